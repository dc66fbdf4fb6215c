"""What the MXU accepts and how it rounds (L4a): a matmul's precision, operand and result rules.

Measured on a real TPU v5e (JAX 0.10.2, libtpu 0.0.42.1, 2026-12-05; `benchmarks/hw/data`,
docs/numerics.md):

- precision DEFAULT (or None) on float32 operands: each operand is rounded to bfloat16 (to nearest
  even), the products of the bf16 values are exact, and the sums accumulate in float32. The chip's
  outputs lie within float32 accumulation rounding of that (at most 2.4e-7 x sum|a'||b'| on the probes),
  against errors up to 6e-3 x sum|a||b| from the exact float32 product. Operands that are already
  bf16, fp8 or 8-bit integers are exact in bf16 and unchanged.
- precision HIGHEST: float32 products, float32 accumulation (within 1.9e-7 x sum|a||b| of the exact
  product on the probes), which the host BLAS computes as it is.
- rejected at lowering (Mosaic / Pallas TPU), so palace rejects them too: precision HIGH ("Unsupported
  dot precision: HIGH"), a different precision per operand ("Per-operand dot precision unsupported"),
  a result (accumulator) narrower than 32 bits, e.g. bf16 x bf16 -> bf16, also `jnp.dot(bf16, bf16)`
  without preferred_element_type ("'tpu.matmul' op Expected matmul acc to be 32-bit"), unsigned integer
  operands ("Unsigned integer dtype uint8 is not supported for dot_general"), and HIGHEST on a float32
  operand mixed with a narrower float ("Mosaic failed to compile TPU kernel: Bad rhs type").

These are compiler rules (JAX's Pallas TPU lowering and Mosaic's verifier), not properties of the v5e
silicon, so palace applies them on every chip preset.

Summation order: the host BLAS's by default; VirtualTPU(dot_numerics="mxu") sums DEFAULT-precision
float dots in the chip's measured order (`follows_chip`, `chip_product`, docs/numerics.md).
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.errors import UnsupportedError
from palace._src.util import user_frame_summary

DEFAULT, HIGH, HIGHEST = "DEFAULT", "HIGH", "HIGHEST"

# JAX's names for each precision (lax.Precision members and the strings jax.lax accepts).
_NAMES = {"default": DEFAULT, "bfloat16": DEFAULT, "fastest": DEFAULT, "none": DEFAULT,
          "high": HIGH, "bfloat16_3x": HIGH, "tensorfloat32": HIGH,
          "highest": HIGHEST, "float32": HIGHEST}
_F32 = np.dtype(np.float32)
_WHERE = "measured on a TPU v5e with JAX 0.10.2; a compiler rule, so applied on every TPU generation"


def _chip() -> str:
  ex = executor.maybe_current()
  return f"TPU {ex.chip.name}" if ex is not None else "the TPU"


def _at(where) -> str:
  """The kernel line named in an error (computed only when raising: frames cost a walk)."""
  return where or user_frame_summary()


def _one(p, site: str, where) -> str:
  if p is None:
    return DEFAULT
  name = getattr(p, "name", p)
  if isinstance(name, str) and name.lower() in _NAMES:
    return _NAMES[name.lower()]
  raise UnsupportedError(
      f"{site}: precision={p!r} at {_at(where)} is not a precision palace knows (observed "
      f"{type(p).__name__}); Mosaic lowers lax.Precision.DEFAULT and HIGHEST. Fix: pass precision=None, "
      f"lax.Precision.DEFAULT or lax.Precision.HIGHEST.")


def precision_of(precision, site: str = "jnp.dot", where: str | None = None) -> str:
  """DEFAULT or HIGHEST for a matmul's `precision` argument (None, a lax.Precision, its string name or
  a pair of them); raises UnsupportedError for what Mosaic rejects (HIGH, per-operand pairs). `where`:
  the kernel line (default: the innermost frame outside palace)."""
  if isinstance(precision, (tuple, list)):
    if len(precision) != 2:
      raise UnsupportedError(f"{site}: precision={precision!r} at {_at(where)} has "
                             f"{len(precision)} entries, expected one or a pair. Fix: pass one "
                             f"lax.Precision.")
    first, second = _one(precision[0], site, where), _one(precision[1], site, where)
    if first != second:
      raise UnsupportedError(
          f"{site}: precision=({first}, {second}) at {_at(where)}: Mosaic rejects a different "
          f"precision per operand on {_chip()} ('Per-operand dot precision unsupported' at lowering, "
          f"{_WHERE}). Fix: pass one precision for both operands (e.g. "
          f"precision=lax.Precision.HIGHEST).")
    p = first
  else:
    p = _one(precision, site, where)
  if p == HIGH:
    raise UnsupportedError(
        f"{site}: precision=HIGH (bf16_3x) at {_at(where)}: Mosaic rejects it on {_chip()} "
        f"('Unsupported dot precision: HIGH' at lowering, {_WHERE}). Fix: use precision=lax.Precision."
        f"HIGHEST (float32 products) or DEFAULT (bf16-rounded operands, float32 accumulation).")
  return p


def check(a_dtype, b_dtype, out_dtype, precision: str, site: str = "jnp.dot",
          where: str | None = None) -> None:
  """Raise UnsupportedError for the operand and result dtypes Mosaic rejects."""
  for which, d in (("lhs", a_dtype), ("rhs", b_dtype)):
    if dt.is_int(d) and not dt.is_signed_int(d):
      raise UnsupportedError(
          f"{site}: {which} operand of dtype {d} at {_at(where)}: Mosaic rejects unsigned "
          f"integer matmul operands on {_chip()} (it reads every integer operand as signed; "
          f"NotImplementedError at lowering: 'Unsigned integer dtype {d} is not supported for "
          f"dot_general (matmul)', {_WHERE}). Fix: cast the operand to a signed type first, "
          f"e.g. x.astype(jnp.int8) when its values are below 128, or jnp.int32 / jnp.bfloat16.")
  out = np.dtype(out_dtype)
  if out.itemsize < 4 and (dt.is_float(out) or dt.is_int(out)):
    raise UnsupportedError(
        f"{site}: a {a_dtype} x {b_dtype} matmul with a {out} result at {_at(where)}: Mosaic "
        f"rejects an accumulator narrower than 32 bits on {_chip()} ('tpu.matmul op: Expected matmul "
        f"acc to be 32-bit', a verification error at lowering, {_WHERE}; jnp.dot of two {a_dtype} "
        f"operands gives {a_dtype} unless told otherwise). Fix: pass preferred_element_type=jnp.float32 "
        f"(or jnp.int32 for integers) and cast the result, e.g. jnp.dot(a, b, "
        f"preferred_element_type=jnp.float32).astype({out}).")
  if precision == HIGHEST and a_dtype != b_dtype and dt.is_float(a_dtype) and dt.is_float(b_dtype) \
      and _F32 in (np.dtype(a_dtype), np.dtype(b_dtype)):
    raise UnsupportedError(
        f"{site}: precision=HIGHEST on {a_dtype} x {b_dtype} operands at {_at(where)}: Mosaic "
        f"fails to compile it on {_chip()} ('Bad rhs type' for float32 x bfloat16, {_WHERE}). Fix: cast "
        f"the narrower operand to float32 first (exact), or use the default precision.")


def rounds_to_bf16(d, precision: str) -> bool:
  """Whether an operand of dtype `d` is rounded to bfloat16 before the MXU multiplies it: float32 at
  DEFAULT, as the chip does, except under the exact-f32-dots diagnostic of the running launch
  (VirtualTPU(exact_f32_dots=True), PALACE_JAX_EXACT_F32_DOTS=1), which multiplies them unrounded as
  XLA:CPU does and so is NOT what the chip computes (its reports say so). Every matmul path asks here."""
  if precision != DEFAULT or np.dtype(d) != _F32:
    return False
  ex = executor.maybe_current()
  return ex is None or not ex.exact_f32_dots


def shares_dots() -> bool:
  """Whether the running launch is under the shared-dots diagnostic (VirtualTPU(shared_dots=True),
  PALACE_JAX_SHARED_DOTS=1): every float product is `shared_product`, inside palace's kernels and, with
  palace.jax, in XLA:CPU's code outside them (jax/shared_dots.py). NOT what the chip computes."""
  ex = executor.maybe_current()
  return ex is not None and ex.shared_dots


