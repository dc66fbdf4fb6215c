"""Software pipelining of BlockSpec'd operands (L5, library code).

Built only from language primitives (run_scoped, make_async_copy/.start/.wait, grid_step): the overlap
of DMA and compute, the skipped copies for unchanged blocks and the revisit behaviour all come out of
the DMA and semaphore model, not out of special cases in the simulator. `pallas_call` and
`emit_pipeline` both run on `run_pipeline`.

Schedule per input (buffer_count b): at step s, blocks for steps s+1 .. s+b-1 whose index changes are
fetched into free slots (b=1: fetched at the step that needs them), then the block of step s is waited.
Per output: a changed block takes the next slot (after waiting the write-back that last used it); the
block is written back when the next step's index differs or at the last step; all write-backs are waited
at the end. Ragged edge blocks copy only their in-bounds part: padding reads whatever the slot held
(NaN for fresh floats) and out-of-bounds writes are dropped, as on TPU.
"""
from __future__ import annotations

import itertools

from palace._src import executor
from palace._src.blocks import ELEMENT, SQUEEZED, BlockMapping
from palace._src.core import MemoryRef, MemorySpace, SemaphoreType
from palace._src.errors import OutOfBoundsError, SyncError
from palace._src.lang.array import concrete_int
from palace._src.lang.primitives import run_scoped
from palace._src.lang.refs import Ref, Slice
from palace._src.lang.tpu_primitives import AsyncCopyDescriptor, sync_copy


_PIPELINE_SITE = ("<pipeline of BlockSpec'd operands>", 0)


class _Op:
  """Pipeline state of one operand."""
  __slots__ = ("m", "hbm", "slots", "sems", "is_out", "blocks", "cur", "cur_slot", "fetched",
               "next_slot", "pending_wb", "written", "squeezed", "sem_views")

  def __init__(self, m: BlockMapping, hbm: Ref, is_out: bool):
    self.m, self.hbm, self.is_out = m, hbm, is_out
    self.blocks = {}        # step -> element offsets (cached index-map results)
    self.fetched = {}       # step -> (slot, descriptor or None)
    self.next_slot = 0
    self.cur = None
    self.cur_slot = 0
    self.pending_wb = {}    # slot -> descriptor
    self.written = set()
    self.squeezed = frozenset(d for d, (k, _, _) in enumerate(m.dims) if k == SQUEEZED)
    self.sem_views = ()


def _copy_views(op: _Op, offsets, slot: int):
  """(hbm view, vmem view) for the in-bounds part of the block at `offsets` (None if none is)."""
  m = op.m
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


def _block_offsets(op: _Op, step: int, point, index_args, where) -> tuple:
  hit = op.blocks.get(step)
  if hit is not None:
    return hit
  m = op.m
  idx = m.index_map(*point, *index_args)
  if not isinstance(idx, (tuple, list)):
    idx = (idx,)
  if len(idx) != len(m.dims):
    raise OutOfBoundsError(f"index_map of {m.name} returned {len(idx)} indices {tuple(idx)!r} for an "
                           f"array of rank {len(m.dims)} at grid point {point}; expected one per dim.")
  idx = tuple(concrete_int(i, f"index_map result for {m.name}") for i in idx)
  offsets = m.offsets(idx)
  ex = executor.current()
  if ex.bounds_checks:
    for d, ((kind, size, pad), off, dim) in enumerate(zip(m.dims, offsets, m.array_shape)):
      limit_lo = -pad if kind == ELEMENT else 0
      if off < limit_lo or off >= dim + (pad if kind == ELEMENT else 0):
        raise OutOfBoundsError(
            f"Block index out of bounds for {m.name} (shape {m.array_shape}) at grid point {point} "
            f"{where}: index_map returned {idx}, i.e. element offset {off} in dim {d} of size {dim}. "
            f"Check the index_map and the grid.")
  op.blocks[step] = offsets
  return offsets


def run_pipeline(body, grid, in_maps, out_maps, in_refs, out_refs, *, lead_args=(), tail_args=(),
                 tail_kwargs=None, index_args=(), points=None):
  """Run `body(*lead, *in_blocks, *out_blocks, *tail, **tail_kwargs)` over the grid, pipelined."""
  ex = executor.current("a pipeline")
  grid = tuple(int(g) for g in grid)
  if points is None:
    points = list(itertools.product(*[range(g) for g in grid]))
  n = len(points)
  ops_in = [_Op(m, r, False) for m, r in zip(in_maps, in_refs)]
  ops_out = [_Op(m, r, True) for m, r in zip(out_maps, out_refs)]
  piped = [o for o in ops_in + ops_out if o.m.pipelined]
  alloc_types = []
  for o in piped:
    alloc_types.append(([MemoryRef(o.m.block_shape, o.m.dtype, MemorySpace.VMEM)
                         for _ in range(o.m.buffer_count)], SemaphoreType.DMA((o.m.buffer_count,))))

  def with_buffers(*allocs):
    for o, (slots, sems) in zip(piped, allocs):
      o.slots, o.sems = slots, sems
      for r in slots:  # errors on the kernel's block refs name the operand (args[0], outputs[1])
        r.buf.name = f"{o.m.name} block"
      o.sem_views = [sems.at[i] for i in range(o.m.buffer_count)]
    _steps(ex, body, grid, points, n, ops_in, ops_out, lead_args, tail_args, tail_kwargs or {},
           index_args)

  if not n:
    return
  run_scoped(with_buffers, *alloc_types)


