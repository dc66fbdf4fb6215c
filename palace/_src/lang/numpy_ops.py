"""`palace.numpy`: the jnp subset kernels use (L4a).

Inside a kernel the results are `Array`s and every op is charged to the virtual core through the
executor (`vector_op` / `matmul` / `scalar_op`). On the host (no kernel running) the same functions
return plain NumPy arrays with JAX's dtype defaults (int32 / float32), so they can build kernel inputs.

Numerics: narrow floats (bf16, f16, fp8) are computed in float32 and rounded once per op, which equals
native bf16 arithmetic for + - * / and sqrt. Matmuls live in `numpy_linalg`.
"""
from __future__ import annotations

import builtins
import math
import operator as _operator

import ml_dtypes
import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.errors import ShapeError, UsageError
from palace._src.lang import deferred
from palace._src.lang.array import Array, dtype_of, ready_of
from palace._src.lang.deferred import Deferred
from palace._src.util import user_frame_summary



class _ScalarType(type):
  """`jnp.float32` & co.: usable wherever a dtype is (np.dtype(jnp.float32), ==, dtype=...) and callable
  like JAX's scalar types: `jnp.float32(x)` is `jnp.asarray(x, jnp.float32)`."""

  def __call__(cls, x):
    return asarray(x, cls.dtype)

  def __eq__(cls, other):
    try:
      return cls.dtype == np.dtype(other)
    except TypeError:
      return NotImplemented

  def __hash__(cls):
    return hash(cls.dtype)

  def __getattr__(cls, name):
    if name.startswith("_"):  # numpy probes protocols (__array_interface__, _type_, ...) on dtype-likes
      raise AttributeError(name)
    return getattr(cls.dtype, name)

  def __repr__(cls):
    return f"jnp.{cls.dtype.name}"


def _scalar_type(d: np.dtype) -> _ScalarType:
  return _ScalarType(d.name, (), {"dtype": d})


# dtype names re-exported by palace.numpy
float32, bfloat16, float16 = _scalar_type(dt.float32), _scalar_type(dt.bfloat16), _scalar_type(dt.float16)
float8_e4m3fn, float8_e5m2 = _scalar_type(dt.float8_e4m3fn), _scalar_type(dt.float8_e5m2)
int8, int16, int32 = _scalar_type(dt.int8), _scalar_type(dt.int16), _scalar_type(dt.int32)
uint8, uint16, uint32 = _scalar_type(dt.uint8), _scalar_type(dt.uint16), _scalar_type(dt.uint32)
int4, uint4, bool_ = _scalar_type(dt.int4), _scalar_type(dt.uint4), _scalar_type(dt.bool_)
float64, int64 = _scalar_type(np.dtype(np.float64)), _scalar_type(np.dtype(np.int64))
finfo, iinfo = ml_dtypes.finfo, ml_dtypes.iinfo
pi, e, inf, nan = math.pi, math.e, math.inf, math.nan
newaxis = None
ndarray = Array
dtype = np.dtype

_F32 = dt.float32
_I32 = dt.int32
_I32_MIN, _I32_MAX = -2**31, 2**31 - 1
_current_ex = executor._current.get  # executor.maybe_current without a Python frame


_FLOATS = frozenset({dt.float32, dt.bfloat16, dt.float16, dt.float8_e4m3fn, dt.float8_e5m2})
_COMPUTE = {dt.bfloat16: _F32, dt.float16: _F32, dt.float8_e4m3fn: _F32, dt.float8_e5m2: _F32}


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
    raise ShapeError(f"Python int {x} is out of range for {d}: a weak Python scalar takes the dtype of the "
                     f"array it meets (JAX raises OverflowError too); expected a value that fits {d}. Use "
                     f"an explicit jnp.int32(...) or widen the array with .astype(jnp.int32). "
                     f"({user_frame_summary()})") from None


def _out(data, shape, dtype, ready, op_class, any_array):
  """Wrap a result: an Array charged to the core inside a kernel, NumPy data on the host."""
  ex = _current_ex()
  if ex is None:
    if any_array:
      raise UsageError("A palace.Array was used outside its kernel.")
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