SHARED_CHUNK = 128   # K per exactly summed chunk: the contraction depth of one MXU pass on v5e (128x128)


def shared_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`a @ b` ((..., m, k) @ (..., k, n), the float values the MXU multiplies) by the shared-dots rule,
  a fixed summation order that both sides of a comparison can follow: the products of each 128-long
  chunk of K summed in float64 and rounded to float32 once, the chunks added in float32 in order. A
  kernel that accumulates `acc += jnp.dot(x_k, y_k)` over K blocks of 128 thus gets the bits of one
  dot over the whole K. float32 result. With bf16-valued operands (DEFAULT precision, bf16 inputs) the
  float64 chunk sums are exact, so the result does not depend on the host BLAS's order."""
  k = a.shape[-1]
  if k <= SHARED_CHUNK:
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
  out = None
  for start in range(0, k, SHARED_CHUNK):   # block-level: one float64 GEMM per chunk
    part = np.matmul(a[..., start:start + SHARED_CHUNK].astype(np.float64),
                     b[..., start:start + SHARED_CHUNK, :].astype(np.float64)).astype(np.float32)
    out = part if out is None else np.add(out, part, out=out)
  return out


def round_to_bf16(v: np.ndarray) -> np.ndarray:
  """float32 values rounded to the nearest bfloat16 (ties to even), as bfloat16."""
  return np.asarray(v, _F32).astype(dt.bfloat16)


