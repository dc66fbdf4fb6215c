"""Hardware is data (L1): frozen per-chip specs with units in field names and a source per number.

All per-TensorCore unless the name says `_per_device`. Source tags are those of
shared/reference/tpu-hardware.md: [tpu_info] jax/_src/tpu_info.py, [xla-pinfo] openxla platform_info.py,
[xla-cost] the openxla Pallas matmul cost model, [SB-tpus] the scaling book, [gcp-*] Cloud TPU pages,
[details] the Pallas TPU details doc. `ChipSpec.sources` maps every field to its source.
"Calibrated" constants are the only fitted numbers: they were fitted on the v5e matmul tutorial table
(tpu-hardware.md section 7) with benchmarks/calibrate.py, and are reused, in cycles, on the other chips.
"Modelling assumption" marks a number no public source gives; docs/timing-model.md lists them all.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np

from palace._src.errors import ShapeError, UsageError
from palace._src.util import fmt_site
from palace._src.validate import as_int

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclasses.dataclass(frozen=True)
class SparseCoreSpec:
  num_cores: int                 # SparseCores visible to Pallas per device
  num_subcores: int              # vector subcores (tiles) per SparseCore
  num_lanes: int                 # 32-bit SIMD lanes per vector subcore
  vmem_bytes_per_subcore: int    # TileSpmem
  vmem_shared_bytes: int         # Spmem per SparseCore (not public; modelling assumption)
  dma_granule_bytes: int


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  name: str
  clock_hz: float
  num_tensorcores_per_device: int   # 2 on megacore (v4, v5p); 7x exposes each TC as a device
  megacore: bool
  vmem_bytes: int
  smem_bytes: int
  default_scoped_vmem_bytes: int
  internal_scratch_bytes: int
  hbm_bytes_per_device: int
  hbm_bytes_per_s_per_device: float
  dma_bytes_per_s_per_tc: float     # one TC's DMA engines, HBM<->VMEM
  vmem_vmem_dma_bytes_per_s: float  # local VMEM<->SMEM/VMEM copies (modelling assumption: 4x HBM)
  dma_hbm_to_vmem_latency_ns: float
  dma_vmem_to_hbm_latency_ns: float
  mxu_size: int
  num_mxus: int
  vmatmul_cadence_cycles: MappingProxyType  # per MXU class: "f32", "bf16", "int8", "fp8"
  latch_cadence_cycles: MappingProxyType    # per MXU class
  mxu_latency_cycles: MappingProxyType      # result (fill/drain) latency per MXU class
  supported_mxu_classes: frozenset
  sublanes: int
  lanes: int
  vpu_alus_per_lane: int
  sparsecore: SparseCoreSpec | None
  ici_link_bytes_per_s_one_way: float
  ici_hop_latency_ns: float
  ici_dims: int                     # torus rank: 2 (v5e, v6e) or 3 (v4, v5p, 7x)
  ici_wraparound_min_axis: int      # wraparound on an axis only when it has at least this many chips
  # calibrated / modelling constants (cycles of this chip's clock)
  grid_step_overhead_cycles: int
  dma_issue_cycles: int
  scalar_op_cycles: int
  launch_overhead_s: float
  num_xlus: int = 2                         # cross-lane units per TC
  vld_per_cycle: int = 3                    # vreg loads per cycle
  vst_per_cycle: int = 1                    # vreg stores per cycle
  dma_local_latency_cycles: int = 64        # VMEM<->SMEM/VMEM copy completion latency
  # MXU operand pairs Mosaic rejects on this chip: ((lhs class, rhs class), ...) -> compile error
  mxu_rejected_operand_classes: frozenset = frozenset()
  # names of palace's kernel dtypes (dtypes.SUPPORTED) this chip's compiler lacks -> ShapeError
  unsupported_dtypes: frozenset = frozenset()
  # the MXU result FIFO of pltpu.matmul_lhs_fifo, bounded in 8 x 128 result vregs: (known to fit,
  # known to overflow); () when the chip has none (lang/mxu_fifo.py)
  mxu_result_fifo_vregs: tuple = ()
  # selectable clocks (P-states, index -> Hz); empty when the chip has one clock. `p_state` is the
  # index `clock_hz` comes from (None: no P-states)
  p_state_clocks_hz: tuple = ()
  p_state: "int | None" = None
  sources: MappingProxyType = dataclasses.field(compare=False, repr=False, default_factory=dict)
  # largest pod (ICI domain) in devices; the presets set it below, with its source in _LIMIT_SOURCES
  max_pod_devices: int = 4096
  semaphores_per_core: int = 4096   # live semaphores one core may allocate (see _LIMIT_SOURCES)
  semaphores_reserved: int = 0      # of those, the compiler keeps this many for itself (_LIMIT_SOURCES)
  # what the scalar core pays to see DMA completions: a DMA wait whose copy landed after the end of the
  # core's last such sync pays this much after the data landed (docs/timing-model.md 1.2)
  dma_wait_sync_cycles: int = 0
  # ---- rules measured on a v5e (off by default; on for v5e since session 33 except dma_wait_landed_cycles,
  # index_map_after_starts and wait_kept_write_backs, candidates still off everywhere: docs/timing-model.md
  # 1.6; `python -m benchmarks.hw --set FIELD=VALUE` evaluates other values against the recorded suite).
  # The latency form of the DMA wait: when set, a DMA wait ends at max(now, the copy's landing + this)
  # and dma_wait_sync_cycles is not paid (sim/sync.py)
  dma_wait_latency_cycles: "int | None" = None
  # with the latency form: every DMA wait also takes at least this many cycles from when the core
  # reaches it (a copy that landed long before is still not free to see)
  dma_wait_landed_cycles: int = 0
  # an XLU op whose operand is an MXU result (directly or through VPU ops of the same grid step) sees
  # it this many cycles per result vreg later, counting at most mxu_handoff_max_vregs vregs
  mxu_handoff_cycles_per_vreg: float = 0.0
  mxu_handoff_max_vregs: int = 16
  # a dot whose operands are ready only after the MXU's latest result (computed from it) starts on
  # the MXU once they are, instead of streaming behind it
  mxu_chain_waits: bool = False
  # an XLU op of another op class than the XLU's previous op starts after that op's result
  xlu_class_turnaround: bool = False
  # each copy on an HBM channel occupies it as if it were this many bytes longer (engine time)
  dma_copy_overhead_bytes: int = 0
  # ...except a copy whose HBM window continues, in the array's (8, 128)-tiled order, where this core's
  # previous copy of the same direction into or out of that array ended (a stream of consecutive blocks)
  dma_sequential_no_overhead: bool = False
  # ...and as if this many bytes longer per contiguous run of its HBM side (a block of R rows narrower
  # than its array's rows is R runs)
  dma_run_overhead_bytes: int = 0
  # the DMA engine holds this many started copies whose transfer has not begun; a start beyond them
  # waits (the scalar core stalls) until the oldest begins (0: no limit)
  dma_queue_depth: int = 0
  # scalar cycles more for a DMA start whose completion semaphore is not the previous start's
  dma_issue_switch_cycles: int = 0
  # what a DMA start costs the scalar core instead of dma_issue_cycles in a DMA-only loop body: while
  # the current basic block (since the last loop back edge or grid step) has issued no vector or MXU
  # op, and the latest block that started copies or computed issued none either (None: always
  # dma_issue_cycles; sim/dma.DmaEngine.start, TensorCore.block_boundary)
  dma_issue_bare_cycles: "int | None" = None
  # a write larger than hbm_write_buffer_bytes that starts while a read of this core is queued behind an
  # earlier write (its transfer not begun) goes after that read instead of ahead of it (sim/dma_arbiter.py)
  dma_big_write_waits_queued_read: bool = False
  # scalar cycles a pallas_call grid step spends per pipelined operand on its index map, charged before
  # the step's next blocks are started (their indices come first: pipeline.py): a map computed from the
  # grid indices (a front end's map with arithmetic in it, or a block index neither constant nor equal
  # to one grid index), a plain map (block indices that are grid indices or constants, not all
  # constant), and a map reading kernel memory (scalar-prefetch tables, evaluated on the core); an
  # operand whose map is constant costs none of these. Pipelines recorded inside a kernel
  # (emit_pipeline's parked schedules) are not charged.
  index_map_cycles: int = 0
  index_map_plain_cycles: int = 0
  index_map_smem_cycles: int = 0
  index_map_subword_cycles: int = 0   # more per table-reading map when the tables hold int8 / int16
  # ...and, charged with them, per grid dimension beyond the first and per pipelined operand beyond
  # two (the step's own bookkeeping: its next grid indices, each operand's block slot); a step's sum
  # is rounded to whole cycles
  grid_step_dim_cycles: int = 0
  grid_step_operand_cycles: float = 0.0
  # ...charged after the step's next blocks are started (before its waits) instead of before
  index_map_after_starts: bool = False
  # a pallas_call output block kept over two or more grid steps is written back and waited at once
  # when it changes (the next step starts after its write-back is seen)
  wait_kept_write_backs: bool = False
  # every pallas_call output write-back is waited at the end of the grid step after the one that
  # started it (after that step's own write-backs are started), not when its slot is next used
  wait_write_backs_next_step: bool = False
  # a rolled loop's back edge (lax.fori_loop / while_loop / pl.loop iteration, not unrolled): the next
  # iteration issues after this one's vector/MXU results have drained, plus these cycles, and no earlier
  # than loop_min_iteration_cycles after the previous back edge let the loop go on (the loop's branch
  # and counter work overlap the body's results) (docs/timing-model.md 1.1)
  loop_back_edge_cycles: int = 0
  loop_min_iteration_cycles: int = 9
  # a vector store whose value comes after the store unit would have ended it holds the in-order store
  # unit until then: the next store (of any later op) ends no earlier than that plus its own cycles,
  # unless it stores an (N, 1) column or an MXU result (directly or through VPU ops)
  stores_in_order: bool = False
  # a vector store of more than one vreg streams behind its value: the store unit is busy until the
  # value's last vreg (ready at the value's ready cycle) is stored, unless the store is exempt from
  # stores_in_order's hold ((N, 1) columns, MXU results)
  stores_stream_behind_values: bool = False
  # a conditional branch (pl.when, lax.cond, lax.switch) costs the scalar core this many cycles beyond
  # its condition's own ops
  branch_cycles: int = 0
  # a grid step's bookkeeping (grid_step_overhead_cycles) starts once the step's vector work has issued
  # and its MXU results are out, while vector and EUP/XLU results are still in flight; the next step
  # issues after both, and at least this many cycles after the last of those results
  # (docs/timing-model.md 1.1)
  grid_step_drain_cycles: int = 10
  # one core's DMA engine serves HBM writes ahead of reads, except a read's first
  # `dma_read_head_bytes`; a read held behind a write, or queued behind one, pays the bus turnaround
  # (sim/dma_arbiter.py)
  dma_read_head_bytes: int = 32 * 1024
  dma_write_turnaround_cycles: int = 142
  smem_reserved_bytes: int = 0      # SMEM the compiler keeps for itself (see _LIMIT_SOURCES)
  # Achieved HBM rates as fractions of the datasheet `hbm_bytes_per_s_per_device` (None: 1.0), measured
  # on a real v5e (_MEASURED_SOURCES, docs/timing-model.md 1.2): reads stream at `hbm_read_fraction`;
  # writes at `hbm_write_fraction` when no read is streaming, else at `hbm_write_with_reads_fraction`
  # (the bus turnaround of mixed traffic); an HBM->HBM DMA copies `hbm_copy_fraction` of the peak in
  # bytes per second (each byte read and written; None: 0.5).
  hbm_read_fraction: "float | None" = None
  hbm_write_fraction: "float | None" = None
  hbm_write_with_reads_fraction: "float | None" = None
  hbm_copy_fraction: "float | None" = None
  # HBM takes writes into a buffer of this many bytes at the read rate (hbm_read_fraction) and drains it
  # at the write rate; a write is done when its bytes are in: a burst's first bytes go faster than a
  # sustained write stream (0: no buffer; sim/dma.CopyPlan). Only while no read streams (the mixed rate
  # applies otherwise, unbuffered)
  hbm_write_buffer_bytes: int = 0
  dma_hbm_hbm_latency_ns: "float | None" = None   # None: the larger of the two directions
  # the chip's link to its host's memory (PCIe): DMAs to and from pinned host memory (pl.HOST) cross it
  host_link_bytes_per_s_one_way: float = 1.6e10
  host_link_latency_ns: float = 1000.0
  # the least `pltpu.CompilerParams(internal_scratch_in_bytes=n)` the TPU compiler accepts: a launch
  # asking for less is refused (check_internal_scratch). None: never measured on this chip, and then
  # palace checks nothing (any n >= 0 runs): the minimum is the compiler's, and guessing one would
  # refuse kernels the chip may run or pass ones it refuses (docs/limits.md)
  min_internal_scratch_bytes: "int | None" = None

  # ---- derived figures ----
  def rows_per_vmatmul(self, lhs_bits: int) -> int:
    return self.sublanes * 32 // lhs_bits  # [xla-cost]: sublanes * 32 / bits(lhs)

  def peak_flops_per_s(self, cls: str = "bf16") -> float:
    """Per device: n_TC * n_MXU * 2 * rows * K * N / cadence * f  (tpu-hardware.md 1.3)."""
    if cls not in self.vmatmul_cadence_cycles or cls not in self.supported_mxu_classes:
      return 0.0
    bits = MXU_CLASS_BITS[cls]
    per_cycle = (self.num_mxus * 2 * self.rows_per_vmatmul(bits) * self.mxu_size * self.mxu_size
                 / self.vmatmul_cadence_cycles[cls])
    return per_cycle * self.clock_hz * self.num_tensorcores_per_device

  def vpu_flops_per_s(self) -> float:
    """Per device: sublanes * lanes * ALUs * f * n_TC ([SB-tpus] appendix A)."""
    return (self.sublanes * self.lanes * self.vpu_alus_per_lane * self.clock_hz
            * self.num_tensorcores_per_device)

  @property
  def hbm_bytes_per_s(self) -> float:
    return self.hbm_bytes_per_s_per_device

  def hbm_weights(self) -> tuple[float, float, float, float]:
    """Bytes of the HBM channel (`hbm_bytes_per_s_per_device`) one byte of a copy takes: (read, write
    alone, write while reads stream, HBM->HBM per byte copied)."""
    wr = self.hbm_write_fraction or 1.0
    return (1.0 / (self.hbm_read_fraction or 1.0), 1.0 / wr, 1.0 / (self.hbm_write_with_reads_fraction or wr),
            1.0 / (self.hbm_copy_fraction or 0.5))

  @property
  def dma_hbm_to_hbm_latency_ns(self) -> float:
    """HBM->HBM copies: measured where known (`dma_hbm_hbm_latency_ns`), else the larger of the two
    directions (modelling assumption)."""
    if self.dma_hbm_hbm_latency_ns is not None:
      return self.dma_hbm_hbm_latency_ns
    return max(self.dma_hbm_to_vmem_latency_ns, self.dma_vmem_to_hbm_latency_ns)

  @property
  def critical_intensity_flops_per_byte(self) -> float:
    return self.peak_flops_per_s("bf16") / self.hbm_bytes_per_s_per_device

  def cycles_to_s(self, cycles: float) -> float:
    return cycles / self.clock_hz

  def ns_to_cycles(self, ns: float) -> int:
    return int(round(ns * 1e-9 * self.clock_hz))


MXU_CLASS_BITS = MappingProxyType({"f32": 32, "bf16": 16, "int8": 8, "fp8": 8})


def vreg_tiles(shape, bits: int = 32) -> int:
  """Number of vregs a value of `shape` occupies: (8 * 32/bits, 128) tiles, everything padded (the
  vreg tiling of every TensorCore generation: the cost rules' and the language's one count)."""
  if not shape:
    return 1
  pack = 32 // bits if bits < 32 else 1
  if len(shape) == 1:
    return max(1, -(-shape[0] // (1024 * pack)))
  lead = 1
  for s in shape[:-2]:
    lead *= s
  return max(1, lead * -(-shape[-2] // (8 * pack)) * -(-shape[-1] // 128))


def _mp(**kw):
  return MappingProxyType(dict(kw))


_OFF_HERE = "off on this chip (measured on a v5e only and adopted there in session 33, see v5e's source): "
_COMMON_SOURCES = _mp(
    clock_hz="[SB-tpus][xla-pinfo]; v4 derived from the [gcp-v4] peak (tpu-hardware.md 1.3); "
             "7x: P-state 7 (2.2 GHz) [xla-pinfo], the clock of the published 1.15e15 bf16 FLOP/s "
             "per logical device ([gcp-7x] 2307 TF per chip, [tpu_info] 2.31e15 per chip) that "
             "Google's 7x kernel benchmarks use for MFU; other P-states via "
             "pl.virtual_tpu('7x', p_state=...)",
    p_state_clocks_hz="[xla-pinfo] 7x P-states 0-7 = 1.6, 1.7, 1.8, 1.9, 2.0, 2.05, 2.1, 2.2 GHz "
                      "(default P-state 3 of the cost-model benchmarks); v4/v5e/v5p/v6e have none",
    p_state="index into p_state_clocks_hz that clock_hz is (7x preset: 7, see clock_hz)",
    mxu_rejected_operand_classes="jax-ml/jax issue 37367: int8 x int8 -> int32 in a pallas_call fails "
                                 "to compile on TPU v4 ('Unsupported matmul RHS type on target: "
                                 "vector<128x128xi8>'); [tpu_info] is_matmul_supported has no "
                                 "integer LHS on v4 (f32/bf16 LHS only). None known on other chips",
    unsupported_dtypes="float8_e4m3b11fnuz on v4 and 7x: [tpu_info] is_matmul_supported takes it on "
                       "v5e/v5p/v6e only, and JAX's tests/pallas/tpu_pallas_test.py "
                       "test_mixed_precision_dot skips 'float8_e4m3b11fnuz not supported on TPU "
                       "generations <= 4' and '... not supported on TPU v7x'. int2 / uint2 (field "
                       "types of pack/unpack_elementwise) on v4: JAX's tests/pallas/tpu_ops_test.py "
                       "skips its int2 packs below v5 ('Requires TPU v5+'). None known otherwise",
    mxu_result_fifo_vregs="not published; bounded from JAX's tests/pallas/tpu_pallas_test.py "
                          "ExplicitMXUTest (v5e and later): test_fifo pops after each push and expects "
                          "success with results of up to 4 vregs (int8: 32 x 128 int32), test_fifo_overflow "
                          "expects 'FIFO is full' from 32 queued (16, 128) float32 results (64 vregs); 7x: "
                          "none ('MatmulLhsFifoOp not supported on TPU generations >= 7'); v4: none "
                          "known (the tests need v5e or later)",
    num_tensorcores_per_device="[tpu_info]; 7x: one TC per logical device [tpu_info]",
    megacore="[details] megacore on v4 and v5p only",
    vmem_bytes="[tpu_info] vmem_capacity_bytes", smem_bytes="[tpu_info] smem_capacity_bytes",
    default_scoped_vmem_bytes="tpu-hardware.md section 3 (16 MiB v4/v5e/v5p, 32 MiB v6e/7x)",
    internal_scratch_bytes="[xla-pinfo] default_internal_scratch_bytes",
    hbm_bytes_per_device="[tpu_info]; 7x: per chip / 2 logical devices",
    hbm_bytes_per_s_per_device="[gcp-*] spec sheets; 7x [SB-tpus] per chip / 2 devices",
    dma_bytes_per_s_per_tc="[xla-pinfo] HBM->VMEM DMA bandwidth per TC; v5e capped at its HBM peak "
                           "(the [xla-pinfo] v5e row is suspect, tpu-hardware.md 2.1); v4: HBM / 2 TCs "
                           "(modelling assumption, by analogy with v5p whose per-TC figure is about "
                           "half its HBM bandwidth)",
    vmem_vmem_dma_bytes_per_s="modelling assumption: local DMAs at 4x HBM bandwidth (VMEM itself is "
                              "~22x HBM [SB-tpus]; the DMA engine, not VMEM, is assumed to limit)",
    dma_hbm_to_vmem_latency_ns="[xla-pinfo]; v5e measured (its _MEASURED_SOURCES entry); v4 assumed "
                               "equal to v5p",
    dma_vmem_to_hbm_latency_ns="[xla-pinfo]; v5e measured (its _MEASURED_SOURCES entry); v4 assumed "
                               "equal to v5p",
    dma_local_latency_cycles="modelling assumption (no public figure)",
    mxu_size="[tpu_info] mxu_column_size", num_mxus="[tpu_info] num_mxus (v6e: 2 after May 2026)",
    vmatmul_cadence_cycles="[xla-pinfo]; v4 chosen to give the [gcp-v4] peak at 1.05 GHz "
                           "(int8 at the bf16 rate [gcp-v4])",
    latch_cadence_cycles="[xla-pinfo]; v4 assumed equal to v5e",
    mxu_latency_cycles="[xla-pinfo] result latency (bf16 / int); f32 assumed equal to bf16; "
                       "v4 assumed equal to v5e",
    supported_mxu_classes="[tpu_info] is_matmul_supported",
    sublanes="[tpu_info]", lanes="[tpu_info]",
    vpu_alus_per_lane="[SB-tpus] appendix A (2 on v4, 4 on v5+)",
    num_xlus="[SB-tpus] appendix A (2 XLUs per TC, v5p); assumed on every chip",
    vld_per_cycle="[SB-tpus] appendix A (up to 3 vreg loads per cycle)",
    vst_per_cycle="[SB-tpus] appendix A (1 vreg store per cycle)",
    ici_link_bytes_per_s_one_way="[SB-tpus]", ici_hop_latency_ns="[SB-shard] ~1 us per hop",
    ici_dims="[gcp-*] topology", ici_wraparound_min_axis="[SB-tpus]",
    sparsecore="[tpu_info] SparseCoreInfo and docs/pallas/tpu/sparsecore.md (cores, subcores, lanes, "
               "TileSpmem, DMA granule); vmem_shared_bytes is a modelling assumption",
    grid_step_overhead_cycles="measured on a TPU v5e (benchmarks/hw, 2026-12-05): 4096 grid steps that "
                              "copy nothing run in 101.3 us, 37 cycles a step; reused in cycles on "
                              "every chip (v5e: its own source, 33 with the step's own bookkeeping rules)",
    dma_wait_sync_cycles="calibrated: the per-step cost fitted on tpu-hardware.md section 7 (v5e matmul "
                         "table, 300 cycles) less the measured 37-cycle step; it is what a v5e shows "
                         "for each run of DMA waits: a start-and-wait loop of 4 KiB reads takes 0.34 us "
                         "a copy, a pipeline of (8, 128) blocks 0.21 us a step, 16 page DMAs and their "
                         "waits 0.53 us (benchmarks/hw); reused in cycles on every chip",
    loop_back_edge_cycles="measured on a TPU v5e (benchmarks/hw loop_ilp 2026-12-06, eup_curve "
                          "2026-12-07): a rolled fori_loop's iteration costs its chain of dependent "
                          "results and nothing more once that chain is 10 cycles or longer (1, 2, 3, 4 "
                          "multiply-adds on one vreg: 9.1, 9.9, 12.9, 16.9 cycles an iteration against "
                          "chains of 4.2 a link unrolled; tanh / exp / divide / sublane-sum chains +1); "
                          "reused in cycles on every chip",
    loop_min_iteration_cycles="measured on a TPU v5e (benchmarks/hw loop_ilp 2026-12-06, eup_curve "
                              "2026-12-07): rolled loops whose chain is shorter than ~9 cycles (one or two "
                              "multiply-adds, two or four independent ones) take 9-10 cycles an "
                              "iteration; reused in cycles on every chip",
    grid_step_drain_cycles="fitted on a TPU v5e (benchmarks/hw step_chain, 2026-12-06): a grid step "
                           "holding k dependent links of one op on one vreg costs the chain plus about "
                           "13 cycles (lane max: 133, 253, 493, 925 cycles for k = 1, 2, 4, 8; exp, "
                           "division and sublane sums alike), and a chain shorter than the step's "
                           "37-cycle bookkeeping costs the bookkeeping alone (multiply-add: 37.5-40); "
                           "the 13 are this drain and the chain's first load and last store; reused in "
                           "cycles on every chip",
    dma_read_head_bytes="measured on a TPU v5e (benchmarks/hw dma_curve, dma_order, dma_chunk, "
                        "2026-12-06): reads of 16-32 KiB started beside a 32-256 KiB write cost their "
                        "own round trip (373-391 ns, +0-37), reads of 64 KiB and more pay the write's "
                        "transfer and the turnaround; 40-56 KiB lie between (+58 to +131 ns beside a 64 "
                        "KiB write); reused on every chip",
    dma_write_turnaround_cycles="fitted on a TPU v5e (benchmarks/hw dma_curve pairs, 2026-12-06): a "
                                "read of 64-256 KiB beside a write of 16-256 KiB pays the write's "
                                "transfer and 51-163 ns more, median 95 ns (142 cycles at 1.5 GHz); "
                                "reused in cycles on every chip",
    dma_wait_latency_cycles=_OFF_HERE + "(None here) session 23's sync_size probes (benchmarks/hw, "
                            "2026-12-06) see a copy about 280 cycles after it landed",
    dma_wait_landed_cycles="candidate rule, off (0): session 22's sync_sweep (benchmarks/hw, 2026-12-06), "
                           "~43 cycles a moving input beside 4096 rows of vector work; not adopted",
    mxu_handoff_cycles_per_vreg=_OFF_HERE + "(0 here) session 24's wheel_step cut chain (benchmarks/hw, "
                                "2026-12-06), ~38 cycles for a (128, 128) f32 result",
    mxu_handoff_max_vregs="candidate rule (with mxu_handoff_cycles_per_vreg): 16, fitted in session 29 "
                          "on stream_pair and wheel_step (docs/validation.md)",
    mxu_chain_waits=_OFF_HERE + "session 25's mxu_chain probes (benchmarks/hw, 2026-12-06)",
    xlu_class_turnaround=_OFF_HERE + "session 24's pv_more probes (benchmarks/hw, 2026-12-06)",
    dma_copy_overhead_bytes=_OFF_HERE + "(0 here) session 28's page_order and sync_size probes "
                            "(benchmarks/hw, 2026-12-06)",
    branch_cycles=_OFF_HERE + "session 34's step_body probes: a pl.when that never holds costs the "
                  "chip 7.0 cycles, its condition included (benchmarks/hw, 2026-12-07)",
    stores_in_order=_OFF_HERE + "session 35's eup_stream probes (benchmarks/hw, 2026-12-07): a VPU "
                    "or EUP stream accumulating into VMEM beside an MXU dot or a lane max costs the chip "
                    "nearly their sum (dot + c += b * 1e-3: 966 cycles a step, the dot alone 719); "
                    "candidate: it breaks a dot beside a lane max, which the chip overlaps",
    stores_stream_behind_values=_OFF_HERE + "session 36's step_raw and eup_curve probes (benchmarks/hw, "
                                "2026-12-07): a grid step's 16- or 64-vreg tanh costs the chip 7 cycles "
                                "more than the same step's add",
    dma_queue_depth=_OFF_HERE + "(0 here) session 34's region traces of bursts (benchmarks/hw, "
                    "2026-12-07): beyond ~14 queued 4 KiB starts each start waits ~10 cycles",
    dma_issue_switch_cycles=_OFF_HERE + "(0 here) session 34's region traces: 16 starts alternating two "
                            "semaphores take 125 cycles, on one 37 (benchmarks/hw, 2026-12-07)",
    dma_issue_bare_cycles=_OFF_HERE + "(None here) session 38's dma_beside probes (benchmarks/hw, "
                          "2026-12-08): a DMA-only loop's starts cost ~2 cycles, beside vector work ~18",
    dma_big_write_waits_queued_read=_OFF_HERE + "session 38's write_queue probes (benchmarks/hw, "
                                    "2026-12-08): a 512 KiB write started while a 128 KiB read waits "
                                    "behind an earlier 512 KiB write goes after it, a 128 KiB write ahead",
    dma_sequential_no_overhead=_OFF_HERE + "session 34's bursts: 4 KiB copies of consecutive rows cost "
                               "the chip ~10 cycles each, random pages ~17 (dma_issue, issue_form)",
    index_map_cycles=_OFF_HERE + "(0 here) session 27's step_branch probes (benchmarks/hw, "
                     "2026-12-06), +21 cycles a step for two operands' computed maps beside a heavy "
                     "body; session 29's copy_shape / copy_window (2026-12-07), +21 for two beside a "
                     "copy-bound one, +28 for three (mm_step)",
    index_map_smem_cycles=_OFF_HERE + "(0 here) session 27's step_branch probes, +46 (int32) and "
                          "+75 (int8) cycles a step for two operands' table-reading maps",
    index_map_subword_cycles=_OFF_HERE + "(0 here) session 27's step_branch probes (benchmarks/hw, "
                             "2026-12-06): two operands' maps reading an int8 table +75 cycles a step, "
                             "an int32 one +46 (the sub-word read's extraction)",
    index_map_plain_cycles=_OFF_HERE + "(0 here) session 32's step_book probes (benchmarks/hw, "
                           "2026-12-07): an input whose block moves with the outer index of a (64, 64) "
                           "grid costs ~14 cycles a step more than a constant one, a copy every 64 steps "
                           "included",
    index_map_after_starts="candidate rule, off: session 32's step_book and session 24's step_ops "
                           "(benchmarks/hw): with moving blocks the grid's rank costs the chip nothing "
                           "(the bookkeeping hides under the copies in flight); not adopted",
    grid_step_dim_cycles=_OFF_HERE + "(0 here) session 32's step_book probes (benchmarks/hw, "
                         "2026-12-07): 4096 steps of fixed blocks cost 37.1 / 42.1 / 48.1 / 54.1 cycles a "
                         "step on grids of rank 1 / 2 / 3 / 4 (and +18 beside a vector body)",
    grid_step_operand_cycles=_OFF_HERE + "(0 here) session 32's step_book probes (benchmarks/hw, "
                             "2026-12-07): 3.0-4.1 cycles a step per fixed-block operand beyond one input "
                             "and one output (2, 4, 8 inputs; 2, 4 outputs)",
    wait_kept_write_backs="candidate rule, off: session 25's out_switch and session 29's mm_step / "
                          "copy_shape (benchmarks/hw, 2026-12-06/07): a kept block's change costs "
                          "190-280 cycles (32 KiB) and ~660 (64 KiB), one written every step far less; "
                          "not adopted",
    dma_run_overhead_bytes=_OFF_HERE + "(0 here) session 31's region traces (benchmarks/hw/regions.py, "
                           "2026-12-07): a pair of 32 KiB copies of 128 rows each is seen ~50 cycles "
                           "later than the per-copy overhead gives (64 bytes a run fits mm_step), 128 "
                           "rows cost ~22 cycles a step more than 64 (copy_shape)",
    wait_write_backs_next_step=_OFF_HERE + "session 31's region traces on the chip "
                               "(benchmarks/hw/regions.py, 2026-12-07): out_switch K = 2 / 8 wait "
                               "~375 cycles at the end of the step after the output block changes, "
                               "K = 1 at every step's end, out_heavy K = 8 not at all (its next step "
                               "outlasts the write-back)",
    hbm_write_buffer_bytes="not measured on this chip: no write buffer (0: writes at one rate); v5e: "
                           "its own source",
    dma_issue_cycles="modelling assumption: one DMA request per cycle [SB-tpus] plus address "
                     "arithmetic (the sum with the step overhead is what section 7 fixes); v5e: its "
                     "own source",
    scalar_op_cycles="[SB-tpus] scalar unit issues one bundle per cycle (modelling assumption)",
    launch_overhead_s="calibrated on tpu-hardware.md section 7 (host dispatch, 100-115 us on v5e); "
                      "assumed the same on every chip",
)

# Calibrated constants (tpu-hardware.md section 7, see benchmarks/calibrate.py and docs/timing-model.md),
# shared in cycles by every chip.
_STEP_OVERHEAD_CYCLES = 37    # measured on v5e (_MEASURED_SOURCES): every step
_DMA_WAIT_SYNC_CYCLES = 263   # with the 37-cycle step, the calibrated 300 cycles of a copying step
_LAUNCH_OVERHEAD_S = 115e-6
# Modelling assumption (not identifiable from section 7 separately from the step overhead).
_DMA_ISSUE_CYCLES = 8

V4 = ChipSpec(
    name="v4", clock_hz=1.05e9, num_tensorcores_per_device=2, megacore=True,
    vmem_bytes=16 * MiB, smem_bytes=1 * MiB, default_scoped_vmem_bytes=16 * MiB,
    internal_scratch_bytes=73728, hbm_bytes_per_device=34_400_000_000,
    hbm_bytes_per_s_per_device=1.2e12, dma_bytes_per_s_per_tc=1.2e12 / 2,
    vmem_vmem_dma_bytes_per_s=4.8e12, dma_hbm_to_vmem_latency_ns=667, dma_vmem_to_hbm_latency_ns=624,
    mxu_size=128, num_mxus=4, vmatmul_cadence_cycles=_mp(f32=8, bf16=16, int8=32),
    latch_cadence_cycles=_mp(f32=2, bf16=4, int8=4), mxu_latency_cycles=_mp(f32=131, bf16=131, int8=121),
    supported_mxu_classes=frozenset({"f32", "bf16", "int8"}), sublanes=8, lanes=128, vpu_alus_per_lane=2,
    mxu_rejected_operand_classes=frozenset({("int8", "int8")}),
    unsupported_dtypes=frozenset({"float8_e4m3b11fnuz", "int2", "uint2"}),
    sparsecore=None, ici_link_bytes_per_s_one_way=4.5e10, ici_hop_latency_ns=1000, ici_dims=3,
    ici_wraparound_min_axis=4, grid_step_overhead_cycles=_STEP_OVERHEAD_CYCLES,
    dma_wait_sync_cycles=_DMA_WAIT_SYNC_CYCLES, dma_issue_cycles=_DMA_ISSUE_CYCLES, scalar_op_cycles=1,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
    sources=_COMMON_SOURCES)

V5E = ChipSpec(
    name="v5e", clock_hz=1.5e9, num_tensorcores_per_device=1, megacore=False,
    vmem_bytes=128 * MiB, smem_bytes=1 * MiB, default_scoped_vmem_bytes=16 * MiB,
    internal_scratch_bytes=73728, hbm_bytes_per_device=17_200_000_000,
    hbm_bytes_per_s_per_device=8.19e11, dma_bytes_per_s_per_tc=8.19e11,
    vmem_vmem_dma_bytes_per_s=3.28e12, dma_hbm_to_vmem_latency_ns=147,
    dma_vmem_to_hbm_latency_ns=42,
    mxu_size=128, num_mxus=4, vmatmul_cadence_cycles=_mp(f32=8, bf16=16, int8=16, fp8=32),
    latch_cadence_cycles=_mp(f32=2, bf16=4, int8=4, fp8=4),
    mxu_latency_cycles=_mp(f32=131, bf16=131, int8=121, fp8=131),
    supported_mxu_classes=frozenset({"f32", "bf16", "int8", "fp8"}), sublanes=8, lanes=128,
    mxu_result_fifo_vregs=(4, 64), vpu_alus_per_lane=4, sparsecore=None,
    ici_link_bytes_per_s_one_way=4.5e10, ici_hop_latency_ns=1000,
    ici_dims=2, ici_wraparound_min_axis=16, grid_step_overhead_cycles=_STEP_OVERHEAD_CYCLES,
    dma_wait_sync_cycles=_DMA_WAIT_SYNC_CYCLES, dma_issue_cycles=_DMA_ISSUE_CYCLES, scalar_op_cycles=1,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
    sources=_COMMON_SOURCES)

V5P = dataclasses.replace(
    V5E, name="v5p", clock_hz=1.75e9, num_tensorcores_per_device=2, megacore=True, vmem_bytes=64 * MiB,
    hbm_bytes_per_device=103_000_000_000, hbm_bytes_per_s_per_device=2.765e12,
    dma_bytes_per_s_per_tc=1.459e12, vmem_vmem_dma_bytes_per_s=5.8e12,
    dma_hbm_to_vmem_latency_ns=667, dma_vmem_to_hbm_latency_ns=624,
    sparsecore=SparseCoreSpec(4, 16, 8, 512 * KiB, 8 * MiB, 32),
    ici_link_bytes_per_s_one_way=9e10, ici_dims=3, ici_wraparound_min_axis=4)

V6E = dataclasses.replace(
    V5E, name="v6e", clock_hz=1.75e9, vmem_bytes=128 * MiB, default_scoped_vmem_bytes=32 * MiB,
    hbm_bytes_per_device=34_400_000_000, hbm_bytes_per_s_per_device=1.64e12,
    dma_bytes_per_s_per_tc=1.373e12, vmem_vmem_dma_bytes_per_s=6.5e12,
    dma_hbm_to_vmem_latency_ns=628, dma_vmem_to_hbm_latency_ns=523, mxu_size=256, num_mxus=2,
    vmatmul_cadence_cycles=_mp(f32=4, bf16=8, int8=8, fp8=16),
    mxu_latency_cycles=_mp(f32=192, bf16=192, int8=182, fp8=192),
    sparsecore=SparseCoreSpec(2, 16, 8, 256 * KiB, 8 * MiB, 32),
    ici_link_bytes_per_s_one_way=9e10, ici_dims=2, ici_wraparound_min_axis=16)

_7X_P_STATE_CLOCKS_HZ = (1.6e9, 1.7e9, 1.8e9, 1.9e9, 2.0e9, 2.05e9, 2.1e9, 2.2e9)  # [xla-pinfo]

V7X = dataclasses.replace(
    V5E, name="7x", clock_hz=_7X_P_STATE_CLOCKS_HZ[7], p_state_clocks_hz=_7X_P_STATE_CLOCKS_HZ, p_state=7, num_tensorcores_per_device=1, vmem_bytes=64 * MiB,
    default_scoped_vmem_bytes=32 * MiB, hbm_bytes_per_device=103_000_000_000,
    hbm_bytes_per_s_per_device=3.7e12, dma_bytes_per_s_per_tc=3.207e12, vmem_vmem_dma_bytes_per_s=14.8e12,
    dma_hbm_to_vmem_latency_ns=692, dma_vmem_to_hbm_latency_ns=594, mxu_size=256, num_mxus=2,
    vmatmul_cadence_cycles=_mp(f32=4, bf16=8, fp8=8), latch_cadence_cycles=_mp(f32=2, bf16=4, fp8=4),
    mxu_latency_cycles=_mp(f32=211, bf16=211, fp8=204),
    supported_mxu_classes=frozenset({"f32", "bf16", "fp8"}),
    unsupported_dtypes=frozenset({"float8_e4m3b11fnuz"}), mxu_result_fifo_vregs=(),
    sparsecore=SparseCoreSpec(2, 16, 16, 512 * KiB, 8 * MiB, 32),
    ici_link_bytes_per_s_one_way=9e10, ici_dims=3, ici_wraparound_min_axis=4)

# Limits a launch is checked against (no timing effect), set apart from the presets above.
_LIMIT_SOURCES = _mp(
    max_pod_devices="tpu-hardware.md 1.1 'Pod / largest ICI domain': v4 4096 [gcp-v4][SB-tpus], v5e 256 "
                    "[gcp-v5e], v5p 8960 [SB-tpus], v6e 256 [gcp-v6e], 7x 9216 chips [gcp-7x] = 18432 "
                    "logical devices (one TensorCore each)",
    semaphores_per_core="v5e: 512, measured on a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05."
                        "jsonl, probe dma_semaphores_1024: 'Allocation (size=4096) would exceed memory "
                        "(size=2048) ... space=sflag': 2048 B of semaphore memory, 4 B per semaphore; 513: "
                        "'Allocation (size=2052)'; 16 and 256 compile). Other chips: modelling assumption, "
                        "no public or measured figure; 4096 is above any known kernel's needs and rejects "
                        "runaway allocations",
    semaphores_reserved="19 on every chip, measured on a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05-"
                        "followup.jsonl): beside the kernel's semaphores the compiler uses 76 B = 19 "
                        "semaphore words of the 2048 B sflag space: 500 DMA semaphores fail with 'Used 2.0K "
                        "of 2.0K sflag. Exceeded sflag capacity by 28B' (2000 + 76 = 2048 + 28), 508 / 511 "
                        "/ 512 by 60 / 72 / 76 B; 256 compile. Each pipelined block buffer takes one more "
                        "DMA semaphore (palace allocates those itself): REGULAR 508 / 512 with whole-array "
                        "in + out blocks (2) fail by 68 / 84 B, DMA 508 / 512 over a grid (2,) with "
                        "double-buffered in + out blocks (4) by 76 / 92 B, all 19 + those. A compiler "
                        "figure, not a chip one: assumed equal elsewhere",
    smem_reserved_bytes="2048 B on every chip, from a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05"
                        "*.jsonl): the compiler's own SMEM use depends on the kernel, implied by its "
                        "messages at 144-1950 B: a 1 MiB SMEM scratch fails with 'Exceeded smem capacity "
                        "by 144B', 1 MiB - 1024 B of scratch by 896 B (1920 B of its own), 1 MiB - 512 B "
                        "by '1.4K' (about 1950 B), a scalar prefetch of 1 MiB - 1024 B by 144 B (1168 B), "
                        "1 MiB - 576 B by 656 B (1232 B); 800 KiB of prefetch and 512 KiB of scratch "
                        "compile. 2048 B is above every use seen. A compiler reservation, not a chip "
                        "figure: assumed equal elsewhere",
)
V4, V5E, V5P, V6E, V7X = (
    dataclasses.replace(c, max_pod_devices=n, semaphores_per_core=sems, semaphores_reserved=19,
                        smem_reserved_bytes=2048, sources=MappingProxyType({**c.sources, **_LIMIT_SOURCES}))
    for c, n, sems in ((V4, 4096, 4096), (V5E, 256, 512), (V5P, 8960, 4096), (V6E, 256, 4096),
                       (V7X, 18432, 4096)))

# Measured on a real TPU v5e (JAX 0.10.2, libtpu 0.0.42.1, 2026-12-05; benchmarks/hw, recorded in
# benchmarks/hw/data/v5e-timing-2026-12-05*.jsonl; docs/timing-model.md 1.2 and docs/validation.md
# "Measured on a TPU v5e"). The other generations keep the datasheet and [xla-pinfo] figures: nothing
# measured says how far their HBM and DMAs fall short of them.
_HW = "measured on a TPU v5e (benchmarks/hw, 2026-12-05): "
_MEASURED_SOURCES = _mp(
    hbm_read_fraction=_HW + "read-only streams (colsum: 64 MiB in 89.7 us, 748 GB/s of 819)",
    hbm_write_fraction=_HW + "write-only streams (fill: 64 MiB in 103.0 us, 651 GB/s of 819)",
    hbm_write_with_reads_fraction=_HW + "copies and adds: reads at 748 GB/s leave writes 582.6 GB/s of "
                                  "819 (copy 32 MiB in 102.5 us, add 147.8 us)",
    hbm_copy_fraction=_HW + "HBM->HBM DMAs of 4-128 MiB: 3.256 us per MB copied (307 GB/s of 819), "
                      "whatever the number of DMAs in flight (1-16)",
    dma_hbm_hbm_latency_ns=_HW + "a 4 KiB HBM->HBM DMA launch takes 0.309 us: issue, transfer, this "
                           "latency and one DMA-wait sync (dma_wait_sync_cycles)",
    dma_hbm_to_vmem_latency_ns=_HW + "a loop of (start; wait) 4 KiB reads takes 0.340 us a copy: issue, "
                               "transfer, this latency and one DMA-wait sync",
    dma_vmem_to_hbm_latency_ns=_HW + "a loop of (start; wait) 4 KiB writes takes 0.235 us a copy: issue, "
                               "transfer, this latency and one DMA-wait sync",
)
V5E = dataclasses.replace(
    V5E, hbm_read_fraction=748 / 819, hbm_write_fraction=651 / 819,
    hbm_write_with_reads_fraction=582.6 / 819, hbm_copy_fraction=307 / 819, dma_hbm_hbm_latency_ns=109,
    sources=MappingProxyType({**V5E.sources, **_MEASURED_SOURCES}))
_ABSENT = "not measured on this chip: the datasheet hbm_bytes_per_s_per_device (None; copies: half)"
V4, V5P, V6E, V7X = (dataclasses.replace(c, sources=MappingProxyType({
    **c.sources, **{k: _ABSENT for k in _MEASURED_SOURCES if k.startswith("hbm_")},
    "dma_hbm_hbm_latency_ns": "not measured on this chip: the larger of the two DMA latencies (None)"}))
    for c in (V4, V5P, V6E, V7X))

_HOST_LINK_SOURCES = _mp(
    host_link_bytes_per_s_one_way="tpu-hardware.md 1.1 'PCIe host<->chip' [SB-tpus]: v4 16 GB/s each way, "
                                  "v5e and v5p ~1.6e10 B/s, v6e 3.2e10 B/s (PCIe Gen5, [gcp-v6e]); 7x: "
                                  "no public figure, modelling assumption: v6e's",
    host_link_latency_ns="modelling assumption (no public or measured figure): 1 us, a PCIe round trip's "
                         "order of magnitude, the same on every chip",
)
V6E, V7X = (dataclasses.replace(c, host_link_bytes_per_s_one_way=3.2e10) for c in (V6E, V7X))
V4, V5E, V5P, V6E, V7X = (dataclasses.replace(c, sources=MappingProxyType({**c.sources, **_HOST_LINK_SOURCES}))
                          for c in (V4, V5E, V5P, V6E, V7X))

# The compiler's minimum internal scratch, measured on a real TPU v5e (benchmarks/hw/scratch_limit.py).
_SCRATCH_MEASURED = ("measured on a TPU v5e (benchmarks/hw/data/v5e-scratch-limit-2026-12-06.jsonl, JAX "
                     "0.10.2, libtpu 0.0.42.1, 2026-12-06): a (128, 128) float32 copy kernel with "
                     "internal_scratch_in_bytes = 0, 512, 4096, 8192, 16384 and 32768 is refused with 'Mosaic "
                     "failed to compile TPU kernel: Requested internal scratch size <n> needs to be at least "
                     "36864 bytes.', and runs correctly with 65536, 73728, 73729, 73984, 81920, 131072 and "
                     "1 MiB; the minimum, in (32768, 36864] by the sizes run, is the 36864 the compiler "
                     "states")
_SCRATCH_ABSENT = ("not measured on this chip (None): palace checks no minimum here, since the v5e figure "
                   "is the compiler's for that chip and nothing says it holds on others")
V5E = dataclasses.replace(V5E, min_internal_scratch_bytes=36864, sources=MappingProxyType(
    {**V5E.sources, "min_internal_scratch_bytes": _SCRATCH_MEASURED}))
V4, V5P, V6E, V7X = (dataclasses.replace(c, sources=MappingProxyType(
    {**c.sources, "min_internal_scratch_bytes": _SCRATCH_ABSENT})) for c in (V4, V5P, V6E, V7X))

# The v5e's step, DMA-wait and unit rules, measured on the chip (sessions 23-32, adopted in session 33:
# docs/validation.md "Session 33" has the suite before and after; docs/timing-model.md 1.6 each
# rule's evidence; and HBM's write buffer, measured in session 33). All 810 points recorded before session
# 33: median |error| 6.9% -> 3.8%, within 15% 628 -> 746 (palace.jax's wait_sources.py included). Decided: the
# other generations keep the published-figure model (nothing measured on them), and where a published
# v5e figure and the chip disagree the chip wins (the 128-block calibration matmul: its wall-clock
# figure vs the chip's device time of the same kernel, `matmul_k`).
_S = ("measured on a TPU v5e (benchmarks/hw/data/v5e-timing-2026-12-0[5-7]*.jsonl, JAX 0.10.2, libtpu "
      "0.0.42.1): ")
_ADOPTED_SOURCES = _mp(
    dma_wait_latency_cycles=_S + "a DMA wait ends 280 cycles after its copy lands, whatever the core "
                            "did meanwhile (sync_size, sync_sweep, pipe_fence, dma_sync; "
                            "docs/validation.md 'Session 23')",
    dma_issue_cycles=_S + "16 scalar cycles a descriptor (step_ops, session 24: a copying step's cost "
                     "per moving operand)",
    dma_copy_overhead_bytes=_S + "each copy holds its channel ~4 KiB longer (page_order, sync_size; "
                            "session 28)",
    dma_run_overhead_bytes=_S + "and 128 B a contiguous run of its HBM side (session 31's region "
                           "traces: a (128, 128) bf16 block's 128 rows land ~50 cycles later than one "
                           "run; 128 fitted with the next-step write-back wait, session 32)",
    mxu_handoff_cycles_per_vreg=_S + "an XLU op reading an MXU result sees it 2.375 cycles a result "
                                "vreg later, up to 16 (wheel_step, stream_pair; sessions 23-24)",
    mxu_chain_waits=_S + "a dot fed from the MXU's last result waits for it (mxu_chain, session 25: "
                    "-15..-20% without)",
    xlu_class_turnaround=_S + "an XLU op of another class waits for the previous one's result "
                         "(pv_more, session 24)",
    wait_write_backs_next_step=_S + "output write-backs are waited at the end of the following step "
                               "(out_switch K = 2 / 8: ~375 cycles there; region traces, session 31)",
    grid_step_overhead_cycles=_S + "a fixed-block rank-1 step with one input and one output and no "
                              "condition in its body costs 25.2 cycles, its body's one-vreg store or add "
                              "included (step_body, session 34: body_w0_*_nofirst; session 32's 33 "
                              "counted step_book's two conditions): 24",
    branch_cycles=_S + "a pl.when that never holds costs 7.0 cycles a step, its grid-index test "
                  "included (step_body, session 34: 1 / 2 / 3 of them 37.1 / 44.1 / 51.1 cycles a "
                  "step); palace charges the test's ops 2: 4 more, fitted with the grid step's 24",
    index_map_cycles=_S + "14-21 cycles a map the compiler evaluates, even one giving constant blocks "
                     "(step_book's min(i, 0) maps; step_branch 10, session 27): 16",
    index_map_plain_cycles=_S + "a plain map whose block moves: ~14 with its copy (step_book); the "
                           "causal flash's skipped step (~170 cycles, region traces) wants its moving "
                           "q / o maps at 12",
    index_map_smem_cycles=_S + "a map reading a scalar-prefetch table: 23 (step_branch, session 27)",
    index_map_subword_cycles=_S + "40 more when the tables are int8 (step_branch: two int8-table maps "
                             "+75 a step, int32 +46; splash's tables)",
    grid_step_dim_cycles=_S + "rank 1-4 fixed-block steps 37.1 / 42.1 / 48.1 / 54.1 cycles "
                         "(step_book): 6 a dimension, 2 of them palace's own grid-index conditions",
    grid_step_operand_cycles=_S + "3.0-4.1 cycles a step per operand beyond one input and one output, "
                             "beside a vector body too (step_book): 3.5",
    dma_sequential_no_overhead=_S + "a copy continuing its array's stream pays no per-copy 4 KiB: a "
                               "burst's 4 KiB copies of consecutive rows cost the chip ~10 cycles each "
                               "beyond the first, random pages ~17 (dma_issue, session 33; issue_form, "
                               "session 34: iss_4KiB_k16_x128_paged against probe_burst_4KiB_k16_x128, "
                               "+116 cycles a round of 16); adopted in session 35",
    stores_in_order=_S + "a VPU or EUP stream accumulating into VMEM beside an MXU dot or a lane max "
                    "costs the chip nearly their sum (eup_stream, session 35: dot + c += b * 1e-3 966 "
                    "cycles a step, the dot alone 719; unit_overlap, session 23), a stream that stores "
                    "nothing hides; an MXU result's or an (N, 1) column's store is not held (a dot beside "
                    "a lane max, chain_dot: the chip overlaps them); adopted in session 35",
    stores_stream_behind_values=_S + "a grid step's tanh on 16 / 64 vregs costs the chip 7 cycles more "
                                "than its add (step_raw, session 36: 59.3 / 109.1 against 52.3 / 102.0 "
                                "cycles a step; the region traces' body segments, first load to last "
                                "store, 37 / 84 against 30 / 78), one-vreg steps not (step_chain: their "
                                "bookkeeping overlaps a lone store's wait); adopted in session 37",
    dma_issue_bare_cycles=_S + "a loop body of DMA starts and waits only: 16 starts of 4 KiB in ~38 cycles "
                          "(start_form's region traces, session 35); dma_beside (session 38): double-"
                          "buffered rounds of 16 4 KiB reads 353 cycles alone (the copies' round trip "
                          "with ~2-cycle starts), beside ~256 vregs of work of any kind (loads, stores, "
                          "VPU in registers, EUP, MXU) the work plus ~18 cycles a copy (ldst 563, eup "
                          "570, reg 495, ld 447: the 16 a start charged in series); adopted in session 38",
    dma_big_write_waits_queued_read=_S + "rounds of a 512 KiB write, a 128 KiB read and another 512 KiB "
                                    "write started 0-900 ns later, the read waited then 500 ns of delay "
                                    "(write_queue, session 38): 2970-3219 cycles a round, the read landing "
                                    "after the first write only (the write-first order: 4213); with 128 KiB "
                                    "writes the second write goes first (2356 a round); the skinny K = 128 "
                                    "matmuls' 128 KiB weight reads are not held behind the next 256 KiB-1 "
                                    "MiB output write (+22..+40% -> +7..+19%); adopted in session 38",
    hbm_write_buffer_bytes=_S + "bursts of k DMA writes of 4 KiB-4 MiB (write_burst, session 33): a "
                           "sustained stream 643-667 GB/s, a burst's first ~1.05 MB ~750 GB/s, a serial "
                           "loop of 1 MiB writes 2426 cycles a write (region traces): a ~144 KB buffer "
                           "filled at the read rate and drained at the write rate fits all eleven within "
                           "4% from 256 KiB up",
)
V5E = dataclasses.replace(
    V5E, dma_wait_latency_cycles=280, dma_issue_cycles=16, dma_copy_overhead_bytes=4096,
    dma_run_overhead_bytes=128, mxu_handoff_cycles_per_vreg=2.375, mxu_chain_waits=True,
    xlu_class_turnaround=True, wait_write_backs_next_step=True, grid_step_overhead_cycles=24,
    branch_cycles=4,
    index_map_cycles=16, index_map_plain_cycles=12, index_map_smem_cycles=23, index_map_subword_cycles=40,
    grid_step_dim_cycles=4, grid_step_operand_cycles=3.5, hbm_write_buffer_bytes=144_000,
    dma_issue_bare_cycles=2, dma_big_write_waits_queued_read=True, dma_sequential_no_overhead=True,
    stores_in_order=True, stores_stream_behind_values=True,
    sources=MappingProxyType({**V5E.sources, **_ADOPTED_SOURCES, "dma_wait_sync_cycles": (
        "not paid on v5e: its DMA waits take the latency form (dma_wait_latency_cycles)")}))

CHIPS = MappingProxyType({c.name: c for c in (V4, V5E, V5P, V6E, V7X)})
# Every measured step / DMA-wait / unit rule and HBM's write buffer at its off value (adopted on v5e
# above, or candidates off everywhere): `dataclasses.replace(chip, **RULES_OFF)` is the chip as the
# published-figure model has it (tests' round-number chips, and the v5e before session 33 with
# grid_step_overhead_cycles=37 and dma_issue_cycles=8).
RULES_OFF = MappingProxyType(dict(
    dma_wait_latency_cycles=None, dma_wait_landed_cycles=0, dma_copy_overhead_bytes=0,
    dma_run_overhead_bytes=0, mxu_handoff_cycles_per_vreg=0.0, mxu_chain_waits=False,
    xlu_class_turnaround=False, wait_kept_write_backs=False, wait_write_backs_next_step=False,
    index_map_cycles=0, index_map_plain_cycles=0, index_map_smem_cycles=0, index_map_subword_cycles=0,
    grid_step_dim_cycles=0, grid_step_operand_cycles=0.0, index_map_after_starts=False,
    hbm_write_buffer_bytes=0, dma_sequential_no_overhead=False, branch_cycles=0, dma_queue_depth=0,
    dma_issue_switch_cycles=0, stores_in_order=False, stores_stream_behind_values=False,
    dma_issue_bare_cycles=None, dma_big_write_waits_queued_read=False))


@dataclasses.dataclass(frozen=True)
class CompilerSpec:
  """The TPU compiler whose rules palace applies (what Mosaic compiles, rejects, how the MXU rounds):
  one for every chip preset, since they are the compiler's rules, not the silicon's."""
  libtpu_version: str   # the libtpu release measured, e.g. "0.0.42.1"
  jax_version: str      # the JAX release that drove it
  source: str


COMPILER = CompilerSpec(
    libtpu_version="0.0.42.1", jax_version="0.10.2",
    source="the TPU v5e palace's compiler rules were measured on, 2026-12-05: the environment records "
           "(libtpu_version, jax_version) of benchmarks/hw/data/v5e-limits-2026-12-05.jsonl, "
           "v5e-numerics-2026-12-05.jsonl and v5e-timing-2026-12-05.jsonl; the rules: docs/limits.md, "
           "lang/mxu.py, lang/int_rejects.py")


def libtpu_at_least(version: str) -> bool:
  """Is the modelled compiler's libtpu `version` or newer (versions compared number by number)?"""
  def parse(v: str) -> tuple:
    return tuple(int(part) for part in v.split("."))
  return parse(COMPILER.libtpu_version) >= parse(version)


