"""DMA engines (L4b): where a copy is issued, timed and (eagerly) moved (`DmaEngine.start`): its data
moves by `memory.copy` (sim/memory.py), called here or, for a copy moved when waited, by the machine's
`dma_arrived`; the bug checks only observe the moved copy (`checks.moved`); its completion arrives on
a semaphore in sim/sync.py.

Landing (the eager policy's copies into another core's or chip's memory). Such a copy keeps its source
data as it was at the start (`memory.snapshot`, copy on write) and lands at its completion (`done`) on
the modelled clock: an access of the destination buffer at cycle t by any core (a load, store or
language-side access of sim/tensorcore.py, a DMA reading or writing it here) first lands the copies
pending there that complete by t (`land_due`), and the receiving wait lands its copy (`land`, from
`Machine.dma_arrived`); copies land in (completion, issue) order. So a receiver's accesses before
the arrival on its own clock (its zeroing of the destination, a read) come first, as on the chip, while
the cores run in palace's host order (sim/sync.py). An access that runs, in host order, before the
sender has issued a copy completing before it does not see that copy: the kernel did not order the two
(`detect_races=True` reports it). Landing moves no modelled time.

Timing model (all in cycles of the chip clock):
  * A copy is issued by the scalar core at `issue` (after `dma_issue_cycles` of scalar work) and cannot
    start reading before its source buffer's last vector store has finished.
  * Each TensorCore has a DMA channel (bandwidth `dma_bytes_per_s_per_tc`); every chip has one HBM
    channel (`hbm_bytes_per_s_per_device`) shared by all its cores. A copy touching HBM runs at the rate
    both still have free (bandwidth calendars, sim/bandwidth.py): one stream behaves FIFO, overlapping
    streams from several cores share. HBM->HBM copies count their bytes twice on the HBM channel.
    Copies between VMEM and SMEM (or VMEM and VMEM) use the core's local channel
    (`vmem_vmem_dma_bytes_per_s`).
  * The completion (semaphore signal) lands one direction-specific latency after the transfer ends,
    rounded up to a whole cycle: HBM->VMEM/SMEM `dma_hbm_to_vmem_latency_ns`, VMEM/SMEM->HBM
    `dma_vmem_to_hbm_latency_ns`, HBM->HBM the larger of the two, local `dma_local_latency_cycles`.
Reservations are greedy in issue order, a simplification of the processor sharing in [xla-cost]: the
aggregate bandwidth and the finishing time of the last transfer are the same; only the order of
completions can differ.
"""
from __future__ import annotations

import collections
import copy
import functools
import math

import numpy as np

from palace._src.core import MemorySpace
from palace._src.sim import memory
from palace._src.sim.bandwidth import reserve
from palace._src.sim.dma_arbiter import READ, WRITE, Arbiter

_SPACE_LABEL = {MemorySpace.ANY: "hbm", MemorySpace.HBM: "hbm", MemorySpace.VMEM: "vmem",
                MemorySpace.VMEM_SHARED: "vmem", MemorySpace.CMEM: "vmem", MemorySpace.SMEM: "smem",
                MemorySpace.SEMAPHORE: "smem", MemorySpace.HOST: "host"}


class DmaRecord:
  """One in-flight copy."""
  __slots__ = ("req", "seq", "issue_cycle", "start_cycle", "done_cycle", "read_done_cycle", "moved",
               "core", "applied", "src_applied", "hbm_sides", "held", "queued", "landing")

  def __init__(self, req, seq, core, issue_cycle=0, start_cycle=0, done_cycle=0, read_done_cycle=0,
               hbm_sides=0):
    self.req, self.seq, self.core = req, seq, core
    self.hbm_sides = hbm_sides
    self.held = False        # delayed behind a write once already (sim/dma_arbiter.py)
    self.queued = False      # a read started while one of its core's writes was transferring (ditto)
    self.moved = False
    self.landing = None      # a copy that lands later (`land_due`): (memory.snapshot, checks.held)
    self.applied = False
    self.src_applied = req.src_sem_buf is None
    self.issue_cycle, self.start_cycle = issue_cycle, start_cycle
    self.done_cycle, self.read_done_cycle = done_cycle, read_done_cycle