_HALF_MINUS_ONE = np.uint32(0x7FFF)
_HIGH_HALF = np.uint32(0xFFFF0000)
_SIGN = np.uint32(0x80000000)
_QUIET_NAN = np.uint32(0x7FC00000)
_ONE, _SIXTEEN = np.uint32(1), np.uint32(16)


def round_to_bf16_as_f32(v: np.ndarray, out: np.ndarray) -> np.ndarray:
  """`bf16_to_f32(round_to_bf16(v))` into `out` (float32, v's shape, any strides), bit for bit, on the
  float32 bits without a bfloat16 temporary (~3x faster on a 512x2048 span): add 0x7FFF plus the kept
  half's lowest bit (ties to even; carries into the exponent give the next binade or infinity), clear
  the low half; NaNs become the quiet NaN of their sign, as ml_dtypes' cast gives. Equal to the cast on
  all 2^32 float32 bit patterns (checked once, exhaustively; tests/lang/test_deferred.py checks every
  exponent, sign and rounding case)."""
  u = v.view(np.uint32)
  o = out.view(np.uint32)
  np.right_shift(u, _SIXTEEN, out=o)
  np.bitwise_and(o, _ONE, out=o)
  np.add(o, _HALF_MINUS_ONE, out=o)
  np.add(o, u, out=o)
  np.bitwise_and(o, _HIGH_HALF, out=o)
  if np.isnan(np.maximum.reduce(v, axis=None)):   # (max propagates NaN: one read pass when there is none)
    nan = np.isnan(v)
    o[nan] = (u[nan] & _SIGN) | _QUIET_NAN
  return out


# ------------------------------------------------------------------------ the chip's summation rule
CHUNK = 128                      # K of one MXU pass on v5e (128x128): chunk sums are added in order
_HALF = 4                        # products summed exactly, then rounded to float32 once
_EXACT_SPREAD = 35               # float64 holds every partial sum of 4 such products exactly when their
                                 # exponents span at most this many binades (chip_product)
_TILE_BYTES = 1 << 22            # float64 four-sums of one output tile (measured best: 128 x 128)
_TILE_ROWS = 128


def follows_chip(a_dtype, b_dtype, precision: str) -> bool:
  """Whether a float dot of these operands at `precision` is summed by the chip's rule (`chip_product`)
  in the running launch: VirtualTPU(dot_numerics="mxu"), no numerics diagnostic on, and both operands'
  values bfloat16-exact as the MXU multiplies them (float32 at DEFAULT, rounded; bfloat16; fp8; int8
  beside a float), the operands the rule was measured on. Float32 at HIGHEST (the chip's multi-pass
  products, unmeasured), float16 and float64 keep the host BLAS."""
  ex = executor.maybe_current()
  if ex is None or ex.dot_numerics != "mxu" or ex.exact_f32_dots or ex.shared_dots:
    return False
  if not (dt.is_float(a_dtype) or dt.is_float(b_dtype)):
    return False   # integer dots are exact either way
  return _bf16_exact(a_dtype, precision) and _bf16_exact(b_dtype, precision)


def _bf16_exact(d, precision: str) -> bool:
  d = np.dtype(d)
  if d == _F32:
    return rounds_to_bf16(d, precision)
  return d in dt.NARROW_FLOATS or (dt.is_signed_int(d) and dt.bits(d) <= 8)


def chip_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """`a @ b` ((..., m, k) @ (..., k, n) float32 arrays of bfloat16-exact values, the same batch shape)
  summed as the v5e's MXU sums a DEFAULT-precision dot (measured, docs/numerics.md): K in chunks of 128
  (the last one shorter), each chunk in groups of 8 products (K padded with zeros to a multiple of 8);
  a group is two exact sums of 4 products, each rounded to float32 once, added in float32; a chunk's
  group sums are added in order, from zero, in float32; the chunks' sums are added in order in float32.

  How, at block level: the four-sums of a tile of the output are float64 GEMMs of depth 4 (one batched
  `np.matmul` per chunk and tile); products of bfloat16 values have at most 16 significant bits, so a
  sum of four is exact in float64 (whatever order the BLAS adds them in) whenever their exponents span
  at most 35 binades (16 bits a product, 2 of carry, 53 in all). Where a row's four values and a
  column's four span more than that together (a product 2^35 times another of its group: checked per
  four-slice of K, from the operands' exponents), those slices' four-sums are summed in a fixed order
  in float64 (((p0 + p1) + p2) + p3) instead: deterministic, independent of the BLAS, and not measured
  on the chip. Then the float32 roundings and in-order additions are whole-tile NumPy operations.
  About ten times the CPU of a float32 BLAS product (docs/numerics.md)."""
  if a.ndim == 2:
    return _chip_2d(a, b)
  out = np.empty(a.shape[:-1] + (b.shape[-1],), _F32)
  for i in np.ndindex(a.shape[:-2]):   # block level: one 2-D product per batch entry
    out[i] = _chip_2d(a[i], b[i])
  return out


