"""Shared helpers of `palace.numpy` (L4a): operand conversion, result wrapping, dtype arguments.

Every op of the topic modules (numpy_dtypes, numpy_elementwise, numpy_creation, numpy_reductions,
numpy_shape, numpy_indexing, numpy_linalg) ends in `_out`: inside a kernel the result is an `Array`
charged to the virtual core through the executor (`vector_op` / `scalar_op`); on the host (no kernel
running) it is plain NumPy data with JAX's dtype defaults (int32 / float32).
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import hw
from palace._src import executor, validate
from palace._src.errors import ShapeError, UsageError
from palace._src.lang.array import Array
from palace._src.util import keep, user_frame_summary

_F32 = dt.float32
_I32 = dt.int32
_I32_MIN, _I32_MAX = -2**31, 2**31 - 1
_current_ex = executor.maybe_current   # (the context variable's getter: no Python frame)


_FLOATS = frozenset({dt.float32, dt.float16, *dt.NARROW_FLOATS})
_COMPUTE = {d: _F32 for d in (dt.float16, *dt.NARROW_FLOATS)}


def _compute_dtype(d: np.dtype) -> np.dtype:
  """Arithmetic dtype for result dtype d: narrow floats go through float32."""
  return _COMPUTE.get(d, d)


def _np(x, d: np.dtype | None = None):
  """Operand -> NumPy value (in dtype d if given)."""
  if isinstance(x, Array):
    v = x._data
    if d is not None and v is not None and v.dtype != d:
      v = v.astype(d)
    return v
  if d is None:
    return np.asarray(x)
  try:
    return np.asarray(x, dtype=d)
  except OverflowError:
    # a weak Python int beyond the array's integer type wraps into it, as in JAX 0.12 (int8 + 300 is
    # int8 + 44); beyond 64 bits JAX raises OverflowError, palace this error
    if type(x) is int and -2**63 <= x < 2**64:
      return np.asarray(x).astype(d)
    raise ShapeError(f"Python int {x} does not fit 64 bits: a weak Python scalar takes the dtype of the "
                     f"array it meets ({d}), and JAX raises OverflowError for it too. Fix: use a value "
                     f"within 64 bits (it wraps into {d}, as in JAX). ({user_frame_summary()})") from None


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SELECT_BITWISE_MIN = 1024   # elements (one float32 vreg); below, np.where's single call is cheaper


def _broadcast_scalar(value: np.ndarray, shape) -> np.ndarray:
  """`np.broadcast_to(value, shape)` for a 0-d `value`: the same read-only zero-stride view, made by
  the ndarray constructor in one C call (broadcast_to's Python layers cost twice as much per
  jnp.full / zeros in a kernel)."""
  if value.ndim:   # (an array fill value: NumPy's broadcasting rules and errors)
    return np.broadcast_to(value, shape)
  buf = value.view(_BITS[value.dtype.itemsize]) if value.dtype.itemsize in _BITS else value
  view = np.ndarray(shape, value.dtype, buf, 0, (0,) * len(shape))
  view.flags.writeable = False
  return view


def _select(c, x, y):
  """`np.where(c, x, y)` for a bool `c` and `x`, `y` of one dtype (broadcasting): the data of
  jnp.where / lax.select. From one vreg up it is a branch-free bit select, y ^ ((x ^ y) & mask): the same
  bits as np.where (a select copies its operands' bits; NaN payloads and -0.0 included), but np.where
  branches per element and a mask that varies unpredictably (x > 0 on random data, attention masks) costs
  it a mispredicted branch every other element: 117 us against 22 us on a (128, 256) float32 block,
  25 us against 23 with a uniform mask (`python -m benchmarks.host_numpy`, last lines: measured with a
  different mask per call, since a mask repeated call after call trains the predictor)."""
  u = _BITS.get(x.dtype.itemsize)
  if u is None or x.dtype != y.dtype or x.dtype.hasobject or \
      max(c.size, x.size, y.size) < _SELECT_BITWISE_MIN:
    return np.where(c, x, y)
  shape = c.shape
  if x.shape != shape or y.shape != shape:
    shape = np.broadcast_shapes(shape, x.shape, y.shape)
  mask = np.empty(shape, u)
  mask[...] = c              # (True -> 1)
  np.negative(mask, out=mask)   # 1 -> all ones
  yb = y.view(u)
  out = np.bitwise_xor(x.view(u), yb, out=np.empty(shape, u))
  out &= mask
  out ^= yb
  return out.view(x.dtype)


def _out(data, shape, dtype, ready, op_class, any_array):
  """Wrap a result: an Array charged to the core inside a kernel, NumPy data on the host."""
  ex = _current_ex()
  if ex is None:
    if any_array:
      raise UsageError(f"A palace.Array was used outside its kernel ({user_frame_summary()}). Fix: "
                       f"compute with kernel values inside the kernel body and return results "
                       f"through output refs.")
    return np.asarray(data, dtype=dtype) if data is not None else np.zeros(shape, dtype)
  if ex.timing_only and shape:
    data = None
  if shape:
    ready = ex.vector_op(op_class, shape, dtype, ready)
  else:
    ready = ex.scalar_op(ready)
  return Array(data, shape, dtype, ready)


def _shape_of(x):
  if isinstance(x, Array):
    return x.shape
  if isinstance(x, (bool, int, float)):
    return ()
  shape = getattr(x, "shape", None)
  return tuple(shape) if shape is not None else np.shape(x)


def _is_arr(*xs):
  for x in xs:
    if isinstance(x, Array):
      return True
  return False


def _has_data(*xs):
  for x in xs:
    if isinstance(x, Array) and x._data is None:
      return False
  return True



_BROADCASTS: dict = {}   # operand shapes -> their broadcast shape (a memo of NumPy's rule)


def _broadcast_shapes(name: str, args) -> tuple:
  shapes = [_shape_of(a) for a in args]
  first = shapes[0]
  for s in shapes:
    if s != first:
      break
  else:   # all equal (scalar code: index arithmetic, selects): nothing to broadcast
    return tuple(first)
  key = tuple(shapes)
  hit = _BROADCASTS.get(key)
  if hit is not None:
    return hit
  try:
    return keep(_BROADCASTS, key, np.broadcast_shapes(*shapes))
  except ValueError:
    ex = executor.maybe_current()
    raise ShapeError(f"Incompatible shapes for jnp.{name}{' ' + ex.where() if ex else ''}: "
                     f"{', '.join(str(s) for s in shapes)}; expected shapes that broadcast (equal, or 1, in "
                     f"each trailing dim). Fix: reshape or broadcast_to the operands first. "
                     f"({user_frame_summary()})") from None


def _weak_promotes(args, strong: np.dtype) -> bool:
  """True when a weak Python scalar changes the result type (float with ints/bool, int with bool)."""
  if dt.is_float(strong):
    return False
  for a in args:
    if type(a) is float or (type(a) is int and strong == dt.bool_):
      return True
  return False


def _dtype_arg(dtype, api: str) -> np.dtype:
  """A user-supplied dtype: 64-bit types are an error inside a kernel and narrowed (as JAX does without
  x64) on the host."""
  d = dt.canonicalize(dtype, keep_64bit=True)
  if dt.is_64bit(d):
    ex = executor.maybe_current()
    if ex is None:
      return dt.narrowed(d)
    raise ShapeError(f"Unsupported dtype for {api} {ex.where()}: {d}; expected a 32-bit or narrower "
                     f"type, TPUs have no 64-bit types. Fix: use {dt.narrowed(d)}. ({user_frame_summary()})")
  if d in dt.CHIP_DEPENDENT:
    ex = executor.maybe_current()
    if ex is not None:
      hw.check_dtype(ex.chip, d, f"{api} {ex.where()} ({user_frame_summary()})")
  return d


def _default_dtype(x):
  if isinstance(x, (np.ndarray, np.generic)):
    return dt.canonicalize(x.dtype)
  return dt.canonicalize(np.asarray(x).dtype)


def _shape_arg(shape):
  return validate.as_dims(shape, "shape", error=ShapeError)


def _norm_axes(axis, ndim):
  if axis is None:
    return tuple(range(ndim))
  axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
  out = []
  for a in axes:
    a = validate.as_int(a, "axis", error=ShapeError)
    if not -ndim <= a < ndim:
      raise ShapeError(f"Reduction axis {a} is out of range for an array of rank {ndim}. Fix: pass an axis "
                       f"in -{ndim}..{ndim - 1}.")
    out.append(a % ndim)
  return tuple(sorted(out))
