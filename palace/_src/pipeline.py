"""Software pipelining of BlockSpec'd operands (L5, library code).

Built only from language primitives (run_scoped, grid_step, and the DMA primitives of
lang/tpu_primitives.py: each block copy is a `PreparedCopy`, made once by `prepare_window_copy` (whole
blocks) or `AsyncCopyDescriptor.prepare()` (ragged and squeezed blocks) and then only started and
waited, cached per (block, slot) when blocks are revisited). The overlap of DMA and compute, the
skipped copies for unchanged blocks and the revisit behaviour all come out of the DMA and semaphore
model, not out of special cases in the simulator. `pallas_call` (launch/run.py) and `emit_pipeline`
(emit_pipeline.py) both run on `Pipeline` (`run_pipeline`: make, run, close).

Schedule per input (buffer_count b): at step s, every input whose block is not in flight yet starts it
(the prologue issues all of step 0's copies before waiting any); then per input the block of step s is
waited and blocks for steps s+1 .. s+b-1 whose index changes are fetched into free slots (b=1: fetched
at the step that needs them). Per output: a changed block takes the next slot (after waiting the
write-back that last used it); the block is written back when the next step's index differs or at the
last step; all write-backs are waited at the end. Ragged edge blocks copy only their in-bounds part:
padding reads whatever the slot held (NaN for fresh floats) and out-of-bounds writes are dropped, as on
TPU. Operands whose source already lives in the block's memory (VMEM, or SMEM for emit_pipeline) are
windowed by views instead of copied; HBM/ANY specs hand the body the ref itself; `sync`
(no_pipelining) waits every copy as soon as it is started.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from palace._src import executor, validate
from palace._src.block_offsets import block_offsets, grid_offsets
from palace._src.prefetch_maps import PrefetchMap
from palace._src.blocks import COMPUTED_INDEX_MAP, SQUEEZED, BlockMapping
from palace._src.core import MemorySpace
from palace._src.errors import OutOfBoundsError, SyncError, UsageError
from palace._src.lang.array import concrete_int
from palace._src.lang.primitives import close_scope, open_scope, sem_target
from palace._src.lang.refs import Ref, Slice
from palace._src.lang.tpu_primitives import AsyncCopyDescriptor, prepare_window_copy
from palace._src.pipeline_steady import Detector


_PIPELINE_SITE = ("<pipeline of BlockSpec'd operands>", 0)


class _Op:
  """Pipeline state of one operand."""
  __slots__ = ("m", "hbm", "slots", "sems", "is_out", "blocks", "cur", "cur_slot", "fetched",
               "next_slot", "pending_wb", "written", "squeezed", "sem_views", "mode", "nbuf",
               "bounds_checks", "views", "all_blocks", "sem_targets", "simple", "whole_blocks",
               "block_nbytes", "prepare", "block_is_array", "full_slices", "ex", "last_copy",
               "map_on_core", "prefetch", "cur_since", "owner")

  def __init__(self, m: BlockMapping, hbm: Ref, is_out: bool):
    self.m, self.hbm, self.is_out = m, hbm, is_out
    self.blocks = {}        # step -> element offsets (cached index-map results)
    self.fetched = {}       # step -> (slot, DMA request or None)
    self.next_slot = 0
    self.cur = None
    self.cur_slot = 0
    self.pending_wb = {}    # slot -> DMA request
    self.written = set()
    self.squeezed = m.squeezed_dims
    self.sem_views = ()
    self.ex = executor.current()  # the core the pipeline runs on (its copies are prepared for it)
    self.bounds_checks = self.ex.bounds_checks
    self.views = {}
    self.all_blocks = None  # every step's offsets, when the index map vectorises
    self.sem_targets = ()   # per slot: (semaphore buffer, index) of sem_views[slot]
    # no squeezed dims and a whole-array source: block views are plain windows (the fast path)
    self.simple = not self.squeezed and isinstance(hbm, Ref) and hbm._full
    # ...and every block is whole: blocked dims that divide the array, offsets bounds-checked
    self.whole_blocks = self.simple and self.bounds_checks and m.tiles_evenly
    self.block_nbytes = m.block_bytes
    self.block_is_array = self.whole_blocks and tuple(m.block_shape) == tuple(hbm.buf.shape)
    # whole blocks spanning a whole dim always index it with the same slice
    self.full_slices = m.full_slices
    # the prepared copy of a block: cached per (block, slot), or made afresh when no block is visited
    # twice (caching would only cost)
    self.prepare = _cached_copy
    self.last_copy = []     # per slot: the last whole-block copy prepared for it (or None)
    self.map_on_core = False  # the index map reads kernel memory (block_offsets: evaluated on the core)
    self.prefetch = None      # a map over scalar-prefetch tables: its PrefetchMap (prefetch_maps.py)
    self.cur_since = 0        # the step the current output block became current (a kept block's age)
    # the token its copies carry (DmaRequest.owner: the machine tells its stream from others'); not
    # the operand itself, which holds its copies (no reference cycle)
    self.owner = object()


class _BlockLabels(tuple):
  """The (source, destination) labels of a whole-block pipeline copy, as executor.flat_label reads them
  (`label_parts`: the slot ref and the operand's window at `offsets`, named without building a view;
  they also name the copies of steps a steady-state detector advanced over, pipeline_steady.py).
  Made from the tuple (buf, offsets, shape, vmem, to_hbm) (a tuple subclass: made without a
  Python-level constructor, once per pipeline copy)."""
  __slots__ = ()

  def label_parts(self) -> tuple:
    """Both sides of the copy's label: the window as (name, offsets, shape), unless it is the whole
    array, and the slot ref's side (no Ref is built; formatting waits for a reader)."""
    buf, offsets, shape, vmem, to_hbm = tuple.__iter__(self)
    hbm = (buf.name, None, None) if tuple(shape) == buf.shape and not any(offsets) else \
        (buf.name, offsets, shape)
    slot = vmem.label_part()
    return slot + hbm if to_hbm else hbm + slot

  def at(self, offsets) -> "_BlockLabels":
    """The labels of the same copy for the block at `offsets`."""
    buf, _, shape, vmem, to_hbm = tuple.__iter__(self)
    return _BlockLabels((buf, offsets, shape, vmem, to_hbm))