def _arrival(rec) -> tuple:
  return rec.done_cycle, rec.seq


def defer(rec, checks) -> None:
  """Copy `rec` lands later (module docstring): its source data as it is now, pending on its destination."""
  req = rec.req
  rec.landing = (memory.snapshot(req), checks.held(req) if checks.active else None)
  buf = req.dst_buf
  if buf.landing is None:
    buf.landing = [rec]
    rec.core.machine.landings[id(buf)] = buf
  else:
    buf.landing.append(rec)


def meet(req, start, now, lands_later: bool) -> None:
  """Before copy `req` reads its source from `start` on (and, unless it `lands_later`, writes its
  destination at its start `now`, as the eager policy moves it): the copies pending there that landed
  by then land first."""
  if req.src_buf.landing is not None:
    land_due(req.src_buf, start)
  if not lands_later and req.dst_buf.landing is not None:
    land_due(req.dst_buf, now)


def land_due(buf, now) -> None:
  """Land every copy pending on `buf` (`buf.landing`, from another core or chip) that completed by cycle
  `now`: what an access of `buf` at `now` (a load, store or DMA on any core) must find there first."""
  due = [rec for rec in buf.landing if rec.done_cycle <= now]
  if due:
    land(max(due, key=_arrival))


def land(rec) -> None:
  """Move the data of `rec`, a copy from another core or chip pending on its destination, and first
  that of every copy pending there that completes before it: copies land in (completion, issue) order."""
  buf = rec.req.dst_buf
  pending = buf.landing
  due = sorted((r for r in pending if _arrival(r) <= _arrival(rec)), key=_arrival)
  rest = [r for r in pending if _arrival(r) > _arrival(rec)]
  buf.landing = rest or None
  if not rest:
    del rec.core.machine.landings[id(buf)]
  for r in due:
    held, init = r.landing
    memory.copy_held(r.req, held)
    r.landing = None
    r.moved = True
    checks = r.core.machine.checks
    if checks.active:
      checks.moved(r.req, init)


_SMEM = MemorySpace.SMEM
_DIRECTIONS: dict = {}
_DIRECTION = {"hbm->vmem": READ, "hbm->smem": READ, "vmem->hbm": WRITE, "smem->hbm": WRITE}


def direction(src_space: MemorySpace, dst_space: MemorySpace) -> str:
  """'hbm->vmem', 'vmem->hbm', 'hbm->hbm', 'vmem->smem', 'smem->vmem', 'vmem->vmem', 'hbm->smem', ..."""
  key = (src_space, dst_space)
  kind = _DIRECTIONS.get(key)
  if kind is None:
    kind = _DIRECTIONS[key] = f"{_SPACE_LABEL.get(src_space, 'vmem')}->{_SPACE_LABEL.get(dst_space, 'vmem')}"
  return kind


def _timing_class(kind: str) -> str:
  src, dst = kind.split("->")
  if "host" in (src, dst):   # across the chip's host link (PCIe), one channel each way
    return "host->" if src == "host" else "->host"
  if src == "hbm":
    return "hbm->hbm" if dst == "hbm" else "read"
  return "write" if dst == "hbm" else "local"


_CLASS = {}           # kind -> timing class (memo of a pure function)
_HBM_SIDES = {"read": 1, "write": 1, "hbm->hbm": 2, "local": 0}


def hbm_sides(kind: str) -> int:
  """How many ends of a copy of this kind touch HBM (for the report's HBM traffic)."""
  cls = _CLASS.get(kind) or _CLASS.setdefault(kind, _timing_class(kind))
  return kind.split("->").count("hbm") if cls in _HOST_CLASSES else _HBM_SIDES[cls]


_HOST_CLASSES = ("host->", "->host")


def _latency_cycles(chip, cls: str) -> int:
  if cls == "local":
    return chip.dma_local_latency_cycles
  if cls in _HOST_CLASSES:
    return chip.ns_to_cycles(chip.host_link_latency_ns)
  lat_ns = {"read": chip.dma_hbm_to_vmem_latency_ns, "write": chip.dma_vmem_to_hbm_latency_ns,
            "hbm->hbm": chip.dma_hbm_to_hbm_latency_ns}[cls]
  return chip.ns_to_cycles(lat_ns)


