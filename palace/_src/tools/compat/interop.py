"""palace kernels as JAX functions (needs JAX installed; palace itself never imports it otherwise)."""
from __future__ import annotations

import functools
import sys

import numpy as np

from palace._src import dtypes as dt
from palace._src.errors import UnsupportedError, UsageError
from palace._src.util import tree_flatten, tree_map, tree_unflatten


def _jax():
  try:
    import jax  # noqa: PLC0415  (optional dependency)
  except ImportError:
    raise UnsupportedError("pl.jax_callable needs JAX (pip install jax; it needs Python >= 3.12); "
                           "palace kernels themselves run without it. Fix: pip install jax (on Python >= "
                           "3.12), or call the palace function directly on NumPy arrays.") from None
  return jax


def is_jax_array(x) -> bool:
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(x, getattr(jax, "Array", ()))


def jax_callable(f, out_shape=None, *, tpu=None, vmap_method=None):
  """Wrap a palace function (one that launches kernels) as a JAX function usable inside `jax.jit`.

  The call becomes a `jax.pure_callback`: JAX hands the operands to the host, palace runs `f` on
  them on a virtual TPU, and the results flow back as JAX arrays. `out_shape` (a pytree of
  ShapeDtypeStructs, or a function of the operands returning one) gives the result types; without it
  palace finds them by running `f` once in timing-only mode on zeros of the operands' shapes (cached
  per operand signature). `tpu` is the `pl.virtual_tpu` to run on; by default the one active where
  the wrapper is called (traced), else a fresh default. The callback is opaque to JAX: no autodiff,
  and `vmap` only with `vmap_method` (passed to pure_callback).

  Example:
    >>> add = pl.jax_callable(lambda x, y: add_pallas(x, y))
    >>> jax.jit(lambda a, b: add(a, b) * 2)(a, b)
  """
  jax = _jax()
  from palace._src.launch.host import on_tpu
  from palace._src.sim.machine import VirtualTPU, explicit_tpu
  cache = {}

  def result_types(args):
    leaves, _ = tree_flatten(args)
    key = tuple((tuple(np.shape(x)), str(np.dtype(x.dtype))) for x in leaves)
    if out_shape is not None:
      res = out_shape(*args) if callable(out_shape) and not hasattr(out_shape, "shape") else out_shape
    elif key in cache:
      return cache[key]
    else:
      zeros = tree_map(lambda x: np.zeros(np.shape(x), np.dtype(x.dtype)), args)
      with VirtualTPU(timing_only=True):
        res = f(*zeros)
    out = tree_map(lambda r: jax.ShapeDtypeStruct(tuple(np.shape(r)), dt.canonicalize(np.dtype(r.dtype))),
                   res)
    cache[key] = out
    return out

  @functools.wraps(f)
  def call(*args):
    run_tpu = tpu if tpu is not None else explicit_tpu()
    types = result_types(args)
    t_leaves, t_td = tree_flatten(types)

    def host(*host_args):
      with on_tpu(run_tpu if run_tpu is not None else VirtualTPU()):   # (not `with run_tpu:`, which
        res = f(*[np.asarray(a) for a in host_args])                   # may be active here already)
      r_leaves, r_td = tree_flatten(res)
      if len(r_leaves) != len(t_leaves):
        raise UsageError(f"pl.jax_callable({getattr(f, '__name__', 'f')}): returned {len(r_leaves)} "
                         f"arrays; the declared out_shape has {len(t_leaves)}. Fix: declare one out_shape "
                         f"entry per returned array.")
      return tree_unflatten(t_td, [np.asarray(r, t.dtype) for r, t in zip(r_leaves, t_leaves)])

    kw = {} if vmap_method is None else {"vmap_method": vmap_method}
    return jax.pure_callback(host, types, *args, **kw)

  return call
