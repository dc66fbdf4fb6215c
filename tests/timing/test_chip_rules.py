"""Chip rules that are hardware data (issue 16): the 7x clock and P-states, operand dtypes a chip's
compiler rejects (int8 x int8 on TPU v4, jax-ml/jax issue 37367)."""
import json
from pathlib import Path

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace._src import hw
from palace._src.errors import UnsupportedError, UsageError


def test_7x_preset_has_the_published_peak():
  # 1.15e15 bf16 FLOP/s per logical device (one TensorCore; [gcp-7x] 2307 TF per chip of two)
  assert hw.get_chip("7x").peak_flops_per_s("bf16") == pytest.approx(1.15e15, rel=5e-3)
  assert hw.get_chip("7x").p_state == 7 and hw.get_chip("7x").clock_hz == 2.2e9


def test_7x_p_state_selects_the_clock():
  with pl.virtual_tpu("7x", p_state=3) as tpu:
    pass
  assert tpu.chip.clock_hz == 1.9e9 and tpu.chip.p_state == 3
  assert tpu.chip.peak_flops_per_s("bf16") == pytest.approx(0.996e15, rel=2e-3)
  # cycle-counted constants stay in cycles, ns-given latencies stay in ns
  assert tpu.chip.grid_step_overhead_cycles == hw.get_chip("7x").grid_step_overhead_cycles
  assert tpu.chip.dma_hbm_to_vmem_latency_ns == hw.get_chip("7x").dma_hbm_to_vmem_latency_ns


def _matmul_kernel(a_ref, b_ref, o_ref):
  o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def test_a_lower_p_state_is_slower_on_compute_bound_work():
  x = np.ones((1024, 1024), jnp.bfloat16)
  times = []
  for p in (0, 3, 7):
    with pl.virtual_tpu("7x", p_state=p, timing_only=True, trace=False) as tpu:
      pl.pallas_call(_matmul_kernel, out_shape=pl.ShapeDtypeStruct((1024, 1024), jnp.float32))(x, x)
    times.append(tpu.reports[-1].device_time_s)
  assert times[0] > times[1] > times[2]


@pytest.mark.parametrize("chip, p_state, match", [
    ("7x", 8, r"p_state=8 is not a P-state of chip 7x; expected an integer 0-7 \(0: 1.6 GHz.*7: 2.2 GHz\)"),
    ("7x", -1, r"p_state=-1 is not a P-state of chip 7x; expected an integer 0-7"),
    ("7x", 2.5, r"p_state must be an integer; got 2.5"),
    ("7x", "3", r"p_state must be an integer; got '3'"),
    ("v5e", 0, r"chip v5e has a single clock \(1.5 GHz\) and no P-states.*P-states exist on: 7x"),
])
def test_bad_p_state_is_an_error_naming_the_allowed_values(chip, p_state, match):
  with pytest.raises(UsageError, match=match):
    pl.virtual_tpu(chip, p_state=p_state)


def _int_matmul(a_ref, b_ref, o_ref):
  o_ref[...] = jnp.matmul(a_ref[...], b_ref[...].T, preferred_element_type=jnp.int32)


def _run_int_matmul(chip, dtype, timing_only=False):
  a = np.ones((128, 128), dtype)
  with pl.virtual_tpu(chip, timing_only=timing_only):
    return pl.pallas_call(_int_matmul, out_shape=pl.ShapeDtypeStruct((128, 128), jnp.int32))(a, a)


@pytest.mark.parametrize("timing_only", [False, True])
def test_int8_matmul_is_rejected_on_v4_like_mosaic(timing_only):
  with pytest.raises(UnsupportedError, match=r"test_chip_rules.py:\d+: matmul of int8 x int8 operands does "
                     r"not compile on TPU v4: .*'Unsupported matmul RHS type on target: vector<\.\.\.xi8>'.*"
                     r"Fix: widen the operands to bfloat16 .* or run on v5e, v5p, v6e.*"
                     r"in kernel '_int_matmul'"):
    _run_int_matmul("v4", np.int8, timing_only)


def test_int8_matmul_compiles_on_v5e_and_v4_takes_bf16():
  assert (np.asarray(_run_int_matmul("v5e", np.int8)) == 128).all()
  a = np.ones((128, 128), jnp.bfloat16)
  with pl.virtual_tpu("v4"):
    out = pl.pallas_call(_matmul_kernel, out_shape=pl.ShapeDtypeStruct((128, 128), jnp.float32))(a, a)
  assert (np.asarray(out) == 128).all()


def test_the_rejection_is_data_not_a_chip_name():
  import dataclasses
  relaxed = dataclasses.replace(hw.get_chip("v4"), mxu_rejected_operand_classes=frozenset())
  assert (np.asarray(_run_int_matmul(relaxed, np.int8)) == 128).all()
  strict = dataclasses.replace(hw.get_chip("v5e"), mxu_rejected_operand_classes=frozenset({("int8", "int8")}))
  with pytest.raises(UnsupportedError, match="does not compile on TPU v5e"):
    _run_int_matmul(strict, np.int8)


def test_the_modelled_compiler_is_the_one_the_v5e_data_recorded():
  # hw.COMPILER (what the pytest plugin's jtu.is_libtpu_at_least answers for) against the environment
  # records of the measured data it names
  data = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data"
  for name in ("v5e-limits-2026-12-05.jsonl", "v5e-numerics-2026-12-05.jsonl", "v5e-timing-2026-12-05.jsonl"):
    assert name in hw.COMPILER.source
    with open(data / name) as f:
      env = json.loads(f.readline())
    assert (env["libtpu_version"], env["jax_version"]) == (hw.COMPILER.libtpu_version, hw.COMPILER.jax_version)
  assert hw.libtpu_at_least("0.0.42.1") and hw.libtpu_at_least("0.0.42") and hw.libtpu_at_least("0.0.9")
  assert not hw.libtpu_at_least("0.0.45") and not hw.libtpu_at_least("0.0.42.2") and not hw.libtpu_at_least("0.1")
