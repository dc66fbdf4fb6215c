"""Inputs behave as JAX arrays: a launch never modifies the caller's arrays unless they are aliased
(and then the result is a new array). Every kind of write into an input ref is tried."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

SHAPE = (8, 128)


def _x():
  return np.arange(8 * 128, dtype=np.float32).reshape(SHAPE)


def _kernel(body, n_out=1, scratch=()):
  out = pl.ShapeDtypeStruct(SHAPE, np.float32)
  return pl.kernel(body, out_type=out if n_out == 1 else [out] * n_out,
                   mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=list(scratch))


@pytest.mark.parametrize("policy", ["eager", "on_wait", "random"])
def test_kernel_dma_into_its_input_leaves_the_callers_array(policy):
  x, keep = _x(), _x()

  def body(x_hbm, o_hbm, buf):
    buf[...] = jnp.full(SHAPE, jnp.nan, jnp.float32)
    pltpu.sync_copy(x_hbm, o_hbm)
    pltpu.sync_copy(buf, x_hbm)           # overwrite the input ref: the kernel's own copy only

  with pl.virtual_tpu("v5e", dma_policy=policy):
    out = _kernel(body, scratch=[pltpu.VMEM(SHAPE, jnp.float32)])(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, keep)


def test_kernel_reads_its_own_write_to_an_input():
  x, keep = _x(), _x()

  def body(x_hbm, o_hbm, buf):
    buf[...] = jnp.full((2, 128), 3.0, jnp.float32)
    pltpu.sync_copy(buf, x_hbm.at[2:4])   # partial write into the input
    pltpu.sync_copy(x_hbm, o_hbm)         # the kernel sees it

  with pl.virtual_tpu("v5e"):
    out = _kernel(body, scratch=[pltpu.VMEM((2, 128), jnp.float32)])(x)
  np.testing.assert_array_equal(x, keep)
  want = keep.copy()
  want[2:4] = 3.0
  np.testing.assert_array_equal(out, want)


def test_async_copy_into_input_and_second_launch_sees_original():
  x, keep = _x(), _x()

  def body(x_hbm, o_hbm, buf, sem):
    buf[...] = jnp.zeros(SHAPE, jnp.float32) - 1.0
    c = pltpu.make_async_copy(buf, x_hbm, sem)
    c.start()
    c.wait()
    pltpu.sync_copy(x_hbm, o_hbm)

  k = _kernel(body, scratch=[pltpu.VMEM(SHAPE, jnp.float32), pltpu.SemaphoreType.DMA])
  with pl.virtual_tpu("v5e"):
    a = k(x)
    b = k(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(a, -np.ones(SHAPE, np.float32))
  np.testing.assert_array_equal(b, a)


def test_pallas_call_store_into_an_any_input_ref():
  x, keep = _x(), _x()

  def kernel(x_hbm, o_ref, buf):
    buf[...] = jnp.zeros(SHAPE, jnp.float32)
    pltpu.sync_copy(buf, x_hbm)
    pltpu.sync_copy(x_hbm, buf)
    o_ref[...] = buf[...] + 1.0

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32),
                     in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     scratch_shapes=[pltpu.VMEM(SHAPE, jnp.float32)])
  with pl.virtual_tpu("v5e"):
    out = f(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, np.ones(SHAPE, np.float32))


def test_pallas_call_blocked_input_ref_store_does_not_reach_the_caller():
  x, keep = _x(), _x()

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    x_ref[...] = jnp.zeros(SHAPE, jnp.float32)   # VMEM block of the input: never written back

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32))
  with pl.virtual_tpu("v5e"):
    out = f(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, keep)


def test_scalar_prefetch_operand_is_not_modified():
  idx = np.array([1, 0], np.int32)
  keep_idx = idx.copy()
  x, keep = _x(), _x()

  def kernel(idx_ref, x_hbm, o_ref, buf):
    idx_ref[0] = 7                        # SMEM copy of the prefetch operand
    pltpu.sync_copy(x_hbm, buf)
    o_ref[...] = buf[...]

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(1,),
                         in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                         out_specs=pl.BlockSpec(SHAPE, lambda i, s: (0, 0)),
                         scratch_shapes=[pltpu.VMEM(SHAPE, jnp.float32)]))
  with pl.virtual_tpu("v5e"):
    out = f(idx, x)
  np.testing.assert_array_equal(idx, keep_idx)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, keep)


def test_aliased_input_returns_a_new_array_and_keeps_the_callers():
  x, keep = _x(), _x()

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32),
                     input_output_aliases={0: 0})
  with pl.virtual_tpu("v5e"):
    out = f(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, 2 * keep)


def test_read_only_caller_array_is_accepted_and_written_by_copy():
  x = _x()
  x.setflags(write=False)

  def body(x_hbm, o_hbm, buf):
    buf[...] = jnp.ones(SHAPE, jnp.float32)
    pltpu.sync_copy(buf, x_hbm)
    pltpu.sync_copy(x_hbm, o_hbm)

  with pl.virtual_tpu("v5e"):
    out = _kernel(body, scratch=[pltpu.VMEM(SHAPE, jnp.float32)])(x)
  np.testing.assert_array_equal(out, np.ones(SHAPE, np.float32))
  np.testing.assert_array_equal(x, _x())


def test_shard_map_operands_are_not_modified():
  n = 2
  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  keep = x.copy()

  def per_chip(xs):
    def body(x_hbm, o_hbm, buf):
      buf[...] = jnp.full(SHAPE, -5.0, jnp.float32)
      pltpu.sync_copy(x_hbm, o_hbm)
      pltpu.sync_copy(buf, x_hbm)

    return _kernel(body, scratch=[pltpu.VMEM(SHAPE, jnp.float32)])(xs)

  with pl.virtual_tpu("v5e", num_chips=n):
    mesh = pl.make_mesh((n,), ("x",))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, keep)


def test_shard_map_replicated_operand_is_not_modified():
  n = 2
  x = _x()
  keep = x.copy()

  def per_chip(xs):
    def body(x_hbm, o_hbm, buf):
      buf[...] = jnp.full(SHAPE, -5.0, jnp.float32)
      pltpu.sync_copy(buf, x_hbm)
      pltpu.sync_copy(x_hbm, o_hbm)

    return _kernel(body, scratch=[pltpu.VMEM(SHAPE, jnp.float32)])(xs)

  with pl.virtual_tpu("v5e", num_chips=n):
    mesh = pl.make_mesh((n,), ("x",))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(), out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(x, keep)
  np.testing.assert_array_equal(out, np.full((n * 8, 128), -5.0, np.float32))
