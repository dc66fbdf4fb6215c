"""`palace.lax`: the lax subset kernels use (L4a)."""
from __future__ import annotations

import functools

import numpy as np

from palace._src import dtypes as dt
from palace._src.executor import OpClass
from palace._src import validate
from palace._src.lang import numpy_ops as jnp
from palace._src.errors import ShapeError, UnsupportedError
from palace._src.lang.array import Array, concrete_int, ready_of
from palace._src.lang.numpy_base import _BITS, _current_ex, _dtype_arg, _has_data, _is_arr, _np, _out
from palace._src.lang.numpy_dtypes import _ScalarType
from palace._src.lang.numpy_elementwise import _elementwise, int_div, int_rem
from palace._src.lang.numpy_shape import _shape_op
from palace._src.lang.numpy_linalg import dot_general  # noqa: F401
from palace._src.lang.tpu_primitives import bitcast
from palace._src.util import keep, user_frame_summary
from palace._src.lang.primitives import (axis_index, axis_size, cond, fori_loop, switch,  # noqa: F401
                                         while_loop)



def select(pred, on_true, on_false):
  return jnp.where(pred, on_true, on_false)


# (dtype argument, its type, shape, its entries' types, dimension, outside a kernel?) -> (shape, dtype,
# data): broadcasted_iota's checked arguments and its read-only data, shared by every call with the
# same key (a kernel's causal mask makes the same iotas every grid step); not for a dtype some chip lacks
_IOTAS: dict = {}


def broadcasted_iota(dtype, shape, dimension: int):
  key = hit = None
  if type(shape) is tuple and type(dimension) is int:
    key = (dtype.dtype if type(dtype) is _ScalarType else dtype, type(dtype), shape,
           tuple(map(type, shape)), dimension, _current_ex() is None)
    try:
      hit = _IOTAS.get(key)
    except TypeError:   # (an unhashable dtype argument: checked below)
      key = None
  if hit is None:
    shape = validate.as_dims(shape, "lax.broadcasted_iota shape", error=ShapeError)
    dimension = validate.as_int(dimension, "lax.broadcasted_iota dimension", error=ShapeError)
    d = _dtype_arg(dtype, "lax.broadcasted_iota")
    hit = (shape, d, np.broadcast_to(np.arange(shape[dimension], dtype=d).reshape(
        [-1 if i == dimension else 1 for i in range(len(shape))]), shape))   # (the data: a read-only view)
    if key is not None and d not in dt.CHIP_DEPENDENT:
      keep(_IOTAS, key, hit, 256)
  shape, d, data = hit
  ex = _current_ex()
  if ex is None or not shape:
    return _out(data, shape, d, 0, OpClass.CHEAP, False)
  # the vregs of an iota repeat along every other dim: the compiler makes each distinct one once (a
  # (512, 512) iota along lanes is 4 vregs, along sublanes 64; docs/timing-model.md 1.4)
  distinct = tuple(n if i == dimension else 1 for i, n in enumerate(shape))
  return _out(data, shape, d, ex.vector_op(OpClass.CHEAP, distinct, d, 0), OpClass.FREE, False)


def iota(dtype, size: int):
  return jnp.arange(size, dtype=dtype)


def _trunc_div(a, b):
  return int_div(a, b) if a.dtype.kind in "iu" else np.true_divide(a, b)


def _trunc_rem(a, b):
  return int_rem(a, b) if a.dtype.kind in "iu" else np.fmod(a, b)


div = _elementwise(_trunc_div, OpClass.MEDIUM, name="div")   # (VECTOR_INT_REJECTS["div"])
rem = _elementwise(_trunc_rem, OpClass.MEDIUM, name="rem")
max = jnp.maximum  # noqa: A001
min = jnp.minimum  # noqa: A001
add, sub, mul = jnp.add, jnp.subtract, jnp.multiply
neg, abs = jnp.negative, jnp.abs  # noqa: A001
exp, log, tanh, sqrt, rsqrt, logistic = jnp.exp, jnp.log, jnp.tanh, jnp.sqrt, jnp.rsqrt, jnp.logistic
erf = jnp.erf
sin, cos = jnp.sin, jnp.cos
bitwise_and, bitwise_or, bitwise_xor = jnp.bitwise_and, jnp.bitwise_or, jnp.bitwise_xor
shift_left = jnp.left_shift
shift_right_arithmetic = jnp.right_shift
eq, ne, lt, le, gt, ge = jnp.equal, jnp.not_equal, jnp.less, jnp.less_equal, jnp.greater, \
    jnp.greater_equal
square = jnp.square
reciprocal = jnp.reciprocal


def shift_right_logical(x, y):
  if isinstance(x, Array):
    u = {1: dt.uint8, 2: dt.uint16, 4: dt.uint32}[x.dtype.itemsize]
    return bitcast(jnp.right_shift(bitcast(x, u, -1), jnp.astype(y, u) if isinstance(y, Array) else y),
                   x.dtype, -1)
  return jnp.right_shift(x, y)


