"""Walls JAX's own tpu_pallas_test found (issue 37, session 22), each against a NumPy reference or the
refusal JAX's TPU lowering gives: an output block revisited at any step under
pl.Buffered(1, revisit=pl.RevisitMode.ANY); exactly the scoped VMEM limit of pipelined blocks; a
dynamic grid bound passed as a shape-(1,) array; `lax.dynamic_slice` of a value, which Mosaic has no
lowering for; a pinned buffer (JAX's `pin`) aliased through a kernel (session 26)."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.pallas.mosaic import error_handling
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import CompilerRejectError, ResourceError, SyncError, UsageError


def _accumulate(mode):
  """Rows of x summed into one row of blocks, the row axis first in the grid: each output block is
  revisited every third step, not consecutively."""
  def body(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]

  x = jnp.arange(24 * 384, dtype=jnp.float32).reshape(24, 384)
  out = pl.pallas_call(
      body, out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32), grid=(3, 3),
      in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
      out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, j), pipeline_mode=mode))(x)
  return out, np.asarray(x).reshape(3, 8, 384).sum(axis=0)


def test_revisit_any_reads_a_revisited_output_block_back():
  with pj.virtual_tpu("v5e"):
    out, want = _accumulate(pl.Buffered(1, revisit=pl.RevisitMode.ANY))
    np.testing.assert_array_equal(np.asarray(out), want)


def test_a_non_consecutive_revisit_without_revisit_any_is_still_refused():
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"Revisited block for outputs\[0\].*"
                                            r"pl\.Buffered\(1, revisit=pl\.RevisitMode\.ANY\)") as e:
    jax.block_until_ready(_accumulate(pl.Buffered(1))[0])
  assert isinstance(e.value, SyncError) or "SyncError" in str(e.value)


def test_revisit_any_with_double_buffering_is_refused_as_jax_lowering_does():
  # (raised where palace builds the launch, as its other pipeline_mode refusals: XLA wraps it)
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"BlockSpecError: .*RevisitMode\.ANY is not "
                                            r"supported with double buffering.*Fix: pl\.Buffered\(1, revisit"):
    jax.block_until_ready(_accumulate(pl.Buffered(2, revisit=pl.RevisitMode.ANY))[0])


def _copy(rows):
  """A copy in two (rows, 1024) float32 blocks: 2 inputs + 2 outputs of rows * 4 KiB each."""
  x = jnp.arange(2 * rows * 1024, dtype=jnp.float32).reshape(2 * rows, 1024)
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0
  out = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((rows, 1024), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((rows, 1024), lambda i: (i, 0)))(x)
  return out, np.asarray(x) + 1.0


def test_blocks_of_exactly_the_scoped_limit_run():
  # 4 x 4 MiB = the v5e's 16 MiB default scoped limit; Mosaic's internal scratch is not taken from it
  with pj.virtual_tpu("v5e"):
    out, want = _copy(1024)
    np.testing.assert_array_equal(np.asarray(out), want)


def test_blocks_over_the_scoped_limit_are_refused():
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"VMEM over capacity .* 16\.1\d MiB of "
                                            r"pipelined blocks .* the scoped VMEM limit is 16\.00 MiB") as e:
    jax.block_until_ready(_copy(1032)[0])
  assert isinstance(e.value, ResourceError) or "ResourceError" in str(e.value)


def test_a_dynamic_grid_bound_given_as_a_size_one_array():
  def body(_, o_ref):
    o_ref[0] = lax.cond(pl.program_id(0) == 0, lambda: 1, lambda: o_ref[0] + 1)

  def run(n):
    return pl.pallas_call(
        body, out_shape=pltpu.SMEM((1,), dtype=jnp.int32),
        grid_spec=pl.GridSpec(grid=(n,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                              out_specs=pl.BlockSpec(memory_space=pltpu.SMEM)))(n)
  with pj.virtual_tpu("v5e"):
    for k in (1, 5):
      n = jnp.array([k], jnp.int32)
      np.testing.assert_array_equal(np.asarray(jax.jit(run)(n)), [k])


def test_a_dynamic_grid_bound_of_several_values_is_refused_naming_the_kernel_and_axis():
  def body(_, o_ref):
    o_ref[0] = 1

  def run(n):
    return pl.pallas_call(
        body, out_shape=pltpu.SMEM((1,), dtype=jnp.int32), name="bounds_kernel",
        grid_spec=pl.GridSpec(grid=(n,), in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                              out_specs=pl.BlockSpec(memory_space=pltpu.SMEM)))(n)
  # (the error leaving virtual_tpu is palace's own; inside it, XLA's JaxRuntimeError carries its text)
  with pytest.raises(UsageError, match=r"pallas_call 'bounds_kernel': the dynamic bound of grid axis 0 "
                                       r"is an array of shape \(2,\); .* Fix: pass the grid size as a "
                                       r"scalar"), pj.virtual_tpu("v5e"):
    jax.jit(run)(jnp.array([2, 3], jnp.int32))


def test_dynamic_slice_of_a_value_is_rejected_as_mosaic_does():
  def kernel(x_ref, o_ref):
    o_ref[...] = lax.dynamic_slice_in_dim(x_ref[...], 64, 1, 0)

  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError,
                                            match=r"lax\.dynamic_slice of a float32\[128\] value .*"
                                                  r"Unimplemented primitive in Pallas TPU lowering for "
                                                  r"tc: dynamic_slice.*Fix: index the ref") as e:
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32))(
        jnp.arange(128, dtype=jnp.float32))
  assert isinstance(e.value, CompilerRejectError)


def test_slicing_the_ref_instead_computes():
  def kernel(i_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(i_ref[0], 8), :]

  x = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)
  with pj.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec()])(
        jnp.array([16], jnp.int32), x)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x)[16:24])


def test_never_written_scratch_reads_the_chips_poison_values():
  # int32 minimum / int8 minimum / NaN, and True for a bool (a 32-bit word holding the int32 minimum)
  def kernel(f_ref, i_ref, b_ref, f_scr, i_scr, b_scr):
    f_ref[...] = f_scr[...]
    i_ref[...] = i_scr[...]
    b_ref[...] = b_scr[...]

  shapes = [jax.ShapeDtypeStruct((8, 128), d) for d in (jnp.float32, jnp.int8, jnp.bool_)]
  with pj.virtual_tpu("v5e"):
    f, i, b = pl.pallas_call(kernel, out_shape=shapes,
                             scratch_shapes=[pltpu.VMEM(s.shape, s.dtype) for s in shapes])()
  assert np.isnan(np.asarray(f)).all()
  assert (np.asarray(i) == -128).all()
  assert np.asarray(b).all()


def _edge_matmul(x, y, bm, bk, bn):
  """JAX's emit_pipeline over HBM refs whose blocks do not divide them (the padded matmul of JAX's
  tpu_pallas_pipeline_test): the edge blocks' DMAs are rounded up to the HBM tiling, into the array's
  tile padding; the kernel masks the K padding."""
  m, k = x.shape
  n = y.shape[1]

  def body(x_ref, y_ref, o_ref, acc_ref):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    cols = kk * bk + lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    rows = kk * bk + lax.broadcasted_iota(jnp.int32, y_ref.shape, 0)
    a = jnp.where(cols < k, x_ref[...], 0)
    b = jnp.where(rows < k, y_ref[...], 0)
    acc_ref[...] += jnp.dot(a, b, preferred_element_type=jnp.float32)
    o_ref[...] = acc_ref[...]

  def kernel(x_hbm, y_hbm, o_hbm):
    def run(acc_ref):
      pltpu.emit_pipeline(
          functools.partial(body, acc_ref=acc_ref),
          in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                    pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
          out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
          grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)))(x_hbm, y_hbm, o_hbm)
    pl.run_scoped(run, pltpu.VMEM((bm, bn), jnp.float32))

  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
                        out_specs=pl.BlockSpec(memory_space=pl.ANY))(x, y)


@pytest.mark.parametrize("m,k,n", [(37, 200, 300), (64, 130, 129)])
def test_emit_pipeline_edge_blocks_reach_into_hbm_tile_padding(m, k, n):
  # integers, exact in any summation order
  x = (np.arange(m * k) % 7 - 3).reshape(m, k).astype(np.float32)
  y = (np.arange(k * n) % 5 - 2).reshape(k, n).astype(np.float32)
  with pj.virtual_tpu("v5e"):
    out = _edge_matmul(jnp.asarray(x), jnp.asarray(y), 32, 128, 128)
  np.testing.assert_array_equal(np.asarray(out), x @ y)


def test_a_window_past_the_tile_padding_is_still_out_of_bounds():
  def kernel(s_ref, x_hbm, o_ref, buf, sem):
    # (8, 922) float32 pads to (8, 1024): columns [1024, 1152) are past it (a start JAX cannot check
    # when it traces the kernel)
    copy = pltpu.make_async_copy(x_hbm.at[:, pl.ds(s_ref[0], 128)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]

  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"Slice \[1024:1152\] out of bounds for "
                                            r"axis 1 of args\[1\] .* start \+ size <= 922 \(or, "
                                            r"unit-stride, <= 1024: the end of the last HBM tile"):
    jax.block_until_ready(pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])(
            jnp.array([1024], jnp.int32), jnp.zeros((8, 922), jnp.float32)))


def _window_call(index_map, grid=(4, 1)):
  """A 10 MiB int8 output block over a 40 MiB array: two buffers of it would pass v5e's 16 MiB scoped
  limit, one fits."""
  window = 10 * 1024 * 1024

  def body(o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 7, jnp.int8)
  return pl.pallas_call(body, grid=grid, out_shape=jax.ShapeDtypeStruct((4 * window,), jnp.int8),
                        out_specs=pl.BlockSpec((window,), index_map))()


def test_a_block_with_one_window_over_the_grid_gets_one_buffer():
  # indexed by the size-1 grid dim only: one window, single-buffered as the TPU compiler does it
  with pj.virtual_tpu("v5e"):
    out = np.asarray(_window_call(lambda i, j: (j,)))
  assert (out[:10 * 1024 * 1024] == 7).all()


def test_a_block_that_changes_over_the_grid_is_double_buffered():
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match=r"VMEM over capacity .*\(outputs\[0\] 2 x "
                                            r"10\.00 MiB block"):
    jax.block_until_ready(_window_call(lambda i, j: (j + i,)))


def _pinned_double(memory_space=None):
  """JAX's pinned buffer (tpu_pallas_state_test's PinnedBufferTest): x pinned, doubled in place by a
  kernel that aliases it as input and output, unpinned."""
  from jax._src.state.primitives import pin, unpin

  def kernel(x_ref, o_ref):
    if memory_space is None:
      o_ref[...] = x_ref[...] * 2
    else:   # (HBM refs: a copy through a VMEM scratch)
      def body(scratch, sem):
        pltpu.async_copy(x_ref, scratch, sem).wait()
        scratch[...] = scratch[...] * 2
        pltpu.async_copy(scratch, o_ref, sem).wait()
      pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA)

  @jax.jit
  def f(x):
    x_pinned = pin(x)
    spec = pl.BlockSpec() if memory_space is None else pl.BlockSpec(memory_space=memory_space)
    x_pinned = pl.pallas_call(kernel, out_shape=x_pinned, in_specs=[spec], out_specs=spec,
                              input_output_aliases={0: 0})(x_pinned)
    return unpin(x_pinned)
  return f


@pytest.mark.parametrize("memory_space", [None, pl.ANY], ids=["vmem_block", "any"])
def test_a_pinned_buffer_aliased_through_a_kernel_is_its_array(memory_space):
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  f = _pinned_double(memory_space)
  with pj.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(np.asarray(f(x)), x * 2)
    hlo = f.lower(x).compile().as_text()
  assert len(tpu.reports) == 1 and '"color"' not in hlo


def test_without_an_engine_pin_keeps_jax_own_lowering():
  """Outside palace's engine, JAX's Pin custom call reaches XLA:CPU, which has no implementation of it;
  inside, the pinned value is the value."""
  from jax._src.state.primitives import pin, unpin
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  with pj.virtual_tpu("v5e"):   # (palace's lowerings installed)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: unpin(pin(v)))(x)), x)
  with pytest.raises(Exception, match="custom call to Pin"):
    jax.jit(lambda v: unpin(pin(v)) + 1)(x)
