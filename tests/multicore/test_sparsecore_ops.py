"""The remaining plsc vector ops, cross-subcore atomics, shared allocations and core_index signals."""
import functools

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc

LANES = 8  # v5p vector subcores: 8 lanes of 32 bits


def _one_subcore(out_rows, scratch, n_subcores=1):
  mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                num_subcores=n_subcores)
  return functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((out_rows, LANES), np.int32),
                           mesh=mesh, scratch_types=scratch)


def test_expand_compress_cummax_addupdate_parallel_loop_bitcast():
  x = np.array([3, -1, 4, 1, -5, 9, 2, -6], np.int32)
  mask = x > 0
  with pl.virtual_tpu("v5p"):
    @_one_subcore(6, [pltpu.VMEM((LANES,), jnp.int32), pltpu.VMEM((LANES,), jnp.int32)])
    def k(x_hbm, m_hbm, o_hbm, xv, tmp):
      pltpu.sync_copy(x_hbm, xv)
      v = xv[...]
      msk = v > 0
      tmp[...] = jnp.zeros((LANES,), jnp.int32)
      plsc.store_compressed(tmp, v, mask=msk)                 # positives packed to the front
      pltpu.sync_copy(tmp, o_hbm.at[0])
      tmp[...] = plsc.load_expanded(xv, mask=msk)              # i-th True lane gets xv[i]
      pltpu.sync_copy(tmp, o_hbm.at[1])
      tmp[...] = plsc.cummax(v, mask=msk)
      pltpu.sync_copy(tmp, o_hbm.at[2])
      tmp[...] = jnp.full((LANES,), 10, jnp.int32)
      plsc.addupdate(tmp, v)
      pltpu.sync_copy(tmp, o_hbm.at[3])

      @plsc.parallel_loop(0, LANES, carry=jnp.zeros((LANES,), jnp.int32))
      def total(i, acc):
        return acc + v
      tmp[...] = total
      pltpu.sync_copy(tmp, o_hbm.at[4])
      tmp[...] = plsc.bitcast(plsc.bitcast(v, jnp.float32), jnp.int32)
      pltpu.sync_copy(tmp, o_hbm.at[5])

    out = k(x, mask)
  packed = np.zeros(LANES, np.int32)
  packed[:mask.sum()] = x[mask]
  np.testing.assert_array_equal(out[0], packed)
  expanded = np.zeros(LANES, np.int32)
  expanded[mask] = x[:mask.sum()]
  np.testing.assert_array_equal(out[1], expanded)
  np.testing.assert_array_equal(out[2], np.maximum.accumulate(np.where(mask, x, np.iinfo(np.int32).min)))
  np.testing.assert_array_equal(out[3], x + 10)
  np.testing.assert_array_equal(out[4], x * LANES)
  np.testing.assert_array_equal(out[5], x)


def test_fetch_and_add_across_subcores_returns_old_values():
  with pl.virtual_tpu("v5p"):
    @_one_subcore(5, [pltpu.SMEM((1,), jnp.int32), pltpu.VMEM((LANES,), jnp.int32)], n_subcores=4)
    def k(o_hbm, counter, buf):
      s = lax.axis_index("s")

      @pl.when(s == 0)
      def _():
        counter[0] = 0
      plsc.subcore_barrier()
      old = plsc.fetch_and_add(counter, s + 1, subcore_id=0)   # everyone adds to subcore 0's counter
      plsc.subcore_barrier()
      buf[...] = jnp.full((LANES,), 1, jnp.int32) * old
      pltpu.sync_copy(buf, o_hbm.at[s])

      @pl.when(s == 0)
      def _():
        buf[...] = jnp.full((LANES,), 1, jnp.int32) * counter[0]
        pltpu.sync_copy(buf, o_hbm.at[4])

    out = k()
  assert out[4, 0] == 1 + 2 + 3 + 4
  # the adds are atomic in some order: replaying them in the order of their old values reproduces them
  old = out[:4, 0]
  total = 0
  for s in np.argsort(old, kind="stable"):
    assert old[s] == total
    total += s + 1


def test_run_scoped_collective_axes_shares_one_allocation():
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 2),
                     scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(o_hbm, sem):
    c = lax.axis_index("core")

    def body(shared):
      @pl.when(c == 0)
      def _():
        shared[...] = jnp.full((8, 128), 5.0, jnp.float32)
        pl.semaphore_signal(sem, 1, core_index=1)

      @pl.when(c == 1)
      def _():
        pl.semaphore_wait(sem, 1)
        shared[...] = shared[...] * 2       # sees core 0's write: the same buffer
        pltpu.sync_copy(shared, o_hbm)

    pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), collective_axes=("core",))

  with pl.virtual_tpu("v5p"):
    out = k()
  np.testing.assert_array_equal(out, np.full((8, 128), 10.0, np.float32))


def test_sparsecore_example_runs_and_sparsecore_is_faster():
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "sparsecore_gather.py"
  spec = importlib.util.spec_from_file_location("sparsecore_gather", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  t_tc, t_sc = mod.main(rows=512, dim=128, n=256)
  assert t_sc < t_tc