# ------------------------------------------------------------------ bit counts, nextafter, precision


def _bit_length(v) -> np.ndarray:
  """Per element, the bit length of the integer's bit pattern (0 for 0): a branch-free binary search,
  exact for every width (float64 tricks are not, above 2**53)."""
  x = v.view(_BITS[v.dtype.itemsize]).astype(np.uint64)
  n = np.zeros(x.shape, np.uint64)
  for s in (32, 16, 8, 4, 2, 1):
    step = (x >= np.uint64(1 << s)).astype(np.uint64) * np.uint64(s)
    n += step
    x >>= step
  return n + (x != 0)


def _clz(v):
  return (8 * v.dtype.itemsize - _bit_length(v).astype(np.int64)).astype(v.dtype)


def _population_count(v):
  return np.bitwise_count(v.view(_BITS[v.dtype.itemsize])).astype(v.dtype)


def _vectors_only(op, name: str):
  """Mosaic lowers `name` for vectors only ("not supported on scalars", jax/_src/pallas/mosaic/
  lowering.py): a 0-d operand inside a kernel is what the TPU compiler rejects."""
  def f(x):
    if _current_ex() is not None and isinstance(x, Array) and not x.shape:
      raise UnsupportedError(f"lax.{name} of a scalar inside a kernel at {user_frame_summary()}: Mosaic "
                             f"lowers it for vectors only (the TPU compiler rejects a 0-d operand). Fix: "
                             f"apply it to a vector, e.g. a (1, 128) block, and read the element you need.")
    return op(x)
  f.__name__ = name
  return f


def _int_dtypes_only(op, name: str):
  def f(x):
    d = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
    if not dt.is_int(d):
      raise ShapeError(f"lax.{name} takes integers; got {d} at {user_frame_summary()}. Fix: pass an "
                       f"integer array (bitcast floats with pltpu.bitcast).")
    return op(x)
  f.__name__ = name
  return f


population_count = _vectors_only(_int_dtypes_only(_elementwise(
    _population_count, OpClass.CHEAP, name="population_count"), "population_count"), "population_count")
clz = _int_dtypes_only(_elementwise(_clz, OpClass.CHEAP, name="clz"), "clz")


def _nextafter(a, b):
  """np.nextafter, with JAX's canonical NaN (0x7fc00000) for NaN operands, as the TPU lowering
  (jax/_src/pallas/utils.py nextafter_lowering_helper) and XLA give it."""
  r = np.nextafter(a, b)
  nan = np.isnan(a) | np.isnan(b)
  if nan.any():
    r = np.where(nan, np.asarray(np.nan, r.dtype), r)
  return r


_nextafter_op = _elementwise(_nextafter, OpClass.MEDIUM, "float", name="nextafter")


def nextafter(x1, x2):
  """The next float after x1 towards x2 (float32: the only dtype Mosaic lowers it for in kernels)."""
  dts = {np.dtype(getattr(v, "dtype", np.float32)) for v in (x1, x2)}
  if dts != {dt.float32}:
    raise UnsupportedError(f"lax.nextafter of {', '.join(sorted(map(str, dts)))} at {user_frame_summary()}: "
                           f"the TPU lowering takes float32 operands of one dtype only. Fix: cast both "
                           f"operands to float32.")
  return _nextafter_op(x1, x2)


def _reduce_precision_f32(x, exponent_bits: int, mantissa_bits: int):
  """XLA's ReducePrecision on float32 bits: round the mantissa to `mantissa_bits` (to nearest even),
  then flush exponents outside the `exponent_bits` range to signed infinity / zero; NaNs are kept as
  they are (checked bit for bit against jax.lax.reduce_precision: tests/jax_backend)."""
  u = x.view(np.uint32).copy()
  if mantissa_bits < 23:
    shift = 23 - mantissa_bits
    lsb = (u >> np.uint32(shift)) & np.uint32(1)
    u += lsb + np.uint32((1 << (shift - 1)) - 1)
    u &= np.uint32(~((1 << shift) - 1) & 0xFFFFFFFF)
  if exponent_bits < 8:
    exp_mask, sign_mask = np.uint32(0x7F800000), np.uint32(0x80000000)
    red_bias = (1 << (exponent_bits - 1)) - 1
    e = u & exp_mask
    over = e > np.uint32((127 + red_bias) << 23)
    under = e <= np.uint32((127 - red_bias) << 23)
    zero = u & sign_mask
    u = np.where(over, zero | exp_mask, np.where(under, zero, u))
  r = u.view(np.float32)
  nan = np.isnan(x)   # NaNs pass through unchanged, payload included, with or without mantissa bits
  if nan.any():       # (as XLA does on the CPU, what JAX's interpret mode runs; else m=0 gives inf)
    r = np.where(nan, x, r)
  return r


