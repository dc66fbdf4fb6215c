"""SparseCore subcores of the virtual TPU (L4b).

Geometry per chip comes from hw.SparseCoreSpec ([tpu_info], docs/pallas/tpu/sparsecore.md): SparseCores
per device, 16 vector subcores each with its own VMEM (TileSpmem), a shared VMEM (Spmem) per SparseCore,
SIMD lanes per subcore and a DMA granule. Cost model (modelling assumptions, not fitted; the vector op
table is sim/cost.py's SPARSECORE_VECTOR_OPS):
  * a vector op costs one cycle per (lanes * packing) elements on the subcore's VPU; there is no MXU;
  * indexed DMAs move whole granules per row (the request's byte count is rounded per row);
  * each SparseCore's DMA engines share one channel at the chip's HBM bandwidth, and all cores of a
    chip share the HBM channel, so TensorCore and SparseCore traffic contend for bandwidth.
Core ids: TensorCores are 0..n-1; vector subcore s of SparseCore c is SC_BASE + c * subcores + s; the
scalar subcore of SparseCore c is SCALAR_BASE + c.
"""
from __future__ import annotations

from palace._src.core import MemorySpace
from palace._src.errors import UnsupportedError, UsageError
from palace._src.sim import cost
from palace._src.sim.bandwidth import Channel
from palace._src.sim.sync import SemaphoreWait
from palace._src.sim.tensorcore import TensorCore

SC_BASE = 64
SCALAR_BASE = 1024


class SparseSubcore(TensorCore):
  """A SparseCore vector or scalar subcore."""

  def __init__(self, machine, chip_index, core_id, axis_env, params, sc_index: int, subcore: int,
               scalar: bool):
    super().__init__(machine, chip_index, core_id, axis_env, params)
    spec = machine.chip.sparsecore
    self.sc_index = sc_index
    self.subcore = subcore
    self.scalar = scalar
    self.lanes = spec.num_lanes
    self.dma_granule_bytes = spec.dma_granule_bytes
    self.memory.vmem_limit = 0 if scalar else spec.vmem_bytes_per_subcore   # TileSpmem
    self.memory.vmem_total_limit = None   # (TileSpmem is the capacity: no TensorCore VMEM)
    self.memory.vmem_shared_limit = spec.vmem_shared_bytes                  # Spmem
    self.share_group = (chip_index, "sc", sc_index)
    self.label = f"sc{sc_index} scalar" if scalar else f"sc{sc_index} subcore {subcore}"
    self.barrier_gen = 0
    self.sparsecore = self    # the SparseCore sub-protocol (executor.SparseCoreExecutor)

  def alloc(self, mem_type, name: str, shared: bool = False):
    """Scalar subcores have no TileSpmem: in an MPMD kernel their VMEM scratch entries are None."""
    if self.scalar and getattr(mem_type, "memory_space", None) == MemorySpace.VMEM:
      self.alloc_seq += 1
      return None
    return super().alloc(mem_type, name, shared)

  def dma_channels(self):
    hbm = self.machine.channels(self.chip_index, 0)[1]
    return sparsecore_channels(self.machine, self.chip_index, self.sc_index, hbm)

  def where(self) -> str:
    gp = f"at grid point {self.grid_stack[-1][0]} " if self.grid_stack else ""
    return f"{gp}on chip {self.chip_index} SparseCore {self.sc_index} " + (
        "scalar subcore" if self.scalar else f"vector subcore {self.subcore}") + \
        f" in kernel '{self.kernel_name}'"

  def vector_op(self, op_class: str, shape, dtype, ready: int, links: int = 0) -> int:
    # (`links`, a TensorCore reduction's accumulation chain, is not measured on SparseCores: their
    # vector ops keep the one cost of cost.sparsecore_vector_cost)
    unit, busy, lat = cost.sparsecore_vector_cost(self.lanes, op_class, shape, dtype)
    if unit is None:
      return ready
    return self._issue(unit, busy, lat, ready, op_class)

  def subcore_barrier(self) -> None:
    """Wait until every vector subcore of this SparseCore reached its barrier of the same number; each
    leaves at the cycle the last one arrived. Every subcore has its own barrier semaphore, and each
    arrival lands on all of them, so each subcore settles (and, for race detection, acquires) every
    peer's arrival itself (one shared count would release the waiters with the first one's settling,
    at their own earlier clocks)."""
    if self.scalar:
      raise UnsupportedError("plsc.subcore_barrier() on a scalar subcore: it synchronises the vector "
                             "subcores of a SparseCore. Fix: call it in a plsc.VectorSubcoreMesh kernel.")
    m = self.machine
    sems = m.sems
    group = self.share_group
    peers = [c for c in m.cores if getattr(c, "share_group", None) == group
             and not getattr(c, "scalar", True)]
    self.barrier_gen += 1
    self.now += self.chip.scalar_op_cycles
    for c in peers:   # (releases this subcore's clock for race detection)
      sems.arrive(sems.keyed(("subcore_barrier", group, c.subcore)), self.now, 1)
    sem = sems.keyed(("subcore_barrier", group, self.subcore))
    target = self.barrier_gen * len(peers)
    t = sems.settle(sem, target)
    if t is not None:   # the last to arrive: the waiting peers leave at its cycle, and run first
      sched = m.sched
      for c in peers:
        if c is not self and c.blocked_on is not None and c.blocked_on.name == "subcore barrier":
          sched.ready_at(c, self.now)
      if sched.yields:
        sched.maybe_yield(self)
    while t is None:
      self.blocked_on = SemaphoreWait("subcore barrier", target, sem, None, self.machine.site())
      m.sched.block(self)
      self.blocked_on = None
      t = sems.settle(sem, target)
    self.now = max(self.now, t)

  def peer_subcore_buffer(self, buf, subcore: int):
    spec = self.machine.chip.sparsecore
    if not 0 <= subcore < spec.num_subcores:
      raise UsageError(f"subcore_id={subcore} {self.where()}: a SparseCore has {spec.num_subcores} "
                       f"vector subcores. Fix: pass subcore_id in 0..{spec.num_subcores - 1}.")
    return self.machine.peer_buffer(buf, self.chip_index, SC_BASE + self.sc_index * spec.num_subcores
                                    + subcore, self)

  def matmul(self, m, k, n, batch, lhs_dtype, rhs_dtype, ready: int, weights=None) -> int:
    raise UnsupportedError(
        f"Matrix multiplication {self.where()}: SparseCores have no MXU. Fix: run matmuls on the "
        f"TensorCore (an MPMD pl.kernel can combine a TensorCoreMesh body with SparseCore bodies).")


def sparsecore_channels(machine, chip_index: int, sc_index: int, hbm: Channel):
  key = (chip_index, "sc", sc_index)
  ch = machine._chans.get(key)
  if ch is None:
    clock = machine.chip.clock_hz
    ch = machine._chans[key] = (Channel("sc-dma", machine.chip.hbm_bytes_per_s_per_device, clock), hbm,
                                Channel("sc-local", machine.chip.vmem_vmem_dma_bytes_per_s, clock))
  return ch
