"""The virtual TPU: chips x cores, DMA channels, semaphores, the core scheduler (L4b).

`VirtualTPU` is the user-visible configuration (chip, chip count, policies) and collects one Report per
launch. Each launch builds a fresh `Machine`; nothing survives between launches except HBM contents
that the caller owns (inputs, outputs, mutable refs).

Cores run as cooperating threads of which exactly one runs at a time. A core runs until it blocks on a
semaphore that no pending arrival can satisfy; the scheduler then resumes the runnable core with the
earliest local clock (ties: lowest chip, then core). When every unfinished core is blocked, the launch
fails with a deadlock error naming each core, what it waits for and where.
"""
from __future__ import annotations

import contextvars
import random
import threading

from palace._src import executor as executor_mod
from palace._src import hw
from palace._src.errors import SyncError, UnsupportedError, UsageError
from palace._src.sim.dma import Channel, move_data
from palace._src.sim.report import Report
from palace._src.sim.tensorcore import SemSlot, TensorCore
from palace._src.sim.trace import Trace
from palace._src.util import fmt_bytes, fmt_site

DMA_POLICIES = ("eager", "on_wait", "random")


class DmaPolicy:
  """When a DMA's data moves: at start (eager), when its semaphore is waited (on_wait), or a seeded
  coin flip per DMA (random). Race-free kernels give bit-identical results under all three."""

  def __init__(self, name: str, seed: int):
    if name not in DMA_POLICIES:
      raise UsageError(f"dma_policy={name!r}: expected one of {DMA_POLICIES}.")
    self.name = name
    self.rng = random.Random(seed)

  def move_at_start(self, rec) -> bool:
    if self.name == "eager":
      return True
    if self.name == "on_wait":
      return False
    return self.rng.random() < 0.5


class _Abort(BaseException):
  """Unwinds the threads of a failed launch."""