def _cached_copy(op: _Op, offsets, slot: int, to_hbm: bool):
  """`_prepare`, cached per (block, slot) for operands whose blocks are revisited (matmul operands): a
  prepared copy is never modified once built (only the executor's `fast` cache on its request is
  filled in), so one object serves every copy of the same block."""
  key = (offsets, slot)
  hit = op.views.get(key)
  if hit is None:
    if len(op.views) > 4096:
      op.views.clear()
    hit = op.views[key] = (_prepare(op, offsets, slot, to_hbm),)
  return hit[0]


def _prepare(op: _Op, offsets, slot: int, to_hbm: bool):
  """The prepared copy (lang/tpu_primitives.PreparedCopy) of the block at `offsets` into slot `slot`
  (or back, `to_hbm`), or None when no part of the block is in bounds: the copy make_async_copy would
  make for the same views, semaphore and site. Operands call it through `op.prepare` (cached or not)."""
  if op.whole_blocks:   # = Ref.window(op.hbm.buf, offsets, vmem.shape), only its NumPy index built
    vmem = op.slots[slot]
    buf = op.hbm.buf
    shape = vmem.shape
    if op.block_is_array:
      idx = ()
    elif len(shape) == 2:
      full = op.full_slices
      idx = (full[0] or slice(offsets[0], offsets[0] + shape[0]),
             full[1] or slice(offsets[1], offsets[1] + shape[1]))
    else:
      idx = tuple([slice(o, o + z) for o, z in zip(offsets, shape)])
    labels = _BlockLabels((buf, offsets, shape, vmem, to_hbm))
    # (same spaces and semaphore: the executor's cache carries over; not for an output block read
    # back, RevisitMode.ANY, whose copy runs the other way)
    usual = to_hbm == op.is_out
    like = op.last_copy[slot] if usual else None
    if to_hbm:
      req = prepare_window_copy(vmem.buf, vmem._np_index, buf, idx, shape, op.sem_targets[slot],
                                nbytes=op.block_nbytes, site=_PIPELINE_SITE, labels=labels, like=like)
    else:
      req = prepare_window_copy(buf, idx, vmem.buf, vmem._np_index, shape, op.sem_targets[slot],
                                nbytes=op.block_nbytes, site=_PIPELINE_SITE, labels=labels, like=like)
    req.owner = op.owner   # (its stream is the operand's: pipeline_steady.py proves its continuity)
    req.hbm_block = offsets
    if usual:
      op.last_copy[slot] = req
    return req
  views = _make_copy_views(op, offsets, slot)
  if views is None:
    return None
  src, dst = (views[1], views[0]) if to_hbm else (views[0], views[1])
  return AsyncCopyDescriptor(src, dst, op.sem_views[slot], site=_PIPELINE_SITE).prepare(op.ex)


