"""Op -> cycles rules for the TensorCore (L4b). Pure functions of the chip spec and operand shapes.

Vector work is counted in (8, 128) vreg tiles: "all vector computation is padded up to the tile size"
([details]). Arithmetic is counted in 32-bit tiles (elementwise math is effectively 32-bit,
tpu-hardware.md section 4); loads and stores move packed tiles (a bf16 vreg holds (16, 128)). Units and
throughputs come from [SB-tpus] appendix A: the VPU retires `vpu_alus_per_lane` tile-ops per cycle (1-cycle
issue, 2-cycle latency), 3 vreg loads and 1 vreg store per cycle, 2 XLUs. The latencies of loads,
stores, divisions, transcendentals, reductions and lane broadcasts, and the unit-ops per tile of
divisions and reductions, are measured on a TPU v5e (docs/timing-model.md 1.4); the expensive class
and the XLU relayouts keep their assumed costs ([details] classes).

The MXU rule is [xla-cost]'s vmatmul cadence model (tpu-hardware.md section 2.2).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from palace._src import dtypes as dt
from palace._src.executor import OpClass as _C
from palace._src.hw import CHIPS, MXU_CLASS_BITS, ChipSpec, vreg_tiles

# op class (executor.OpClass: the language's names for kinds of vector work) -> (unit, unit-ops per
# 32-bit (8,128) tile, result latency cycles): [SB-tpus] appendix A, chip measurements and [details]
# cost classes (see the module docstring).
VECTOR_CLASSES = {
    _C.CHEAP: ("vpu", 1, 2),            # + - * max min where compare cast: 1-cycle issue, 2 latency
    _C.BROADCAST: ("vpu", 1, 2),        # sublane broadcasts; a lane-replicated value across lanes
    _C.LANE_BROADCAST: ("xlu", 5, 108), # any other (N, 1) column across lanes (measured)
    _C.MEDIUM: ("vpu", 12, 17),         # divide / pow / integer div: Newton steps on the VPU (measured)
    _C.TRANSCENDENTAL: ("eup", 1, 7),   # exp2 / log / tanh / rsqrt: one EUP push per tile (measured)
    _C.EXP: ("eup", 1, 9),              # exp: as exp2, two cycles longer (measured)
    _C.EXPENSIVE: ("vpu", 16, 16),      # sin / cos: a polynomial on the VPU ([details]: expensive)
    _C.REDUCE_SUBLANE: ("vpu", 1, 10),  # second-minor reductions: in-lane shuffles (measured)
    _C.REDUCE_LANE: ("xlu", 5.5, 114),  # last-dim reductions, one per 8 rows of 128 lanes (measured)
    _C.XLU: ("xlu", 2, 32),             # minor-dim transposes, relayouts, rolls
    _C.LOAD: ("vld", 1, 1),             # vreg loads (packed tiles) (measured: a chain's load)
    _C.STORE: ("vst", 1, 1),            # vreg stores (packed tiles)
    _C.FREE: (None, 0, 0),              # leading-dim reshapes / transposes
}

UNITS = ("scalar", "vld", "vst", "vpu", "eup", "xlu", "mxu")
# cycles between an op and the op before it on the same unit when it queues behind that op (the unit
# still busy when it issues): measured on a TPU v5e, back-to-back EUP ops stream their vregs at one a
# cycle with 2 cycles between ops, while a lone op's result is not delayed (docs/timing-model.md 1.4)
QUEUE_GAP_CYCLES = {"eup": 2}


_THROUGHPUT_FIELD = {"vpu": "vpu_alus_per_lane", "xlu": "num_xlus", "vld": "vld_per_cycle",
                     "vst": "vst_per_cycle"}


def _units_per_cycle(chip: ChipSpec, unit: str) -> int:
  """Tile-ops a unit retires per cycle (the EUP: one)."""
  field = _THROUGHPUT_FIELD.get(unit)
  return 1 if field is None else getattr(chip, field)


def vector_cost(chip: ChipSpec, op_class: str, shape, dtype=None):
  """(unit, busy cycles, latency cycles) of one vector op; `dtype` packs loads and stores."""
  unit = VECTOR_CLASSES[op_class][0]
  bits = 32
  if dtype is not None and unit in ("vld", "vst"):
    bits = max(1, min(32, dt.bits(np.dtype(dtype))))
  return _vector_cost(op_class, tuple(shape), bits, _units_per_cycle(chip, unit) if unit else 1)


@functools.lru_cache(maxsize=65536)
def _vector_cost(op_class: str, shape: tuple, bits: int, per_cycle: int):
  unit, ops_per_tile, lat = VECTOR_CLASSES[op_class]
  if unit is None:
    return None, 0, 0
  return unit, max(1, math.ceil(ops_per_tile * vreg_tiles(shape, bits) / per_cycle)), lat


def mxu_class(chip: ChipSpec, lhs_dtype, rhs_dtype) -> str:
  """Cadence class of an MXU op: the narrowest operand decides; unsupported classes fall back to the
  bf16 rate (the compiler upcasts them; modelling assumption)."""
  lhs_dtype, rhs_dtype = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
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


def _operand_class(dtype) -> str:
  """MXU class of one operand: f32 (32-bit and wider), bf16 (16-bit), int8 / fp8 (8-bit and narrower)."""
  b = dt.bits(dtype)
  if b >= 32:
    return "f32"
  if b == 16:
    return "bf16"
  return "fp8" if dt.is_float(dtype) else "int8"


def mxu_operand_error(chip: ChipSpec, lhs_dtype, rhs_dtype) -> "str | None":
  """Why the chip's compiler rejects an (lhs, rhs) matmul, or None: `chip.mxu_rejected_operand_classes`
  (hardware data with its source, e.g. int8 x int8 on TPU v4, jax-ml/jax issue 37367)."""
  lhs_dtype, rhs_dtype = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
  pair = (_operand_class(lhs_dtype), _operand_class(rhs_dtype))
  if pair not in chip.mxu_rejected_operand_classes:
    return None
  ok = sorted(c.name for c in _chips_accepting(pair))
  return (f"matmul of {lhs_dtype.name} x {rhs_dtype.name} operands does not compile on TPU {chip.name}: "
          f"Mosaic rejects {pair[0]} x {pair[1]} products there ('Unsupported matmul RHS type on "
          f"target: vector<...x{_mlir_type(rhs_dtype)}>', ChipSpec.mxu_rejected_operand_classes). "
          f"Fix: widen the operands to bfloat16 (exact for int8 values), or run on "
          f"{', '.join(ok) or 'another chip'}.")


def _chips_accepting(pair):
  return [c for c in CHIPS.values() if pair not in c.mxu_rejected_operand_classes
          and (pair[0] != "int8" or "int8" in c.supported_mxu_classes)]


def _mlir_type(dtype) -> str:
  kind = "f" if dt.is_float(dtype) else ("ui" if dtype.kind == "u" else "i")
  return f"{kind}{dt.bits(dtype)}"


def _latches(chip: ChipSpec, k: int, n: int, batch: int) -> int:
  """Weight tiles of `batch` (., k) @ (k, n) products: K and N padded to the MXU."""
  return math.ceil(k / chip.mxu_size) * math.ceil(n / chip.mxu_size) * batch


def matmul_cycles(chip: ChipSpec, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype,
                  latched: bool = False):
  """(MXU busy cycles, result latency cycles) of `batch` (m,k)@(k,n) products on one TensorCore.

  [xla-cost] (tpu-hardware.md 2.2): num_latches = ceil(K/mxu) * ceil(N/mxu); vmatmuls per latch =
  ceil(M / rows), rows = sublanes*32/bits; the vmatmuls spread over the MXUs (cycles = cadence *
  vmatmuls / n_MXU, rounded up to whole vmatmuls); latch cycles = latch_cadence * mxu / (8*32/bits): the
  first latch is never hidden, later ones show when longer than the vmatmuls between latches; +4 cycles
  per chained vmatmul when there is only one vmatmul per latch (MRB reuse). The fill/drain latency delays
  the result but does not occupy the MXU (the next product can stream in behind it). `latched`: the
  weights are already in the MXUs (`matmul_issue`): the first latch is not paid.
  """
  cls = mxu_class(chip, lhs_dtype, rhs_dtype)
  bits = MXU_CLASS_BITS[cls]
  rows = chip.rows_per_vmatmul(bits)
  cadence = chip.vmatmul_cadence_cycles[cls]
  latches = _latches(chip, k, n, batch)
  per_latch = math.ceil(m / rows)
  vmatmuls_per_mxu = math.ceil(latches * per_latch / chip.num_mxus)
  busy = cadence * vmatmuls_per_mxu
  latches_per_mxu = max(1, math.ceil(latches / chip.num_mxus))
  between = cadence * per_latch
  latch_cycles = chip.latch_cadence_cycles[cls] * chip.mxu_size // (8 * 32 // bits)
  busy += (0 if latched else latch_cycles) + max(latch_cycles - between, 0) * (latches_per_mxu - 1)
  if per_latch == 1:
    busy += 4 * vmatmuls_per_mxu
  return int(busy), chip.mxu_latency_cycles[cls]


def matmul_mxus(chip: ChipSpec, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype) -> int:
  """How many of the core's MXUs a product keeps busy: its vmatmuls spread over them, so a product of
  fewer vmatmuls than `num_mxus` (one latch of one vreg's rows) leaves the others free."""
  bits = MXU_CLASS_BITS[mxu_class(chip, lhs_dtype, rhs_dtype)]
  return min(chip.num_mxus, _latches(chip, k, n, batch) * math.ceil(m / chip.rows_per_vmatmul(bits)))


def matmul_issue(chip: ChipSpec, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype,
                 latched: bool) -> tuple:
  """(cycles the product holds the core's MXU unit, cycles from then to its result) as the TensorCore
  issues it (measured on a v5e, session 37: benchmarks/hw `loop_ilp`, docs/timing-model.md 1.3).

  * A product that keeps u < num_mxus MXUs busy (`matmul_mxus`) holds the unit u / num_mxus of its busy
    cycles: independent small products run side by side on the other MXUs, and its own remaining
    cycles delay only its result. Two or four independent chains of (8, 128) x (128, 128) bf16 dots in
    a loop cost the chip 171 and 178 cycles an iteration against one chain's 171.
  * `latched`: its weights are one of the last `num_mxus` distinct weights multiplied in the same basic
    block (no grid step or rolled loop's back edge between; each MXU keeps its own), and fit the MXUs
    (one latch each): they stay latched, the first latch is not paid. A dependent chain of such dots
    costs the chip 140 cycles a link unrolled, 171 rolled (the 32-cycle latch again each iteration), and
    two chains on two weight matrices unrolled cost what two on one do (session 37's holdout).
  """
  reuse = latched and _latches(chip, k, n, batch) <= chip.num_mxus
  busy, lat = matmul_cycles(chip, m, k, n, batch, lhs_dtype, rhs_dtype, reuse)
  held = max(1, -(-busy * matmul_mxus(chip, m, k, n, batch, lhs_dtype, rhs_dtype) // chip.num_mxus))
  return held, lat + busy - held


def matmul_flops(m: int, k: int, n: int, batch: int) -> int:
  return 2 * m * k * n * batch


def roofline_time_s(chip: ChipSpec, flops: float, hbm_bytes: float, num_chips: int = 1) -> float:
  """max(FLOPs / bf16 peak, bytes / HBM bandwidth) ([SB-roof])."""
  return max(flops / (chip.peak_flops_per_s("bf16") * num_chips),
             hbm_bytes / (chip.hbm_bytes_per_s_per_device * num_chips))


# ------------------------------------------------------------------ SparseCore vector subcores
# op class -> subcore VPU ops per (lanes * packing)-element chunk; classes not listed cost 1. Modelling
# assumptions (sim/subcore.py's docstring): no public per-op figures exist for SparseCore subcores.
SPARSECORE_VECTOR_OPS = {_C.MEDIUM: 4, _C.TRANSCENDENTAL: 4, _C.EXP: 4, _C.EXPENSIVE: 16, _C.REDUCE_LANE: 2,
                         _C.XLU: 2}
SPARSECORE_VECTOR_LATENCY_CYCLES = 2   # result latency of every subcore vector op (assumption)


def sparsecore_vector_cost(lanes: int, op_class: str, shape, dtype=None):
  """(unit, busy cycles, latency cycles) of one vector op on a SparseCore subcore with `lanes` SIMD
  lanes: one cycle per (lanes * packing) elements times the op's ops per chunk; loads and stores
  occupy the load / store slots, everything else the VPU; leading-dim reshapes ('free') cost nothing."""
  if op_class == _C.FREE:
    return None, 0, 0
  n = 1
  for s in shape:
    n *= s
  width = lanes * dt.packing(dtype if hasattr(dtype, "itemsize") else dt.int32)
  busy = max(1, math.ceil(n / width)) * SPARSECORE_VECTOR_OPS.get(op_class, 1)
  unit = "vld" if op_class == _C.LOAD else ("vst" if op_class == _C.STORE else "vpu")
  return unit, busy, SPARSECORE_VECTOR_LATENCY_CYCLES
