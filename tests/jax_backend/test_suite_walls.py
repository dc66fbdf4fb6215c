"""Walls JAX's own tpu_pallas_test found (issue 37, session 22), each against a NumPy reference or the
refusal JAX's TPU lowering gives: an output block revisited at any step under
pl.Buffered(1, revisit=pl.RevisitMode.ANY); exactly the scoped VMEM limit of pipelined blocks; a
dynamic grid bound passed as a shape-(1,) array; `lax.dynamic_slice` of a value, which Mosaic has no
lowering for."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.pallas.mosaic import error_handling
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import CompilerRejectError, ResourceError, SyncError


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
