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


def test_a_dma_of_bool_refs_is_refused_at_lowering_but_bool_blocks_are_not():
  """Mosaic: 'DMAs with bool dtypes are not supported.' (JAX's test_bool_dma_not_implemented); a
  pallas_call's bool VMEM blocks still carry the mask."""
  mask = np.arange(8 * 128).reshape(8, 128) % 3 == 0

  def dma(x_hbm, o_hbm):
    pl.run_scoped(lambda sem: pltpu.async_copy(x_hbm, o_hbm, sem).wait(), pltpu.SemaphoreType.DMA)
  with pj.virtual_tpu("v5e"), pytest.raises(UnsupportedError, match=r"DMAs with bool dtypes are not "
                                            r"supported. \(palace.jax: the src of dma_start"):
    pl.pallas_call(dma, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                   out_specs=pl.BlockSpec(memory_space=pl.ANY),
                   out_shape=jax.ShapeDtypeStruct(mask.shape, jnp.bool_))(mask)

  def where(m_ref, o_ref):
    o_ref[...] = jnp.where(m_ref[...], 1, 2)
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(where, out_shape=jax.ShapeDtypeStruct(mask.shape, jnp.int32))(mask)
  np.testing.assert_array_equal(np.asarray(got), np.where(mask, 1, 2))


def test_a_dma_of_a_key_ref_is_not_taken_for_a_bool_one():
  """The bool-DMA check reads a ref's dtype without NumPy (a PRNG key's has none): a key copied with
  sync_copy keeps its key data (JAX's test_output_physical_key)."""
  key = pltpu.to_pallas_key(jax.random.key(0, impl="threefry2x32"))

  def body(x_ref, o_ref):
    pltpu.sync_copy(x_ref, o_ref)
  with pj.virtual_tpu("v5e"):
    y = jax.jit(lambda x: pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct((), jax.typeof(x).dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM))(x))(key)
  np.testing.assert_array_equal(jax.random.key_data(y), jax.random.key_data(key))


def test_blocks_over_the_scoped_vmem_limit_are_refused_when_compiled_as_the_compiler_refuses_them():
  """The TPU compiler refuses a kernel whose pipelined blocks exceed the scoped VMEM limit when it
  compiles it (`.lower().compile()`, JAX's test_automatic_single_buffering): palace.jax refuses it
  there too, with palace's ResourceError that is also JAX's JaxRuntimeError. A window fetched once
  (single-buffered) fits; one that moves with the grid (double-buffered, 2 x 10 MiB) does not."""
  from palace import ResourceError
  x = jax.ShapeDtypeStruct((40 * 2**20,), jnp.int8)
  window = 10 * 2**20

  def call(index_map):
    return jax.jit(pl.pallas_call(lambda *_: None, grid=(4, 1), out_shape=x,
                                  out_specs=pl.BlockSpec((window,), index_map)))

  with pj.virtual_tpu("v5e"):
    call(lambda i, j: (j,)).lower().compile()
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"20.00 MiB of pipelined blocks requested.*scoped "
                                                         r"VMEM limit is 16.00 MiB") as e:
      call(lambda i, j: (i + j,)).lower().compile()
  assert isinstance(e.value, ResourceError)
