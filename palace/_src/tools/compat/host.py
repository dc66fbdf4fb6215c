"""Host-side JAX names for modules loaded by `palace.compat.load_module` (no JAX involved).

Everything here runs eagerly on NumPy values: `jit` compiles nothing, `custom_vjp` only runs the
forward function, `random` is deterministic but not bit-compatible with JAX's Threefry streams.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, util, validate
from palace._src.core import ShapeDtypeStruct as _PalaceSDS
from palace._src.errors import UnsupportedError, UsageError
from palace._src.lang import numpy_ops as pjnp
from palace._src.lang.array import Array as _PalaceArray
from palace._src.sim.machine import active_tpu
from palace._src.util import tree_flatten, tree_leaves, tree_map, tree_unflatten


class MissingNameError(UnsupportedError, AttributeError):
  """A JAX name that palace's JAX shim does not provide (also an AttributeError, so `hasattr` works)."""


# ------------------------------------------------------------------ arrays and types
class _ArrayMeta(type):
  def __instancecheck__(cls, x):
    return isinstance(x, (np.ndarray, np.generic, _PalaceArray))


class Array(metaclass=_ArrayMeta):
  """`jax.Array` in palace's JAX shim: host values are NumPy arrays, kernel values `palace.Array`s."""


class ShapeDtypeStruct(_PalaceSDS):
  """`jax.ShapeDtypeStruct` (sharding and other keywords are accepted and ignored)."""

  @classmethod
  def like(cls, x):
    return cls(np.shape(x), x.dtype)


def block_until_ready(x):
  return x


def device_put(x, device=None, *, src=None, donate=False, may_alias=None):
  """Host values stay NumPy arrays (64-bit narrowed as JAX does); shardings are ignored."""
  return tree_map(_canonical, x)


def _canonical(x):
  if isinstance(x, (np.ndarray, np.generic)):
    d = dt.canonicalize(x.dtype)
    return x.astype(d) if d != x.dtype else x
  return x