def _chip_2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  m, k = a.shape
  n = b.shape[1]
  out = np.zeros((m, n), _F32)
  if m == 0 or n == 0 or k == 0:
    return out
  kp = -(-k // 8) * 8
  a64 = np.zeros((m, kp), np.float64)
  a64[:, :k] = a
  b64 = np.zeros((kp, n), np.float64)
  b64[:k] = b
  wide = _spread(a64, 1) + _spread(b64, 0) > _EXACT_SPREAD   # per four-slice of K
  rows = min(m, _TILE_ROWS)
  cols = min(n, max(128, _TILE_BYTES // (32 * rows * 8) // 128 * 128))
  four = np.empty((32, rows, cols), np.float64)
  groups = np.empty((16, rows, cols), _F32)
  chunk_sum = np.empty((rows, cols), _F32)
  for c0 in range(0, kp, CHUNK):
    g = min(CHUNK, kp - c0) // 8
    # batch entry h * g + j: half h of group j (its K slice c0 + 8j + 4h .. + 4)
    lhs = a64[:, c0:c0 + 8 * g].reshape(m, g, 2, _HALF).transpose(2, 1, 0, 3).reshape(2 * g, m, _HALF)
    rhs = b64[c0:c0 + 8 * g].reshape(g, 2, _HALF, n).transpose(1, 0, 2, 3).reshape(2 * g, _HALF, n)
    slices = c0 // _HALF + 2 * np.arange(g)[None, :] + np.arange(2)[:, None]   # (2, g): K slice index
    fixed = np.flatnonzero(wide[slices.ravel()])
    for r0 in range(0, m, rows):
      r1 = min(m, r0 + rows)
      for n0 in range(0, n, cols):
        n1 = min(n, n0 + cols)
        p = four[:2 * g, :r1 - r0, :n1 - n0]
        np.matmul(lhs[:, r0:r1], rhs[:, :, n0:n1], out=p)
        for e in fixed:
          _fixed_order(lhs[e, r0:r1], rhs[e, :, n0:n1], p[e])
        s = groups[:g, :r1 - r0, :n1 - n0]
        np.add(p[:g], p[g:], out=s, dtype=_F32, casting="same_kind")   # each half rounded, then added
        o = out[r0:r1, n0:n1]
        acc = o if c0 == 0 else chunk_sum[:r1 - r0, :n1 - n0]
        np.add(s[0], np.float32(0), out=acc)   # from zero: a -0 group sum becomes +0
        for j in range(1, g):
          np.add(acc, s[j], out=acc)
        if c0:
          np.add(o, acc, out=o)
  return out


def _spread(v: np.ndarray, axis: int) -> np.ndarray:
  """Per four-slice of `v` along `axis` (the K axis, a multiple of 4 long), the largest span of binary
  exponents among one row's (or column's) nonzero values in that slice, over all rows (0 for none or
  one value; 2^20 where a slice holds an infinity or a NaN, which then take the fixed order)."""
  mag = np.abs(v)
  part = [(slice(None),) * axis + (slice(t, None, _HALF),) for t in range(_HALF)]
  hi = np.maximum(np.maximum(mag[part[0]], mag[part[1]]), np.maximum(mag[part[2]], mag[part[3]]))
  np.copyto(mag, np.inf, where=mag == 0)
  lo = np.minimum(np.minimum(mag[part[0]], mag[part[1]]), np.minimum(mag[part[2]], mag[part[3]]))
  span = np.frexp(hi)[1] - np.frexp(lo)[1]
  span[~np.isfinite(lo)] = 0           # no nonzero value
  span[~np.isfinite(hi)] = 1 << 20     # an infinity or a NaN (max propagates NaN)
  return span.max(axis=1 - axis, initial=0)


def _fixed_order(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
  """out = ((x0 y0 + x1 y1) + x2 y2) + x3 y3 in float64 (x: (r, 4), y: (4, c)), elementwise."""
  np.multiply(x[:, 0, None], y[0], out=out)
  for t in range(1, _HALF):
    np.add(out, x[:, t, None] * y[t], out=out)