class CopyPlan:
  """How one core times a copy between two memory spaces (computed once per core and direction):
  its `kind` ('hbm->vmem', ...), the `channels` it crosses as [(channel, bytes per byte)] (the core's
  DMA engine and the chip's HBM, HBM->HBM weighing 2 there; or the core's local channel), the
  completion latency and how many of its ends touch HBM (for the report's HBM traffic). `copies` and
  `bytes` count the copies timed with it; the machine adds them to the report's per-direction DMA
  totals when the launch finishes (`Machine.finish`)."""
  __slots__ = ("kind", "channels", "channels_alone", "hbm", "reads_hbm", "latency_cycles", "hbm_sides",
               "copies", "bytes", "direction", "channels_fast", "wbuf", "cycles_per_byte")

  def __init__(self, kind: str, channels: list, latency_cycles: int, hbm_sides: int,
               channels_alone=None, hbm=None, reads_hbm=False, channels_fast=None, wbuf=None):
    self.kind, self.channels = kind, channels
    self.channels_alone = channels_alone   # a write's channels while no HBM read streams (else None)
    # a write into HBM's write buffer: its channels at the read rate, and (buffer bytes, buffer bytes a
    # byte taken fast adds, bytes drained a cycle) (ChipSpec.hbm_write_buffer_bytes; else None)
    self.channels_fast, self.wbuf = channels_fast, wbuf
    self.hbm, self.reads_hbm = hbm, reads_hbm
    self.latency_cycles, self.hbm_sides = latency_cycles, hbm_sides
    self.copies = self.bytes = 0
    self.direction = _DIRECTION.get(kind)   # READ / WRITE for the arbiter, None for other copies
    # a byte's cycles on the slowest of its channels with nothing else on them (the arbiter's "alone")
    slowest = 0.0
    for c, w in channels:   # (a loop: no frame per plan)
      if w / c.bytes_per_cycle > slowest:
        slowest = w / c.bytes_per_cycle
    self.cycles_per_byte = slowest

  def reserve(self, start: float, nbytes: float) -> tuple[float, float]:
    """(first, last cycle) of a copy of `nbytes` from `start` on its channels: writes run at the
    mixed-traffic rate while an HBM read is reserved past `start` on the chip's HBM, else at the
    write-alone rate (through HBM's write buffer where the chip has one: `_buffered`); reads mark how
    far HBM reads now stream."""
    alone = self.channels_alone
    if alone is not None and start >= self.hbm.read_until:
      if self.wbuf is None:
        return reserve(alone, start, nbytes)
      return self._buffered(start, nbytes)
    first, last = reserve(self.channels, start, nbytes)
    if self.reads_hbm and last > self.hbm.read_until:
      self.hbm.read_until = last
    return first, last

  def _buffered(self, start: float, nbytes: float) -> tuple[float, float]:
    """A write while no read streams, through HBM's write buffer: taken at the read rate while the
    buffer (drained at the write rate since the last write) has room, then at the write rate."""
    cap, fill, drain = self.wbuf
    hbm = self.hbm
    level = hbm.wbuf_level
    if start > hbm.wbuf_time:   # (drained since the last write ended; a write queued behind it: none)
      level -= drain * (start - hbm.wbuf_time)
      if level < 0.0:
        level = 0.0
    room = (cap - level) / fill if level < cap else 0.0   # bytes taken fast before the buffer is full
    if nbytes <= room:
      first, last = reserve(self.channels_fast, start, nbytes)
      level += nbytes * fill
    else:
      first, mid = reserve(self.channels_fast, start, room) if room > 0.0 else (None, start)
      later, last = reserve(self.channels_alone, mid, nbytes - room)
      first = later if first is None else first
      level = cap
    hbm.wbuf_level, hbm.wbuf_time = level, last
    return first, last


