"""Correct kernels produce no report under detect_races=True (and read no never-written memory).

Pipelines (pallas_call, emit_pipeline, manual double buffering), megacore, TensorCore meshes with
barriers and remote core copies, ring collectives over several chips, SparseCore kernels.
"""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc

F32 = jnp.float32
RNG = np.random.default_rng(0)
X = RNG.standard_normal((64, 256)).astype(np.float32)


def _bf(a):
  """float32 operands as the MXU reads them at the default precision: rounded to bf16 (docs/numerics.md)."""
  return a.astype(jnp.bfloat16).astype(np.float32)


def _checked(chip="v5e", num_chips=1, uninit=True):
  return pl.virtual_tpu(chip, num_chips, detect_races=True, uninitialized="raise" if uninit else "nan")


def _kernel(out_shape, mesh=None, dtype=np.float32, **kw):
  return functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(out_shape, dtype),
                           mesh=mesh or pltpu.TensorCoreMesh("core", 1), **kw)


# ====================================================================== pipelines on one core
@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_pallas_call_elementwise_pipeline(buffers):
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j), pipeline_mode=pl.Buffered(buffers))
  f = pl.pallas_call(lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2 + y_ref[...]),
                     out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(8, 2), in_specs=[spec, spec],
                     out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)))
  with _checked():
    np.testing.assert_allclose(f(X, X), 3 * X, rtol=1e-6)


def _matmul(x, y, bm=16, bk=128, bn=128, sem=None):
  def body(x_ref, y_ref, o_ref, acc):
    @pl.when(pl.program_id(2) == 0)
    def _():
      acc[...] = jnp.zeros_like(acc)
    acc[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
      o_ref[...] = acc[...]

  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      body, out_shape=pl.ShapeDtypeStruct((m, n), F32), grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), F32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem))(x, y)


def test_pallas_call_matmul_with_accumulator():
  y = RNG.standard_normal((256, 256)).astype(np.float32)
  with _checked():
    np.testing.assert_allclose(_matmul(X, y), _bf(X) @ _bf(y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chip", ["v4", "v5p"])
def test_megacore_pallas_call_matmul(chip):
  y = RNG.standard_normal((256, 256)).astype(np.float32)
  with _checked(chip):
    out = _matmul(X, y, sem=("parallel", "parallel", "arbitrary"))
  np.testing.assert_allclose(out, _bf(X) @ _bf(y), rtol=1e-4, atol=1e-4)


def test_pallas_call_ragged_blocks_and_scalar_prefetch():
  idx = np.array([3, 0, 2, 1], np.int32)
  x = RNG.standard_normal((60, 128)).astype(np.float32)   # 60 rows: the last 16-row block is ragged

  def body(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + idx_ref[pl.program_id(0)].astype(F32)

  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                    in_specs=[pl.BlockSpec((16, 128), lambda i, s: (s[i], 0))],
                                    out_specs=pl.BlockSpec((16, 128), lambda i, s: (i, 0)))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid_spec=gs)
  with _checked(uninit=False):   # the ragged block's padding rows are garbage by definition
    out = f(idx, x)
  for i, s in enumerate(idx):
    rows = x[s * 16:(s + 1) * 16]
    np.testing.assert_allclose(out[i * 16:i * 16 + len(rows)], rows + s)


def test_pallas_call_input_output_alias_accumulates_in_place():
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                     out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(8,),
                     in_specs=[pl.BlockSpec((8, 256), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)), input_output_aliases={0: 0})
  with _checked():
    np.testing.assert_allclose(f(X), X + 1)


