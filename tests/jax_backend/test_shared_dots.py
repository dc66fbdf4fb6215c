"""The shared-dots diagnostic (VirtualTPU(shared_dots=True), PALACE_JAX_SHARED_DOTS=1): every float dot,
in palace's kernels and in XLA:CPU's code outside them (jax/shared_dots.py), summed by one rule
(lang/mxu.shared_product: exact per 128 of K, chunks added in float32 in order), float32 operands
rounded to bfloat16 at DEFAULT precision on both sides as on the chip. Not the chip's numerics: every
report made under it says so (the environment switch: test_exact_f32_dots.py)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

import palace
import palace.jax
from palace._src.jax.activation import activate_from_env

# x @ y over K = 384 = three chunks of 128 whose sums are 2^24, 1 and 1 (all operands bfloat16 values,
# every chunk sum exact): added in float32 in order, 2^24 + 1 ties to 2^24, and again; the exact total,
# rounded once, is 2^24 + 2. So the rule's value is 2^24, whatever order a BLAS sums a chunk in.
X = np.ones((8, 384), np.float32)
Y = np.zeros((384, 128), np.float32)
Y[:128] = 2.0 ** 17
Y[128] = Y[256] = 1.0
RULE = np.full((8, 128), 2.0 ** 24, np.float32)
# 1 + 2^-12 is not a bfloat16 (it rounds to 1); sums of these are exact in float32
A = np.full((8, 512), 1 + 2.0 ** -12, np.float32)
B = np.ones((512, 256), np.float32)


def _k_tiled(x, y):
  """acc += jnp.dot(x_k, y_k) over K blocks of 128 (palace defers such sums unless the diagnostic is on)."""
  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
                        grid=(x.shape[1] // 128,),
                        in_specs=[pl.BlockSpec((x.shape[0], 128), lambda k: (0, k)),
                                  pl.BlockSpec((128, y.shape[1]), lambda k: (k, 0))],
                        out_specs=pl.BlockSpec((x.shape[0], y.shape[1]), lambda k: (0, 0)))(x, y)


def _xla_dot(x, y, precision=None):
  return jax.jit(lambda a, b: jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32))(x, y)


def test_the_kernel_and_xla_cpu_sum_by_one_rule_under_the_diagnostic():
  with palace.jax.virtual_tpu("v5e", shared_dots=True) as tpu:
    kernel = np.asarray(jax.jit(_k_tiled)(X, Y))
    outside = np.asarray(_xla_dot(X, Y))
    bf16 = np.asarray(_xla_dot(X.astype(jnp.bfloat16), Y.astype(jnp.bfloat16)))
  np.testing.assert_array_equal(kernel, RULE)
  np.testing.assert_array_equal(outside, RULE)
  np.testing.assert_array_equal(bf16, RULE)
  report = tpu.reports[-1]
  assert report.shared_dots and report.as_dict()["shared_dots"]
  assert "DIAGNOSTIC shared_dots: not the chip's numerics" in str(report).splitlines()[0]
  assert "shared_dots=True (a diagnostic" in repr(tpu)


def test_xla_cpu_dots_round_as_the_chip_at_default_precision_only_under_the_diagnostic():
  exact = np.full((8, 256), 512 * (1 + 2.0 ** -12), np.float32)
  with palace.jax.virtual_tpu("v5e", shared_dots=True):
    default = np.asarray(_xla_dot(A, B))
    highest = np.asarray(_xla_dot(A, B, jax.lax.Precision.HIGHEST))
    ints = np.asarray(jax.jit(jnp.dot)(np.full((4, 300), 3, np.int32), np.full((300, 2), 5, np.int32)))
  np.testing.assert_array_equal(default, np.full((8, 256), 512.0, np.float32))   # bf16(1 + 2^-12) = 1
  np.testing.assert_array_equal(highest, exact)
  np.testing.assert_array_equal(ints, np.full((4, 2), 4500, np.int32))            # JAX's own lowering
  with palace.jax.virtual_tpu("v5e"):   # off: XLA:CPU's own dot, float32 operands unrounded
    np.testing.assert_array_equal(np.asarray(_xla_dot(A, B)), exact)


def test_one_diagnostic_at_a_time_and_bad_environment_values_are_usage_errors():
  with pytest.raises(palace.UsageError, match=r"exact_f32_dots=True, shared_dots=True.*Fix: pass one"):
    palace.jax.virtual_tpu("v5e", exact_f32_dots=True, shared_dots=True).__enter__()
  with pytest.raises(palace.UsageError, match="PALACE_JAX_SHARED_DOTS='yes': expected 1"):
    activate_from_env({"PALACE_JAX": "v5e", "PALACE_JAX_SHARED_DOTS": "yes"})