def _steps(ex, body, grid, points, n, ops_in, ops_out, lead_args, tail_args, tail_kwargs, index_args):
  ex.grid_stack.append((points[0], grid))
  try:
    _steps_inner(ex, body, grid, points, n, ops_in, ops_out, lead_args, tail_args, tail_kwargs,
                 index_args)
  finally:
    ex.grid_stack.pop()


def _start_fetch(op: _Op, step: int, offsets):
  slot = op.next_slot
  op.next_slot = (slot + 1) % op.m.buffer_count
  views = _copy_views(op, offsets, slot)
  desc = None
  if views is not None:
    desc = AsyncCopyDescriptor(views[0], views[1], op.sem_views[slot], site=_PIPELINE_SITE)
    desc.start()
  op.fetched[step] = (slot, desc)


def _steps_inner(ex, body, grid, points, n, ops_in, ops_out, lead_args, tail_args, tail_kwargs,
                 index_args):
  kernel_refs_in = [None] * len(ops_in)
  kernel_refs_out = [None] * len(ops_out)
  for k, o in enumerate(ops_in + ops_out):
    if not o.m.pipelined:
      ref = o.hbm
      (kernel_refs_in if not o.is_out else kernel_refs_out)[k if not o.is_out else k - len(ops_in)] = ref
  for s in range(n):
    point = points[s]
    ex.grid_stack[-1] = (point, grid)
    ex.grid_step()
    # ---- inputs: prefetch ahead, then wait the current block
    for k, o in enumerate(ops_in):
      if not o.m.pipelined:
        continue
      cur = _block_offsets(o, s, point, index_args, "")
      if s == 0 or cur != o.cur:
        if s not in o.fetched:
          _start_fetch(o, s, cur)
        slot, desc = o.fetched.pop(s)
        if desc is not None:
          desc.wait()
        o.cur, o.cur_slot = cur, slot
        kernel_refs_in[k] = o.slots[slot]
      ahead = o.m.buffer_count - 1
      prev = cur
      for t in range(s + 1, min(n, s + 1 + ahead)):
        nxt = _block_offsets(o, t, points[t], index_args, "")
        if nxt != prev and t not in o.fetched:
          _start_fetch(o, t, nxt)
        prev = nxt
        if not o.m.use_lookahead:
          break
    # ---- outputs: pick the slot for this step's block
    for k, o in enumerate(ops_out):
      if not o.m.pipelined:
        continue
      cur = _block_offsets(o, s, point, index_args, "")
      if s == 0 or cur != o.cur:
        if cur in o.written:
          raise SyncError(
              f"Revisited block for {o.m.name} at grid point {point} on chip {ex.chip_index} core "
              f"{ex.core_id}: output block at offsets {cur} was written back earlier and is visited "
              f"again non-consecutively, so the pipeline would overwrite it and lose data. Put the "
              f"reduction axis last in the grid (mark it 'arbitrary') so revisits are consecutive.")
        slot = o.next_slot
        o.next_slot = (slot + 1) % o.m.buffer_count
        wb = o.pending_wb.pop(slot, None)
        if wb is not None:
          wb.wait()
        o.cur, o.cur_slot = cur, slot
        kernel_refs_out[k] = o.slots[slot]
    body(*lead_args, *kernel_refs_in, *kernel_refs_out, *tail_args, **tail_kwargs)
    # ---- outputs: write back blocks that change next step (or at the end)
    for o in ops_out:
      if not o.m.pipelined:
        continue
      last = s == n - 1
      if not last:
        nxt = _block_offsets(o, s + 1, points[s + 1], index_args, "")
      if last or nxt != o.cur:
        o.written.add(o.cur)
        views = _copy_views(o, o.cur, o.cur_slot)
        if views is not None:
          desc = AsyncCopyDescriptor(views[1], views[0], o.sem_views[o.cur_slot], site=_PIPELINE_SITE)
          desc.start()
          o.pending_wb[o.cur_slot] = desc
    for o in ops_in:
      o.blocks.pop(s, None)
    for o in ops_out:
      o.blocks.pop(s, None)
  for o in ops_out:
    for desc in o.pending_wb.values():
      desc.wait()
    o.pending_wb.clear()


def copy_whole(src: Ref, dst: Ref) -> None:
  sync_copy(src, dst)
