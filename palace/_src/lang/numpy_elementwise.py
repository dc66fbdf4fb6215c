"""`palace.numpy` elementwise ops (L4a): arithmetic, comparisons, logic, bit ops, math functions, where.

Numerics: narrow floats (bf16, f16, fp8) are computed in float32 and rounded once per op, which equals
native bf16 arithmetic for + - * / and sqrt.
"""
from __future__ import annotations

import math
import operator as _operator

import ml_dtypes
import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.executor import OpClass
from palace._src.errors import ShapeError, UnsupportedError, UsageError
from palace._src.lang import deferred
from palace._src.lang.host_math import pick as _math
from palace._src.lang.array import Array, WeakArray, dtype_of, promotion_type, ready_of, weakly_typed
from palace._src.lang.deferred import Deferred
from palace._src.lang.int_rejects import VECTOR_INT_REJECTS, refusal, scalar_mlir_op
from palace._src.lang.numpy_dtypes import _FLUSHED, _flush
from palace._src.lang.numpy_base import (_COMPUTE, _F32, _FLOATS, _I32, _I32_MAX, _I32_MIN, _broadcast_shapes,
                                         _current_ex, _has_data, _is_arr, _np, _out, _select, _weak_promotes)
from palace._src.util import keep, user_frame_summary

_IMPORTED = frozenset(globals())  # names above are imports, not this module's API


_PY_COMPARE = {np.equal: _operator.eq, np.not_equal: _operator.ne, np.less: _operator.lt,
               np.less_equal: _operator.le, np.greater: _operator.gt, np.greater_equal: _operator.ge}


def _rounded(x, rt: np.dtype, cd: np.dtype):
  """A non-Array operand of an op whose result type `rt` is a narrow float computed in `cd`: JAX
  converts a weak Python scalar to the array's dtype first (bf16(3.3) == 3.3 is True: 3.3 becomes
  3.296875), so it is rounded to `rt`, then widened."""
  return _np(x, rt).astype(cd)


def _mask_cast(name: str, args) -> bool:
  """`x != 0` / `x == 0` of an integer vector and a scalar zero: Mosaic's cast of a vector to a mask,
  which it compiles for 8-bit integers on TPU v5 and later, unlike the general 8-bit comparison
  (JAX's own tpu_ops_test runs int8 masks through jnp.where and `x != 0` there, skipping them only
  before v5: test_cast_vector_to_mask, test_concat_mask, test_i1_relayout_bw)."""
  if name not in ("equal", "not_equal") or len(args) != 2:
    return False
  for a in args:
    v = a._data if isinstance(a, Array) else a
    if np.ndim(v) == 0 and v is not None and not isinstance(v, bool) and v == 0:
      return True
  return False


def _all_lanes(args, shape) -> bool:
  """Whether an elementwise result of `shape` is lane-replicated (Array._lanes): every operand of its
  shape is, the others are 0-d (kernels cannot close over array constants)."""
  for a in args:
    if type(a) is Array and a.shape and (a.shape != shape or not a._lanes):
      return False
  return True


def _lane_broadcasts(ex, args, shape, dtype, ready: int) -> int:
  """Charge the XLU lane broadcast of every operand an elementwise op of result `shape` broadcasts
  across lanes ((..., 1) columns that are not lane-replicated, where the result has more than one lane),
  each after its operand is ready; the ready cycle of the op's operands with them."""
  if shape[-1] == 1:
    return ready
  for a in args:
    if type(a) is Array and a.shape and a.shape[-1] == 1 and not a._lanes:
      b = ex.vector_op(OpClass.LANE_BROADCAST, shape, dtype, a._ready)
      ready = b if b > ready else ready
  return ready


def _any_lanes(args) -> bool:
  for a in args:
    if type(a) is Array and a._lanes:
      return True
  return False


