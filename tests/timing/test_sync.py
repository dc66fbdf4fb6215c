"""White-box tests of sim/sync.py: semaphore settle / wait / read / check-zero and the scheduler.

Fake cores and a fake machine keep every number in hand: each expected cycle is written as the sum
that produces it (the style of test_exact_timeline.py). A property test checks `settle` against a
straightforward reference (sort every arrival, take the shortest prefix that reaches the value).
"""
import itertools
import random
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import palace as pl
from palace import lax
from palace import tpu as pltpu
from palace._src.errors import SyncError
from palace._src.sim import sync
from palace._src.sim.trace import Trace
from palace._src.util import user_site

from timing_helpers import UNIT_CHIP

SCALAR = 1   # UNIT_CHIP.scalar_op_cycles


class _Machine:
  def __init__(self, policy="eager"):
    self.sequence = itertools.count(1)
    self.kernel_name = "k"
    self.arrived = []
    self.dma_policy = types.SimpleNamespace(name=policy, rng=random.Random(0))
    self.sems = sync.Semaphores(self)
    self.sched = sync.Solo(self)

  def dma_arrived(self, rec, src):
    self.arrived.append((rec, src))

  def site(self):   # (Machine.site: the user's line from the stack, no fixed site)
    return user_site()


class _Core:
  def __init__(self, core_id=0, now=0):
    self.now = now
    self.trace = Trace()
    self.tid = (0, core_id)
    self.chip = UNIT_CHIP
    self.chip_index, self.core_id = 0, core_id
    self.grid_stack = []
    self.blocked_on = None
    self._poll, self._polls = None, 0
    self.kernel_name = "k"


class _Buf:
  def __init__(self, name="sem", shape=()):
    self.name, self.shape, self.sem_kind = name, shape, "regular"


def test_settle_applies_just_enough_arrivals_in_cycle_order():
  m = _Machine()
  sems = m.sems
  s = sems.slot(_Buf(), ())
  sems.arrive(s, 500, 2)
  sems.arrive(s, 100, 1, dma="copy A")
  sems.arrive(s, 300, 1)
  sems.arrive(s, 300, 4)
  assert sems.settle(s, 9) is None and s.value == 0          # 2 + 1 + 1 + 4 = 8 < 9: nothing applied
  # in (cycle, seq) order: 1 @100, 1 @300, 4 @300 reach 1 + 1 + 4 = 6 >= 5; the last needed lands at 300
  assert sems.settle(s, 5) == 300 and s.value == 1 + 1 + 4
  assert [(a.cycle, a.amount) for a in s.pending] == [(500, 2)]
  assert m.arrived == [("copy A", False)]                    # the applied DMA arrival completed its copy
  assert sems.settle(s, 6) == 0                              # already there: completes at once
  assert s.total() == 6 + 2 and s.visible(499) == 6 and s.visible(500) == 6 + 2


def test_wait_moves_the_clock_to_the_arrival_then_one_scalar_op_and_decrements():
  m = _Machine()
  core = _Core(now=40)
  buf = _Buf("flag")
  s = m.sems.slot(buf, ())
  m.sems.arrive(s, 250, 3)
  m.sems.wait(core, buf, (), 2)
  assert core.now == 250 + SCALAR and s.value == 3 - 2
  assert [e[2:5] for e in core.trace.events] == [("wait flag", 40, 250)]
  m.sems.wait(core, buf, (), 1, decrement=False)              # satisfied already: just the scalar op
  assert core.now == 250 + SCALAR + SCALAR and s.value == 1
  assert len(core.trace.events) == 1


def test_wait_that_nothing_can_satisfy_on_one_core_is_a_deadlock():
  m = _Machine()
  core = _Core()
  buf = _Buf("never")
  m.sems.arrive(m.sems.slot(buf, ()), 10, 1)
  with pytest.raises(SyncError, match=r"core 0 waits at .* for semaphore never: needs 2, has 1"):
    m.sems.wait(core, buf, (), 2)


def test_read_sees_arrivals_landed_by_the_readers_clock_and_applies_none():
  m = _Machine()
  core = _Core(now=99)
  buf = _Buf()
  s = m.sems.slot(buf, ())
  m.sems.arrive(s, 100, 5)
  m.sems.arrive(s, 200, 7)
  assert m.sems.read(core, buf, ()) == 5 and core.now == 99 + SCALAR   # 100 <= 100: landed
  assert len(s.pending) == 2 and s.value == 0


def test_read_polling_a_value_nothing_can_change_is_reported_as_a_deadlock():
  m = _Machine()
  core = _Core()
  buf = _Buf("poll")
  for _ in range(sync.LIVELOCK_POLLS):
    assert m.sems.read(core, buf, ()) == 0
  with pytest.raises(SyncError, match=r"semaphore poll to change from 0 \(polled with semaphore_read "
                     r"1000 times\)"):
    m.sems.read(core, buf, ())


def test_check_zero_counts_pending_arrivals_and_names_the_element():
  m = _Machine()
  core = _Core()
  buf = _Buf("sems", (2,))
  m.sems.check_zero(core, buf, "at kernel end")   # never touched: zero
  m.sems.arrive(m.sems.slot(buf, (1,)), 5, 3)
  with pytest.raises(SyncError, match=r"Semaphore sems\[1\] \(regular\) is 3, not 0, at kernel end"):
    m.sems.check_zero(core, buf, "at kernel end")


def _run(m, programs):
  sched = sync.Scheduler(m, programs)
  sched.run()
  return sched


