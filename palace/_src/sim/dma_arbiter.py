"""How one core's DMA engine orders its HBM reads and writes (L4b): writes go ahead of reads.

Measured on a TPU v5e (benchmarks/hw families `dma_curve`, `dma_order`, `dma_chunk`, 2026-12-06;
docs/validation.md "Session 20" and "Session 21"): a read and a write started together cost the same
in either order, and that cost is the read's own round trip plus the write's transfer plus a
turnaround, for reads of more than 32 KiB (a 64 KiB read beside a 64 KiB write: 651 ns a round against
461 alone; beside a 256 KiB write: 887). A read of 16-32 KiB beside a write pays almost nothing, and
a small read started after a big write lands before it (a read overtakes a write, never another
read). So the engine keeps separate read and write queues and serves the write queue first, except
for the first `ChipSpec.dma_read_head_bytes` of a read, which are requested at once.

The bandwidth calendars (sim/bandwidth.py) reserve greedily in issue order, so a write issued after a
read is placed behind it there. The arbiter moves the completion times instead, which keeps the
channel totals the calendars account for:
  * a write (VMEM/SMEM -> HBM) that starts while reads of this core larger than the head are still
    transferring delays each of them by its own transfer time, plus the turnaround
    (`ChipSpec.dma_write_turnaround_cycles`) the first time a read is held; the write itself then
    runs from its start, ahead of them;
  * a read larger than the head that starts while one of this core's writes is still transferring
    (it queued behind it) pays the turnaround;
  * a read of less than twice the head pays only the share of the write its bytes beyond the head are
    of the head (`_tail_fraction`; held, or queued behind the write: its time alone plus that share
    of what is left of the write);
  * a read within the head that starts while one of this core's writes is still transferring, and
    alone (its bytes at its own rate from its start) would be through before that write's end, lands
    so, ahead of the write the calendars put it behind (session 37: a 16 KiB read started after a
    512 KiB write, waited, then 500 ns of delay, then the write waited: 1.01 us a round on the chip,
    1.56 in the model before: +55% -> -6%).
  * a write larger than the HBM write buffer (`ChipSpec.hbm_write_buffer_bytes`) does not hold a read
    that queued behind an earlier write and has not begun its transfer: that read goes next, and the
    write after it as the calendars have it (`ChipSpec.dma_big_write_waits_queued_read`; session 38's
    `write_queue`: a 512 KiB write started 0-900 ns after a 128 KiB read that waits behind a 512 KiB
    write goes after the read, a 128 KiB one ahead of it).
A delayed read's pending semaphore arrivals move with it (a read already waited for has landed and
is never moved). Copies between HBM and HBM, remote copies and local copies are not arbitrated.
"""
from __future__ import annotations

import math

from palace._src.sim.sync import Arrival

READ, WRITE = "read", "write"