# ------------------------------------------------------------------ jit and friends
def jit(fun=None, *, static_argnums=None, static_argnames=None, donate_argnums=None,
        donate_argnames=None, **_options):
  """`jax.jit`: compiles nothing and calls `fun`. Static arguments must be hashable (as in JAX); the
  other NumPy operands are narrowed to 32 bits, as JAX does without x64."""
  if fun is None:
    return functools.partial(jit, static_argnums=static_argnums, static_argnames=static_argnames,
                             donate_argnums=donate_argnums, donate_argnames=donate_argnames)
  nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums or ())
  names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames or ())
  try:
    params = list(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    params = []
  names = set(names) | {params[i] for i in nums if 0 <= i < len(params)}
  nums = set(nums) | {params.index(n) for n in names if n in params}
  fname = getattr(fun, "__name__", "function")

  @functools.wraps(fun)
  def call(*args, **kwargs):
    args = list(args)
    for i, a in enumerate(args):
      if i in nums or (i - len(args)) in nums:
        _check_hashable(fname, f"argument {i}", a)
      else:
        args[i] = tree_map(_canonical, a)
    for k, v in kwargs.items():
      if k in names:
        _check_hashable(fname, f"argument {k!r}", v)
      else:
        kwargs[k] = tree_map(_canonical, v)
    return fun(*args, **kwargs)

  call.lower = _unsupported("jax.jit(...).lower", "palace runs functions eagerly; nothing is lowered. "
                            "Fix: call the function itself.")
  call.trace = _unsupported("jax.jit(...).trace", "palace runs functions eagerly; nothing is traced. "
                            "Fix: call the function itself.")
  return call


def _check_hashable(fname, what, v):
  try:
    hash(v)
  except TypeError:
    raise UsageError(f"jax.jit({fname}): static {what} = {type(v).__name__} is not hashable; JAX "
                     f"requires hashable static arguments. Fix: pass a tuple instead of a list (or a "
                     f"frozen dataclass), or make it a regular argument.") from None


def _unsupported(api, hint=""):
  def f(*_a, **_k):
    raise UnsupportedError.feature(api, hint)
  return f


class custom_vjp:  # noqa: N801  (JAX's name)
  """`jax.custom_vjp`: forward only. Calling it runs `fun`; `defvjp(fwd, bwd)` stores the rules but
  palace has no autodiff, so `jax.grad`/`jax.vjp` are not provided."""

  def __init__(self, fun, nondiff_argnums=(), nondiff_argnames=()):
    functools.update_wrapper(self, fun)
    self.fun = fun
    self.nondiff_argnums = tuple(nondiff_argnums)
    self.fwd = self.bwd = None

  def defvjp(self, fwd, bwd, symbolic_zeros=False, optimize_remat=False):
    self.fwd, self.bwd = fwd, bwd

  def __call__(self, *args, **kwargs):
    return self.fun(*args, **kwargs)

  def __get__(self, obj, objtype=None):
    return self if obj is None else functools.partial(self, obj)


def custom_jvp(fun, nondiff_argnums=(), nondiff_argnames=()):
  """`jax.custom_jvp`: forward only (see custom_vjp)."""
  f = custom_vjp(fun, nondiff_argnums)
  f.defjvp = lambda jvp, symbolic_zeros=False: None
  return f


def vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None, spmd_axis_name=None):
  """`jax.vmap` on the host: a Python loop over the mapped axis, outputs stacked along `out_axes`."""

  @functools.wraps(fun)
  def call(*args):
    axes = in_axes if isinstance(in_axes, (list, tuple)) else (in_axes,) * len(args)
    if len(axes) != len(args):
      raise UsageError(f"jax.vmap: {len(axes)} in_axes for {len(args)} arguments. Fix: give one "
                       f"in_axes entry per argument (None for an unmapped one), or a single int.")
    flat = [tree_flatten(a) for a in args]
    sizes = {np.shape(x)[ax] for (leaves, _), ax in zip(flat, axes) if ax is not None for x in leaves}
    if axis_size is not None:
      sizes.add(axis_size)
    if len(sizes) != 1:
      raise UsageError(f"jax.vmap: mapped axes have inconsistent sizes {sorted(sizes)}. Fix: map "
                       f"axes of one size, or mark the others None in in_axes.")
    n = sizes.pop()
    results = []
    for i in range(n):
      call_args = []
      for (leaves, td), ax, a in zip(flat, axes, args):
        call_args.append(a if ax is None else
                         tree_unflatten(td, [np.take(np.asarray(x), i, axis=ax) for x in leaves]))
      results.append(fun(*call_args))
    leaves0, td = tree_flatten(results[0])
    per = [tree_flatten(r)[0] for r in results]
    oaxes = out_axes if isinstance(out_axes, (list, tuple)) else (out_axes,) * len(leaves0)
    return tree_unflatten(td, [np.stack([np.asarray(p[j]) for p in per], axis=oaxes[j])
                               for j in range(len(leaves0))])

  return call


@contextlib.contextmanager
def named_scope(name):
  yield


def ensure_compile_time_eval():
  return _NullContext()


class _NullContext(contextlib.ContextDecorator):
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def default_matmul_precision(precision):
  """A no-op context manager / decorator (palace matmuls are always float32-accurate)."""
  return _NullContext()


def debug_print(fmt: str, *args, ordered=False, **kwargs):
  """`jax.debug.print` on the host (str.format). Inside kernels use `pl.debug_print`."""
  if executor.maybe_current() is not None:
    from palace._src.lang.primitives import debug_print as pl_debug_print
    pl_debug_print(fmt, *args)
    return
  print(fmt.format(*args, **kwargs))


# ------------------------------------------------------------------ devices
_DEVICE_KIND = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite",
                "7x": "TPU7x"}


