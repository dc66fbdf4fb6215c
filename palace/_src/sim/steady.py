"""The machine side of steady-state extrapolation of timing-only grids (L4b).

A pipeline over a long grid (pipeline_steady.py) asks its core, at step boundaries, for the
*signature* of the machine's state relative to the core's clock `now`, and when a later boundary has
the same signature and the steps in between are proved to repeat, for `advance`: every clock and
pending time moves on by whole periods and every counter grows by the per-period deltas, as stepping
those periods would have done.

What the signature holds (everything a later step's timing can depend on, relative to `now`):
  * the core: the clocks that only ever enter a `max` (units' free cycles, the latest result, the
    horizon, each live buffer's ready cycle, the HBM read mark) as `max(x - now, 0)`; the last DMA-wait
    sync exactly, unless it is before `now` and every pending arrival (only arrivals are compared
    with it);
  * the semaphores: every element's value and pending arrivals (cycle - now, amount, side, and for a
    DMA its bytes and flags), in their order;
  * the bandwidth calendars: the segment holding `now` (its rate, and whether it starts at `now` or
    within a cycle of it) and every later breakpoint (time - now, rate);
  * the DMA engine's issue state (sim/dma.DmaEngine.signature): its queue's transfer starts ahead, the
    previous start's semaphore and where each stream of copies ended, except the streams a pipeline
    owns (`own_streams`: their continuity is in the pipeline's proof, their ends set by `advance`).

Exactness. Clocks, DMA issue and completion cycles are Python ints: shifting them is exact. The
calendars hold floats (transfer ends, `t + bytes / rate`). Every float the timing computes is either
an absolute time (an int or an earlier absolute time plus a relative quantity) or the difference of
two absolute times; while all of them lie in one binade [2^e, 2^(e+1)) with e <= 51, each is a
multiple of ulp = 2^(e-52) <= 1/2, differences are exact, and round-to-nearest-even of x + D equals
round(x) + D for every integer D (an even multiple of ulp). So a period's arithmetic repeats bit for
bit shifted by D as long as the period it copies started at or after 2^e and nothing reaches 2^(e+1):
the signature is refused (None) when a float it must express exactly lies outside `now`'s binade,
and `headroom` says how far the clocks may move before one would (the caller stops there, steps
across the boundary, and finds the period again in the next binade).
"""
from __future__ import annotations

import bisect
import itertools

from palace._src.sim.dma import block_tile_ranges
from palace._src.sim.sync import Arrival

_EXACT_BINADE = 51   # above 2^51 an ulp exceeds 1/2 and integer shifts stop being exact


class Snapshot:
  """The counters of a core and its machine at a step boundary (`SteadyState.snapshot`)."""
  __slots__ = ("now", "busy", "flops", "steps", "alloc_seq", "dma_count", "grid_steps", "seq", "plans",
               "trace_counts", "trace_bytes", "ici_bytes")


