"""pallas_call semantics: BlockSpec forms, pipelining modes, scalar prefetch, aliasing, scratch, ragged
blocks, pytrees and the virtual TPU selection (pallas-api.md 3.1-3.3)."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def _copy(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def _double(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2


@pytest.fixture
def x(rng):
  return rng.standard_normal((64, 256)).astype(np.float32)


@pytest.mark.parametrize("block", [(8, 128), (pl.Blocked(8), pl.Blocked(128)), (16, 256), (64, 256)])
def test_blocked_specs_tile_the_array(x, block):
  bm = block[0].block_size if isinstance(block[0], pl.Blocked) else block[0]
  bn = block[1].block_size if isinstance(block[1], pl.Blocked) else block[1]
  grid = (64 // bm, 256 // bn)
  out = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                       in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))],
                       out_specs=pl.BlockSpec(block, lambda i, j: (i, j)))(x)
  np.testing.assert_array_equal(out, x * 2)


def test_grid_runs_row_major_and_transposed_index_map(x):
  order = []

  def kernel(x_ref, o_ref):
    order.append((int(pl.program_id(0)._data), int(pl.program_id(1)._data)))
    o_ref[...] = x_ref[...]

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 1024), x.dtype), grid=(2, 8),
                       in_specs=[pl.BlockSpec((8, 128), lambda i, j: (j, i))],
                       out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)))(x)
  assert order == [(i, j) for i in range(2) for j in range(8)]
  ref = np.zeros((16, 1024), np.float32)
  for i in range(2):
    for j in range(8):
      ref[8 * i:8 * i + 8, 128 * j:128 * j + 128] = x[8 * j:8 * j + 8, 128 * i:128 * i + 128]
  np.testing.assert_array_equal(out, ref)


def test_int_grid_and_default_specs_give_whole_arrays(x):
  seen = []

  def kernel(x_ref, o_ref):
    seen.append((x_ref.shape, x_ref.memory_space))
    o_ref[...] = x_ref[...] + 1

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=3)(x)
  assert seen == [((64, 256), pltpu.VMEM)] * 3
  np.testing.assert_array_equal(out, x + 1)


@pytest.mark.parametrize("squeeze", [None, pl.squeezed, pl.Squeezed()])
def test_squeezed_dims_are_removed(rng, squeeze):
  x3 = rng.standard_normal((4, 16, 128)).astype(np.float32)
  shapes = []

  def kernel(x_ref, o_ref):
    shapes.append(x_ref.shape)
    o_ref[...] = x_ref[...].sum(axis=0, keepdims=True) + jnp.zeros((8, 128), jnp.float32)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((4, 16, 128), np.float32), grid=(4, 2),
                       in_specs=[pl.BlockSpec((squeeze, 8, 128), lambda b, i: (b, i, 0))],
                       out_specs=pl.BlockSpec((squeeze, 8, 128), lambda b, i: (b, i, 0)))(x3)
  assert set(shapes) == {(8, 128)}
  ref = x3.reshape(4, 2, 8, 128).sum(2, keepdims=True) + np.zeros((1, 1, 8, 128), np.float32)
  np.testing.assert_allclose(out, ref.reshape(4, 16, 128), rtol=1e-6)


def test_element_dims_take_element_offsets(x):
  # overlapping windows: rows [4i, 4i + 16)
  out = pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((3, 16, 256), np.float32), grid=(3,),
                       in_specs=[pl.BlockSpec((pl.Element(16), 256), lambda i: (i * 4, 0))],
                       out_specs=pl.BlockSpec((None, 16, 256), lambda i: (i, 0, 0)))(x)
  np.testing.assert_array_equal(out, np.stack([x[4 * i:4 * i + 16] for i in range(3)]))


def test_element_padding_offsets_are_in_padded_coordinates(x):
  # Element(16, (4, 4)): the index map addresses the array padded by 4 rows on each side.
  out = pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((3, 16, 256), np.float32), grid=(3,),
                       in_specs=[pl.BlockSpec((pl.Element(16, (4, 4)), 256), lambda i: (i * 24, 0))],
                       out_specs=pl.BlockSpec((None, 16, 256), lambda i: (i, 0, 0)))(x)
  np.testing.assert_array_equal(out[0, 4:], x[0:12])          # rows -4..-1 are padding
  np.testing.assert_array_equal(out[1], x[20:36])
  np.testing.assert_array_equal(out[2], x[44:60])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_buffered_pipeline_modes_give_identical_results(x, n):
  mode = pl.Buffered(n)
  out = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(8, 2),
                       in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j), pipeline_mode=mode)],
                       out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j), pipeline_mode=mode))(x)
  np.testing.assert_array_equal(out, x * 2)


def test_grid_spec_object_equals_keywords(x):
  spec = pl.GridSpec(grid=(8,), in_specs=[pl.BlockSpec((8, 256), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)))
  out = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=spec)(x)
  np.testing.assert_array_equal(out, x * 2)


def test_scalar_prefetch_gathers_row_blocks(x):
  idx = np.array([3, 0, 7, 1, 3], np.int32)
  seen = []

  def kernel(idx_ref, x_ref, o_ref):
    seen.append(idx_ref.memory_space)
    o_ref[...] = x_ref[...] + idx_ref[pl.program_id(0)].astype(jnp.float32)

  out = pl.pallas_call(
      kernel, out_shape=pl.ShapeDtypeStruct((40, 256), np.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(5,),
          in_specs=[pl.BlockSpec((8, 256), lambda i, idx_ref: (idx_ref[i], 0))],
          out_specs=pl.BlockSpec((8, 256), lambda i, idx_ref: (i, 0))))(idx, x)
  assert set(seen) == {pltpu.SMEM}
  np.testing.assert_array_equal(out, np.concatenate([x[8 * j:8 * j + 8] + np.float32(j) for j in idx]))


@pytest.mark.parametrize("row_dim", [pl.Element(1), None])
def test_scalar_prefetch_gathers_single_rows(x, row_dim):
  rows = np.array([5, 63, 0, 17, 17, 2, 9, 40], np.int32)
  out = pl.pallas_call(
      lambda rows_ref, x_ref, o_ref: _copy(x_ref, o_ref), out_shape=pl.ShapeDtypeStruct((8, 256), np.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(8,),
          in_specs=[pl.BlockSpec((row_dim, 256), lambda i, r: (r[i], 0))],
          out_specs=pl.BlockSpec((row_dim, 256), lambda i, r: (i, 0))))(rows, x)
  np.testing.assert_array_equal(out, x[rows])


def test_two_scalar_prefetch_operands_and_pytree(x):
  a = np.array([1, 2], np.int32)
  b = {"off": np.array([0, 128], np.int32)}

  def kernel(a_ref, b_tree, x_ref, o_ref):
    o_ref[...] = x_ref[...] * b_tree["off"][1].astype(jnp.float32) + a_ref[0].astype(jnp.float32)

  out = pl.pallas_call(
      kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(1,),
          in_specs=[pl.BlockSpec((8, 128), lambda i, a_ref, b_tree: (a_ref[1], b_tree["off"][1] // 128))],
          out_specs=pl.BlockSpec((8, 128), lambda i, a_ref, b_tree: (0, 0))))(a, b, x)
  np.testing.assert_array_equal(out, x[16:24, 128:] * 128 + 1)


def test_input_output_aliases_keep_unwritten_blocks(x):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 100

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (2 * i + 1, 1))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (2 * i + 1, 1)),
                       input_output_aliases={0: 0})(x)
  ref = x.copy()
  ref[8:16, 128:] += 100
  ref[24:32, 128:] += 100
  np.testing.assert_array_equal(out, ref)
  assert not np.shares_memory(out, x)     # the caller's array is not mutated
  assert np.isfinite(x).all()


def test_an_aliased_input_and_its_output_are_one_hbm_buffer(x):
  """As on a TPU (and in JAX's interpret mode): writes through the input ref of an aliased pair are in
  the output, and the input ref reads what the output ref wrote. (They were two buffers until session
  6, and a write through the input ref was silently lost.)"""
  def kernel(a_ref, x_ref, a_out, o_ref, buf):
    pltpu.sync_copy(a_ref.at[0:8], buf)
    buf[...] = buf[...] + 1
    pltpu.sync_copy(buf, a_ref.at[0:8])            # through the input ref
    pltpu.sync_copy(x_ref.at[8:16], a_out.at[8:16])  # through the output ref ...
    pltpu.sync_copy(a_ref.at[8:16], buf)           # ... read back through the input ref
    pltpu.sync_copy(buf, o_ref)

  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  a = x[:, :128] * 3
  a_out, o = pl.pallas_call(
      kernel, out_shape=[pl.ShapeDtypeStruct(a.shape, a.dtype), pl.ShapeDtypeStruct((8, 128), a.dtype)],
      in_specs=[any_spec, any_spec], out_specs=[any_spec, any_spec],
      scratch_shapes=[pltpu.VMEM((8, 128), np.float32)], input_output_aliases={0: 0})(a, x[:, :128])
  ref = a.copy()
  ref[0:8] += 1
  ref[8:16] = x[8:16, :128]
  np.testing.assert_array_equal(a_out, ref)
  np.testing.assert_array_equal(o, x[8:16, :128])
  np.testing.assert_array_equal(a, x[:, :128] * 3)   # the caller's array is not mutated


def test_aliases_count_scalar_prefetch_operands(x):
  idx = np.array([2], np.int32)

  def kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)

  out = pl.pallas_call(
      kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(1,),
          in_specs=[pl.BlockSpec((8, 256), lambda i, r: (r[0], 0))],
          out_specs=pl.BlockSpec((8, 256), lambda i, r: (r[0], 0))),
      input_output_aliases={1: 0})(idx, x)
  ref = x.copy()
  ref[16:24] = 0
  np.testing.assert_array_equal(out, ref)


def test_scratch_persists_across_steps_and_starts_as_nan(x):
  def kernel(x_ref, o_ref, acc_ref, cnt_ref, sem):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
      o_ref[...] = jnp.where(jnp.isnan(acc_ref[...]), 1.0, 0.0)   # uninitialised floats read NaN
      acc_ref[...] = jnp.zeros_like(acc_ref)
      cnt_ref[0] = 0

    acc_ref[...] += x_ref[...]
    cnt_ref[0] = cnt_ref[0] + 1

    @pl.when(i == pl.num_programs(0) - 1)
    def _():
      o_ref[...] += acc_ref[...] + cnt_ref[0].astype(jnp.float32)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 256), np.float32), grid=(8,),
                       in_specs=[pl.BlockSpec((8, 256), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 256), lambda i: (0, 0)),
                       scratch_shapes=[pltpu.VMEM((8, 256), jnp.float32), pltpu.SMEM((1,), jnp.int32),
                                       pltpu.SemaphoreType.DMA])(x)
  np.testing.assert_allclose(out, x.reshape(8, 8, 256).sum(0) + 1 + 8, rtol=1e-5)


def test_uninitialised_int_scratch_and_outputs(x):
  def kernel(o_ref, s_ref):
    o_ref[...] = s_ref[...]

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32),
                       scratch_shapes=[pltpu.VMEM((8, 128), jnp.int32)])()
  assert (out == np.iinfo(np.int32).min).all()
  # an output block the kernel never writes keeps the (uninitialised) HBM contents
  out = pl.pallas_call(lambda o_ref: None, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32))()
  assert np.isnan(out).all()


def test_ragged_last_block_pads_reads_and_drops_writes(rng):
  x = rng.standard_normal((20, 200)).astype(np.float32)
  pads = []

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    pads.append(np.asarray(jnp.isnan(v)._data).sum())
    o_ref[...] = v * 2

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(3, 2),
                       in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                       out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)))(x)
  np.testing.assert_array_equal(out, x * 2)
  # padding shows whatever the VMEM slot held: fresh slots are NaN, reused slots hold stale data
  assert pads[0] == 0 and pads[1] == 8 * (256 - 200)


def test_single_ragged_block_padding_reads_nan(rng):
  x = rng.standard_normal((20, 200)).astype(np.float32)
  seen = {}

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    seen["nan"] = np.asarray(jnp.isnan(v)._data)
    o_ref[...] = jnp.where(jnp.isnan(v), -1.0, v)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((32, 256), x.dtype),
                       in_specs=[pl.BlockSpec((32, 256), lambda: (0, 0))],
                       out_specs=pl.BlockSpec((32, 256), lambda: (0, 0)))(x)
  ref = np.full((32, 256), -1.0, np.float32)
  ref[:20, :200] = x
  np.testing.assert_array_equal(out, ref)
  assert seen["nan"].sum() == 32 * 256 - 20 * 200


def test_pytree_specs_outputs_and_dict_scratch(x):
  def kernel(a_ref, b_ref, c_ref, diff_ref, sum_ref, *, acc, sem):   # dict leaves in sorted-key order
    acc[...] = a_ref[...] + b_ref[...]
    sum_ref[...] = acc[...] + c_ref[...]
    diff_ref[...] = a_ref[...] - b_ref[...]

  outs = pl.pallas_call(
      kernel,
      out_shape={"sum": pl.ShapeDtypeStruct((8, 256), np.float32),
                 "diff": pl.ShapeDtypeStruct((8, 256), np.float32)},
      in_specs=({"a": pl.BlockSpec((8, 256), lambda: (0, 0)), "b": pl.BlockSpec((8, 256), lambda: (1, 0))},
                pl.BlockSpec((8, 256), lambda: (2, 0))),
      out_specs={"sum": pl.BlockSpec((8, 256), lambda: (0, 0)),
                 "diff": pl.BlockSpec((8, 256), lambda: (0, 0))},
      scratch_shapes=dict(acc=pltpu.VMEM((8, 256), jnp.float32), sem=pltpu.SemaphoreType.DMA),
  )({"a": x, "b": x}, x)
  assert set(outs) == {"sum", "diff"}
  np.testing.assert_array_equal(outs["sum"], x[0:8] + x[8:16] + x[16:24])
  np.testing.assert_array_equal(outs["diff"], x[0:8] - x[8:16])


def test_tuple_and_list_outputs(x):
  def kernel(x_ref, o1, o2):
    o1[...] = x_ref[...]
    o2[...] = x_ref[...].astype(jnp.bfloat16)

  r = pl.pallas_call(kernel, out_shape=[pl.ShapeDtypeStruct(x.shape, x.dtype),
                                        pl.ShapeDtypeStruct(x.shape, jnp.bfloat16)])(x)
  assert isinstance(r, (list, tuple)) and len(r) == 2
  np.testing.assert_array_equal(r[0], x)
  np.testing.assert_array_equal(r[1], x.astype(jnp.bfloat16))


def test_smem_and_any_block_specs(x):
  def kernel(s_ref, x_hbm, o_ref, buf, sem):
    pltpu.make_async_copy(x_hbm.at[pl.ds(s_ref[1], 8)], buf, sem).start()
    pltpu.make_async_copy(x_hbm.at[pl.ds(s_ref[1], 8)], buf, sem).wait()
    o_ref[...] = buf[...] * s_ref[0].astype(jnp.float32)

  s = np.array([3, 16], np.int32)
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 256), np.float32),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                       scratch_shapes=[pltpu.VMEM((8, 256), jnp.float32), pltpu.SemaphoreType.DMA])(s, x)
  np.testing.assert_array_equal(out, x[16:24] * 3)


def test_revisited_output_accumulates_with_reduction_axis_last(rng):
  a = rng.standard_normal((16, 512)).astype(np.float32)

  def kernel(a_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += a_ref[...]

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32), grid=(2, 4),
                       in_specs=[pl.BlockSpec((8, 128), lambda i, k: (i, k))],
                       out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)),
                       compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(a)
  np.testing.assert_allclose(out, a.reshape(16, 4, 128).sum(1), rtol=1e-5, atol=1e-6)


def test_virtual_tpu_selects_chip_and_default_is_documented(x):
  from palace._src import hw
  call = pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))
  for chip in ("v4", "v5e", "v5p", "v6e", "7x"):
    with pl.virtual_tpu(chip) as tpu:
      np.testing.assert_array_equal(call(x), x)
      np.testing.assert_array_equal(call(x), x)
    assert len(tpu.reports) == 2
    assert tpu.reports[-1].chip.name == hw.get_chip(chip).name
  with pl.virtual_tpu("v6e") as outer:
    with pl.virtual_tpu("v4") as inner:
      call(x)
    call(x)
  # a nested context's launches are recorded there and in every enclosing context
  assert [len(outer.reports), len(inner.reports)] == [2, 1]
  assert [r.chip.name for r in outer.reports] == ["v4", "v6e"]
  assert hw.DEFAULT_CHIP == "v5e"
  from palace._src.sim.machine import active_tpu
  assert active_tpu().chip.name == "v5e"


def test_default_scoped_vmem_limit_depends_on_chip():
  # 2 x 12 MiB blocks fit the 32 MiB default of v6e but not the 16 MiB default of v5e
  big = np.zeros((6144, 1024), np.float32)
  call = pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((8, 1024), np.float32), grid=(2,),
                        in_specs=[pl.BlockSpec((3072, 1024), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((8, 1024), lambda i: (0, 0)))
  with pl.virtual_tpu("v6e"):
    with pytest.raises(pl.ShapeError):   # the shapes differ; only reached when VMEM fits
      call(big)
  with pl.virtual_tpu("v5e"):
    with pytest.raises(pl.ResourceError, match=r"VMEM over capacity .* \(v5e\)"):
      call(big)


def test_no_block_spec_leaf_is_a_raw_hbm_ref(x):
  seen = []

  def kernel(x_hbm, y_ref, o_ref):
    seen.append((x_hbm.memory_space, x_hbm.shape, y_ref.memory_space))
    pltpu.sync_copy(x_hbm.at[pl.ds(8, 8)], o_ref)
    o_ref[...] += y_ref[...]

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 256), np.float32),
                       in_specs=[pl.no_block_spec, pl.BlockSpec((8, 256), lambda: (0, 0))])(x, x)
  assert seen == [(pl.ANY, (64, 256), pltpu.VMEM)]
  np.testing.assert_array_equal(out, x[8:16] + x[0:8])


def test_lookahead_pipeline_mode_gives_identical_results(x):
  mode = pl.Buffered(3, use_lookahead=True)
  out = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
                       in_specs=[pl.BlockSpec((8, 256), lambda i: (i // 2, 0), pipeline_mode=mode)],
                       out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)))(x)
  np.testing.assert_array_equal(out, np.repeat(x[:32].reshape(4, 8, 256), 2, axis=0).reshape(64, 256) * 2)


def test_rank0_scalars_in_smem():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + 1

  smem = pl.BlockSpec(memory_space=pltpu.SMEM)
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((), np.int32), in_specs=[smem],
                       out_specs=smem)(np.int32(20))
  assert out.shape == () and out == 41


def test_semaphore_scratch_persists_across_steps():
  def kernel(o_ref, sem):
    i = pl.program_id(0)
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.int32) + pl.semaphore_read(sem)

    @pl.when(i < 2)
    def _():
      pl.semaphore_signal(sem, i + 5)          # carried over to the next grid step

    @pl.when(i > 0)
    def _():
      pl.semaphore_wait(sem, i + 4)            # consume what the previous step signalled

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((24, 128), jnp.int32), grid=(3,),
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                       scratch_shapes=[pltpu.SemaphoreType.REGULAR])()
  np.testing.assert_array_equal(out[::8, 0], [0, 5, 6])


def test_index_maps_may_use_jnp_and_lax_on_grid_indices(x):
  from palace import lax
  out = pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((40, 256), np.float32), grid=(5,),
                       in_specs=[pl.BlockSpec((8, 256), lambda i: (jnp.minimum(i, 2) + lax.rem(i, 2), 0))],
                       out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)))(x)
  rows = [min(i, 2) + i % 2 for i in range(5)]
  np.testing.assert_array_equal(out, np.concatenate([x[8 * r:8 * r + 8] for r in rows]))


def test_smem_blocks_are_windowed_per_grid_step():
  """An SMEM BlockSpec smaller than its array is a window, as Mosaic pipelines it: step i sees row i
  (before session 21 every step saw the whole array, row 0 first: a wrong answer). A squeezed dim
  leaves the block ref."""
  x = np.arange(4 * 128, dtype=np.int32).reshape(4, 128)

  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.int32) + x_ref[0, 1] + x_ref.shape[0] * 1000

  def squeezed(x_ref, o_ref):
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.int32) + x_ref[1] + len(x_ref.shape) * 1000
  for k, spec, rows in ((kernel, pl.BlockSpec((1, 128), lambda i: (i, 0), memory_space=pltpu.SMEM), 1),
                        (squeezed, pl.BlockSpec((None, 128), lambda i: (i, 0), memory_space=pltpu.SMEM), 1)):
    out = pl.pallas_call(k, grid=(4,), in_specs=[spec], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                         out_shape=pl.ShapeDtypeStruct((32, 128), jnp.int32))(x)
    np.testing.assert_array_equal(out[::8, 0], x[:, 1] + rows * 1000)
