"""The `palace` console script: every command through click's CliRunner, plus the installed entry point."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

click = pytest.importorskip("click")
pytest.importorskip("rich")
pytest.importorskip("matplotlib")
from click.testing import CliRunner  # noqa: E402

from palace import tpu as pltpu  # noqa: E402
from palace import tpu_sc as plsc  # noqa: E402
import palace as pl  # noqa: E402
from palace._src.tools.cli import main  # noqa: E402
from palace._src.tools.pngs import (ROOFLINE_SIZE_PX, TIMELINE_MAX_HEIGHT_PX, TIMELINE_WIDTH_PX,  # noqa: E402
                                png_size)

ADD_SCRIPT = '''
import sys
import numpy as np
import palace as pl

def add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]

x = np.ones((256, 256), np.float32)
f = pl.pallas_call(add_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                   in_specs=[pl.BlockSpec((128, 256), lambda i: (i, 0))] * 2,
                   out_specs=pl.BlockSpec((128, 256), lambda i: (i, 0)))
assert (f(x, x) == 2).all()
assert (f(x, x + 1) == 3).all()
print("args:", sys.argv[1:])
'''

BAD_SCRIPT = '''
import numpy as np
import palace as pl

def copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]

x = np.ones((256, 256), np.float32)
pl.pallas_call(copy_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
               in_specs=[pl.BlockSpec((100, 256), lambda i: (i, 0))],
               out_specs=pl.BlockSpec((128, 256), lambda i: (i, 0)))(x)
'''


def _invoke(args):
  return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.parametrize("cmd", [[], ["demo"], ["run"], ["tune"], ["tune", "matmul"], ["chips"]])
def test_help_on_every_command(cmd):
  res = _invoke(cmd + ["--help"])
  assert res.exit_code == 0, res.output
  assert "Usage:" in res.output and "--help" in res.output


def test_demo_quick_writes_traces_and_plots(tmp_path):
  out = tmp_path / "out"
  res = _invoke(["demo", "--quick", "--out", str(out)])
  assert res.exit_code == 0, res.output
  assert str(out.resolve()) in res.output.replace("\n", "")
  traces = sorted(out.glob("*.trace.json"))
  assert {p.name for p in traces} >= {"matmul.trace.json", "ragged_gather.trace.json"}
  for p in traces:
    data = json.loads(p.read_text())
    assert any(ev.get("ph") == "X" for ev in data["traceEvents"]), p
  assert png_size(out / "roofline.png") == ROOFLINE_SIZE_PX
  timelines = sorted(out.glob("*.timeline.png"))
  assert len(timelines) == len(traces)
  for p in timelines:
    w, h = png_size(p)
    assert w == TIMELINE_WIDTH_PX and 150 <= h <= TIMELINE_MAX_HEIGHT_PX, (p, w, h)
    assert p.stat().st_size > 5000
  # parts are listed as built or not built, never faked
  for present, name in [(hasattr(pltpu, "emit_pipeline"), "pl.kernel + emit_pipeline matmul"),
                        (hasattr(plsc, "VectorSubcoreMesh"), "SparseCore gather"),
                        (hasattr(pl, "shard_map"), "collective matmul on 8 chips")]:
    assert name in res.output
    if not present:
      assert f"{name}: not built yet" in res.output.replace("\n", " ")
  assert "failed" not in res.output.split("the tour")[-1]


def test_chips_lists_presets_and_sources():
  res = _invoke(["chips"])
  assert res.exit_code == 0, res.output
  for name in ("v4", "v5e", "v5p", "v6e", "7x", "TFLOP/s", "GB/s"):
    assert name in res.output
  assert "[tpu_info]" in res.output  # source tags printed literally, not eaten as rich markup
  assert "source" not in _invoke(["chips", "--no-sources"]).output


def test_run_prints_reports_and_writes_trace(tmp_path):
  script = tmp_path / "add.py"
  script.write_text(ADD_SCRIPT)
  trace, png = tmp_path / "last.json", tmp_path / "last.png"
  res = _invoke(["run", str(script), "--chip", "v6e", "--trace", str(trace), "--timeline", str(png),
                 "--trace-dir", str(tmp_path / "all"), "x", "y"])
  assert res.exit_code == 0, res.output
  assert "args: ['x', 'y']" in res.output
  assert "2 launch(es)" in res.output and res.output.count("kernel 'add_kernel' on v6e") == 2
  assert json.loads(trace.read_text())["traceEvents"]
  assert len(list((tmp_path / "all").glob("*.trace.json"))) == 2
  assert png_size(png)[0] == TIMELINE_WIDTH_PX


def test_run_palace_error_is_a_message_with_exit_2(tmp_path):
  script = tmp_path / "bad.py"
  script.write_text(BAD_SCRIPT)
  res = CliRunner().invoke(main, ["run", str(script)])
  assert res.exit_code == 2
  assert "BlockSpecError" in res.output and "bad.py:9" in res.output
  assert "Traceback" not in res.output


def test_run_script_without_kernels(tmp_path):
  script = tmp_path / "empty.py"
  script.write_text("print('hello')\n")
  res = _invoke(["run", str(script)])
  assert res.exit_code == 0 and "launched no kernel" in res.output


def test_tune_matmul_small(tmp_path):
  out = tmp_path / "rank.json"
  res = _invoke(["tune", "matmul", "--m", "512", "--n", "512", "--k", "1024", "--bm", "128,256",
                 "--bk", "512,1024", "--bn", "256,512", "--json", str(out)])
  assert res.exit_code == 0, res.output
  text = " ".join(res.output.split())
  assert "best: bm=" in text and "XLA-style roofline" in text
  data = json.loads(out.read_text())
  assert len(data["ranking"]) == 8
  times = [r["device_time_s"] for r in data["ranking"] if r["device_time_s"] is not None]
  assert times == sorted(times)


def test_tune_and_demo_user_errors_exit_2():
  res = CliRunner().invoke(main, ["tune", "matmul", "--chip", "v9"])
  assert res.exit_code == 2 and "Unknown TPU chip 'v9'" in res.output and "Traceback" not in res.output
  res = CliRunner().invoke(main, ["tune", "matmul", "--bm", "12x"])
  assert res.exit_code == 2 and "comma-separated integers" in res.output


def test_console_script_is_installed():
  exe = Path(sys.executable).parent / "palace"
  if not exe.exists():
    pytest.skip("the palace console script is not installed in this environment (pip install -e '.[cli]')")
  res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
  assert res.returncode == 0 and "palace demo" not in res.stderr and "demo" in res.stdout
