"""SparseCore meshes through real JAX: `pl.kernel` over plsc.ScalarSubcoreMesh / VectorSubcoreMesh runs
on palace's SparseCore subcores, including JAX's emit_pipeline split over subcores and indexed
(gather / scatter) DMAs whose index is a VMEM ref."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import palace.jax as pj


def test_scalar_subcores_prefix_sum_per_core():
  x = (np.arange(2 * 16) % 7).reshape(2, 16).astype(np.int32)
  with pj.virtual_tpu("7x") as tpu:
    mesh = plsc.ScalarSubcoreMesh(axis_name="c", num_cores=2)

    @jax.jit
    def prefix(x):
      @pl.kernel(out_type=x, mesh=mesh, scratch_types=[pltpu.SMEM((16,), jnp.int32),
                                                       pltpu.SemaphoreType.DMA])
      def k(x_hbm, o_hbm, buf, sem):
        c = jax.lax.axis_index("c")
        pltpu.async_copy(x_hbm.at[c], buf, sem).wait()

        @pl.loop(1, 16)
        def _(i):
          buf[i] = buf[i] + buf[i - 1]

        pltpu.async_copy(buf, o_hbm.at[c], sem).wait()
      return k(x)

    out = np.asarray(prefix(x))
  np.testing.assert_array_equal(out, np.cumsum(x, axis=1))
  assert len(tpu.reports) == 1 and tpu.reports[0].device_cycles > 0


def test_vector_subcores_pipeline_split_over_both_axes():
  x = (np.arange(256 * 128) % 11).reshape(256, 128).astype(np.int32)
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")
    lanes = pltpu.get_tpu_info().sparse_core.num_lanes

    @jax.jit
    def double(x):
      @pl.kernel(out_type=x, mesh=mesh)
      def k(x_hbm, o_hbm):
        def body(i_vmem, o_vmem):
          @pl.loop(0, i_vmem.shape[0])
          def _(r):
            @pl.loop(0, i_vmem.shape[1], step=lanes)
            def _(c):
              o_vmem[pl.ds(r, 1), pl.ds(c, lanes)] = i_vmem[pl.ds(r, 1), pl.ds(c, lanes)] * 2
        pltpu.emit_pipeline(body, grid=(x.shape[0] // 8, 1),
                            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                            out_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                            core_axis_name=("c", "s"),
                            dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL))(x_hbm, o_hbm)
      return k(x)

    out = np.asarray(double(x))
  np.testing.assert_array_equal(out, x * 2)


@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_indexed_dma_with_a_vmem_index_ref(direction):
  rows, width, window = 64, 128, 16
  table = (np.arange(rows * width) % 97).reshape(rows, width).astype(np.int32)
  perm = np.random.default_rng(0).permutation(rows).astype(np.int32)
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")

    @jax.jit
    def indexed(data, idx):
      idx = idx.reshape(1, rows)

      @pl.kernel(out_type=jax.ShapeDtypeStruct((rows, width), data.dtype), mesh=mesh)
      def k(d_hbm, i_hbm, o_hbm):
        if direction == "gather":
          def body(i_vmem, o_vmem):
            pltpu.sync_copy(d_hbm.at[i_vmem.at[0]], o_vmem)
          specs = dict(in_specs=[pl.BlockSpec((1, window), lambda i: (0, i))],
                       out_specs=[pl.BlockSpec((window, width), lambda i: (i, 0))])
          operands = (i_hbm, o_hbm)
        else:
          def body(d_vmem, i_vmem):
            pltpu.sync_copy(d_vmem, o_hbm.at[i_vmem.at[0]])
          specs = dict(in_specs=[pl.BlockSpec((window, width), lambda i: (i, 0)),
                                 pl.BlockSpec((1, window), lambda i: (0, i))], out_specs=[])
          operands = (d_hbm, i_hbm)
        pltpu.emit_pipeline(body, grid=(rows // window,), core_axis_name="s",
                            dimension_semantics=(pltpu.PARALLEL,), **specs)(*operands)
      return k(data, idx)

    out = np.asarray(indexed(table, perm))
  if direction == "gather":
    np.testing.assert_array_equal(out, table[perm])
  else:
    expected = np.empty_like(table)
    expected[perm] = table
    np.testing.assert_array_equal(out, expected)


def test_every_launch_kind_yields_one_palace_report_on_7x():
  """Issue 37: each kind of launch (pallas_call; pl.kernel and core_map over TensorCore, SparseCore
  vector-subcore and scalar-subcore meshes; core_map eager and jitted) runs on palace and leaves
  exactly one report, with the right result."""
  lanes = 16
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  v = np.arange(16 * lanes, dtype=np.int32).reshape(16, lanes)
  with pj.virtual_tpu("7x") as tpu:
    tc = pltpu.create_tensorcore_mesh("core")
    vec = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1)
    scalar = plsc.ScalarSubcoreMesh(axis_name="c", num_cores=1)
    counts = []

    def launched(out, expected):
      np.testing.assert_array_equal(np.asarray(out), expected)
      counts.append(len(tpu.reports))

    def add_one(x_ref, o_ref):
      o_ref[...] = x_ref[...] + 1
    launched(pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x), x + 1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), mesh=tc)
    def tc_copy(x_hbm, o_hbm):
      pltpu.sync_copy(x_hbm, o_hbm)
    launched(tc_copy(x), x)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((lanes,), jnp.int32), mesh=scalar,
               scratch_types=[pltpu.SMEM((lanes,), jnp.int32), pltpu.SemaphoreType.DMA])
    def scalar_fill(o_hbm, buf, sem):
      @pl.loop(0, lanes)
      def _(i):
        buf[i] = i * 3
      pltpu.async_copy(buf, o_hbm, sem).wait()
    launched(scalar_fill(), np.arange(lanes) * 3)

    def doubled_rows(v):
      v_ref = jax.new_ref(v)

      @pl.core_map(vec)
      def _():
        s = jax.lax.axis_index("s")

        def body(buf):
          pltpu.sync_copy(v_ref.at[s], buf)
          buf[...] = buf[...] * 2
          pltpu.sync_copy(buf, v_ref.at[s])
        pl.run_scoped(body, pltpu.VMEM((lanes,), jnp.int32))
      return jax.freeze(v_ref)
    launched(doubled_rows(v), 2 * v)            # eager
    launched(jax.jit(doubled_rows)(v), 2 * v)   # jitted

    @jax.jit
    def tripled(x):
      x_ref = jax.new_ref(x)

      @pl.core_map(tc)
      def _():
        def body(buf):
          pltpu.sync_copy(x_ref, buf)
          buf[...] = buf[...] * 3
          pltpu.sync_copy(buf, x_ref)
        pl.run_scoped(body, pltpu.VMEM(x.shape, x.dtype))
      return jax.freeze(x_ref)
    launched(tripled(x), 3 * x)
  assert counts == [1, 2, 3, 4, 5, 6]
  assert all(r.device_cycles > 0 for r in tpu.reports)



def _protocol_mesh(core_type, shape, space):
  """A mesh that is none of JAX's mesh classes, only something answering JAX's Mesh protocol (built as
  JAX's own tpu_sparsecore_pallas_test builds one, with unittest.mock): palace knows it by its core
  type and shape."""
  from unittest import mock  # noqa: PLC0415
  mesh = mock.MagicMock()
  mesh.axis_names, mesh.shape, mesh.axis_sizes = tuple(shape), dict(shape), dict(shape)
  mesh.core_type, mesh.default_memory_space = core_type, space
  mesh.dimension_semantics = [pltpu.GridDimensionSemantics.PARALLEL] * len(shape)
  return mesh


def test_a_mesh_is_known_by_its_core_type_not_its_class():
  # (one core, as JAX's mock: a MagicMock also answers `discharges_effect` truthily, which changes
  # how JAX traces a kernel of several cores)
  x = (np.arange(16) % 7).reshape(1, 16).astype(np.int32)
  mesh = _protocol_mesh(pltpu.CoreType.SC_SCALAR_SUBCORE, {"c": 1}, pltpu.SMEM)
  with pj.virtual_tpu("7x") as tpu:
    @jax.jit
    def double(x):
      @pl.kernel(out_type=x, mesh=mesh, scratch_types=[pltpu.SMEM((16,), jnp.int32)])
      def k(x_hbm, o_hbm, buf):
        pltpu.sync_copy(x_hbm.at[0], buf)
        for i in range(16):
          buf[i] = buf[i] * 2
        pltpu.sync_copy(buf, o_hbm.at[0])
      return k(x)

    out = np.asarray(double(x))
  np.testing.assert_array_equal(out, 2 * x)
  assert len(tpu.reports) == 1


def test_a_mesh_of_another_core_type_is_refused():
  mesh = _protocol_mesh("gpu_warp", {"c": 2}, pltpu.SMEM)
  with pj.virtual_tpu("7x"), pytest.raises(Exception, match=r"pl\.kernel '\w+' over a MagicMock "
                                           r"\(core type 'gpu_warp'\) is not supported yet"):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((8,), jnp.int32), mesh=mesh)
    def k(o_hbm):
      del o_hbm
    jax.block_until_ready(jax.jit(k)())
