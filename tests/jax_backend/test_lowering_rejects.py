"""What Mosaic rejects from a kernel's types is raised while palace lowers the kernel (registry
entries' `rejects`, CompilerParams checks), so the caller gets palace's own error type at the call, as
JAX on a TPU raises Mosaic's lowering errors there, not XLA's JaxRuntimeError around palace's host
callback (which an error raised while the kernel runs still becomes)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import UnsupportedError, UsageError


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint32])
def test_an_unsigned_matmul_is_refused_at_lowering_as_not_implemented(dtype):
  lhs, rhs = jnp.zeros((32, 256), dtype), jnp.zeros((256, 128), dtype)

  def kernel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...] @ b_ref[...]
  with pj.virtual_tpu("v5e"), pytest.raises(NotImplementedError,
                                            match="Unsigned integer dtype.*dot_general.*matmul") as e:
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), dtype))(lhs, rhs)
  assert isinstance(e.value, UnsupportedError)
  assert "kernel line test_lowering_rejects.py" in str(e.value)


def test_an_invalid_side_effect_type_is_a_value_error_at_lowering():
  x = jnp.ones((8, 128), jnp.float32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  f = jax.jit(lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct.like(x),
                                       compiler_params=pltpu.CompilerParams(has_side_effects="bad"))(x))
  with pj.virtual_tpu("v5e"), pytest.raises(UsageError, match="Invalid side effect type: 'bad'"):
    f(x)
  g = jax.jit(lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct.like(x),
                                       compiler_params=pltpu.CompilerParams(
                                           has_side_effects=pltpu.SideEffectType.SIDE_EFFECTING))(x))
  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(g(x), x)


def test_an_error_while_the_kernel_runs_still_reaches_the_caller_wrapped_by_xla():
  x = jnp.ones((8, 128), jnp.float32)

  def kernel(i_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(i_ref[0], 8), :]   # an out-of-bounds start, known only at run time
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match="OutOfBoundsError") as e:
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                   in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec()])(
        jnp.array([4], jnp.int32), x)
  assert type(e.value).__name__ == "JaxRuntimeError"
