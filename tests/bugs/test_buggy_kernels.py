"""The corpus of buggy kernels: each is caught with the right error class and a message naming the fault.

Bug classes: races (one core, several cores, several chips), deadlocks, end-of-kernel protocol errors,
out-of-bounds accesses, uninitialised reads, non-consecutive output revisits.
"""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

F32 = jnp.float32
X = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)


def _kernel(out_shape=(16, 128), mesh=None, **kw):
  return functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(out_shape, np.float32),
                           mesh=mesh or pltpu.TensorCoreMesh("core", 1), **kw)


def _shard(n, f, *args):
  mesh = pl.make_mesh((n,), ("x",))
  return pl.shard_map(f, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(*args)


# ====================================================================== races: one core
def test_race_read_of_dma_destination_before_its_wait():
  @_kernel(scratch_types=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    buf[...] = buf[...] + 1          # BUG: reads the destination before copy.wait()
    copy.wait()
    pltpu.sync_copy(buf, o_hbm)

  with pl.virtual_tpu("v5e", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)on scratch\[0\].*write of scratch\[0\]\[0:16, 0:128\] by DMA args\[0\] -> "
                          r"scratch\[0\].*not yet awaited.*read of scratch\[0\].*vector load at "
                          r"test_buggy_kernels.py:\d+.*wait for it \(\.wait\(\)\) before touching"):
    k(X)


def test_race_write_of_dma_source_while_in_flight():
  @_kernel(scratch_types=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.sync_copy(x_hbm, buf)
    copy = pltpu.make_async_copy(buf, o_hbm, sem)
    copy.start()
    buf[0:8, :] = jnp.zeros((8, 128), F32)   # BUG: overwrites the source of the copy in flight
    copy.wait()

  with pl.virtual_tpu("v5e", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)read of scratch\[0\]\[0:16, 0:128\] by DMA scratch\[0\] -> outputs\[0\] "
                          r"\(the copy's source\).*write of scratch\[0\]\[0:8, 0:128\] by a vector store"
                          r".*before overwriting the source"):
    k(X)


def test_race_two_dmas_into_the_same_buffer():
  @_kernel(scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, buf, sems):
    a = pltpu.make_async_copy(x_hbm.at[0:8], buf, sems.at[0])
    b = pltpu.make_async_copy(x_hbm.at[8:16], buf, sems.at[1])
    a.start()
    b.start()                          # BUG: a is still writing buf
    a.wait()
    b.wait()
    pltpu.sync_copy(buf, o_hbm.at[0:8])
    pltpu.sync_copy(buf, o_hbm.at[8:16])

  with pl.virtual_tpu("v5e", detect_races=True), pytest.raises(
      pl.RaceError, match=r"Two DMAs write the same data concurrently"):
    k(X)


def test_race_manual_double_buffer_prefetches_into_the_slot_being_read():
  @_kernel(scratch_types=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, slots, sems):
    def fetch(i, slot):
      return pltpu.make_async_copy(x_hbm.at[pl.ds(i * 8, 8)], slots.at[slot], sems.at[slot])
    fetch(0, 0).start()
    for i in range(2):
      fetch(i, 0).wait()
      if i + 1 < 2:
        fetch(i + 1, 0).start()      # BUG: should prefetch into slot 1, slot 0 is read below
      slots[0] = slots[0] * 2
      pltpu.sync_copy(slots.at[0], o_hbm.at[pl.ds(i * 8, 8)])

  with pl.virtual_tpu("v5e", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)write of scratch\[0\]\[0, 0:8, 0:128\] by DMA args\[0\]\[8:16, 0:128\]"):
    k(X)


# ====================================================================== races: several cores
def test_race_two_cores_write_the_same_hbm_block():
  @_kernel(mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    c = lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[pl.ds(c * 8, 8)], buf)
    pltpu.sync_copy(buf, o_hbm.at[0:8])     # BUG: both cores write rows 0:8 (should be c * 8)

  with pl.virtual_tpu("v5p", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)on outputs\[0\].*write of outputs\[0\]\[0:8, 0:128\] by DMA .* core 0"
                          r".*write of outputs\[0\]\[0:8, 0:128\] by DMA .* core 1"):
    k(X)