def check_dtype(chip: ChipSpec, dtype, what: str) -> None:
  """A palace dtype that `chip` lacks (`ChipSpec.unsupported_dtypes`: float8_e4m3b11fnuz on v4 and
  7x): ShapeError naming `what`, the chip and the chips that have it."""
  if not chip.unsupported_dtypes:   # (most chips; asked per operand of every launch: dtype.name is
    return                          # Python code in NumPy)
  try:
    d = np.dtype(dtype)
  except TypeError:   # an extended JAX dtype (a PRNG key's): not one of palace's dtypes
    return
  if d.name not in chip.unsupported_dtypes:
    return
  others = [c.name for c in CHIPS.values() if d.name not in c.unsupported_dtypes]
  raise ShapeError(f"{what} has dtype {d}, which TPU {chip.name} kernels do not support (its compiler "
                   f"has no {d}; {', '.join(others)} have it: ChipSpec.unsupported_dtypes); expected "
                   f"another TPU dtype. Fix: use another dtype (e.g. cast to jnp.float32), or run on "
                   f"{' / '.join(others)}.")


def check_internal_scratch(chip: ChipSpec, requested, kernel: str, site=None) -> None:
  """A launch of `kernel` (defined or called at `site`, (file, line), when known) on `chip` whose
  `CompilerParams(internal_scratch_in_bytes=requested)` is below the chip's measured minimum
  (`ChipSpec.min_internal_scratch_bytes`): UsageError quoting the TPU compiler's refusal. Nothing is
  checked where the request is unset (None) or the minimum unknown."""
  least = chip.min_internal_scratch_bytes
  if requested is None or least is None or requested >= least:
    return
  raise UsageError(
      (f"{fmt_site(site)}: " if site else "")
      + f"pltpu.CompilerParams(internal_scratch_in_bytes={requested}) for kernel '{kernel}' on TPU "
      f"{chip.name}: {requested} B of Mosaic internal scratch requested; expected at least {least} B, "
      f"the least the TPU compiler accepts on {chip.name} (it refuses the kernel: 'Requested internal "
      f"scratch size {requested} needs to be at least {least} bytes.', measured on a TPU {chip.name}: "
      f"ChipSpec.min_internal_scratch_bytes). Fix: request internal_scratch_in_bytes >= {least}, or leave "
      f"it unset (None) for the compiler's default ({chip.internal_scratch_bytes} B).")