def copy_timing(chip, src_space: MemorySpace, dst_space: MemorySpace) -> tuple:
  """(kind, timing class, completion latency in cycles, HBM sides, HBM weights (mixed, alone), write
  buffer) of a copy from `src_space` to `dst_space` on `chip`: a pure function of the frozen chip spec,
  which a VirtualTPU memoises for all its launches (tensorcore.cost_memos). The weights are the HBM
  channel bytes one byte of the copy takes (ChipSpec.hbm_weights; alone: a write while no read
  streams); the write buffer (its bytes, the weight of a byte taken fast) is None unless the chip has
  one (ChipSpec.hbm_write_buffer_bytes) and reads stream faster than writes alone."""
  kind = direction(src_space, dst_space)
  cls = _CLASS.get(kind) or _CLASS.setdefault(kind, _timing_class(kind))
  rd, wr, wr_mixed, cp = chip.hbm_weights()
  if cls in _HOST_CLASSES:   # the HBM end, if any, is read (to the host) or written (from it)
    weights = ((rd, None) if cls == "->host" else (wr_mixed, wr)) if "hbm" in kind else (0, None)
  else:
    weights = {"read": (rd, None), "write": (wr_mixed, wr), "hbm->hbm": (cp, None), "local": (0, None)}[cls]
  buffer = (chip.hbm_write_buffer_bytes, rd) if chip.hbm_write_buffer_bytes and rd < wr else None
  return kind, cls, _latency_cycles(chip, cls), hbm_sides(kind), weights, buffer


def plan(timing: tuple, chans, link=None) -> CopyPlan:
  """The CopyPlan of a copy with `timing` (`copy_timing`) on a core whose channels are `chans` =
  (DMA engine, HBM, local); `link`: the chip's host-link channel of the copy's direction, for a copy
  to or from host memory (it crosses the link, the core's DMA engine and, at an HBM end, HBM)."""
  kind, cls, latency_cycles, sides, (weight, weight_alone), buffer = timing
  if cls == "local":
    return CopyPlan(kind, [(chans[2], 1.0)], latency_cycles, sides)
  if cls in _HOST_CLASSES:
    through = [(link, 1.0), (chans[0], 1.0)] + ([(chans[1], weight)] if weight else [])
    return CopyPlan(kind, _slowest_first(through), latency_cycles, sides, None, chans[1] if weight else None,
                    bool(weight) and cls == "->host")
  alone = None if weight_alone is None or weight_alone == weight else \
      _slowest_first([(chans[0], 1.0), (chans[1], weight_alone)])
  fast = wbuf = None
  if alone is not None and buffer is not None:   # (a write, and HBM has a write buffer)
    cap, weight_fast = buffer
    fast = _slowest_first([(chans[0], 1.0), (chans[1], weight_fast)])
    wbuf = (float(cap), 1.0 - weight_fast / weight_alone, chans[1].bytes_per_cycle / weight_alone)
  return CopyPlan(kind, _slowest_first([(chans[0], 1.0), (chans[1], weight)]), latency_cycles, sides,
                  alone, chans[1], cls in ("read", "hbm->hbm"), fast, wbuf)


def _slowest_first(channels: list) -> list:
  """`channels` ([(channel, weight)]) with the one that carries the fewest bytes of the copy per cycle
  first (stable on ties). A stream of copies is queued behind its previous copy, which fills its
  slowest channel up to its end; bandwidth.reserve jumps there at once when the first channel with
  a later reservation is full, and otherwise steps there through the general loop (the same cycles:
  the order of a copy's channels changes no result, only how many passes the reservation takes; v5e
  reads: the HBM channel, second before, cost each copy an extra pass)."""
  return sorted(channels, key=lambda cw: cw[0].bytes_per_cycle / cw[1])


def stream_overhead(streams: dict, req, reads_hbm: bool, extra: int, mixed: set) -> int:
  """A copy's per-copy overhead `extra` under dma_sequential_no_overhead: 0 when its HBM window
  continues where this core's previous copy of that direction on that array ended. `streams`: (buffer
  id, direction) -> (where the last copy ended or None, that copy's `owner`), updated; a key whose
  copies came from different owners (a pipeline's operand, the body) goes into `mixed` (the
  steady-state proof of a pipeline owning it stops: sim/steady.py)."""
  found = req.stream_span   # (a request started again, as the pipeline's revisited blocks: found once)
  if found is None:
    buf, index = (req.src_buf, req.src_index) if reads_hbm else (req.dst_buf, req.dst_index)
    span = None
    if (req.src_indices if reads_hbm else req.dst_indices) is None and type(index) is tuple:
      block = req.hbm_block
      span = tile_range(buf.shape, buf.dtype.itemsize, index) if block is None else \
          block_span(buf.shape, buf.dtype.itemsize, req.shape, block)
    found = req.stream_span = ((id(buf), reads_hbm), span)   # (the key: SteadyState.stream_key's)
  key, span = found
  owner = req.owner
  last = streams.get(key)
  if last is not None and last[1] is not owner:
    mixed.add(key)
  if span is None:
    streams[key] = (None, owner)
    return extra
  streams[key] = (span[1], owner)
  return 0 if last is not None and last[0] == span[0] else extra


