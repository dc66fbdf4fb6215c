"""Plots of launch reports (L4b; matplotlib is imported lazily, Agg backend, no pyplot state).

`Report.plot_timeline(path)` draws one launch; `plot_roofline(reports, path)` places several launches on
the roofline of their chips: x = arithmetic intensity (FLOPs per HBM byte), y = achieved FLOP/s, with the
bf16 compute roof and the HBM bandwidth roof of every chip involved ([SB-roof]).
"""
from __future__ import annotations

ROOFLINE_SIZE_PX = (1200, 800)


def _figure(width_px: int, height_px: int, dpi: int):
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, without touching pyplot state
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
  FigureCanvasAgg(fig)
  return fig


def plot_roofline(reports, path, labels=None, width_px: int = ROOFLINE_SIZE_PX[0],
                  height_px: int = ROOFLINE_SIZE_PX[1], dpi: int = 100) -> str:
  """Save a log-log roofline PNG of exactly width_px x height_px with one point per report. Returns path."""
  reports = list(reports)
  labels = list(labels) if labels is not None else [r.kernel_name for r in reports]
  fig = _figure(width_px, height_px, dpi)
  ax = fig.add_subplot(1, 1, 1)
  ax.set_xscale("log")
  ax.set_yscale("log")
  xs = [max(r.arithmetic_intensity, 1e-2) if r.hbm_bytes else 1e4 for r in reports]
  lo = min([0.1] + [x / 4 for x in xs])
  hi = max([1e4] + [x * 4 for x in xs])
  chips = {}
  for r in reports:
    chips.setdefault((r.chip.name, r.num_chips), r)
  for (name, n), r in chips.items():
    peak = r.peak_flops_per_s
    bw = r.chip.hbm_bytes_per_s_per_device * n
    knee = peak / bw
    ax.plot([lo, knee, hi], [lo * bw / 1e12, peak / 1e12, peak / 1e12], linewidth=1.5,
            label=f"{name}{f' x{n}' if n > 1 else ''}: {peak / 1e12:,.0f} TFLOP/s, {bw / 1e9:,.0f} GB/s")
  for r, x, label in zip(reports, xs, labels):
    y = max(r.flops_per_s / 1e12, 1e-6)
    ax.scatter([x], [y], zorder=3)
    ax.annotate(f"{label} ({r.bound})", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
  ax.set_xlim(lo, hi)
  ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
  ax.set_ylabel("achieved TFLOP/s (modelled)")
  ax.set_title("Roofline (modelled)")
  ax.grid(True, which="both", linewidth=0.3)
  ax.legend(loc="lower right", fontsize=8)
  fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.93)
  fig.savefig(path, dpi=dpi)
  return str(path)