def _make_copy_views(op: _Op, offsets, slot: int):
  """(operand view, slot view) of the in-bounds part of the block at `offsets`, or None if empty."""
  m = op.m
  if op.simple:
    vmem = op.slots[slot]
    sizes = vmem.shape
    for off, size, dim in zip(offsets, sizes, m.array_shape):
      if off < 0 or off + size > dim:
        break
    else:  # the whole block is in bounds: a plain window of the source
      return Ref.window(op.hbm.buf, offsets, sizes), vmem
  starts, sizes, vstarts = [], [], []
  ragged = False
  for (kind, size, _), off, dim in zip(m.dims, offsets, m.array_shape):
    if kind == SQUEEZED:
      starts.append(off)
      sizes.append(1)
      continue
    lo = off if off > 0 else 0
    hi = off + size if off + size < dim else dim
    if hi <= lo:
      return None
    if lo != off or hi - lo != size:
      ragged = True
    starts.append(lo)
    sizes.append(hi - lo)
    vstarts.append(lo - off)
  hbm = Ref.window(op.hbm.buf, starts, sizes, op.squeezed) if op.hbm._full else \
      op.hbm.at[tuple(st if d in op.squeezed else Slice(st, sz)
                      for d, (st, sz) in enumerate(zip(starts, sizes)))]
  if not ragged:
    return hbm, op.slots[slot]
  vsizes = [sz for d, sz in enumerate(sizes) if d not in op.squeezed]
  return hbm, Ref.window(op.slots[slot].buf, vstarts, vsizes)


_RAW, _ALIAS, _BUFFERED = "raw", "alias", "buffered"


def _mode(m: BlockMapping, ref, smem_blocks: bool) -> str:
  """raw: the body gets the ref itself; alias: a view of a source already in the block's memory;
  buffered: DMA'd into scoped block buffers."""
  if not (m.space == MemorySpace.VMEM or
          (m.space == MemorySpace.SMEM and (smem_blocks or not m.whole_array))):
    return _RAW
  if isinstance(ref, Ref) and ref.buf.memory_space == m.space:
    return _ALIAS
  return _BUFFERED


def allocation_types(in_maps, out_maps, in_refs, out_refs, *, sync=False, smem_blocks=False):
  """Per operand (inputs then outputs): None, or ([block slot types], DMA semaphore array type)."""
  return [_allocation_type(m, _mode(m, r, smem_blocks), sync)
          for m, r in zip(list(in_maps) + list(out_maps), list(in_refs) + list(out_refs))]


def _allocation_type(m: BlockMapping, mode: str, sync: bool):
  if mode != _BUFFERED:
    return None
  n = 1 if sync else m.buffer_count
  return m.buffer_types(n, MemorySpace.SMEM if m.space == MemorySpace.SMEM else MemorySpace.VMEM)


def run_pipeline(body, grid, in_maps, out_maps, in_refs, out_refs, *, lead_args=(), tail_args=(),
                 tail_kwargs=None, index_args=(), points=None, sync=False, allocations=None,
                 smem_blocks=False, written=None, offsets_cache=None):
  """Run `body(*lead, *in_blocks, *out_blocks, *tail, **tail_kwargs)` over the grid, pipelined.

  `points`: the grid points to visit (default: all, row-major); `sync`: every copy is waited at once
  (no_pipelining); `allocations`: buffers from `allocation_types` allocated by the caller (reused
  across pipelines); `smem_blocks`: SMEM BlockSpecs are windowed like VMEM ones (emit_pipeline);
  `written`: a dict that receives, per output index, the element offsets of the blocks written back;
  `offsets_cache`: a dict kept with these block mappings (a launch plan's) that keeps their block
  offsets per list of points for the next pipeline over them (`block_offsets.grid_offsets`)."""
  pipe = Pipeline(body, grid, in_maps, out_maps, in_refs, out_refs, lead_args=lead_args,
                  tail_args=tail_args, tail_kwargs=tail_kwargs, index_args=index_args, points=points,
                  sync=sync, allocations=allocations, smem_blocks=smem_blocks, offsets_cache=offsets_cache)
  try:
    pipe.run(written)
  except BaseException:
    pipe.close(quiet=True)
    raise
  pipe.close()


