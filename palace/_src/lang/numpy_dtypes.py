"""`palace.numpy` dtypes (L4a): the scalar types (jnp.float32 & co.), dtype queries and conversions."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from palace._src import dtypes as dt
from palace._src.executor import OpClass
from palace._src.lang import deferred
from palace._src.lang.array import Array, dtype_of, ready_of, weakly_typed
from palace._src.lang.deferred import Deferred
from palace._src.lang.numpy_base import (_COMPUTE, _F32, _current_ex, _default_dtype, _dtype_arg, _has_data,
                                         _is_arr, _np, _out, _shape_of)

_IMPORTED = frozenset(globals())  # names above are imports, not this module's API


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
float8_e4m3b11fnuz = _scalar_type(dt.float8_e4m3b11fnuz)
int8, int16, int32 = _scalar_type(dt.int8), _scalar_type(dt.int16), _scalar_type(dt.int32)
uint8, uint16, uint32 = _scalar_type(dt.uint8), _scalar_type(dt.uint16), _scalar_type(dt.uint32)
int4, uint4, bool_ = _scalar_type(dt.int4), _scalar_type(dt.uint4), _scalar_type(dt.bool_)
float64, int64 = _scalar_type(np.dtype(np.float64)), _scalar_type(np.dtype(np.int64))
finfo, iinfo = ml_dtypes.finfo, ml_dtypes.iinfo
pi, e, inf, nan = math.pi, math.e, math.inf, math.nan
newaxis = None
ndarray = Array
dtype = np.dtype



def _float_to_int(v: np.ndarray, d: np.dtype) -> np.ndarray:
  """XLA's (and the TPU's) float -> int conversion: NaN -> 0, out-of-range values saturate at the
  integer type's limits. The clip happens in float64, where every 8-, 16- and 32-bit limit is
  exact. In float32, 2**31 - 1 rounds up to 2**31, and NumPy's cast of that is INT32_MIN. The
  64-bit limits are fixed up after the cast."""
  v = np.nan_to_num(v.astype(np.float64), nan=0)
  if d in (dt.int4, dt.uint4):
    return v.astype(d)
  info = np.iinfo(d)
  if info.bits < 64:
    return np.clip(v, info.min, info.max).astype(d)
  top = float(info.max) + 1.0      # 2**63 or 2**64: the first value past the range, exact in float64
  out = np.clip(v, info.min, np.nextafter(top, 0.0)).astype(d)
  out[v >= top] = info.max
  return out


def _convert(v: np.ndarray, d: np.dtype) -> np.ndarray:
  """v.astype(d), except integers to a narrow float (bf16, f16, fp8) go through float32 as XLA converts
  them (two roundings: int32 2**24 + 2**16 + 1 is bf16 2**24, not 2**24 + 2**17), and float -> float
  conversions follow the chip (`_float_to_float`)."""
  if d in _COMPUTE and v.dtype.kind in "iub":   # (_COMPUTE: the narrow floats, computed in float32)
    return v.astype(dt.float32).astype(d)
  if d != v.dtype and d in _CHIP_FLOATS and v.dtype in _CHIP_FLOATS:
    return _float_to_float(v, d)
  return v.astype(d)


# Float conversions as a TPU v5e does them (measured 2026-12-05, docs/numerics.md): float32 and bf16
# denormals read as signed zero and are written as signed zero (all 65536 bf16 -> f32 patterns, f32 ->
# bf16 sweep), every NaN written to float32 / bf16 is the positive quiet NaN 0x7fc00000 / 0x7fc0 (from
# bf16, fp8 and f32 NaNs of either sign and any payload), and +-inf becomes the positive NaN 0x7f of
# float8_e4m3fn (which has no infinity; out-of-range finite values keep their sign, 0x7f / 0xff, as
# in ml_dtypes). float8_e4m3b11fnuz (v5e/v5p/v6e; not measured) converts as ml_dtypes does (it has no
# infinity and one NaN, 0x80, which every NaN and overflow becomes), with the float32 / bf16 side's
# measured rules above.
_CHIP_FLOATS = frozenset({dt.float32, dt.bfloat16, dt.float8_e4m3fn, dt.float8_e5m2, dt.float8_e4m3b11fnuz})
_FLUSHED = {dt.float32: (np.uint32, 0x7F800000, 0x80000000, 0x7FFFFFFF, 0x7FC00000),
            dt.bfloat16: (np.uint16, 0x7F80, 0x8000, 0x7FFF, 0x7FC0)}


def _flush(x: np.ndarray, inputs: bool) -> np.ndarray:
  """float32 / bf16 `x` with denormals as signed zeros and (outputs) NaNs as the positive quiet NaN;
  a copy only when something changes."""
  u, exp, sign, mag, qnan = _FLUSHED[x.dtype]
  bits = x.view(u)
  e = bits & u(exp)
  den = (e == 0) & ((bits & u(mag)) != 0)
  nan = None if inputs else (e == u(exp)) & ((bits & u(mag)) > u(exp)) & (bits != u(qnan))
  if not den.any() and (nan is None or not nan.any()):
    return x
  bits = bits.copy()
  np.bitwise_and(bits, u(sign), out=bits, where=den)
  if nan is not None:
    np.copyto(bits, u(qnan), where=nan)
  return bits.view(x.dtype)


def _float_to_float(v: np.ndarray, d: np.dtype) -> np.ndarray:
  if v.dtype in _FLUSHED:
    v = _flush(v, inputs=True)
  out = v.astype(d)
  if d in _FLUSHED:
    return _flush(out, inputs=False)
  if d == dt.float8_e4m3fn and v.dtype != dt.float8_e5m2:
    special = ~np.isfinite(v)
    if special.any():
      out = out.copy()
      np.copyto(out.view(np.uint8), np.uint8(0x7F), where=special)
  return out


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
    data = _float_to_int(v, d) if dt.is_int(d) and dt.is_float(v.dtype) else _convert(v, d)
  return _out(data, _shape_of(x), d, ready_of(x), OpClass.CHEAP, _is_arr(x))


def astype_on_scalars(src, dtype):
  """`astype(x, dtype)` specialised to 0-d Arrays `x` of dtype `src` inside a kernel (as
  numpy_elementwise.on_scalars): the same conversion and one `scalar_op` charge; other operands
  take `astype` itself."""
  src, d = np.dtype(src), dt.canonicalize(dtype, keep_64bit=True)
  if src == d or dt.is_64bit(d) or dt.is_64bit(src):   # x itself, or a context-dependent dtype
    return lambda x: astype(x, dtype)
  to_int = dt.is_int(d) and dt.is_float(src)

  def convert(x):
    if type(x) is Array and x.dtype is src and not x.shape:
      v, ex = x._data, _current_ex()
      if v is not None and ex is not None and v.dtype is src:
        return Array(_float_to_int(v, d) if to_int else _convert(v, d), (), d, ex.scalar_op(ready_of(x)))
    return astype(x, d)
  return convert


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
  out = _out(np.asarray(x, dtype=d), np.shape(x), d, 0, OpClass.CHEAP, False)
  return weakly_typed(out) if dtype is None and type(x) in (bool, int, float) else out   # (as in JAX)


array = asarray


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _IMPORTED)
