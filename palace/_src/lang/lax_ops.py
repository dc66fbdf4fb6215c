"""`palace.lax`: the lax subset kernels use (L4a)."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.executor import OpClass
from palace._src import validate
from palace._src.lang import numpy_ops as jnp
from palace._src.errors import ShapeError
from palace._src.lang.array import Array, concrete_int, ready_of
from palace._src.lang.numpy_base import _dtype_arg, _has_data, _is_arr, _np, _out
from palace._src.lang.numpy_elementwise import _elementwise, int_div, int_rem
from palace._src.lang.numpy_shape import _shape_op
from palace._src.lang.numpy_linalg import dot_general  # noqa: F401
from palace._src.lang.tpu_primitives import bitcast
from palace._src.lang.primitives import (axis_index, axis_size, cond, fori_loop, switch,  # noqa: F401
                                         while_loop)



def select(pred, on_true, on_false):
  return jnp.where(pred, on_true, on_false)


def broadcasted_iota(dtype, shape, dimension: int):
  shape = validate.as_dims(shape, "lax.broadcasted_iota shape", error=ShapeError)
  dimension = validate.as_int(dimension, "lax.broadcasted_iota dimension", error=ShapeError)
  d = _dtype_arg(dtype, "lax.broadcasted_iota")
  data = np.broadcast_to(np.arange(shape[dimension], dtype=d).reshape(
      [-1 if i == dimension else 1 for i in range(len(shape))]), shape)
  return _out(data, shape, d, 0, OpClass.CHEAP, False)


def iota(dtype, size: int):
  return jnp.arange(size, dtype=dtype)


def _trunc_div(a, b):
  return int_div(a, b) if a.dtype.kind in "iu" else np.true_divide(a, b)


def _trunc_rem(a, b):
  return int_rem(a, b) if a.dtype.kind in "iu" else np.fmod(a, b)


div = _elementwise(_trunc_div, OpClass.MEDIUM, name="div")
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


def _clamped_starts(x, start_indices, sizes, api):
  shape = x.shape
  if len(start_indices) != len(shape) or len(sizes) != len(shape):
    raise ShapeError(f"{api}: {len(start_indices)} start indices and {len(sizes)} sizes for an operand of "
                     f"rank {len(shape)}; expected one of each per dimension. Fix: pass {len(shape)} start "
                     f"indices and {len(shape)} sizes.")
  starts = []
  for s, size, dim in zip(start_indices, sizes, shape):
    if not 0 <= size <= dim:
      raise ShapeError(f"{api}: slice size {size} does not fit dimension {dim} of shape {shape}. "
                       f"Fix: use a slice size between 0 and {dim}.")
    v = concrete_int(s, f"{api} start")
    starts.append(0 if v < 0 else dim - size if v > dim - size else v)  # XLA clamps starts
  return starts


def dynamic_slice(x, start_indices, slice_sizes):
  """`lax.dynamic_slice` of a value (starts may be runtime scalars; clamped into bounds like XLA)."""
  sizes = validate.as_dims(slice_sizes, "lax.dynamic_slice slice_sizes", error=ShapeError)
  starts = _clamped_starts(x, start_indices, sizes, "lax.dynamic_slice")
  idx = tuple(slice(s, s + n) for s, n in zip(starts, sizes))
  return _shape_op(x, lambda v: v[idx], sizes, OpClass.XLU)


def dynamic_update_slice(x, update, start_indices):
  """`lax.dynamic_update_slice`: x with `update` written at (clamped) `start_indices`."""
  if update.dtype != x.dtype:
    raise ShapeError(f"lax.dynamic_update_slice: update dtype {update.dtype} differs from operand dtype "
                     f"{x.dtype}; expected equal dtypes. Fix: cast the update with .astype({x.dtype}).")
  starts = _clamped_starts(x, start_indices, tuple(update.shape), "lax.dynamic_update_slice")
  idx = tuple(slice(s, s + n) for s, n in zip(starts, update.shape))
  data = None
  if _has_data(x, update):
    data = np.array(_np(x), copy=True)
    data[idx] = _np(update)
  return _out(data, tuple(x.shape), x.dtype, ready_of(x, update), OpClass.XLU, _is_arr(x, update))


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in
                 {"annotations", "np", "dt", "jnp", "Array", "ShapeError", "concrete_int"})