# ------------------------------------------------------------------------------- elementwise
_PY_COMPARE = {np.equal: _operator.eq, np.not_equal: _operator.ne, np.less: _operator.lt,
               np.less_equal: _operator.le, np.greater: _operator.gt, np.greater_equal: _operator.ge}


def _elementwise(fn, op_class: str, result: str = "same", name: str = ""):
  """Build an n-ary elementwise op. result: same | bool | float | int."""

  scalar_fast = result in ("same", "bool")
  py_compare = _PY_COMPARE.get(fn) if result == "bool" else None

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
        args[0].shape == args[1].shape and args[0].dtype == args[1].dtype:
      # two Arrays of one shape and dtype (acc + dot): the pass below, whose result type is theirs
      a, b = args
      shape, rt, any_array = a.shape, a.dtype, True
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
        rt = dt.result_type(*[dtype_of(a) for a in args])
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
                else _np(a, cd),
                (b._data if b._data.dtype == cd else b._data.astype(cd)) if type(b) is Array
                else _np(b, cd))
      else:
        vals = [(a._data if a._data.dtype == cd else a._data.astype(cd)) if type(a) is Array
                else _np(a, cd) for a in args]
      try:
        if ex is not None:  # kernels run under np.errstate(all="ignore") set once per core (sim)
          data = fn(*vals)
        else:
          with np.errstate(all="ignore"):
            data = fn(*vals)
      except ValueError as e:  # e.g. integers to negative integer powers (JAX rejects them too)
        raise ShapeError(f"Invalid operands for jnp.{op.__name__}{' ' + ex.where() if ex else ''}: {e} "
                         f"(dtypes {', '.join(str(dtype_of(a)) for a in args)}). "
                         f"({user_frame_summary()})") from None
      if data.dtype != out_dtype:
        data = data.astype(out_dtype)
    if ex is None:
      return _out(data, shape, out_dtype, ready, op_class, any_array)
    if shape:  # = _out(...) inside a kernel, inlined
      if ex.timing_only:
        data = None
      ready = ex.vector_op(op_class, shape, out_dtype, ready)
    else:
      ready = ex.scalar_op(ready)
    return Array(data, shape, out_dtype, ready)

  op.__name__ = name or getattr(fn, "__name__", "op")
  op.__doc__ = f"Elementwise `{op.__name__}` (cost class: {op_class})."
  return op


def _broadcast_shapes(name: str, args) -> tuple:
  shapes = [_shape_of(a) for a in args]
  try:
    return np.broadcast_shapes(*shapes)
  except ValueError:
    ex = executor.maybe_current()
    raise ShapeError(f"Incompatible shapes for jnp.{name}{' ' + ex.where() if ex else ''}: "
                     f"{', '.join(str(s) for s in shapes)}; expected shapes that broadcast (equal, or 1, in "
                     f"each trailing dim). ({user_frame_summary()})") from None


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
                     f"type, TPUs have no 64-bit types. Use {dt.narrowed(d)}. ({user_frame_summary()})")
  return d


def _int_only(fn, name):
  def f(*args):
    for a in args:
      d = dtype_of(a)
      if isinstance(d, np.dtype) and dt.is_float(d):
        raise ShapeError(f"{name} requires integer or bool operands; got {d}.")
    return fn(*args)
  return f


_add = _elementwise(np.add, "cheap", name="add")


def add(x1, x2):
  if type(x1) is Deferred or type(x2) is Deferred:  # a matmul sum grows without being computed
    later = deferred.add(_current_ex(), x1, x2)
    if later is not None:
      return later
  return _add(x1, x2)