class SteadyState:
  """The steady-state view of one TensorCore running alone on a timing-only machine (made by
  `TensorCore.steady_state`)."""

  def __init__(self, core):
    self.core = core
    self.machine = core.machine
    self.owned = {}   # DMA streams whose continuity the pipeline proves: key -> owner (`own_streams`)

  @staticmethod
  def eligible(core) -> bool:
    m = core.machine
    return (m.timing_only and m.tpu.steady_state and len(m.cores) == 1
            and m.num_chips == 1 and not m.checks.active and not core.checks.active
            and m.dma_policy.name != "random")

  # ------------------------------------------------------------------ DMA streams
  @property
  def streams_on(self) -> bool:
    """The chip's copies continuing a stream pay no per-copy overhead (dma_sequential_no_overhead):
    where each stream ended is state, which a pipeline's proof must cover (`own_streams`)."""
    return self.core.dma.streams is not None

  @staticmethod
  def stream_key(buf, reads_hbm: bool) -> tuple:
    """The key of the stream of copies reading (or writing) HBM buffer `buf`, as sim/dma.stream_overhead
    keys it (there built inline: it runs once per new copy on the DMA start path)."""
    return id(buf), reads_hbm

  @staticmethod
  def block_tile_ranges(buf, block_shape, offsets):
    """sim/dma.block_tile_ranges of the blocks of `block_shape` at `offsets` in `buf`."""
    return block_tile_ranges(buf.shape, buf.dtype.itemsize, block_shape, offsets)

  def own_streams(self, owned: dict) -> None:
    """The streams (key -> the owner its copies carry, DmaRequest.owner) whose continuity the caller
    proves (pipeline_steady.py): left out of the signature, their ends set by `advance`."""
    self.owned = owned

  # ------------------------------------------------------------------ signature
  def signature(self):
    """(key, now, binade, largest float time) of the state at this boundary, or None when it cannot
    be expressed exactly (module docstring)."""
    core, m = self.core, self.machine
    now = core.now
    if type(now) is not int or now < 2 or core.unused_dmas or core.blocked_on is not None:
      return None
    e = now.bit_length() - 1            # 2^e <= now < 2^(e+1)
    if e > _EXACT_BINADE:
      return None
    top = float(1 << (e + 1))
    hi = float(now)

    def rel(x):   # a clock that only enters max(): as far as it is in the future
      return x - now if x > now else 0

    clocks = [core.synced_until, core.compute_done, core.mxu_done, core.horizon, core.store_hold,
              core.last_back_edge,
              *core.unit_free.values(),
              *core.unit_issued.values()]
    clocks += [b.ready_cycle for b in self._buffers()]
    if any(type(x) is not int for x in clocks):   # (integer cycles: shifting them is exact)
      return None
    parts = [self._sync_mark(now), rel(core.store_hold), rel(core.last_back_edge),
             tuple(rel(v) for v in core.unit_free.values()),
             tuple(rel(v) for v in core.unit_issued.values()),
             rel(core.compute_done), rel(core.mxu_done), rel(core.horizon),
             (core.block_vector, core.block_starts, core.dma_only)]
    parts.append(tuple((id(b), rel(b.ready_cycle)) for b in self._buffers()))
    if core.mxu_results or core.xlu_last[0] is not None:   # (the measured rules' state: hw.ChipSpec)
      parts.append((core.xlu_last[0], rel(core.xlu_last[1]),
                    tuple(sorted((t - now, v) for t, v in (core.mxu_results or {}).items()))))
    sems = []
    for key, sem in m.sems.slots.items():
      pending = sem.pending
      if not sem.value and not pending:
        continue
      arr = []
      for a in pending:
        rec = a[3]
        if rec is None:
          arr.append((a[0] - now, a[2], a[4]))
          continue
        # (a record's start and read-done times are never read after its start, except by the DMA
        # arbiter, whose reads are in its own part below)
        arr.append((a[0] - now, a[2], a[4], rec.req.nbytes, rec.moved, rec.applied, rec.src_applied))
      sems.append((key, sem.value, tuple(arr)))
    parts.append(tuple(sems))
    parts.append(len(m.inflight))
    parts.append(core.dma.arbiter.signature(now, rel))
    dma = core.dma.signature(now, rel, self.owned)
    if dma is None:
      return None
    parts.append(dma)
    for ch in self._channels():
      times, used = ch.times, ch.used
      i = bisect.bisect_right(times, now) - 1
      if i < 0:
        head = ("none",)
      else:
        t0 = times[i]
        if t0 >= now - 1:          # near enough to be compared with a later time: exact
          if t0 < (1 << e):
            return None
          head = (t0 - now, used[i])
        else:
          head = ("far", used[i])
      tail = []
      for q in range(i + 1, len(times)):
        t = times[q]
        if t >= top:
          return None
        hi = t if t > hi else hi
        tail.append((t - now, used[q]))
      ru = ch.read_until
      if ru > now:
        if ru >= top:
          return None
        hi = ru if ru > hi else hi
      wb = None   # (HBM's write buffer: its level and time, while it may not have drained by now)
      if ch.wbuf_level > 0.0 and ch.wbuf_time > now - 1:
        if ch.wbuf_time < (1 << e) or ch.wbuf_time >= top:
          return None
        hi = ch.wbuf_time if ch.wbuf_time > hi else hi
        wb = (ch.wbuf_time - now, ch.wbuf_level)
      elif ch.wbuf_level > 0.0:   # (draining since a write that ended: exact only in now's binade)
        if ch.wbuf_time < (1 << e):
          return None
        wb = ("since", now - ch.wbuf_time, ch.wbuf_level)
      parts.append((head, tuple(tail), rel(ru), wb))
    return tuple(parts), now, e, hi

  def _sync_mark(self, now: int):
    """The last DMA-wait sync relative to `now`, or None when it is before `now` and every pending
    arrival: it is compared only with the cycles of arrivals a wait applies, and every later one
    comes at or after `now`, so its value no longer matters."""
    synced = self.core.synced_until
    if synced >= now:
      return synced - now
    low = min((a[0] for sem in self.machine.sems.slots.values() for a in sem.pending), default=now)
    return synced - now if synced >= low else None

  def headroom(self, e: int, hi: float) -> float:
    """How many cycles every time may still move on before one leaves binade `e` (with a cycle of
    margin for the transient `t + eps` comparisons of the calendars)."""
    return float((1 << (e + 1)) - 1) - hi

  def _buffers(self):
    core = self.core
    seen = {}
    for b in itertools.chain(core.named_buffers.values(), self.machine.hbm_peers.values()):
      seen[id(b)] = b
    return seen.values()

  def _channels(self):
    chans = {}
    for group in self.machine._chans.values():
      for ch in group:
        chans[id(ch)] = ch
    return chans.values()

  # ------------------------------------------------------------------ the trace
  def trace_on(self) -> bool:
    return self.core.trace.on

  def trace_cap(self) -> int:
    return self.core.trace.cap

  def trace_mark(self):
    """The newest trace event (for `trace_events` and `trace_splice`)."""
    ring = self.core.trace._ring
    return ring[-1] if ring else None

  def trace_events(self, mark):
    """The events recorded since `mark`, in order, or None when some were dropped."""
    ring = self.core.trace._ring
    after = []
    for ev in reversed(ring):
      if ev is mark:
        break
      after.append(ev)
    else:
      if mark is not None or len(ring) == self.core.trace.cap:
        return None
    after.reverse()
    return after

  def trace_splice(self, mark, produce) -> bool:
    """Put the events of advanced-over steps where stepping them would have recorded them: before
    every event recorded since `mark` (the newest event when they were advanced over). Only the
    newest `cap` events of a launch are kept, so `produce(k)` is asked for the last k of them (none
    when the events since `mark` fill the trace alone). Returns whether the trace still has room
    for older events."""
    after = self.trace_events(mark)
    if after is None:
      return False
    trace = self.core.trace
    need = trace.cap - len(after)
    if need <= 0:
      return False
    ring = trace._ring
    for _ in after:
      ring.pop()
    events = produce(need)
    ring.extend(events)
    ring.extend(after)
    return len(events) < need

  # ------------------------------------------------------------------ counters
  def snapshot(self) -> Snapshot:
    core, m = self.core, self.machine
    s = Snapshot()
    s.now = core.now
    s.busy = dict(core.unit_busy)
    s.flops, s.steps, s.alloc_seq = core.flops, core.steps, core.alloc_seq
    s.dma_count, s.grid_steps, s.ici_bytes = m.dma_count, m.grid_steps, m.ici_bytes
    s.seq = next(m.sequence)
    m.sequence = itertools.count(s.seq)
    s.plans = {id(p): (p, p.copies, p.bytes) for _, p, _ in core.dma.prepared.values()}
    s.trace_counts = dict(core.trace.stats["dma_count"])
    s.trace_bytes = dict(core.trace.stats["dma_bytes"])
    return s

  # ------------------------------------------------------------------ the jump
  def advance(self, periods: int, a: Snapshot, b: Snapshot, remap: dict, stream_ends=None) -> None:
    """Move the machine on by `periods` repetitions of the period from snapshot `a` to snapshot `b`
    (taken at the current boundary, whose signature equals `a`'s): clocks and pending times by
    `periods * (b.now - a.now)` cycles, sequence numbers and counters by `periods` times their
    growth. `remap`: id(request) -> the request that takes its place (the pipeline's copies of the
    blocks of the new steps), for the DMA records still in flight."""
    core, m = self.core, self.machine
    k = periods
    shift = k * (b.now - a.now)
    dseq = k * (b.seq - a.seq)
    now = core.now

    def later(x):
      return x + shift if x > now else x

    if self._sync_mark(now) is not None:
      core.synced_until += shift
    core.now = now + shift
    core.dma.arbiter.shift(now, later)
    core.dma.shift(later, stream_ends or {})
    for uf in (core.unit_free, core.unit_issued):
      for u in uf:
        uf[u] = later(uf[u])
    core.compute_done = later(core.compute_done)
    core.store_hold = later(core.store_hold)
    core.last_back_edge = later(core.last_back_edge)
    if core.xlu_last[0] is not None:
      core.xlu_last = (core.xlu_last[0], later(core.xlu_last[1]))
    if core.mxu_results:
      items = list(core.mxu_results.items())
      core.mxu_results.clear()
      core.mxu_results.update((t + shift, v) for t, v in items)
    core.mxu_done = later(core.mxu_done)
    core.horizon = later(core.horizon)
    for buf in self._buffers():
      buf.ready_cycle = later(buf.ready_cycle)
    for u, v in b.busy.items():
      core.unit_busy[u] += k * (v - a.busy.get(u, 0))
    core.flops += k * (b.flops - a.flops)
    core.steps += k * (b.steps - a.steps)
    core.alloc_seq += k * (b.alloc_seq - a.alloc_seq)
    m.dma_count += k * (b.dma_count - a.dma_count)
    m.grid_steps += k * (b.grid_steps - a.grid_steps)
    m.ici_bytes += k * (b.ici_bytes - a.ici_bytes)
    for pid, (p, copies, nbytes) in b.plans.items():
      _, c0, b0 = a.plans.get(pid, (p, 0, 0))
      p.copies += k * (copies - c0)
      p.bytes += k * (nbytes - b0)
    stats = core.trace.stats
    for name, snap_a, snap_b in (("dma_count", a.trace_counts, b.trace_counts),
                                 ("dma_bytes", a.trace_bytes, b.trace_bytes)):
      for kind, v in snap_b.items():
        stats[name][kind] += k * (v - snap_a.get(kind, 0))
    m.sequence = itertools.count(next(m.sequence) + dseq)
    records = {}
    for sem in m.sems.slots.values():
      if sem.pending:
        sem.pending = [Arrival((x[0] + shift, x[1] + dseq, x[2], x[3], x[4])) for x in sem.pending]
        for x in sem.pending:
          if x[3] is not None:
            records[id(x[3])] = x[3]
    inflight = {}
    for rec in m.inflight.values():
      records[id(rec)] = rec
    for rec in records.values():
      rec.seq += dseq
      rec.issue_cycle += shift
      rec.start_cycle += shift
      rec.done_cycle += shift
      rec.read_done_cycle += shift
      rec.req = remap.get(id(rec.req), rec.req)
    for rec in m.inflight.values():
      inflight[rec.seq] = rec
    m.inflight = inflight
    for ch in self._channels():
      times = ch.times
      i = bisect.bisect_right(times, now) - 1
      if i >= 0 and times[i] >= now - 1:
        times[i] += shift
      for q in range(i + 1, len(times)):
        times[q] += shift
      if ch.read_until > now:
        ch.read_until += shift
      if ch.wbuf_level > 0.0:
        ch.wbuf_time += shift
    m.tpu.extrapolated_steps += k * (b.steps - a.steps)