def reduce_precision(x, exponent_bits: int, mantissa_bits: int):
  """`lax.reduce_precision` of a float32 value (XLA's rounding and range rules, bit for bit)."""
  e = validate.as_int(exponent_bits, "lax.reduce_precision(exponent_bits)", min_value=1)
  m = validate.as_int(mantissa_bits, "lax.reduce_precision(mantissa_bits)", min_value=0)
  d = np.dtype(getattr(x, "dtype", np.float32))
  if d != dt.float32:
    raise UnsupportedError(f"lax.reduce_precision of {d} at {user_frame_summary()}: palace covers float32 "
                           f"operands. Fix: cast to float32 first (x.astype(jnp.float32)).")
  return _reduce_precision_op(e, m)(x)


@functools.lru_cache(maxsize=64)
def _reduce_precision_op(e: int, m: int):
  # (a memo of a pure function: the elementwise op for one target format)
  return _elementwise(lambda v: _reduce_precision_f32(v, e, m), OpClass.CHEAP, "float",
                      name="reduce_precision")


def convert_element_type(x, new_dtype):
  return jnp.astype(x, new_dtype)


def reduce_sum(x, axes):
  return jnp.sum(x, axis=tuple(axes))


def reduce_max(x, axes):
  return jnp.max(x, axis=tuple(axes))


def reduce_min(x, axes):
  return jnp.min(x, axis=tuple(axes))


def broadcast_in_dim(x, shape, broadcast_dimensions):
  shape = tuple(shape)
  s = [1] * len(shape)
  for src, dst in enumerate(broadcast_dimensions):
    s[dst] = x.shape[src]
  return jnp.broadcast_to(jnp.reshape(x, s), shape)


def _clamped_starts(x, start_indices, sizes, api, allow_negative_indices=True):
  """The start of each dimension: a negative start counts from the end where allowed (JAX's
  `allow_negative_indices`, True by default: -3 on 8 rows is row 5), then every start is clamped into
  bounds as XLA's primitive does."""
  shape = x.shape
  wrap = allow_negative_indices
  wrap = [bool(w) for w in wrap] if isinstance(wrap, (list, tuple)) else [bool(wrap)] * len(shape)
  if len(start_indices) != len(shape) or len(sizes) != len(shape):
    raise ShapeError(f"{api}: {len(start_indices)} start indices and {len(sizes)} sizes for an operand of "
                     f"rank {len(shape)}; expected one of each per dimension. Fix: pass {len(shape)} start "
                     f"indices and {len(shape)} sizes.")
  if len(wrap) != len(shape):
    raise ShapeError(f"{api}: allow_negative_indices has {len(wrap)} entries for an operand of rank "
                     f"{len(shape)}. Fix: pass one bool, or one per dimension. ({user_frame_summary()})")
  starts = []
  for s, size, dim, w in zip(start_indices, sizes, shape, wrap):
    if not 0 <= size <= dim:
      raise ShapeError(f"{api}: slice size {size} does not fit dimension {dim} of shape {shape}. "
                       f"Fix: use a slice size between 0 and {dim}.")
    v = concrete_int(s, f"{api} start")
    if v < 0 and w:
      v += dim
    starts.append(0 if v < 0 else dim - size if v > dim - size else v)  # XLA clamps starts
  return starts


def dynamic_slice(x, start_indices, slice_sizes, *, allow_negative_indices=True):
  """`lax.dynamic_slice` of a value (starts may be runtime scalars; negative ones count from the end
  unless `allow_negative_indices=False`; then clamped into bounds like XLA)."""
  sizes = validate.as_dims(slice_sizes, "lax.dynamic_slice slice_sizes", error=ShapeError)
  starts = _clamped_starts(x, start_indices, sizes, "lax.dynamic_slice", allow_negative_indices)
  idx = tuple(slice(s, s + n) for s, n in zip(starts, sizes))
  return _shape_op(x, lambda v: v[idx], sizes, OpClass.XLU)


def dynamic_update_slice(x, update, start_indices, *, allow_negative_indices=True):
  """`lax.dynamic_update_slice`: x with `update` written at `start_indices` (negative ones from the
  end unless `allow_negative_indices=False`; then clamped like XLA)."""
  if update.dtype != x.dtype:
    raise ShapeError(f"lax.dynamic_update_slice: update dtype {update.dtype} differs from operand dtype "
                     f"{x.dtype}; expected equal dtypes. Fix: cast the update with .astype({x.dtype}).")
  starts = _clamped_starts(x, start_indices, tuple(update.shape), "lax.dynamic_update_slice",
                           allow_negative_indices)
  idx = tuple(slice(s, s + n) for s, n in zip(starts, update.shape))
  data = None
  if _has_data(x, update):
    data = np.array(_np(x), copy=True)
    data[idx] = _np(update)
  return _out(data, tuple(x.shape), x.dtype, ready_of(x, update), OpClass.XLU, _is_arr(x, update))


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in
                 {"annotations", "np", "dt", "jnp", "Array", "ShapeError", "UnsupportedError",
                  "concrete_int", "functools", "user_frame_summary"})