add.__doc__ = _add.__doc__
subtract = _elementwise(np.subtract, "cheap", name="subtract")
multiply = _elementwise(np.multiply, "cheap", name="multiply")
true_divide = divide = _elementwise(np.true_divide, "medium", "float", name="divide")
maximum = _elementwise(np.maximum, "cheap", name="maximum")
minimum = _elementwise(np.minimum, "cheap", name="minimum")
power = _elementwise(np.power, "medium", name="power")
arctan2 = _elementwise(np.arctan2, "transcendental", "float", name="arctan2")
equal = _elementwise(np.equal, "cheap", "bool", name="equal")
not_equal = _elementwise(np.not_equal, "cheap", "bool", name="not_equal")
less = _elementwise(np.less, "cheap", "bool", name="less")
less_equal = _elementwise(np.less_equal, "cheap", "bool", name="less_equal")
greater = _elementwise(np.greater, "cheap", "bool", name="greater")
greater_equal = _elementwise(np.greater_equal, "cheap", "bool", name="greater_equal")
logical_and = _elementwise(np.logical_and, "cheap", "bool", name="logical_and")
logical_or = _elementwise(np.logical_or, "cheap", "bool", name="logical_or")
logical_xor = _elementwise(np.logical_xor, "cheap", "bool", name="logical_xor")
logical_not = _elementwise(np.logical_not, "cheap", "bool", name="logical_not")
bitwise_and = _int_only(_elementwise(np.bitwise_and, "cheap", name="bitwise_and"), "bitwise_and")
bitwise_or = _int_only(_elementwise(np.bitwise_or, "cheap", name="bitwise_or"), "bitwise_or")
bitwise_xor = _int_only(_elementwise(np.bitwise_xor, "cheap", name="bitwise_xor"), "bitwise_xor")
bitwise_not = invert = _int_only(_elementwise(np.invert, "cheap", name="invert"), "invert")
left_shift = _int_only(_elementwise(np.left_shift, "cheap", name="left_shift"), "left_shift")
right_shift = _int_only(_elementwise(np.right_shift, "cheap", name="right_shift"), "right_shift")


def _floor_div(a, b):
  if a.dtype.kind in "iu":
    with np.errstate(all="ignore"):
      return np.floor_divide(a, np.where(b == 0, 1, b))
  return np.floor_divide(a, b)


def _mod(a, b):
  if a.dtype.kind in "iu":
    return np.remainder(a, np.where(b == 0, 1, b))
  return np.remainder(a, b)


floor_divide = _elementwise(_floor_div, "medium", name="floor_divide")
remainder = mod = _elementwise(_mod, "medium", name="remainder")

negative = _elementwise(np.negative, "cheap", name="negative")
positive = _elementwise(np.positive, "cheap", name="positive")
abs = absolute = _elementwise(np.abs, "cheap", name="abs")  # noqa: A001
sign = _elementwise(np.sign, "cheap", name="sign")
square = _elementwise(np.square, "cheap", name="square")
floor = _elementwise(np.floor, "cheap", "float", name="floor")
ceil = _elementwise(np.ceil, "cheap", "float", name="ceil")
round = _elementwise(np.round, "cheap", "float", name="round")  # noqa: A001
trunc = _elementwise(np.trunc, "cheap", "float", name="trunc")
exp = _elementwise(np.exp, "transcendental", "float", name="exp")
exp2 = _elementwise(np.exp2, "transcendental", "float", name="exp2")
expm1 = _elementwise(np.expm1, "transcendental", "float", name="expm1")
log = _elementwise(np.log, "transcendental", "float", name="log")
log2 = _elementwise(np.log2, "transcendental", "float", name="log2")
log1p = _elementwise(np.log1p, "transcendental", "float", name="log1p")
tanh = _elementwise(np.tanh, "transcendental", "float", name="tanh")
sqrt = _elementwise(np.sqrt, "transcendental", "float", name="sqrt")
rsqrt = _elementwise(lambda x: 1.0 / np.sqrt(x), "transcendental", "float", name="rsqrt")
reciprocal = _elementwise(np.reciprocal, "transcendental", "float", name="reciprocal")
sin = _elementwise(np.sin, "expensive", "float", name="sin")
cos = _elementwise(np.cos, "expensive", "float", name="cos")
tan = _elementwise(np.tan, "expensive", "float", name="tan")
arctan = _elementwise(np.arctan, "expensive", "float", name="arctan")
sinh = _elementwise(np.sinh, "transcendental", "float", name="sinh")
cosh = _elementwise(np.cosh, "transcendental", "float", name="cosh")
isnan = _elementwise(np.isnan, "cheap", "bool", name="isnan")
isinf = _elementwise(np.isinf, "cheap", "bool", name="isinf")
isfinite = _elementwise(np.isfinite, "cheap", "bool", name="isfinite")
logistic = _elementwise(lambda x: 1.0 / (1.0 + np.exp(-x)), "transcendental", "float", name="logistic")


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


