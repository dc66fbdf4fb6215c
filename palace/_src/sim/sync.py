"""Synchronisation of the virtual TPU (L4b): semaphore arrivals, waits and the core scheduler.

Semaphores. Every semaphore element (a `Semaphore`) holds an applied `value` and a list of pending
`Arrival`s: a signal (`semaphore_signal`, also from another core or chip), a DMA's byte count landing
at its completion cycle, or a DMA's source side finishing its read (`src`). Arrivals are applied
lazily, by the wait that needs them:
  * settle: a wait for `value` applies pending arrivals in (cycle, seq) order, just enough of them to
    reach `value`; the wait completes at the latest cycle among those applied (0 if the value was
    already there). Applying a DMA arrival completes that side of the copy (its data moves then at the
    latest: `Machine.dma_arrived`). If the pending arrivals cannot reach `value`, the wait blocks.
  * read (`semaphore_read`): the applied value plus the arrivals that have landed by the reader's clock;
    nothing is applied. A read that sees the same value 1000 times while no other core can change it
    is a livelock, reported as a deadlock.
  * check-zero: at the end of a `run_scoped` region or the kernel, value + pending must be 0.

Scheduler (`Scheduler`, the algorithm: "earliest clock first, run to the next blocking wait"). Cores
are cooperating threads of which exactly one runs at a time. The running core runs ahead on its own
clock until it blocks (a wait that settle cannot satisfy, a peer allocation not made yet) or yields
(after a DMA start, a signal or a read, when a ready core has an earlier clock); control then passes by
direct handoff to the runnable core with the smallest (clock, chip, core) - a blocked core is runnable
once its wait could be satisfied. When no core is runnable and some are blocked, the launch fails with a
deadlock error naming each core, what it waits for and where. The `random` DMA policy picks among the
runnable cores with the policy's seeded generator instead. A single-core launch runs with `Solo`: the
same interface, where a blocking wait is a deadlock at once.
"""
from __future__ import annotations

import enum
import functools
import itertools
import operator
import threading

import numpy as np

from palace._src import executor as executor_mod
from palace._src.errors import SyncError
from palace._src.sim import workers
from palace._src.sim.checks import NO_CHECKS
from palace._src.util import fmt_bytes, fmt_site

LIVELOCK_POLLS = 1000   # semaphore_read calls seeing the same value before a livelock is reported


class Arrival(tuple):
  """One pending increment of a semaphore, made from the tuple (cycle, seq, amount, dma, src): `amount`
  lands at `cycle`; `seq` orders arrivals of equal cycle (issue order); `dma` is the copy it completes
  (None for a signal or barrier arrival) and `src` says whether it completes the copy's source side
  (its read) rather than its destination. A tuple subclass (made without a Python-level constructor,
  one or two per DMA), immutable; arrivals order as their (cycle, seq) prefix does."""
  __slots__ = ()
  cycle = property(operator.itemgetter(0))
  seq = property(operator.itemgetter(1))
  amount = property(operator.itemgetter(2))
  dma = property(operator.itemgetter(3))
  src = property(operator.itemgetter(4))

  def __repr__(self):
    return f"Arrival(cycle={self.cycle}, seq={self.seq}, amount={self.amount}, src={self.src})"


_order = operator.itemgetter(0, 1)   # (cycle, seq): unique per arrival


class Semaphore:
  """One semaphore element: the applied `value` and the pending arrivals (in arrival order)."""
  __slots__ = ("value", "pending")

  def __init__(self):
    self.value = 0
    self.pending = []

  def total(self) -> int:
    """The value once every pending arrival has landed."""
    return self.value + sum(a.amount for a in self.pending)

  def visible(self, now) -> int:
    """The value a reader at cycle `now` sees: applied plus landed arrivals."""
    return self.value + sum(a.amount for a in self.pending if a.cycle <= now)


class CoreState(enum.Enum):
  READY = "ready"
  RUNNING = "running"
  BLOCKED = "blocked"
  DONE = "done"


_READY, _RUNNING, _BLOCKED, _DONE = CoreState.READY, CoreState.RUNNING, CoreState.BLOCKED, CoreState.DONE


