"""Semaphores as launch operands or results under palace.jax (issue 37: the callback used to fail inside
JAX with "unexpected input: dtype=dma_sem")."""
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj


def test_a_semaphore_carried_out_of_a_launch_is_refused_by_name():
  """An async copy started in one pallas_call and waited in a later one (the launch returns its DMA
  semaphore): palace's copies live within one launch, so it refuses, naming the result."""
  def start(x_ref, o_ref, sem):
    pltpu.make_async_copy(x_ref, o_ref, sem).start()

  call = pl.pallas_call(
      start, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
      out_specs=(pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
      out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())))
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"pallas_call .start. result 1 is a semaphore "
                                            r"\(dma_sem\).*not covered.*start and wait the copy"):
    jax.jit(call)(jnp.ones((8, 128), jnp.float32))
