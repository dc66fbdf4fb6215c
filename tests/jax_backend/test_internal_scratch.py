"""palace.jax against the TPU v5e's recorded answers to `pltpu.CompilerParams(internal_scratch_in_bytes=n)`
(benchmarks/hw/data/v5e-scratch-limit-2026-12-06.jsonl: JAX 0.10.2, libtpu 0.0.42.1): each refused size
is refused while palace.jax lowers the launch (pallas_call and pl.kernel), as the TPU compiler refuses it
when it compiles it: palace's UsageError (a ValueError) that is also JAX's JaxRuntimeError, quoting the
compiler's words; each size that ran runs and copies its operand."""
import json
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import PalaceError, UsageError
from palace._src.jax import compiler_errors

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data" / "v5e-scratch-limit-2026-12-06.jsonl"
PROBES = [r for r in map(json.loads, DATA.read_text().splitlines()) if r["kind"] == "scratch"]
X = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)


def _copy(x_ref, y_ref):
  y_ref[...] = x_ref[...]


def _copy_hbm(x_hbm, y_hbm):
  pltpu.sync_copy(x_hbm, y_hbm)


def _launch(front: str, n):
  """JAX's pallas_call (body `_copy`) or pl.kernel (body `_copy_hbm`) of a (128, 128) float32 copy."""
  out, params = jax.ShapeDtypeStruct((128, 128), jnp.float32), pltpu.CompilerParams(internal_scratch_in_bytes=n)
  if front == "pallas_call":
    return pl.pallas_call(_copy, out_shape=out, compiler_params=params)
  return pl.kernel(_copy_hbm, out_type=out, mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1),
                   compiler_params=params)


FRONTS = {"pallas_call": "_copy", "kernel": "_copy_hbm"}


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("record", [r for r in PROBES if not r["ran"]], ids=lambda r: str(r["requested_bytes"]))
def test_refused_sizes_are_refused_when_compiled(front, record):
  n, name = record["requested_bytes"], FRONTS[front]
  quote = record["error"].split("Mosaic failed to compile TPU kernel: ")[1]   # the compiler's own words
  with pj.virtual_tpu("v5e"), pytest.raises(jax.errors.JaxRuntimeError) as e:
    jax.jit(_launch(front, n)).lower(X).compile()
  assert isinstance(e.value, UsageError) and isinstance(e.value, ValueError)
  msg = str(e.value)
  assert quote in msg
  assert f"internal_scratch_in_bytes={n}) for kernel '{name}' on TPU v5e: {n} B" in msg
  assert "Fix: request internal_scratch_in_bytes >= 36864, or leave it unset" in msg
  assert msg.startswith("test_internal_scratch.py:"), msg   # the kernel function's line (its jaxpr's debug info)


@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("n", [r["requested_bytes"] for r in PROBES if r["ran"]])
def test_sizes_that_ran_run(front, n):
  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(jax.jit(_launch(front, n))(X)), X)


def test_jax_test_set_internal_scratch_size():
  """JAX's tpu_pallas_test::test_set_internal_scratch_size: a 512-byte request, called eagerly."""
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match="Requested internal scratch size 512 needs "
                                                              "to be at least"):
    _launch("pallas_call", 512)(X)


def test_a_chip_never_measured_runs_any_size():
  with pj.virtual_tpu("v6e"):
    np.testing.assert_array_equal(np.asarray(jax.jit(_launch("pallas_call", 0))(X)), X)


@pytest.mark.parametrize("n,why", [(-512, "must be >= 0"), (512.5, "must be an integer")])
def test_non_integers_and_negatives_stay_errors(n, why):
  with pj.virtual_tpu("v5e"), pytest.raises(PalaceError, match=rf"internal_scratch_in_bytes\) {why}") as e:
    jax.jit(_launch("pallas_call", n))(X)
  assert isinstance(e.value, ValueError)


def test_the_usage_class_is_both():
  e = UsageError("too small. Fix: more.")
  e.add_note("a note")
  j = compiler_errors.as_jax_usage_error(e)
  assert isinstance(j, jax.errors.JaxRuntimeError) and isinstance(j, UsageError)
  assert type(j).__name__ == "UsageError" and j.__notes__ == ["a note"] and str(j) == str(e)