class Machine:
  def __init__(self, tpu: "VirtualTPU", kernel_name: str, timing_only: bool):
    self.tpu = tpu
    self.chip = tpu.chip
    self.num_chips = tpu.num_chips
    self.kernel_name = kernel_name
    self.timing_only = timing_only
    self.dma_policy = DmaPolicy(tpu.dma_policy, tpu.seed + len(tpu.reports))
    self.trace = Trace(on=tpu.trace)
    self.slots = {}
    self.inflight = {}
    self._seq = 0
    self.cores = []
    self._chans = {}
    self._hbm = {}
    self.hbm_bytes = 0
    self.ici_bytes = 0
    self.grid_steps = 0
    self.dma_count = 0
    # scheduler state
    self._lock = threading.Condition()
    self._running = None
    self._state = {}
    self._error = None

  # ------------------------------------------------------------------ construction
  def add_core(self, chip_index: int, core_id: int, axis_env: dict, params) -> TensorCore:
    core = TensorCore(self, chip_index, core_id, axis_env, params)
    self.cores.append(core)
    return core

  def channels(self, chip_index: int, core_id: int):
    key = (chip_index, core_id)
    ch = self._chans.get(key)
    if ch is None:
      hbm = self._hbm.get(chip_index)
      if hbm is None:
        hbm = self._hbm[chip_index] = Channel("hbm", self.chip.hbm_bytes_per_s_per_device,
                                              self.chip.clock_hz)
      ch = self._chans[key] = (
          Channel("tc-dma", self.chip.dma_bytes_per_s_per_tc, self.chip.clock_hz), hbm,
          Channel("local", self.chip.vmem_vmem_dma_bytes_per_s, self.chip.clock_hz))
    return ch

  def next_seq(self) -> int:
    self._seq += 1
    return self._seq

  def debug_print(self, text: str) -> None:
    self.tpu.debug_output.append(text)
    print(text)

  # ------------------------------------------------------------------ semaphores
  def slot(self, buf, index) -> SemSlot:
    key = (id(buf), index)
    s = self.slots.get(key)
    if s is None:
      s = self.slots[key] = SemSlot()
    return s

  def add_arrival(self, buf, index, cycle, amount, rec, src=False) -> None:
    if rec is not None:
      self.dma_count += 0 if src else 1
      if not src:
        from_hbm = rec.req.src_buf.memory_space.value in ("any", "hbm")
        to_hbm = rec.req.dst_buf.memory_space.value in ("any", "hbm")
        self.hbm_bytes += rec.req.nbytes * (int(from_hbm) + int(to_hbm))
    if buf is None:
      return
    self.slot(buf, index).pending.append((cycle, self.next_seq(), amount, rec, src))

  def settle(self, slot: SemSlot, value: int):
    """Cycle at which `slot` reaches `value`, applying just enough pending arrivals; None if it can't."""
    if slot.value >= value:
      return 0
    if not slot.pending:
      return None
    slot.pending.sort(key=lambda p: (p[0], p[1]))
    total = slot.value
    for j, p in enumerate(slot.pending):
      total += p[2]
      if total >= value:
        applied = slot.pending[:j + 1]
        del slot.pending[:j + 1]
        t = 0
        for cycle, _, amount, rec, src in applied:
          slot.value += amount
          t = cycle if cycle > t else t
          if rec is not None:
            self._apply(rec, src)
        return t
    return None

  def _apply(self, rec, src: bool) -> None:
    if src:
      rec.src_applied = True
    else:
      if not rec.moved:
        move_data(rec.req)
        rec.moved = True
      rec.applied = True
    if rec.applied and rec.src_applied:
      self.inflight.pop(rec.seq, None)

  def resolve_sem(self, buf, index, core, device_id=None, core_index=None):
    chip = core.chip_index if device_id is None else device_id
    cid = core.core_id if core_index is None else core_index
    if chip == core.chip_index and cid == core.core_id:
      return buf, index
    return self.lookup_buffer(buf, chip, cid), index

  def lookup_buffer(self, buf, chip_index: int, core_id: int):
    for c in self.cores:
      if c.chip_index == chip_index and c.core_id == core_id:
        found = c.named_buffers.get(buf.name) if hasattr(c, "named_buffers") else None
        if found is not None:
          return found
    raise UnsupportedError.feature("signalling another core or chip",
                                   "Multi-core and multi-chip signalling arrive with those issues.")

  # ------------------------------------------------------------------ ICI (multi-chip issue)
  def ici_transfer(self, src_chip, dst_chip, start, nbytes):
    raise UnsupportedError.feature("remote DMA between chips")

  def ici_signal_cycle(self, src_chip, dst_chip, now):
    raise UnsupportedError.feature("remote semaphore signals between chips")

  # ------------------------------------------------------------------ running cores
  def run(self, programs) -> None:
    """programs: list of (core, fn); runs each fn with its core as the current executor."""
    if len(programs) == 1:
      core, fn = programs[0]
      token = executor_mod.set_current(core)
      try:
        fn()
      finally:
        executor_mod.reset_current(token)
      return
    self._run_threads(programs)

  def block(self, core) -> None:
    """Called by a core whose wait cannot be satisfied yet."""
    if len(self.cores) == 1 or threading.current_thread() is threading.main_thread():
      raise self.deadlock_error([core])
    with self._lock:
      self._state[core] = "blocked"
      self._running = None
      self._lock.notify_all()
      while self._running is not core:
        self._lock.wait()
      if self._error is not None:
        raise _Abort()

  def _run_threads(self, programs) -> None:
    threads = []
    for core, fn in programs:
      self._state[core] = "ready"

      def target(core=core, fn=fn):
        with self._lock:
          while self._running is not core:
            self._lock.wait()
        executor_mod.set_current(core)
        try:
          if self._error is None:
            fn()
        except _Abort:
          pass
        except BaseException as e:  # noqa: BLE001  handed to the main thread
          with self._lock:
            if self._error is None:
              self._error = e
        with self._lock:
          self._state[core] = "done"
          self._running = None
          self._lock.notify_all()

      t = threading.Thread(target=target, name=f"palace-core-{core.tid}", daemon=True)
      threads.append(t)
      t.start()
    try:
      while True:
        with self._lock:
          while self._running is not None:
            self._lock.wait()
          if self._error is not None:
            break
          nxt = self._pick()
          if nxt is None:
            blocked = [c for c, s in self._state.items() if s == "blocked"]
            if not blocked:
              break
            self._error = self.deadlock_error(blocked)
            break
          self._state[nxt] = "running"
          self._running = nxt
          self._lock.notify_all()
    finally:
      with self._lock:
        for c, s in self._state.items():
          if s != "done":
            self._running = c
            self._lock.notify_all()
            while self._state[c] != "done":
              self._lock.wait()
      for t in threads:
        t.join()
    if self._error is not None:
      raise self._error

  def _pick(self):
    best = None
    for core, s in self._state.items():
      if s == "ready" or (s == "blocked" and self._can_resume(core)):
        if best is None or (core.now, core.tid) < (best.now, best.tid):
          best = core
    return best

  def _can_resume(self, core) -> bool:
    buf, index, value, slot, dma, site = core.blocked_on
    return slot.value + sum(p[2] for p in slot.pending) >= value

  def deadlock_error(self, cores) -> SyncError:
    rows = []
    for c in cores:
      buf, index, value, slot, dma, site = c.blocked_on
      what = f"DMA {dma.describe}" if dma is not None else f"semaphore {buf.name}"
      rows.append(f"chip {c.chip_index} core {c.core_id} waits at {fmt_site(site)} for {what}: "
                  f"needs {value}, has {slot.value}" +
                  (f" ({fmt_bytes(value)} of DMA data)" if dma is not None else "") +
                  ("" if not c.grid_stack else f" at grid point {c.grid_stack[-1][0]}"))
    return SyncError(f"Deadlock in kernel '{self.kernel_name}': no core can make progress.\n  " +
                     "\n  ".join(rows) + "\nEvery wait needs a matching signal or DMA start; check the "
                     "semaphore and byte counts.")

  # ------------------------------------------------------------------ end of launch
  def finish(self) -> Report:
    if self.inflight:
      rec = min(self.inflight.values(), key=lambda r: r.seq)
      raise SyncError(
          f"Kernel '{self.kernel_name}' ended with {len(self.inflight)} DMA(s) in flight: "
          f"{rec.req.describe} started at {fmt_site(rec.req.site)} on chip {rec.core.chip_index} core "
          f"{rec.core.core_id}. Did you forget .wait()?")
    end = 0
    busy = {}
    vmem_peak = 0
    flops = 0
    events = []
    for c in self.cores:
      end = max(end, c.finish())
      for u, v in c.unit_busy.items():
        busy[u] = max(busy.get(u, 0), v)
      vmem_peak = max(vmem_peak, c.vmem_peak)
      flops += c.flops
    events = self.trace.events
    return Report(self.kernel_name, self.chip, self.num_chips, int(round(end)), flops, self.hbm_bytes,
                  busy, vmem_peak, self.grid_steps, self.dma_count, events, self.ici_bytes,
                  self.timing_only)