class Pipeline:
  """One pipeline over a grid, in three phases: making it (block mappings to operand states, block
  offsets, the block buffers' allocation: `run_pipeline`'s arguments), `run(written)` (the steps) and
  `close()` (freeing the block buffers). A replayed launch keeps its pipeline between runs
  (launch/run.py, `_Warm`): `park()` after a run puts it back in the state `run` expects, so a run of a
  parked pipeline whose block buffers were renewed does what a new one would.

  A parked pipeline's schedule is the same in every run: a replayed launch's schedule was proved a
  function of its plan and keyed operands (sim/replay.py), and a kept one serves only launches with
  the same key. So the first run after a park records what the step loop asks of the core, in order
  (the grid point of each step, each copy started or waited, each body call with its arguments:
  `_Recorder`), and later runs play that record (`_play`) instead of deciding the schedule again."""

  def __init__(self, body, grid, in_maps, out_maps, in_refs, out_refs, *, lead_args=(), tail_args=(),
               tail_kwargs=None, index_args=(), points=None, sync=False, allocations=None,
               smem_blocks=False, offsets_cache=None):
    ex = self.ex = executor.current("a pipeline")
    if ex.grid_reads is not None:   # (inside a watched body: its steps are not a function of the grid)
      ex.grid_reads.append(None)
    grid = self.grid = validate.as_dims(grid, "the pipeline grid")
    self.full_grid = points is None   # (every point, row-major)
    if points is None:
      points = list(itertools.product(*[range(g) for g in grid]))
    self.points, self.n = points, len(points)
    self.body, self.lead_args, self.tail_args = body, lead_args, tail_args
    self.tail_kwargs, self.index_args, self.sync = tail_kwargs or {}, index_args, sync
    ops_in = self.ops_in = [_Op(m, r, False) for m, r in zip(in_maps, in_refs)]
    ops_out = self.ops_out = [_Op(m, r, True) for m, r in zip(out_maps, out_refs)]
    ops = ops_in + ops_out
    types = []
    for o in ops:
      o.mode = _mode(o.m, o.hbm, smem_blocks)
      t = _allocation_type(o.m, o.mode, sync)
      o.nbuf = 0 if t is None else len(t[0])
      types.append(t)
    piped = [o for o in ops if o.mode == _BUFFERED]
    for k, o in enumerate(ops):
      # (with scalar prefetch a map may read the prefetched scalars, per step on the core: only the
      # pure maps, which do not, are evaluated for the whole grid)
      if o.mode != _RAW and (not index_args or o.m.pure_index_map):
        o.all_blocks, distinct = grid_offsets(o, k, points, offsets_cache, index_args)
        if distinct:
          o.prepare = _prepare
      elif o.mode != _RAW and o.m.prefetch_index_map:
        o.prefetch = PrefetchMap(points)
    self.bufs = None   # the block buffers this pipeline allocated (None: the caller's, or no steps)
    self.record = False   # the next run records its schedule (after a park)
    self.tape = None      # the recorded schedule: [(kind, payload)], and the blocks written back
    self.tape_written = None
    if not self.n:
      return
    if allocations is not None:   # the caller's buffers (emit_pipeline_with_allocations)
      allocs = _check_allocations(allocations, types, ops)
    else:                         # = pl.run_scoped(..., *types) around the steps, as one flat scope
      flat = [x for t in types if t is not None for x in (*t[0], t[1])]
      refs, _, self.bufs = open_scope(ex, flat, {}, "run_scoped")
      allocs, k = [], 0
      for t in types:
        if t is not None:
          allocs.append((refs[k:k + len(t[0])], refs[k + len(t[0])]))
          k += len(t[0]) + 1
    try:
      for o, (slots, sems) in zip(piped, allocs):
        o.slots, o.sems = list(slots), sems
        if self.bufs is not None:
          for r in slots:  # errors on the kernel's block refs name the operand (args[0], outputs[1])
            r.buf.name = f"{o.m.name} block"
        # (= sems.at[i]: a whole freshly allocated array, so its element views need no index checks)
        o.sem_views = [Ref.window(sems.buf, (i,), (1,), (0,)) if sems._full else sems.at[i]
                       for i in range(o.nbuf)]
        o.sem_targets = [sem_target(v, "DMA semaphore") for v in o.sem_views]
        o.last_copy = [None] * o.nbuf
    except BaseException:
      self.close(quiet=True)
      raise

  def run(self, written=None) -> None:
    """The steps; `written`: run_pipeline's."""
    if not self.n:
      return
    ex = self.ex
    ex.grid_stack.append((self.points[0], self.grid))
    try:
      if self.tape is not None:
        self._play()
      elif self.record:
        tape = []
        recorder = _Recorder(ex, tape)
        body = self.body

        def recorded_body(*args, **kwargs):
          tape.append((_BODY, args))
          return body(*args, **kwargs)
        _steps(self, recorder, recorded_body)
        self.tape_written = {k: frozenset(o.written) for k, o in enumerate(self.ops_out) if o.written}
        self.tape = tape if len(tape) <= _TAPE_LIMIT else None
        self.record = False
      else:
        _steps(self, ex, self.body)
    finally:
      ex.grid_stack.pop()
    if written is not None:  # which output blocks were written back (for lazy output init)
      if self.tape_written is not None:
        for k, blocks in self.tape_written.items():
          written.setdefault(k, set()).update(blocks)
        return
      for k, o in enumerate(self.ops_out):
        if o.mode == _BUFFERED:
          written.setdefault(k, set()).update(o.written)

  def _play(self) -> None:
    """The recorded schedule, on the same core (the steps of `_steps` without deciding them)."""
    ex = self.ex
    grid_stack, grid, grid_step = ex.grid_stack, self.grid, ex.grid_step
    dma_start, dma_wait = ex.dma_start, ex.dma_wait
    body, kwargs = self.body, self.tail_kwargs
    for kind, x in self.tape:
      if kind is _BODY:
        body(*x, **kwargs)
      elif kind is _START:
        dma_start(x)
      elif kind is _WAIT:
        dma_wait(x)
      else:
        grid_stack[-1] = (x, grid)
        grid_step()

  def close(self, quiet: bool = False) -> None:
    if self.bufs is not None:
      close_scope(self.ex, self.bufs, quiet=quiet)

  def park(self) -> None:
    """After a run that returned: the operand states as a new pipeline's, the copies prepared per block
    and slot kept (from now on for every operand: a parked pipeline runs again, so even blocks visited
    once are visited again). The block buffers (`bufs`) are the owner's to renew: a run expects them as
    freshly allocated (launch/run.py renews them; the language side does not touch buffer state)."""
    self.record = self.tape is None and self.tape_written is None   # (once: a run too long keeps none)
    for o in self.ops_in + self.ops_out:
      o.prepare = _cached_copy
      o.fetched.clear()
      o.blocks.clear()
      o.pending_wb.clear()
      o.written = set()
      o.next_slot = o.cur_slot = 0
      o.cur = None
      if o.prefetch is not None:
        o.prefetch.reset()


