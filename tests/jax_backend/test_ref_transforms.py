"""Real JAX kernels through palace.jax: ref bitcasts that change the element width (packed along the
second-minor axis, checked against a NumPy reference and against JAX's own `state_utils.bitcast`),
chains of ref transforms, and SparseCore stores that add or compress (`plsc.addupdate`,
`addupdate_compressed`, `store_compressed`: JAX binds them as a `swap` with `add` / `compress`)."""
import functools

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax._src.state import utils as state_utils
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import palace as ppl
import palace.jax as pj
from bitcast_reference import ref_bitcast


def test_the_numpy_reference_is_jax_state_bitcast(rng):
  for src, dst, shape in [(np.int32, np.int16, (3, 8, 5)), (np.int16, np.int32, (3, 8, 5)),
                          (np.int32, np.int8, (4, 6)), (ml_dtypes.bfloat16, np.uint32, (8, 4))]:
    x = rng.integers(-100, 100, shape).astype(src)
    np.testing.assert_array_equal(np.asarray(state_utils.bitcast(jnp.asarray(x), dst)),
                                  ref_bitcast(x, dst))


@pytest.mark.parametrize("slice_first", [True, False])
def test_load_and_store_through_bitcast_views(slice_first):
  x = np.arange(4 * 8 * 128, dtype=np.int32).reshape(16, 256)
  xb = np.arange(16 * 128).astype(ml_dtypes.bfloat16).reshape(16, 128)

  def load(x_ref, y_ref):
    ref = x_ref.at[:8, :128].bitcast(jnp.int16) if slice_first else \
        x_ref.bitcast(jnp.int16).at[:16, :128]
    pltpu.store(y_ref, pltpu.load(ref))

  def store(x_ref, y_ref):
    y_ref[...] = jnp.zeros(y_ref.shape, jnp.int32)
    ref = y_ref.at[:8, :128].bitcast(jnp.bfloat16) if slice_first else \
        y_ref.bitcast(jnp.bfloat16).at[:16, :128]
    ref[...] = x_ref[...]

  with pj.virtual_tpu("v5e") as tpu:
    y = pl.pallas_call(load, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int16))(x)
    z = pl.pallas_call(store, out_shape=jax.ShapeDtypeStruct((16, 256), jnp.int32))(xb)
    y, z = np.asarray(y), np.asarray(z)
  expected = ref_bitcast(x[:8, :128], np.int16) if slice_first else ref_bitcast(x, np.int16)[:16, :128]
  np.testing.assert_array_equal(y, expected)
  np.testing.assert_array_equal(z[:8, :128], ref_bitcast(xb, np.int32))
  assert len(tpu.reports) == 2


def test_dma_of_a_bitcast_hbm_ref_and_a_chain_of_transforms():
  x = np.arange(4 * 8 * 128, dtype=np.int32).reshape(16, 1, 256)
  x2 = np.arange(32 * 256, dtype=np.int32).reshape(32, 256)

  def dma(x_hbm, y_hbm):
    def body(sem):
      pltpu.async_copy(x_hbm.bitcast(jnp.int16).at[:8, :, :128], y_hbm.at[...], sem).wait()
    pl.run_scoped(body, pltpu.SemaphoreType.DMA)

  def chain(x_ref, y_ref):
    y_ref[...] = (x_ref.at[:16, :256].bitcast(jnp.int16).reshape((2, 16, 256)).bitcast(jnp.float16)
                  .at[1:, :, :].reshape((16, 256)).at[:, :128].bitcast(jnp.int32))[...]

  with pj.virtual_tpu("v5e"):
    y = np.asarray(pl.pallas_call(dma, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                                  out_specs=pl.BlockSpec(memory_space=pl.ANY),
                                  out_shape=jax.ShapeDtypeStruct((8, 2, 128), jnp.int16))(x))
    z = np.asarray(pl.pallas_call(chain, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))(x2))
  np.testing.assert_array_equal(y, ref_bitcast(x, np.int16)[:8, :, :128])
  np.testing.assert_array_equal(z, x2[8:16, :128])