_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "trillium": "v6e", "v7x": "7x",
            "tpu7x": "7x", "ironwood": "7x", "v7": "7x"}
DEFAULT_CHIP = "v5e"


def with_p_state(chip: ChipSpec, p_state) -> ChipSpec:
  """`chip` clocked at P-state `p_state` (an index into `chip.p_state_clocks_hz`). Everything counted
  in cycles (cadences, step overhead) keeps its cycle count; times in ns (DMA latencies) and bytes/s
  stay in real time."""
  if not chip.p_state_clocks_hz:
    raise UsageError(f"p_state={p_state!r}: chip {chip.name} has a single clock "
                     f"({chip.clock_hz / 1e9:g} GHz) and no P-states. Fix: drop p_state= (P-states exist "
                     f"on: {', '.join(c.name for c in CHIPS.values() if c.p_state_clocks_hz)}).")
  n = len(chip.p_state_clocks_hz)
  p = as_int(p_state, "p_state")
  if not 0 <= p < n:
    clocks = ", ".join(f"{i}: {f / 1e9:g} GHz" for i, f in enumerate(chip.p_state_clocks_hz))
    raise UsageError(f"p_state={p} is not a P-state of chip {chip.name}; expected an integer 0-{n - 1} "
                     f"({clocks}). Fix: pass p_state=0..{n - 1}, or drop it for the default.")
  return dataclasses.replace(chip, clock_hz=chip.p_state_clocks_hz[p], p_state=p)


def get_chip(name: "str | ChipSpec") -> ChipSpec:
  """A preset by name (or alias), or a ChipSpec passed through (e.g. a dataclasses.replace variant)."""
  if isinstance(name, ChipSpec):
    return name
  key = str(name).lower().replace("tpu", "").replace(" ", "").strip("_-")
  key = _ALIASES.get(key, key)
  if key not in CHIPS:
    raise UsageError(f"Unknown TPU chip {name!r}; expected one of {', '.join(CHIPS)}. Fix: pass one of "
                     f"those names (aliases such as 'v5litepod', 'trillium', 'ironwood' work too).")
  return CHIPS[key]
