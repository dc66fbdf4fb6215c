"""Elementwise packing and stochastic rounding (L4a): `pltpu.pack_elementwise`,
`pltpu.unpack_elementwise`, `pltpu.stochastic_round`.

pack/unpack interleave narrow values inside each word of a wide element (Mosaic's
`tpu.pack_elementwise` / `tpu.unpack_elementwise`): source k of a pack lands in bits
[k*b, (k+1)*b) of each output element (b: the packed dtype's width), the lowest first; an unpack
takes field `index` back out, sign-extended for signed integers, widened exactly for bf16 -> f32.
Integer sources are truncated to b bits; f32 sources are rounded to bf16 (nearest even), as
`astype` rounds them.

`stochastic_round` (Mosaic's `tpu.stochastic_convert`) rounds each float32 to one of its two
neighbours in the target float type: the one toward zero (`lo`) or the next away from zero (`hi`);
it picks `hi` when `bits < frac * 2**32`, `frac = (|x| - |lo|) / (|hi| - |lo|)` (so `hi` with
probability `frac` over uniform `bits`); values the target represents exactly, NaN and infinities
convert as `astype` converts them. The chip's own choice for given `bits` is not published: palace's
is this documented deterministic rule, and it always gives one of the two neighbours.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import hw
from palace._src import executor
from palace._src.errors import ShapeError, UnsupportedError
from palace._src.executor import OpClass
from palace._src.lang.array import Array, ready_of
from palace._src.lang.numpy_base import _dtype_arg, _out
from palace._src.util import user_frame_summary

_UINT_OF_BITS = {4: dt.uint4, 8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32)}
_ROUND_TARGETS = (dt.bfloat16, dt.float8_e5m2, dt.float8_e4m3fn, dt.float8_e4m3b11fnuz)
_FIELD_ONLY = (dt.int2, dt.uint2)   # packed field types that are no kernel dtype
# int2 fields: JAX's tpu_ops_test skips other shapes ("int2 is only supported for shapes with vreg
# alignment": the last two dimensions multiples of 8 x 16 and 128), so palace refuses them
_INT2_ALIGN = (128, 128)
_NO_NEGATIVE_ZERO = frozenset({dt.float8_e4m3b11fnuz})   # "fnuz": 0x80 is the NaN


def _dtype(x) -> np.dtype:
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _data(x):
  return x._data if isinstance(x, Array) else np.asarray(x)


def _raw_bits(a: np.ndarray) -> np.ndarray:
  """The bit pattern of each element as uint64 (4-bit types: their 4 bits)."""
  d = a.dtype
  if dt.bits(d) == 4:
    return (a.astype(np.int64) & 0xF).astype(np.uint64)
  return a.view(_UINT_OF_BITS[d.itemsize * 8]).astype(np.uint64)


def _covered(d: np.dtype, api: str, field: bool = False) -> np.dtype:
  if d not in dt.SUPPORTED and not (field and d in _FIELD_ONLY):
    raise UnsupportedError(f"{api} with {d}: palace models {', '.join(map(str, dt.SUPPORTED))} "
                           f"({user_frame_summary()}); {d} is not one of them. Fix: pack into a "
                           f"covered type (e.g. int4 rather than int2).")
  return d


def _packing_factor(wide: np.dtype, narrow: np.dtype, api: str) -> int:
  _covered(wide, api)
  _covered(narrow, api, field=True)
  wb, nb = dt.bits(wide), dt.bits(narrow)
  if wb % nb:
    raise ShapeError(f"{api}: a {wide} element does not hold a whole number of {narrow} values "
                     f"({wb} and {nb} bits) ({user_frame_summary()}). Fix: pick a packed dtype whose "
                     f"width divides {wb}.")
  return wb // nb


def _check_int2_shape(p: np.dtype, shape, api: str) -> None:
  if p not in _FIELD_ONLY or shape is None:
    return
  if len(shape) < 2 or shape[-2] % _INT2_ALIGN[0] or shape[-1] % _INT2_ALIGN[1]:
    raise UnsupportedError(f"{api} with {p} fields on a {list(shape)} array ({user_frame_summary()}): "
                           f"{p} needs the last two dimensions to be multiples of {_INT2_ALIGN[0]} and "
                           f"{_INT2_ALIGN[1]} (whole vregs: JAX's tests skip other shapes, 'int2 is only "
                           f"supported for shapes with vreg alignment'). Fix: pad the array to that.")


def _check_field_on_chip(p: np.dtype, api: str) -> None:
  ex = executor.maybe_current()
  if ex is not None:
    hw.check_dtype(ex.chip, p, f"{api} {ex.where()} ({user_frame_summary()})")


def check_pack(d, packed_dtype, count: int, shape=None) -> None:
  """Raise palace's error for a pack of `count` `d` sources into `packed_dtype` that Mosaic (or
  palace) refuses; types only, so palace.jax checks it while lowering (rules_tpu.py)."""
  api = "pltpu.pack_elementwise"
  d, p = np.dtype(d), dt.canonicalize(packed_dtype)
  n = _packing_factor(d, p, api)
  if not ((d == dt.float32 and p == dt.bfloat16) or (dt.is_int(d) and dt.is_int(p))):
    raise UnsupportedError(f"{api} of {d} sources into {p}: Mosaic packs float32 into bfloat16 and "
                           f"integers into narrower integers only ({user_frame_summary()}). Fix: "
                           f"convert the sources first.")
  if count != n:
    raise ShapeError(f"{api}: {count} sources of {d} into {p}, whose packing factor is {n} "
                     f"({user_frame_summary()}). Fix: pass exactly {n} arrays.")
  _check_int2_shape(p, shape, api)


def pack_elementwise(xs, *, packed_dtype):
  """Pack len(xs) arrays of one dtype into one array of the unsigned integer type of their width:
  xs[k] narrowed to `packed_dtype` fills bits [k*b, (k+1)*b) of each element (module docstring)."""
  api = "pltpu.pack_elementwise"
  xs = list(xs)
  p = dt.canonicalize(packed_dtype)
  if not xs:
    raise ShapeError(f"{api} got no sources ({user_frame_summary()}). Fix: pass the packing "
                     f"factor's number of arrays.")
  d, shape = _dtype(xs[0]), tuple(np.shape(xs[0]) if not isinstance(xs[0], Array) else xs[0].shape)
  for x in xs[1:]:
    xshape = tuple(x.shape) if isinstance(x, Array) else np.shape(x)
    if xshape != shape or _dtype(x) != d:
      raise ShapeError(f"{api}: every source must have the first one's shape and dtype "
                       f"({d}{list(shape)}); got {_dtype(x)}{list(xshape)} ({user_frame_summary()}). "
                       f"Fix: cast or broadcast the sources to one shape and dtype.")
  check_pack(d, p, len(xs), shape)
  _check_field_on_chip(p, api)
  out_dtype = _UINT_OF_BITS[dt.bits(d)]
  data = None
  if all(_data(x) is not None for x in xs):
    b = dt.bits(p)
    acc = np.zeros(shape, np.uint64)
    for k, x in enumerate(xs):
      a = np.asarray(_data(x))
      field = _raw_bits(a.astype(p)) if d == dt.float32 else _raw_bits(a) & np.uint64((1 << b) - 1)
      acc |= field << np.uint64(k * b)
    data = acc.astype(np.uint32).astype(out_dtype) if out_dtype == dt.uint4 else acc.astype(out_dtype)
  return _out(data, shape, out_dtype, ready_of(*xs), OpClass.CHEAP, any(isinstance(x, Array) for x in xs))


def check_unpack(d, packed_dtype, unpacked_dtype, index: int, shape=None) -> None:
  """Raise palace's error for an unpack Mosaic (or palace) refuses; types only (check_pack)."""
  api = "pltpu.unpack_elementwise"
  d, p, u = np.dtype(d), dt.canonicalize(packed_dtype), dt.canonicalize(unpacked_dtype)
  if dt.bits(d) != dt.bits(u):
    raise ShapeError(f"{api}: x is {d} ({dt.bits(d)} bits) but unpacked_dtype {u} has {dt.bits(u)} "
                     f"({user_frame_summary()}). Fix: bitcast x to a type of {u}'s width first.")
  n = _packing_factor(u, p, api)
  if not 0 <= int(index) < n:
    raise ShapeError(f"{api}: index {index} is outside the {n} fields of {p} in a {u} element "
                     f"({user_frame_summary()}). Fix: pass an index in [0, {n}).")
  if not ((u == dt.float32 and p == dt.bfloat16) or (dt.is_int(u) and dt.is_int(p))):
    raise UnsupportedError(f"{api} of {p} fields into {u}: Mosaic unpacks bfloat16 into float32 and "
                           f"integers into wider integers only ({user_frame_summary()}). Fix: unpack "
                           f"to one of those and convert.")
  _check_int2_shape(p, shape, api)


