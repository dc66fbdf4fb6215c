"""PNG plots of launch reports (L5, needs matplotlib from the `cli` extra): timeline and roofline.

`timeline_png` uses `Report.plot_timeline` when the report has it (the timing model's own plot) and the
local fallback otherwise; `roofline_png` uses `palace._src.sim.plots.plot_roofline` when it exists. Both
draw with matplotlib's object API on a `Figure` (no pyplot state, no display needed) at an exact pixel size.
"""
from __future__ import annotations

_UNITS = ("scalar", "dma", "mxu", "vpu", "eup", "xlu", "vld", "vst", "ici")
_COLORS = {"scalar": "#7f7f7f", "dma": "#1f77b4", "mxu": "#d62728", "vpu": "#2ca02c", "eup": "#9467bd",
           "xlu": "#8c564b", "vld": "#17becf", "vst": "#bcbd22", "ici": "#ff7f0e"}
TIMELINE_WIDTH_PX, TIMELINE_MAX_HEIGHT_PX, ROOFLINE_SIZE_PX = 1600, 2400, (1200, 800)


def _figure(width_px: int, height_px: int, dpi: int = 100):
  try:
    from matplotlib.figure import Figure
  except ImportError as e:  # pragma: no cover - depends on the environment
    from palace._src.errors import UsageError
    raise UsageError("Plots need matplotlib: pip install 'palace[cli]'.") from e
  return Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)


def plot_timeline(report, path, width_px: int = TIMELINE_WIDTH_PX, height_px: int | None = None) -> str:
  """Per-core timeline: one lane per (chip, core, unit) with the busy intervals of `report.events`.
  Size: width_px x (120 + 40 per lane) pixels unless height_px is given. Returns the path."""
  lanes = {}
  for (chip, core), unit, _, start, end, _ in report.events:
    lanes.setdefault((chip, core, unit), []).append((start, max(end - start, 0)))
  order = sorted(lanes, key=lambda k: (k[0], k[1], _UNITS.index(k[2]) if k[2] in _UNITS else len(_UNITS)))
  height_px = height_px or 120 + 40 * max(len(order), 1)
  fig = _figure(width_px, height_px)
  ax = fig.add_subplot(1, 1, 1)
  us = 1e6 / report.chip.clock_hz
  for row, key in enumerate(order):
    ax.broken_barh([(s * us, max(d * us, 1e-6)) for s, d in lanes[key]], (row - 0.4, 0.8),
                   facecolors=_COLORS.get(key[2], "#333333"))
  ax.set_yticks(range(len(order)))
  ax.set_yticklabels([f"chip {c} core {k} {u}" for c, k, u in order])
  ax.set_ylim(-0.6, max(len(order), 1) - 0.4)
  ax.invert_yaxis()
  ax.set_xlim(0, max(report.device_time_s * 1e6, 1e-6))
  ax.set_xlabel("modelled time (us)")
  ax.set_title(f"{report.kernel_name} on {report.chip.name}: {report.device_time_s * 1e6:,.1f} us, "
               f"{report.bound}-bound")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return str(path)


def plot_roofline(reports, path, labels=None, size_px=ROOFLINE_SIZE_PX) -> str:
  """Roofline (log-log FLOP/byte vs TFLOP/s) with one point per report and the roof of each chip.
  `labels` defaults to the kernel names; reports without FLOPs (pure data movement) are listed in a note
  instead of plotted. Size: size_px pixels. Returns the path."""
  reports = list(reports)
  labels = list(labels) if labels is not None else [r.kernel_name for r in reports]
  fig = _figure(*size_px)
  ax = fig.add_subplot(1, 1, 1)
  ax.set_xscale("log")
  ax.set_yscale("log")
  shown = [(r, lab) for r, lab in zip(reports, labels) if r.flops > 0 and r.device_cycles > 0]
  skipped = [lab for r, lab in zip(reports, labels) if not (r.flops > 0 and r.device_cycles > 0)]
  merged = {}  # points at the same place share one marker and one label
  for r, lab in shown:
    x = r.flops / r.hbm_bytes if r.hbm_bytes else 1e4
    key = (round(x, 6), round(r.flops_per_s / 1e12, 6))
    merged.setdefault(key, []).append(lab)
  xs = [k[0] for k in merged] or [1.0]
  lo, hi = min(min(xs) / 4, 0.5), max(max(xs) * 4, 1e3)
  chips = {}
  for r, _ in shown:
    chips.setdefault((r.chip.name, r.num_chips), r)
  tops = [1.0]
  for (name, n), r in chips.items():
    peak = r.chip.peak_flops_per_s("bf16") * n / 1e12
    bw = r.chip.hbm_bytes_per_s_per_device * n / 1e12
    tops.append(peak)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, x * bw) for x in grid], lw=1.5,
            label=f"{name}{f' x{n}' if n > 1 else ''} roof: {peak:.0f} TFLOP/s bf16, {bw * 1e3:.0f} GB/s HBM")
  for (x, y), labs in merged.items():
    ax.plot([x], [y], "o", ms=7)
    ax.annotate(", ".join(labs), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
  ys = [k[1] for k in merged] or [1.0]
  ax.set_xlim(lo, hi)
  ax.set_ylim(min(min(ys) / 4, max(tops) / 1e3), max(tops) * 3)
  ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
  ax.set_ylabel("modelled TFLOP/s")
  ax.set_title("Roofline (modelled on the virtual TPU)")
  ax.grid(True, which="both", alpha=0.3)
  if chips:
    ax.legend(loc="lower right", fontsize=8)
  if skipped:
    ax.text(0.01, 0.99, "no FLOPs, not plotted: " + ", ".join(skipped), transform=ax.transAxes,
            va="top", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return str(path)


def timeline_png(report, path) -> str:
  """The report's timeline PNG: the timing model's `Report.plot_timeline` if present, else ours."""
  lanes = len({(tid, unit) for tid, unit, *_ in report.events})
  height = min(120 + 60 * max(lanes, 1), TIMELINE_MAX_HEIGHT_PX)  # SparseCore: 64 subcores x units
  own = getattr(report, "plot_timeline", None)
  if callable(own):
    try:
      own(path, width_px=TIMELINE_WIDTH_PX, height_px=height)
    except TypeError:  # a plot_timeline without size parameters
      own(path)
    return str(path)
  return plot_timeline(report, path, height_px=height)


def roofline_png(reports, path, labels=None) -> str:
  """The roofline PNG: `palace._src.sim.plots.plot_roofline` if present, else ours."""
  try:
    from palace._src.sim.plots import plot_roofline as sim_plot_roofline
  except ImportError:
    return plot_roofline(reports, path, labels)
  if labels is None:
    sim_plot_roofline(list(reports), path)
    return str(path)
  return plot_roofline(reports, path, labels)


def png_size(path) -> tuple:
  """(width, height) from a PNG file's IHDR chunk; raises ValueError for a non-PNG file."""
  with open(path, "rb") as f:
    head = f.read(24)
  if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
    raise ValueError(f"{path} is not a PNG file.")
  return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")

