"""PNG plots for the `palace` tools (needs matplotlib from the `cli` extra).

Thin wrappers over the timing model's own plots (`Report.plot_timeline`, `sim.plots.plot_roofline`) that
fix the image sizes the tools promise, cap the height of timelines with many lanes (a SparseCore has 64
subcores), and keep roofline plots readable (no points for FLOP-less kernels, one label per position).
"""
from __future__ import annotations

import warnings

from palace._src.errors import UsageError

TIMELINE_WIDTH_PX, TIMELINE_MAX_HEIGHT_PX, ROOFLINE_SIZE_PX = 1600, 2400, (1200, 800)


def _need_matplotlib():
  try:
    import matplotlib  # noqa: F401
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise UsageError("Plots need matplotlib, which is not installed. Fix: pip install 'palace[cli]'.") from e


def timeline_height_px(report) -> int:
  """60 px per (core, unit) lane plus 120 px, at most TIMELINE_MAX_HEIGHT_PX."""
  lanes = len({(tid, unit) for tid, unit, *_ in report.events})
  return min(120 + 60 * max(lanes, 1), TIMELINE_MAX_HEIGHT_PX)


def timeline_png(report, path) -> str:
  """The report's per-core timeline (lanes: DMA, MXU, VPU, ...), TIMELINE_WIDTH_PX wide. Returns path."""
  _need_matplotlib()
  report.plot_timeline(path, width_px=TIMELINE_WIDTH_PX, height_px=timeline_height_px(report))
  return str(path)


def roofline_png(reports, path, labels=None) -> str:
  """Every report with FLOPs as a point under its chip's roofline, ROOFLINE_SIZE_PX. Reports at the
  same position share one point and one label. Returns path."""
  _need_matplotlib()
  from palace._src.sim.report_plots import plot_roofline
  reports = list(reports)
  labels = list(labels) if labels is not None else [r.kernel_name for r in reports]
  points = {}
  for r, lab in zip(reports, labels):
    if r.flops > 0 and r.device_cycles > 0:
      key = (r.chip.name, r.num_chips, r.flops, r.hbm_bytes, r.device_cycles)
      points.setdefault(key, (r, []))[1].append(lab)
  with warnings.catch_warnings():  # no point at all: an empty plot, without matplotlib's legend warning
    warnings.filterwarnings("ignore", "No artists with labels", UserWarning)
    plot_roofline([r for r, _ in points.values()], path,
                  labels=[", ".join(labs) for _, labs in points.values()],
                  width_px=ROOFLINE_SIZE_PX[0], height_px=ROOFLINE_SIZE_PX[1])
  return str(path)


def png_size(path) -> tuple:
  """(width, height) from a PNG file's IHDR chunk; raises ValueError for a non-PNG file."""
  with open(path, "rb") as f:
    head = f.read(24)
  if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
    raise ValueError(f"{path} is not a PNG file.")
  return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
