"""`pltpu.CompilerParams(internal_scratch_in_bytes=n)` against the TPU compiler's minimum, as a real TPU
v5e answered it (benchmarks/hw/scratch_limit.py; JAX 0.10.2, libtpu 0.0.42.1, 2026-12-06): every size
the chip's compiler refused, palace refuses with the compiler's figure; every size it ran, palace runs
and computes the copy. Chips never measured check no minimum (ChipSpec.min_internal_scratch_bytes None)."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src import hw

from errcheck import raises

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data" / "v5e-scratch-limit-2026-12-06.jsonl"
RECORDS = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
ENV = next(r for r in RECORDS if r["kind"] == "environment")
PROBES = [r for r in RECORDS if r["kind"] == "scratch"]
REFUSED = [r["requested_bytes"] for r in PROBES if not r["ran"]]
RAN = [r["requested_bytes"] for r in PROBES if r["ran"]]
X = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)


def _copy(x_ref, y_ref):
  y_ref[...] = x_ref[...]


def _copy_hbm(x_hbm, y_hbm):   # (pl.kernel operands stay in HBM)
  pltpu.sync_copy(x_hbm, y_hbm)


def _pallas_call(n):
  return pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((128, 128), jnp.float32),
                        compiler_params=pltpu.CompilerParams(internal_scratch_in_bytes=n))


def _kernel(n):
  return pl.kernel(_copy_hbm, out_type=pl.ShapeDtypeStruct((128, 128), jnp.float32),
                   mesh=pltpu.TensorCoreMesh("core", num_cores=1),
                   compiler_params=pltpu.CompilerParams(internal_scratch_in_bytes=n))


def _compiler_minimum(record) -> int:
  """The minimum the chip's compiler stated in its refusal."""
  return int(re.search(r"needs to be at least (\d+) bytes", record["error"]).group(1))


def test_the_record_is_a_v5e_run():
  assert ENV["device_kind"] == "TPU v5 lite" and ENV["libtpu_version"] == hw.COMPILER.libtpu_version
  assert REFUSED and RAN and max(REFUSED) < min(RAN)


def test_v5e_minimum_is_the_compilers():
  minimum = {_compiler_minimum(r) for r in PROBES if not r["ran"]}
  assert minimum == {hw.CHIPS["v5e"].min_internal_scratch_bytes} == {36864}
  assert "v5e-scratch-limit-2026-12-06.jsonl" in hw.CHIPS["v5e"].sources["min_internal_scratch_bytes"]


@pytest.mark.parametrize("front", [_pallas_call, _kernel], ids=["pallas_call", "kernel"])
@pytest.mark.parametrize("record", [r for r in PROBES if not r["ran"]], ids=lambda r: str(r["requested_bytes"]))
def test_refused_sizes_are_refused(front, record):
  n, name = record["requested_bytes"], "_copy" if front is _pallas_call else "_copy_hbm"
  quote = record["error"].split("Mosaic failed to compile TPU kernel: ")[1]   # the compiler's own words
  with pl.virtual_tpu("v5e"):
    msg = raises(lambda: front(n)(X), pl.UsageError,
                 rf"internal_scratch_in_bytes={n}\) for kernel '{name}' on TPU v5e: {n} B .*expected at "
                 rf"least 36864 B", r"Fix: request internal_scratch_in_bytes >= 36864, or leave it unset")
  assert quote in msg
  assert msg.startswith("test_internal_scratch.py:"), msg   # the user's line that built the launch


@pytest.mark.parametrize("front", [_pallas_call, _kernel], ids=["pallas_call", "kernel"])
@pytest.mark.parametrize("n", RAN)
def test_sizes_that_ran_run(front, n):
  with pl.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(front(n)(X)), X)


def test_the_default_chip_is_v5e_and_checks():
  raises(lambda: _pallas_call(512)(X), pl.UsageError, "on TPU v5e: 512 B")


def test_unset_runs():
  with pl.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(_pallas_call(None)(X)), X)


@pytest.mark.parametrize("chip", ["v4", "v5p", "v6e", "7x"])
def test_chips_never_measured_check_nothing(chip):
  assert hw.CHIPS[chip].min_internal_scratch_bytes is None
  assert "not measured" in hw.CHIPS[chip].sources["min_internal_scratch_bytes"]
  with pl.virtual_tpu(chip):
    np.testing.assert_array_equal(np.asarray(_pallas_call(0)(X)), X)


@pytest.mark.parametrize("n,why", [(-512, "must be >= 0"), (512.0, "must be an integer"),
                                   ("512", "must be an integer"), (True, "must be an integer")])
def test_non_integers_and_negatives_stay_errors(n, why):
  raises(lambda: pltpu.CompilerParams(internal_scratch_in_bytes=n), pl.UsageError,
         rf"internal_scratch_in_bytes\) {why}")