class Arbiter:
  """The read/write order of one core's DMA engine (module docstring). `reads`: this core's HBM
  reads larger than the head whose transfer may still be under way; `write_until`: the end of the
  core's latest HBM write transfer."""
  __slots__ = ("core", "head_bytes", "turnaround", "reads", "write_until", "big_write")

  def __init__(self, core):
    chip = core.chip
    self.core = core
    self.head_bytes = chip.dma_read_head_bytes
    self.turnaround = chip.dma_write_turnaround_cycles
    self.reads = []
    self.write_until = 0
    # (hw.ChipSpec.dma_big_write_waits_queued_read) writes of more bytes than this keep a queued read's
    # place; None: every write goes first
    self.big_write = chip.hbm_write_buffer_bytes if chip.dma_big_write_waits_queued_read else None

  def timed(self, direction: str, start, first, last, rec, plan):
    """(first, last) cycles of the transfer of a copy in `direction` (READ / WRITE) that asked to
    start at `start` and was reserved on the calendars from `first` to `last` (`plan`: its
    dma.CopyPlan, whose channels give a read's time alone)."""
    if direction is WRITE:
      transfer = last - first
      held = False
      big = self.big_write is not None and rec.req.nbytes > self.big_write
      for r in self.reads:
        if big and r.queued and r.start_cycle > start:
          continue   # (a read waiting behind an earlier write goes before a write the buffer cannot take)
        if r.read_done_cycle > start and self._hold(r, transfer):
          held = True
      if held:
        first, last = start, start + transfer
      if last > self.write_until:
        self.write_until = last
      return first, last
    if rec.req.nbytes > self.head_bytes:
      if self.write_until > start:
        if rec.req.nbytes < 2 * self.head_bytes:   # (its time alone, then its share of the write's rest)
          frac = self._tail_fraction(rec)
          alone = start + rec.req.nbytes * plan.cycles_per_byte
          cut = alone + (self.write_until - start) * frac
          if cut < last:
            last = cut
        last += self.turnaround
        rec.queued = True
      self._forget_landed(start)
      self.reads.append(rec)
    elif self.write_until > start:
      # a read within the head is requested at once: it overtakes the write being transferred when it
      # would land before that write's end alone (session 37: dma_order's overtake and write-then-read
      # pairs; a read that would not lands behind it, as the calendars have it)
      alone = start + rec.req.nbytes * plan.cycles_per_byte
      if alone < last and alone <= self.write_until:
        first, last = start, alone
    return first, last

  def _forget_landed(self, t) -> None:
    """Drop the reads whose transfer ended by cycle `t`: no write starting then can hold them."""
    reads = self.reads
    if reads:
      kept = []
      for r in reads:   # (a loop, not a comprehension: no frame per call, once per read issued)
        if r.read_done_cycle > t:
          kept.append(r)
      self.reads = kept

  def signature(self, now, rel) -> tuple:
    """The arbiter's state relative to `now` (sim/steady.py): the reads it may still hold."""
    self._forget_landed(now)
    return rel(self.write_until), tuple((rel(r.read_done_cycle), rel(r.start_cycle), r.req.nbytes, r.held,
                                         r.queued) for r in self.reads)

  def shift(self, now, later) -> None:
    """Advance the state by a steady-state jump (its records are shifted with the machine's)."""
    self._forget_landed(now)
    self.write_until = later(self.write_until)

  def _tail_fraction(self, rec) -> float:
    """The share of a write's transfer a read longer than the head but shorter than twice it waits for
    (its callers take 1 from twice the head up): its bytes beyond the head over the head (measured,
    session 37's reading of `dma_chunk`: reads of 40 / 48 / 56 KiB beside a 64 KiB write pay about a
    quarter / half / three quarters of what a 64 KiB read pays)."""
    return (rec.req.nbytes - self.head_bytes) / self.head_bytes

  def _hold(self, rec, transfer) -> bool:
    """Delay read `rec` behind a write of `transfer` cycles (plus the turnaround the first time):
    its completion and its pending arrivals move; False if it already landed and was waited for."""
    if rec.req.nbytes < 2 * self.head_bytes:
      transfer *= self._tail_fraction(rec)
    shift = math.ceil(transfer) + (0 if rec.held else self.turnaround)
    # (whole cycles: done stays int)
    sems = self.core.machine.sems
    moved = False
    for sem in (rec.req.fast[2] if rec.req.fast is not None else None,
                sems.find(rec.req.src_sem_buf, rec.req.src_sem_index)
                if rec.req.src_sem_buf is not None else None):
      if sem is None:
        continue
      pending = sem.pending
      for i, a in enumerate(pending):
        if a[3] is rec:
          pending[i] = Arrival((a[0] + shift, a[1], a[2], a[3], a[4]))
          moved = True
    if not moved:
      return False
    old = rec.done_cycle
    rec.held = True
    rec.done_cycle += shift
    rec.read_done_cycle += shift
    core = self.core
    if rec.done_cycle > core.horizon:
      core.horizon = rec.done_cycle
    trace = core.trace
    if trace.on:
      trace.add((core.tid, "dma", "read held behind a write", old, rec.done_cycle, None))
    return True