def test_race_megacore_pallas_call_cores_share_an_output_block():
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),   # BUG: parallel axis revisits
                     compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))
  with pl.virtual_tpu("v4", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)outputs\[0\]\[0:8, 0:128\].*core 0 at grid point \(0,\).*core 1 at grid "
                          r"point \(1,\)"):
    f(X)


def test_race_core_reads_shared_scratch_before_the_barrier():
  @_kernel(out_shape=(8, 128), mesh=pltpu.TensorCoreMesh("core", 2),
           scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(o_hbm, sem):
    c = lax.axis_index("core")

    def body(shared):
      @pl.when(c == 0)
      def _():
        shared[...] = jnp.full((8, 128), 1.0, F32)

      @pl.when(c == 1)
      def _():
        shared[...] = shared[...] + 1    # BUG: no barrier between core 0's store and this read
        pltpu.sync_copy(shared, o_hbm)
      pltpu.core_barrier(sem, core_axis_name="core")

    pl.run_scoped(body, pltpu.VMEM((8, 128), F32), collective_axes="core")

  with pl.virtual_tpu("v5p", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)write of run_scoped\[0\].*vector store.*core 0.*read of run_scoped\[0\].*"
                          r"vector load.*core 1.*Two cores access the same data"):
    k()


def test_race_remote_core_copy_read_before_wait():
  @_kernel(out_shape=(8, 128), mesh=pltpu.TensorCoreMesh("core", 2),
           scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                          pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, buf, send, recv, ready):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.sync_copy(x_hbm.at[0:8], buf)
      copy = pltpu.make_async_remote_copy(buf, buf, send, recv, device_id={"core": 1})
      copy.start()
      copy.wait_send()
      pl.semaphore_signal(ready, 1, device_id={"core": 1})

    @pl.when(c == 1)
    def _():
      pl.semaphore_wait(ready, 1)
      buf[...] = buf[...] + 1            # BUG: the copy landed, but its receive was not waited
      pltpu.make_async_copy(buf, buf, recv).wait()
      pltpu.sync_copy(buf, o_hbm)

  with pl.virtual_tpu("v5p", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)write of scratch\[0\].*DMA .*core 0.*read of scratch\[0\].*core 1.*"
                          r"copy from another core/chip.*wait_recv"):
    k(X)


def _subcore_scatter_gather(barrier: bool):
  """Each of two vector subcores scatters its id into lane s of a shared vector, then gathers the
  other's lane (reversed order); without plsc.subcore_barrier() the gather races the other scatter."""
  from palace import tpu_sc as plsc
  lanes = 8
  mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=2)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((2, lanes), np.int32), mesh=mesh,
                     scratch_types=[pltpu.VMEM((lanes,), jnp.int32),
                                    pltpu.VMEM_SHARED((lanes,), jnp.int32)])
  def k(o_hbm, tmp, shared):
    s = lax.axis_index("s")
    lane = jnp.zeros((lanes,), jnp.int32) + s
    plsc.store_scatter(shared, [lane], lane + 100, mask=jnp.arange(lanes, dtype=jnp.int32) == 0)
    if barrier:
      plsc.subcore_barrier()
    tmp[...] = plsc.load_gather(shared, [1 - lane])   # BUG without the barrier
    pltpu.sync_copy(tmp, o_hbm.at[s])

  return k


def test_race_subcore_gathers_what_another_subcore_scatters_before_the_barrier():
  with pl.virtual_tpu("v5p", detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)(?=.*read of scratch\[1\]\[rows \[1\]\] by a vector load)"
                          r"(?=.*write of scratch\[1\]\[rows \[1\]\] by a vector store).*Two cores"):
    _subcore_scatter_gather(barrier=False)()
  with pl.virtual_tpu("v5p", detect_races=True):
    out = _subcore_scatter_gather(barrier=True)()
  np.testing.assert_array_equal(out, [[101] * 8, [100] * 8])


