"""PNG plots of the tools: exact pixel sizes, non-empty images, PNG header parsing."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")

import palace as pl  # noqa: E402
import palace.numpy as jnp  # noqa: E402
from palace._src.tools import pngs as plots  # noqa: E402


def _report(rows=256):
  def matmul_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  x = np.ones((rows, 256), np.float32)
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(matmul_kernel, out_shape=pl.ShapeDtypeStruct((rows, 256), np.float32), grid=(2,),
                   in_specs=[pl.BlockSpec((rows // 2, 256), lambda i: (i, 0)),
                             pl.BlockSpec((256, 256), lambda i: (0, 0))],
                   out_specs=pl.BlockSpec((rows // 2, 256), lambda i: (i, 0)))(x, x[:256])
  return tpu.reports[-1]


def test_timeline_and_roofline_sizes(tmp_path):
  r = _report()
  lanes = len({(tid, unit) for tid, unit, *_ in r.events})
  p = plots.timeline_png(r, tmp_path / "t.png")
  assert plots.png_size(p) == (plots.TIMELINE_WIDTH_PX, 120 + 60 * lanes)
  assert (tmp_path / "t.png").stat().st_size > 5_000
  p = plots.roofline_png([r, r, _report(512)], tmp_path / "r.png", labels=["a", "b", "c"])
  assert plots.png_size(p) == plots.ROOFLINE_SIZE_PX and (tmp_path / "r.png").stat().st_size > 10_000
  assert r.flops > 0


def test_timeline_height_is_capped():
  class Many:
    events = [((0, c), u, "op", 0, 1, None) for c in range(64) for u in ("dma", "vpu", "scalar")]
  assert plots.timeline_height_px(Many()) == plots.TIMELINE_MAX_HEIGHT_PX


def test_png_size_rejects_other_files(tmp_path):
  (tmp_path / "x.png").write_bytes(b"not a png at all, just some bytes")
  with pytest.raises(ValueError, match="not a PNG"):
    plots.png_size(tmp_path / "x.png")