def tile_range(shape, itemsize: int, index):
  """(first, end) of a window (a tuple of slices and integers over `shape`) in the array's HBM layout,
  counted in tiles: the last two dims in tiles of (32 / bits x 8, 128), tile rows in order, leading
  dims outermost; None when the window is not one contiguous range of whole tiles there."""
  if len(shape) < 2:
    return None
  rows_tile = 8 * max(1, 4 // itemsize)
  *lead, rows, cols = shape
  if rows % rows_tile or cols % 128:
    return None
  spans = []
  for d, n in enumerate(shape):
    ix = index[d] if d < len(index) else slice(None)
    if type(ix) is slice:
      a, b, step = ix.indices(n)
      if step != 1 or b <= a:
        return None
      spans.append((a, b))
    else:
      spans.append((int(ix), int(ix) + 1))
  (r0, r1), (c0, c1) = spans[-2], spans[-1]
  whole = (r0, r1, c0, c1) == (0, rows, 0, cols)
  if r0 % rows_tile or r1 % rows_tile or c0 % 128 or c1 % 128 or \
      (r1 - r0 > rows_tile and (c0, c1) != (0, cols)):
    return None   # (not whole tiles, or several tile rows each only partly: not one range)
  col_tiles = cols // 128
  per_lead = (rows // rows_tile) * col_tiles
  first, extent = 0, 1
  for d, ((a, b), n) in enumerate(zip(spans, lead)):
    first = first * n + a
    extent *= b - a
    if b - a > 1 and not (whole and all(spans[e] == (0, lead[e]) for e in range(d + 1, len(lead)))):
      return None   # (a leading dim spanning several entries: one range only over whole later dims)
  start = first * per_lead + (r0 // rows_tile) * col_tiles + c0 // 128
  return start, start + (((r1 - r0) // rows_tile) * ((c1 - c0) // 128) if extent == 1
                         else extent * per_lead)


@functools.lru_cache(maxsize=4096)
def block_plan(shape: tuple, itemsize: int, block_shape: tuple) -> tuple:
  """What `tile_range` and `hbm_runs` answer for the blocks of `block_shape` (whole, inside the array)
  of an array of `shape`, once per (shape, itemsize, block shape): (span, runs). `span` is None when
  such a block is not one range of tiles, else (first tile of the block at the origin, the tiling unit
  of each dim, the tiles one unit along each dim moves the first tile, tiles a block spans): a block's
  first tile is affine in its offsets when they are multiples of the units (`block_span`). `runs` is
  the same for every block (its extents and which dims it spans whole do not depend on where it is)."""
  rank = len(shape)
  origin = tuple(slice(0, b) for b in block_shape)
  runs = window_runs(shape, origin)
  base = tile_range(shape, itemsize, origin)
  if base is None or len(block_shape) != rank:
    return None, runs
  units = (1,) * (rank - 2) + (8 * max(1, 4 // itemsize), 128)
  steps = []
  for d in range(rank):
    if block_shape[d] == shape[d]:
      steps.append(0)   # (a block spanning the dim: offset 0 there)
      continue
    moved = list(origin)
    moved[d] = slice(units[d], units[d] + block_shape[d])
    step = tile_range(shape, itemsize, tuple(moved))
    if step is None:
      return None, runs
    steps.append(step[0] - base[0])
  return (base[0], units, tuple(steps), base[1] - base[0]), runs


def block_span(shape: tuple, itemsize: int, block_shape: tuple, offsets) -> "tuple | None":
  """`tile_range` of the whole block of `block_shape` at element `offsets` (a pipeline's block:
  DmaRequest.hbm_block), from the block's plan (`block_plan`) without building its window."""
  span = block_plan(shape, itemsize, block_shape)[0]
  if span is None:
    return None
  first, units, steps, extent = span
  for o, u, st in zip(offsets, units, steps):
    if o % u:   # (not on the tiling: the window itself decides)
      return tile_range(shape, itemsize, tuple(slice(a, a + b) for a, b in zip(offsets, block_shape)))
    first += (o // u) * st
  return first, first + extent


def block_tile_ranges(shape, itemsize: int, block_shape, offsets):
  """`tile_range` of the blocks of `block_shape` at each row of `offsets` (an (n, rank) integer array of
  block-aligned element offsets, every block inside the array): arrays (first, end), or None when such
  a block is not one range (`block_plan`'s affine span, evaluated for every row at once)."""
  span = block_plan(tuple(shape), itemsize, tuple(block_shape))[0]
  if span is None:
    return None
  base, units, steps, extent = span
  first = np.full(len(offsets), base, np.int64)
  for d, (u, st) in enumerate(zip(units, steps)):
    if st == 0:
      continue
    if (offsets[:, d] % u).any():
      return None
    first += (offsets[:, d] // u) * st
  return first, first + extent


def hbm_runs(req, reads_hbm: bool) -> int:
  """Contiguous runs of a copy's HBM side (`window_runs`); 1 for an indexed copy. An HBM->HBM copy
  counts its source's. A pipeline's block (DmaRequest.hbm_block) takes its block's plan's."""
  buf, index = (req.src_buf, req.src_index) if reads_hbm else (req.dst_buf, req.dst_index)
  if (req.src_indices if reads_hbm else req.dst_indices) is not None or not isinstance(index, tuple):
    return 1
  if req.hbm_block is not None:
    return block_plan(buf.shape, buf.dtype.itemsize, req.shape)[1]
  return window_runs(buf.shape, index)


def window_runs(shape, index: tuple) -> int:
  """Contiguous runs of the window `index` of an array of `shape`: the product of the window's extents
  before its last dim that is not whole (an integer index counts 1); 1 for a window of whole rows."""
  index = index + (slice(None),) * (len(shape) - len(index))
  for d in range(len(shape) - 1, -1, -1):
    ix = index[d]
    if isinstance(ix, slice) and len(range(*ix.indices(shape[d]))) == shape[d]:
      continue
    runs = 1
    for j in range(d):
      if isinstance(index[j], slice):
        runs *= len(range(*index[j].indices(shape[j])))
    return runs
  return 1


class DmaEngine:
  """The DMA issue of one core: plans per (spaces, semaphore), the core's channels, the start path."""
  __slots__ = ("core", "machine", "issue_cycles", "bare_cycles", "overhead_bytes", "run_bytes", "eager",
               "chans", "prepared", "arbiter", "streams", "mixed", "queue", "switch_cycles", "last_sem")

  def __init__(self, core):
    self.core = core
    self.machine = core.machine
    self.issue_cycles = core.chip.dma_issue_cycles
    self.bare_cycles = core.chip.dma_issue_bare_cycles
    self.overhead_bytes = core.chip.dma_copy_overhead_bytes   # (hw.ChipSpec: v5e 4096, else 0)
    self.run_bytes = core.chip.dma_run_overhead_bytes         # (hw.ChipSpec: v5e 128, else 0)
    self.eager = core.machine.dma_policy.name == "eager"
    self.chans = None        # the core's (DMA engine, HBM, local) channels, resolved at the first copy
    self.prepared = {}       # (src space, dst space, semaphore) ids -> (core, CopyPlan, semaphore)
    self.arbiter = Arbiter(core)   # the order of this core's HBM reads and writes (sim/dma_arbiter.py)
    # (hw.ChipSpec.dma_sequential_no_overhead) stream key -> (the tile where its last copy ended or None,
    # that copy's owner): `stream_overhead`; None when the rule is off
    self.streams = {} if core.chip.dma_sequential_no_overhead else None
    self.mixed = set()   # ...the keys of `streams` whose copies came from more than one owner
    # (hw.ChipSpec.dma_queue_depth) the cycles the last `depth` copies' transfers began, oldest first;
    # None when the engine's queue is unbounded
    depth = core.chip.dma_queue_depth
    self.queue = collections.deque(maxlen=depth) if depth else None
    # (hw.ChipSpec.dma_issue_switch_cycles) the previous start's completion semaphore (buffer, index)
    self.switch_cycles = core.chip.dma_issue_switch_cycles
    self.last_sem = (None, None)

  def start(self, req) -> None:
    """Issue a copy (the one path for local, remote and checked copies): one DMA issue on the scalar
    core; the transfer starts once its source's last store is done and is timed on the channels of
    its CopyPlan (or the ICI route to another chip); its data moves now or when waited (the DMA
    policy: memory.copy here, or in Machine.dma_arrived); its completion and source side arrive on their
    semaphores (sim/sync.py)."""
    core = self.core
    core.block_starts = True
    # (hw.ChipSpec.dma_issue_bare_cycles: measured on a v5e, a loop of starts and waits alone issues its
    # starts in ~2 cycles; beside vector work each costs ~16 in series with it)
    issue = self.issue_cycles if self.bare_cycles is None or core.block_vector or not core.dma_only \
        else self.bare_cycles
    if self.switch_cycles:
      last = self.last_sem
      if req.sem_buf is not last[0] or req.sem_index != last[1]:
        issue += self.switch_cycles
        self.last_sem = (req.sem_buf, req.sem_index)
    now = core.now + issue
    core.unit_busy["scalar"] += issue
    queue = self.queue
    if queue is not None and len(queue) == queue.maxlen and queue[0] > now:
      now = math.ceil(queue[0])   # the engine holds `depth` copies not begun: wait for the oldest
    core.now = now
    m = self.machine
    seq = next(m.sequence)
    rec = DmaRecord(req, seq, core, now)
    src_ready = req.src_buf.ready_cycle
    start = now if now > src_ready else src_ready
    target_chip = core.chip_index
    elsewhere = False   # into another core's or chip's memory (lands later under eager: `land_due`)
    if req.device_id is not None or req.core_index is not None:
      local = req.dst_buf
      target_chip, req = self._remote(req)
      rec.req = req
      elsewhere = req.dst_buf is not local
    checks = core.checks
    if checks.active:
      req = checks.dma_start(core, rec)
    nbytes = req.nbytes
    fast = req.fast   # (this core, CopyPlan, destination semaphore or None): per request, shared per key
    if fast is None or fast[0] is not core:
      # (enum members are singletons and Enum.__hash__ is Python code: the key holds ids)
      key = (id(req.src_buf.memory_space), id(req.dst_buf.memory_space), id(req.sem_buf), req.sem_index)
      fast = self.prepared.get(key)
      if fast is None:
        fast = self._prepare(req, key)
      req.fast = fast
    p, slot = fast[1], fast[2]
    trace = core.trace
    if target_chip != core.chip_index:
      s, read_done, done = m.ici_transfer(core, target_chip, start, nbytes)
      kind = "ici"
      trace.count_dma(kind, nbytes)
    else:
      extra = self.overhead_bytes
      if self.streams is not None and p.direction is not None and p.hbm_sides == 1:
        extra = stream_overhead(self.streams, req, p.reads_hbm, extra, self.mixed)
      if self.run_bytes and p.direction is not None:
        runs = req.hbm_runs
        if runs is None:
          runs = req.hbm_runs = hbm_runs(req, p.reads_hbm)
        extra += runs * self.run_bytes
      s, read_done = p.reserve(start, nbytes + extra)
      if p.direction is not None:   # an HBM read or write: this core's engine orders them
        s, read_done = self.arbiter.timed(p.direction, start, s, read_done, rec, p)
      done = math.ceil(read_done) + p.latency_cycles
      kind = p.kind
      rec.hbm_sides = p.hbm_sides
      p.copies += 1   # (the report's totals per direction and its HBM traffic: Machine.finish)
      p.bytes += nbytes
    rec.start_cycle, rec.done_cycle, rec.read_done_cycle = s, done, read_done
    if queue is not None:
      queue.append(s)
    if done > core.horizon:
      core.horizon = done
    if trace.on:
      trace.add((core.tid, "dma", kind, s, done, (req, nbytes)))   # (args: Trace.events)
    if m.landings:   # copies from other cores or chips not landed yet: those this copy meets first
      meet(req, start, now, elsewhere)
    if core.timing_only and req.dst_buf.memory_space is not _SMEM:
      rec.moved = True  # timing only: payloads are skipped; only scalar (SMEM) data moves
    elif elsewhere and self.eager:
      defer(rec, checks)
    elif self.eager or m.dma_policy.move_at_start(rec):
      if checks.active:   # (checked: never borrowing, the checkers follow storage identity)
        memory.copy(req)
        checks.moved(req)
      else:               # a whole VMEM destination may borrow its source (Buffer.borrow)
        memory.copy(req, borrow=True)
      rec.moved = True
    m.dma_count += 1
    sems = m.sems
    if slot is not None:
      sems.arrive(slot, done, nbytes, rec)
    if req.src_sem_buf is not None:
      sems.arrive(sems.slot(req.src_sem_buf, req.src_sem_index), read_done, nbytes, rec, True)
    m.inflight[seq] = rec
    if m.dma_count & 1023 == 0:
      m.prune_channels()
    sched = m.sched
    if sched.yields:   # (a single-core launch has no one to yield to)
      sched.maybe_yield(core)

  def signature(self, now, rel, owned: dict):
    """The issue state relative to `now` (sim/steady.py): the queue's transfer starts still ahead, the
    previous start's semaphore and, under dma_sequential_no_overhead, where each stream ended, except
    the streams in `owned` (key -> owner: a pipeline's operands, whose proof covers them); None when
    an owned stream's last copy is not its owner's or another owner's copies joined it."""
    queue = self.queue
    held = () if queue is None else tuple(rel(t) for t in queue)
    ends = ()
    if self.streams:
      ends = []
      for key, (end, owner) in self.streams.items():
        mine = owned.get(key)
        if mine is None:
          ends.append((key, end, id(owner)))
        elif owner is not mine or key in self.mixed:
          return None
      ends = tuple(ends)
    return held, id(self.last_sem[0]), self.last_sem[1], ends

  def shift(self, later, stream_ends: dict) -> None:
    """Advance the state by a steady-state jump: `stream_ends` (key -> end) where each owned stream's
    last copy ends at the new step (its owner unchanged)."""
    if self.queue:
      self.queue = collections.deque((later(t) for t in self.queue), maxlen=self.queue.maxlen)
    for key, end in stream_ends.items():
      last = self.streams.get(key)
      if last is not None:
        self.streams[key] = (end, last[1])

  def _remote(self, req):
    """(target chip, the request as it lands there) of a copy to another core or chip: it lands in the
    target's buffer and signals the target's semaphore; the issuer's descriptor keeps naming its own
    semaphores (its .wait_recv() waits on the local copy)."""
    core, m = self.core, self.machine
    target_chip, target = req.device_id if req.device_id is not None else (core.chip_index, core.core_id)
    if req.core_index is not None:
      target = req.core_index
    req = copy.copy(req)
    req.fast = req.stream_span = None
    req.dst_buf = m.peer_buffer(req.dst_buf, target_chip, target, core)
    if req.sem_buf is not None:
      req.sem_buf = m.peer_buffer(req.sem_buf, target_chip, target, core)
    return target_chip, req

  def _prepare(self, req, key) -> tuple:
    """(core, CopyPlan, destination semaphore) of a request, kept under `key` for every request with the
    same spaces and semaphore."""
    if self.chans is None:
      self.chans = self.core.dma_channels()
    sem = None if req.sem_buf is None else self.machine.sems.slot(req.sem_buf, req.sem_index)
    timings = self.core.copy_timings   # (the chip's, kept by its VirtualTPU: key[:2] names the spaces)
    timing = timings.get(key[:2])
    if timing is None:
      timing = timings[key[:2]] = copy_timing(self.core.chip, req.src_buf.memory_space,
                                              req.dst_buf.memory_space)
    link = self.machine.host_link(self.core.chip_index, timing[1]) if timing[1] in _HOST_CLASSES else None
    fast = self.prepared[key] = (self.core, plan(timing, self.chans, link), sem)
    return fast