def test_emit_pipeline_inside_a_kernel():
  @_kernel(X.shape)
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = jnp.exp(x_ref[...])
    spec = pl.BlockSpec((16, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  with _checked():
    np.testing.assert_allclose(k(X), np.exp(X), rtol=1e-6)


def test_manual_double_buffering_with_correct_waits():
  n = 8

  @_kernel(X.shape, scratch_types=[pltpu.VMEM((2, 8, 256), F32), pltpu.VMEM((2, 8, 256), F32),
                                   pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, ins, outs, in_sems, out_sems):
    def fetch(i):
      return pltpu.make_async_copy(x_hbm.at[pl.ds(i * 8, 8)], ins.at[i % 2], in_sems.at[i % 2])

    def put(i):
      return pltpu.make_async_copy(outs.at[i % 2], o_hbm.at[pl.ds(i * 8, 8)], out_sems.at[i % 2])

    fetch(0).start()
    for i in range(n):
      fetch(i).wait()
      if i + 1 < n:
        fetch(i + 1).start()          # the other slot: its last reader (step i-1) is done
      if i >= 2:
        put(i - 2).wait()             # the output slot is free again
      outs[i % 2] = ins[i % 2] * 3
      put(i).start()
    put(n - 2).wait()
    put(n - 1).wait()

  for policy in ("eager", "on_wait", "random"):
    with pl.virtual_tpu("v5e", detect_races=True, uninitialized="raise", dma_policy=policy, seed=4):
      np.testing.assert_allclose(k(X), 3 * X)


# ====================================================================== several cores
def test_tensorcore_mesh_emit_pipeline_split_over_cores():
  @_kernel(X.shape, mesh=pltpu.TensorCoreMesh("core", 2))
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] - 1
    spec = pl.BlockSpec((16, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(4, 2), in_specs=[spec], out_specs=[spec], core_axis_name="core",
                        dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL))(x_hbm, o_hbm)

  with _checked("v5p"):
    np.testing.assert_allclose(k(X), X - 1)


def test_core_barrier_orders_a_handoff_through_hbm_and_shared_scratch():
  @_kernel((8, 128), mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.SemaphoreType.REGULAR,
                                                                         pltpu.VMEM((8, 128), F32)])
  def k(o_hbm, sem, buf):
    c = lax.axis_index("core")

    def body(shared):
      @pl.when(c == 0)
      def _():
        shared[...] = jnp.full((8, 128), 2.0, F32)
        buf[...] = jnp.full((8, 128), 3.0, F32)
        pltpu.sync_copy(buf, o_hbm)
      pltpu.core_barrier(sem, core_axis_name="core")

      @pl.when(c == 1)
      def _():
        pltpu.sync_copy(o_hbm, buf)
        buf[...] = buf[...] * shared[...]
        pltpu.sync_copy(buf, o_hbm)
      pltpu.core_barrier(sem, core_axis_name="core")   # nobody frees `shared` while core 1 reads it

    pl.run_scoped(body, pltpu.VMEM((8, 128), F32), collective_axes="core")

  with _checked("v5p"):
    np.testing.assert_array_equal(k(), np.full((8, 128), 6.0, np.float32))


def test_remote_core_copy_waited_on_the_receiving_core():
  @_kernel((8, 128), mesh=pltpu.TensorCoreMesh("core", 2),
           scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, send, recv):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.sync_copy(x_hbm.at[0:8, 0:128], buf)
      copy = pltpu.make_async_remote_copy(buf, buf, send, recv, device_id={"core": 1})
      copy.start()
      copy.wait_send()

    @pl.when(c == 1)
    def _():
      pltpu.make_async_copy(buf, buf, recv).wait()    # the receive of core 0's copy
      buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)

  with _checked("v5p"):
    np.testing.assert_allclose(k(X), X[0:8, 0:128] + 1)


def test_polling_handoff_with_semaphore_read():
  @_kernel((8, 128), mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(o_hbm, flag):
    c = lax.axis_index("core")

    @pl.when(c == 1)
    def _():
      def body(buf):
        buf[...] = jnp.full((8, 128), 7.0, F32)
        pltpu.sync_copy(buf, o_hbm)
      pl.run_scoped(body, pltpu.VMEM((8, 128), F32))
      pl.semaphore_signal(flag, 1, device_id={"core": 0})

    @pl.when(c == 0)
    def _():
      lax.while_loop(lambda n: pl.semaphore_read(flag) < 1, lambda n: n + 1, 0)  # sees core 1's signal

      def body(buf):
        pltpu.sync_copy(o_hbm, buf)
        buf[...] = buf[...] + 1
        pltpu.sync_copy(buf, o_hbm)
      pl.run_scoped(body, pltpu.VMEM((8, 128), F32))
      pl.semaphore_wait(flag, 1)         # consume the signal (semaphores end at 0)

  with _checked("v5p"):
    np.testing.assert_array_equal(k(), np.full((8, 128), 8.0, np.float32))


# ====================================================================== several chips
def _ring_all_gather(n, bidirectional=False):
  def per_chip(xs):
    @_kernel((n * 8, 128), scratch_types=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
             compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm, send, recv):
      me = lax.axis_index("x")
      right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={"x": left})
      pl.semaphore_signal(barrier, 1, device_id={"x": right})
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, o_hbm.at[pl.ds(me * 8, 8)])
      for step in range(n - 1):
        slot = lax.rem(me + n - step, n)
        blk = o_hbm.at[pl.ds(slot * 8, 8)]
        copy = pltpu.make_async_remote_copy(blk, blk, send, recv, device_id={"x": right})
        copy.start()
        copy.wait()
        pl.semaphore_signal(barrier, 1, device_id={"x": left})
        pl.semaphore_wait(barrier, 1)
    return k(xs)
  return per_chip


