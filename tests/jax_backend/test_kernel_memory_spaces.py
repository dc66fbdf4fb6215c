"""Launch operands and results that live in VMEM or SMEM under palace.jax (issue 37, session 20): a
grid-free pallas_call's VMEM result aliased to its input is one buffer with it, JAX mutable refs in
SMEM / VMEM handed to pl.kernel are staged and written back, and pl.kernel results typed pltpu.VMEM
are computed in VMEM. Each against a NumPy reference."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import UnsupportedError
from async_kernels import ANY, DMA_SEM, SEM, _done, _run_kernel, _x, copy_between_kernels


VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


def test_an_async_copy_into_an_output_xla_places_in_vmem_is_waited_on_the_same_buffer():
  """JAX's async copy into VMEM: the start's result lives in VMEM (out_shape=pltpu.VMEM(...)); the
  wait's kernel takes it with a VMEM BlockSpec aliased to its own VMEM result and writes nothing.
  A grid-free kernel's refs are the buffers themselves, so the result is what the copy put there
  (before, the wait's output block, never written, was written back: NaN)."""
  def start(x_ref, _aliased, o_ref, sem):
    pltpu.make_async_copy(x_ref, o_ref, sem).start()

  @jax.jit
  def f(x):
    s = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, sem = pl.pallas_call(start, out_shape=(s, pltpu.VMEM(x.shape, x.dtype), DMA_SEM), in_specs=[ANY],
                                 out_specs=(ANY, VMEM, SEM), input_output_aliases={0: 0})(x)
    return pl.pallas_call(_done, out_shape=pltpu.VMEM(x.shape, x.dtype), in_specs=[ANY, VMEM, SEM],
                          out_specs=VMEM, input_output_aliases={1: 0})(x, out, sem)

  x = _x((8, 128))
  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(f(x)), x)


def test_a_vmem_result_aliased_to_its_input_keeps_what_the_kernel_does_not_write():
  def k(x_ref, o_ref):
    o_ref[:8] = x_ref[8:] * 2

  call = pl.pallas_call(k, out_shape=pltpu.VMEM((16, 128), jnp.float32), in_specs=[VMEM], out_specs=VMEM,
                        input_output_aliases={0: 0})
  x = _x((16, 128))
  with pj.virtual_tpu("v5e"):
    got = np.asarray(jax.jit(call)(x))
  np.testing.assert_array_equal(got, np.concatenate([x[8:] * 2, x[8:]]))


def test_an_smem_ref_kept_across_kernels_and_copied_out_asynchronously():
  """A JAX mutable ref in SMEM (pl.empty_ref_like(pltpu.SMEM(...))) handed to pl.kernels is staged in
  SMEM around each body and written back (before, the kernel got the HBM buffer and its scalar stores
  were refused); a later pair of kernels copies it out with a semaphore ref carried between them."""
  @jax.jit
  def f():
    y_ref = pl.empty_ref_like(pltpu.SMEM((8,), jnp.int32))

    @_run_kernel
    def _():
      for i in range(8):
        y_ref[i] = i * i

    @_run_kernel
    def _():
      for i in range(8):
        y_ref[i] = y_ref[i] + 1

    out_ref = pl.empty_ref_like(pltpu.HBM((8,), jnp.int32))
    copy_between_kernels(y_ref, out_ref, pl.empty_ref_like(pltpu.SemaphoreType.DMA(())))
    return out_ref[...]

  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(f()), np.arange(8) ** 2 + 1)


def test_a_pl_kernel_result_typed_vmem_is_computed_in_vmem():
  """A pl.kernel result typed pltpu.VMEM: the body's ref is a VMEM buffer copied out after it (before,
  the body got the HBM buffer and its vector stores were refused)."""
  def body(x_ref, o_ref):
    pltpu.sync_copy(x_ref, o_ref)
    o_ref[...] = o_ref[...] * 2 + 1

  x = _x((16, 128))
  call = pl.kernel(body, out_type=pltpu.VMEM(x.shape, x.dtype),
                   mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1))
  with pj.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), x * 2 + 1)