def unpack_elementwise(x, *, index, packed_dtype, unpacked_dtype):
  """Field `index` (of width `packed_dtype`) of each element of `x`, as `unpacked_dtype` (whose width
  is x's): sign-extended for signed integers, bf16 widened to f32 exactly (module docstring)."""
  d, p, u = _dtype(x), dt.canonicalize(packed_dtype), dt.canonicalize(unpacked_dtype)
  shape = tuple(x.shape) if isinstance(x, Array) else np.shape(x)
  check_unpack(d, p, u, index, shape)
  _check_field_on_chip(p, "pltpu.unpack_elementwise")
  data = None if _data(x) is None else np.asarray(_data(x))
  if data is not None:
    b = dt.bits(p)
    field = (_raw_bits(data) >> np.uint64(int(index) * b)) & np.uint64((1 << b) - 1)
    if u == dt.float32:
      data = (field << np.uint64(16)).astype(np.uint32).view(np.float32)
    else:
      v = field.astype(np.int64)
      if dt.is_signed_int(p):
        v = v - ((v >> (b - 1)) & 1) * (1 << b)
      data = v.astype(u)
  return _out(data, shape, u, ready_of(x), OpClass.CHEAP, isinstance(x, Array))


def _stochastic(x: np.ndarray, bits: np.ndarray, target: np.dtype) -> np.ndarray:
  nearest = x.astype(target)
  w = dt.bits(target)
  ut = _UINT_OF_BITS[w]
  mag = np.abs(x)
  nb = nearest.view(ut).astype(np.int64)
  # x's sign, not the nearest's: an "fnuz" type's zero has none (its sign-bit pattern is the NaN)
  sign = np.where(np.signbit(x), 1 << (w - 1), 0)
  mag_bits = nb & ((1 << (w - 1)) - 1)
  # lo: the neighbour toward zero (the nearest, or the one below it when the nearest is above |x|)
  near32 = nearest.astype(np.float32)
  above = np.abs(near32) > mag
  lo_bits = np.where(above & (mag_bits > 0), mag_bits - 1, mag_bits)
  hi_bits = lo_bits + 1
  lo_pat = sign | lo_bits
  if target in _NO_NEGATIVE_ZERO:
    lo_pat = np.where(lo_bits == 0, 0, lo_pat)
  lo = np.asarray(lo_pat.astype(ut)).view(target).astype(np.float32)
  hi = np.asarray((sign | hi_bits).astype(ut)).view(target).astype(np.float32)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    frac = (mag - np.abs(lo)) / (np.abs(hi) - np.abs(lo))
  up = bits.astype(np.float64) < frac.astype(np.float64) * 2.0 ** 32
  out_bits = np.where(up & np.isfinite(hi), sign | hi_bits, lo_pat)
  out = out_bits.astype(ut).view(target)
  exact = (lo == x) | ~np.isfinite(x) | ~np.isfinite(lo) | np.isnan(near32)
  return np.where(exact, nearest, out)