def _elementwise(fn, op_class: str, result: str = "same", name: str = ""):
  """Build an n-ary elementwise op. result: same | bool | float | int. The integer forms the TPU
  compiler rejects (int_rejects.py): vectors of the dtypes `VECTOR_INT_REJECTS[name]` names, 0-d
  values of the dtypes `scalar_mlir_op` names (`op.scalar_rejects`)."""
  rejects = VECTOR_INT_REJECTS.get(name)
  scalar_rejects = frozenset(d for d in dt.SUPPORTED if scalar_mlir_op(name, d) is not None) \
      if result == "same" else frozenset()

  scalar_fast = result in ("same", "bool")
  py_compare = _PY_COMPARE.get(fn) if result == "bool" else None
  chip = getattr(fn, "chip", fn)   # (a transcendental's chip rule; fn asks for the host-math diagnostic)

  def op(*args):
    if scalar_fast and len(args) == 2:
      # int32 scalar with a weak Python int (pl.program_id(i) == 0): the general path's steps, inlined
      a, b = args
      if type(a) is Array and type(b) is int and a.shape == () and a.dtype == _I32 and \
          a._data is not None and _I32_MIN <= b <= _I32_MAX:
        ex = _current_ex()
        if py_compare is not None and ex is not None:
          # both values are exact int32s: Python's comparison gives the ufunc's np.bool_ result
          return Array(np.True_ if py_compare(int(a._data), b) else np.False_, (), dt.bool_,
                       ex.scalar_op(a._ready))
        try:
          data = None if ex is None else fn(a._data, np.asarray(b, dtype=_I32))
        except ValueError:  # invalid operands: the general path raises the error
          data = None
        if data is not None:
          out_dtype = dt.bool_ if result == "bool" else _I32
          if data.dtype != out_dtype:
            data = data.astype(out_dtype)
          return Array(data, (), out_dtype, ex.scalar_op(a._ready))
    if len(args) == 2 and type(args[0]) is Array and type(args[1]) is Array and \
        args[0].dtype == args[1].dtype:
      # two Arrays of one dtype: the pass below, whose result type is theirs; of one shape (acc + dot)
      # or one of them 0-d (x * scale, a typed constant), the larger one's shape, else the broadcast
      # of both (x - max(x, axis=-1, keepdims=True))
      a, b = args
      same = a.shape == b.shape or not b.shape or not a.shape
      shape = (a.shape or b.shape) if same else _broadcast_shapes(op.__name__, args)
      rt, any_array = a.dtype, True
      has_data = a._data is not None and b._data is not None
      ready = a._ready if a._ready > 0 else 0
      if b._ready > ready:
        ready = b._ready
    else:
      # One pass over the operands: shapes/dtypes for the fast path, readiness and data presence.
      shape = strong = None
      same = has_data = True
      any_array = False
      ready = 0
      for a in args:
        ta = type(a)
        if ta is Array:
          any_array = True
          if a._data is None:
            has_data = False
          if a._ready > ready:
            ready = a._ready
          if shape is None:
            shape, strong = a.shape, a.dtype
          elif a.shape != shape or a.dtype != strong:
            same = False
        elif ta is not int and ta is not float and ta is not bool:
          same = False
          if isinstance(a, Array):
            any_array = True
            has_data = has_data and a._data is not None
            ready = a._ready if a._ready > ready else ready
      if same and strong is not None and (strong in _FLOATS or not _weak_promotes(args, strong)):
        rt = strong
      else:
        rt = dt.result_type(*[promotion_type(a) for a in args])
        shape = _broadcast_shapes(op.__name__, args)
    if result == "float" and rt not in _FLOATS:
      rt = _F32
    out_dtype = dt.bool_ if result == "bool" else rt
    data = None
    ex = _current_ex()
    if has_data and not (ex is not None and ex.timing_only and shape):
      cd = _COMPUTE.get(rt, rt)
      if len(args) == 2:  # the list below, unrolled for binary ops
        a, b = args
        vals = ((a._data if a._data.dtype == cd else a._data.astype(cd)) if type(a) is Array
                else _np(a, cd) if cd is rt else _rounded(a, rt, cd),
                (b._data if b._data.dtype == cd else b._data.astype(cd)) if type(b) is Array
                else _np(b, cd) if cd is rt else _rounded(b, rt, cd))
      else:
        vals = [(a._data if a._data.dtype == cd else a._data.astype(cd)) if type(a) is Array
                else _np(a, cd) if cd is rt else _rounded(a, rt, cd) for a in args]
      try:
        if ex is not None:  # kernels run under np.errstate(all="ignore") set once per core (sim)
          data = (fn if ex.host_math else chip)(*vals)
        else:
          with np.errstate(all="ignore"):
            data = chip(*vals)
      except (ValueError, TypeError) as e:  # integers to negative powers, bool - bool (JAX rejects both)
        raise ShapeError(f"Invalid operands for jnp.{op.__name__}{' ' + ex.where() if ex else ''}: {e} "
                         f"(dtypes {', '.join(str(dtype_of(a)) for a in args)}). Fix: pass operands JAX "
                         f"accepts for it (e.g. cast integers to float for negative powers). "
                         f"({user_frame_summary()})") from None
      if data.dtype != out_dtype:
        data = data.astype(out_dtype)
    if ex is None:
      return _out(data, shape, out_dtype, ready, op_class, any_array)
    if shape:  # = _out(...) inside a kernel, inlined
      if rejects is not None and rt in rejects and ex.sparsecore is None and \
          not _mask_cast(op.__name__, args):
        raise refusal(op.__name__, rt, shape, f"{ex.where()} ({user_frame_summary()})")
      if ex.timing_only:
        data = None
      if not same:   # (operands of other shapes: (N, 1) columns are broadcast across lanes first)
        ready = _lane_broadcasts(ex, args, shape, out_dtype, ready)
      ready = ex.vector_op(op_class, shape, out_dtype, ready)
      a0 = args[0]
      if a0._lanes if type(a0) is Array and a0.shape else _any_lanes(args):
        return Array(data, shape, out_dtype, ready, _all_lanes(args, shape))
    else:
      if rt in scalar_rejects and ex.sparsecore is None:
        raise refusal(op.__name__, rt, (), f"{ex.where()} ({user_frame_summary()})")
      ready = ex.scalar_op(ready)
    return Array(data, shape, out_dtype, ready)

  op.__name__ = name or getattr(fn, "__name__", "op")
  op.__doc__ = f"Elementwise `{op.__name__}` (cost class: {op_class})."
  op.scalar_form = (fn, result)
  op.op_class = op_class
  op.rejects = rejects
  op.scalar_rejects = scalar_rejects
  return op


