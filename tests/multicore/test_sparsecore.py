"""SparseCore meshes: every subcore runs, indexed gather/scatter DMAs, plsc vector ops, MPMD."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc


def test_sparsecore_mesh_on_chip_without_sparsecores_is_an_error():
  with pl.virtual_tpu("v5e"), pytest.raises(pl.UsageError, match=r"v5e\) does not have SparseCores"):
    plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")


def test_all_64_vector_subcores_of_v5p_write_their_rows():
  with pl.virtual_tpu("v5p") as tpu:
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
    n = mesh.num_cores * mesh.num_subcores
    lanes = plsc.get_sparse_core_info().num_lanes

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((n, lanes), np.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), jnp.int32)])
    def k(o_hbm, buf):
      wid = lax.axis_index(("core", "subcore"))
      buf[...] = jnp.full((lanes,), 1, jnp.int32) * wid + lax.axis_size(("core", "subcore"))
      pltpu.sync_copy(buf, o_hbm.at[wid])

    out = k()
  assert n == 64
  np.testing.assert_array_equal(out, np.arange(n)[:, None] + n + np.zeros((n, lanes), np.int32))
  cores = {e[0][1] for e in tpu.reports[-1].events}
  assert len(cores) == 64


@pytest.mark.parametrize("chip", ["v6e", "7x"])
def test_indexed_gather_equals_table_take(chip):
  rng = np.random.default_rng(0)
  table = rng.standard_normal((256, 128)).astype(np.float32)
  with pl.virtual_tpu(chip):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
    workers = mesh.num_cores * mesh.num_subcores
    per = 8
    idx = rng.integers(0, 256, size=workers * per).astype(np.int32)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((workers * per, 128), np.float32),
                       mesh=mesh, scratch_types=[pltpu.VMEM((per,), jnp.int32),
                                                 pltpu.VMEM((per, 128), jnp.float32)])
    def gather(table_hbm, idx_hbm, out_hbm, idx_vmem, rows_vmem):
      wid = lax.axis_index(("core", "subcore"))
      pltpu.sync_copy(idx_hbm.at[pl.ds(wid * per, per)], idx_vmem)
      pltpu.sync_copy(table_hbm.at[idx_vmem], rows_vmem)
      pltpu.sync_copy(rows_vmem, out_hbm.at[pl.ds(wid * per, per)])

    out = gather(table, idx)
  np.testing.assert_array_equal(out, table[idx])


def test_scatter_add_equals_np_add_at_and_ignored_entries_are_skipped():
  rng = np.random.default_rng(1)
  updates = rng.standard_normal((16, 128)).astype(np.float32)
  idx = np.array([3, 5, 3, 7, 0, 5, 5, 1, 2, 3, 4, 6, 7, 0, 1, 2], np.int32)
  idx_ignored = idx.copy()
  idx_ignored[::4] = -1
  with pl.virtual_tpu("v6e"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1,
                                  num_subcores=1)

    def make(ignored):
      @functools.partial(pl.kernel, out_type=(), mesh=mesh,
                         scratch_types=[pltpu.VMEM((16,), jnp.int32), pltpu.VMEM((16, 128), jnp.float32)])
      def scatter_add(upd_hbm, idx_hbm, acc_hbm, idx_vmem, upd_vmem):
        pltpu.sync_copy(idx_hbm, idx_vmem)
        pltpu.sync_copy(upd_hbm, upd_vmem)
        target = plsc.Indices(idx_vmem, ignored_value=-1) if ignored else idx_vmem
        pltpu.sync_copy(upd_vmem, acc_hbm.at[target], add=True)
      return scatter_add

    acc = pl.new_ref(np.zeros((8, 128), np.float32))
    make(False)(updates, idx, acc)
    acc2 = pl.new_ref(np.zeros((8, 128), np.float32))
    make(True)(updates, idx_ignored, acc2)
  ref = np.zeros((8, 128), np.float32)
  np.add.at(ref, idx, updates)
  np.testing.assert_allclose(pl.freeze(acc), ref, rtol=1e-6, atol=1e-6)
  ref2 = np.zeros((8, 128), np.float32)
  keep = idx_ignored != -1
  np.add.at(ref2, idx_ignored[keep], updates[keep])
  np.testing.assert_allclose(pl.freeze(acc2), ref2, rtol=1e-6, atol=1e-6)


def test_vector_ops_and_subcore_barrier():
  lanes = 8
  x = np.array([5, 1, 4, 1, 5, 9, 2, 6], np.int32)
  with pl.virtual_tpu("v5p"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=2)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((6, lanes), np.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32),
                                      pltpu.VMEM_SHARED((2, lanes), jnp.int32)])
    def k(x_hbm, o_hbm, xv, tmp, shared):
      s = lax.axis_index("s")
      pltpu.sync_copy(x_hbm, xv)
      v = xv[...]
      mask = v > 2

      @pl.when(s == 0)
      def _():
        tmp[...] = plsc.cumsum(v, mask=mask)
        pltpu.sync_copy(tmp, o_hbm.at[0])
        keys, vals = plsc.sort_key_val(v, jnp.arange(lanes, dtype=jnp.int32))
        tmp[...] = keys
        pltpu.sync_copy(tmp, o_hbm.at[1])
        tmp[...] = vals
        pltpu.sync_copy(tmp, o_hbm.at[2])
        tmp[...] = plsc.load_gather(xv, [jnp.arange(lanes, dtype=jnp.int32)[::-1] if False else
                                         (lanes - 1) - jnp.arange(lanes, dtype=jnp.int32)])
        pltpu.sync_copy(tmp, o_hbm.at[3])
        tmp[...] = plsc.all_reduce_population_count(mask)
        pltpu.sync_copy(tmp, o_hbm.at[4])

      # each subcore writes its row of shared VMEM; after the barrier subcore 1 reads both
      tmp[...] = jnp.full((lanes,), 10, jnp.int32) * (s + 1)
      pltpu.sync_copy(tmp, shared.at[s])
      plsc.subcore_barrier()

      @pl.when(s == 1)
      def _():
        pltpu.sync_copy(shared.at[0], tmp)
        xv[...] = tmp[...]
        pltpu.sync_copy(shared.at[1], tmp)
        tmp[...] = tmp[...] + xv[...]
        pltpu.sync_copy(tmp, o_hbm.at[5])

    out = k(x)
  np.testing.assert_array_equal(out[0], np.cumsum(np.where(x > 2, x, 0)))
  order = np.argsort(x, kind="stable")
  np.testing.assert_array_equal(out[1], x[order])
  np.testing.assert_array_equal(out[2], order)
  np.testing.assert_array_equal(out[3], x[::-1])
  np.testing.assert_array_equal(out[4], np.full(lanes, (x > 2).sum()))
  np.testing.assert_array_equal(out[5], np.full(lanes, 30))


def test_mpmd_vector_and_scalar_subcores():
  with pl.virtual_tpu("v5p"):
    vmesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1,
                                   num_subcores=4)
    smesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)

    def vector_body(o_hbm, flag, buf):
      s = lax.axis_index("subcore")
      buf[...] = jnp.full((8,), 1, jnp.int32) * (s + 100)
      pltpu.sync_copy(buf, o_hbm.at[s])

    def scalar_body(o_hbm, flag, buf):
      flag[0] = 7

    k = pl.kernel([vector_body, scalar_body], out_type=pl.ShapeDtypeStruct((4, 8), np.int32),
                  mesh=[vmesh, smesh], scratch_types=[pltpu.SMEM((1,), jnp.int32),
                                                      pltpu.VMEM((8,), jnp.int32)])
    out = k()
  np.testing.assert_array_equal(out, np.arange(100, 104)[:, None] * np.ones((1, 8), np.int32))


def _exchange_kernel(smesh, vmesh, subcores: int, wait_on_scalar_sem: bool = False):
  """The scalar subcore of each SparseCore puts its rows in shared VMEM and signals each vector
  subcore on the vector mesh's semaphore; subcore s doubles row s in place, adds 1 and signals the
  scalar subcore's semaphore; the scalar subcore waits for all of them and copies the rows out."""
  def scalar_body(x_hbm, o_hbm, shared, to_vec, to_scs):
    c = lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[c], shared)
    for s in range(subcores):
      pl.semaphore_signal(to_vec, device_id={"subcore": s})
    pl.semaphore_wait(to_scs, subcores)
    pltpu.sync_copy(shared, o_hbm.at[c])

  def vector_body(x_hbm, o_hbm, shared, to_vec, to_scs):
    s = lax.axis_index("subcore")

    def body(v):
      pl.semaphore_wait(to_scs if wait_on_scalar_sem else to_vec, 1)
      pltpu.sync_copy(shared.at[s], v)
      v[...] = v[...] * 2 + 1
      pltpu.sync_copy(v, shared.at[s])
    pl.run_scoped(body, pltpu.VMEM((16,), np.int32))
    pl.semaphore_signal(to_scs)

  return pl.kernel([scalar_body, vector_body], out_type=pl.ShapeDtypeStruct((2, subcores, 16), np.int32),
                   mesh=[smesh, vmesh],
                   scratch_types=[pltpu.VMEM_SHARED((subcores, 16), np.int32),
                                  pltpu.SemaphoreType.REGULAR(()) @ vmesh,
                                  pltpu.SemaphoreType.REGULAR(()) @ smesh])


