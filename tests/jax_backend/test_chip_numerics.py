"""palace.jax against a real TPU v5e's recorded outputs (benchmarks/hw/data/v5e-numerics-2026-12-05.jsonl,
JAX 0.10.2): every probe in `numerics_compare.BOUNDS` is bit-identical, within its stated bound, or
rejected as the chip rejects it (docs/numerics.md). Dot and sum bounds are in units of the float32
summation error bound of their terms, so they hold whatever order the host BLAS sums in."""
import os
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax
from benchmarks.hw import numerics_compare as nc

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data" / "v5e-numerics-2026-12-05.jsonl"


@pytest.fixture(scope="module")
def results():
  records = nc.load(str(DATA))
  return {r["name"]: (r, rec) for r, rec in zip(nc.compare(records), records)}


def test_every_recorded_probe_has_a_bound_with_a_reason(results):
  assert set(results) == set(nc.BOUNDS)
  assert all(reason for _, _, reason in nc.BOUNDS.values())


@pytest.mark.parametrize("name", sorted(n for n, (k, _, _) in nc.BOUNDS.items() if k != "gap"))
def test_probe_matches_the_chip(results, name):
  kind, bound, reason = nc.BOUNDS[name]
  res, _ = results[name]
  if kind == "identical":
    assert res["status"] == "identical", (res, reason)
  elif kind == "both errors":
    assert res["status"] == "both errors", (res, reason)
    assert "UnsupportedError" in res["palace_error"] and "Fix:" in res["palace_error"]
  else:
    assert res["outcome"] in ("identical", "within bound"), (res, reason)


def _rule_error(name, rec, out):
  """max |out - exact product of the operands the MXU reads| / (u sum|a_k b_k|)."""
  a, b = nc._operands(name, rec)
  return float((np.abs(out.astype(np.float64) - a @ b) / (nc.U24 * (np.abs(a) @ np.abs(b)))).max())


@pytest.mark.parametrize("name", sorted(n for n, (k, _, _) in nc.BOUNDS.items() if k == "dot"))
def test_dot_rule_chip_and_palace_both_follow_it(results, name):
  """The rule (bf16-rounded operands at DEFAULT, f32 at HIGHEST; exact products; f32 sums): the chip is
  within 8 u x sum|terms| of it (measured <= 4.9), palace within K u (any summation order)."""
  res, rec = results[name]
  chip = nc.decode(rec["output"], rec["dtypes"]["output"])
  assert _rule_error(name, rec, chip) <= 8
  assert res["scaled"] <= 1.0
  if ("none" in name or "default" in name) and "bf16" not in name:   # DEFAULT f32: far from the f32 product
    exact = nc._operands(name.replace("none", "highest").replace("default", "highest"), rec)
    assert float((np.abs(chip - exact[0] @ exact[1]) / (nc.U24 * (np.abs(exact[0]) @ np.abs(exact[1])))).max()) > 1e3


def _kernel(fn, *arrays, out_dtype=jnp.float32):
  spec = pl.BlockSpec(memory_space=pltpu.VMEM)

  def kernel(a_ref, b_ref, o_ref):
    o_ref[...] = fn(a_ref[...], b_ref[...]).astype(o_ref.dtype)

  m, n = arrays[0].shape[0], arrays[1].shape[-1]
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
                        in_specs=[spec, spec], out_specs=spec)
  with palace.jax.virtual_tpu("v5e"):
    return np.asarray(jax.jit(call)(*arrays))


P = jax.lax.Precision


@pytest.mark.parametrize("fn, dtypes, match", [
    (lambda a, b: jnp.dot(a, b, precision=P.HIGH), (np.float32, np.float32), r"precision=HIGH .*Fix: use"),
    (lambda a, b: jnp.dot(a, b, precision=(P.HIGHEST, P.DEFAULT)), (np.float32, np.float32),
     r"Per-operand dot precision unsupported.*Fix: pass one precision"),
    (lambda a, b: jnp.dot(a, b), (jnp.bfloat16, jnp.bfloat16),
     r"bfloat16 result .*acc to be 32-bit.*Fix: pass preferred_element_type=jnp.float32"),
    (lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.int32), (np.uint8, np.uint8),
     r"dtype uint8 .*unsigned integer.*Fix: cast"),
    (lambda a, b: jnp.dot(a, b, precision=P.HIGHEST, preferred_element_type=jnp.float32),
     (np.float32, jnp.bfloat16), r"HIGHEST on float32 x bfloat16.*Bad rhs type.*Fix: cast"),
])
def test_dot_forms_the_chip_rejects_raise(fn, dtypes, match):
  a = np.ones((8, 128), dtypes[0])
  b = np.ones((128, 128), dtypes[1])
  with pytest.raises(NotImplementedError, match=match) as e:
    _kernel(fn, a, b)
  assert isinstance(e.value, palace.PalaceError) and "TPU v5e" in str(e.value)
  assert "kernel line test_chip_numerics.py:" in str(e.value)


def test_default_dot_rounds_float32_operands_to_bf16_and_highest_does_not():
  # products and sums exact in f32: the only rounding is the operands' (1 + 2^-12 is not a bf16)
  a = np.full((8, 128), 1 + 2.0 ** -12, np.float32)
  b = np.ones((128, 128), np.float32)
  out = _kernel(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32), a, b)
  np.testing.assert_array_equal(out, np.full((8, 128), 128.0, np.float32))
  out = _kernel(lambda x, y: jnp.dot(x, y, precision=P.HIGHEST), a, b)
  np.testing.assert_array_equal(out, np.full((8, 128), 128 * (1 + 2.0 ** -12), np.float32))