# ====================================================================== races: several chips
def _remote_kernel(n, bug):
  def per_chip(xs):
    @_kernel(out_shape=(8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA,
                                                pltpu.SemaphoreType.DMA],
             compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm, buf, send, recv):
      me = lax.axis_index("x")
      right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={"x": left})
      pl.semaphore_signal(barrier, 1, device_id={"x": right})
      pl.semaphore_wait(barrier, 2)
      copy = pltpu.make_async_remote_copy(x_hbm, o_hbm, send, recv, device_id={"x": right})
      copy.start()
      if bug == "read_before_recv":
        copy.wait_send()
        pltpu.sync_copy(o_hbm, buf)      # BUG: reads what the left neighbour sends, before wait_recv
        copy.wait_recv()
      else:
        copy.wait()
        pltpu.sync_copy(o_hbm, buf)
      buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)        # (bug "no_final_barrier": the neighbour may still send here)
    return k(xs)
  return per_chip


def test_race_remote_copy_destination_read_before_wait_recv():
  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(32, 128)
  with pl.virtual_tpu("v5e", num_chips=4, detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)write of outputs\[0\]\[0:8, 0:128\] by DMA args\[0\] -> outputs\[0\].*"
                          r"chip \d core 0.*read of outputs\[0\]\[0:8, 0:128\] by DMA outputs\[0\] -> "
                          r"scratch\[0\].*copy from another core/chip\. Fix: wait for it with \.wait_recv\(\)"):
    _shard(4, _remote_kernel(4, "read_before_recv"), x)


def test_race_ring_step_overwrites_a_buffer_the_neighbour_still_reads():
  n = 4

  def per_chip(xs):
    @_kernel(out_shape=(8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA,
                                                pltpu.SemaphoreType.DMA])
    def k(x_hbm, o_hbm, buf, send, recv):
      me = lax.axis_index("x")
      right = lax.rem(me + 1, n)
      pltpu.sync_copy(x_hbm, buf)
      for _ in range(2):
        # BUG: no barrier/credit: the right neighbour may still be reading its buf from last step
        copy = pltpu.make_async_remote_copy(buf, buf, send, recv, device_id={"x": right})
        copy.start()
        copy.wait()
        buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)
    return k(xs)

  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=n, detect_races=True), pytest.raises(
      pl.RaceError, match=r"(?s)Data race in kernel 'k' on scratch\[0\] \(vmem of chip \d core 0\)"):
    _shard(n, per_chip, x)


# ====================================================================== deadlocks
def test_deadlock_wait_that_nobody_signals():
  @_kernel(scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem):
    pltpu.sync_copy(x_hbm, o_hbm)
    pl.semaphore_wait(sem, 1)            # BUG: nothing signals sem

  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.SyncError, match=r"Deadlock in kernel 'k'.*\n  chip 0 core 0 waits at test_buggy_kernels.py:\d+ "
                          r"for semaphore scratch\[0\]: needs 1, has 0"):
    k(X)


def test_deadlock_two_cores_wait_for_each_other():
  @_kernel(mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem):
    c = lax.axis_index("core")
    pl.semaphore_wait(sem, 1)            # BUG: both wait before signalling the other
    pl.semaphore_signal(sem, 1, device_id={"core": 1 - c})

  with pl.virtual_tpu("v5p"), pytest.raises(pl.SyncError, match=r"(?s)Deadlock.*chip 0 core 0 waits at "
                                            r"test_buggy_kernels.py:\d+ for semaphore scratch\[0\]: needs "
                                            r"1, has 0.*chip 0 core 1 waits at"):
    k(X)