def test_mpmd_semaphores_tied_to_a_mesh_are_signalled_there():
  x = (np.arange(2 * 3 * 16) % 11).reshape(2, 3, 16).astype(np.int32)
  with pl.virtual_tpu("7x") as tpu:
    smesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)
    vmesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=2,
                                   num_subcores=3)
    out = _exchange_kernel(smesh, vmesh, 3)(x)
  np.testing.assert_array_equal(out, x * 2 + 1)
  assert len(tpu.reports) == 1


def test_mpmd_wait_on_another_meshs_semaphore_is_refused():
  with pl.virtual_tpu("7x"):
    smesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)
    vmesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=2,
                                   num_subcores=1)
    k = _exchange_kernel(smesh, vmesh, 1, wait_on_scalar_sem=True)
    with pytest.raises(pl.UnsupportedError, match=r"pl.semaphore_wait on scratch\[2\], a semaphore tied "
                                                  r"to ScalarSubcoreMesh\(core=2\), from a core of another "
                                                  r"mesh \(on chip 0 SparseCore \d+ vector subcore \d+ in kernel "
                                                  r"'scalar_body_vector_body'; test_sparsecore.py:\d+\)"):
      k(np.zeros((2, 1, 16), np.int32))


def test_mpmd_semaphore_of_a_mesh_without_a_body_is_refused():
  with pl.virtual_tpu("7x"):
    smesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2)
    vmesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=2,
                                   num_subcores=1)

    def body(sem):
      pl.semaphore_signal(sem)

    k = pl.kernel(body, out_type=(), mesh=smesh, scratch_types=[pltpu.SemaphoreType.REGULAR(()) @ vmesh])
    with pytest.raises(pl.UnsupportedError, match=r"test_sparsecore.py:\d+: scratch\[0\] of kernel 'body' is a semaphore tied to "
                                                  r"VectorSubcoreMesh\(.*\), a mesh the kernel does not run "
                                                  r"a body on"):
      k()


