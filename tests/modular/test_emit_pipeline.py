"""pltpu.emit_pipeline inside pl.kernel: BlockSpec semantics, nesting, buffering, allocations."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

MESH = pltpu.TensorCoreMesh("core", num_cores=1)
F32 = jnp.float32


def _kernel(out_shape, dtype=F32, **kw):
  return functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(out_shape, dtype), mesh=MESH, **kw)


def _spec(bs, f):
  return pl.BlockSpec(bs, f)


def _rows(values, rows):
  """A float32 column: each value repeated `rows` times."""
  return np.repeat(np.asarray(values, np.float32), rows)[:, None]


def test_elementwise_program_id_and_num_programs(rng):
  x = rng.standard_normal((512, 256)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = (x_ref[...] * 2 + pl.program_id(0).astype(F32) * 10
                    + pl.program_id(1).astype(F32) + pl.num_programs(0) * 100)
    spec = _spec((128, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  ref = (x * 2 + _rows(np.arange(4) * 10, 128)) + _rows(np.arange(2), 128).T + np.float32(400)
  np.testing.assert_allclose(k(x), ref, rtol=1e-6)


def test_single_specs_and_pytrees_of_refs(rng):
  a = rng.standard_normal((256, 128)).astype(np.float32)
  b = rng.standard_normal((256, 128)).astype(np.float32)

  @functools.partial(pl.kernel, mesh=MESH, out_type={"s": pl.ShapeDtypeStruct(a.shape, F32),
                                                     "d": pl.ShapeDtypeStruct(a.shape, F32)})
  def k(a_hbm, b_hbm, outs_hbm):
    def body(ins, outs):
      x, y = ins
      outs["s"][...] = x[...] + y[...]
      outs["d"][...] = x[...] - y[...]
    spec = _spec((64, 128), lambda i: (i, 0))
    # one spec broadcast over a pytree operand; a dict of specs for a dict operand
    pltpu.emit_pipeline(body, grid=(4,), in_specs=spec, out_specs={"s": spec, "d": spec})(
        (a_hbm, b_hbm), outs_hbm)

  out = k(a, b)
  np.testing.assert_array_equal(out["s"], a + b)
  np.testing.assert_array_equal(out["d"], a - b)


def test_reduction_revisits_output_block(rng):
  x = rng.standard_normal((256, 512)).astype(np.float32)

  @_kernel((256, 128))
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      @pl.when(pl.program_id(1) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
      o_ref[...] += x_ref[...]
    pltpu.emit_pipeline(body, grid=(2, 4), in_specs=[_spec((128, 128), lambda i, j: (i, j))],
                        out_specs=[_spec((128, 128), lambda i, j: (i, 0))],
                        dimension_semantics=(pltpu.PARALLEL, pltpu.ARBITRARY))(x_hbm, o_hbm)

  np.testing.assert_allclose(k(x), x.reshape(256, 4, 128).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [pl.Buffered(1), pl.Buffered(2), pl.Buffered(3),
                                  pl.Buffered(3, use_lookahead=True)])
def test_buffered(rng, mode):
  x = rng.standard_normal((1024, 128)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] + 1
    pltpu.emit_pipeline(body, grid=(8,), in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0),
                                                                pipeline_mode=mode)],
                        out_specs=[_spec((128, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

  with pl.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(k(x), x + 1)
  in_bytes = mode.buffer_count * 128 * 128 * 4
  assert tpu.reports[-1].vmem_peak_bytes == in_bytes + 2 * 128 * 128 * 4


def test_no_pipelining_is_synchronous_and_equal(rng):
  x = rng.standard_normal((512, 256)).astype(np.float32)

  def make(no_pipelining):
    @_kernel(x.shape)
    def k(x_hbm, o_hbm):
      def body(x_ref, o_ref):
        o_ref[...] = jnp.tanh(x_ref[...])
      spec = _spec((128, 256), lambda i: (i, 0))
      pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec],
                          no_pipelining=no_pipelining)(x_hbm, o_hbm)
    return k

  with pl.virtual_tpu("v5e") as tpu:
    piped = make(False)(x)
    sync = make(True)(x)
  assert piped.tobytes() == sync.tobytes()
  r_piped, r_sync = tpu.reports
  assert r_sync.vmem_peak_bytes == r_piped.vmem_peak_bytes // 2   # one buffer per operand
  assert r_sync.device_cycles > r_piped.device_cycles


def test_hbm_and_any_specs_pass_raw_refs_and_no_block_spec_gives_none(rng):
  x = rng.standard_normal((256, 128)).astype(np.float32)
  seen = []

  @_kernel(x.shape, scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, small):
    def body(x_ref, raw_x, raw_o, dropped, o_ref):
      seen.append((raw_x.memory_space, raw_o.memory_space, raw_x.shape, x_ref.memory_space, dropped))
      pltpu.sync_copy(raw_x.at[pl.ds(0, 8)], small)     # the raw HBM ref, DMA'd by hand
      o_ref[...] = x_ref[...] + small[0:1, :]
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec, pl.BlockSpec(memory_space=pltpu.HBM),
                                                   pl.BlockSpec(memory_space=pl.ANY), pl.no_block_spec],
                        out_specs=[spec])(x_hbm, x_hbm, o_hbm, x_hbm, o_hbm)

  np.testing.assert_array_equal(k(x), x + x[0:1])
  assert seen[0] == (pl.ANY, pl.ANY, (256, 128), pltpu.VMEM, None)


def test_vmem_source_is_aliased_not_copied(rng):
  x = rng.standard_normal((256, 256)).astype(np.float32)

  @_kernel(x.shape, scratch_types=[pltpu.VMEM((256, 256), F32), pltpu.VMEM((256, 256), F32)])
  def k(x_hbm, o_hbm, xv, ov):
    pltpu.sync_copy(x_hbm, xv)

    def body(x_ref, o_ref):
      assert x_ref.buf is xv.buf and o_ref.buf is ov.buf   # views of the VMEM refs, no buffers
      o_ref[...] = x_ref[...] * 3
    spec = _spec((64, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(4, 2), in_specs=[spec], out_specs=[spec])(xv, ov)
    pltpu.sync_copy(ov, o_hbm)

  with pl.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(k(x), x * 3)
  assert tpu.reports[-1].dma_count == 2
  assert tpu.reports[-1].vmem_peak_bytes == 2 * 256 * 256 * 4


def test_nested_pipelines(rng):
  """Outer pipeline brings (256, 256) blocks to VMEM; the inner one walks them in (64, 128) views."""
  x = rng.standard_normal((512, 512)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def outer(x_blk, o_blk):
      i, j = pl.program_id(0), pl.program_id(1)

      def inner(xi, oi):
        oi[...] = xi[...] + (i * 10 + j).astype(F32) + pl.program_id(0).astype(F32) * 0.5
      spec = _spec((64, 128), lambda a, b: (a, b))
      pltpu.emit_pipeline(inner, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_blk, o_blk)
      # back in the outer pipeline: program_id is the outer grid again
      assert int(pl.num_programs(0)) == 2
    spec = _spec((256, 256), lambda i, j: (i, j))
    pltpu.emit_pipeline(outer, grid=(2, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  ref = x.copy()
  for i in range(2):
    for j in range(2):
      blk = ref[i * 256:(i + 1) * 256, j * 256:(j + 1) * 256]
      blk[...] = (blk + np.float32(i * 10 + j)) + _rows(np.arange(4) * 0.5, 64)
  np.testing.assert_array_equal(k(x), ref)


def test_nested_hbm_pipelines(rng):
  """An inner pipeline over HBM row panels chosen by the outer grid (`.at` views as operands)."""
  x = rng.standard_normal((512, 256)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def outer(xp, op):
      r = pl.program_id(0)

      def inner(a, o):
        o[...] = a[...] - r.astype(F32)
      spec = _spec((64, 128), lambda i, j: (i, j))
      pltpu.emit_pipeline(inner, grid=(4, 2), in_specs=[spec], out_specs=[spec])(
          x_hbm.at[pl.ds(r * 256, 256)], o_hbm.at[pl.ds(r * 256, 256)])
    pltpu.emit_pipeline(outer, grid=(2,), in_specs=[pl.no_block_spec],
                        out_specs=[pl.no_block_spec])(x_hbm, o_hbm)

  ref = x - _rows(np.arange(2), 256)
  np.testing.assert_array_equal(k(x), ref)


def test_index_map_closes_over_smem_scalars(rng):
  """Block order taken from an SMEM table: index maps see only grid indices but may read refs."""
  x = rng.standard_normal((512, 128)).astype(np.float32)
  perm = np.array([3, 0, 2, 1], np.int32)

  @_kernel(x.shape, scratch_types=[pltpu.SMEM((4,), jnp.int32)])
  def k(p_hbm, x_hbm, o_hbm, p):
    pltpu.sync_copy(p_hbm, p)

    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...]
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[_spec((128, 128), lambda i: (p[i], 0))],
                        out_specs=[_spec((128, 128), lambda i: (i, 0))])(x_hbm, o_hbm)

  np.testing.assert_array_equal(k(perm, x), x.reshape(4, 128, 128)[perm].reshape(512, 128))


def test_scratches_and_squeezed_dims(rng):
  x = rng.standard_normal((4, 64, 128)).astype(np.float32)

  @_kernel((64, 128), scratch_types=[pltpu.VMEM((64, 128), F32)])
  def k(x_hbm, o_hbm, acc):
    def body(x_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
      acc_ref[...] += x_ref[...]

      @pl.when(pl.program_id(0) == 3)
      def _():
        o_ref[...] = acc_ref[...]
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[_spec((None, 64, 128), lambda b: (b, 0, 0))],
                        out_specs=[_spec((64, 128), lambda b: (0, 0))])(x_hbm, o_hbm, scratches=[acc])

  np.testing.assert_allclose(k(x), x.sum(0), rtol=1e-5, atol=1e-6)


def test_ragged_last_block(rng):
  x = rng.standard_normal((200, 128)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] * 2
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(pl.cdiv(200, 64),), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  np.testing.assert_array_equal(k(x), x * 2)


def test_smem_block_specs(rng):
  x = np.arange(512, dtype=np.int32)

  @_kernel((512,), jnp.int32)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      assert x_ref.memory_space == pltpu.SMEM and x_ref.shape == (128,)
      for t in (0, 5, 127):
        o_ref[t] = x_ref[t] * 2 + pl.program_id(0)
    spec = pl.BlockSpec((128,), lambda i: (i,), memory_space=pltpu.SMEM)
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  out = k(x).reshape(4, 128)
  for t in (0, 5, 127):
    np.testing.assert_array_equal(out[:, t], x.reshape(4, 128)[:, t] * 2 + np.arange(4))


def test_allocations_reused_across_pipelines(rng):
  x = rng.standard_normal((512, 128)).astype(np.float32)
  spec = _spec((128, 128), lambda i: (i, 0))

  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  pipeline, make_allocations = pltpu.emit_pipeline_with_allocations(
      body, grid=(4,), in_specs=[spec], out_specs=[spec])

  @_kernel(x.shape, scratch_types=[pltpu.VMEM(x.shape, F32)])
  def k(x_hbm, o_hbm, tmp):
    def run(allocs):
      pipeline(x_hbm, o_hbm, allocations=allocs)     # o = x + 1
      pipeline(o_hbm, o_hbm, allocations=allocs)     # o = x + 2 (in place, same blocks)
    pl.run_scoped(run, make_allocations(x_hbm, o_hbm))

  with pl.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(k(x), (x + 1) + 1)
  assert tpu.reports[-1].vmem_peak_bytes == 512 * 128 * 4 + 4 * 128 * 128 * 4


def test_allocations_of_the_wrong_shape_are_an_error(rng):
  spec = _spec((128, 128), lambda i: (i, 0))
  pipeline, make_allocations = pltpu.emit_pipeline_with_allocations(
      lambda a, b: None, grid=(2,), in_specs=[spec], out_specs=[spec])

  @_kernel((256, 128))
  def k(x_hbm, o_hbm):
    pl.run_scoped(lambda a: pipeline(x_hbm, o_hbm, allocations=a),
                  [([pltpu.VMEM((64, 128), F32)] * 2, pltpu.SemaphoreType.DMA((2,)))] * 2)

  with pytest.raises(pl.UsageError, match=r"allocations\[0\] for args\[0\] do not fit: expected 2 "
                                          r"buffer\(s\) of float32\[128, 128\]"):
    k(np.zeros((256, 128), np.float32))


def test_explicit_indices(rng):
  x = rng.standard_normal((256, 128)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def body(step, x_ref, o_ref):
      o_ref[...] = x_ref[...] + step.index[0].astype(F32) * 10 + step.local_index.astype(F32)
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec],
                        _explicit_indices=True)(x_hbm, o_hbm)

  np.testing.assert_array_equal(k(x), (x + _rows(np.arange(4) * 10, 64)) + _rows(np.arange(4), 64))


def test_core_axis_name_with_one_core_does_not_split(rng):
  x = rng.standard_normal((256, 128)).astype(np.float32)

  @_kernel(x.shape)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] + pl.program_id(0).astype(F32)
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec], core_axis_name="core",
                        dimension_semantics=(pltpu.PARALLEL,))(x_hbm, o_hbm)

  np.testing.assert_array_equal(k(x), x + _rows(np.arange(4), 64))


@pytest.mark.parametrize("grid,expect", [((4,), [[0, 1], [2, 3]]), ((5,), [[0, 1, 2], [3, 4]])])
def test_core_axis_name_splits_the_grid_across_cores(rng, grid, expect):
  n = grid[0]
  x = rng.standard_normal((n * 64, 128)).astype(np.float32)
  mesh = pltpu.TensorCoreMesh("core", num_cores=2)

  @functools.partial(pl.kernel, mesh=mesh, out_type=(pl.ShapeDtypeStruct(x.shape, F32),
                                                     pl.ShapeDtypeStruct((n * 64, 128), jnp.int32)))
  def k(x_hbm, o_hbm, who_hbm):
    core = lax.axis_index("core")

    def body(x_ref, o_ref, w_ref):
      o_ref[...] = x_ref[...] + pl.program_id(0).astype(F32)   # the global grid index
      w_ref[...] = jnp.full(w_ref.shape, core * 10 + pl.num_programs(0), jnp.int32)  # this core's share
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=grid, in_specs=[spec], out_specs=[spec, spec], core_axis_name="core",
                        dimension_semantics=("parallel",))(x_hbm, o_hbm, who_hbm)

  with pl.virtual_tpu("v5p"):
    out, who = k(x)
  np.testing.assert_array_equal(out, x + _rows(np.arange(n), 64))
  for c, blocks in enumerate(expect):
    for b in blocks:
      assert (who[b * 64:(b + 1) * 64] == c * 10 + len(blocks)).all()


def test_split_without_parallel_dims_is_an_error(rng):
  mesh = pltpu.TensorCoreMesh("core", num_cores=2)

  @functools.partial(pl.kernel, mesh=mesh, out_type=pl.ShapeDtypeStruct((256, 128), F32))
  def k(x_hbm, o_hbm):
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(lambda a, b: None, grid=(4,), in_specs=[spec], out_specs=[spec],
                        core_axis_name="core")(x_hbm, o_hbm)

  with pl.virtual_tpu("v5p"), pytest.raises(pl.UnsupportedError, match=r"cannot split grid \(4,\) "
                                                                         r"across 2 cores"):
    k(np.zeros((256, 128), np.float32))


# ------------------------------------------------------------------ errors
def _run_pipeline_kernel(make_pipeline, shape=(256, 128)):
  @_kernel(shape)
  def k(x_hbm, o_hbm):
    make_pipeline()(x_hbm, o_hbm)
  return k(np.zeros(shape, np.float32))


def test_body_must_return_none():
  spec = _spec((64, 128), lambda i: (i, 0))

  def body(x_ref, o_ref):
    return x_ref

  with pytest.raises(pl.UsageError, match=r"emit_pipeline body 'body' returned Ref"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec]))


def test_wrong_number_of_refs():
  spec = _spec((64, 128), lambda i: (i, 0))
  with pytest.raises(pl.UsageError, match=r"2 input spec\(s\) and 1 output spec\(s\) but was called with "
                                          r"2 ref\(s\)"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[spec, spec],
                                                     out_specs=[spec]))


def test_index_map_arity_and_bounds():
  bad = _spec((64, 128), lambda s, i: (i, 0))
  with pytest.raises(pl.BlockSpecError, match=r"index_map of args\[0\] takes 2 argument\(s\) but the "
                                              r"pipeline grid \(4,\) has 1"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[bad],
                                                     out_specs=[bad]))
  spec = _spec((64, 128), lambda i: (i + 1, 0))
  with pytest.raises(pl.OutOfBoundsError, match=r"Block index out of bounds for args\[0\] "
                                                r"\(shape \(256, 128\)\) at grid point \(3,\)"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[spec],
                                                     out_specs=[_spec((64, 128), lambda i: (i, 0))]))


def test_bad_grid_and_tiling():
  spec = _spec((64, 128), lambda i: (i, 0))
  with pytest.raises(pl.UsageError, match=r"grid \(0,\): every grid size must be strictly positive"):
    pltpu.emit_pipeline(lambda *a: None, grid=(0,), in_specs=[spec], out_specs=[spec])
  bad = _spec((60, 128), lambda i: (i, 0))
  with pytest.raises(pl.BlockSpecError, match=r"Block shape for args\[0\] \(= \(60, 128\)\) breaks the TPU "
                                              r"tiling rule.*emit_pipeline in_specs\[0\]"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[bad],
                                                     out_specs=[spec]))


def test_ragged_block_over_an_aliased_vmem_source_is_an_error():
  @_kernel((200, 128), scratch_types=[pltpu.VMEM((200, 128), F32)])
  def k(x_hbm, o_hbm, v):
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(lambda a, b: None, grid=(4,), in_specs=[spec], out_specs=[spec])(v, o_hbm)

  with pytest.raises(pl.OutOfBoundsError, match=r"Block of scratch\[0\] at grid point \(3,\).*not inside "
                                                r"the vmem ref it aliases"):
    k(np.zeros((200, 128), np.float32))


def test_emit_pipeline_outside_a_kernel():
  spec = _spec((64, 128), lambda i: (i, 0))
  p = pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[spec], out_specs=[spec])
  with pytest.raises(pl.UsageError, match=r"an emit_pipeline pipeline was called outside a kernel body"):
    p(None, None)


def test_inside_pallas_call_with_core_axis(rng):
  """emit_pipeline over pl.ANY operands of a pallas_call; core_axis=0 gives each program of the
  enclosing grid its share of the pipeline grid."""
  x = rng.standard_normal((512, 128)).astype(np.float32)

  def kernel(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] + pl.program_id(0).astype(F32)
    spec = _spec((64, 128), lambda i: (i, 0))
    pltpu.emit_pipeline(body, grid=(8,), in_specs=[spec], out_specs=[spec], core_axis=0,
                        dimension_semantics=(pltpu.PARALLEL,))(x_hbm, o_hbm)

  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  with pl.virtual_tpu("v5e") as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(2,),
                         in_specs=[any_spec], out_specs=any_spec)(x)
  np.testing.assert_array_equal(out, x + _rows(np.arange(8), 64))
  assert tpu.reports[-1].dma_count == 16   # each block fetched and written back once in total


def test_output_lookahead_is_an_error():
  spec = _spec((64, 128), lambda i: (i, 0))
  ahead = pl.BlockSpec((64, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(2, use_lookahead=True))
  with pytest.raises(pl.UsageError, match=r"Output buffering does not support lookahead: the out spec "
                                          r"of outputs\[0\]"):
    _run_pipeline_kernel(lambda: pltpu.emit_pipeline(lambda *a: None, grid=(4,), in_specs=[spec],
                                                     out_specs=[ahead]))