def test_deadlock_barrier_across_chips_missing_a_signal():
  n = 4

  def per_chip(xs):
    @_kernel(out_shape=(8, 128), compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm):
      me = lax.axis_index("x")
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + 1, n)})   # BUG: only the right
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, o_hbm)
    return k(xs)

  x = np.zeros((n * 8, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=n), pytest.raises(
      pl.SyncError, match=r"(?s)Deadlock.*chip 0 core 0 waits at test_buggy_kernels.py:\d+ for semaphore "
                          r"barrier_semaphore\[0\]: needs 2, has 1.*chip 3 core 0 waits"):
    _shard(n, per_chip, x)


def test_deadlock_polling_loop_that_nothing_can_end():
  @_kernel(out_shape=(8, 128), mesh=pltpu.TensorCoreMesh("core", 2),
           scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR])
  def k(o_hbm, flag, other):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      lax.while_loop(lambda n: pl.semaphore_read(flag) < 1, lambda n: n + 1, 0)   # spins forever

    @pl.when(c == 1)
    def _():
      pl.semaphore_wait(other, 1)        # BUG: waits instead of signalling core 0's flag

  with pl.virtual_tpu("v5p"), pytest.raises(
      pl.SyncError, match=r"(?s)Deadlock.*chip 0 core 0 waits at test_buggy_kernels.py:\d+ for semaphore "
                          r"scratch\[0\] to change from 0 \(polled with semaphore_read 1000 times\).*chip 0 "
                          r"core 1 waits at .* for semaphore scratch\[1\]: needs 1, has 0"):
    k()


# ====================================================================== end-of-kernel protocol
def test_protocol_dma_in_flight_at_kernel_end():
  @_kernel(scratch_types=[pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, sem):
    pltpu.make_async_copy(x_hbm, o_hbm, sem).start()   # BUG: never waited

  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.SyncError, match=r"Semaphore scratch\[0\] \(dma\) is 8192, not 0, at the end of its run_scoped "
                          r"region on chip 0 core 0 in kernel 'k'. DMA args\[0\] -> outputs\[0\] started "
                          r"at test_buggy_kernels.py:\d+ was never waited: did you forget \.wait\(\)"):
    k(X)


def test_protocol_semaphore_left_nonzero():
  @_kernel(mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem):
    c = lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[pl.ds(c * 8, 8)], o_hbm.at[pl.ds(c * 8, 8)])
    pl.semaphore_signal(sem, 1, device_id={"core": 1 - c})   # BUG: nobody waits

  with pl.virtual_tpu("v5p"), pytest.raises(
      pl.SyncError, match=r"Semaphore scratch\[0\] \(regular\) is 1, not 0, at the end of its "
                          r"run_scoped region on chip 0 core \d"):
    k(X)


def test_protocol_barrier_semaphore_left_nonzero():
  n = 2

  def per_chip(xs):
    @_kernel(out_shape=(8, 128), compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm):
      me = lax.axis_index("x")
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 2, device_id={"x": 1 - me})   # BUG: signals 2, waits 1
      pl.semaphore_wait(barrier, 1)
      pltpu.sync_copy(x_hbm, o_hbm)
    return k(xs)

  with pl.virtual_tpu("v5e", num_chips=n), pytest.raises(
      pl.SyncError, match=r"Semaphore barrier_semaphore.* \(barrier\) is 1, not 0"):
    _shard(n, per_chip, np.zeros((16, 128), np.float32))


def test_protocol_unused_dma_descriptor():
  @_kernel(scratch_types=[pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, sem):
    pltpu.sync_copy(x_hbm, o_hbm)
    pltpu.make_async_copy(x_hbm.at[0:8], o_hbm.at[8:16], sem)   # BUG: never started

  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.SyncError, match=r"made 1 DMA descriptor\(s\) that were never started nor waited on chip 0 core 0: "
                          r"args\[0\]\[0:8, 0:128\] -> outputs\[0\]\[8:16, 0:128\] made at "
                          r"test_buggy_kernels.py:\d+"):
    k(X)


