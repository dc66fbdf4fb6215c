"""The replay machine (sim/replay.py) without JAX: plans marked replayable by hand (their schedules are
data-independent by construction; palace.jax proves it for its kernels, tests/jax_backend/test_replay.py)
replay with the full machine's outputs and reports, implement the whole executor protocol, and stop
with an internal error where a false proof would make them model something else."""
import dataclasses

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src import executor
from palace._src.executor import Executor
from palace._src.launch.run import run
from palace._src.sim.replay import ReplayCore, ReplayMemo

RNG = np.random.default_rng(0)
X = RNG.integers(-4, 5, (256, 256)).astype(np.float32)
Y = RNG.integers(-4, 5, (256, 256)).astype(np.float32)


def _matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...]


MATMUL = pl.pallas_call(
    _matmul_kernel, grid=(2, 2, 2), out_shape=pl.ShapeDtypeStruct((256, 256), np.float32),
    in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)), pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
    out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
    scratch_shapes=[pltpu.VMEM((128, 128), np.float32)])


def _manual_kernel(x_hbm, o_hbm):
  def body(buf, dma, sem):
    c = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, dma.at[0])
    c.start()
    c.wait()
    buf[...] = buf[...] * 3.0 + 1.0
    pl.semaphore_signal(sem, 2)
    pl.semaphore_wait(sem, 2)
    d = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(8, 8)], dma.at[1])
    d.start()
    d.wait()
  pl.run_scoped(body, pltpu.VMEM((8, 128), np.float32), pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.REGULAR)


MANUAL = pl.kernel(_manual_kernel, out_type=pl.ShapeDtypeStruct((16, 128), np.float32),
                   mesh=pltpu.TensorCoreMesh("core", num_cores=1))


def _replayable(call, *args):
  plan, operands = call.plan(*args)
  return dataclasses.replace(plan, replay_operands=()), operands


def _figures(r):
  return (r.device_cycles, r.flops, r.hbm_bytes, r.unit_busy_cycles, r.vmem_peak_bytes, r.grid_steps,
          r.dma_count, r.stats, [e[:5] for e in r.events])


@pytest.mark.parametrize("call,args", [(MATMUL, (X, Y)), (MANUAL, (X[:16, :128],))], ids=["grid", "manual"])
def test_a_replayed_launch_gives_the_full_machines_outputs_and_report(call, args):
  plan, operands = _replayable(call, *args)
  with pl.virtual_tpu("v5e") as tpu:
    outs = [run(plan, operands) for _ in range(3)]
  with pl.virtual_tpu("v5e", replay=False) as full:
    ref = run(plan, operands)
  assert tpu.replays.hits == 2 and full.replays is None
  for o in outs:
    np.testing.assert_array_equal(o[0], ref[0])
  assert [_figures(r) for r in tpu.reports] == [_figures(full.reports[0])] * 3
  assert tpu.reports[1] is not tpu.reports[2]   # each launch its own report


def test_plans_not_marked_replayable_always_run_the_full_machine():
  with pl.virtual_tpu("v5e") as tpu:
    for _ in range(2):
      MATMUL(X, Y)
  assert tpu.replays.hits == 0


def test_the_replay_core_implements_the_whole_protocol():
  seen = []

  def kernel(x_ref, o_ref):
    ex = executor.current()
    names = {n for c in Executor.__mro__ for n in getattr(c, "__annotations__", {})} | \
        {n for c in Executor.__mro__ if c.__module__ == executor.__name__ for n, v in vars(c).items()
         if callable(v) and not n.startswith("_")}
    seen.append((type(ex), sorted(n for n in names if not hasattr(ex, n))))
    o_ref[...] = x_ref[...]
  call = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))
  plan, operands = _replayable(call, X[:8, :128])
  with pl.virtual_tpu("v5e"):
    run(plan, operands)
    run(plan, operands)
  assert seen[1][0] is ReplayCore and seen[1][1] == []


def test_a_false_proof_stops_with_an_internal_error_instead_of_modelling_something_else():
  def kernel(x_hbm, o_hbm):
    def body(buf, sem):
      c = pltpu.make_async_copy(x_hbm, buf, sem)
      c.start()
      _ = pl.semaphore_read(sem)   # a value that depends on when the copy lands: never replayable
      c.wait()
      pltpu.sync_copy(buf, o_hbm)
    pl.run_scoped(body, pltpu.VMEM((8, 128), np.float32), pltpu.SemaphoreType.DMA)
  call = pl.kernel(kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                   mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  plan, operands = _replayable(call, X[:8, :128])
  with pl.virtual_tpu("v5e"):
    run(plan, operands)
    with pytest.raises(RuntimeError, match=r"palace internal error: the replayed launch of kernel "
                                           r"'kernel' read a semaphore \(on chip 0 core 0 in kernel "
                                           r"'kernel', .*test_replay_machine.py:\d+\).*replay=False"):
      run(plan, operands)


def test_the_memo_is_bounded_in_entries_and_trace_events():
  class Rep:
    def __init__(self, n):
      self.trace_log = [None] * n

    def replica(self):
      return self
  memo = ReplayMemo()
  memo.LIMIT, memo.EVENT_LIMIT = 3, 10
  plans = [object() for _ in range(6)]
  for p in plans[:4]:
    memo.put(p, (), Rep(2))
  assert memo.get(plans[0], ()) is None and memo.get(plans[3], ()) is not None   # the oldest went
  memo.put(plans[4], (), Rep(9))     # 9 events: only room once the others are gone
  assert [memo.get(p, ()) is not None for p in plans[1:5]] == [False, False, False, True]
  memo.put(plans[5], (), Rep(11))    # more than the whole budget: never kept
  assert memo.get(plans[5], ()) is None and memo.get(plans[4], ()) is not None
  assert memo.get(object(), ()) is None and memo.hits == 3
