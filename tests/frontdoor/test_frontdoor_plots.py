"""PNG plots: exact pixel sizes, non-empty images, PNG header parsing."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")

import palace as pl  # noqa: E402
from palace._src import plots  # noqa: E402


def _report():
  def add_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  x = np.ones((256, 256), np.float32)
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(add_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                   in_specs=[pl.BlockSpec((128, 256), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((128, 256), lambda i: (i, 0)))(x)
  return tpu.reports[-1]


def test_own_timeline_and_roofline_sizes(tmp_path):
  r = _report()
  lanes = len({(tid, unit) for tid, unit, *_ in r.events})
  p = plots.plot_timeline(r, tmp_path / "t.png")
  assert plots.png_size(p) == (plots.TIMELINE_WIDTH_PX, 120 + 40 * lanes)
  p = plots.plot_timeline(r, tmp_path / "t2.png", width_px=800, height_px=300)
  assert plots.png_size(p) == (800, 300)
  p = plots.plot_roofline([r, r], tmp_path / "r.png", labels=["a", "b"])
  assert plots.png_size(p) == plots.ROOFLINE_SIZE_PX and (tmp_path / "r.png").stat().st_size > 10_000
  assert plots.png_size(plots.timeline_png(r, tmp_path / "t3.png"))[0] == plots.TIMELINE_WIDTH_PX


def test_png_size_rejects_other_files(tmp_path):
  (tmp_path / "x.png").write_bytes(b"not a png at all, just some bytes")
  with pytest.raises(ValueError, match="not a PNG"):
    plots.png_size(tmp_path / "x.png")