# ====================================================================== bounds
def test_bounds_ref_slice_in_a_pallas_call_body():
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(pl.program_id(0) * 4, 8), :]   # BUG: the block has 8 rows

  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.OutOfBoundsError, match=r"Slice \[4:12\] out of bounds for axis 0 of args\[0\] block .* at grid "
                                 r"point \(1,\) on chip 0 core 0 .*expected 0 <= start and start \+ size <= 8"
                                 r".*test_buggy_kernels.py:\d+"):
    f(X)


def test_bounds_dma_window_on_the_second_core():
  @_kernel(mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    c = lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[pl.ds(c * 8 + 4, 8)], buf)   # BUG: core 1 reads rows 12:20 of 16
    pltpu.sync_copy(buf, o_hbm.at[pl.ds(c * 8, 8)])

  with pl.virtual_tpu("v5p"), pytest.raises(
      pl.OutOfBoundsError, match=r"Slice \[12:20\] out of bounds for axis 0 of args\[0\] \(shape "
                                 r"\(16, 128\), any\) on chip 0 core 1"):
    k(X)


def test_bounds_index_map_past_the_array():
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                     out_shape=pl.ShapeDtypeStruct((16, 128), np.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 1, 0))],   # BUG: off by one
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.OutOfBoundsError, match=r"Block index out of bounds for args\[0\] \(shape \(16, 128\)\) at grid "
                                 r"point \(1,\).*index_map returned \(2, 0\)"):
    f(X)


def test_bounds_chip_dependent_slice_in_shard_map():
  def per_chip(xs):
    @_kernel(out_shape=(8, 128), scratch_types=[pltpu.VMEM((8, 128), F32)])
    def k(x_hbm, o_hbm, buf):
      me = lax.axis_index("x")
      pltpu.sync_copy(x_hbm.at[pl.ds(me * 4, 8)], buf)   # BUG: rows 4:12 of an 8-row shard on chip 1
      pltpu.sync_copy(buf, o_hbm)
    return k(xs)

  with pl.virtual_tpu("v5e", num_chips=2), pytest.raises(
      pl.OutOfBoundsError, match=r"Slice \[4:12\] out of bounds for axis 0 of args\[0\] \(shape \(8, 128\), "
                                 r"any\) on chip 1 core 0"):
    _shard(2, per_chip, X)


# ====================================================================== uninitialised memory
def _subcore_gather_unwritten(write_lanes: int):
  """A vector subcore scatters into the first `write_lanes` lanes of a scratch vector, then gathers
  all 8 lanes: with fewer than 8 written the gather reads garbage."""
  from palace import tpu_sc as plsc
  mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8,), np.int32), mesh=mesh,
                     scratch_types=[pltpu.VMEM((8,), jnp.int32), pltpu.VMEM((8,), jnp.int32)])
  def k(o_hbm, vec, tmp):
    lanes = jnp.arange(8, dtype=jnp.int32)
    plsc.store_scatter(vec, [lanes], lanes * 10, mask=lanes < write_lanes)
    tmp[...] = plsc.load_gather(vec, [7 - lanes])     # BUG when write_lanes < 8
    pltpu.sync_copy(tmp, o_hbm)

  return k


def test_uninitialised_lanes_read_by_a_sparsecore_gather():
  with pl.virtual_tpu("v5p", uninitialized="raise"), pytest.raises(
      pl.UninitializedReadError, match=r"Read of never-written data in scratch\[0\]\[rows \[0, 1, 2, 3\]\.\.\.\] "
                                       r"\(vmem\) on chip 0 SparseCore 0 vector subcore 0.*element \(0,\) of the loaded window \(and 1 more\)"):
    _subcore_gather_unwritten(6)()
  with pl.virtual_tpu("v5p", uninitialized="raise"):
    np.testing.assert_array_equal(_subcore_gather_unwritten(8)(), [70, 60, 50, 40, 30, 20, 10, 0])


def _acc_call(init: bool):
  def body(x_ref, o_ref):
    if init:
      @pl.when(pl.program_id(1) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]              # BUG when init=False: the accumulator starts as garbage

  return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), grid=(1, 2),
                        in_specs=[pl.BlockSpec((8, 128), lambda i, k: (k, 0))],
                        out_specs=pl.BlockSpec((8, 128), lambda i, k: (i, 0)))


