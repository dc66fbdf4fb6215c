"""Kernel-bug checks of the virtual TPU (L4b): what a core and the machine call on every access.

All of it is opt-in and off the default path: a machine builds a `KernelChecks` only for
`VirtualTPU(detect_races=True)` (sim/races.py), `VirtualTPU(uninitialized="raise")` (sim/uninit.py) or a
core running with `CompilerParams(disable_bounds_checks=True)` (sim/unchecked.py); otherwise its cores
hold `NO_CHECKS`, whose hooks do nothing (`active` False: the core may then borrow, adopt and defer
storage, which the checkers would have to follow).
"""
from __future__ import annotations

import numpy as np

from palace._src.sim.races import RaceDetector
from palace._src.sim.unchecked import clip, clip_dma, garbage_buffer
from palace._src.sim.uninit import InitTracker


def make_checks(machine):
  """The machine-wide checks of a launch, or NO_CHECKS (the default: nothing to do)."""
  tpu = machine.tpu
  races = bool(getattr(tpu, "detect_races", False))
  uninit = getattr(tpu, "uninitialized", "nan") == "raise" and not machine.timing_only  # needs data
  if not (races or uninit):
    return NO_CHECKS
  return KernelChecks(RaceDetector(machine) if races else None,
                      InitTracker(machine) if uninit else None, False)


class KernelChecks:
  """What a core calls on its loads, stores, DMAs and frees; `unchecked` clips out-of-bounds accesses."""

  active = True

  def __init__(self, races, init, unchecked: bool):
    self.races, self.init, self.unchecked = races, init, unchecked

  def with_unchecked(self) -> "KernelChecks":
    return KernelChecks(self.races, self.init, True)

  # ---- core accesses
  def load(self, core, buf, index, shape):
    """None, or a (buffer, index) to load from instead (clipped out-of-bounds loads)."""
    alt = None
    if self.unchecked:
      clipped = clip(buf.shape, index)
      if clipped is not None:
        alt = (garbage_buffer(buf, shape, clipped), ())
        index = clipped[0]
        if index is None:
          return alt
    if self.races is not None:
      self.races.access(core, buf, index, "r", shape)
    if self.init is not None:
      self.init.check_read(core, buf, index)
    return alt

  def store(self, core, buf, index, shape, data):
    """None, or an (index, data) to store instead (clipped out-of-bounds stores; data None: nothing)."""
    alt = None
    if self.unchecked:
      clipped = clip(buf.shape, index)
      if clipped is not None:
        index, dst = clipped
        if index is None:
          return (), None
        if data is not None:
          data = np.broadcast_to(data, shape)[tuple(dst)]
        alt = (index, data)
    if self.races is not None:
      self.races.access(core, buf, index, "w", shape)
    if self.init is not None:
      self.init.mark(buf, index)
    return alt

  def dma_start(self, core, rec):
    """Clip (unchecked), then record the DMA's accesses; returns the request that moves the data."""
    if self.unchecked:
      rec.req = clip_dma(rec.req)
    if self.races is not None:
      self.races.dma_start(core, rec)
    if self.init is not None:
      self.init._view(rec.req.dst_buf)  # start tracking the destination before any data lands in it
    return rec.req

  def moved(self, req, held=None) -> None:
    """A copy's data was moved (memory.copy, never borrowing: the checkers track storage identity);
    `held`: `held(req)` of a copy that lands later, taken at its start."""
    if self.init is not None:
      self.init.moved(req, held)

  def held(self, req):
    """What `moved` needs of the source of a copy that lands later (sim/dma.py `land`), as it is now."""
    return None if self.init is None else self.init.source(req)

  def free(self, core, buf) -> None:
    if core.machine.shared_buffers.get((core.share_group, buf.key)) is buf:
      return  # shared scratch lives until every core that uses it is done
    if self.races is not None:
      self.races.shadows.pop(id(buf), None)
    if self.init is not None:
      self.init.free(buf)

  # ---- machine hooks
  def arrival(self, seq, rec, src) -> None:
    if self.races is not None:
      self.races.arrival(seq, rec, src)

  def acquire(self, slot, applied) -> None:
    if self.races is not None:
      self.races.acquire(slot, applied)

  def peek(self, slot, now) -> None:
    if self.races is not None:
      self.races.acquire(slot, [a for a in slot.pending if a.cycle <= now], consume=False)

  def finish(self) -> None:
    if self.init is not None:
      self.init.finish()


class NoChecks:
  """The checks of a launch that runs none: every hook does nothing. The per-access hooks (load,
  store, dma_start, arrival, acquire) are called only when `active` is True, so they are not here."""
  __slots__ = ()
  active = False
  races = init = None
  unchecked = False

  def with_unchecked(self) -> KernelChecks:
    return KernelChecks(None, None, True)

  def free(self, core, buf) -> None:
    pass

  def peek(self, slot, now) -> None:
    pass

  def finish(self) -> None:
    pass


NO_CHECKS = NoChecks()