def on_scalars(op, dtype, arity: int):
  """`op` (an elementwise op of this module, or lax's div/rem) specialised to `arity` 0-d Arrays of
  `dtype` inside a kernel, for callers that know their operands' types up front (palace.jax's
  compiled jaxpr programs, one call per scalar equation): the same NumPy function on the operands'
  data, the same result dtype and the same one `scalar_op` charge as `op`, without its operand
  analysis. Operands of any other kind (host values, other dtypes or shapes, no data) take `op`
  itself. None where that form does not apply (narrow floats, which compute in float32)."""
  form = getattr(op, "scalar_form", None)
  dtype = np.dtype(dtype)
  if form is None or _COMPUTE.get(dtype, dtype) != dtype or arity not in (1, 2) or \
      dtype in getattr(op, "scalar_rejects", ()) or (getattr(op, "int_only", False) and dt.is_float(dtype)):
    return None
  fn, result = form
  if result == "float" and dtype not in _FLOATS:
    return None
  out = dt.bool_ if result == "bool" else dtype   # (np.dtype gives the instance data dtypes are)
  chip = getattr(fn, "chip", fn)   # (as in _elementwise)

  def finish(data, ready, ex):
    if data.dtype != out:
      data = data.astype(out)
    return Array(data, (), out, ex.scalar_op(ready))

  if arity == 1:
    def unary(a):
      if type(a) is Array and a.dtype is dtype and not a.shape:
        da, ex = a._data, _current_ex()
        if da is not None and ex is not None and da.dtype is dtype:
          return finish((fn if ex.host_math else chip)(da), a._ready, ex)
      return op(a)
    return unary

  def binary(a, b):
    if type(a) is Array and type(b) is Array and a.dtype is dtype and b.dtype is dtype and \
        not a.shape and not b.shape:
      da, db, ex = a._data, b._data, _current_ex()
      if da is not None and db is not None and ex is not None and da.dtype is dtype and \
          db.dtype is dtype:
        try:
          data = (fn if ex.host_math else chip)(da, db)
        except ValueError:   # invalid operands: `op` raises its error
          return op(a, b)
        ra, rb = a._ready, b._ready
        return finish(data, ra if ra > rb else rb, ex)
    return op(a, b)
  return binary


