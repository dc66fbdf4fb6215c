"""`palace.numpy` array creation (L4a): full / zeros / ones / *_like, arange, iota, eye."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.executor import OpClass
from palace._src.lang import deferred
from palace._src.lang.array import dtype_of, ready_of, weakly_typed
from palace._src.lang.numpy_base import (_F32, _broadcast_scalar, _dtype_arg, _np, _out, _shape_arg,
                                         _shape_of)

_IMPORTED = frozenset(globals())  # names above are imports, not this module's API


def full(shape, fill_value, dtype=None):
  return _full(shape, fill_value, dtype, "jnp.full")


def _full(shape, fill_value, dtype, api: str):
  shape = _shape_arg(shape)
  d = _dtype_arg(dtype, api) if dtype is not None else dt.result_type(dtype_of(fill_value))
  ex = executor.maybe_current()
  if ex is None:
    data = np.full(shape, _np(fill_value), d)
  elif ex.timing_only and shape:
    data = None
  else:  # values are immutable: a read-only broadcast view costs nothing until it is stored
    if type(fill_value) in (int, float) and fill_value == 0 and d == _F32 and dtype is not None:
      later = deferred.zeros(ex, shape)  # an accumulator's zero start, kept symbolic
      if later is not None:
        return later
    data = _broadcast_scalar(np.asarray(_np(fill_value), d), shape)
  # a filled vector costs no vector op: the VPU takes a scalar operand (a vector-scalar op) and a fill
  # that is stored is one splat vreg stored again and again (its stores are charged); measured on the
  # v5e's causal flash, whose `jnp.where(mask, 0.0, mask_value)` costs the chip nothing visible
  # (docs/timing-model.md 1.4)
  out = _out(data, shape, d, ready_of(fill_value), OpClass.FREE, False)
  return weakly_typed(out) if dtype is None and type(fill_value) in (bool, int, float) else out  # (JAX)


def zeros(shape, dtype=None):
  return _full(shape, 0, dtype or _F32, "jnp.zeros")


def ones(shape, dtype=None):
  return _full(shape, 1, dtype or _F32, "jnp.ones")


def empty(shape, dtype=None):
  return _full(shape, 0, dtype or _F32, "jnp.empty")


def zeros_like(x, dtype=None):
  return _full(_shape_of(x), 0, dtype or x.dtype, "jnp.zeros_like")


def ones_like(x, dtype=None):
  return _full(_shape_of(x), 1, dtype or x.dtype, "jnp.ones_like")


def full_like(x, fill_value, dtype=None):
  return _full(_shape_of(x), fill_value, dtype or x.dtype, "jnp.full_like")


def arange(start, stop=None, step=1, dtype=None):
  if stop is None:
    start, stop = 0, start
  d = _dtype_arg(dtype, "jnp.arange") if dtype is not None else dt.result_type(start, stop, step)
  data = np.arange(start, stop, step).astype(d)
  return _out(data, data.shape, d, 0, OpClass.CHEAP, False)


def iota(dtype, size):
  return arange(size, dtype=dtype)


def eye(n, m=None, dtype=None):
  data = np.eye(n, m, dtype=_dtype_arg(dtype or _F32, "jnp.eye"))
  return _out(data, data.shape, data.dtype, 0, OpClass.CHEAP, False)


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _IMPORTED)
