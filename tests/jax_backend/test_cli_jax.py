"""`palace run --jax FILE.py`: the real JAX runs FILE, its TPU kernels run on palace and are reported."""
import importlib.util

import pytest

pytest.importorskip("click")
pytest.importorskip("rich")
from click.testing import CliRunner  # noqa: E402

from palace._src.tools.cli import main  # noqa: E402

SCRIPT = '''
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl

def add_one_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1

@jax.jit
def add_one(x):
  return pl.pallas_call(add_one_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)

x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
np.testing.assert_array_equal(add_one(x), np.asarray(x) + 1)
print("script ok", type(add_one(x)).__name__, sys.argv[1:])
'''


def _script(tmp_path, text=SCRIPT):
  path = tmp_path / "prog.py"
  path.write_text(text)
  return str(path)


def test_run_jax_reports_every_launch(tmp_path):
  r = CliRunner().invoke(main, ["run", "--jax", "--chip", "v6e", _script(tmp_path), "a1"])
  assert r.exit_code == 0, r.output
  assert "script ok ArrayImpl ['a1']" in r.output     # real JAX arrays, the script's own argv
  assert "2 launch(es)" in r.output and "add_one_kernel" in r.output and "v6e" in r.output


def test_run_jax_palace_error_is_one_line(tmp_path):
  bad = SCRIPT.replace("pl.BlockSpec((8, 128), lambda i: (i, 0))]", "pl.BlockSpec((8, 128), lambda i: (i + 1, 0))]")
  r = CliRunner().invoke(main, ["run", "--jax", _script(tmp_path, bad)])
  assert r.exit_code == 2, r.output
  assert "palace: error" in r.output and "OutOfBoundsError" in r.output


def test_run_jax_without_jax_is_one_line_exit_2(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
  r = CliRunner().invoke(main, ["run", "--jax", _script(tmp_path)])
  assert r.exit_code == 2
  assert r.output.strip().count("\n") == 0 and "not installed" in r.output and "--compat" in r.output


def test_run_jax_and_compat_exclude_each_other(tmp_path):
  r = CliRunner().invoke(main, ["run", "--jax", "--compat", _script(tmp_path)])
  assert r.exit_code == 2 and "exclude each other" in r.output