_STEP, _START, _WAIT, _BODY = "step", "start", "wait", "body"   # the kinds of a recorded schedule's entries
_TAPE_LIMIT = 100_000   # entries (~16,000 steps, ~10 MB); a longer schedule is not kept (decided every run)


class _Recorder:
  """The core as `_steps` sees it while a parked pipeline records its schedule (`Pipeline.run`): every
  member it uses, each call also appended to the record."""
  __slots__ = ("ex", "tape", "grid_stack", "chip_index", "core_id")

  def __init__(self, ex, tape: list):
    self.ex, self.tape = ex, tape
    self.grid_stack, self.chip_index, self.core_id = ex.grid_stack, ex.chip_index, ex.core_id

  def grid_step(self) -> None:
    self.tape.append((_STEP, self.grid_stack[-1][0]))
    self.ex.grid_step()

  def dma_start(self, copy) -> None:
    self.tape.append((_START, copy))
    self.ex.dma_start(copy)

  def dma_wait(self, copy) -> None:
    self.tape.append((_WAIT, copy))
    self.ex.dma_wait(copy)


def _check_allocations(allocations, types, ops):
  allocations = list(allocations)
  if len(allocations) != len(types):
    raise UsageError(f"Pipeline allocations have {len(allocations)} entries but the pipeline has "
                     f"{len(types)} operands. Fix: build them with the make_allocations function that "
                     f"emit_pipeline_with_allocations returned, for the same refs.")
  out = []
  for k, (a, t, o) in enumerate(zip(allocations, types, ops)):
    if t is None:
      continue
    ok = a is not None and len(a) == 2 and len(a[0]) == len(t[0]) and a[1].shape == t[1].shape
    ok = ok and all(isinstance(r, Ref) and r.shape == mt.shape and r.dtype == mt.dtype
                    for r, mt in zip(a[0], t[0]))
    if not ok:
      raise UsageError(f"Pipeline allocations[{k}] for {o.m.name} do not fit: expected "
                       f"{len(t[0])} buffer(s) of {t[0][0].dtype}{list(t[0][0].shape)} and a DMA "
                       f"semaphore array of shape {t[1].shape}. Fix: allocate them with "
                       f"pl.run_scoped(run, make_allocations(*refs)) for the same refs.")
    out.append(a)
  return out


def _start_fetch(op: _Op, step: int, offsets, dma_start) -> None:
  """Start the copy of the block at `offsets` (the block of step `step`) into the next free slot."""
  slot = op.next_slot
  op.next_slot = slot + 1 if slot + 1 < op.nbuf else 0
  copy = op.prepare(op, offsets, slot, False)
  if copy is not None:
    dma_start(copy)
  op.fetched[step] = (slot, copy)


def _alias_view(op: _Op, offsets, point) -> Ref:
  """The block at `offsets` as a view of a source already in VMEM/SMEM (no copy)."""
  idx = tuple(off if kind == SQUEEZED else Slice(off, size)
              for (kind, size, _), off in zip(op.m.dims, offsets))
  try:
    return op.hbm.at[idx]
  except OutOfBoundsError as e:
    raise OutOfBoundsError(
        f"Block of {op.m.name} at grid point {point} (element offsets {offsets}, block "
        f"{op.m.block_shape}) is not inside the {op.hbm.buf.memory_space} ref it aliases (shape "
        f"{op.m.array_shape}): a pipeline over a source already in {op.hbm.buf.memory_space} uses views "
        f"of it, so every block must be in bounds. Fix: pick a block shape that divides the array.") from e