class SemaphoreWait:
  """What a core blocked in a semaphore (or DMA, or barrier) wait waits for."""
  __slots__ = ("name", "value", "sem", "dma", "site")

  def __init__(self, name: str, value: int, sem: Semaphore, dma, site):
    self.name, self.value, self.sem, self.dma, self.site = name, value, sem, dma, site

  def can_resume(self) -> bool:
    return self.sem.total() >= self.value

  def describe(self) -> str:
    what = f"DMA {self.dma.describe}" if self.dma is not None else f"semaphore {self.name}"
    return (f"waits at {fmt_site(self.site)} for {what}: needs {self.value}, has {self.sem.total()}" +
            (f" ({fmt_bytes(self.value)} of DMA data)" if self.dma is not None else ""))


class ConditionWait:
  """A core waiting for a condition (a peer's allocation), or a livelocked polling loop (`ready`
  always False)."""
  __slots__ = ("ready", "text", "site")

  def __init__(self, ready, text: str, site):
    self.ready, self.text, self.site = ready, text, site

  def can_resume(self) -> bool:
    return self.ready()

  def describe(self) -> str:
    return f"waits at {fmt_site(self.site)} for {self.text}"


def _never() -> bool:
  return False


class Semaphores:
  """The semaphore elements of one launch, keyed by (id(buffer), index) (or a barrier's own key), and
  the one implementation of signal, settle, wait, read and check-zero. `checks`: the machine's bug
  checks (sim/checks.py), told of every arrival and acquire."""

  def __init__(self, machine, checks=NO_CHECKS):
    self.machine = machine
    self.checks = checks
    self.slots = {}

  def slot(self, buf, index) -> Semaphore:
    key = (id(buf), index)
    s = self.slots.get(key)
    if s is None:
      s = self.slots[key] = Semaphore()
    return s

  def keyed(self, key) -> Semaphore:
    """A semaphore the machine keeps for itself (SparseCore subcore barriers)."""
    s = self.slots.get(key)
    if s is None:
      s = self.slots[key] = Semaphore()
    return s

  def find(self, buf, index):
    return self.slots.get((id(buf), index))

  def arrive(self, sem: Semaphore, cycle, amount: int, dma=None, src: bool = False) -> None:
    """An arrival of `amount` at `cycle` (signal, DMA completion or DMA source side)."""
    seq = next(self.machine.sequence)
    sem.pending.append(Arrival((cycle, seq, amount, dma, src)))
    checks = self.checks
    if checks.active:   # (a launch without checkers makes no hook call per arrival)
      checks.arrival(seq, dma, src)

  def settle(self, sem: Semaphore, value: int):
    """Cycle at which `sem` reaches `value`, applying just enough pending arrivals (module docstring);
    None if the pending arrivals cannot reach it."""
    m = self.machine
    checks = self.checks
    if sem.value >= value:
      if checks.active:
        checks.acquire(sem, ())
      return 0
    pending = sem.pending
    if not pending:
      return None
    if len(pending) == 1:  # the common case: one copy or signal in flight on this semaphore
      a = pending[0]
      if sem.value + a.amount < value:
        return None
      del pending[0]
      sem.value += a.amount
      if a.dma is not None:
        m.dma_arrived(a.dma, a.src)
      if checks.active:
        checks.acquire(sem, (a,))
      return a.cycle
    pending.sort(key=_order)
    total = sem.value
    for j, a in enumerate(pending):
      total += a.amount
      if total >= value:
        applied = pending[:j + 1]
        del pending[:j + 1]
        t = 0
        for a in applied:
          sem.value += a.amount
          t = a.cycle if a.cycle > t else t
          if a.dma is not None:
            m.dma_arrived(a.dma, a.src)
        if checks.active:
          checks.acquire(sem, applied)
        return t
    return None

  def wait(self, core, buf, index, value: int, decrement: bool = True, dma=None, sem=None) -> None:
    """`core` waits until semaphore `buf[index]` (`sem`, when the caller has it) reaches `value`, then
    takes `value` off it (`decrement`); the wait itself is one scalar op after the arrival."""
    if sem is None:
      sem = self.slot(buf, index)
    t = self.settle(sem, value)
    while t is None:
      core.blocked_on = SemaphoreWait(buf.name, value, sem, dma, self.machine.site())
      self.machine.sched.block(core)
      core.blocked_on = None
      t = self.settle(sem, value)
    now = core.now
    if t > now:
      trace = core.trace
      if trace.on:
        trace.add((core.tid, "scalar", f"wait {buf.name}", now, t, None))
      now = t
    lat = core.chip.dma_wait_latency_cycles
    if dma is not None and lat is not None:   # (v5e's latency form: seen `lat` after it landed)
      seen = t + lat
      floor = now + core.chip.dma_wait_landed_cycles
      if floor > seen:
        seen = floor
      if seen > now:
        if core.trace.on:
          core.trace.add((core.tid, "scalar", "dma wait sync", now, seen, None))
        now = seen
    elif dma is not None and t > core.synced_until:   # a copy that landed after the last DMA-wait sync
      sync = core.chip.dma_wait_sync_cycles
      if sync and core.trace.on:
        core.trace.add((core.tid, "scalar", "dma wait sync", now, now + sync, None))
      now += sync
      core.synced_until = now
    if decrement:
      sem.value -= value
    core.now = now + core.chip.scalar_op_cycles

  def wait_copy(self, core, req, which: str = "recv") -> None:
    """`core` waits for DMA `req`: until its destination semaphore got its bytes (`which="recv"`, the
    data landed) or its source semaphore did ("send", the data left). The core's `dma_wait`."""
    if which == "send":
      self.wait(core, req.src_sem_buf, req.src_sem_index, req.nbytes, True, req)
      return
    fast = req.fast   # set by DmaEngine.start: (issuing core, plan, the semaphore of (sem_buf, sem_index))
    self.wait(core, req.sem_buf, req.sem_index, req.nbytes, True, req,
              fast[2] if fast is not None and fast[0] is core else None)

  def read(self, core, buf, index) -> int:
    """`semaphore_read` on `core` (one scalar op; lets earlier cores run first, so polling progresses)."""
    m = self.machine
    sem = self.slot(buf, index)
    core.now += core.chip.scalar_op_cycles
    sched = m.sched
    if sched.yields:
      sched.maybe_yield(core)
    value = sem.visible(core.now)
    self.checks.peek(sem, core.now)
    key = (id(sem), value)
    core._polls = core._polls + 1 if core._poll == key else 0
    core._poll = key
    if core._polls >= LIVELOCK_POLLS and not sem.pending:
      stuck = m.sched.stuck_cores(core)
      if stuck is not None:   # nothing can change the value: a livelock, reported as a deadlock
        core.blocked_on = ConditionWait(_never, f"semaphore {buf.name} to change from {value} (polled "
                                        f"with semaphore_read {core._polls} times)", m.site())
        raise deadlock_error(m.kernel_name, [core] + stuck)
    return value

  def check_zero(self, core, buf, when: str) -> None:
    """Every element of semaphore buffer `buf` must be 0, counting arrivals not yet applied."""
    for idx in itertools.product(*map(range, buf.shape)):   # (row-major; () for a scalar)
      sem = self.find(buf, idx)
      value = None if sem is None else sem.total()
      if value:
        dma = next((a.dma for a in sem.pending if a.dma is not None), None)
        raise SyncError(
            f"Semaphore {buf.name}{list(idx) if idx else ''} ({buf.sem_kind}) is {value}, not 0, "
            f"{when} on chip {core.chip_index} core {core.core_id} in kernel '{core.kernel_name}'. " +
            ("" if dma is None else f"DMA {dma.req.describe} started at {fmt_site(dma.req.site)} was "
             f"never waited: did you forget .wait()? ") +
            "Every signal (and every DMA's byte count) must be waited for. Fix: check the matching "
            "semaphore_wait / .wait() calls.")