@pytest.mark.parametrize("transform", ["narrowing bitcast", "same-width bitcast", "reshape"])
def test_views_of_a_replayed_launch_read_each_launchs_data(rng, transform):
  """A kernel launched again with new data (palace.jax keeps and replays such launches, rebinding their
  buffers): its bitcast and reshape views read the new operands, not those of the launch that made
  them (until session 37 the same-width bitcast and the reshape read stale data from the third call)."""
  view, shape, dtype, expected = {
      "narrowing bitcast": (lambda r: r.bitcast(jnp.int16), (32, 128), jnp.int16,
                            lambda x: ref_bitcast(x, np.int16)),
      "same-width bitcast": (lambda r: r.bitcast(jnp.float32), (16, 128), jnp.float32,
                             lambda x: x.view(np.float32)),
      "reshape": (lambda r: r.reshape(8, 256), (8, 256), jnp.int32, lambda x: x.reshape(8, 256)),
  }[transform]

  def kernel(x_ref, y_ref):
    y_ref[...] = view(x_ref)[...]

  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, dtype)))
  with pj.virtual_tpu("v5e"):
    for _ in range(4):
      x = rng.integers(-2**31, 2**31 - 1, (16, 128), dtype=np.int64).astype(np.int32)
      got = np.asarray(f(x))
      np.testing.assert_array_equal(got.view(np.uint8), expected(x).view(np.uint8))


def _vector_kernel(body, out_shape, mesh):
  """JAX's SparseCore test harness in small: `body` on whole-array VMEM blocks of a vector subcore."""
  @functools.partial(pl.kernel, out_type=out_shape, mesh=mesh)
  def k(*hbm):
    pltpu.emit_pipeline(body, grid=(1,), in_specs=[pl.BlockSpec()] * (len(hbm) - 1),
                        out_specs=[pl.BlockSpec()])(*hbm)
  return k


def test_sparsecore_addupdate_and_compressed_stores():
  with pj.virtual_tpu("7x") as tpu:
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes
    out = jax.ShapeDtypeStruct((lanes,), jnp.int32)

    def add(o_ref):
      o_ref[...] = jnp.zeros_like(o_ref)
      for i in range(lanes):
        plsc.addupdate(o_ref.at[...], jax.lax.broadcast(i, o_ref.shape))

    def compressed(x_ref, o_ref):
      o_ref[...] = jnp.full(o_ref.shape, 100, jnp.int32)
      m = x_ref[...] % 3 == 0
      plsc.store_compressed(o_ref.at[...], x_ref[...], mask=m)
      plsc.addupdate_compressed(o_ref.at[...], x_ref[...], mask=m)

    added = np.asarray(_vector_kernel(add, out, mesh)())
    x = np.arange(lanes, dtype=np.int32)
    got = np.asarray(_vector_kernel(compressed, out, mesh)(x))
  np.testing.assert_array_equal(added, np.full(lanes, sum(range(lanes))))
  picked = x[x % 3 == 0]
  expected = np.full(lanes, 100, np.int32)
  expected[:picked.size] = 2 * picked
  np.testing.assert_array_equal(got, expected)
  assert len(tpu.reports) == 2


@pytest.mark.parametrize("src,dst", [(np.int32, ml_dtypes.int4), (ml_dtypes.int4, np.int16),
                                     (np.float32, ml_dtypes.int4)])
def test_a_4_bit_ref_bitcast_equals_the_value_bitcast(src, dst):
  # refs.PackedRef: the whole view loads as pltpu.bitcast of the whole value (JAX's tpu_ops_test
  # test_bitcast compares the two forms the same way)
  bits = lambda d: 4 if np.dtype(d) == np.dtype(ml_dtypes.int4) else np.dtype(d).itemsize * 8  # noqa: E731
  rows_in, rows_out = 32 // bits(src), 32 // bits(dst)
  x = np.arange(rows_in * 256).reshape(rows_in, 256).astype(src)

  def by_ref(x_ref, o_ref):
    o_ref[...] = x_ref.bitcast(dst)[...]

  def by_value(x_ref, o_ref):
    o_ref[...] = pltpu.bitcast(x_ref[...], dst)
  out = jax.ShapeDtypeStruct((rows_out, 256), dst)
  with pj.virtual_tpu("v5e"):
    a = np.asarray(pl.pallas_call(by_ref, out_shape=out)(x))
    b = np.asarray(pl.pallas_call(by_value, out_shape=out)(x))
  np.testing.assert_array_equal(a.astype(np.int64) if bits(dst) == 4 else a.view(np.uint8),
                                b.astype(np.int64) if bits(dst) == 4 else b.view(np.uint8))
  if src == np.int32:   # row 8i + k is nibble k of row i, the lowest first
    want = ((x[:, None, :] >> (4 * np.arange(8))[None, :, None]) & 0xF).reshape(8 * rows_in, 256)
    np.testing.assert_array_equal(a.astype(np.int64) & 0xF, want)


