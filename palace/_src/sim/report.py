"""Per-launch report: modelled time, rates, bound, VMEM peak, trace export (L4b)."""
from __future__ import annotations

import dataclasses

from palace._src.sim.trace import to_chrome_trace, write_json
from palace._src.util import fmt_bytes


@dataclasses.dataclass
class Report:
  """What one kernel launch cost on the virtual TPU. Times are modelled, not measured."""
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
  events: list = dataclasses.field(repr=False, default_factory=list)
  ici_bytes: int = 0
  timing_only: bool = False

  @property
  def device_time_s(self) -> float:
    return self.device_cycles / self.chip.clock_hz

  @property
  def launch_overhead_s(self) -> float:
    return self.chip.launch_overhead_s

  @property
  def total_time_s(self) -> float:
    return self.device_time_s + self.launch_overhead_s

  @property
  def flops_per_s(self) -> float:
    return self.flops / self.device_time_s if self.device_cycles else 0.0

  @property
  def peak_fraction(self) -> float:
    peak = self.chip.peak_flops_per_s("bf16") * self.num_chips
    return self.flops_per_s / peak if peak else 0.0

  @property
  def hbm_bytes_per_s(self) -> float:
    return self.hbm_bytes / self.device_time_s if self.device_cycles else 0.0

  @property
  def hbm_fraction(self) -> float:
    return self.hbm_bytes_per_s / (self.chip.hbm_bytes_per_s_per_device * self.num_chips)

  @property
  def bound(self) -> str:
    """'compute' (MXU), 'memory' (HBM), 'vector' (VPU/EUP/XLU) or 'overhead' (step, issue, latency)."""
    t = max(self.device_cycles, 1)
    mxu = self.unit_busy_cycles.get("mxu", 0)
    hbm = self.hbm_bytes / self.chip.hbm_bytes_per_s_per_device * self.chip.clock_hz / self.num_chips
    vec = max(self.unit_busy_cycles.get(u, 0) for u in ("vpu", "eup", "xlu", "vld", "vst"))
    best, name = max((mxu, "compute"), (hbm, "memory"), (vec, "vector"))
    return name if best >= 0.5 * t else "overhead"

  def to_perfetto(self, path) -> str:
    """Write a Chrome/Perfetto trace (open in ui.perfetto.dev). Returns the path."""
    write_json(to_chrome_trace(self.events, self.chip.clock_hz, self.kernel_name), path)
    return str(path)

  def __str__(self) -> str:
    us = self.device_time_s * 1e6
    lines = [
        f"kernel '{self.kernel_name}' on {self.chip.name}" + (f" x{self.num_chips}" if self.num_chips > 1
                                                               else "")
        + (" (timing only)" if self.timing_only else ""),
        f"  device time     {us:,.3f} us  ({self.device_cycles:,} cycles at "
        f"{self.chip.clock_hz / 1e9:.2f} GHz); launch overhead {self.launch_overhead_s * 1e6:.1f} us",
        f"  compute         {self.flops / 1e9:,.3f} GFLOP, {self.flops_per_s / 1e12:,.2f} TFLOP/s "
        f"({100 * self.peak_fraction:.1f}% of bf16 peak)",
        f"  HBM traffic     {fmt_bytes(self.hbm_bytes)}, {self.hbm_bytes_per_s / 1e9:,.1f} GB/s "
        f"({100 * self.hbm_fraction:.1f}% of HBM bandwidth)",
        f"  bound           {self.bound}",
        f"  VMEM peak       {fmt_bytes(self.vmem_peak_bytes)}; grid steps {self.grid_steps:,}; "
        f"DMAs {self.dma_count:,}",
    ]
    if self.ici_bytes:
      lines.append(f"  ICI traffic     {fmt_bytes(self.ici_bytes)}")
    return "\n".join(lines)
