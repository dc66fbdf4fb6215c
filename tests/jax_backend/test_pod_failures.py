"""Failed launches through palace.jax: a pod launch (a communicating kernel in jax.shard_map) that fails
on one chip reports that chip's error, and the same compiled function's next call starts clean; a
megacore launch failing on one core likewise; neither leaves threads behind. And a core_barrier one
core skipped names the core left waiting."""
import functools
import threading

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import palace as palace_pl
import palace.jax as pj


def _pod_copy(n: int):
  """Each chip copies its shard after a barrier; a chip whose flag is 1 reads out of bounds."""
  mesh = jax.make_mesh((n,), ("x",))

  def per_chip(flag, xs):
    @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                       mesh=pltpu.create_tensorcore_mesh("core", num_cores=1),
                       scratch_types=[pltpu.VMEM(xs.shape, xs.dtype), pltpu.SMEM((1,), jnp.int32)],
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(f_hbm, x_hbm, o_hbm, buf, f_smem):
      me = jax.lax.axis_index("x")   # a ring handshake first: a pod launch, all chips in one machine
      pl.semaphore_signal(pltpu.get_barrier_semaphore(), 1, device_id={"x": jax.lax.rem(me + 1, n)})
      pl.semaphore_wait(pltpu.get_barrier_semaphore(), 1)
      pltpu.sync_copy(f_hbm, f_smem)
      pltpu.sync_copy(x_hbm.at[pl.ds(f_smem[0] * 1000, xs.shape[0])], buf)
      pltpu.sync_copy(buf, o_hbm)
    return k(flag, xs)

  f = jax.jit(jax.shard_map(per_chip, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
                            check_vma=False))
  return f, functools.partial(jax.device_put, device=NamedSharding(mesh, P("x")))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_pod_call_that_failed_on_one_chip_leaves_the_next_call_clean():
  n = 4
  x = np.arange(8 * n * 128, dtype=np.float32).reshape(8 * n, 128)
  with pj.virtual_tpu("v5e", num_chips=n):
    f, put = _pod_copy(n)
    bad = np.zeros(n, np.int32)
    bad[2] = 1
    good, bad, xs = put(np.zeros(n, np.int32)), put(bad), put(x)
    np.testing.assert_array_equal(np.asarray(f(good, xs)), x)
    baseline = threading.active_count()
    for _ in range(2):
      with pytest.raises(Exception, match=r"OutOfBoundsError: Slice \[1000:1008\] out of bounds"):
        np.asarray(f(bad, xs))
      assert threading.active_count() == baseline
    np.testing.assert_array_equal(np.asarray(f(good, xs)), x)   # (was: _PeerFailed)
    assert threading.active_count() == baseline


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_megacore_call_that_failed_on_one_core_leaves_no_threads():
  x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)

  def run(offset: int):
    @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       mesh=pltpu.create_tensorcore_mesh("core", num_cores=2),
                       scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.SMEM((1,), jnp.int32)])
    def k(o_hbm_in, x_hbm, o_hbm, sem, off):
      c = jax.lax.axis_index("core")
      pltpu.sync_copy(o_hbm_in, off)

      @pl.when(c == 0)
      def _():
        pl.semaphore_wait(sem, 1)         # core 0 waits while core 1 fails
        pltpu.sync_copy(x_hbm, o_hbm)

      @pl.when(c == 1)
      def _():
        pltpu.sync_copy(x_hbm.at[pl.ds(off[0], 16)], o_hbm)
        pl.semaphore_signal(sem, 1, core_index=0)
    return np.asarray(k(np.array([offset], np.int32), x))

  with pj.virtual_tpu("v5p"):
    np.testing.assert_array_equal(run(0), x)
    baseline = threading.active_count()
    for _ in range(3):
      with pytest.raises(Exception, match=r"OutOfBoundsError"):
        run(1000)
      assert threading.active_count() == baseline
    np.testing.assert_array_equal(run(0), x)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_skipped_core_barrier_names_the_core_left_waiting():
  x = np.zeros((8, 128), np.float32)
  # (the error leaving virtual_tpu is palace's own; inside it, XLA's JaxRuntimeError carries its text)
  with pytest.raises(palace_pl.SyncError,
                     match=r"(?s)Deadlock.*chip 0 core 0 is left waiting in pltpu.core_barrier at "
                           r"test_pod_failures.py:\d+.*: chip 0 core 1 never reached a core_barrier"), \
      pj.virtual_tpu("v5p"):
    @functools.partial(pl.kernel, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                       mesh=pltpu.create_tensorcore_mesh("core", num_cores=2),
                       scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR])
    def k(x_hbm, o_hbm, sem, done):
      c = jax.lax.axis_index("core")

      @pl.when(c == 0)
      def _():
        pltpu.core_barrier(sem, core_axis_name="core")
        pl.semaphore_signal(done, 1, core_index=1)

      @pl.when(c == 1)
      def _():
        pl.semaphore_wait(done, 1)   # BUG: core 1 never reaches the barrier
    np.asarray(k(x))
