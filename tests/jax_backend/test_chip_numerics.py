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


def _recorded(name):
  """(inputs x, chip output) of a recorded elementwise probe."""
  rec = next(r for r in nc.load(str(DATA)) if r["name"] == name)
  dtypes = rec.get("dtypes") or {}
  x = nc.decode(rec["inputs"]["x"], dtypes.get("x"))
  return x, (None if rec.get("output") is None else nc.decode(rec["output"], dtypes.get("output"))), rec


def _unary_kernel(fn, x):
  spec = pl.BlockSpec(memory_space=pltpu.VMEM)
  call = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., fn(x_ref[...])),
                        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[spec], out_specs=spec)
  with palace.jax.virtual_tpu("v5e"):
    return np.asarray(jax.jit(call)(x))


def test_exp2_is_its_own_function_not_exp_of_x_ln2():
  # the chip's exp2(-126) is the smallest normal (exp(x * ln2) falls just below it and flushes to 0)
  x, chip, _ = _recorded("exp2_f32")
  out = _unary_kernel(jnp.exp2, x)
  at = np.flatnonzero(x.ravel() == -126.0)
  assert at.size and (chip.ravel()[at] == np.finfo(np.float32).tiny).all()
  np.testing.assert_array_equal(out.ravel()[at], chip.ravel()[at])


def test_log1p_keeps_tiny_x_and_reads_denormals_as_zero():
  # the chip: log1p(x) = x for tiny normal x (log(1 + x) gives 0); denormal inputs read as signed zero
  x, chip, _ = _recorded("log1p_f32")
  tiny = (np.abs(x) < 1e-8) & (np.abs(x) >= np.finfo(np.float32).tiny)   # (x*x/2 below half an ulp)
  assert tiny.any() and (chip[tiny] == x[tiny]).all()
  out = _unary_kernel(jnp.log1p, x)
  np.testing.assert_array_equal(out[tiny], chip[tiny])
  import palace.numpy as pnp  # noqa: PLC0415 -- palace's own language: the same rule outside palace.jax
  import palace as ppl  # noqa: PLC0415
  den = np.array([1e-45, -1e-45, 3e-39, 5.85e-8] * 32 * 8, np.float32).reshape(8, 128)
  got = ppl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., pnp.log1p(x_ref[...])),
                        out_shape=ppl.ShapeDtypeStruct(den.shape, den.dtype))(den)
  want = np.log1p(np.where(np.abs(den) < np.finfo(np.float32).tiny, den * 0, den))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))   # (signed zeros too)


def test_expm1_is_rejected_in_a_kernel_as_the_chip_rejects_it():
  _, chip, rec = _recorded("expm1_f32")
  assert chip is None and "Unimplemented primitive in Pallas TPU lowering for tc: expm1" in rec["error"]
  with pytest.raises(NotImplementedError, match=r"jnp\.expm1 of a float32 value of shape \(8, 128\) .*no "
                                                r"expm1 .*for tc: expm1.*Fix: compute jnp\.exp\(x\) - 1"):
    _unary_kernel(jnp.expm1, np.zeros((8, 128), np.float32))
  import palace.numpy as pnp  # noqa: PLC0415 -- palace's own front end rejects it too
  import palace as ppl  # noqa: PLC0415
  with pytest.raises(ppl.UnsupportedError, match=r"jnp\.expm1 .*Fix: compute"):
    ppl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., pnp.expm1(x_ref[...])),
                    out_shape=ppl.ShapeDtypeStruct((8, 128), np.float32))(np.zeros((8, 128), np.float32))
  np.testing.assert_allclose(pnp.expm1(np.float32(1e-3)), np.expm1(np.float32(1e-3)))   # host: computed
