"""The `palace` command: every user mistake prints one clear line and exits 2, no traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("click")
pytest.importorskip("rich")
from click.testing import CliRunner  # noqa: E402

from palace._src.tools.cli import main  # noqa: E402

SCRIPT = "print('hello')\n"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(tmp_path):
  p = tmp_path / "s.py"
  p.write_text(SCRIPT)
  return str(p)


def _one_line_exit_2(args, needle):
  res = CliRunner().invoke(main, args)
  out = res.output.strip()
  assert res.exit_code == 2, (res.exit_code, out)
  assert "Traceback" not in out
  lines = [l for l in out.splitlines() if l.strip()]
  assert len(lines) == 1, out
  assert lines[0].startswith("palace: error:"), out
  assert needle in lines[0], out


@pytest.mark.parametrize("args,needle", [
    (["tune", "matmul", "--m", "abc"], "'--m': 'abc' is not a valid integer"),
    (["tune", "matmul", "--m", "-5"], "'--m': -5 is not in the range x>=1"),
    (["tune", "matmul", "--n", "0"], "'--n': 0 is not in the range"),
    (["tune", "matmul", "--k", "1.5"], "'--k': '1.5' is not a valid integer"),
    (["tune", "matmul", "--top", "0"], "'--top': 0 is not in the range"),
    (["tune", "matmul", "--bm", "0,128"], "'--bm': expected comma-separated positive integers"),
    (["tune", "matmul", "--bk", "a,b"], "'--bk': expected comma-separated integers"),
    (["tune", "matmul", "--bn", ","], "'--bn': expected comma-separated positive integers"),
    (["tune", "matmul", "--dtype", "float64"], "'--dtype': 'float64' is not one of"),
    (["tune", "matmul", "--chip", "v9"], "Unknown TPU chip 'v9'"),
    (["tune", "conv"], "No such command 'conv'"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["chips", "--colour"], "--colour"),
    (["run", "/nonexistent/x.py"], "'/nonexistent/x.py' does not exist"),
])
def test_bad_arguments(args, needle):
  _one_line_exit_2(args, needle)


@pytest.mark.parametrize("opts,needle", [
    (["--num-chips", "0"], "'--num-chips': 0 is not in the range x>=1"),
    (["--num-chips", "two"], "'--num-chips': 'two' is not a valid integer"),
    (["--num-chips", "100000"], "largest v5e pod"),
    (["--max-reports", "-1"], "'--max-reports': -1 is not in the range"),
    (["--chip", ""], "virtual_tpu(chip) must be a non-empty string"),
    (["--chip", "v9"], "Unknown TPU chip 'v9'"),
    (["--trace", "/nonexistent/dir/t.json"], "cannot write '/nonexistent/dir/t.json'"),
    (["--timeline", "/nonexistent/dir/t.png"], "cannot write '/nonexistent/dir/t.png'"),
    (["--trace-dir", "/proc/palace-traces"], "cannot create the folder '/proc/palace-traces'"),
])
def test_bad_run_options(script, opts, needle):
  _one_line_exit_2(["run", script, *opts], needle)


def test_trace_path_is_a_folder(script, tmp_path):
  _one_line_exit_2(["run", script, "--trace", str(tmp_path)], "is a directory")


def test_trace_dir_is_a_file(script):
  _one_line_exit_2(["run", script, "--trace-dir", script], "is a file")


def test_json_path_unwritable():
  _one_line_exit_2(["tune", "matmul", "--m", "128", "--json", "/nonexistent/r.json"], "cannot write")


def test_demo_out_unwritable():
  _one_line_exit_2(["demo", "--quick", "--out", "/proc/palace-demo"], "cannot create the folder")


def test_unwritable_path_check_leaves_no_file(script, tmp_path):
  res = CliRunner().invoke(main, ["run", script, "--trace", str(tmp_path / "t.json")])
  assert res.exit_code == 0, res.output
  assert not (tmp_path / "t.json").exists()   # no launch, no trace; the check left nothing behind


@pytest.mark.parametrize("module", ["click", "rich"])
def test_missing_cli_extra(module):
  code = (f"import sys; sys.modules[{module!r}] = None\n"
          "from palace._src.tools.cli_entry import main; main(['chips'])")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
  assert res.returncode == 2, res.stderr
  assert "Traceback" not in res.stderr
  line = res.stderr.strip()
  assert "\n" not in line and line.startswith("palace: error:") and f"'{module}" in line, line
  assert line.endswith("part of the 'cli' extra. Fix: pip install 'palace[cli]'"), line
