"""Manual DMA, semaphores, run_scoped capacity, DMA policies and SMEM-driven dynamic slicing."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

MESH = pltpu.TensorCoreMesh("core", num_cores=1)
F32 = jnp.float32


def _kernel(out_shape, **kw):
  return functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(out_shape, F32), mesh=MESH, **kw)


# ------------------------------------------------------------------ DMA
def test_make_async_copy_start_wait_hbm_vmem_hbm(rng):
  x = rng.standard_normal((64, 256)).astype(np.float32)

  @_kernel((64, 256), scratch_types=[pltpu.VMEM((64, 256), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    buf[...] = buf[...] - 1
    c2 = pltpu.make_async_copy(buf, o_hbm, sem)
    c2.start()
    c2.wait()

  np.testing.assert_array_equal(k(x), x - 1)


def test_views_on_both_sides_and_hbm_to_hbm(rng):
  x = rng.standard_normal((64, 256)).astype(np.float32)

  @_kernel((64, 256), scratch_types=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, buf, sems):
    pltpu.async_copy(x_hbm, o_hbm, sems.at[0]).wait()                     # HBM -> HBM, whole
    pltpu.async_copy(x_hbm.at[8:24, 128:256], buf, sems.at[1]).wait()     # view -> VMEM
    pltpu.async_copy(buf.at[0:8], o_hbm.at[pl.ds(40, 8), pl.ds(0, 128)], sems.at[0]).wait()
    pltpu.sync_copy(x_hbm.at[0:16, 0:128], o_hbm.at[48:64, 128:256])      # HBM view -> HBM view

  ref = x.copy()
  ref[40:48, 0:128] = x[8:16, 128:256]
  ref[48:64, 128:256] = x[0:16, 0:128]
  np.testing.assert_array_equal(k(x), ref)


def test_vmem_smem_copies(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SMEM((128,), F32)])
  def k(x_hbm, o_hbm, buf, s):
    pltpu.sync_copy(x_hbm.at[3], s)          # HBM -> SMEM
    s[5] = s[5] * 10
    pltpu.sync_copy(x_hbm, buf)
    pltpu.sync_copy(s, buf.at[0])            # SMEM -> VMEM
    pltpu.sync_copy(buf.at[1], s)            # VMEM -> SMEM
    s[0] = s[0] + 1
    pltpu.sync_copy(s, buf.at[2])
    pltpu.sync_copy(buf, o_hbm)

  ref = x.copy()
  ref[0] = x[3]
  ref[0, 5] *= 10
  ref[2] = x[1]
  ref[2, 0] += 1
  np.testing.assert_allclose(k(x), ref, rtol=1e-6)


def test_sync_copy_pytrees(rng):
  xs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in range(3)]

  @functools.partial(pl.kernel, mesh=MESH, out_type=[pl.ShapeDtypeStruct((8, 128), F32)] * 3,
                     scratch_types=[[pltpu.VMEM((8, 128), F32)] * 3])
  def k(a, b, c, oa, ob, oc, bufs):
    pltpu.sync_copy({"p": a, "q": (b, c)}, {"p": bufs[0], "q": (bufs[1], bufs[2])})
    for r in bufs:
      r[...] = r[...] * 2
    pltpu.sync_copy(bufs, [oa, ob, oc])

  for o, x in zip(k(*xs), xs):
    np.testing.assert_array_equal(o, x * 2)


def test_sync_copy_tree_mismatch_is_an_error(rng):
  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    pltpu.sync_copy((x_hbm, x_hbm), buf)

  with pytest.raises(pl.ShapeError, match=r"sync_copy: source and destination trees differ"):
    k(np.zeros((8, 128), np.float32))


def test_dma_add_accumulates(rng):
  x = rng.standard_normal((16, 128)).astype(np.float32)

  @_kernel((16, 128), scratch_types=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.sync_copy(x_hbm, buf)
    pltpu.sync_copy(x_hbm, o_hbm)
    pltpu.async_copy(buf, o_hbm, sem, add=True).wait()
    c = pltpu.make_async_copy(buf.at[0:8], o_hbm.at[8:16], sem)
    c.start(add=True)
    c.wait()
    pltpu.sync_copy(buf.at[8:16], o_hbm.at[0:8], add=True)

  ref = 2 * x
  ref[8:16] += x[0:8]
  ref[0:8] += x[8:16]
  np.testing.assert_allclose(k(x), ref, rtol=1e-6)


def test_dma_shape_mismatch_is_an_error():
  @_kernel((16, 128), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    pltpu.sync_copy(x_hbm, buf)

  with pytest.raises(pl.ShapeError, match=r"DMA shapes differ: args\[0\] has shape \(16, 128\)"):
    k(np.zeros((16, 128), np.float32))


def test_dma_semaphore_counts_bytes(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @functools.partial(pl.kernel, mesh=MESH, out_type=(pl.ShapeDtypeStruct((8, 128), F32),
                                                     pltpu.SMEM((2,), jnp.int32)),
                     scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, reads, buf, sem):
    c1 = pltpu.make_async_copy(x_hbm.at[0:4], buf.at[0:4], sem)
    c2 = pltpu.make_async_copy(x_hbm.at[4:8], buf.at[4:8], sem)
    c1.start()
    c2.start()
    c1.wait()  # waits for 2 KiB and takes them off the semaphore
    pl.semaphore_wait(sem, 1024, decrement=False)
    reads[0] = pl.semaphore_read(sem)
    pl.semaphore_wait(sem, 2048)
    reads[1] = pl.semaphore_read(sem)
    pltpu.sync_copy(buf, o_hbm)

  out, reads = k(x)
  np.testing.assert_array_equal(out, x)
  assert reads.tolist() == [2048, 0]


def test_wait_without_start_deadlocks():
  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).wait()

  with pytest.raises(pl.SyncError, match=r"(?s)Deadlock in kernel 'k'.*waits at "
                                          r"test_dma_semaphores.py:\d+ for DMA args\[0\] -> "
                                          r"scratch\[0\]: needs 4096, has 0"):
    k(np.zeros((8, 128), np.float32))


def test_dma_never_waited_is_an_error():
  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start()
    pltpu.sync_copy(x_hbm, o_hbm)

  with pytest.raises(pl.SyncError, match=r"(in flight|not 0).*wait"):
    k(np.zeros((8, 128), np.float32))


@pytest.mark.parametrize("priority,error,match", [
    (2, pl.UnsupportedError, r"priority=2 on a local copy.*only support priority 0 or 1.*Fix: drop"),
    (-1, pl.UsageError, r"DMA start priority must be >= 0; got -1"),
    (0.0, pl.UsageError, r"DMA start priority must be an integer")])
def test_dma_priority_other_than_the_default_is_refused(priority, error, match):
  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.async_copy(x_hbm, buf, sem, priority=priority).wait()
    pltpu.sync_copy(buf, o_hbm)

  with pytest.raises(error, match=match):
    k(np.zeros((8, 128), np.float32))


def test_dma_priority_one_moves_the_same_data_timed_as_priority_zero_and_is_kept_on_the_copy(rng):
  """A local copy may take the second DMA queue (priority=1), as Mosaic compiles it: the same data
  lands, the queue is kept on the copy, and it is timed as a priority-0 copy (docs/jax.md, "DMA
  priority": how the chip arbitrates the two queues is not measured)."""
  x = rng.standard_normal((8, 128)).astype(np.float32)
  seen = []

  def make(priority):
    @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
    def k(x_hbm, o_hbm, buf, sem):
      d = pltpu.async_copy(x_hbm, buf, sem, priority=priority)
      seen.append(d._prepared.priority)
      d.wait()
      pltpu.sync_copy(buf, o_hbm)
    return k

  cycles = []
  for priority in (0, 1):
    with pl.virtual_tpu("v5e") as tpu:
      np.testing.assert_array_equal(make(priority)(x), x)
    cycles.append(tpu.reports[-1].device_cycles)
  assert seen == [0, 1] and cycles[0] == cycles[1]


def test_dma_priority_zero_is_the_default(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start(priority=0)
    pltpu.make_async_copy(x_hbm, buf, sem).wait()
    pltpu.sync_copy(buf, o_hbm)

  np.testing.assert_array_equal(k(x), x)


# ------------------------------------------------------------------ semaphores
def test_regular_semaphore_signal_wait_read():
  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.SMEM((5,), jnp.int32),
                     scratch_types=[pltpu.SemaphoreType.REGULAR((3,))])
  def k(o_ref, sems):
    pl.semaphore_signal(sems.at[0], 5)
    pl.semaphore_signal(sems.at[2])
    for i in range(3):
      o_ref[i] = pl.semaphore_read(sems.at[i])
    pl.semaphore_wait(sems.at[0], 2)
    o_ref[3] = pl.semaphore_read(sems.at[0])
    pl.semaphore_wait(sems.at[0], 3, decrement=False)   # the value stays 3
    o_ref[4] = pl.semaphore_read(sems.at[0])
    pl.semaphore_wait(sems.at[0], 3)
    pl.semaphore_wait(sems.at[2])

  assert k().tolist() == [5, 0, 1, 3, 3]


def test_scalar_semaphore_and_barrier_type():
  # an unindexed (scalar) REGULAR semaphore and a BARRIER semaphore in scratch: signalled, read, waited
  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.SMEM((4,), jnp.int32),
                     scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.BARRIER])
  def k(o_ref, sem, bar):
    pl.semaphore_signal(sem, 2)
    pl.semaphore_signal(bar)
    o_ref[0] = pl.semaphore_read(sem)
    o_ref[1] = pl.semaphore_read(bar)
    pl.semaphore_wait(sem, 2)
    pl.semaphore_wait(bar)
    o_ref[2] = pl.semaphore_read(sem)
    o_ref[3] = pl.semaphore_read(bar)

  assert k().tolist() == [2, 1, 0, 0]


