"""DMA engines: transfer timing and data movement (L4b).

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

import math

import numpy as np

from palace._src.core import MemorySpace

_SPACE_LABEL = {MemorySpace.ANY: "hbm", MemorySpace.HBM: "hbm", MemorySpace.VMEM: "vmem",
                MemorySpace.VMEM_SHARED: "vmem", MemorySpace.CMEM: "vmem", MemorySpace.SMEM: "smem",
                MemorySpace.SEMAPHORE: "smem"}


class DmaRecord:
  """One in-flight copy."""
  __slots__ = ("req", "seq", "issue_cycle", "start_cycle", "done_cycle", "read_done_cycle", "moved",
               "core", "applied", "src_applied", "hbm_sides")

  def __init__(self, req, seq, core, issue_cycle=0, start_cycle=0, done_cycle=0, read_done_cycle=0,
               hbm_sides=0):
    self.req, self.seq, self.core = req, seq, core
    self.hbm_sides = hbm_sides
    self.moved = False
    self.applied = False
    self.src_applied = req.src_sem_buf is None
    self.issue_cycle, self.start_cycle = issue_cycle, start_cycle
    self.done_cycle, self.read_done_cycle = done_cycle, read_done_cycle


_DIRECTIONS: dict = {}


def direction(src_space: MemorySpace, dst_space: MemorySpace) -> str:
  """'hbm->vmem', 'vmem->hbm', 'hbm->hbm', 'vmem->smem', 'smem->vmem', 'vmem->vmem', 'hbm->smem', ..."""
  key = (src_space, dst_space)
  kind = _DIRECTIONS.get(key)
  if kind is None:
    kind = _DIRECTIONS[key] = f"{_SPACE_LABEL.get(src_space, 'vmem')}->{_SPACE_LABEL.get(dst_space, 'vmem')}"
  return kind


def _timing_class(kind: str) -> str:
  src, dst = kind.split("->")
  if src == "hbm":
    return "hbm->hbm" if dst == "hbm" else "read"
  return "write" if dst == "hbm" else "local"


_CLASS = {}           # kind -> timing class (memo of a pure function)
_HBM_SIDES = {"read": 1, "write": 1, "hbm->hbm": 2, "local": 0}


def hbm_sides(kind: str) -> int:
  """How many ends of a copy of this kind touch HBM (for the report's HBM traffic)."""
  cls = _CLASS.get(kind) or _CLASS.setdefault(kind, _timing_class(kind))
  return _HBM_SIDES[cls]


def _latency_cycles(chip, cls: str) -> int:
  if cls == "local":
    return chip.dma_local_latency_cycles
  lat_ns = {"read": chip.dma_hbm_to_vmem_latency_ns, "write": chip.dma_vmem_to_hbm_latency_ns,
            "hbm->hbm": chip.dma_hbm_to_hbm_latency_ns}[cls]
  return chip.ns_to_cycles(lat_ns)


def plan(chip, src_space: MemorySpace, dst_space: MemorySpace) -> tuple:
  """(kind, local?, HBM weight, completion latency cycles, HBM sides) of a copy between two memory
  spaces, computed once per core and direction."""
  kind = direction(src_space, dst_space)
  cls = _CLASS.get(kind) or _CLASS.setdefault(kind, _timing_class(kind))
  return kind, cls == "local", 2.0 if cls == "hbm->hbm" else 1.0, _latency_cycles(chip, cls), \
      _HBM_SIDES[cls]


def _add(cur, data):
  if cur.dtype.kind == "f" and cur.dtype.itemsize >= 4 or cur.dtype.kind in "iu":
    return cur + data.astype(cur.dtype, copy=False)
  return (cur.astype(np.float32) + data.astype(np.float32)).astype(cur.dtype)  # bf16 / fp8


_BORROW_MIN_BYTES = 64 * 1024  # below this a plain copy is cheaper than the borrowing bookkeeping


def move_data(req, borrow: bool = False) -> None:
  """Perform the copy on the NumPy storages (called once per DMA, at the policy's chosen moment).

  Indexed copies (SparseCore): `src_indices` gathers rows, `dst_indices` scatters them (np.add.at for
  add=True, so repeated indices accumulate); `mask` drops ignored index entries on the dense side.
  `borrow`: a plain copy of a whole VMEM buffer may view the source instead (Buffer.borrow)."""
  dst_buf = req.dst_buf
  src_buf = req.src_buf
  plain = not req.add and req.src_indices is None and req.dst_indices is None and req.mask is None
  if dst_buf.pending is not None and plain and req.dst_index == ():
    dst_buf.storage = np.empty(dst_buf.shape, dst_buf.dtype)  # overwritten whole: drop the old value
  pending = src_buf.pending
  if pending is not None and plain and req.src_index == () and dst_buf is not src_buf:
    dst = dst_buf.storage
    if dst is None:
      return
    if dst_buf.readers or dst_buf.borrowed is not None:
      dst_buf.detach_readers()
      dst = dst_buf._storage
    out = dst[req.dst_index]
    if out.shape == src_buf.shape and out.dtype == src_buf.dtype:
      pending.compute_into(out)  # a deferred value goes straight to its destination
      return
  # raw storages when nothing is pending (the common case; `storage` would compute a pending value)
  src = src_buf._storage if src_buf.pending is None else src_buf.storage
  dst = dst_buf._storage if dst_buf.pending is None else dst_buf.storage
  if src is None or dst is None:
    return
  if (plain and borrow and req.dst_index == () and dst.nbytes >= _BORROW_MIN_BYTES and
      not dst_buf.aliased and dst_buf.memory_space is MemorySpace.VMEM and not src_buf.aliased):
    view = src[req.src_index]
    if view.shape == dst.shape and view.dtype == dst.dtype:
      dst_buf.borrowed = None  # the old storage is not written: its readers keep valid views
      dst_buf.borrow(src_buf, view)
      return
  readers = dst_buf.readers
  if dst_buf.borrowed is not None or (readers and (len(readers) > 1 or readers[0]() is not None)):
    dst_buf.detach_readers()
    dst = dst_buf._storage  # unborrowing replaced it with a private copy
  elif readers:   # = detach_readers() when the one value that read the buffer is gone
    readers.clear()
  if plain:
    dst[req.dst_index] = src[req.src_index]
    return
  data = src[req.src_indices] if req.src_indices is not None else src[req.src_index]
  if req.dst_indices is not None:
    if req.mask is not None:
      data = data[req.mask]
    if req.add:
      np.add.at(dst, req.dst_indices, data.astype(dst.dtype, copy=False))
    else:
      dst[req.dst_indices] = data
    return
  if req.mask is not None:
    view = dst[req.dst_index]
    view[req.mask] = _add(view[req.mask], data) if req.add else data
    return
  dst[req.dst_index] = _add(dst[req.dst_index], data) if req.add else data


def bytes_of(shape, itemsize: int) -> int:
  return int(math.prod(shape)) * itemsize