def deadlock_error(kernel_name: str, cores) -> SyncError:
  rows = []
  for c in cores:
    row = f"chip {c.chip_index} core {c.core_id} {c.blocked_on.describe()}"
    if isinstance(c.blocked_on, SemaphoreWait) and c.grid_stack:
      row += f" at grid point {c.grid_stack[-1][0]}"
    rows.append(row)
  return SyncError(f"Deadlock in kernel '{kernel_name}': no core can make progress.\n  " +
                   "\n  ".join(rows) + "\nEvery wait needs a matching signal or DMA start. Fix: check the "
                   "semaphore and byte counts.")


class _Abort(BaseException):
  """Unwinds the threads of a failed launch."""


class Solo:
  """The scheduler of a single-core launch: nothing to switch to (`yields` False: callers skip
  `maybe_yield`)."""
  yields = False

  def __init__(self, machine):
    self.machine = machine

  def block(self, core) -> None:
    raise deadlock_error(self.machine.kernel_name, [core])

  def maybe_yield(self, core) -> None:
    pass

  def ready_at(self, core, cycle) -> None:
    pass

  def stuck_cores(self, core):
    return []

  def finished(self, core) -> bool:
    return True


class Scheduler:
  """Runs one thread per core with exactly one running at a time (module docstring). Control passes
  by direct handoff (a threading.Semaphore per core) when the running core blocks, yields or ends."""
  yields = True   # callers of maybe_yield check this first (Solo: no call at all)

  def __init__(self, machine, programs):
    self.machine = machine
    self.programs = programs
    self.state = {core: _READY for core, _ in programs}
    self.wake = {core: threading.Semaphore(0) for core, _ in programs}
    self.error = None
    self.aborted = False
    self.rng = machine.dma_policy.rng if machine.dma_policy.name == "random" else None

  def run(self) -> None:
    m = self.machine
    solo, m.sched = m.sched, self
    running = [workers.run_soon(functools.partial(self._thread, core, fn))
               for core, fn in self.programs]
    first = self.pick()
    self.state[first] = _RUNNING
    self.wake[first].release()
    for done in running:
      done.wait()
    m.sched = solo
    if self.error is not None:
      raise self.error

  def _thread(self, core, fn) -> None:
    """One core's program, on a worker thread (sim/workers.py) that outlives the launch."""
    self.wake[core].acquire()
    if not self.aborted:
      token = executor_mod.set_current(core)
      try:
        with np.errstate(all="ignore"):
          fn()
      except _Abort:
        pass
      except BaseException as e:  # noqa: BLE001  re-raised by the launching thread
        self.fail(e)
      finally:
        executor_mod.reset_current(token)
    self.state[core] = _DONE
    if not self.aborted:
      self.switch_from(core)

  def fail(self, error) -> None:
    if self.error is None:
      self.error = error
    self.aborted = True
    for c, st in self.state.items():
      if st is not _DONE:
        self.wake[c].release()

  # ---- the interface the cores use
  def block(self, core) -> None:
    """`core`'s wait cannot be satisfied yet: run others until it can."""
    self.state[core] = _BLOCKED
    self.switch_from(core)

  def maybe_yield(self, core) -> None:
    """Let a ready core with an earlier clock run first (keeps shared channels close to time order)."""
    for c, st in self.state.items():
      if st is _READY and c is not core and (c.now, c.tid) < (core.now, core.tid):
        self.state[core] = _READY
        self.switch_from(core)
        return

  def ready_at(self, core, cycle) -> None:
    """`core`, blocked in a wait that another core has just satisfied from `cycle` on (a barrier's
    last arrival), becomes ready at that cycle: until it runs, maybe_yield orders the running core
    after it (a blocked core's clock is the one it blocked at, which would let the releasing core run
    ahead and move data the released core reads at `cycle`)."""
    if self.state.get(core) is _BLOCKED:
      core.now = max(core.now, cycle)
      self.state[core] = _READY

  def stuck_cores(self, core):
    """The other unfinished cores if none of them can run (all blocked for good), else None."""
    others = [c for c, st in self.state.items() if c is not core and st is not _DONE]
    if any(self.state[c] is not _BLOCKED or c.blocked_on.can_resume() for c in others):
      return None
    return others

  def finished(self, core) -> bool:
    return self.state.get(core) is _DONE

  # ---- the algorithm
  def pick(self):
    """The runnable core with the smallest (clock, chip, core); a seeded random one under `random`."""
    best = None
    runnable = [] if self.rng is not None else None
    for core, st in self.state.items():
      if st is _READY or st is _RUNNING or (st is _BLOCKED and core.blocked_on.can_resume()):
        if runnable is not None:
          runnable.append(core)
        if best is None or (core.now, core.tid) < (best.now, best.tid):
          best = core
    if runnable is not None and len(runnable) > 1:
      return runnable[self.rng.randrange(len(runnable))]
    return best

  def switch_from(self, core) -> None:
    """Hand control to the next core; return when `core` is scheduled again (if it is not done)."""
    nxt = self.pick()
    if nxt is None:
      blocked = [c for c, st in self.state.items() if st is _BLOCKED]
      if blocked:
        self.fail(deadlock_error(self.machine.kernel_name, blocked))
        if self.state[core] is not _DONE:
          raise _Abort()
      return
    if nxt is core:
      self.state[core] = _RUNNING
      return
    self.state[nxt] = _RUNNING
    self.wake[nxt].release()
    if self.state[core] is _DONE:
      return
    self.wake[core].acquire()
    if self.aborted:
      raise _Abort()
    self.state[core] = _RUNNING