def test_device_ids_address_vector_subcores_of_a_mesh_smaller_than_the_chip():
  """A VectorSubcoreMesh of 1 subcore per SparseCore: core 1's subcore 0 is the chip's subcore 16."""
  with pl.virtual_tpu("7x"):
    vmesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=2,
                                   num_subcores=1)

    def body(o_hbm, sem):
      c = lax.axis_index("core")
      pl.semaphore_signal(sem, 5 + c, device_id={"core": 1 - c, "subcore": 0})
      pl.semaphore_wait(sem, 6 - c)

      def write(v):
        v[...] = jnp.full((16,), 1, jnp.int32) * (c + 10)
        pltpu.sync_copy(v, o_hbm.at[c])
      pl.run_scoped(write, pltpu.VMEM((16,), np.int32))

    out = pl.kernel(body, out_type=pl.ShapeDtypeStruct((2, 16), np.int32), mesh=vmesh,
                    scratch_types=[pltpu.SemaphoreType.REGULAR])()
  np.testing.assert_array_equal(out, np.full((2, 16), 1, np.int32) * np.array([[10], [11]]))


def test_sparsecore_has_no_mxu():
  with pl.virtual_tpu("v6e"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)

    @functools.partial(pl.kernel, out_type=(), mesh=mesh, scratch_types=[pltpu.VMEM((8, 8), jnp.float32)])
    def k(buf):
      buf[...] = jnp.zeros((8, 8), jnp.float32)
      jnp.dot(buf[...], buf[...])

    with pytest.raises(pl.UnsupportedError, match="SparseCores have no MXU"):
      k()


