"""SparseCore subcore barrier timing, plsc.pack / unpack / scan_count / cummin, and the indexed-DMA
rules Mosaic enforces (indices in VMEM, 1-D, one indexed side, HBM/VMEM_SHARED against VMEM, no
transform after the indexer), each against a NumPy reference or the expected message."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc

L = 16


@pytest.mark.parametrize("policy", ["eager", "on_wait"])
def test_subcore_barrier_releases_all_at_the_last_arrival(policy):
  """Subcore s writes its row 2s+1 times, then after the barrier reads its neighbour's row, which the
  neighbour overwrites after its own read: every read must see the pre-barrier rows. (The waiting
  subcores used to leave at their own arrival clocks, and the last one ran ahead of them.)"""
  n = 16
  with pl.virtual_tpu("7x", dma_policy=policy) as tpu:
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((n, L), np.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((n, L), np.int32)])
    def k(o_ref, vmem):
      s = lax.axis_index("s")

      @pl.loop(0, 2 * s + 1)
      def _(i):
        vmem[s] = jnp.full((L,), 1, jnp.int32) * i
        pltpu.sync_copy(vmem.at[s], o_ref.at[s])
      plsc.subcore_barrier()
      pltpu.sync_copy(o_ref.at[(s + 1) % n], vmem.at[s])
      pltpu.sync_copy(vmem.at[s], o_ref.at[s])

    out = k()
  np.testing.assert_array_equal(out[:, 0], 2 * np.roll(np.arange(n), -1))
  # every subcore leaves the barrier at the last arrival: their first copy after it starts together
  starts = {}
  for e in tpu.reports[-1].events:
    if e[1] == "dma":
      starts.setdefault(e[0], []).append(e[3])
  post = [v[-2] for v in starts.values()]   # (each core's second-to-last copy: the read after the barrier)
  assert max(post) - min(post) < 50


@pytest.mark.parametrize("fmt", list(plsc.PackFormat))
def test_pack_unpack_layouts(fmt):
  a = np.arange(L, dtype=np.int32) * 70000 - 5
  b = -a
  with pl.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)
    shape = (L, 2) if fmt is plsc.PackFormat.COMPRESSED else (2 * L,)

    @functools.partial(pl.kernel, mesh=mesh, out_type=(pl.ShapeDtypeStruct(shape, np.int16),
                                                       pl.ShapeDtypeStruct((2, L), np.int32)),
                       scratch_types=[pltpu.VMEM((2, L), np.int32), pltpu.VMEM(shape, np.int16),
                                      pltpu.VMEM((2, L), np.int32)])
    def k(x_hbm, p_hbm, u_hbm, x, p, u):
      pltpu.sync_copy(x_hbm, x)
      packed = plsc.pack(x[0], x[1], format=fmt)
      p[...] = packed
      u[0], u[1] = plsc.unpack(packed, format=fmt)
      pltpu.sync_copy(p, p_hbm)
      pltpu.sync_copy(u, u_hbm)

    p, u = k(np.stack([a, b]))
  narrow = np.stack([a, b]).astype(np.int16)
  np.testing.assert_array_equal(p, narrow.reshape(L, 2) if fmt is plsc.PackFormat.COMPRESSED
                                else narrow.T.reshape(-1))
  np.testing.assert_array_equal(u, narrow.astype(np.int32))


def test_pack_of_unsupported_dtypes_and_unpack_of_a_wrong_shape_are_errors():
  with pl.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)

    @functools.partial(pl.kernel, mesh=mesh, out_type=pl.ShapeDtypeStruct((L,), np.int32))
    def k(o_hbm):
      plsc.pack(jnp.zeros((L,), jnp.int16), jnp.zeros((L,), jnp.int16), format="interleaved")

    with pytest.raises(pl.UnsupportedError, match=r"plsc.pack of int16 vectors.*Fix:"):
      k()

    @functools.partial(pl.kernel, mesh=mesh, out_type=pl.ShapeDtypeStruct((L,), np.int32))
    def k2(o_hbm):
      plsc.unpack(jnp.zeros((L, 2), jnp.int16), format=plsc.PackFormat.INTERLEAVED)

    with pytest.raises(pl.ShapeError, match=r"needs shape \(n, 2\) \(compressed\) or \(2n,\)"):
      k2()


def test_scan_count_and_cummin():
  x = np.array([4, 4, 1, 4, 2, 1, 9, 9, 9, 0, 4, 2, 7, 3, 3, 4], np.int32)
  keep = np.arange(L) % 5 != 3
  with pl.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)

    @functools.partial(pl.kernel, mesh=mesh, out_type=pl.ShapeDtypeStruct((3, L), np.int32),
                       scratch_types=[pltpu.VMEM((L,), np.int32), pltpu.VMEM((3, L), np.int32)])
    def k(x_hbm, o_hbm, x, o):
      pltpu.sync_copy(x_hbm, x)
      m = lax.iota(jnp.int32, L) % 5 != 3
      counts, last = plsc.scan_count(x[...], m)
      o[0] = counts
      o[1] = last.astype(jnp.int32)
      o[2] = plsc.cummin(x[...], mask=m)
      pltpu.sync_copy(o, o_hbm)

    out = k(x)
  counts = np.array([np.sum((x[:i + 1] == x[i]) & keep[:i + 1]) if keep[i] else 0 for i in range(L)])
  last = np.array([keep[i] and not np.any((x[i + 1:] == x[i]) & keep[i + 1:]) for i in range(L)])
  run = np.minimum.accumulate(np.where(keep, x, np.iinfo(np.int32).max))
  np.testing.assert_array_equal(out[0], counts)
  np.testing.assert_array_equal(out[1], last.astype(np.int32))
  np.testing.assert_array_equal(out[2], np.where(np.cumsum(keep) > 0, run, x))


def _indexed(body, idx_space=pltpu.VMEM, out_space=None):
  with pl.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)

    @functools.partial(pl.kernel, mesh=mesh, out_type=pl.ShapeDtypeStruct((8,), np.int32),
                       scratch_types=[idx_space((8,), np.int32), pltpu.VMEM((8,), np.int32)])
    def k(x_hbm, o_hbm, idx, buf):
      if idx_space is pltpu.VMEM:
        pltpu.sync_copy(x_hbm, idx)
      body(x_hbm, o_hbm, idx, buf)

    return k(np.arange(8, dtype=np.int32))


def test_indexed_dma_rules():
  with pytest.raises(pl.UnsupportedError, match=r"Scatter/gather DMA from HBM to HBM is not supported.*Fix:"):
    _indexed(lambda x, o, idx, buf: pltpu.sync_copy(x.at[idx], o))
  with pytest.raises(pl.UnsupportedError, match=r"indices of a scatter/gather DMA must be in VMEM, got SMEM"):
    _indexed(lambda x, o, idx, buf: pltpu.sync_copy(x.at[idx], buf), idx_space=pltpu.SMEM)
  with pytest.raises(pl.UsageError, match=r"only the source ref can be indexed when gathering"):
    _indexed(lambda x, o, idx, buf: pltpu.sync_copy(x.at[idx], buf.at[idx]))
  with pytest.raises(pl.UnsupportedError, match=r"cannot have any transforms following the indexer"):
    _indexed(lambda x, o, idx, buf: pltpu.sync_copy(x.at[idx].reshape(8), buf))