erf = _elementwise(_erf, "transcendental", "float", name="erf")


def where(condition, x=None, y=None):
  """`jnp.where(c, x, y)` (the one-argument form is not available in kernels)."""
  if x is None or y is None:
    raise UsageError("jnp.where(condition) with one argument has a data-dependent shape; pass x and y.")
  rt = dt.result_type(dtype_of(x), dtype_of(y))
  shape = _broadcast_shapes("where", (condition, x, y))
  data = None
  ex = executor.maybe_current()
  if not (ex is not None and ex.timing_only and shape) and _has_data(condition, x, y):
    data = np.where(_np(condition, dt.bool_), _np(x, rt), _np(y, rt))
  return _out(data, shape, rt, ready_of(condition, x, y), "cheap", _is_arr(condition, x, y))


def clip(x, min=None, max=None):  # noqa: A002
  if min is not None:
    x = maximum(x, min)
  if max is not None:
    x = minimum(x, max)
  return x


def astype(x, dtype):
  d = _dtype_arg(dtype, "astype")
  if isinstance(x, Array) and x.dtype == d:
    return x
  if type(x) is Deferred:
    later = deferred.astype(_current_ex(), x, d)
    if later is not None:
      return later
  data = None
  if _has_data(x):
    v = _np(x)
    if dt.is_int(d) and dt.is_float(v.dtype):
      if v.dtype.itemsize < 4:
        v = v.astype(_F32)
      v = np.nan_to_num(v, nan=0)  # TPU float->int conversion: NaN -> 0, saturating
      info = np.iinfo(d) if d not in (dt.int4, dt.uint4) else None
      if info is not None:
        v = np.clip(v, info.min, info.max)
    data = v.astype(d)
  return _out(data, _shape_of(x), d, ready_of(x), "cheap", _is_arr(x))


floating, inexact, number, integer = np.floating, np.inexact, np.number, np.integer
signedinteger, unsignedinteger, generic = np.signedinteger, np.unsignedinteger, np.generic


_ABSTRACT = (np.floating, np.inexact, np.number, np.integer, np.signedinteger, np.unsignedinteger, np.generic)


def issubdtype(arg1, arg2) -> bool:
  """`jnp.issubdtype`, with bfloat16 and fp8 as floating and int4/uint4 as integers (as in JAX)."""
  d = dt.canonicalize(arg1, keep_64bit=True)
  if arg2 not in _ABSTRACT:
    return d == dt.canonicalize(arg2, keep_64bit=True)
  if dt.is_float(d):
    return arg2 in (np.floating, np.inexact, np.number, np.generic)
  if d in (dt.int4, dt.uint4):
    return arg2 in (np.integer, np.number, np.generic,
                    np.signedinteger if d == dt.int4 else np.unsignedinteger)
  return np.issubdtype(d, arg2)


def promote_types(a, b) -> np.dtype:
  """`jnp.promote_types`: JAX's (x64-disabled) promotion of two dtypes."""
  return dt.result_type(dt.canonicalize(a), dt.canonicalize(b))


def result_type(*args) -> np.dtype:
  """`jnp.result_type` of arrays, dtypes and (weak) Python scalars."""
  def one(a):
    if isinstance(a, (bool, int, float)):
      return a
    return dtype_of(a) if isinstance(a, (Array, np.ndarray, np.generic)) else dt.canonicalize(a)
  return dt.result_type(*[one(a) for a in args])


def asarray(x, dtype=None):
  if isinstance(x, Array):
    return x if dtype is None else astype(x, dtype)
  d = _dtype_arg(dtype, "jnp.asarray") if dtype is not None else _default_dtype(x)
  return _out(np.asarray(x, dtype=d), np.shape(x), d, 0, "cheap", False)


array = asarray


def _default_dtype(x):
  if isinstance(x, (np.ndarray, np.generic)):
    return dt.canonicalize(x.dtype)
  return dt.canonicalize(np.asarray(x).dtype)