def _select_copy(num_refs):
  """A kernel copying, per step i of a loop, the ref pl.select_ref(idx[i], *x_refs) (a DMA source picked
  at run time) into row block i of the output, on the semaphore select_ref(i % 2, ...) picks."""
  def kernel(idx_ref, *refs):
    *x_refs, o_ref, sems = refs

    @pl.loop(0, idx_ref.shape[0])
    def _(i):
      sem = pl.select_ref(i % 2, sems.at[0], sems.at[1])
      pltpu.async_copy(pl.select_ref(idx_ref[i], *x_refs), o_ref.at[pl.ds(8 * i, 8)], sem).wait()

  def call(idx, *xs):
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8 * idx.shape[0], 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * num_refs,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))]))(idx, *xs)
  return call


def test_a_dma_of_a_ref_picked_at_run_time_by_select_ref_copies_that_ref(rng):
  """pl.select_ref (JAX's SelectTransform) in a DMA's source and semaphore: the ref the index picks
  (before session 20 palace refused 'an operand of type tuple where a ref belongs')."""
  xs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(3)]
  idx = np.array([2, 0, 1, 2], np.int32)
  with pj.virtual_tpu("v5e"):
    got = np.asarray(jax.jit(_select_copy(3))(idx, *xs))
  np.testing.assert_array_equal(got, np.concatenate([xs[i] for i in idx]))


def test_a_select_ref_index_past_its_refs_picks_the_last_one_as_the_tpu_lowering_does(rng):
  """JAX's TPU lowering compiles select_ref to a chain of `idx == 0` tests whose last else is the last
  ref (_select_to_ifop): indices 2, 5 and -1 of three refs take the third (JAX's test_select_ref
  relies on it for its semaphores)."""
  xs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(3)]
  idx = np.array([0, 1, 2, 5, -1], np.int32)
  with pj.virtual_tpu("v5e"):
    got = np.asarray(jax.jit(_select_copy(3))(idx, *xs))
  np.testing.assert_array_equal(got, np.concatenate([xs[i] for i in (0, 1, 2, 2, 2)]))


def test_a_reshaped_select_ref_of_select_refs_is_a_dma_source(rng):
  """A view of a select_ref nests it (TransformedRef(ref=TransformedRef)); before session 21 palace
  refused 'an operand of type TransformedRef where a ref belongs'."""
  a, b = (rng.standard_normal((8, 256)).astype(np.float32) for _ in range(2))

  def kernel(a_ref, b_ref, o_ref):
    def body(sem):
      for i in range(2):
        halves = [pl.select_ref(1 - i, r.at[:, :128], r.at[:, 128:]) for r in (a_ref, b_ref)]
        src = pl.select_ref(i, *halves).reshape(4, 256)
        pltpu.async_copy(src, o_ref.at[pl.ds(4 * i, 4)], sem.at[0]).wait()
    pl.run_scoped(body, pltpu.SemaphoreType.DMA((1,)))
  with pj.virtual_tpu("v5e"):
    got = np.asarray(pl.pallas_call(
        kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))(a, b))
  np.testing.assert_array_equal(got, np.concatenate([a[:, 128:].reshape(4, 256),
                                                     b[:, :128].reshape(4, 256)]))


def _table_kernel(steps: int):
  """A grid of `steps` 8-row blocks whose index map reads its block from an SMEM table and whose
  body reads a scale from it and counts its steps in an SMEM scratch (scalar reads and a scalar
  read-modify-write at indices that change every step)."""
  def kernel(tbl_ref, x_ref, o_ref, n_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
      n_ref[0] = 0
    n_ref[0] = n_ref[0] + tbl_ref[i, 1]
    o_ref[...] = x_ref[...] * (tbl_ref[i, 1] + n_ref[0]).astype(jnp.float32)
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((8 * steps, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(steps,),
          in_specs=[pl.BlockSpec((8, 128), lambda i, t: (t[i, 0], 0))],
          out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0)),
          scratch_shapes=[pltpu.SMEM((1,), jnp.int32)]))


