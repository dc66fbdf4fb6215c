"""Parity kernels: pl.kernel over a TensorCoreMesh, mutable refs, emit_pipeline inside kernels."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ABSTRACT_MESH = True   # emit_pipeline asks for the TPU info; JAX needs a TPU abstract device on CPU

MESH = pltpu.TensorCoreMesh(axis_name="core", num_cores=1)


def _ints(shape, seed, dtype=np.float32):
  return np.random.default_rng(seed).integers(-8, 8, shape).astype(dtype)


def case_kernel_sync_copy_compute():
  @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32), mesh=MESH,
                     scratch_types=[pltpu.VMEM((64, 128), jnp.float32)])
  def f(x_hbm, o_hbm, buf):
    pltpu.sync_copy(x_hbm, buf)
    buf[...] = buf[...] * buf[...] - 3.0
    pltpu.sync_copy(buf, o_hbm)
  return f, (_ints((64, 128), 30),), None


def case_kernel_mutable_ref_in_place():
  def run(x):
    ref = jax.new_ref(x)

    @functools.partial(pl.kernel, out_type=(), mesh=MESH,
                       scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
    def bump(r_hbm, buf):
      pltpu.sync_copy(r_hbm.at[pl.ds(8, 8)], buf)
      buf[...] = buf[...] + 100.0
      pltpu.sync_copy(buf, r_hbm.at[pl.ds(8, 8)])
    bump(ref)
    return jax.freeze(ref)
  return run, (_ints((32, 128), 31),), None


def case_emit_pipeline_add():
  spec = pl.BlockSpec((64, 128), lambda i, j: (i, j))

  def inner(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + 2.0 * y_ref[...]

  @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct((256, 256), jnp.float32), mesh=MESH)
  def f(x_hbm, y_hbm, o_hbm):
    pltpu.emit_pipeline(inner, grid=(4, 2), in_specs=[spec, spec], out_specs=[spec])(x_hbm, y_hbm, o_hbm)
  return f, (_ints((256, 256), 32), _ints((256, 256), 33)), None


def case_emit_pipeline_matmul_accumulate():
  bm = bn = bk = 128

  def inner(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
      o_ref[...] = acc_ref[...]

  @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct((256, 256), jnp.float32), mesh=MESH,
                     scratch_types=[pltpu.VMEM((bm, bn), jnp.float32)])
  def f(x_hbm, y_hbm, o_hbm, acc):
    pltpu.emit_pipeline(
        lambda x, y, o: inner(x, y, o, acc), grid=(2, 2, 3),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=[pl.BlockSpec((bm, bn), lambda i, j, k: (i, j))])(x_hbm, y_hbm, o_hbm)
  return f, (_ints((256, 384), 34), _ints((384, 256), 35)), None


def case_emit_pipeline_in_pallas_call():
  # an outer pallas_call over row strips with HBM operands, an inner pipeline over column blocks
  spec = pl.BlockSpec((32, 128), lambda j: (0, j))

  def inner(x_ref, o_ref):
    o_ref[...] = jnp.maximum(x_ref[...], 0.0) * 3.0

  def kernel(x_hbm, o_hbm):
    i = pl.program_id(0)
    pltpu.emit_pipeline(inner, grid=(3,), in_specs=[spec], out_specs=[spec])(
        x_hbm.at[pl.ds(i * 32, 32)], o_hbm.at[pl.ds(i * 32, 32)])
  x = _ints((96, 384), 36)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,),
                     in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     out_specs=pl.BlockSpec(memory_space=pl.ANY))
  return f, (x,), None


def case_emit_pipeline_squeezed_batch():
  spec = pl.BlockSpec((None, 32, 128), lambda b, i: (b, i, 0))

  def inner(x_ref, o_ref):
    o_ref[...] = x_ref[...] - 1.0

  @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct((3, 64, 128), jnp.float32), mesh=MESH)
  def f(x_hbm, o_hbm):
    pltpu.emit_pipeline(inner, grid=(3, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
  return f, (_ints((3, 64, 128), 37),), None
