"""Registry entries of JAX's PRNG inside kernels: key arrays (`random_seed`, `random_bits`,
`random_fold_in`, `random_wrap`, `random_unwrap`), the threefry hash (`threefry2x32`,
`iota_2x32_shape`) and Pallas' own key handling (`prng_split`, `prng_join`).

A key array is held as its key data (uint32 with the key's trailing dimensions, avals.physical),
as JAX's TPU lowering holds it. Each key primitive is evaluated as Mosaic lowers it: the JAX function
its lowering runs through `lower_fun` (the key implementation's `seed` / `random_bits` /
`fold_in`, threefry's unrolled hash) is traced once per equation into a jaxpr that palace's
interpreter then runs, so the values are JAX's own, bit for bit: threefry keys give what
`jax.random` gives outside a kernel, and Pallas TPU keys (`pltpu.to_pallas_key`, impl
"pallas_tpu") seed palace's hardware-PRNG model (`pltpu.prng_seed`, docs/jax.md). The traced
functions read JAX's configuration (`jax_threefry_partitionable`) when the kernel is first run."""
from __future__ import annotations

import numpy as np

from palace._src.jax.interpret import traced
from palace._src.jax.registry import DATA, rule
import palace._src.lang.numpy_ops as pjnp
from palace._src.lang import lax_ops


def _impl(eqn, k: int = 0):
  return eqn.invars[k].aval.dtype._impl


def _is_pallas(impl) -> bool:
  from jax._src.pallas.mosaic import random as pl_random  # noqa: PLC0415
  return pl_random.is_pallas_impl(impl)


def _keyed(eqn, fn):
  """`fn` applied per key of a key array of any rank (one key: `fn` itself), as JAX's own lowering
  maps it (prng.iterated_vmap_unary)."""
  from jax._src.random import prng  # noqa: PLC0415
  return prng.iterated_vmap_unary(len(eqn.invars[0].aval.shape), fn)


@rule("random_seed", compiles=True, schedule=DATA)
@traced
def _random_seed(eqn):
  return _keyed(eqn, eqn.params["impl"].seed)


@rule("random_bits", compiles=True, schedule=DATA)
@traced
def _random_bits(eqn):
  import jax  # noqa: PLC0415
  impl, p = _impl(eqn), eqn.params
  if _is_pallas(impl):   # (the key itself seeds the core's generator: prng_seed, prng_random_bits)
    return _keyed(eqn, lambda k: impl.random_bits(k, p["bit_width"], p["shape"]))
  return _keyed(eqn, lambda k: impl.random_bits(jax.random.key_data(k), p["bit_width"], p["shape"]))


@rule("random_fold_in", compiles=True, schedule=DATA)
@traced
def _random_fold_in(eqn):
  import jax  # noqa: PLC0415
  impl = _impl(eqn)
  if _is_pallas(impl):
    return impl.fold_in
  return lambda keys, msgs: jax.random.wrap_key_data(
      impl.fold_in(jax.random.key_data(keys), msgs), impl=impl)


@rule("random_wrap", "random_unwrap", schedule=DATA)
def _random_wrap(eqn, x):
  """Key data <-> key array: the same data in palace (a key array is held as its key data)."""
  return x


@rule("threefry2x32", compiles=True, schedule=DATA)
@traced
def _threefry2x32(eqn):
  from jax._src.random import threefry2x32  # noqa: PLC0415
  return lambda k1, k2, x1, x2: threefry2x32._threefry2x32_lowering(k1, k2, x1, x2,
                                                                    use_rolled_loops=False)


@rule("iota_2x32_shape", schedule=DATA)
def _iota_2x32_shape(eqn):
  """The (high, low) words of a row-major uint64 iota of `shape` (shapes of at most 2**32 elements:
  the high words are 0)."""
  shape = tuple(eqn.params["shape"])
  strides = np.cumprod((1, *shape[::-1]))[:-1][::-1]
  lo = None
  for d, stride in enumerate(strides):
    term = pjnp.multiply(lax_ops.broadcasted_iota(np.uint32, shape, d), np.uint32(stride))
    lo = term if lo is None else pjnp.add(lo, term)
  if lo is None:
    lo = pjnp.zeros(shape, np.uint32)
  return [pjnp.zeros(shape, np.uint32), lo]


@rule("prng_split", schedule=DATA)
def _prng_split(eqn, key):
  """A Pallas TPU key's words as uint32 scalars (pltpu's unwrap_pallas_seed)."""
  n = int(np.prod(eqn.invars[0].aval.dtype._impl.key_shape))
  flat = pjnp.reshape(key, (n,))
  return [flat[i] for i in range(n)]


@rule("prng_join", schedule=DATA)
def _prng_join(eqn, *words):
  """uint32 scalars joined into a Pallas TPU key (pltpu's wrap_pallas_seed)."""
  shape = tuple(eqn.params["impl"].key_shape)
  return pjnp.reshape(pjnp.stack([pjnp.asarray(w, dtype=np.uint32) for w in words]), shape)