def _steps(pipe: Pipeline, ex, body) -> None:
  """The step loop (the hottest path of a launch): per grid point, start/wait the block copies, call
  the body, write changed output blocks back; then wait the last write-backs. `ex` is the core (or
  the `_Recorder` around it), `body` the kernel body (or the recording one). A timing-only grid whose
  steps provably repeat runs its first steps under a steady-state detector, which advances over
  whole periods (pipeline_steady.py)."""
  steps = _Steps(pipe, ex)
  enter, write_backs, args, kwargs = steps.enter, steps.write_backs, steps.call_args, pipe.tail_kwargs
  steady = Detector.make(pipe, steps, ex, _alias_view) if ex is pipe.ex else None
  # (the step indices, in order: the detector's may jump over whole periods)
  order = range(pipe.n) if steady is None else steady.order(ex)
  try:
    for s in order:
      enter(s)
      if kwargs:
        body(*args, **kwargs)
      else:
        body(*args)
      write_backs(s)
  finally:
    if steady is not None:
      order.close()
  if steady is not None:
    steady.finish()
  dma_wait = steps.dma_wait
  for o in pipe.ops_out:
    for copy in o.pending_wb.values():
      dma_wait(copy)
    o.pending_wb.clear()


def _host_blocks(o, points, index_args):
  """Every step's element offsets of operand `o` with its map run on the host (no executor: nothing
  charged), or None where it cannot run there (it reads kernel memory: then marked to run on the core,
  as block_offsets' own host try would mark it, so that the map is not tried on the host twice)."""
  token = executor.set_current(None)
  try:
    out = []
    for point in points:
      idx = o.m.index_map(*point, *index_args)
      idx = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
      out.append(o.m.offsets(tuple(concrete_int(i, "index_map result") for i in idx)))
    return out
  except Exception:  # noqa: BLE001  (a map reading kernel memory: the caller counts it as one)
    o.map_on_core = True
    return None
  finally:
    executor.reset_current(token)


def _index_map_cycles(ops, points, index_args, grid, chip) -> int:
  """Scalar cycles a grid step's index maps and bookkeeping cost under the rules measured on v5e
  (hw.ChipSpec.index_map_cycles and the fields beside it): per operand whose map is evaluated on the
  core (it reads kernel memory) index_map_smem_cycles; per operand whose map computes its indices (a
  front end's map marked blocks.COMPUTED_INDEX_MAP, or block offsets over the grid that are, in some
  dim, neither constant nor one grid index times the block size) index_map_cycles (index_map_subword_cycles
  more per table-reading map when the scalar-prefetch operands hold sub-word integers); per other operand
  whose offsets move index_map_plain_cycles (none of these for an operand whose blocks are views of a
  source already in VMEM: no copy is started from its indices; measured: the bf16 gather whose table
  XLA puts in VMEM steps in 38 cycles, jax/xla_placement.py); and grid_step_dim_cycles per grid
  dimension beyond the first, grid_step_operand_cycles per operand beyond two; the sum rounded to whole
  cycles. 0 without a chip (a recording) or with every one of these fields off (then no map is
  evaluated here)."""
  if not points or chip is None or not (
      chip.index_map_cycles or chip.index_map_plain_cycles or chip.index_map_smem_cycles
      or chip.index_map_subword_cycles or chip.grid_step_dim_cycles or chip.grid_step_operand_cycles):
    return 0
  total = (chip.grid_step_dim_cycles * max(0, len(grid) - 1)
           + chip.grid_step_operand_cycles * max(0, len(ops) - 2))
  smem = chip.index_map_smem_cycles
  if chip.index_map_subword_cycles and any(
      np.dtype(getattr(a, "dtype", np.int32)).itemsize < 4 for a in index_args):
    smem += chip.index_map_subword_cycles   # (a table of sub-word entries: each read extracts its entry)
  grid_idx = np.asarray(points, dtype=np.int64).reshape(len(points), -1)
  for _, o in ops:
    if o.mode == _ALIAS:   # (a view of a source already in VMEM: no copy waits for its indices, which
      continue             # the body's address arithmetic computes beside its vector work; session 34)
    blocks = o.all_blocks
    if blocks is None and o.prefetch is None and not o.map_on_core:
      blocks = _host_blocks(o, points, index_args)
    if blocks is None:
      total += smem
      continue
    if getattr(o.m.index_map, COMPUTED_INDEX_MAP, False) is True:
      total += chip.index_map_cycles
      continue
    offs = np.asarray(blocks, dtype=np.int64).reshape(len(points), -1)
    if offs.shape[1] != len(o.m.dims):   # (a map of the wrong rank: the step's own check names it)
      continue
    form = "const"
    for d, (_kind, size, _pad) in enumerate(o.m.dims):
      col = offs[:, d]
      if (col == col[0]).all():
        continue
      if any((col == grid_idx[:, c] * size).all() for c in range(grid_idx.shape[1])):
        form = "plain"
        continue
      form = "computed"
      break
    total += {"const": 0, "plain": chip.index_map_plain_cycles, "computed": chip.index_map_cycles}[form]
  return math.floor(total + 0.5)   # (whole cycles: the clocks stay ints, sim/steady.py)


