"""Kernels that more than one palace.jax test runs (imported by the test modules, not collected)."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _skip_kernel(flags_ref, x_ref, o_ref):
  # control flow from a scalar-prefetch operand: only flagged blocks are computed
  @pl.when(flags_ref[pl.program_id(0)] != 0)
  def _():
    y = jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.float32)
    for _ in range(64):   # value-neutral vector work, so that a computed block costs more than the
      y = y + 0.0 * jnp.tanh(y)   # step's DMA wait hides (the flags must change the modelled time)
    o_ref[...] = y

  @pl.when(flags_ref[pl.program_id(0)] == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)


@jax.jit
def skip_matmul(flags, x):
  """Per 128-row block of `x` (512, 128): x_block @ x_block where flags[block] != 0, else zeros."""
  return pl.pallas_call(
      _skip_kernel, out_shape=jax.ShapeDtypeStruct((4 * 128, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(4,),
          in_specs=[pl.BlockSpec((128, 128), lambda i, f: (i, 0))],
          out_specs=pl.BlockSpec((128, 128), lambda i, f: (i, 0))))(flags, x)