def test_a_pallas_call_smem_block_is_a_window_with_its_squeezed_dims_dropped():
  """SMEM BlockSpecs window their array per grid step, as Mosaic pipelines them (JAX's interpret mode
  agrees); a squeezed dim leaves the block ref: a (squeezed, 1, 2) block of a (3, 1, 2) array is
  uint32[1, 2] (JAX's test_squeezed_blockspec read a squeezed key block so). Before session 21 palace
  gave every step the whole array."""
  x = np.arange(6, dtype=np.uint32).reshape(3, 1, 2) * 7

  def kernel(k_ref, o_ref):
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.uint32) + k_ref[0, 1] * 100 + k_ref[0, 0]
  with pj.virtual_tpu("v5e"):
    got = np.asarray(pl.pallas_call(
        kernel, grid=(3,),
        in_specs=[pl.BlockSpec((pl.squeezed, 1, 2), lambda i: (i, 0, 0), memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((24, 128), jnp.uint32))(x))
  np.testing.assert_array_equal(got[::8, 0], x[:, 0, 1] * 100 + x[:, 0, 0])


def _host_sharding():
  return jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices()[:1], "x"), jax.sharding.PartitionSpec(),
                                    memory_kind="pinned_host")


def test_pinned_host_operands_and_results_move_by_dma_across_the_host_link():
  """pl.HOST (JAX's test_host_input_host_to_hbm_dma, test_hbm_to_host_host_output_dma): an operand
  the caller put in pinned host memory is read by DMA into HBM, and a result in host memory written
  by DMA from HBM; both cross the chip's host link (its one-way bandwidth, hw.ChipSpec)."""
  def to_hbm(x_host_ref, y_ref):
    pl.run_scoped(lambda sem: pltpu.async_copy(x_host_ref, y_ref, sem).wait(), pltpu.SemaphoreType.DMA)

  def to_host(y_ref, x_host_ref):
    pl.run_scoped(lambda sem: pltpu.async_copy(y_ref, x_host_ref, sem).wait(), pltpu.SemaphoreType.DMA)

  x = _x((8, 128))
  with pj.virtual_tpu("v5e") as tpu:
    xh = jax.device_put(x, _host_sharding())
    y = pl.pallas_call(to_hbm, in_specs=[pl.BlockSpec(memory_space=pl.HOST)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY),
                       out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(xh)
    np.testing.assert_array_equal(np.asarray(y), x)
    assert tpu.reports[-1].dma_bytes_by_direction == {"host->hbm": x.nbytes}
    z = jax.jit(lambda a: pl.pallas_call(
        to_host, in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.HOST),
        out_shape=pl.MemoryRef(jax.core.ShapedArray(x.shape, x.dtype), pl.HOST))(a),
        out_shardings=_host_sharding())(x)
    np.testing.assert_array_equal(np.asarray(z), x)
    assert tpu.reports[-1].dma_bytes_by_direction == {"hbm->host": x.nbytes}


def test_a_kernel_cannot_load_a_pinned_host_operand_nor_allocate_host_scratch():
  from palace import MemorySpaceError

  def load(x_host_ref, y_ref):
    y_ref[...] = x_host_ref[...]
  x = _x((8, 128))
  with pytest.raises(MemorySpaceError, match=r"host memory\) from the vector unit.*by DMA only"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(pl.pallas_call(load, in_specs=[pl.BlockSpec(memory_space=pl.HOST)],
                                           out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
  with pytest.raises(UnsupportedError, match=r"in host memory \(pl.HOST\) is not supported"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(pl.pallas_call(
          lambda x_ref, y_ref, s_ref: None, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          scratch_shapes=[pl.MemoryRef(jax.core.ShapedArray(x.shape, x.dtype), pl.HOST)])(x))
