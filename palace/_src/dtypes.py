"""Dtypes TPUs have, and JAX's type-promotion rules (L0).

Python scalars are *weak*: they take the dtype of the array they meet (JAX semantics). Without another
operand they default to int32 / float32 (JAX with x64 disabled).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from palace._src.errors import ShapeError

float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e4m3b11fnuz = np.dtype(ml_dtypes.float8_e4m3b11fnuz)   # not on every chip: hw.check_dtype
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
bool_ = np.dtype(np.bool_)
int4 = np.dtype(ml_dtypes.int4)
uint4 = np.dtype(ml_dtypes.uint4)
int2, uint2 = np.dtype(ml_dtypes.int2), np.dtype(ml_dtypes.uint2)   # field types of pack/unpack only

SUPPORTED = (float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, float8_e4m3b11fnuz, int8, int16,
             int32, uint8, uint16, uint32, bool_, int4, uint4)
_SUPPORTED_SET = frozenset(SUPPORTED)
_64BIT = frozenset(np.dtype(t) for t in (np.float64, np.int64, np.uint64, np.complex64,
                                           np.complex128))
_CANON_64 = {np.dtype(np.float64): float32, np.dtype(np.int64): int32,
             np.dtype(np.uint64): uint32}


_CANON_MEMO: dict = {}  # (dtype argument, keep_64bit) -> np.dtype: memo of a pure function


def canonicalize(dtype, keep_64bit: bool = False) -> np.dtype:
  """dtype as given by a user (str, type, np.dtype) -> np.dtype, with 64-bit mapped to 32-bit (as JAX
  does without x64) unless `keep_64bit` (allocation types keep it so the kernel can reject it)."""
  try:
    hit = _CANON_MEMO.get((dtype, keep_64bit))
  except TypeError:  # unhashable argument
    hit = None
  if hit is not None:
    return hit
  d = _canonicalize(dtype, keep_64bit)
  try:
    if len(_CANON_MEMO) < 256:
      _CANON_MEMO[(dtype, keep_64bit)] = d
  except TypeError:
    pass
  return d


def _canonicalize(dtype, keep_64bit: bool) -> np.dtype:
  if isinstance(dtype, str) and dtype == "bfloat16":
    return bfloat16
  try:
    d = np.dtype(dtype)
  except TypeError as e:
    raise ShapeError(f"{dtype!r} is not a dtype. Fix: pass a dtype, e.g. jnp.float32 or jnp.bfloat16.") from e
  return d if keep_64bit else _CANON_64.get(d, d)


def is_64bit(d: np.dtype) -> bool:
  return d in _64BIT


def narrowed(d: np.dtype) -> np.dtype:
  """The 32-bit type JAX (x64 disabled) uses for a 64-bit dtype."""
  return _CANON_64.get(d, float32)


def check_kernel_dtype(dtype, what: str, hint: str = "") -> np.dtype:
  d = np.dtype(dtype)
  if d.kind == "c":
    raise ShapeError(f"Unsupported dtype for {what}: {d}; expected a real type, TPU kernels have no complex "
                     f"numbers. Fix: split it into real and imaginary float32 parts.")
  if d in _64BIT:
    raise ShapeError(f"Unsupported dtype for {what}: {d}; expected a 32-bit or narrower type, TPUs have "
                     f"no 64-bit types. Fix: use {_CANON_64.get(d, float32)}." + (f" {hint}" if hint else ""))
  if d not in _SUPPORTED_SET:
    raise ShapeError(f"{what} has dtype {d}, which TPU kernels do not support; expected one of "
                     f"{', '.join(str(t) for t in SUPPORTED)}. Fix: cast it to one of them (e.g. "
                     f".astype(jnp.float32)).")
  return d


def is_float(d: np.dtype) -> bool:
  return d.kind == "f" or d in NARROW_FLOATS


NARROW_FLOATS = frozenset({bfloat16, float8_e4m3fn, float8_e5m2, float8_e4m3b11fnuz})  # (NumPy kind "V")
CHIP_DEPENDENT = frozenset({float8_e4m3b11fnuz})   # dtypes some chip lacks (hw.check_dtype)


def is_int(d: np.dtype) -> bool:
  return d.kind in "iu" or d in (int4, uint4, int2, uint2)


def is_signed_int(d: np.dtype) -> bool:
  return d.kind == "i" or d in (int4, int2)


def bits(d: np.dtype) -> int:
  if d in (int4, uint4):
    return 4
  if d in (int2, uint2):
    return 2
  if d == bool_:
    return 32  # masks occupy 32-bit vregs on the VPU
  return d.itemsize * 8


def packing(d: np.dtype) -> int:
  """Elements per 32-bit word: the sublane packing factor (f32 1, bf16 2, int8 4)."""
  return max(1, 32 // bits(d))


# JAX's promotion lattice restricted to TPU types, as explicit pairs (x64 disabled).
_FLOAT_ORDER = {float8_e4m3fn: 0, float8_e5m2: 0, float8_e4m3b11fnuz: 0, bfloat16: 1, float16: 1, float32: 2}
_INT_RANK = {int4: 0, int8: 1, int16: 2, int32: 3}
_UINT_RANK = {uint4: 0, uint8: 1, uint16: 2, uint32: 3}
_INT_BY_RANK = [int4, int8, int16, int32]


# fp8 and 4-bit types have no implicit promotion edges in JAX: mixing them with another type (other than
# bool, or an integer for fp8) raises TypePromotionError; users must cast explicitly.
_FP8 = frozenset({float8_e4m3fn, float8_e5m2, float8_e4m3b11fnuz})
_ISOLATED = _FP8 | {int4, uint4}


def _promote_pair(a: np.dtype, b: np.dtype) -> np.dtype:
  if a == b:
    return a
  if a == bool_:
    return b
  if b == bool_:
    return a
  if a in _ISOLATED or b in _ISOLATED:
    x, y = (a, b) if a in _ISOLATED else (b, a)
    if x in _FP8 and is_int(y) and y not in _ISOLATED:
      return x
    raise ShapeError(f"Type promotion error for operands of dtypes {a} and {b}: JAX has no implicit "
                     f"promotion path between them; expected matching dtypes. Fix: cast one operand "
                     f"explicitly, e.g. x.astype(jnp.float32).")
  fa, fb = is_float(a), is_float(b)
  if fa and fb:
    ra, rb = _FLOAT_ORDER[a], _FLOAT_ORDER[b]
    if ra != rb:
      return a if ra > rb else b
    return float32  # bf16+f16, e4m3+e5m2 -> next level (JAX gives f32 / bf16; f32 is exact for both)
  if fa:
    return a
  if fb:
    return b
  # both integers
  sa, sb = is_signed_int(a), is_signed_int(b)
  if sa == sb:
    table = _INT_RANK if sa else _UINT_RANK
    return a if table[a] >= table[b] else b
  s, u = (a, b) if sa else (b, a)
  need = _UINT_RANK[u] + 1
  if _INT_RANK[s] >= need:
    return s
  return _INT_BY_RANK[min(need, 3)]  # int32 + uint32 -> int64 in JAX, canonicalised to int32


def result_type(*args) -> np.dtype:
  """JAX-style result dtype; `args` are np.dtypes (strong) or Python scalars (weak)."""
  strong = None
  weak_kind = 0  # 0 none, 1 bool, 2 int, 3 float
  for a in args:
    if isinstance(a, np.dtype):
      strong = a if strong is None else _promote_pair(strong, a)
    elif isinstance(a, bool):
      weak_kind = max(weak_kind, 1)
    elif isinstance(a, int):
      weak_kind = max(weak_kind, 2)
    elif isinstance(a, float):
      weak_kind = max(weak_kind, 3)
    else:
      raise ShapeError(f"Unsupported operand type {type(a).__name__} in a kernel operation. Fix: pass "
                       f"kernel values (loaded from refs), NumPy scalars or Python numbers.")
  if strong is None:
    return (bool_, bool_, int32, float32)[weak_kind]
  if weak_kind == 3 and not is_float(strong):
    if strong in (int4, uint4):
      raise ShapeError(f"Type promotion error for a {strong} operand and a Python float: JAX has no "
                       f"implicit promotion path for 4-bit integers. Fix: cast explicitly, e.g. "
                       f"x.astype(jnp.float32).")
    return float32
  if weak_kind == 2 and strong == bool_:
    return int32
  return strong


_SHIFT16 = np.uint32(16)


def bf16_to_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
  """bfloat16 -> float32, bit-identical to astype and faster: the bf16 bits are the high half of the
  float32. Into `out` (float32, any strides) it is one shift pass; otherwise a widening copy shifted in
  place (`u32 << 16` would allocate a second array: fresh pages cost more than the shift, 415 vs 36 us
  for a 512x512 block)."""
  bits = x.view(np.uint16)
  if out is not None:
    np.left_shift(bits, _SHIFT16, out=out.view(np.uint32), dtype=np.uint32)
    return out
  wide = bits.astype(np.uint32)
  wide <<= 16
  return wide.view(np.float32)
