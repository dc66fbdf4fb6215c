"""Replayed launches: a repeated launch whose schedule is known computes its data without time (L4b).

A front end may mark a plan *replayable* (`LaunchPlan.replay_operands`): it proved that the
launch's schedule, everything the kernel asks of the machine, is a function of the plan and the
bytes of a few keyed operands (palace.jax: jax/schedule.py's taint analysis of the kernel jaxpr).
The first launch with a given key runs on the full machine; when that machine was a single
TensorCore without bug checks, with eager DMAs and with data (`replayable`), its report is kept in the
VirtualTPU's `ReplayMemo`. The next launch with the same plan and key runs on a `ReplayMachine`: the
same launch, pipeline and language ops, on a `ReplayCore` that implements the executor interface
with the TensorCore's data semantics (sim/memory.py: allocation, loads, stores, copies at start, as
the eager DMA policy moves them) and no clock, channels, semaphore accounting or trace; its report is
a copy of the first one. So outputs are computed exactly as before and every user error the language
side raises is raised again; the report is the one the full machine would give, because nothing it
depends on can differ. `pl.virtual_tpu(..., replay=False)` turns it off.
"""
from __future__ import annotations

import functools

from palace._src import executor as executor_mod
from palace._src.core import MemorySpace, SemaphoreRefType
from palace._src.errors import PalaceError
from palace._src.sim import memory
from palace._src.sim.checks import NO_CHECKS
from palace._src.sim.tensorcore import TensorCore
from palace._src.util import fmt_site, user_site

_SMEM = MemorySpace.SMEM
# memory.copy as the eager DMA path of an unchecked core calls it: whole VMEM buffers may borrow
_copy = functools.partial(memory.copy, borrow=True)


class ReplayMemo:
  """The reports of replayable launches of one VirtualTPU: (plan, key) -> the first launch's report.
  Bounded: at most `LIMIT` entries and `EVENT_LIMIT` trace events in all (the oldest go first)."""
  LIMIT = 256
  EVENT_LIMIT = 1_000_000

  def __init__(self):
    # (id(plan), key) -> [plan, report, kept launch or None]; the plan kept alive so its id stays its
    # own; the kept launch is the launch layer's (launch/run.py `_Warm`), opaque here
    self._entries = {}
    self._events = 0
    self.hits = 0        # launches replayed (tests, benchmarks)
    self.warm_hits = 0   # of which on a launch kept from the last one (launch/run.py `_Warm`)

  def _entry(self, plan, key):
    entry = self._entries.get((id(plan), key))
    return entry if entry is not None and entry[0] is plan else None

  def get(self, plan, key):
    entry = self._entry(plan, key)
    if entry is None:
      return None
    self.hits += 1
    return entry[1]

  def take_warm(self, plan, key):
    """The launch kept with this entry, taken out (a launch running on it owns it), or None."""
    entry = self._entry(plan, key)
    if entry is None:
      return None
    warm, entry[2] = entry[2], None
    if warm is not None:
      self.warm_hits += 1
    return warm

  def give_warm(self, plan, key, warm) -> None:
    """Keep `warm` with this entry (unless the entry is gone or another launch gave one back first)."""
    entry = self._entry(plan, key)
    if entry is not None and entry[2] is None:
      entry[2] = warm

  def put(self, plan, key, report) -> None:
    n = len(report.trace_log)
    if n > self.EVENT_LIMIT:
      return
    kept = report.replica()   # (the VirtualTPU may later drop the recorded report's trace, not this one's)
    entries = self._entries
    while entries and (len(entries) >= self.LIMIT or self._events + n > self.EVENT_LIMIT):
      old = entries.pop(next(iter(entries)))
      self._events -= len(old[1].trace_log)
    entries[(id(plan), key)] = [plan, kept, None]
    self._events += n


def replayable(machine) -> bool:
  """May a later launch with the same plan and key replay this machine's launch? One TensorCore on
  one chip, no bug checks (races, uninitialised reads, disabled bounds checks), eager DMAs, data."""
  cores = machine.cores
  return (len(cores) == 1 and type(cores[0]) is TensorCore and machine.num_chips == 1
          and machine.checks is NO_CHECKS and cores[0].checks is NO_CHECKS
          and machine.dma_policy.name == "eager" and not machine.timing_only)


class _NotReplayable(PalaceError, RuntimeError):
  """A replayed launch asked for something a replayable launch never asks (a bug of the analysis)."""


def _never(what: str):
  def fail(self, *args, **kwargs):
    where = f" ({self.where()}, {fmt_site(self.site())})" if hasattr(self, "where") else ""
    raise _NotReplayable(f"palace internal error: the replayed launch of kernel '{self.kernel_name}' "
                         f"{what}{where}, which its first launch proved it does not. Fix: report this; "
                         f"pl.virtual_tpu(..., replay=False) runs every launch on the full machine.")
  return fail


