"""The host-math diagnostic (VirtualTPU(host_math=True), PALACE_JAX_HOST_MATH=1): a kernel's
transcendentals evaluated by XLA:CPU (lang/host_math.py), as a test's reference outside the kernel is,
instead of palace's rule of the chip's. Not the chip's numerics: every report made under it says so (the
environment switch: test_exact_f32_dots.py)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

import palace
import palace.jax
from palace._src.jax.activation import activate_from_env

X = np.linspace(-10, 10, 8 * 128, dtype=np.float32).reshape(8, 128)
POSITIVE = np.linspace(0.01, 20, 8 * 128, dtype=np.float32).reshape(8, 128)
UNIT = np.linspace(-0.999, 0.999, 8 * 128, dtype=np.float32).reshape(8, 128)
# palace's function, JAX's, the operand: palace's rule of the chip's function is NumPy's
CASES = {"exp": (np.exp, jnp.exp, X), "tanh": (np.tanh, jnp.tanh, X), "log": (np.log, jnp.log, POSITIVE),
         "sin": (np.sin, jnp.sin, X)}


def _unary(fn):
  def kernel(x_ref, o_ref):
    o_ref[...] = fn(x_ref[...])
  return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _xla_cpu(fn, x):
  return np.asarray(jax.jit(fn)(x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_kernels_transcendental_is_xla_cpus_under_the_diagnostic_and_the_chips_rule_without(name):
  chip_rule, fn, x = CASES[name]
  with palace.jax.virtual_tpu("v5e", host_math=True) as tpu:
    under = np.asarray(jax.jit(_unary(fn))(x))
    reference = _xla_cpu(fn, x)          # XLA:CPU's, outside the kernel
  with palace.jax.virtual_tpu("v5e") as chip:
    without = np.asarray(jax.jit(_unary(fn))(x))
  np.testing.assert_array_equal(under, reference)            # bit for bit
  np.testing.assert_array_equal(without, chip_rule(x))        # palace's rule, unchanged
  assert tpu.reports[-1].host_math and not chip.reports[-1].host_math
  # the same ops charged: the diagnostic changes values, not timing
  assert tpu.reports[-1].device_cycles == chip.reports[-1].device_cycles


def test_erf_inv_and_a_bf16_chain_are_xla_cpus_under_the_diagnostic():
  """erf_inv (jax.random.normal in a kernel: Mosaic's polynomial, charged op by op) takes XLA:CPU's
  value; a bfloat16 exp(tanh(z)) takes XLA:CPU's function of each op."""
  def chain(z):
    return jnp.exp(jnp.tanh(z))
  z = X.astype(jnp.bfloat16)
  with palace.jax.virtual_tpu("v5e", host_math=True) as tpu:
    erf_inv = np.asarray(jax.jit(_unary(lax.erf_inv))(UNIT))
    bf16 = np.asarray(jax.jit(_unary(chain))(z))
    erf_inv_ref = _xla_cpu(lax.erf_inv, UNIT)
    bf16_ref = np.asarray(jax.jit(lambda a: jnp.exp(jnp.tanh(a)), compiler_options={
        "xla_allow_excess_precision": False})(z))
  np.testing.assert_array_equal(erf_inv, erf_inv_ref)
  np.testing.assert_array_equal(bf16.view(np.uint16), bf16_ref.view(np.uint16))
  with palace.jax.virtual_tpu("v5e") as chip:
    np.asarray(jax.jit(_unary(lax.erf_inv))(UNIT))
  assert tpu.reports[0].device_cycles == chip.reports[0].device_cycles   # the polynomial's charges


def test_every_report_and_the_virtual_tpu_say_so():
  with palace.jax.virtual_tpu("v5e", host_math=True) as tpu:
    jax.jit(_unary(jnp.exp))(X).block_until_ready()
  report = tpu.reports[-1]
  assert report.as_dict()["host_math"]
  assert "DIAGNOSTIC host_math: not the chip's numerics" in str(report).splitlines()[0]
  assert "transcendentals (exp, log, tanh, erf_inv, ...) were XLA:CPU's" in str(report)
  assert "host_math=True (a diagnostic" in repr(tpu)
  with pytest.raises(palace.UsageError, match="host_math"):
    palace.jax.virtual_tpu("v5e", host_math="yes").__enter__()


def test_a_bad_environment_value_is_a_usage_error():
  with pytest.raises(palace.UsageError, match="PALACE_JAX_HOST_MATH='yes': expected 1"):
    activate_from_env({"PALACE_JAX": "v5e", "PALACE_JAX_HOST_MATH": "yes"})


def test_palace_own_kernels_take_the_diagnostic_too():
  import palace.numpy as pnp

  def kernel(x_ref, o_ref):
    o_ref[...] = pnp.tanh(x_ref[...])
  call = palace.pallas_call(kernel, out_shape=palace.ShapeDtypeStruct(X.shape, np.float32))
  with palace.virtual_tpu("v5e", host_math=True) as tpu:
    under = np.asarray(call(X))
  np.testing.assert_array_equal(under, _xla_cpu(jnp.tanh, X))
  assert tpu.reports[-1].host_math
