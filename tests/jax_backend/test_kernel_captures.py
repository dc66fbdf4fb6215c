"""A pl.kernel body that closes over traced scalars (JAX passes them as value operands of mpmd_map, not
refs): staged in SMEM and read before the body (jax/launch.py plan_mpmd_map)."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj


def test_a_kernel_closing_over_a_traced_index_and_scalar():
  mesh = pltpu.TensorCoreMesh(axis_name="x", num_cores=1)

  @jax.jit
  def f(x, i, bias):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((1, *x.shape[1:]), jnp.int32), mesh=mesh,
               scratch_types=[pltpu.VMEM(x.shape[1:], jnp.int32)])
    def kernel(x_ref, out_ref, buf):
      pltpu.sync_copy(x_ref.at[i], buf)
      buf[...] += bias
      pltpu.sync_copy(buf, out_ref.at[0])
    return kernel(x)

  x = jnp.arange(4 * 8 * 128, dtype=jnp.int32).reshape((4, 8, 128))
  bias = jnp.int32(7)
  with pj.virtual_tpu("v5e"):
    for i in range(4):
      np.testing.assert_array_equal(np.asarray(f(x, i, bias))[0], np.asarray(x[i] + bias))