class Device:
  """A virtual chip of the active `pl.virtual_tpu`, seen as a `jax.Device`."""
  platform = "tpu"

  def __init__(self, i, chip):
    self.id = i
    self.device_kind = _DEVICE_KIND.get(chip.name, f"TPU {chip.name}")
    self.num_cores = chip.num_tensorcores_per_device

  def __repr__(self):
    return f"VirtualTpuDevice(id={self.id}, device_kind={self.device_kind!r})"


def devices(backend=None):
  tpu = active_tpu()
  return [Device(i, tpu.chip) for i in range(tpu.num_chips)]


def device_count(backend=None):
  return active_tpu().num_chips


local_devices = devices
local_device_count = device_count


def default_backend():
  return "tpu"


# ------------------------------------------------------------------ tree_util
# Registrations go to palace's pytree registry (util.py), so pallas_call / pl.kernel operands and
# jax.tree_util calls of the loaded module see the same nodes.
def register_pytree_node(cls, flatten, unflatten, flatten_with_keys=None):
  return util.register_pytree_node(cls, flatten, unflatten)


def register_pytree_node_class(cls):
  return util.register_pytree_node(cls, lambda x: x.tree_flatten(), cls.tree_unflatten)


def register_dataclass(cls, data_fields=None, meta_fields=None, drop_fields=()):
  return util.register_dataclass(cls, data_fields, meta_fields, drop_fields)


def static_field(**kwargs):
  """`jax.tree.static()`: a dataclass field that register_dataclass treats as static metadata."""
  metadata = {**(kwargs.pop("metadata", None) or {}), "static": True}
  return dataclasses.field(metadata=metadata, **kwargs)


class Partial(functools.partial):
  """`jax.tree_util.Partial`."""


# ------------------------------------------------------------------ nn (works on host values and in kernels)
def relu(x):
  return pjnp.maximum(x, 0)


def relu6(x):
  return pjnp.minimum(pjnp.maximum(x, 0), 6)


def sigmoid(x):
  return pjnp.logistic(x)


def silu(x):
  return x * pjnp.logistic(x)


def gelu(x, approximate: bool = True):
  if approximate:
    c = np.sqrt(2 / np.pi).astype(np.float32)
    return 0.5 * x * (1 + pjnp.tanh(c * (x + 0.044715 * (x * x * x))))
  return 0.5 * x * (1 + pjnp.erf(x * np.float32(1 / np.sqrt(2))))


def softplus(x):
  return pjnp.log(1 + pjnp.exp(-pjnp.abs(x))) + pjnp.maximum(x, 0)


def _axis_max(x, axis):
  return pjnp.max(x, axis=axis, keepdims=True)


def softmax(x, axis=-1, where=None):
  e = pjnp.exp(x - _axis_max(x, axis))
  return e / pjnp.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1, where=None):
  s = x - _axis_max(x, axis)
  return s - pjnp.log(pjnp.sum(pjnp.exp(s), axis=axis, keepdims=True))


def logsumexp(x, axis=None, keepdims=False):
  m = pjnp.max(x, axis=axis, keepdims=True)
  out = pjnp.log(pjnp.sum(pjnp.exp(x - m), axis=axis, keepdims=True)) + m
  return out if keepdims else pjnp.squeeze(out, axis)


def one_hot(x, num_classes, *, dtype=np.float32, axis=-1):
  x = np.asarray(x)
  out = (x[..., None] == np.arange(num_classes)).astype(dt.canonicalize(np.dtype(dtype)))
  return np.moveaxis(out, -1, axis)


NN = dict(relu=relu, relu6=relu6, sigmoid=sigmoid, silu=silu, swish=silu, gelu=gelu, softplus=softplus,
          softmax=softmax, log_softmax=log_softmax, logsumexp=logsumexp, one_hot=one_hot,
          tanh=pjnp.tanh)