# ------------------------------------------------------------------------------- creation
def _shape_arg(shape):
  return validate.as_dims(shape, "shape", error=ShapeError)


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
    if type(fill_value) in (int, float) and fill_value == 0 and d == _F32:
      later = deferred.zeros(ex, shape)  # an accumulator's zero start, kept symbolic
      if later is not None:
        return later
    data = np.broadcast_to(np.asarray(_np(fill_value), d), shape)
  return _out(data, shape, d, ready_of(fill_value), "cheap", False)


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
  return _out(data, data.shape, d, 0, "cheap", False)


def iota(dtype, size):
  return arange(size, dtype=dtype)


def eye(n, m=None, dtype=None):
  data = np.eye(n, m, dtype=_dtype_arg(dtype or _F32, "jnp.eye"))
  return _out(data, data.shape, data.dtype, 0, "cheap", False)


# ------------------------------------------------------------------------------- reductions
def _norm_axes(axis, ndim):
  if axis is None:
    return tuple(range(ndim))
  axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
  out = []
  for a in axes:
    a = validate.as_int(a, "axis", error=ShapeError)
    if not -ndim <= a < ndim:
      raise ShapeError(f"Reduction axis {a} is out of range for an array of rank {ndim}.")
    out.append(a % ndim)
  return tuple(sorted(out))


def _reduce_class(axes, ndim):
  if ndim >= 1 and (ndim - 1) in axes:
    return "reduce_lane"
  if ndim >= 2 and (ndim - 2) in axes:
    return "reduce_sublane"
  return "cheap"


def _reduction(npfn, name, result="same"):
  def op(a, axis=None, keepdims=False, dtype=None, **kw):
    shape = _shape_of(a)
    axes = _norm_axes(axis, len(shape))
    in_d = dtype_of(a) if isinstance(a, Array) else _default_dtype(a)
    if result == "index":
      out_d = dt.int32
    elif result == "bool":
      out_d = dt.bool_
    elif dtype is not None:
      out_d = _dtype_arg(dtype, f"jnp.{name}")
    elif name in ("sum", "prod") and (in_d == dt.bool_ or dt.is_int(in_d)):
      out_d = _promoted_int(in_d)   # JAX promote_integers: narrow ints (and bool) sum in 32 bits
    elif name == "mean" and not dt.is_float(in_d):
      out_d = _F32
    else:
      out_d = in_d
    out_shape = tuple((1 if i in axes else s) for i, s in enumerate(shape)) if keepdims else \
        tuple(s for i, s in enumerate(shape) if i not in axes)
    data = None
    ex = executor.maybe_current()
    if not (ex is not None and ex.timing_only and out_shape) and _has_data(a):
      v = _np(a, _compute_dtype(out_d) if result == "same" else None)
      with np.errstate(all="ignore"):
        if result == "index":
          if len(axes) != 1:
            raise ShapeError(f"jnp.{name} takes a single axis; got axis={axis}.")
          data = npfn(v, axis=axes[0], keepdims=keepdims)
        else:
          data = npfn(v, axis=axes, keepdims=keepdims)
      data = np.asarray(data).astype(out_d, copy=False)
    return _out(data, out_shape, out_d, ready_of(a), _reduce_class(axes, len(shape)), _is_arr(a))

  op.__name__ = name
  return op


sum = _reduction(np.sum, "sum")  # noqa: A001
prod = _reduction(np.prod, "prod")
max = amax = _reduction(np.max, "max")  # noqa: A001
min = amin = _reduction(np.min, "min")  # noqa: A001
mean = _reduction(np.mean, "mean")
argmax = _reduction(np.argmax, "argmax", "index")
argmin = _reduction(np.argmin, "argmin", "index")
any = _reduction(np.any, "any", "bool")  # noqa: A001
all = _reduction(np.all, "all", "bool")  # noqa: A001


def _promoted_int(d: np.dtype) -> np.dtype:
  return dt.uint32 if d.kind == "u" or d == dt.uint4 else dt.int32


