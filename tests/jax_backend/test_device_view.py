"""The virtual chip visible where programs look (issue 37): device queries answer as the chip for code
outside JAX and palace, JAX's internals keep the CPU devices, and `pytest -p palace.jax` makes a TPU
test suite's selection helpers answer as on that chip."""
import os
import subprocess
import sys
import textwrap
import types

import pytest

import jax

import palace
from palace._src.jax import device_view


def _read_as(module_name: str, fn_src: str):
  """Run `fn_src` (defining f) as if written in module `module_name`; return f()."""
  mod = types.ModuleType(module_name)
  exec(textwrap.dedent(fn_src), mod.__dict__)  # noqa: S102
  return mod.f()


LIB = "def f():\n  import jax\n  d = jax.devices()[0]\n  return d.device_kind, d.platform, d.coords, d.core_on_chip\n"


@pytest.fixture
def view():
  tpu = palace.virtual_tpu("v5e", num_chips=4)
  device_view.install(tpu)
  try:
    yield tpu
  finally:
    device_view.uninstall()


def test_a_library_sees_the_virtual_chip(view):
  assert _read_as("somelib.hardware", LIB) == ("TPU v5 lite", "tpu", (0, 0, 0), 0)
  assert _read_as("jaxtyping_like_lib", LIB)[0] == "TPU v5 lite"   # a name starting "jax" is not JAX
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.default_backend()\n") == "tpu"
  tpus = _read_as("somelib", "def f():\n  import jax\n  return jax.devices('tpu')\n")
  assert tpus == jax.devices("cpu")


def test_local_devices_take_their_backend_by_keyword_and_position(view):
  """jax.local_devices' backend is its second argument (after process_index): asked for the CPU
  devices by keyword, a library gets them (it raised TypeError when the view passed "cpu" on as the
  process index); asked for "tpu", the virtual chip's."""
  cpus = jax.local_devices(backend="cpu")
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.local_devices(backend='cpu')\n") == cpus
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.local_devices(None, 'cpu')\n") == cpus
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.local_devices(backend='tpu')\n") == cpus
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.local_devices(0)\n") == jax.local_devices(0)
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.devices(backend='tpu')\n") == cpus


def test_coords_follow_the_torus(view):
  # 4 v5e chips: a 2x2 torus, the last axis fastest; z is 0 on a 2-D torus
  assert [view.chip_coords(i) for i in range(4)] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]


def test_jax_internals_keep_the_cpu_devices(view):
  assert _read_as("jax._src.fake_internal", LIB.replace(", d.coords, d.core_on_chip", "")) == ("cpu", "cpu")
  assert _read_as("jax._src.fake_internal",
                  "def f():\n  import jax\n  return hasattr(jax.devices()[0], 'coords')\n") is False
  assert _read_as("jax._src.fake_internal", "def f():\n  import jax\n  return jax.default_backend()\n") \
      == "cpu"
  # and XLA still runs on the host
  assert float(jax.jit(lambda x: x + 1)(1.0)) == 2.0


def test_uninstall_restores_everything():
  before = jax.devices()[0].device_kind
  device_view.install(palace.virtual_tpu("v6e"))
  assert _read_as("somelib", LIB)[0] == "TPU v6 lite"
  device_view.uninstall()
  assert _read_as("somelib", "def f():\n  import jax\n  return jax.devices()[0].device_kind\n") == before
  assert not hasattr(jax.devices()[0], "coords")
  assert jax.default_backend() == "cpu"
  device_view.uninstall()   # a second uninstall is a no-op


SUITE = '''
import jax, jax.numpy as jnp, numpy as np
from absl.testing import absltest
from jax._src import test_util as jtu
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


class T(jtu.JaxTestCase):
  def setUp(self):
    if not jtu.test_device_matches(["tpu"]):
      self.skipTest("TPU only")
    super().setUp()

  def test_selection_helpers(self):
    self.assertTrue(jtu.is_device_tpu(5, "e"))
    self.assertTrue(jtu.is_device_tpu_at_least(4))
    self.assertEqual(jtu.get_tpu_version(), 5)
    self.assertTrue(pltpu.is_tpu_device())

  def test_libtpu_version_is_the_modelled_compilers(self):
    # palace models libtpu 0.0.42.1 (hw.COMPILER, measured on a TPU v5e); JAX answers True off a TPU
    self.assertTrue(jtu.is_libtpu_at_least("0.0.42.1"))
    self.assertTrue(jtu.is_libtpu_at_least("0.0.42"))
    self.assertFalse(jtu.is_libtpu_at_least("0.0.45"))
    self.assertFalse(jtu.is_libtpu_at_least("0.45.0"))

  def test_a_newer_compiler_skips(self):
    if not jtu.is_libtpu_at_least("0.0.45"):
      self.skipTest("Requires libtpu 0.0.45 or newer")
    raise AssertionError("ran on a compiler palace does not model")

  def test_a_kernel(self):
    def k(x_ref, o_ref):
      o_ref[...] = x_ref[...] * 2
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    out = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2)
'''


def _run_suite(tmp_path, palace_jax):
  f = tmp_path / "tpu_fake_test.py"
  f.write_text(SUITE)
  env = {k: v for k, v in os.environ.items() if k != "PALACE_JAX"}
  if palace_jax:
    env["PALACE_JAX"] = palace_jax
  return subprocess.run([sys.executable, "-m", "pytest", "-p", "palace.jax", "-rs", str(f)],
                        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_pytest_plugin_runs_a_tpu_suite_on_palace(tmp_path):
  r = _run_suite(tmp_path, "v5e")
  assert "3 passed, 1 skipped" in r.stdout, r.stdout + r.stderr
  assert "Requires libtpu 0.0.45 or newer" in r.stdout
  assert "palace.jax: TPU kernels run on a virtual v5e (1 chip)" in r.stdout
  assert "libtpu 0.0.42.1 modelled" in r.stdout


def test_pytest_plugin_is_inert_without_palace_jax(tmp_path):
  r = _run_suite(tmp_path, None)
  assert "4 skipped" in r.stdout, r.stdout + r.stderr
  assert "palace.jax: inactive" in r.stdout