@pytest.mark.parametrize("n,policy", [(2, "eager"), (4, "on_wait"), (4, "random")])
def test_ring_all_gather(n, policy):
  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  with pl.virtual_tpu("v5e", n, detect_races=True, uninitialized="raise", dma_policy=policy, seed=2):
    mesh = pl.make_mesh((n,), ("x",))
    out = pl.shard_map(_ring_all_gather(n), mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(out, np.tile(x, (n, 1)))


def test_ring_reduce_with_double_buffered_receive_slots_and_credits():
  n = 4

  def per_chip(xs):
    @_kernel((8, 128), scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.VMEM((2, 8, 128), F32),
                                      pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,)),
                                      pltpu.SemaphoreType.REGULAR],
             compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm, acc, slots, send, recv, credit):
      me = lax.axis_index("x")
      right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={"x": left})
      pl.semaphore_signal(barrier, 1, device_id={"x": right})
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, acc)
      pltpu.sync_copy(x_hbm, slots.at[0])
      for step in range(n - 1):
        cur, nxt = step % 2, (step + 1) % 2
        if step >= 1:
          pl.semaphore_wait(credit, 1)   # the right neighbour consumed its slot `nxt`
        copy = pltpu.make_async_remote_copy(slots.at[cur], slots.at[nxt], send.at[cur], recv.at[nxt],
                                            device_id={"x": right})
        copy.start()
        copy.wait_send()
        copy.wait_recv()                 # my slot `nxt` holds the left neighbour's block
        acc[...] = acc[...] + slots[nxt]
        if step < n - 2:
          pl.semaphore_signal(credit, 1, device_id={"x": left})   # my slot `cur` may be overwritten
      pltpu.sync_copy(acc, o_hbm)
    return k(xs)

  x = RNG.standard_normal((n * 8, 128)).astype(np.float32)
  with _checked("v5e", n):
    mesh = pl.make_mesh((n,), ("x",))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  total = x.reshape(n, 8, 128).sum(0)
  np.testing.assert_allclose(out, np.tile(total, (n, 1)), rtol=1e-5, atol=1e-5)


def test_pallas_call_inside_shard_map():
  def per_chip(xs):
    return _matmul(xs, np.eye(256, dtype=np.float32))
  x = RNG.standard_normal((4 * 16, 256)).astype(np.float32)
  with _checked("v5e", 4):
    mesh = pl.make_mesh((4,), ("x",))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  np.testing.assert_allclose(out, _bf(x), rtol=1e-5, atol=1e-5)   # x @ I: x rounded to bf16


# ====================================================================== SparseCore
def test_sparsecore_gather_and_subcore_barrier_through_shared_vmem():
  lanes = 8
  x = np.arange(lanes, dtype=np.int32)
  with _checked("v5p"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=4)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((4, lanes), np.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32),
                                      pltpu.VMEM_SHARED((4, lanes), jnp.int32)])
    def k(x_hbm, o_hbm, mine, other, shared):
      s = lax.axis_index("s")
      pltpu.sync_copy(x_hbm, mine)
      mine[...] = mine[...] * (s + 1)
      pltpu.sync_copy(mine, shared.at[s])
      plsc.subcore_barrier()
      pltpu.sync_copy(shared.at[lax.rem(s + 1, 4)], other)   # the next subcore's row
      mine[...] = mine[...] + other[...]
      pltpu.sync_copy(mine, o_hbm.at[s])
      plsc.subcore_barrier()   # keep `shared` alive until every subcore has read it

    out = k(x)
  want = np.stack([x * (s + 1) + x * ((s + 1) % 4 + 1) for s in range(4)])
  np.testing.assert_array_equal(out, want)


def test_sparsecore_indexed_gather_of_table_rows():
  table = RNG.standard_normal((64, 128)).astype(np.float32)
  idx = RNG.integers(0, 64, size=32).astype(np.int32)
  with _checked("v6e"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1,
                                  num_subcores=4)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((32, 128), np.float32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((8,), jnp.int32), pltpu.VMEM((8, 128), jnp.float32)])
    def gather(table_hbm, idx_hbm, out_hbm, idx_vmem, rows_vmem):
      wid = lax.axis_index("subcore")
      pltpu.sync_copy(idx_hbm.at[pl.ds(wid * 8, 8)], idx_vmem)
      pltpu.sync_copy(table_hbm.at[idx_vmem], rows_vmem)
      pltpu.sync_copy(rows_vmem, out_hbm.at[pl.ds(wid * 8, 8)])

    out = gather(table, idx)
  np.testing.assert_array_equal(out, table[idx])
