"""`PALACE_JAX=<chip> pytest -p palace.jax ...`: a TPU test suite runs its TPU tests on palace (L5).

PALACE_JAX already makes every TPU kernel of the process run on the virtual chip and shows the devices as
that chip to the suite's own code (device_view.py). The plugin adds what a suite's selection helpers read
besides the devices: JAX's `jax_test_dut` flag is set to "tpu", so `jtu.test_device_matches(["tpu"])`,
`jtu.is_device_tpu(5, "e")`, `jtu.is_device_tpu_at_least(4)` and `jtu.get_tpu_version()` answer as on
that chip, and `jtu.is_libtpu_at_least(v)` answers for the TPU compiler palace models
(`hw.COMPILER.libtpu_version`, the one measured on a TPU v5e) instead of JAX's "True" off a Cloud TPU,
so a test that needs a newer compiler skips as it would on the measured chip. Only the test utilities'
name is answered so: JAX's own lowering code keeps its own version check, and no kernel or result is
touched. The header of the run names the chip and the compiler. Without PALACE_JAX the plugin does
nothing.
"""
from __future__ import annotations

from palace._src import hw

_saved: dict = {}   # what pytest_configure replaced, restored by pytest_unconfigure


def _tpu():
  from palace._src.jax import process_tpu  # noqa: PLC0415  (the package's PALACE_JAX activation)
  return process_tpu


def pytest_configure(config):
  if _tpu() is None:
    return
  import jax  # noqa: PLC0415
  from jax._src import test_util  # noqa: PLC0415  (defines the jax_test_dut flag)
  jax.config.update("jax_test_dut", "tpu")
  _saved.setdefault("is_libtpu_at_least", test_util.is_libtpu_at_least)
  test_util.is_libtpu_at_least = hw.libtpu_at_least


def pytest_unconfigure(config):
  if "is_libtpu_at_least" in _saved:
    from jax._src import test_util  # noqa: PLC0415
    test_util.is_libtpu_at_least = _saved.pop("is_libtpu_at_least")


def pytest_report_header(config):
  tpu = _tpu()
  if tpu is None:
    return "palace.jax: inactive (set PALACE_JAX=<chip>[:<num_chips>] to run TPU kernels on palace)"
  return (f"palace.jax: TPU kernels run on a virtual {tpu.chip.name} ({tpu.num_chips} chip"
          f"{'s' if tpu.num_chips != 1 else ''}); jax_test_dut=tpu; libtpu "
          f"{hw.COMPILER.libtpu_version} modelled (jtu.is_libtpu_at_least answers for it)"
          + ("; DIAGNOSTIC PALACE_JAX_EXACT_F32_DOTS=1: float32 dots at the default precision are "
             "computed exactly, NOT as the chip computes them (it rounds their operands to bfloat16)"
             if tpu.exact_f32_dots else "")
          + ("; DIAGNOSTIC PALACE_JAX_SHARED_DOTS=1: float dots in kernels and in XLA:CPU's code outside "
             "them are summed by one rule, NOT in the chip's order" if tpu.shared_dots else "")
          + ("; DIAGNOSTIC PALACE_JAX_HOST_MATH=1: the kernels' transcendentals are XLA:CPU's, NOT the "
             "chip's" if tpu.host_math else "")
          + ("; PALACE_JAX_DOT_NUMERICS=mxu: float dots in kernels summed in the chip's measured order"
             if tpu.dot_numerics == "mxu" else ""))