def cumsum(a, axis=None, dtype=None):
  """`jnp.cumsum` (axis=None scans the flattened array); narrow ints accumulate in 32 bits like JAX."""
  if axis is None:
    a = ravel(a)
    axis = 0
  in_d = dtype_of(a) if isinstance(a, Array) else _default_dtype(a)
  if dtype is not None:
    out_d = _dtype_arg(dtype, "jnp.cumsum")
  elif dt.is_int(in_d) or in_d == dt.bool_:
    out_d = _promoted_int(in_d)
  else:
    out_d = in_d
  data = None
  if _has_data(a):
    data = np.cumsum(_np(a, _compute_dtype(out_d)), axis=axis).astype(out_d, copy=False)
  return _out(data, _shape_of(a), out_d, ready_of(a), "reduce_lane", _is_arr(a))


# ------------------------------------------------------------------------------- shape ops
def _shape_op(a, fn, out_shape, op_class="cheap"):
  data = None
  ex = executor.maybe_current()
  if not (ex is not None and ex.timing_only) and _has_data(a):
    data = fn(_np(a))
  d = a.dtype if isinstance(a, Array) else _default_dtype(a)
  return _out(data, tuple(out_shape), d, ready_of(a), op_class, _is_arr(a))


def reshape(a, *shape, order="C"):
  if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
    shape = tuple(shape[0])
  src = _shape_of(a)
  n = int(np.prod(src))
  shape = [validate.as_int(s, f"reshape shape[{i}]", min_value=-1, error=ShapeError)
           for i, s in enumerate(shape)]
  if -1 in shape:
    k = shape.index(-1)
    rest = int(np.prod([s for i, s in enumerate(shape) if i != k]))
    shape[k] = n // builtins.max(rest, 1)
  if int(np.prod(shape)) != n:
    raise ShapeError(f"Cannot reshape an array of shape {src} into shape {tuple(shape)}.")
  # Merging/splitting leading dims is free; touching the last two dims needs the XLU.
  free = len(src) >= 2 and len(shape) >= 2 and src[-1] == shape[-1] and src[-2] == shape[-2]
  return _shape_op(a, lambda v: v.reshape(shape), shape, "free" if free else "xlu")


def transpose(a, axes=None):
  nd = len(_shape_of(a))
  axes = tuple(reversed(range(nd))) if axes is None else \
      tuple(validate.as_int(x, "transpose axes", error=ShapeError) % nd for x in axes)
  out_shape = tuple(_shape_of(a)[i] for i in axes)
  minor = nd >= 2 and axes[-2:] != (nd - 2, nd - 1)
  return _shape_op(a, lambda v: np.transpose(v, axes), out_shape, "xlu" if minor else "free")


def swapaxes(a, axis1, axis2):
  nd = len(_shape_of(a))
  perm = list(range(nd))
  perm[axis1], perm[axis2] = perm[axis2], perm[axis1]
  return transpose(a, perm)


def moveaxis(a, source, destination):
  nd = len(_shape_of(a))
  perm = [i for i in range(nd) if i != source % nd]
  perm.insert(destination % nd, source % nd)
  return transpose(a, perm)


def broadcast_to(a, shape):
  shape = _shape_arg(shape)
  try:
    np.broadcast_shapes(_shape_of(a), shape)
  except ValueError:
    raise ShapeError(f"Cannot broadcast shape {_shape_of(a)} to {shape}.") from None
  if not isinstance(a, Array):
    a = asarray(a)
  return _shape_op(a, lambda v: np.broadcast_to(v, shape), shape, "broadcast")  # values are immutable


def expand_dims(a, axis):
  s = list(_shape_of(a))
  axes = (axis,) if isinstance(axis, int) else tuple(axis)
  for ax in sorted(x % (len(s) + len(axes)) for x in axes):
    s.insert(ax, 1)
  return _shape_op(a, lambda v: v.reshape(s), s, "free")


def squeeze(a, axis=None):
  s = _shape_of(a)
  axes = tuple(i for i, n in enumerate(s) if n == 1) if axis is None else _norm_axes(axis, len(s))
  out = [n for i, n in enumerate(s) if i not in axes]
  return _shape_op(a, lambda v: v.reshape(out), out, "free")


def ravel(a):
  return reshape(a, -1)


