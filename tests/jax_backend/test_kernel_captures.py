"""pl.kernel operands that are not HBM refs (jax/launch.py plan_mpmd_map): traced scalars the body closes
over (value operands of mpmd_map) are staged in SMEM and read before the body; a JAX mutable ref typed
SMEM/VMEM is staged there and copied back after the body."""
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


def test_a_mutable_smem_ref_keeps_its_value_across_kernels():
  # pl.empty_ref_like(pltpu.SMEM(...)) handed to two pl.kernel launches: each body gets an SMEM copy
  # (scalar stores, which HBM would refuse), written back after it (a Stage with write_back)
  mesh = pltpu.TensorCoreMesh(axis_name="core", num_cores=1)

  @jax.jit
  def f():
    y_ref = pl.empty_ref_like(pltpu.SMEM((8,), jnp.int32))

    @pl.kernel(mesh=mesh, out_type=())
    def first():
      for i in range(8):
        y_ref[i] = i * i
    first()

    @pl.kernel(mesh=mesh, out_type=())
    def second():
      for i in range(8):
        y_ref[i] = y_ref[i] + 1
    second()
    return y_ref[...]
  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(f()), np.arange(8) ** 2 + 1)