def test_uninitialised_accumulator_reads_nan_by_default_and_raises_on_request():
  with pl.virtual_tpu("v5e"):
    assert np.isnan(_acc_call(False)(X)).all()
  with pl.virtual_tpu("v5e", uninitialized="raise"), pytest.raises(
      pl.UninitializedReadError, match=r"Read of never-written data in outputs\[0\] block\[0:8, 0:128\] "
                                       r"\(vmem\) at grid point \(0, 0\) on chip 0 core 0.*"
                                       r"test_buggy_kernels.py:\d+: element \(0, 0\)"):
    _acc_call(False)(X)
  with pl.virtual_tpu("v5e", uninitialized="raise"):
    np.testing.assert_array_equal(_acc_call(True)(X), X[:8] + X[8:])


def test_uninitialised_scratch_row_read_on_a_second_core():
  @_kernel(mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.sync_copy(x_hbm.at[0:8], buf)
    buf[...] = buf[...] * 2              # BUG: core 1 never filled its buf
    pltpu.sync_copy(buf, o_hbm.at[pl.ds(c * 8, 8)])

  with pl.virtual_tpu("v5p"):
    assert np.isnan(k(X)[8:]).all()
  with pl.virtual_tpu("v5p", uninitialized="raise"), pytest.raises(
      pl.UninitializedReadError, match=r"never-written data in scratch\[0\]\[0:8, 0:128\] \(vmem\) on chip 0 "
                                       r"core 1"):
    k(X)


def test_uninitialised_receive_slot_read_on_another_chip():
  n = 2

  def per_chip(xs):
    @_kernel(out_shape=(8, 128), scratch_types=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA,
                                                pltpu.SemaphoreType.DMA],
             compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm, slots, send, recv):
      me = lax.axis_index("x")
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={"x": 1 - me})
      pl.semaphore_wait(barrier, 1)
      copy = pltpu.make_async_remote_copy(x_hbm, slots.at[0], send, recv, device_id={"x": 1 - me})
      copy.start()
      copy.wait()
      slots[0] = slots[1] * 2              # BUG: the neighbour's data landed in slot 0
      pltpu.sync_copy(slots.at[0], o_hbm)
    return k(xs)

  with pl.virtual_tpu("v5e", num_chips=n, uninitialized="raise"), pytest.raises(
      pl.UninitializedReadError, match=r"never-written data in scratch\[0\]\[1, 0:8, 0:128\] \(vmem\) on "
                                       r"chip \d core 0 in kernel 'k' at test_buggy_kernels.py:\d+"):
    _shard(n, per_chip, X)


def test_uninitialised_output_rows_left_unwritten():
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                     out_shape=pl.ShapeDtypeStruct((16, 128), np.float32), grid=(1,),   # BUG: grid (2,)
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pl.virtual_tpu("v5e", uninitialized="raise"), pytest.raises(
      pl.UninitializedReadError, match=r"left 1024 element\(s\) of outputs\[0\] \(shape \(16, 128\)\) never "
                                       r"written, first at index \(8, 0\)"):
    f(X)


# ====================================================================== revisits
def test_revisit_of_an_output_block_that_is_not_consecutive():
  def body(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]

  # BUG: the reduction axis k comes first, so output block j is revisited after other blocks
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 256), np.float32), grid=(2, 2),
                     in_specs=[pl.BlockSpec((8, 128), lambda k, j: (k, j))],
                     out_specs=pl.BlockSpec((8, 128), lambda k, j: (0, j)))
  with pl.virtual_tpu("v5e"), pytest.raises(
      pl.SyncError, match=r"Revisited block for outputs\[0\] at grid point \(1, 0\) on chip 0 core 0.*"
                          r"visited again non-consecutively.*Fix: put the reduction axis last"):
    f(np.ones((16, 256), np.float32))