# ------------------------------------------------------------------ random (deterministic, NumPy-based)
def _key_words(key) -> np.ndarray:
  k = np.asarray(key)
  if k.dtype != np.uint32 or k.shape[-1:] != (2,):
    raise UsageError(f"jax.random: expected a key from jax.random.key/PRNGKey (uint32[2]); got "
                     f"{k.dtype}{list(k.shape)}. Fix: make the key with jax.random.key(seed) or "
                     f"jax.random.PRNGKey(seed), and split it with jax.random.split.")
  return k


def PRNGKey(seed) -> np.ndarray:  # noqa: N802 (JAX's name)
  """A uint32[2] key. palace's streams are deterministic but differ from JAX's Threefry streams."""
  s = validate.as_int(seed, "jax.random.PRNGKey(seed)") & 0xFFFFFFFFFFFFFFFF
  return np.array([s >> 32, s & 0xFFFFFFFF], np.uint32)


key = PRNGKey


def _gen(k) -> np.random.Generator:
  return np.random.Generator(np.random.Philox(key=_key_words(k).astype(np.uint64)))


def split(k, num: int = 2) -> np.ndarray:
  return _gen(k).integers(0, 2**32, size=(validate.as_int(num, "jax.random.split(num)", min_value=0), 2), dtype=np.uint32)


def fold_in(k, data) -> np.ndarray:
  w = _key_words(k)
  return _gen(np.array([w[0] ^ (validate.as_int(data, "jax.random.fold_in(data)") & 0xFFFFFFFF), w[1]], np.uint32)).integers(
      0, 2**32, size=(2,), dtype=np.uint32)


def _shape(shape):
  return validate.as_dims(shape, "jax.random shape")


def _float_dtype(dtype):
  d = dt.canonicalize(np.dtype(dtype))
  if not dt.is_float(d):
    raise UsageError(f"jax.random: dtype must be a float type; got {d}. Fix: pass e.g. "
                     f"dtype=jnp.float32 or jnp.bfloat16.")
  return d


def normal(k, shape=(), dtype=np.float32):
  d = _float_dtype(dtype)
  return _gen(k).standard_normal(_shape(shape), np.float32).astype(d)


def uniform(k, shape=(), dtype=np.float32, minval=0.0, maxval=1.0):
  d = _float_dtype(dtype)
  u = _gen(k).random(_shape(shape), np.float32)
  return (np.float32(minval) + u * np.float32(maxval - minval)).astype(d)


def bits(k, shape=(), dtype=np.uint32):
  d = np.dtype(dtype)
  return _gen(k).integers(0, np.iinfo(d).max, size=_shape(shape), dtype=d, endpoint=True)


def randint(k, shape, minval, maxval, dtype=np.int32):
  return _gen(k).integers(minval, maxval, size=_shape(shape), dtype=dt.canonicalize(np.dtype(dtype)))


def bernoulli(k, p=0.5, shape=None):
  s = np.shape(p) if shape is None else _shape(shape)
  return _gen(k).random(s, np.float32) < np.asarray(p, np.float32)


def permutation(k, x, axis=0, independent=False):
  if np.ndim(x) == 0:
    return _gen(k).permutation(validate.as_int(x, "jax.random.permutation(x)", min_value=0)).astype(
        np.int32)
  return _gen(k).permutation(np.asarray(x), axis=axis)


def key_data(k):
  return np.asarray(k)


RANDOM = dict(key=key, PRNGKey=PRNGKey, split=split, fold_in=fold_in, normal=normal, uniform=uniform,
              bits=bits, randint=randint, bernoulli=bernoulli, permutation=permutation,
              key_data=key_data, wrap_key_data=lambda d, impl=None: np.asarray(d, np.uint32))

TREE = dict(tree_map=tree_map, tree_flatten=tree_flatten, tree_unflatten=tree_unflatten,
            tree_leaves=tree_leaves, register_pytree_node=register_pytree_node,
            register_pytree_node_class=register_pytree_node_class,
            register_dataclass=register_dataclass, Partial=Partial,
            tree_structure=lambda t, is_leaf=None: tree_flatten(t, is_leaf)[1])
