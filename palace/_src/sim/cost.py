"""Op -> cycles rules for the TensorCore (L4b). Pure functions of the chip spec and operand shapes.

Vector work is counted in (8, 128) 32-bit vreg tiles: "all vector computation is padded up to the tile
size" ([details]). Narrow dtypes are counted in the same tiles (v5e has no bf16 VPU; elementwise math is
effectively 32-bit, tpu-hardware.md section 4). Per-tile costs by class are modelling assumptions built on
[details]'s cost classes (cheap / medium / expensive) and [SB-tpus] appendix A (1-cycle issue VPU ops,
3 vld + 1 vst slots, 2 XLUs): they are not fitted to anything.

The MXU rule is [xla-cost]'s vmatmul cadence model (tpu-hardware.md section 2.2).
"""
from __future__ import annotations

import math

from palace._src import dtypes as dt
from palace._src.hw import ChipSpec

# op class -> (unit, cycles per (8,128) tile, result latency cycles)
VECTOR_CLASSES = {
    "cheap": ("vpu", 1.0, 2),           # + - * max min where compare cast: 1-cycle issue, 2 latency
    "broadcast": ("vpu", 1.0, 2),
    "medium": ("vpu", 4.0, 8),          # divide / pow / integer div: a few VPU ops (Newton steps)
    "transcendental": ("eup", 2.0, 16), # exp / log / tanh / rsqrt on the EUP
    "expensive": ("vpu", 16.0, 16),     # sin / cos: polynomial on the VPU ([details]: expensive)
    "reduce_sublane": ("vpu", 1.0, 4),  # second-minor reductions: in-lane shuffles
    "reduce_lane": ("xlu", 2.0, 32),    # last-dim reductions: cross-lane unit, "slow and expensive"
    "xlu": ("xlu", 2.0, 32),            # minor-dim transposes, relayouts, rolls
    "load": ("vld", 1.0 / 3.0, 4),      # up to 3 vreg loads per cycle
    "store": ("vst", 1.0, 2),           # 1 vreg store per cycle
    "free": (None, 0.0, 0),             # leading-dim reshapes / transposes
}

UNITS = ("scalar", "vld", "vst", "vpu", "eup", "xlu", "mxu")


def vreg_tiles(shape) -> int:
  """Number of (8,128) tiles a value of `shape` occupies (everything padded to whole tiles)."""
  if not shape:
    return 1
  if len(shape) == 1:
    return max(1, math.ceil(shape[0] / 1024))
  lead = 1
  for s in shape[:-2]:
    lead *= s
  return max(1, lead * math.ceil(shape[-2] / 8) * math.ceil(shape[-1] / 128))


_VECTOR_COST_CACHE: dict = {}


def vector_cost(op_class: str, shape):
  """(unit, busy cycles, latency cycles) of one vector op (memoised: a pure function)."""
  key = (op_class, shape)
  hit = _VECTOR_COST_CACHE.get(key)
  if hit is not None:
    return hit
  unit, per_tile, lat = VECTOR_CLASSES[op_class]
  res = (None, 0, 0) if unit is None else \
      (unit, max(1, int(math.ceil(per_tile * vreg_tiles(shape)))), lat)
  if len(_VECTOR_COST_CACHE) < 65536:
    _VECTOR_COST_CACHE[key] = res
  return res


def mxu_class(chip: ChipSpec, lhs_dtype, rhs_dtype) -> str:
  """Cadence class of an MXU op: the narrowest operand decides; unsupported classes fall back to the
  bf16 rate (the compiler upcasts them; modelling assumption)."""
  b = min(dt.bits(lhs_dtype), dt.bits(rhs_dtype))
  if b >= 32:
    cls = "f32"
  elif b == 16:
    cls = "bf16"
  elif dt.is_float(lhs_dtype) or dt.is_float(rhs_dtype):
    cls = "fp8"
  else:
    cls = "int8"
  if cls not in chip.supported_mxu_classes or cls not in chip.vmatmul_cadence_cycles:
    cls = "bf16"
  return cls


_CLASS_BITS = {"f32": 32, "bf16": 16, "int8": 8, "fp8": 8}


def matmul_cycles(chip: ChipSpec, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype):
  """(busy cycles, result latency cycles) of `batch` (m,k)@(k,n) products on one TensorCore.

  num_latches = ceil(K/mxu) * ceil(N/mxu); vmatmuls per latch = ceil(M / rows), rows = 8*32/bits;
  latches spread over the MXUs; a latch that takes longer than the vmatmuls between latches shows; the
  first latch is never hidden; +4 cycles per chained vmatmul when there is one vmatmul per latch
  ([xla-cost]). The MXU fill/drain latency delays the result but does not occupy the MXU.
  """
  cls = mxu_class(chip, lhs_dtype, rhs_dtype)
  bits = _CLASS_BITS[cls]
  rows = chip.rows_per_vmatmul(bits)
  cadence = chip.vmatmul_cadence_cycles[cls]
  latches = math.ceil(k / chip.mxu_size) * math.ceil(n / chip.mxu_size) * batch
  per_latch = math.ceil(m / rows)
  latches_per_mxu = math.ceil(latches / chip.num_mxus)
  between = cadence * per_latch
  busy = between * latches_per_mxu
  latch_cycles = chip.latch_cadence_cycles[cls] * chip.mxu_size // (8 * 32 // bits)
  busy += latch_cycles + max(latch_cycles - between, 0) * (latches_per_mxu - 1)
  if per_latch == 1:
    busy += 4 * latches_per_mxu
  return int(busy), chip.mxu_latency_cycles


def matmul_flops(m: int, k: int, n: int, batch: int) -> int:
  return 2 * m * k * n * batch