def test_semaphore_array_needs_an_index():
  @_kernel((8, 128), scratch_types=[pltpu.SemaphoreType.REGULAR((2,))])
  def k(x_hbm, o_hbm, sems):
    pl.semaphore_signal(sems)

  with pytest.raises(pl.UsageError, match=r"shape \(2,\)\. Fix: select one semaphore with .at\[i\]"):
    k(np.zeros((8, 128), np.float32))


def test_semaphore_left_nonzero_is_an_error():
  @_kernel((8, 128), scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem):
    pl.semaphore_signal(sem, 1)
    pltpu.sync_copy(x_hbm, o_hbm)

  with pytest.raises(pl.SyncError, match=r"is 1, not 0"):
    k(np.zeros((8, 128), np.float32))


# ------------------------------------------------------------------ run_scoped
def test_run_scoped_positional_keyword_and_return_value(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @_kernel((8, 128))
  def k(x_hbm, o_hbm):
    def run(buf, *, sem):
      pltpu.async_copy(x_hbm, buf, sem).wait()
      buf[...] = buf[...] + 1
      pltpu.async_copy(buf, o_hbm, sem).wait()
      return "done"
    assert pl.run_scoped(run, pltpu.VMEM((8, 128), F32), sem=pltpu.SemaphoreType.DMA) == "done"

  np.testing.assert_array_equal(k(x), x + 1)


def test_with_scoped_decorator(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @_kernel((8, 128))
  def k(x_hbm, o_hbm):
    @pl.with_scoped(pltpu.VMEM((8, 128), F32), sem=pltpu.SemaphoreType.DMA)
    def f(buf, sem):
      pltpu.async_copy(x_hbm, buf, sem).wait()
      buf[...] = -buf[...]
      pltpu.async_copy(buf, o_hbm, sem).wait()
    f()

  np.testing.assert_array_equal(k(x), -x)


def _capacity_kernel(n_live, mib_each):
  @functools.partial(pl.kernel, out_type=(), mesh=MESH)
  def k():
    def nest(i):
      if i == n_live:
        return
      pl.run_scoped(lambda buf: nest(i + 1), pltpu.VMEM((mib_each * 2**18,), F32))
    nest(0)
  return k


def test_scoped_vmem_counted_while_alive():
  with pl.virtual_tpu("v5e"):
    # run_scoped buffers count against the whole VMEM, not the 16 MiB scoped limit (a TPU v5e compiles
    # 20 and 100 MiB of run_scoped VMEM, benchmarks/hw/data/v5e-limits-2026-12-05-followup.jsonl)
    _capacity_kernel(3, 40)()   # 120 MiB alive at once fits v5e's 128 MiB
    with pytest.raises(pl.ResourceError, match=r"VMEM over capacity on chip 0 core 0.*run_scoped"):
      _capacity_kernel(4, 40)()


def test_scoped_vmem_freed_at_scope_end():
  @functools.partial(pl.kernel, out_type=(), mesh=MESH)
  def k():
    for _ in range(6):  # 6 x 8 MiB one after the other: each is freed before the next
      pl.run_scoped(lambda buf: None, pltpu.VMEM((2 * 2**20,), F32))

  with pl.virtual_tpu("v5e") as tpu:
    k()
  assert tpu.reports[-1].vmem_peak_bytes == 8 * 2**20


def test_scoped_smem_over_capacity():
  @functools.partial(pl.kernel, out_type=(), mesh=MESH)
  def k():
    pl.run_scoped(lambda s: None, pltpu.SMEM((1 << 20,), jnp.int32))

  with pytest.raises(pl.ResourceError, match=r"SMEM over capacity for run_scoped\[0\]"):
    k()


# ------------------------------------------------------------------ DMA policies
def _racefree_kernel():
  """Double-buffered manual copy loop: each buffer is waited before it is reused."""
  n, rows = 8, 16

  @_kernel((n * rows, 128), scratch_types=[pltpu.VMEM((2, rows, 128), F32),
                                           pltpu.VMEM((2, rows, 128), F32),
                                           pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, ibuf, obuf, isem, osem):
    def fetch(i):
      return pltpu.make_async_copy(x_hbm.at[pl.ds(i * rows, rows)], ibuf.at[i % 2], isem.at[i % 2])

    def put(i):
      return pltpu.make_async_copy(obuf.at[i % 2], o_hbm.at[pl.ds(i * rows, rows)], osem.at[i % 2])

    fetch(0).start()
    for i in range(n):
      if i + 1 < n:
        fetch(i + 1).start()
      fetch(i).wait()
      if i >= 2:
        put(i - 2).wait()
      obuf[i % 2] = jnp.sin(ibuf[i % 2]) * (i + 1)
      put(i).start()
    put(n - 2).wait()
    put(n - 1).wait()
  return k


@pytest.mark.parametrize("policy,seed", [("eager", 0), ("on_wait", 0), ("random", 0), ("random", 1),
                                         ("random", 7), ("random", 123)])
def test_dma_policies_bit_identical(rng, policy, seed):
  x = rng.standard_normal((128, 128)).astype(np.float32)
  with pl.virtual_tpu("v5e", dma_policy="eager"):
    base = _racefree_kernel()(x)
  with pl.virtual_tpu("v5e", dma_policy=policy, seed=seed):
    out = _racefree_kernel()(x)
  assert out.tobytes() == base.tobytes()
  ref = np.concatenate([np.sin(x[i * 16:(i + 1) * 16]) * (i + 1) for i in range(8)])
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_on_wait_policy_exposes_a_missing_wait(rng):
  """Reading the buffer before waiting its DMA sees stale data under on_wait (the bug surfaces)."""
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    buf[...] = jnp.zeros((8, 128), F32)
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    v = buf[...]          # racy: not yet waited
    c.wait()
    buf[...] = v
    pltpu.sync_copy(buf, o_hbm)

  with pl.virtual_tpu("v5e", dma_policy="eager"):
    eager = k(x)
  with pl.virtual_tpu("v5e", dma_policy="on_wait"):
    lazy = k(x)
  np.testing.assert_array_equal(eager, x)
  np.testing.assert_array_equal(lazy, np.zeros_like(x))


def test_pipelines_bit_identical_across_policies(rng):
  x = rng.standard_normal((256, 256)).astype(np.float32)

  def run():
    @_kernel((256, 256))
    def k(x_hbm, o_hbm):
      def body(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) + pl.program_id(1).astype(F32)
      spec = pl.BlockSpec((64, 128), lambda i, j: (i, j))
      pltpu.emit_pipeline(body, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    return k(x)

  outs = []
  for policy, seed in [("eager", 0), ("on_wait", 0), ("random", 3), ("random", 11)]:
    with pl.virtual_tpu("v5e", dma_policy=policy, seed=seed):
      outs.append(run())
  assert all(o.tobytes() == outs[0].tobytes() for o in outs)


# ------------------------------------------------------------------ dynamic slicing from SMEM
def test_smem_scalars_drive_ref_views_and_dmas(rng):
  x = rng.standard_normal((64, 256)).astype(np.float32)
  starts = np.array([8, 40, 1, 128], np.int32)

  @_kernel((16, 128), scratch_types=[pltpu.SMEM((4,), jnp.int32), pltpu.VMEM((32, 256), F32),
                                     pltpu.VMEM((16, 128), F32)])
  def k(s_hbm, x_hbm, o_hbm, s, buf, out):
    pltpu.sync_copy(s_hbm, s)
    r0, r1, r2, c0 = s[0], s[1], s[2], s[3]
    # DMA with dynamic starts on the HBM source (pl.ds) and on a view of the destination
    pltpu.sync_copy(x_hbm.at[pl.ds(r0, 16)], buf.at[pl.ds(0, 16)])
    pltpu.sync_copy(x_hbm.at[pl.ds(r1, 16), :], buf.at[16:32])
    # dynamic start on a ref load, on a view of a view, and on a store
    out[...] = buf[pl.ds(r2, 16), pl.ds(c0, 128)]
    out.at[pl.ds(r2, 8)][pl.ds(0, 4), :] = buf.at[pl.ds(16, 16)].at[pl.ds(r2, 4)][:, 0:128]
    out[r2 + 14] = buf[r1 - 30, pl.ds(c0, 128)]       # integer indices from SMEM scalars
    pltpu.sync_copy(out, o_hbm)

  got = k(starts, x)
  buf = np.concatenate([x[8:24], x[40:56]])
  ref = buf[1:17, 128:256].copy()
  ref[1:5] = buf[17:21, 0:128]
  ref[15] = buf[10, 128:256]
  np.testing.assert_array_equal(got, ref)


def test_dynamic_start_out_of_bounds_is_an_error():
  @_kernel((8, 128), scratch_types=[pltpu.SMEM((1,), jnp.int32), pltpu.VMEM((8, 128), F32)])
  def k(s_hbm, x_hbm, o_hbm, s, buf):
    pltpu.sync_copy(s_hbm, s)
    pltpu.sync_copy(x_hbm.at[pl.ds(s[0], 8)], buf)

  with pytest.raises(pl.OutOfBoundsError, match=r"Slice \[60:68\] out of bounds for axis 0 of args\[1\]"):
    k(np.array([60], np.int32), np.zeros((64, 128), np.float32))