class VirtualTPU:
  """A virtual TPU system: `with pl.virtual_tpu("v5e") as tpu: ...; tpu.reports[-1]`."""

  def __init__(self, chip="v5e", num_chips: int = 1, *, timing_only: bool = False,
               dma_policy: str = "eager", seed: int = 0, trace: bool = True, topology=None,
               detect_races: bool = False):
    self.chip = hw.get_chip(chip)
    if int(num_chips) < 1:
      raise UsageError(f"num_chips must be >= 1; got {num_chips}.")
    self.num_chips = int(num_chips)
    self.timing_only = bool(timing_only)
    if dma_policy not in DMA_POLICIES:
      raise UsageError(f"dma_policy={dma_policy!r}: expected one of {DMA_POLICIES}.")
    self.dma_policy = dma_policy
    self.seed = int(seed)
    self.trace = bool(trace)
    self.topology = topology
    self.detect_races = detect_races
    self.reports: list[Report] = []
    self.debug_output: list[str] = []
    self._token = None

  def __enter__(self):
    self._token = _active.set(self)
    return self

  def __exit__(self, *exc):
    _active.reset(self._token)
    self._token = None
    return False

  def new_machine(self, kernel_name: str) -> Machine:
    return Machine(self, kernel_name, self.timing_only)

  def __repr__(self):
    return (f"VirtualTPU(chip={self.chip.name!r}, num_chips={self.num_chips}, timing_only="
            f"{self.timing_only}, dma_policy={self.dma_policy!r}, launches={len(self.reports)})")


_active: contextvars.ContextVar = contextvars.ContextVar("palace_virtual_tpu", default=None)


def active_tpu() -> VirtualTPU:
  """The VirtualTPU of the innermost `with pl.virtual_tpu(...)`, or a fresh default one (v5e)."""
  tpu = _active.get()
  return tpu if tpu is not None else VirtualTPU(hw.DEFAULT_CHIP)
