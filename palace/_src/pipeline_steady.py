"""Steady state of a pipeline's grid (L5): a timing-only grid whose steps provably repeat is timed
for one period and advanced over the rest (the report is the one stepping every point gives).

The rule. At a step boundary s the pipeline takes the signature of the machine (its core's clocks,
semaphores, DMAs in flight and bandwidth calendars relative to the core's clock: sim/steady.py) and
of its own state (per operand: the next and current slot, which later steps' blocks are in flight in
which slot, which slots have a write-back pending). When it equals the signature at an earlier
boundary j, the P = s - j steps between took the machine from one state to the same state D cycles
later. The steps from s on repeat them if each step t does what step t - P did:
  * the pipeline's copies: at step t they depend on whether each operand's block changes at steps t
    .. t + (buffer count) (fetch, prefetch, write-back) and on t being the last step; so the changes
    at steps [s, T + lookahead] must equal those P steps earlier (from the index maps, computed for
    the whole grid beforehand), and T stays clear of the last step;
  * the body: in timing-only mode vector data are not computed, so a body's work can depend only on
    the grid indices it reads (pl.program_id), scalar memory (SMEM, 0-d loads), semaphore reads,
    random bits of a generator seeded in an earlier step and what it prints. While the detector
    runs, the core records each step's reads (`grid_reads`); a step that read anything but grid
    indices, printed or ran a nested pipeline is never used as a template. Step t then behaves as
    its template t - kP in [j, s) when its grid indices agree on every axis the template read (the
    body is a function of what it reads, so equal answers to the same reads take the same path);
  * exact arithmetic: the float times of the calendars repeat bit for bit shifted while they stay in
    one binade (sim/steady.py); the jump stops before a time would leave it;
  * the DMA streams, where the chip times them (dma_sequential_no_overhead: a copy continuing where its
    array's previous copy ended pays no per-copy overhead): where a stream ended never repeats, so the
    machine leaves the streams of the pipelined operands out of its signature and the codes carry, per
    operand and step, whether its copy continues its previous one (`_stream_codes`, from the index
    maps); after a jump each stream ends where its operand's last copy at the new step ends. A copy from
    anyone else on such a stream refuses the jump (sim/dma.DmaEngine.signature).
Then m whole periods are skipped at once: the machine's clocks move on by mD and its counters (units'
busy cycles, flops, steps, DMA counts and bytes, sequence numbers) by m times their per-period
growth (sim/steady.SteadyState.advance); the pipeline's state moves to step T = s + mP (the copies in
flight become those of step T's blocks, the written-back output blocks are added). The remaining
steps run as usual. Trace events: those of the skipped periods are the period's shifted by whole
periods, each pipeline copy named by the block of its new step; `finish` puts them where stepping
would have recorded them, only as many as the trace keeps (its newest `Trace.cap`). When the period
holds an event that cannot be moved (a copy the body issued), the jump instead stops early enough
that the stepped tail records every kept event. Python side effects of the body (a counter in a
closure) are not modelled: a skipped step does not call the body.
"""
from __future__ import annotations

import functools
import math
import operator

import numpy as np

MIN_STEPS = 64          # grids shorter than this are stepped (nothing to gain)
KEEP_SIGNATURES = 1024  # signatures kept per binade before the check interval doubles
RECENT = 4              # earlier steps with the same signature tried as the start of a period
FAILED_BOUNDARIES = 64  # boundaries in a row whose repeated signature proved no jump before the
                        # check interval doubles (a body that reads the grid indices it branches on,
                        # `pl.when(program_id(0) == 0)`, repeats the machine's state every step but
                        # never provably the body: without a budget every step pays the proof)


def _is_wait(ev) -> bool:
  """A trace event of a wait (recorded only when the wait waits)."""
  return ev[1] == "scalar" and (ev[2].startswith("wait ") or ev[2] == "dma wait sync")