def _calls_per_launch(monkeypatch, method: str) -> dict:
  """{steps: calls of refs.Ref.<method> in the first launch of the table kernel at that many steps},
  for 4 and 32 steps, each launch's output checked against the NumPy reference."""
  from palace._src.lang import refs
  calls = []
  real = getattr(refs.Ref, method)
  monkeypatch.setattr(refs.Ref, method, lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
  counts = {}
  for steps in (4, 32):
    rng = np.random.default_rng(3)
    tbl = np.stack([rng.permutation(steps), rng.integers(1, 5, steps)], axis=1).astype(np.int32)
    x = rng.standard_normal((8 * steps, 128)).astype(np.float32)
    f = jax.jit(_table_kernel(steps))
    calls.clear()
    with pj.virtual_tpu("v5e"):
      out = np.asarray(f(tbl, x))   # (a new kernel: nothing kept from an earlier launch)
    counts[steps] = len(calls)
    scale = (tbl[:, 1] + np.cumsum(tbl[:, 1])).astype(np.float32)
    want = np.concatenate([x[8 * b:8 * b + 8] * s for b, s in zip(tbl[:, 0], scale)])
    np.testing.assert_array_equal(out, want)
  return counts


def test_scalar_reads_and_writes_at_runtime_indices_make_no_view_per_step(monkeypatch):
  # an element of an SMEM table at a grid-dependent index is read or written without making a Ref
  # view per access (Ref._target; a view per scalar access was most of a splash attention index
  # map's cost): the views a kernel's first launch makes do not grow with its steps
  views = _calls_per_launch(monkeypatch, "__init__")
  assert views[32] == views[4], views


def test_scalar_reads_and_writes_at_runtime_indices_compose_no_index_per_step(monkeypatch):
  # an in-range element of an SMEM ref at a runtime index is read (the body's table reads and the
  # index map's) and written (the scratch counter) without composing the index as a view would
  # (Ref._element_index): the compositions of a launch do not grow with its steps
  composed = _calls_per_launch(monkeypatch, "_compose")
  assert composed[32] == composed[4], composed


_OUT_OF_RANGE = r"Index {} out of bounds for axis 0 of args\[0\] \(shape \(4,\), smem\) at grid point \(0,\)"


@pytest.mark.parametrize("index, message", [(lambda i: i + 100, _OUT_OF_RANGE.format(100)),
                                            (lambda i: i - 4, _OUT_OF_RANGE.format(-4))])
def test_an_out_of_range_scalar_read_at_a_runtime_index_is_still_refused(index, message):
  # (an index outside the ref takes the general path: its bounds check and message)
  def kernel(t_ref, o_ref):
    o_ref[...] = jnp.full(o_ref.shape, t_ref[index(pl.program_id(0))], jnp.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32), grid=(4,),
                     in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
  with pytest.raises(ppl.OutOfBoundsError, match=message), pj.virtual_tpu("v5e"):
    jax.block_until_ready(jax.jit(f)(np.arange(4, dtype=np.int32)))


def test_a_scalar_read_and_write_of_a_windowed_smem_view_at_a_runtime_index():
  # an element of a view (a window of an SMEM ref: start and stride) at a runtime index reads and
  # writes the element the view selects
  def kernel(t_ref, o_ref, s_ref):
    i = pl.program_id(0)
    s_ref[i] = t_ref.at[pl.ds(1, 4, 2)][i] * 10
    o_ref[...] = jnp.full(o_ref.shape, s_ref.at[pl.ds(0, 4)][i] + s_ref[i], jnp.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.int32), grid=(4,),
                     in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     scratch_shapes=[pltpu.SMEM((4,), jnp.int32)])
  t = np.arange(8, dtype=np.int32) * 3
  with pj.virtual_tpu("v5e"):
    out = np.asarray(jax.jit(f)(t))
  want = np.repeat(t[1::2] * 20, 8)[:, None] * np.ones((1, 128), np.int32)
  np.testing.assert_array_equal(out, want)


def test_an_index_is_built_by_one_builder_made_once_per_entry_list():
  """ref_operands._index_builder: the index a ref access reads or writes at, for every entry kind
  (a static int, runtime indices, a pl.ds at a runtime start, a general entry's function); runtime
  indices alone are built by a C call (no Python frame per access)."""
  import operator

  from palace._src.jax import ref_operands as ro
  from palace._src.lang.ref_index import Slice
  flat = ("ref", 7, 3, 5)
  build = ro._index_builder(((ro._DYNAMIC, 2, 0, 0),))
  assert type(build) is operator.itemgetter and build(flat) == (3,)
  build = ro._index_builder(((ro._DYNAMIC, 3, 0, 0), (ro._DYNAMIC, 1, 0, 0)))
  assert type(build) is operator.itemgetter and build(flat) == (5, 7)
  build = ro._index_builder(((ro._STATIC, 4, 0, 0), (ro._DYNAMIC, 1, 0, 0), (ro._DYNAMIC_SLICE, 2, 8, 2),
                             (ro._GENERAL, lambda f: f[3] * 10, 0, 0)))
  assert build(flat) == (4, 7, Slice(3, 8, 2), 50)
  assert ro._index_builder(())(flat) == ()
