"""Per-launch report: modelled time, rates, bound, VMEM peak, DMA traffic, trace export, plots (L4b)."""
from __future__ import annotations

import dataclasses

from palace._src.errors import UsageError
from palace._src.sim.trace import UNIT_ORDER, EventLog, to_chrome_trace, write_json
from palace._src.util import fmt_bytes

_PLOT_COLORS = {"scalar": "#7f7f7f", "dma": "#1f77b4", "mxu": "#d62728", "vpu": "#2ca02c",
                "eup": "#9467bd", "xlu": "#8c564b", "vld": "#17becf", "vst": "#bcbd22", "ici": "#ff7f0e"}


@dataclasses.dataclass
class Report:
  """What one kernel launch cost on the virtual TPU. Times are modelled, not measured.

  `device_time_s` is the kernel on the chip (first issue to last completion); `launch_overhead_s` is the
  host dispatch of one call, a per-chip constant reported separately. Their sum is comparable to a
  `timeit` wall time of a jitted call.
  """
  kernel_name: str
  chip: object                 # hw.ChipSpec
  num_chips: int
  device_cycles: int
  flops: int
  hbm_bytes: int
  unit_busy_cycles: dict
  vmem_peak_bytes: int
  grid_steps: int
  dma_count: int
  trace_log: list = dataclasses.field(repr=False, default_factory=list)   # (read it as `events`)
  ici_bytes: int = 0
  timing_only: bool = False
  exact_f32_dots: bool = False   # made under the exact-f32-dots diagnostic (not the chip's numerics)
  shared_dots: bool = False      # made under the shared-dots diagnostic (not the chip's numerics)
  host_math: bool = False        # made under the host-math diagnostic (not the chip's numerics)
  stats: dict | None = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if self.stats is None:
      self.stats = getattr(self.trace_log, "stats", None) or {"dma_bytes": {}, "dma_count": {}}

  def replica(self) -> "Report":
    """A copy for another launch with the same figures (sim/replay.py): its own unit_busy_cycles dict,
    the same (read-only) timeline; dropping one's trace (`drop_trace`) leaves the other's."""
    new = object.__new__(Report)
    new.__dict__.update(self.__dict__)
    new.unit_busy_cycles = dict(self.unit_busy_cycles)
    return new

  @property
  def events(self) -> list:
    """The launch's timeline: (tid, unit, name, start_cycle, end_cycle, args) per event; a DMA's args
    name the copy ("copy": 'src -> dst'), formatted at the first read (sim/trace.py)."""
    log = self.trace_log
    if getattr(log, "unnamed", None):
      log.name_copies()
    return log

  @events.setter
  def events(self, value) -> None:
    self.trace_log = value

  # ---- times
  @property
  def device_time_s(self) -> float:
    return self.device_cycles / self.chip.clock_hz

  @property
  def launch_overhead_s(self) -> float:
    return self.chip.launch_overhead_s

  @property
  def total_time_s(self) -> float:
    return self.device_time_s + self.launch_overhead_s

  # ---- rates
  @property
  def flops_per_s(self) -> float:
    return self.flops / self.device_time_s if self.device_cycles else 0.0

  @property
  def peak_flops_per_s(self) -> float:
    return self.chip.peak_flops_per_s("bf16") * self.num_chips

  @property
  def peak_fraction(self) -> float:
    return self.flops_per_s / self.peak_flops_per_s if self.peak_flops_per_s else 0.0

  @property
  def hbm_bytes_per_s(self) -> float:
    return self.hbm_bytes / self.device_time_s if self.device_cycles else 0.0

  @property
  def hbm_fraction(self) -> float:
    return self.hbm_bytes_per_s / (self.chip.hbm_bytes_per_s_per_device * self.num_chips)

  @property
  def arithmetic_intensity(self) -> float:
    """FLOPs per HBM byte."""
    return self.flops / self.hbm_bytes if self.hbm_bytes else float("inf")

  @property
  def roofline_time_s(self) -> float:
    """max(FLOPs / bf16 peak, HBM bytes / HBM bandwidth): the time with no overheads at all."""
    return max(self.flops / self.peak_flops_per_s if self.peak_flops_per_s else 0.0,
               self.hbm_bytes / (self.chip.hbm_bytes_per_s_per_device * self.num_chips))

  # ---- traffic and units
  @property
  def dma_bytes_by_direction(self) -> dict:
    """Bytes moved per DMA direction ('hbm->vmem', 'vmem->hbm', 'hbm->hbm', 'vmem->smem', ...)."""
    return dict(sorted(self.stats["dma_bytes"].items()))

  @property
  def dma_count_by_direction(self) -> dict:
    return dict(sorted(self.stats["dma_count"].items()))

  @property
  def unit_utilization(self) -> dict:
    """Busy cycles / device cycles per unit (the busiest core's figure)."""
    t = max(self.device_cycles, 1)
    return {u: v / t for u, v in self.unit_busy_cycles.items()}

  @property
  def bound(self) -> str:
    """'compute' (MXU), 'memory' (HBM), 'vector' (VPU/EUP/XLU) or 'overhead' (step, issue, latency)."""
    t = max(self.device_cycles, 1)
    mxu = self.unit_busy_cycles.get("mxu", 0)
    hbm = self.hbm_bytes / self.chip.hbm_bytes_per_s_per_device * self.chip.clock_hz / self.num_chips
    vec = max(self.unit_busy_cycles.get(u, 0) for u in ("vpu", "eup", "xlu", "vld", "vst"))
    best, name = max((mxu, "compute"), (hbm, "memory"), (vec, "vector"))
    return name if best >= 0.5 * t else "overhead"

  def as_dict(self) -> dict:
    """The report's figures as plain data (for comparisons, JSON and tables)."""
    return {"kernel": self.kernel_name, "chip": self.chip.name, "num_chips": self.num_chips,
            "device_cycles": self.device_cycles, "device_time_s": self.device_time_s,
            "launch_overhead_s": self.launch_overhead_s, "flops": self.flops,
            "hbm_bytes": self.hbm_bytes, "ici_bytes": self.ici_bytes, "bound": self.bound,
            "vmem_peak_bytes": self.vmem_peak_bytes, "grid_steps": self.grid_steps,
            "dma_count": self.dma_count, "unit_busy_cycles": dict(self.unit_busy_cycles),
            "dma_bytes_by_direction": self.dma_bytes_by_direction,
            "dma_count_by_direction": self.dma_count_by_direction, "timing_only": self.timing_only,
            "exact_f32_dots": self.exact_f32_dots, "shared_dots": self.shared_dots,
            "host_math": self.host_math}

  # ---- exports
  def drop_trace(self, budget: int) -> None:
    """Free this report's timeline (its figures stay): the VirtualTPU's `keep_trace_events` budget."""
    dropped = EventLog()
    dropped.stats = self.stats
    dropped.dropped = (len(self.trace_log), budget)
    self.trace_log = dropped

  def _timeline(self) -> list:
    dropped = getattr(self.trace_log, "dropped", None)
    if dropped is not None:
      raise UsageError(
          f"The trace of kernel '{self.kernel_name}' ({dropped[0]:,} events) was dropped to bound memory: "
          f"a virtual TPU's reports keep {dropped[1]:,} trace events in all, the newest launches' "
          f"(pl.virtual_tpu(keep_trace_events=...)). Fix: export it before later launches push it out, "
          f"or pass keep_trace_events=None (keep every trace) or a larger budget.")
    return self.events

  def to_perfetto(self, path) -> str:
    """Write a Chrome/Perfetto trace (open in ui.perfetto.dev). Returns the path."""
    meta = {"device_cycles": self.device_cycles, "device_time_s": self.device_time_s,
            "launch_overhead_s": self.launch_overhead_s, "bound": self.bound}
    write_json(to_chrome_trace(self._timeline(), self.chip.clock_hz, self.kernel_name,
                               chip_name=self.chip.name, metadata=meta), path)
    return str(path)

  def plot_timeline(self, path, width_px: int = 1600, height_px: int | None = None, dpi: int = 100):
    """Save a PNG of the timeline: one lane per (chip, core, unit) with the modelled busy intervals.
    The image is exactly width_px x height_px (default height: 60 px per lane + 120). Returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, without touching pyplot state
    from matplotlib.figure import Figure
    lanes = {}
    for (chip, core), unit, _, start, end, _ in self._timeline():
      lanes.setdefault((chip, core, unit), []).append((start, max(end - start, 1e-9)))
    order = sorted(lanes, key=lambda k: (k[0], k[1], UNIT_ORDER.index(k[2]) if k[2] in UNIT_ORDER
                                         else len(UNIT_ORDER)))
    if height_px is None:
      height_px = 120 + 60 * max(len(order), 1)
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    us = 1e6 / self.chip.clock_hz
    for row, key in enumerate(order):
      spans = [(s * us, d * us) for s, d in lanes[key]]
      ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=_PLOT_COLORS.get(key[2], "#333333"))
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"chip {c} core {k} {u}" for c, k, u in order])
    ax.set_ylim(-0.6, max(len(order), 1) - 0.4)
    ax.set_xlim(0, max(self.device_time_s * 1e6, 1e-6))
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(f"{self.kernel_name} on {self.chip.name}: {self.device_time_s * 1e6:,.3f} us, "
                 f"{self.bound}-bound")
    fig.subplots_adjust(left=0.16, right=0.98, bottom=0.5 * 120 / height_px + 0.05,
                        top=1 - 0.4 * 120 / height_px)
    fig.savefig(path, dpi=dpi)
    return str(path)

  def __str__(self) -> str:
    us = self.device_time_s * 1e6
    lines = [
        f"kernel '{self.kernel_name}' on {self.chip.name}" + (f" x{self.num_chips}" if self.num_chips > 1
                                                               else "")
        + (" (timing only)" if self.timing_only else "")
        + (" (DIAGNOSTIC exact_f32_dots: not the chip's numerics)" if self.exact_f32_dots else "")
        + (" (DIAGNOSTIC shared_dots: not the chip's numerics)" if self.shared_dots else "")
        + (" (DIAGNOSTIC host_math: not the chip's numerics)" if self.host_math else ""),
        f"  device time     {us:,.3f} us  ({self.device_cycles:,} cycles at "
        f"{self.chip.clock_hz / 1e9:.2f} GHz); launch overhead {self.launch_overhead_s * 1e6:.1f} us",
        f"  compute         {self.flops / 1e9:,.3f} GFLOP, {self.flops_per_s / 1e12:,.2f} TFLOP/s "
        f"({100 * self.peak_fraction:.1f}% of bf16 peak)",
        f"  HBM traffic     {fmt_bytes(self.hbm_bytes)}, {self.hbm_bytes_per_s / 1e9:,.1f} GB/s "
        f"({100 * self.hbm_fraction:.1f}% of HBM bandwidth)",
        f"  bound           {self.bound} (roofline {self.roofline_time_s * 1e6:,.3f} us)",
        f"  VMEM peak       {fmt_bytes(self.vmem_peak_bytes)}; grid steps {self.grid_steps:,}; "
        f"DMAs {self.dma_count:,}",
    ]
    busy = ", ".join(f"{u} {100 * f:.0f}%" for u, f in self.unit_utilization.items() if f >= 0.005)
    if busy:
      lines.append(f"  unit busy       {busy}")
    if self.stats["dma_bytes"]:
      lines.append("  DMA traffic     " + ", ".join(
          f"{k} {fmt_bytes(v)} ({self.stats['dma_count'][k]:,})"
          for k, v in self.dma_bytes_by_direction.items()))
    if self.ici_bytes:
      lines.append(f"  ICI traffic     {fmt_bytes(self.ici_bytes)}")
    if self.exact_f32_dots:
      lines.append("  numerics        DIAGNOSTIC: float32 dots at the default precision were computed "
                   "exactly; the chip rounds their operands to bfloat16 (VirtualTPU(exact_f32_dots=True), "
                   "PALACE_JAX_EXACT_F32_DOTS)")
    if self.shared_dots:
      lines.append("  numerics        DIAGNOSTIC: float dots were summed by one fixed rule (exact per 128 "
                   "of K, chunks added in float32), not in the chip's order (VirtualTPU(shared_dots=True), "
                   "PALACE_JAX_SHARED_DOTS)")
    if self.host_math:
      lines.append("  numerics        DIAGNOSTIC: the kernel's transcendentals (exp, log, tanh, erf_inv, "
                   "...) were XLA:CPU's, not the chip's (VirtualTPU(host_math=True), PALACE_JAX_HOST_MATH)")
    return "\n".join(lines)