class Detector:
  """The steady-state detector of one pipeline run (`Pipeline`'s `_steps`)."""

  def __init__(self, pipe, steps, helper, alias_view):
    self.pipe, self.steps, self.helper, self.alias_view = pipe, steps, helper, alias_view
    self.n = pipe.n
    self.buffered = steps.buffered_in + steps.buffered_out
    self.alias = [(k, o) for k, o, _, alias, *_ in steps.in_plan + steps.out_plan if alias]
    # how many steps ahead a step's copies look (prefetch and lookahead, the next block of outputs)
    self.ahead = max([o.nbuf for o in self.buffered] + [1])
    self.hist = {}      # signature -> the last steps it was taken at (at most RECENT, newest first)
    self.at = {}        # step -> (signature, snapshot, trace mark), this binade's
    self.full = None    # the points are the whole grid in row-major order (`_row_major`)
    self.pending = []   # per jump: its trace events, recorded by `finish`
    self.reads = {}     # step -> the grid axes its body read (None: something else)
    self.binade = None
    self.interval = 1   # boundaries checked (every interval-th step)
    self.failed = 0     # boundaries in a row whose attempts all failed
    self.stop = self.n - self.ahead - 2   # no jump lands after this step
    self.codes = self.changes = None
    self.cols = {}      # grid axis -> every step's index along it
    # operands whose HBM stream the chip times (dma_sequential_no_overhead): (operand, stream key, the
    # steps of its copies' blocks in issue order, each block's end in the array's tiles) (`_tables`)
    self.streams = []

  @classmethod
  def make(cls, pipe, steps, ex, alias_view):
    """A detector for this pipeline run, or None where steady state cannot be proved: short grids,
    nested pipelines, index maps evaluated per step (scalar prefetch), ragged or partial blocks, a
    machine that does not extrapolate (sim/steady.SteadyState.eligible)."""
    if pipe.n < MIN_STEPS or len(ex.grid_stack) != 1 or ex.grid_reads is not None:
      return None
    if steps.per_step or any(not o.whole_blocks for o in steps.buffered_in + steps.buffered_out):
      return None
    helper = ex.steady_state()
    if helper is None:
      return None
    return cls(pipe, steps, helper, alias_view)

  # ------------------------------------------------------------------ the loop
  def order(self, ex):
    """The step indices of the grid in order (the pipeline runs each), watching the body of each
    while a jump may still come and jumping over whole periods at step boundaries."""
    n = self.n
    s = 0
    try:
      while s < n and s <= self.stop:
        if s and s % self.interval == 0:
          s = self._boundary(s)
          if s > self.stop:
            break
        reads = ex.grid_reads = []
        yield s
        ex.grid_reads = None
        self.reads[s] = reads
        s += 1
    finally:
      ex.grid_reads = None
    yield from range(s, n)

  def _boundary(self, s: int) -> int:
    """At the boundary before step s: remember the signature, or jump when it repeats."""
    if self.codes is None and self.helper.streams_on and not self._tables():
      self.stop = -1   # (the operands' streams are registered before the first signature)
      return s
    sig = self.helper.signature()
    if sig is None:
      return s
    key, now, binade, hi = sig
    if binade != self.binade:   # (a new binade: periods of the last one are not exact here)
      self.binade = binade
      self.hist.clear()
      self.at.clear()
      self.reads = {t: r for t, r in self.reads.items() if t >= s}
    key = (key, self._pipeline_key(s))
    entry = (key, self.helper.snapshot(), self.helper.trace_mark())
    prev = self.hist.get(key)
    self.hist[key] = [s] if prev is None else [s] + prev[:RECENT - 1]
    self.at[s] = entry
    if prev is None:
      if len(self.at) > KEEP_SIGNATURES:   # (no period yet: look less often, keep fewer)
        self._coarser()
      return s
    if self.codes is None and not self._tables():
      self.stop = -1   # (an output block revisited later: stepping raises the error where it is)
      return s
    # the last few steps with this signature, newest first; then a period that also repeats the grid
    # indices the body read (a multiple of their cycles in the row-major grid)
    for j in (*prev, self._index_period(s, prev[0])):
      past = self.at.get(j)
      if past is not None and past[0] == key:
        jumped = self._attempt(s, j, past, entry, binade, hi, now)
        if jumped:
          self.failed = 0
          return jumped
    self.failed += 1
    if self.failed >= FAILED_BOUNDARIES:   # (nothing provable here: look less often)
      self._coarser()
    return s

  def _coarser(self) -> None:
    """Check every other boundary of those checked so far (keeping only their signatures)."""
    self.interval *= 2
    self.failed = 0
    self.at = {t: e for t, e in self.at.items() if t % self.interval == 0}
    self.hist = {}
    for t in sorted(self.at):
      key = self.at[t][0]
      self.hist[key] = [t] + self.hist.get(key, [])[:RECENT - 1]

  def _index_period(self, s: int, j: int):
    """The step before s at the least common multiple of s - j and the cycles of the grid axes the
    steps [j, s) read (None when the grid is not every point in row-major order)."""
    if not self._row_major():
      return None
    grid = self.pipe.grid
    period = s - j
    for t in range(j, s):
      for d in self.reads.get(t) or ():
        if d is not None:
          period = math.lcm(period, math.prod(grid[d:]))
    return s - period if period != s - j else None

  def _attempt(self, s, j, past, entry, binade, hi, now) -> int:
    """Jump from step s over whole periods of the steps [j, s), as far as they provably repeat;
    returns the step reached (0: no jump)."""
    _, snap_j, mark_j = past
    period, cycles = s - j, now - snap_j.now
    templates = [self.reads.get(t) for t in range(j, s)]
    if cycles <= 0 or any(r is None or None in r for r in templates):
      return 0
    most = (self.n - self.ahead - 2 - s) // period
    room = self.helper.headroom(binade, hi)
    exact = int(room // cycles) if room > 0 else 0
    verified = self._verified(s, j, period, most, templates)
    if min(verified, exact) < 1:   # (no period provably repeats: the trace's events are not needed)
      return 0
    tail, events = 0, None
    if self.helper.trace_on():
      # the trace's events of the steps advanced over: shifted copies of the period's (recorded at
      # the end of the run, `finish`), or else the stepped tail must record every event it keeps
      template = self.helper.trace_events(mark_j)
      events = None if template is None else self._template_events(template, j, s)
      if events is None:
        lower = 0 if template is None else sum(not _is_wait(ev) for ev in template)
        if not lower:
          return 0
        tail = math.ceil((self.helper.trace_cap() + 1) / lower)
    periods = min(verified - tail, exact)
    if tail and verified == most and verified - tail <= exact:
      self.stop = -1   # (this jump reaches the tail: the rest is stepped)
    if periods < 1:
      return 0
    remap = self._advance(s, periods * period)
    self.helper.advance(periods, snap_j, entry[1], remap, self._stream_ends(s + periods * period))
    if events is not None:
      self.pending.append((self.helper.trace_mark(), events, j, period, cycles, periods))
    self.hist.clear()
    self.at.clear()
    self.reads.clear()
    return s + periods * period

  def finish(self) -> None:
    """After the steps: the trace's events of the steps advanced over, where stepping them would
    have recorded them (newest jump first, each filling only what later events leave of the trace:
    once it is full, older ones would be dropped)."""
    for mark, events, j, period, cycles, periods in reversed(self.pending):
      if not self.helper.trace_splice(mark, functools.partial(self._shifted, events, j, period, cycles,
                                                              periods)):
        break
    self.pending = []

  @staticmethod
  def _shifted(events, j, period, cycles, periods, count) -> list:
    """The last `count` events of `periods` repetitions of a period's `events` (`_template_events`),
    each repetition later by `cycles` and `period` steps: a copy names the block of its step."""
    out = []
    reps = min(periods, -(-count // len(events)))
    for q in range(periods - reps + 1, periods + 1):
      dt, ds = q * cycles, q * period
      for ev, copy in events:
        args = ev[5]
        if copy is not None:   # (named by its labels: pipeline._BlockLabels, executor.flat_label)
          labels, blocks, rel = copy
          args = (labels.at(blocks[j + rel + ds]), args[1])
        out.append((ev[0], ev[1], ev[2], ev[3] + dt, ev[4] + dt, args))
    return out[-count:]

  def _template_events(self, template, j: int, s: int):
    """The trace events of steps [j, s), each with None or, for a pipeline block copy, (its labels,
    its operand's blocks, the step of its block - j); None when one cannot be moved to other steps
    (a copy the body issued, other arguments). The pipeline copies each block once per change, in
    step order: an input's copies of [j, s) fetch the changed blocks after those in flight at step j
    (as many steps ahead of j as the ones in flight now are of s), an output's write back the blocks
    of the steps before a change."""
    slots = {id(ref): (o, z) for o in self.buffered for z, ref in enumerate(o.slots)}
    due = {}
    for o in self.buffered:
      chg = self.changes[id(o)]
      if o.is_out:
        due[id(o), True] = iter((np.flatnonzero(chg[j + 1:s + 1]) + j).tolist())
      else:
        ahead = max(o.fetched, default=s - 1) - s   # (blocks in flight, as many steps ahead at j)
        due[id(o), False] = iter((np.flatnonzero(chg[j + ahead + 1:s + ahead + 1]) + j + ahead + 1)
                                 .tolist())
    out = []
    for ev in template:
      args = ev[5]
      if args is None:
        out.append((ev, None))
        continue
      labels = getattr(args[0], "labels", None) if type(args) is tuple else None
      hit = slots.get(id(labels[3])) if type(labels) is not tuple and isinstance(labels, tuple) \
          and len(labels) == 5 else None
      if hit is None:
        return None
      o, slot = hit
      to_hbm = labels[4]
      t = next(due[id(o), to_hbm], None)
      if t is None or o.all_blocks[t] != labels[1]:
        return None
      out.append((ev, (labels, o.all_blocks, t - j)))
    return out

  def _row_major(self) -> bool:
    """The pipeline visits every grid point once, in row-major order."""
    if self.full is None:
      pipe = self.pipe
      pts = pipe.points
      self.full = pipe.full_grid or (
          len(pts) == math.prod(pipe.grid) and all(map(operator.lt, pts, pts[1:]))
          and all(0 <= x < g for x, g in zip(pts[-1], pipe.grid)) and not any(pts[0]))
    return self.full

  def _pipeline_key(self, s: int) -> tuple:
    return tuple((o.next_slot, o.cur_slot, tuple(sorted((t - s, f[0]) for t, f in o.fetched.items())),
                  tuple(sorted(o.pending_wb))) for o in self.buffered)

  # ------------------------------------------------------------------ proofs
  def _tables(self) -> bool:
    """Per step, which operands' blocks change (a bit per operand); False when an output block is
    visited again after another (the pipeline raises there: that grid is stepped)."""
    n = self.n
    ops = self.buffered + [o for _, o in self.alias]
    codes = np.zeros(n + 1, np.int64)
    self.changes = {}
    for b, o in enumerate(ops):
      blocks = o.all_blocks
      chg = np.ones(n + 1, bool)   # (a change after the last step: its write-back)
      chg[1:n] = np.fromiter(map(operator.ne, blocks[1:], blocks[:-1]), bool, n - 1)
      if o.is_out and b < len(self.buffered) and len(set(blocks)) != int(chg[:n].sum()):
        return False
      self.changes[id(o)] = chg
      codes |= chg.astype(np.int64) << b
    if self.helper.streams_on and not self._stream_codes(codes):
      return False
    self.codes = codes
    return True

  def _stream_codes(self, codes) -> bool:
    """Under dma_sequential_no_overhead a copy's time depends on whether its block continues, in the
    array's tiles, the operand's previous copy (sim/dma.stream_overhead): a bit per operand and step,
    added to `codes` (each input's block at the step it is for, each output's where its write-back is
    due), so a period repeats only with its copies' continuity. The operands' streams are registered
    with the machine, which leaves them out of its signature (`advance` sets their ends). False when
    two operands share a stream."""
    n, helper = self.n, self.helper
    owned = {}
    for b, o in enumerate(self.buffered):
      buf = o.hbm.buf
      key = helper.stream_key(buf, not o.is_out)
      if key in owned:
        return False
      ranges = helper.block_tile_ranges(buf, o.slots[0].shape, np.asarray(o.all_blocks, np.int64))
      if ranges is None:
        continue   # (never one range: every copy pays, whatever came before; the machine's signature)
      first, end = ranges
      chg = self.changes[id(o)]
      steps = np.flatnonzero(chg[1:n + 1] if o.is_out else chg[:n])
      cont = np.zeros(n + 1, np.int64)
      cont[steps[1:] + o.is_out] = first[steps[1:]] == end[steps[:-1]]
      codes |= cont << (32 + b)
      owned[key] = o.owner
      self.streams.append((o, key, steps, end))
    helper.own_streams(owned)
    return True

  @staticmethod
  def _read_axes(templates) -> dict:
    """grid axis -> which steps of the period read it (a bool per step)."""
    axes = {}
    for r, read in enumerate(templates):
      for d in read:
        which = axes.get(d)
        if which is None:
          which = axes[d] = np.zeros(len(templates), bool)
        which[r] = True
    return axes

  def _axis(self, d: int):
    """Every step's grid index along axis d (a NumPy column, made once)."""
    col = self.cols.get(d)
    if col is None:
      pipe = self.pipe
      if self._row_major():
        col = np.unravel_index(np.arange(self.n), pipe.grid)[d]
      else:
        col = np.fromiter((p[d] for p in pipe.points), np.int64, self.n)
      col = self.cols[d] = col
    return col

  def _verified(self, s: int, j: int, period: int, most: int, templates) -> int:
    """How many whole periods from step s (at most `most`) provably repeat the steps [j, s): checked
    over 1, 2, 4, ... periods, so a mismatch costs about as much as the steps before it."""
    done = 0
    while done < most:
      upto = min(most, max(1, 2 * done))
      ok = self._check(s, j, period, done, upto, templates)
      if ok < upto:
        return ok
      done = upto
    return done

  def _check(self, s, j, period, q0, q1, templates) -> int:
    """The first period in [q0, q1) that does not provably repeat (q1 if all do)."""
    codes, ahead = self.codes, self.ahead
    lo, hi = s + q0 * period, min(s + q1 * period + ahead, self.n)
    bad = np.flatnonzero(codes[lo:hi] != codes[lo - period:hi - period])
    q = q1
    if len(bad):
      q = min(q, (lo + int(bad[0]) - ahead - s) // period)
    # per grid axis read: the indices of the steps [s + q0 P, s + q1 P) as rows of one period, equal
    # to the template's wherever the template step read that axis
    lo = s + q0 * period
    count = (min(s + q1 * period, self.n) - lo) // period
    for d, which in self._read_axes(templates).items():
      col = self._axis(d)
      rows = col[lo:lo + count * period].reshape(count, period)
      bad = ((rows != col[j:s]) & which).any(axis=1)
      if bad.any():
        q = min(q, q0 + int(np.argmax(bad)))
    return max(q, q0)

  # ------------------------------------------------------------------ the jump
  def _stream_ends(self, t: int) -> dict:
    """Where each registered stream's last copy ends at the boundary before step t (after `_advance`):
    an input's last copy is its latest fetch in flight or else the block of its latest change by step
    t - 1; an output's the write-back of its latest block finished by step t - 1."""
    ends = {}
    for o, key, steps, end in self.streams:
      if not o.is_out and o.fetched:
        last = max(o.fetched)
      else:
        i = int(np.searchsorted(steps, t - 1, "right")) - 1
        if i < 0:
          continue
        last = steps[i]
      ends[key] = int(end[last])
    return ends

  def _advance(self, s: int, skip: int) -> dict:
    """The pipeline's state at step s + skip (the machine's: sim/steady.py); returns id(old copy) ->
    new copy for the copies in flight."""
    remap = {}
    new_last = s + skip - 1
    for o in self.buffered:
      blocks = o.all_blocks
      fetched = {}
      for t, (slot, copy) in o.fetched.items():
        new = o.prepare(o, blocks[t + skip], slot, False)
        remap[id(copy)] = new
        fetched[t + skip] = (slot, new)
      o.fetched = fetched
      chg = self.changes[id(o)]
      for slot, copy in list(o.pending_wb.items()):
        offsets = tuple.__getitem__(copy.labels, 1)
        w = next(t for t in range(s - 1, -1, -1) if chg[t + 1] and blocks[t] == offsets)
        new = o.pending_wb[slot] = o.prepare(o, blocks[w + skip], slot, True)
        remap[id(copy)] = new
      if o.is_out:
        o.written.update(blocks[t] for t in (np.flatnonzero(chg[s + 1:s + skip + 1]) + s).tolist())
      o.cur = blocks[new_last]
      o.cur_since += skip   # (the same phase of the period: its block became current skip steps later)
    args = self.steps.call_args
    for k, o in self.alias:
      o.cur = o.all_blocks[new_last]
      args[k] = self.alias_view(o, o.cur, self.pipe.points[new_last])
    return remap