def test_tensorcore_and_sparsecore_timelines_overlap_on_one_chip():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((512, 512)).astype(np.float32)
  table = rng.standard_normal((1024, 128)).astype(np.float32)
  idx = rng.integers(0, 1024, size=256).astype(np.int32)

  def tc_body(x_hbm, table_hbm, idx_hbm, y_hbm, g_hbm):
    def body(xv, yv):
      pltpu.sync_copy(x_hbm, xv)
      for _ in range(4):
        yv[...] = jnp.dot(xv[...], xv[...], preferred_element_type=jnp.float32)
      pltpu.sync_copy(yv, y_hbm)
    pl.run_scoped(body, pltpu.VMEM((512, 512), jnp.float32), pltpu.VMEM((512, 512), jnp.float32))

  def sc_body(x_hbm, table_hbm, idx_hbm, y_hbm, g_hbm):
    wid = lax.axis_index(("c", "s"))
    per = 8

    def body(iv, rv):
      pltpu.sync_copy(idx_hbm.at[pl.ds(wid * per, per)], iv)
      pltpu.sync_copy(table_hbm.at[iv], rv)
      pltpu.sync_copy(rv, g_hbm.at[pl.ds(wid * per, per)])
    pl.run_scoped(body, pltpu.VMEM((per,), jnp.int32), pltpu.VMEM((per, 128), jnp.float32))

  out_type = (pl.ShapeDtypeStruct((512, 512), np.float32), pl.ShapeDtypeStruct((256, 128), np.float32))
  with pl.virtual_tpu("v6e") as tpu:
    smesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")
    tmesh = pltpu.TensorCoreMesh("tc", 1)
    both = pl.kernel([tc_body, sc_body], out_type=out_type, mesh=[tmesh, smesh])
    y, g = both(x, table, idx)
    pl.kernel(tc_body, out_type=out_type, mesh=tmesh)(x, table, idx)
    pl.kernel(sc_body, out_type=out_type, mesh=smesh)(x, table, idx)
  xb = x.astype(jnp.bfloat16).astype(np.float32)   # DEFAULT precision: bf16-rounded operands (chip rule)
  np.testing.assert_allclose(y, xb.astype(np.float64) @ xb.astype(np.float64), rtol=1e-4, atol=1e-3)
  np.testing.assert_array_equal(g, table[idx])
  t_both, t_tc, t_sc = (r.device_cycles for r in tpu.reports)
  assert t_both < t_tc + t_sc
  assert t_both <= max(t_tc, t_sc) * 1.05