def on_vectors(op, dtype, shape, arity: int, in_shapes=None):
  """`op` specialised to `arity` Arrays of one `dtype` and one non-empty `shape` (in a binary op one of
  them may be 0-d) inside a kernel, for callers that know their operands' types up front (palace.jax's
  compiled equations on blocks): the steps `op` takes for such operands (data through the compute
  dtype, result dtype, one `vector_op` of op's cost class on the result shape), without its operand
  analysis. `in_shapes`: a binary op's two operand shapes instead, when they differ from `shape` but
  broadcast to it (a (128, 128) block with a (128, 1) column: op's steps are the same, NumPy
  broadcasts). Operands of any other kind take `op` itself. None where the form does not apply."""
  form, op_class = getattr(op, "scalar_form", None), getattr(op, "op_class", None)
  dtype, shape = np.dtype(dtype), tuple(shape)
  if form is None or op_class is None or not shape or arity not in (1, 2) or \
      dtype in (getattr(op, "rejects", None) or ()) or \
      (getattr(op, "int_only", False) and dt.is_float(dtype)):
    return None
  fn, result = form
  chip = getattr(fn, "chip", fn)   # (as in _elementwise)
  rt = _F32 if result == "float" and dtype not in _FLOATS else dtype
  out = dt.bool_ if result == "bool" else rt
  cd = _COMPUTE.get(rt, rt)

  def finish(data, ready, ex, lanes=False):
    if ex.timing_only:
      data = None
    elif data is not None and data.dtype != out:
      data = data.astype(out)
    return Array(data, shape, out, ex.vector_op(op_class, shape, out, ready), lanes)

  if arity == 1:
    def unary(a):
      ex = _current_ex()
      if ex is None or type(a) is not Array or a.dtype != dtype or a.shape != shape:
        return op(a)
      da = a._data
      if da is not None and not ex.timing_only:
        try:
          da = (fn if ex.host_math else chip)(da if da.dtype == cd else da.astype(cd))
        except ValueError:   # invalid operands: `op` raises its error
          return op(a)
      return finish(da, a._ready if a._ready > 0 else 0, ex, a._lanes)
    return unary

  def binary(a, b):   # (one operand may be 0-d: a typed constant, broadcast as op broadcasts it)
    ex = _current_ex()
    if ex is None or type(a) is not Array or type(b) is not Array or a.dtype != dtype or \
        b.dtype != dtype:
      return op(a, b)
    sa, sb = a.shape, b.shape
    if in_shapes is not None:
      if sa != in_shapes[0] or sb != in_shapes[1]:
        return op(a, b)
    elif not ((sa == shape and (sb == shape or not sb)) or (sb == shape and not sa)):
      return op(a, b)
    da, db = a._data, b._data
    data = None
    if da is not None and db is not None and not ex.timing_only:
      try:
        data = (fn if ex.host_math else chip)(da if da.dtype == cd else da.astype(cd),
                                              db if db.dtype == cd else db.astype(cd))
      except ValueError:
        return op(a, b)
    ready = a._ready if a._ready > 0 else 0
    if b._ready > ready:
      ready = b._ready
    if in_shapes is not None:
      return finish(data, _lane_broadcasts(ex, (a, b), shape, out, ready), ex)
    return finish(data, ready, ex, (a._lanes or not sa) and (b._lanes or not sb) and (a._lanes or b._lanes))
  return binary


def _int_only(fn, name):
  def f(*args):
    for a in args:
      d = dtype_of(a)
      if isinstance(d, np.dtype) and dt.is_float(d):
        raise ShapeError(f"{name} requires integer or bool operands; got {d}. Fix: cast with "
                       f".astype(jnp.int32), or bitcast floats with pltpu.bitcast.")
    return fn(*args)
  f.scalar_form, f.int_only, f.op_class, f.rejects = fn.scalar_form, True, fn.op_class, fn.rejects
  f.scalar_rejects, f.__name__ = fn.scalar_rejects, name
  return f


_add = _elementwise(np.add, OpClass.CHEAP, name="add")


def add(x1, x2):
  if type(x1) is Deferred or type(x2) is Deferred:  # a matmul sum grows without being computed
    later = deferred.add(_current_ex(), x1, x2)
    if later is not None:
      return later
  return _add(x1, x2)


add.__doc__ = _add.__doc__
# the specialised forms (on_scalars, on_vectors) compute with np.add for Arrays and call `add` itself
# for anything else, a deferred matmul sum included (0-d values are never Deferred)
add.scalar_form, add.op_class, add.rejects = _add.scalar_form, _add.op_class, _add.rejects
add.scalar_rejects = _add.scalar_rejects
subtract = _elementwise(np.subtract, OpClass.CHEAP, name="subtract")
multiply = _elementwise(np.multiply, OpClass.CHEAP, name="multiply")
true_divide = divide = _elementwise(np.true_divide, OpClass.MEDIUM, "float", name="divide")
maximum = _elementwise(np.maximum, OpClass.CHEAP, name="maximum")
minimum = _elementwise(np.minimum, OpClass.CHEAP, name="minimum")
power = _elementwise(np.power, OpClass.MEDIUM, name="power")
arctan2 = _elementwise(np.arctan2, OpClass.TRANSCENDENTAL, "float", name="arctan2")
equal = _elementwise(np.equal, OpClass.CHEAP, "bool", name="equal")
not_equal = _elementwise(np.not_equal, OpClass.CHEAP, "bool", name="not_equal")
less = _elementwise(np.less, OpClass.CHEAP, "bool", name="less")
less_equal = _elementwise(np.less_equal, OpClass.CHEAP, "bool", name="less_equal")
greater = _elementwise(np.greater, OpClass.CHEAP, "bool", name="greater")
greater_equal = _elementwise(np.greater_equal, OpClass.CHEAP, "bool", name="greater_equal")
logical_and = _elementwise(np.logical_and, OpClass.CHEAP, "bool", name="logical_and")
logical_or = _elementwise(np.logical_or, OpClass.CHEAP, "bool", name="logical_or")
logical_xor = _elementwise(np.logical_xor, OpClass.CHEAP, "bool", name="logical_xor")
logical_not = _elementwise(np.logical_not, OpClass.CHEAP, "bool", name="logical_not")
bitwise_and = _int_only(_elementwise(np.bitwise_and, OpClass.CHEAP, name="bitwise_and"), "bitwise_and")
bitwise_or = _int_only(_elementwise(np.bitwise_or, OpClass.CHEAP, name="bitwise_or"), "bitwise_or")
bitwise_xor = _int_only(_elementwise(np.bitwise_xor, OpClass.CHEAP, name="bitwise_xor"), "bitwise_xor")
bitwise_not = invert = _int_only(_elementwise(np.invert, OpClass.CHEAP, name="invert"), "invert")
left_shift = _int_only(_elementwise(np.left_shift, OpClass.CHEAP, name="left_shift"), "left_shift")
right_shift = _int_only(_elementwise(np.right_shift, OpClass.CHEAP, name="right_shift"), "right_shift")