def check_round(d, bits_dtype, shape, bits_shape, target_dtype) -> None:
  """Raise palace's error for a stochastic round Mosaic (or palace) refuses; types only (check_pack)."""
  api = "pltpu.stochastic_round"
  d, bd, t = np.dtype(d), np.dtype(bits_dtype), dt.canonicalize(target_dtype)
  if d != dt.float32 or bd != np.uint32 or tuple(bits_shape) != tuple(shape):
    raise ShapeError(f"{api} takes float32 x and uint32 random_bits of x's shape; got {d}{list(shape)} "
                     f"and {bd}{list(bits_shape)} ({user_frame_summary()}). Fix: pass matching arrays.")
  if t not in _ROUND_TARGETS:
    raise UnsupportedError(f"{api} to {t}: palace covers {[str(r) for r in _ROUND_TARGETS]} (Mosaic "
                           f"also takes float4_e2m1fn and int4, which palace does "
                           f"not model) ({user_frame_summary()}). Fix: round to a covered type.")


def stochastic_round(x, random_bits, *, target_dtype):
  """float32 `x` rounded to `target_dtype` by the uint32 `random_bits` (module docstring)."""
  t = _dtype_arg(target_dtype, "pltpu.stochastic_round")
  shape = tuple(x.shape) if isinstance(x, Array) else np.shape(x)
  bshape = tuple(random_bits.shape) if isinstance(random_bits, Array) else np.shape(random_bits)
  check_round(_dtype(x), _dtype(random_bits), shape, bshape, t)
  data = None
  if _data(x) is not None and _data(random_bits) is not None:
    data = _stochastic(np.asarray(_data(x)), np.asarray(_data(random_bits)), t)
  return _out(data, shape, t, ready_of(x, random_bits), OpClass.CHEAP,
              isinstance(x, Array) or isinstance(random_bits, Array))