class ReplayCore:
  """The executor of a replayed launch: a TensorCore's data semantics, no time (module docstring).
  Ready cycles are all 0; waits and semaphores do nothing, since every copy's data moved at its start
  and the first launch proved the waits complete."""
  timing_only = False
  bounds_checks = True
  deferred_values = True    # (no checker follows storage identity)
  dma_granule_bytes = 0
  sparsecore = None
  mesh_home = None
  now = 0
  checks = NO_CHECKS

  def __init__(self, machine, chip_index: int, core_id: int, axis_env: dict, params):
    self.machine = machine
    self.chip = machine.chip
    self.chip_index, self.core_id = chip_index, core_id
    self.kernel_name = machine.kernel_name
    self.exact_f32_dots = machine.tpu.exact_f32_dots
    self.shared_dots = machine.tpu.shared_dots
    self.host_math = machine.tpu.host_math
    self.dot_numerics = machine.tpu.dot_numerics
    self.axis_env = dict(axis_env)
    self.grid_stack = []
    self.grid_reads = None   # (never watched: steady_state is None)
    self.host_cache = {}
    self.unused_dmas = {}
    self.memory = memory.Allocator.of_core(self, params.vmem_limit_bytes)

  where = TensorCore.where   # (the same message text: grid point, chip, core, kernel)

  def site(self) -> tuple:
    return self.machine.site()

  def steady_state(self):
    return None   # (no time to extrapolate)

  def debug_print(self, text: str) -> None:
    self.machine.tpu.debug_print(text)

  def trace_value(self, label: str, value) -> None:
    """Nothing: a replayed launch keeps the timeline of the launch it copies (palace.jax never replays
    a kernel that traces values: its schedule entry is Never)."""

  # compute: no clock
  def vector_op(self, op_class, shape, dtype, ready: int, links: int = 0) -> int:
    return ready

  def matmul(self, m, k, n, batch, lhs_dtype, rhs_dtype, ready: int, weights=None) -> int:
    return ready

  def scalar_op(self, ready: int = 0) -> int:
    return ready

  def scalar_ops(self, n: int) -> tuple:
    return 0, 0

  def delay(self, cycles: int) -> None:
    pass

  def grid_step(self) -> None:
    pass

  def loop_back_edge(self) -> None:
    pass

  def branch(self, tested: int) -> None:
    pass

  # memory: sim/memory.py, as TensorCore.load / store do it without checks
  def load(self, buf, index, shape, site=None):
    if not shape or buf.memory_space is _SMEM:
      return memory.read_scalar(buf, index), 0
    return memory.read(buf, index, False), 0

  def store(self, buf, index, shape, data, ready: int) -> None:
    memory.write(buf, index, data, True)

  def note_access(self, buf, index, kind, shape, atomic: bool = False) -> None:
    pass

  def alloc(self, mem_type, name: str, shared: bool = False):
    if isinstance(mem_type, SemaphoreRefType):
      return memory.new_semaphore(mem_type, name, self)
    return self.memory.allocate(mem_type, name)

  def free(self, buf) -> None:
    self.memory.release(buf)

  @property
  def vmem_limit(self) -> int:
    return self.memory.vmem_limit

  # copies move at their start; waits and semaphores were proved to complete by the first launch
  def dma_start(self, req) -> None:
    if req.device_id is not None or req.core_index is not None:
      _never("started a copy to another core or chip")(self)
    _copy(req)

  def dma_wait(self, req, which: str = "recv") -> None:
    pass

  def sem_signal(self, buf, index, inc: int, device_id=None, core_index=None) -> None:
    if device_id is not None or core_index is not None:
      _never("signalled another core or chip")(self)

  def sem_wait(self, buf, index, value: int, decrement: bool = True) -> None:
    pass

  sem_read = _never("read a semaphore")
  carry_semaphores = _never("carried a semaphore between launches")
  resolve_device_id = _never("resolved a device id")


class ReplayMachine:
  """The machine of a replayed launch (module docstring): one ReplayCore; its report is `report`'s."""

  def __init__(self, tpu, kernel_name: str, report):
    self.tpu, self.chip, self.kernel_name = tpu, tpu.chip, kernel_name
    self.report = report
    self.num_chips = 1
    self.timing_only = False
    self.cores = []
    self.grid_steps = 0
    self.fixed_site = None
    self.axes = []
    self.kept = False

  def adopt(self, core: ReplayCore) -> None:
    """Run on a core kept from an earlier replayed launch of the same plan and key (launch/run.py)."""
    if self.cores:
      _never("made a second core")(self)
    core.machine = self
    self.cores.append(core)

  def keep_cores(self) -> None:
    """The launch layer keeps this launch's core for the next one: `release` leaves it intact."""
    self.kept = True

  def add_core(self, chip_index: int, core_id: int, axis_env: dict, params) -> ReplayCore:
    if self.cores:
      _never("made a second core")(self)
    core = ReplayCore(self, chip_index, core_id, axis_env, params)
    self.cores.append(core)
    return core

  def add_sparse_subcore(self, *args, **kwargs):
    _never("made a SparseCore subcore")(self)

  def chip_axis_env(self, chip_index: int) -> dict:
    return {}

  def register_hbm(self, chip_index: int, bufs) -> None:
    pass

  def site(self) -> tuple:
    return self.fixed_site or user_site()

  def run(self, programs) -> None:
    if len(programs) != 1:
      _never("ran several cores")(self)
    core, fn = programs[0]
    with executor_mod.running_on(core):
      fn()

  def finish(self):
    return self.report.replica()

  def release(self) -> None:
    if not self.kept:
      for c in self.cores:
        c.__dict__.clear()
    self.__dict__.clear()