class _Steps:
  """What `_steps` decides per grid point, over the state fixed before the first step: the body's
  positional arguments (lead, input blocks, output blocks, tail; updated in place), which operands
  are buffered, aliased or have per-step block offsets, and the core's own DMA start / wait, bound
  once (what PreparedCopy.start() / .wait() call on the current core, lang/tpu_primitives.py, without
  looking the core up per copy)."""
  __slots__ = ("ex", "points", "n", "index_args", "sync", "call_args", "buffered_in", "buffered_out",
               "per_step", "in_plan", "out_plan", "dma_start", "dma_wait", "grid", "grid_stack",
               "grid_step", "map_cycles", "maps_late", "wait_kept", "wait_next")

  def __init__(self, pipe: Pipeline, ex):
    ops_in, ops_out, lead = pipe.ops_in, pipe.ops_out, pipe.lead_args
    self.ex, self.points, self.n = ex, pipe.points, pipe.n
    self.index_args, self.sync = pipe.index_args, pipe.sync
    self.call_args = [*lead, *[o.hbm if o.mode == _RAW else None for o in ops_in + ops_out],
                      *pipe.tail_args]
    base_in, base_out = len(lead), len(lead) + len(ops_in)
    ins = [(base_in + k, o) for k, o in enumerate(ops_in) if o.mode != _RAW]
    outs = [(base_out + k, o) for k, o in enumerate(ops_out) if o.mode != _RAW]
    self.buffered_in = [o for _, o in ins if o.mode == _BUFFERED]
    self.buffered_out = [o for _, o in outs if o.mode == _BUFFERED]
    self.per_step = [o for _, o in ins + outs if o.all_blocks is None]
    # per input: (argument index, op, blocks of every step or None, alias?, how many steps ahead to
    # prefetch); per output: (argument index, op, blocks or None, alias?)
    self.in_plan = [(k, o, o.all_blocks, o.mode == _ALIAS,
                     0 if o.mode == _ALIAS else min(o.nbuf - 1, 1 if not o.m.use_lookahead else o.nbuf))
                    for k, o in ins]
    self.out_plan = [(k, o, o.all_blocks, o.mode == _ALIAS) for k, o in outs]
    self.dma_start, self.dma_wait = ex.dma_start, ex.dma_wait
    self.grid, self.grid_stack, self.grid_step = pipe.grid, ex.grid_stack, ex.grid_step
    chip = ex.chip if type(ex) is not _Recorder else None
    self.wait_kept = chip is not None and chip.wait_kept_write_backs
    self.wait_next = chip is not None and chip.wait_write_backs_next_step
    self.map_cycles = _index_map_cycles(ins + outs, pipe.points, pipe.index_args, pipe.grid, chip)
    self.maps_late = bool(self.map_cycles) and chip.index_map_after_starts

  def enter(self, s: int) -> None:
    """Grid step `s` up to its body: the step overhead, the input and output blocks."""
    point = self.points[s]
    self.grid_stack[-1] = (point, self.grid)
    self.grid_step()
    self.inputs(s, point)
    self.outputs(s, point)

  def inputs(self, s: int, point) -> None:
    """Start every missing current input block first (the prologue issues all of step 0's copies
    before waiting any), then per input wait the current block and prefetch ahead."""
    # (a block's element offsets: precomputed for every step, or its index map run now)
    dma_start, call_args, n, points, index_args = self.dma_start, self.call_args, self.n, self.points, \
        self.index_args
    if self.map_cycles and s and not self.maps_late:   # (hw.ChipSpec.index_map_cycles and beside it,
      self.ex.scalar_ops(self.map_cycles)                # measured on v5e: the next blocks' indices,
                                                         # before their copies start)
    for o in self.buffered_in:
      if s not in o.fetched:
        cur = o.all_blocks[s] if o.all_blocks is not None else block_offsets(o, s, point, index_args, "")
        if s == 0 or cur != o.cur:
          _start_fetch(o, s, cur, dma_start)
    # double buffering: every input's next block is started before any current block is waited
    # (JAX's order; one run of waits per step: the chip streams a read-only pipeline without a gap per
    # step and pays one DMA-wait sync per step, docs/timing-model.md 1.2)
    curs = []
    for k, o, blocks, alias, ahead in self.in_plan:
      cur = blocks[s] if blocks is not None else block_offsets(o, s, point, index_args, "")
      curs.append(cur)
      if ahead == 1:   # (0 for an aliased input)
        t = s + 1
        if t < n:
          nxt = blocks[t] if blocks is not None else block_offsets(o, t, points[t], index_args, "")
          if nxt != cur and t not in o.fetched:
            _start_fetch(o, t, nxt, dma_start)
    if self.maps_late and s:   # (the candidate rule's other placement: index_map_after_starts)
      self.ex.scalar_ops(self.map_cycles)
    for (k, o, blocks, alias, ahead), cur in zip(self.in_plan, curs):
      if alias:
        if s == 0 or cur != o.cur:
          o.cur = cur
          call_args[k] = _alias_view(o, cur, point)
        continue
      if s == 0 or cur != o.cur:
        slot, copy = o.fetched.pop(s)
        if copy is not None:
          self.dma_wait(copy)
        o.cur, o.cur_slot = cur, slot
        call_args[k] = o.slots[slot]
      if ahead > 1:    # lookahead: every changed block that fits the free slots
        prev = cur
        for t in range(s + 1, min(n, s + o.nbuf)):
          nxt = blocks[t] if blocks is not None else block_offsets(o, t, points[t], index_args, "")
          if nxt != prev and t not in o.fetched:
            _start_fetch(o, t, nxt, dma_start)
          prev = nxt

  def outputs(self, s: int, point) -> None:
    """Pick each output's slot for this step's block (after waiting the write-back that last used it)."""
    call_args, index_args = self.call_args, self.index_args
    for k, o, blocks, alias in self.out_plan:
      cur = blocks[s] if blocks is not None else block_offsets(o, s, point, index_args, "")
      if alias:
        if s == 0 or cur != o.cur:
          o.cur = cur
          call_args[k] = _alias_view(o, cur, point)
        continue
      if s == 0 or cur != o.cur:
        revisit = cur in o.written
        if revisit and not o.m.revisit_any:
          ex = self.ex
          raise SyncError(
              f"Revisited block for {o.m.name} at grid point {point} on chip {ex.chip_index} core "
              f"{ex.core_id}: output block at offsets {cur} was written back earlier and is visited "
              f"again non-consecutively, so the pipeline would overwrite it and lose data. Fix: put the "
              f"reduction axis last in the grid (mark it 'arbitrary') so revisits are consecutive, "
              f"or give the out spec pipeline_mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY), which "
              f"reads the block back before revisiting it.")
        slot = o.next_slot
        o.next_slot = slot + 1 if slot + 1 < o.nbuf else 0
        wb = o.pending_wb.pop(slot, None)
        if wb is not None:
          self.dma_wait(wb)
        if revisit:   # RevisitMode.ANY (one slot): the block's contents come back from memory first
          copy = _prepare(o, cur, slot, False)
          if copy is not None:
            self.dma_start(copy)
            self.dma_wait(copy)
        o.cur, o.cur_slot, o.cur_since = cur, slot, s
        call_args[k] = o.slots[slot]

  def write_backs(self, s: int) -> None:
    """Write back the output blocks that change next step (or at the last step). With the rule
    wait_write_backs_next_step (measured on v5e, on there), the write-backs still in flight from earlier
    steps are then waited: each is seen by the end of the step after the one that started it."""
    last = self.n - 1
    older = [(o, list(o.pending_wb.items())) for o in self.buffered_out if o.pending_wb] \
        if self.wait_next else ()
    for o in self.buffered_out:
      if s != last:
        nxt = o.all_blocks[s + 1] if o.all_blocks is not None else \
            block_offsets(o, s + 1, self.points[s + 1], self.index_args, "")
        if nxt == o.cur:
          continue
      o.written.add(o.cur)
      copy = o.prepare(o, o.cur, o.cur_slot, True)
      if copy is not None:
        self.dma_start(copy)
        if self.sync or (self.wait_kept and o.cur_since < s):   # (wait_kept: a candidate rule, off)
          self.dma_wait(copy)
        else:
          o.pending_wb[o.cur_slot] = copy
    for o, copies in older:
      for slot, copy in copies:
        self.dma_wait(copy)
        if o.pending_wb.get(slot) is copy:
          del o.pending_wb[slot]
    for o in self.per_step:
      o.blocks.pop(s, None)
