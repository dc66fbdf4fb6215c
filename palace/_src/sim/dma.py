"""DMA engines: transfer timing (L4b); the data of a copy moves in sim/memory.py (`memory.copy`).

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


class CopyPlan:
  """How one core times a copy between two memory spaces (computed once per core and direction):
  its `kind` ('hbm->vmem', ...), the `channels` it crosses as [(channel, bytes per byte)] (the core's
  DMA engine and the chip's HBM, HBM->HBM weighing 2 there; or the core's local channel), the
  completion latency and how many of its ends touch HBM (for the report's HBM traffic)."""
  __slots__ = ("kind", "channels", "latency_cycles", "hbm_sides")

  def __init__(self, kind: str, channels: list, latency_cycles: int, hbm_sides: int):
    self.kind, self.channels = kind, channels
    self.latency_cycles, self.hbm_sides = latency_cycles, hbm_sides


def plan(chip, src_space: MemorySpace, dst_space: MemorySpace, chans) -> CopyPlan:
  """The CopyPlan of a copy from `src_space` to `dst_space` on a core whose channels are `chans` =
  (DMA engine, HBM, local)."""
  kind = direction(src_space, dst_space)
  cls = _CLASS.get(kind) or _CLASS.setdefault(kind, _timing_class(kind))
  channels = [(chans[2], 1.0)] if cls == "local" else \
      [(chans[0], 1.0), (chans[1], 2.0 if cls == "hbm->hbm" else 1.0)]   # HBM->HBM: read + write
  return CopyPlan(kind, channels, _latency_cycles(chip, cls), _HBM_SIDES[cls])


def bytes_of(shape, itemsize: int) -> int:
  return int(math.prod(shape)) * itemsize