def div_ints(x: int, y: int) -> int:
  """`lax.div` of two integers of one dtype, on Python ints, before the wrap to that dtype: the
  quotient rounded toward zero; x / 0 = -1 (all ones once wrapped); INT_MIN / -1 = 2**31 wraps to
  INT_MIN. The one definition of int_div's 0-d form and of palace.jax's fused scalar code."""
  if y == 0:
    return -1
  q = (-x if x < 0 else x) // (-y if y < 0 else y)   # (this module's `abs` is jnp.abs)
  return q if (x < 0) == (y < 0) else -q


def rem_ints(x: int, y: int) -> int:
  """`lax.rem` of two integers on Python ints: the sign of the dividend; x % 0 = x; INT_MIN % -1 = 0
  (|result| < |y|, or x itself: always in range, no wrap). The one definition of int_rem's 0-d form
  and of palace.jax's fused scalar code."""
  if y == 0:
    return x
  r = x % y                     # Python's: the sign of the divisor; lax.rem's: that of the dividend
  if r and (r < 0) != (x < 0):
    r -= y
  return r


def _one_divisor(a: np.ndarray, b: np.ndarray):
  """The divisor of an integer division of the block `a` as a NumPy scalar of a's dtype when it is one
  value for every element and the result has a's shape (a 0-d `b`, or a broadcast one: `lax.rem(x,
  5)` broadcasts its literal with zero strides); else None. With one divisor the special cases (0, -1)
  are whole-block cases and the division itself is NumPy's by a scalar (libdivide for floor_divide),
  not an element-wise select around a division by an array (47 -> 15 us for a (64, 128) int32
  lax.rem)."""
  if not a.ndim or a.dtype != b.dtype:
    return None
  if b.ndim and (b.shape != a.shape or any(b.strides) or not b.size):
    return None
  return b[(0,) * b.ndim]


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`lax.div` of integers as XLA defines it (and JAX's interpret mode computes it): the quotient
  rounded toward zero; x / 0 = -1 (all ones: the unsigned maximum); INT_MIN / -1 = INT_MIN.
  Integer arithmetic only (a float quotient's cast of 2**31 would be machine-dependent). Two 0-d
  operands of one dtype of up to 32 bits (scalar index arithmetic) are computed on Python ints
  (`div_ints`), wrapped to the dtype by NumPy's int64 cast."""
  if not a.ndim and not b.ndim and a.dtype == b.dtype and a.dtype.itemsize <= 4:
    return np.array(div_ints(int(a), int(b)), np.int64).astype(a.dtype)
  v = _one_divisor(a, b)
  if v is not None:
    signed = a.dtype.kind == "i"
    if v == 0:
      return np.full(a.shape, -1 if signed else np.iinfo(a.dtype).max, a.dtype)
    with np.errstate(all="ignore"):
      if signed and v == -1:
        return np.negative(a)   # (wraps: INT_MIN / -1 = INT_MIN)
      q = np.floor_divide(a, v)
      if signed:   # floor -> toward zero: one up where the signs differ and the division is inexact
        np.add(q, 1, out=q, where=((a - q * v) != 0) & ((a > 0) if v < 0 else (a < 0)))
    return q
  a, b = np.broadcast_arrays(a, b)
  zero = b == 0
  s = np.where(zero, 1, b)
  if a.dtype.kind == "i":
    s = np.where((s == -1) & (a == np.iinfo(a.dtype).min), 1, s)   # INT_MIN / 1 = INT_MIN
  with np.errstate(all="ignore"):
    q = np.floor_divide(a, s)
    if a.dtype.kind == "i":
      q = q + ((np.remainder(a, s) != 0) & ((a < 0) != (s < 0))).astype(q.dtype)
  return np.where(zero, np.array(-1).astype(a.dtype), q).astype(a.dtype)


def int_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`lax.rem` of integers as XLA defines it: the sign of the dividend; x % 0 = x; INT_MIN % -1 = 0.
  Two 0-d operands of one dtype (scalar index arithmetic) are computed on Python ints (`rem_ints`):
  the same rules without NumPy's broadcasting and error state."""
  if not a.ndim and not b.ndim and a.dtype == b.dtype:
    return np.array(rem_ints(int(a), int(b)), a.dtype)
  v = _one_divisor(a, b)
  if v is not None:
    if v == 0:
      return a.copy()
    if v == -1:
      return np.zeros_like(a)
    with np.errstate(all="ignore"):
      return np.fmod(a, v)
  a, b = np.broadcast_arrays(a, b)
  zero = b == 0
  with np.errstate(all="ignore"):
    r = np.fmod(a, np.where(zero | (b == -1), 1, b))   # x % -1 = 0, which also covers INT_MIN
  return np.where(zero, a, r).astype(a.dtype)


def _floor_div(a, b):
  """`jnp.floor_divide` as JAX defines it for integers: lax.div, minus one where the signs differ and
  the remainder is not zero (so x // 0 is -1 for x == 0, else -2; unsigned x // 0 is all ones)."""
  if a.dtype.kind in "iu":
    v = _one_divisor(a, b)
    if v is not None and v != 0:
      if a.dtype.kind == "i" and v == -1:
        with np.errstate(all="ignore"):
          return np.negative(a)   # (INT_MIN // -1 = INT_MIN, as lax.div gives it)
      return np.floor_divide(a, v)
    q = int_div(a, b)
    if a.dtype.kind == "u":
      return q
    a, b = np.broadcast_arrays(a, b)
    step = (np.sign(a) != np.sign(b)) & (int_rem(a, b) != 0)
    return (q - step.astype(q.dtype)).astype(a.dtype)
  return np.floor_divide(a, b)


def _mod(a, b):
  if a.dtype.kind in "iu":
    v = _one_divisor(a, b)
    if v is not None:   # x % 0 = 0 (as the remainder by 1 below)
      return np.zeros_like(a) if v == 0 else np.remainder(a, v)
    return np.remainder(a, np.where(b == 0, 1, b))
  return np.remainder(a, b)


floor_divide = _elementwise(_floor_div, OpClass.MEDIUM, name="floor_divide")
remainder = mod = _elementwise(_mod, OpClass.MEDIUM, name="remainder")

negative = _elementwise(np.negative, OpClass.CHEAP, name="negative")
positive = _elementwise(np.positive, OpClass.CHEAP, name="positive")
abs = absolute = _elementwise(np.abs, OpClass.CHEAP, name="abs")  # noqa: A001
def _sign(x):
  """XLA's sign: zeros keep their sign (sign(-0.0) = -0.0, where NumPy gives 0.0); NaN stays NaN."""
  return np.where(x == 0, x * 0, np.sign(x)) if dt.is_float(x.dtype) else np.sign(x)


sign = _elementwise(_sign, OpClass.CHEAP, name="sign")
square = _elementwise(np.square, OpClass.CHEAP, name="square")
_floor = _elementwise(np.floor, OpClass.CHEAP, "float", name="floor")
_ceil = _elementwise(np.ceil, OpClass.CHEAP, "float", name="ceil")
_round = _elementwise(np.round, OpClass.CHEAP, "float", name="round")
_trunc = _elementwise(np.trunc, OpClass.CHEAP, "float", name="trunc")


def _integral(x) -> bool:
  """An integer or bool operand (Array, NumPy value or Python scalar)."""
  d = x.dtype if isinstance(x, (Array, np.ndarray, np.generic)) else np.asarray(x).dtype
  return not dt.is_float(d)


def _float_only(op):
  """jnp.floor / ceil / trunc: integers and bools come back unchanged, as in JAX (no work on the TPU;
  NumPy's ufuncs would make them float and lose integers above 2**24)."""
  def f(x):
    if _integral(x):
      if isinstance(x, Array):
        return x
      v = np.asarray(x)
      return _out(v, v.shape, v.dtype, 0, OpClass.CHEAP, False)
    return op(x)
  f.__name__, f.__doc__ = op.__name__, op.__doc__ + " Integers and bools are returned unchanged."
  f.scalar_form, f.op_class = op.scalar_form, op.op_class
  return f


floor, ceil, trunc = _float_only(_floor), _float_only(_ceil), _float_only(_trunc)
_round_int = _float_only(_round)   # (host integers: returned as NumPy data)


def round(x, decimals=0):  # noqa: A001
  """`jnp.round` (round half to even): integers come back unchanged (decimals >= 0); with `decimals`
  a float is scaled by 10**decimals in its own dtype, rounded and scaled back, as JAX does (float16
  through float32)."""
  decimals = validate.as_int(decimals, "decimals of jnp.round", error=ShapeError)
  if _integral(x):
    if decimals < 0:
      ex = _current_ex()
      raise UnsupportedError(f"jnp.round of integers with decimals={decimals}"
                             f"{' ' + ex.where() if ex else ''} ({user_frame_summary()}): "
                             f"JAX does not implement decimals < 0 for integers either. Fix: round in "
                             f"float (x.astype(jnp.float32)) or divide, round and multiply yourself.")
    return x if isinstance(x, Array) else _round_int(x)
  if decimals == 0:
    return _round(x)
  d = dtype_of(x)
  d = d if isinstance(d, np.dtype) else dt.float32
  if decimals > np.log10(float(ml_dtypes.finfo(d).max)):
    return x
  y = x.astype(dt.float32) if d == dt.float16 else x
  factor = 10 ** decimals
  out = divide(_round(multiply(y, factor)), factor)
  return out.astype(d) if d == dt.float16 else out


round.scalar_form, round.op_class = _round.scalar_form, _round.op_class
exp = _elementwise(_math('exp', np.exp), OpClass.EXP, "float", name="exp")
exp2 = _elementwise(_math('exp2', np.exp2), OpClass.TRANSCENDENTAL, "float", name="exp2")
_expm1 = _elementwise(np.expm1, OpClass.TRANSCENDENTAL, "float", name="expm1")


def expm1(x):
  """`jnp.expm1`: computed on the host (index maps, constants); in a kernel an UnsupportedError, as the
  TPU compiler has no expm1 (measured on a TPU v5e; JAX 0.12's Pallas TPU lowering has no rule for it
  in TensorCore or SparseCore kernels either)."""
  ex = _current_ex()
  if ex is not None and isinstance(x, Array):
    raise UnsupportedError(
        f"jnp.expm1 of a {x.dtype} value of shape {x.shape} {ex.where()} ({user_frame_summary()}): the "
        f"TPU compiler has no expm1 (Mosaic, measured on a TPU v5e: 'Unimplemented primitive in Pallas "
        f"TPU lowering for tc: expm1'; JAX 0.12's lowering has no rule for it either). Fix: compute "
        f"jnp.exp(x) - 1, which loses relative accuracy for |x| below ~1e-3; there use the series "
        f"x + x*x/2 + x*x*x/6 (jnp.where(jnp.abs(x) < 1e-3, series, jnp.exp(x) - 1)).")
  return _expm1(x)


log = _elementwise(_math('log', np.log), OpClass.TRANSCENDENTAL, "float", name="log")
log2 = _elementwise(_math('log2', np.log2), OpClass.TRANSCENDENTAL, "float", name="log2")


def _log1p(x: np.ndarray) -> np.ndarray:
  """log1p with denormal float32 / bf16 inputs read as signed zero, as the TPU reads them (a v5e's
  log1p of a denormal x is +-0, not x: benchmarks/hw/data/v5e-numerics-2026-12-05.jsonl, log1p_f32)."""
  return np.log1p(_flush(x, inputs=True) if x.dtype in _FLUSHED else x)


log1p = _elementwise(_math('log1p', _log1p), OpClass.TRANSCENDENTAL, "float", name="log1p")
tanh = _elementwise(_math('tanh', np.tanh), OpClass.TRANSCENDENTAL, "float", name="tanh")
sqrt = _elementwise(_math('sqrt', np.sqrt), OpClass.TRANSCENDENTAL, "float", name="sqrt")
rsqrt = _elementwise(_math('rsqrt', lambda x: 1.0 / np.sqrt(x)), OpClass.TRANSCENDENTAL, "float",
                     name="rsqrt")
reciprocal = _elementwise(np.reciprocal, OpClass.TRANSCENDENTAL, "float", name="reciprocal")
sin = _elementwise(_math('sin', np.sin), OpClass.EXPENSIVE, "float", name="sin")
cos = _elementwise(_math('cos', np.cos), OpClass.EXPENSIVE, "float", name="cos")
tan = _elementwise(_math('tan', np.tan), OpClass.EXPENSIVE, "float", name="tan")
arctan = _elementwise(_math('arctan', np.arctan), OpClass.EXPENSIVE, "float", name="arctan")
sinh = _elementwise(_math('sinh', np.sinh), OpClass.TRANSCENDENTAL, "float", name="sinh")
cosh = _elementwise(_math('cosh', np.cosh), OpClass.TRANSCENDENTAL, "float", name="cosh")
isnan = _elementwise(np.isnan, OpClass.CHEAP, "bool", name="isnan")
isinf = _elementwise(np.isinf, OpClass.CHEAP, "bool", name="isinf")
isfinite = _elementwise(np.isfinite, OpClass.CHEAP, "bool", name="isfinite")
logistic = _elementwise(_math('logistic', lambda x: 1.0 / (1.0 + np.exp(-x))), OpClass.TRANSCENDENTAL,
                        "float", name="logistic")


def _erf(x):
  """Vectorised erf in float64: Taylor series for |x| < 0.5, Abramowitz-Stegun 7.1.26 (abs error
  1.5e-7, relative error < 3e-7 there) beyond; below float32 rounding everywhere."""
  v = np.asarray(x, np.float64)
  a = np.abs(v)
  t = 1.0 / (1.0 + 0.3275911 * a)
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  far = 1.0 - poly * np.exp(-a * a)
  v2 = v * v
  near = a * (1.0 + v2 * (-1 / 3 + v2 * (1 / 10 + v2 * (-1 / 42 + v2 * (1 / 216 + v2 * (-1 / 1320 + v2
                                                                                      / 9360))))))
  near *= 2.0 / math.sqrt(math.pi)
  return (np.sign(v) * np.where(a < 0.5, near, far)).astype(x.dtype)


erf = _elementwise(_math('erf', _erf), OpClass.TRANSCENDENTAL, "float", name="erf")


# (each operand's type, shape, and x's and y's dtypes) -> (result dtype, shape): a memo of where's type
# promotion and broadcasting for kernel values and Python scalars (a causal mask's jnp.where(mask, s,
# -inf) runs every grid step)
_WHERES: dict = {}
_WHERE_KINDS = frozenset({Array, WeakArray, bool, int, float})


def where(condition, x=None, y=None):
  """`jnp.where(c, x, y)` (the one-argument form is not available in kernels)."""
  if x is None or y is None:
    raise UsageError("jnp.where(condition) with one argument has a data-dependent shape. Fix: pass x "
                     "and y, jnp.where(condition, x, y).")
  tc, tx, ty = type(condition), type(x), type(y)
  key = None
  if tc in _WHERE_KINDS and tx in _WHERE_KINDS and ty in _WHERE_KINDS:   # (not NumPy values)
    key = (tc, tx, ty, getattr(condition, "shape", None), getattr(x, "shape", None),
           getattr(y, "shape", None), getattr(x, "dtype", None), getattr(y, "dtype", None))
    hit = _WHERES.get(key)
  if key is not None and hit is not None:
    rt, shape = hit
  else:
    rt = dt.result_type(promotion_type(x), promotion_type(y))
    shape = _broadcast_shapes("where", (condition, x, y))
    if key is not None:
      keep(_WHERES, key, (rt, shape))
  data = None
  ex = executor.maybe_current()
  if not (ex is not None and ex.timing_only and shape) and _has_data(condition, x, y):
    data = _select(_np(condition, dt.bool_), _np(x, rt), _np(y, rt))
  out = _out(data, shape, rt, ready_of(condition, x, y), OpClass.CHEAP, _is_arr(condition, x, y))
  return weakly_typed(out) if type(x) in _PY_SCALARS and type(y) in _PY_SCALARS else out   # (as JAX)


_PY_SCALARS = (bool, int, float)


def where_on_scalars(dtype):
  """`where(c, x, y)` specialised to a bool 0-d Array `c` and 0-d Arrays `x`, `y` of `dtype` inside a
  kernel (see `on_scalars`): the same NumPy where and one `scalar_op` charge; other operands take
  `where` itself."""
  dtype = np.dtype(dtype)
  b = dt.bool_

  def select(c, x, y):
    if type(c) is Array and type(x) is Array and type(y) is Array and c.dtype is b and \
        x.dtype is dtype and y.dtype is dtype and not (c.shape or x.shape or y.shape):
      dc, dx, dy, ex = c._data, x._data, y._data, _current_ex()
      if ex is not None and dc is not None and dx is not None and dy is not None and \
          dc.dtype is b and dx.dtype is dtype and dy.dtype is dtype:
        return Array(np.where(dc, dx, dy), (), dtype, ex.scalar_op(ready_of(c, x, y)))
    return where(c, x, y)
  return select


def clip(x, min=None, max=None):  # noqa: A002
  if min is not None:
    x = maximum(x, min)
  if max is not None:
    x = minimum(x, max)
  return x


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _IMPORTED)