def test_scheduler_resumes_the_runnable_core_with_the_smallest_clock():
  """Core 0 signals core 1 and 2 at known cycles; each waiter resumes when its arrival lands, and the
  order of the log is the order of (clock, core) at each handoff."""
  m = _Machine()
  log = []
  a, b, c = _Core(0), _Core(1), _Core(2, now=5)
  buf = _Buf("go")
  s1, s2 = m.sems.slot(buf, (1,)), m.sems.slot(buf, (2,))

  def p0():
    a.now = 100
    m.sems.arrive(s2, a.now, 1)     # core 2 may go at 100
    m.sched.maybe_yield(a)          # cores 1 (clock 0) and 2 (clock 5) are earlier: they run first
    log.append(("a", a.now))
    a.now = 300
    m.sems.arrive(s1, a.now, 1)
    log.append(("a end", a.now))

  def p1():
    log.append(("b", b.now))
    m.sems.wait(b, buf, (1,), 1)
    log.append(("b woke", b.now))

  def p2():
    log.append(("c", c.now))
    m.sems.wait(c, buf, (2,), 1)
    log.append(("c woke", c.now))

  _run(m, [(a, p0), (b, p1), (c, p2)])
  assert log == [("b", 0), ("c", 5), ("c woke", 100 + SCALAR), ("a", 100), ("a end", 300),
                 ("b woke", 300 + SCALAR)]


def test_scheduler_reports_every_blocked_core_in_a_deadlock():
  m = _Machine()
  a, b = _Core(0), _Core(1)
  buf = _Buf("x")

  def waits(core, idx):
    return lambda: m.sems.wait(core, buf, (idx,), 1)

  with pytest.raises(SyncError, match=r"(?s)Deadlock in kernel 'k'.*core 0 waits .*semaphore x: needs 1, "
                     r"has 0.*core 1 waits .*semaphore x: needs 1, has 0"):
    _run(m, [(a, waits(a, 0)), (b, waits(b, 1))])


def test_a_condition_wait_resumes_when_its_condition_holds():
  m = _Machine()
  a, b = _Core(0), _Core(1, now=50)
  box = []

  def p0():
    a.blocked_on = sync.ConditionWait(lambda: bool(box), "the box", None)
    m.sched.block(a)
    a.blocked_on = None
    box.append("a saw it")

  def p1():
    box.append("b filled it")

  _run(m, [(a, p0), (b, p1)])
  assert box == ["b filled it", "a saw it"]


def _reference_settle(value, pending, need):
  """Cycle at which `need` is reached by the shortest (cycle, seq)-ordered prefix, and what remains."""
  if value >= need:
    return 0, value, pending
  order = sorted(pending)
  total = value
  for j, (cycle, seq, amount) in enumerate(order):
    total += amount
    if total >= need:
      return max(c for c, _, _ in order[:j + 1]), total, order[j + 1:]
  return None, value, pending


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 4)), max_size=8),
       st.lists(st.integers(0, 12), min_size=1, max_size=5))
def test_settle_agrees_with_a_reference_over_random_arrivals_and_waits(arrivals, needs):
  m = _Machine()
  s = m.sems.slot(_Buf(), ())
  ref_value, ref_pending = 0, []
  for seq, (cycle, amount) in enumerate(arrivals, 1):   # (the machine's sequence numbers: 1, 2, ...)
    m.sems.arrive(s, cycle, amount)
    ref_pending.append((cycle, seq, amount))
  for need in needs:
    t, ref_value2, ref_pending2 = _reference_settle(ref_value, ref_pending, need)
    assert m.sems.settle(s, need) == t
    if t is not None:
      ref_value, ref_pending = ref_value2, ref_pending2
    assert s.value == ref_value
    assert sorted((a.cycle, a.seq, a.amount) for a in s.pending) == sorted(ref_pending)
    if t is not None:
      s.value -= need   # what a decrementing wait does
      ref_value -= need


F32 = np.float32
UNIT2 = UNIT_CHIP.__class__(**{**UNIT_CHIP.__dict__, "name": "unit2", "num_tensorcores_per_device": 2})


def test_a_cross_core_signal_wakes_the_waiter_at_the_signal_cycle():
  """Core 0 signals core 1's semaphore after a 4-row copy; core 1, which waits from the start, resumes
  at the signal's cycle plus one scalar op (exact sums on the round-number chip)."""
  def k(x_hbm, o_hbm, vbuf, sem, dsem):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.sync_copy(x_hbm, vbuf)
      pl.semaphore_signal(sem, 1, core_index=1)

    @pl.when(c == 1)
    def _():
      pl.semaphore_wait(sem, 1)
      pltpu.sync_copy(x_hbm, o_hbm)

  import functools
  x = np.ones((8, 128), F32)
  with pl.virtual_tpu(UNIT2) as tpu:
    functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, F32),
                      mesh=pltpu.TensorCoreMesh("core", 2),
                      scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.REGULAR,
                                     pltpu.SemaphoreType.DMA])(k)(x)
  r = tpu.reports[-1]
  by_core = {}
  for e in r.events:
    by_core.setdefault(e[0][1], []).append((e[1], e[2], e[3], e[4]))
  (copy0,) = [e for e in by_core[0] if e[0] == "dma"]
  (wait1,) = [e for e in by_core[1] if e[0] == "scalar" and e[1] == "wait scratch[1]"]
  (copy1,) = [e for e in by_core[1] if e[0] == "dma"]
  # core 0: copy done at copy0[3]; its .wait() (the DMA-wait sync and one scalar op), then the signal
  signal = copy0[3] + UNIT_CHIP.dma_wait_sync_cycles + SCALAR + SCALAR
  assert wait1[3] == signal
  # core 1 resumes at the signal, pays the wait's scalar op, then issues its copy
  assert copy1[2] == signal + SCALAR + UNIT_CHIP.dma_issue_cycles