def concatenate(arrays, axis=0):
  arrays = list(arrays)
  rt = dt.result_type(*[dtype_of(a) for a in arrays])
  shapes = [_shape_of(a) for a in arrays]
  nd = len(shapes[0])
  ax = axis % nd
  for s in shapes:
    if len(s) != nd or any_mismatch(s, shapes[0], ax):
      raise ShapeError(f"jnp.concatenate: shapes {shapes} differ outside axis {axis}.")
  out_shape = list(shapes[0])
  out_shape[ax] = builtins.sum(s[ax] for s in shapes)
  data = None
  ex = executor.maybe_current()
  if not (ex is not None and ex.timing_only) and _has_data(*arrays):
    data = np.concatenate([_np(a, rt) for a in arrays], axis=ax)
  return _out(data, tuple(out_shape), rt, ready_of(*arrays), "cheap", _is_arr(*arrays))


def any_mismatch(s, ref, ax):
  return builtins.any(a != b for i, (a, b) in enumerate(zip(s, ref)) if i != ax)


def stack(arrays, axis=0):
  return concatenate([expand_dims(a, axis) for a in arrays], axis=axis)


def tile(a, reps):
  reps = _shape_arg(reps)
  s = _shape_of(a)
  full_reps = (1,) * (len(s) - len(reps)) + reps if len(reps) < len(s) else reps
  s2 = (1,) * (len(full_reps) - len(s)) + tuple(s)
  out = tuple(x * r for x, r in zip(s2, full_reps))
  return _shape_op(a, lambda v: np.tile(v, reps), out, "cheap")


def repeat(a, repeats, axis=None):
  repeats = validate.as_int(repeats, "jnp.repeat repeats", min_value=0, error=ShapeError)
  s = list(_shape_of(a))
  if axis is None:
    out = [int(np.prod(s)) * repeats]
  else:
    out = list(s)
    out[axis % len(s)] *= repeats
  return _shape_op(a, lambda v: np.repeat(v, repeats, axis=axis), out, "xlu")


def roll(a, shift, axis=None):
  shift_v = int(shift._data) if isinstance(shift, Array) else \
      validate.as_int(shift, "jnp.roll shift", error=ShapeError)
  nd = len(_shape_of(a))
  cls = "xlu" if axis is not None and axis % builtins.max(nd, 1) >= nd - 2 else "cheap"
  return _shape_op(a, lambda v: np.roll(v, shift_v, axis=axis), _shape_of(a), cls)


def flip(a, axis=None):
  return _shape_op(a, lambda v: np.flip(v, axis=axis), _shape_of(a), "xlu")


# ------------------------------------------------------------------------------- Array methods
def _bind_methods():
  def rev(f):
    return lambda self, other: f(other, self)

  ops = {"__add__": add, "__sub__": subtract, "__mul__": multiply, "__truediv__": true_divide,
         "__floordiv__": floor_divide, "__mod__": remainder, "__pow__": power, "__and__": bitwise_and,
         "__or__": bitwise_or, "__xor__": bitwise_xor, "__lshift__": left_shift,
         "__rshift__": right_shift, "__lt__": less, "__le__": less_equal, "__gt__": greater,
         "__ge__": greater_equal, "__eq__": equal, "__ne__": not_equal}
  for name, f in ops.items():
    setattr(Array, name, f)
    if name not in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
      setattr(Array, "__r" + name[2:], rev(f))
  Array.__neg__ = negative
  Array.__pos__ = positive
  Array.__abs__ = abs
  Array.__invert__ = invert
  Array.astype = astype
  Array.T = property(lambda self: transpose(self))
  Array.reshape = reshape
  Array.transpose = lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 else (axes or None))
  Array.swapaxes = swapaxes
  Array.squeeze = squeeze
  Array.ravel = ravel
  Array.flatten = ravel
  for red in (sum, prod, max, min, mean, argmax, argmin, any, all):
    setattr(Array, red.__name__, red)


_bind_methods()


_PRIVATE_IMPORTS = {"annotations", "builtins", "math", "ml_dtypes", "np", "dt", "executor", "Array",
                    "deferred", "Deferred",
                    "ShapeError", "UsageError", "dtype_of", "ready_of",
                    "user_frame_summary"}
__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _PRIVATE_IMPORTS)
