"""One TensorCore of the virtual TPU: implements the executor protocol (L4b).

Time model of the core (cycles of the chip clock):
  * `now` is the in-order issue point of the scalar core. Every vector op issues at or after `now` and
    after its unit is free; issuing moves `now` to the op's start (in-order VLIW issue), so the scalar
    core cannot run more than one op ahead of a busy unit.
  * An op's result is ready at max(start + busy, inputs ready + latency): consumers stream behind their
    producers, as the pipelined VLIW schedule does; only the MXU fill/drain latency is exposed.
  * Waits (DMA, semaphores) move `now` to the moment the awaited count arrived.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from palace._src.core import Buffer, MemoryRef, MemorySpace, SemaphoreRefType
from palace._src.errors import ResourceError, SyncError, UsageError
from palace._src.sim import cost
from palace._src.sim.bandwidth import reserve2
from palace._src.sim.dma import DmaRecord, move_data, plan
from palace._src.util import fmt_bytes, fmt_site, prod, user_site

_SMEM = MemorySpace.SMEM
_SENTINEL = {np.dtype(np.int32): np.iinfo(np.int32).min, np.dtype(np.int16): np.iinfo(np.int16).min,
             np.dtype(np.int8): np.iinfo(np.int8).min}


_LAZY_FILL_BYTES = 64 * 1024  # VMEM buffers this large start with a pending fill instead of one


class _Fill:
  """The uninitialised contents of a fresh VMEM buffer (NaN / int sentinel) as a pending value: written
  only if something reads the buffer before a whole-buffer store or DMA replaces it."""
  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value

  def compute_into(self, out) -> None:
    out.fill(self.value)


class SemSlot:
  """Arrivals on one semaphore element: applied `value` plus pending (cycle, seq, amount, dma)."""
  __slots__ = ("value", "pending")

  def __init__(self):
    self.value = 0
    self.pending = []


class TensorCore:
  """Executor for one core. `machine` owns chips, channels, the scheduler and the trace."""

  def __init__(self, machine, chip_index: int, core_id: int, axis_env: dict, params):
    self.machine = machine
    self.chip = machine.chip
    self.chip_index = chip_index
    self.core_id = core_id
    self.axis_env = dict(axis_env)
    self.timing_only = machine.timing_only
    self.bounds_checks = not params.disable_bounds_checks
    self.semaphore_checks = not params.disable_semaphore_checks
    self.checks = machine.checks if self.bounds_checks else machine.unchecked_checks()
    # whole-buffer stores may leave deferred values (lang/deferred.py) unless a checker follows storage
    self.deferred_values = self.checks is None and not self.timing_only
    self.host_cache = {}      # the language side's host caches for this launch (opaque to the machine)
    self._poll, self._polls = None, 0   # semaphore_read polling (livelock detection)
    self.unused_dmas = {}     # descriptors made but never started nor waited: key -> (site, text, desc)
    self.grid_stack = []
    self.kernel_name = machine.kernel_name
    self.now = 0
    self.unit_free = dict.fromkeys(cost.UNITS, 0)
    self.unit_busy = dict.fromkeys(cost.UNITS, 0)
    self.horizon = 0
    self.compute_done = 0     # latest result of any vector/MXU op (drained at grid-step boundaries)
    self.flops = 0
    limit = params.vmem_limit_bytes
    if limit is not None and limit > self.chip.vmem_bytes:
      raise ResourceError(
          f"vmem_limit_bytes={limit} ({fmt_bytes(limit)}) for kernel '{self.kernel_name}' exceeds the "
          f"physical VMEM of {self.chip.name} ({fmt_bytes(self.chip.vmem_bytes)} per TensorCore). "
          f"Lower vmem_limit_bytes or the block sizes.")
    self.vmem_limit = (limit or self.chip.default_scoped_vmem_bytes) - self.chip.internal_scratch_bytes
    self.vmem_used = 0
    self.vmem_peak = 0
    self.smem_used = 0
    self.sem_buffers = []
    self.live = {}            # id(buf) -> what (for the allocation breakdown in errors)
    self.trace = machine.trace
    self.tid = (chip_index, core_id)
    self.blocked_on = None
    self.alloc_seq = 0
    self.steps = 0            # grid steps run on this core (pallas_call and emit_pipeline)
    self._chans = None        # this core's DMA channels (resolved at the first copy)
    self._dma_plans = {}      # (id(src space), id(dst space)) -> dma.plan
    self._dma_issue = self.chip.dma_issue_cycles
    self._scalar_cycles = self.chip.scalar_op_cycles
    self._step_cycles = self.chip.grid_step_overhead_cycles
    self._dma_stats = None    # the trace's (dma_bytes, dma_count) counters
    self._dma_fast = {}       # (src space, dst space, semaphore) ids -> (self, plan, slot)
    self._eager = machine.dma_policy.name == "eager"
    self._vcost = {}          # memo of cost.vector_cost / matmul_cycles for this launch
    self._mcost = {}
    self.share_group = (chip_index,)   # cores that see the same shared allocations
    self.vmem_shared_limit = self.chip.vmem_bytes  # TensorCores: VMEM_SHARED is modelled as VMEM
    self.dma_granule_bytes = 0
    self.label = f"core {core_id}"
    self.mesh_axes = []       # [(axis name, size)] of the core-level mesh this core runs in
    self.core_id_base = 0     # core id of mesh position 0 (SparseCore subcores are numbered apart)
    self.named_buffers = {}   # key -> Buffer, to find "the same" buffer on another core or chip

  # ------------------------------------------------------------------ messages
  def where(self) -> str:
    gp = f"at grid point {self.grid_stack[-1][0]} " if self.grid_stack else ""
    return f"{gp}on chip {self.chip_index} core {self.core_id} in kernel '{self.kernel_name}'"

  def debug_print(self, text: str) -> None:
    self.machine.debug_print(text)

  # ------------------------------------------------------------------ compute
  def _issue(self, unit: str, busy: int, latency: int, ready: int, what: str) -> int:
    """Issue `busy` cycles on `unit` (in order after its previous op); the result is ready `latency`
    cycles after it ends, or at `ready` if its operands come later. The one issue model of every
    vector, MXU, load and store op."""
    unit_free = self.unit_free
    now = self.now
    free = unit_free[unit]
    start = self.now = now if now > free else free
    end = unit_free[unit] = start + busy
    self.unit_busy[unit] += busy
    done = (end if end > ready else ready) + latency
    if done > self.compute_done:
      self.compute_done = done
      if done > self.horizon:
        self.horizon = done
    trace = self.trace
    if trace.on:
      ev = trace.events
      if len(ev) < trace.cap:   # = trace.add, inlined (the hottest trace site)
        ev.append((self.tid, unit, what, start, end, None))
      else:
        trace.add(self.tid, unit, what, start, end)
    return done

  def _vector_cost(self, op_class: str, shape, dtype=None):
    """cost.vector_cost, memoised per core (a pure function of the chip and the arguments)."""
    key = (op_class, shape, dtype)
    hit = self._vcost.get(key)
    if hit is None:
      hit = self._vcost[key] = cost.vector_cost(self.chip, op_class, shape, dtype)
    return hit

  def vector_op(self, op_class: str, shape, dtype, ready: int) -> int:
    key = (op_class, shape, None)   # = self._vector_cost(op_class, shape), inlined
    hit = self._vcost.get(key)
    if hit is None:
      hit = self._vcost[key] = cost.vector_cost(self.chip, op_class, shape, None)
    unit, busy, lat = hit
    if unit is None:
      return ready
    return self._issue(unit, busy, lat, ready, op_class)

  def matmul(self, m, k, n, batch, lhs_dtype, rhs_dtype, ready: int) -> int:
    key = (m, k, n, batch, lhs_dtype, rhs_dtype)
    hit = self._mcost.get(key)
    if hit is None:
      hit = self._mcost[key] = (*cost.matmul_cycles(self.chip, m, k, n, batch, lhs_dtype, rhs_dtype),
                                cost.matmul_flops(m, k, n, batch), f"matmul {m}x{k}x{n}")
    busy, lat, flops, label = hit
    self.flops += flops
    return self._issue("mxu", busy, lat, ready, label)

  def scalar_op(self, ready: int = 0) -> int:
    cycles = self._scalar_cycles
    now = self.now = self.now + cycles
    self.unit_busy["scalar"] += cycles
    return now if now > ready else ready

  # ------------------------------------------------------------------ memory
  def load(self, buf: Buffer, index, shape, site=None):
    if self.checks is not None:
      alt = self.checks.load(self, buf, index, shape)
      if alt is not None:
        buf, index = alt
    space = buf.memory_space
    if not shape or space == MemorySpace.SMEM:
      self.now += self.chip.scalar_op_cycles
      ready = self.now if self.now > buf.ready_cycle else buf.ready_cycle
      data = None if buf.storage is None else buf.storage[index]
      if data is not None and not isinstance(data, np.ndarray):
        data = np.asarray(data)
      return (data if data is None or data.shape == () else data.copy()), ready
    hit = self._vcost.get(("load", shape, buf.dtype))
    if hit is None:
      hit = self._vector_cost("load", shape, buf.dtype)
    ready = self._issue("vld", hit[1], hit[2], buf.ready_cycle, "load")
    pending = buf.pending
    if pending is not None:
      if index == () and type(pending) is not _Fill:
        return pending, ready  # a deferred value read whole stays deferred (Buffer.pending)
      storage = buf.storage
    else:
      storage = buf._storage
    if self.timing_only or storage is None:
      return None, ready
    if buf.aliased:
      return np.array(storage[index], copy=True), ready
    ro = buf._ro   # zero-copy: writers detach the view first (Buffer.detach_readers)
    if ro is None:
      ro = buf._ro = storage.view()
      ro.setflags(write=False)
    view = ro[index]   # read-only, as a view of a read-only view
    if view.base is None:   # (an index that copies)
      view.flags.writeable = False
    return view, ready

  def store(self, buf: Buffer, index, shape, data, ready: int) -> None:
    if self.checks is not None:
      alt = self.checks.store(self, buf, index, shape, data)
      if alt is not None:
        index, data = alt
    if index == () and data is not None and type(data) is not np.ndarray and \
        hasattr(data, "compute_into"):
      buf.defer(data)  # the language side checked: whole VMEM buffer, same shape and dtype
      storage = data = None
    else:
      if buf.pending is not None:
        if index == ():
          buf.storage = np.empty(buf.shape, buf.dtype)  # overwritten whole: never compute the old value
        storage = buf.storage
      else:
        storage = buf._storage
    if storage is not None and data is not None:
      if (index == () and data.base is None and self.checks is None and not buf.aliased
          and type(data) is np.ndarray and data.dtype == storage.dtype and data.shape == storage.shape
          and (flags := data.flags).writeable and flags.c_contiguous):
        # a whole-buffer store of a fresh result: adopt the array instead of copying it. The old
        # memory is not written, so views of it (loads, a lender's storage) stay valid; the stored
        # value is made a copy-on-write reader by Ref.__setitem__.
        buf.borrowed = buf.pending = buf._ro = None   # = buf.storage = data, inlined
        buf._storage = data
      else:
        if buf.readers or buf.borrowed is not None:
          buf.detach_readers()
          storage = buf.storage
        storage[index] = data
    if not shape or buf.memory_space is _SMEM:
      self.now += self.chip.scalar_op_cycles
      done = self.now if self.now > ready else ready
    else:
      hit = self._vcost.get(("store", shape, buf.dtype))
      if hit is None:
        hit = self._vector_cost("store", shape, buf.dtype)
      done = self._issue(hit[0], hit[1], hit[2], ready, "store")
    if done > buf.ready_cycle:
      buf.ready_cycle = done

  def note_access(self, buf: Buffer, index, kind: str, shape, atomic: bool = False) -> None:
    """A read ('r') or write ('w') of `buf[index]` the language side performs itself (SparseCore
    vector gathers, scatters, expanded loads, compressed stores, fetch_and_add): shown to the race
    detector like a vector load or store (not for `atomic` updates) and to the uninitialised-read
    tracker. `index` may hold index arrays."""
    checks = self.checks
    if checks is None:
      return
    if checks.races is not None and not atomic:
      checks.races.access(self, buf, index, kind, shape)
    if checks.init is not None:
      if kind == "r":
        checks.init.check_read(self, buf, index)
      else:
        checks.init.mark(buf, index)

  def dma_channels(self):
    return self.machine.channels(self.chip_index, self.core_id)

  def alloc(self, mem_type, name: str, shared: bool = False) -> Buffer:
    """Allocate on this core. `shared`: one buffer for every core running this program (the first
    core allocates, the others get the same buffer: `run_scoped(collective_axes=...)`). VMEM_SHARED
    allocations are always shared by the cores of this core's share group (a SparseCore)."""
    self.alloc_seq += 1
    key = (name, self.alloc_seq)
    if getattr(mem_type, "memory_space", None) == MemorySpace.VMEM_SHARED:
      shared = True
    if shared:
      buf = self.machine.shared_buffers.get((self.share_group, key))
      if buf is not None:
        self.named_buffers[key] = buf
        return buf
    buf = self._alloc(mem_type, name)
    buf.key = key
    self.named_buffers[key] = buf
    if shared:
      self.machine.shared_buffers[(self.share_group, key)] = buf
    return buf

  def _alloc(self, mem_type, name: str) -> Buffer:
    if isinstance(mem_type, SemaphoreRefType):
      count = prod(mem_type.shape)
      in_use = sum(prod(b.shape) for b in self.sem_buffers)
      cap = self.chip.semaphores_per_core
      if in_use + count > cap:
        raise ResourceError(
            f"Semaphores over capacity for {name} {self.where()}: {in_use} in use + {count} requested "
            f"{mem_type.kind} semaphores > {cap} per core on {self.chip.name}. Fix: reuse semaphores "
            f"(one per in-flight DMA slot, e.g. SemaphoreType.DMA((2,)) for double buffering) instead of "
            f"one per copy.")
      storage = np.zeros(mem_type.shape, np.int32)
      buf = Buffer(storage, mem_type.shape, np.dtype(np.int32), MemorySpace.SEMAPHORE, name, self,
                   self.chip_index, sem_kind=mem_type.kind)
      self.sem_buffers.append(buf)
      return buf
    if not isinstance(mem_type, MemoryRef):
      raise UsageError(f"Cannot allocate {name}: {mem_type!r} is not a memory type; use pltpu.VMEM(shape,"
                       f" dtype), pltpu.SMEM(...) or pltpu.SemaphoreType.")
    space = mem_type.memory_space
    nbytes = mem_type.nbytes
    if space == MemorySpace.VMEM_SHARED:
      if nbytes > self.vmem_shared_limit:
        raise ResourceError(
            f"VMEM_SHARED over capacity for {name} {self.where()}: {fmt_bytes(nbytes)} requested but "
            f"the shared VMEM holds {fmt_bytes(self.vmem_shared_limit)}. Use smaller buffers.")
    elif space in (MemorySpace.VMEM, MemorySpace.ANY):
      space = MemorySpace.VMEM
      if self.vmem_used + nbytes > self.vmem_limit:
        raise ResourceError(self._vmem_message(name, nbytes))
      self.vmem_used += nbytes
      self.vmem_peak = max(self.vmem_peak, self.vmem_used)
    elif space == MemorySpace.SMEM:
      if self.smem_used + nbytes > self.chip.smem_bytes:
        raise ResourceError(
            f"SMEM over capacity for {name} on chip {self.chip_index} core {self.core_id} in kernel "
            f"'{self.kernel_name}': {fmt_bytes(self.smem_used)} in use + {fmt_bytes(nbytes)} requested "
            f"> {fmt_bytes(self.chip.smem_bytes)} on {self.chip.name}. Keep SMEM for scalars and small "
            f"index tables; move arrays to VMEM.")
      self.smem_used += nbytes
    if space == MemorySpace.VMEM and self.deferred_values and nbytes >= _LAZY_FILL_BYTES:
      # the uninitialised value is written only if something reads the buffer before overwriting it
      buf = Buffer(None, mem_type.shape, mem_type.dtype, space, name, self, self.chip_index)
      buf.defer(_Fill(self._fill_value(mem_type.dtype)))
    else:
      storage = self._fresh_storage(mem_type.shape, mem_type.dtype, space)
      buf = Buffer(storage, mem_type.shape, mem_type.dtype, space, name, self, self.chip_index)
    self.live[id(buf)] = (name, nbytes, space)
    return buf

  def _fresh_storage(self, shape, dtype, space):
    if self.timing_only and space != MemorySpace.SMEM:
      return None
    return np.full(shape, self._fill_value(dtype), dtype)

  @staticmethod
  def _fill_value(dtype):
    if dtype.kind == "f" or str(dtype) in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
      return np.nan  # uninitialised scratch reads as NaN (floats)
    return _SENTINEL.get(dtype, 0)

  def _vmem_message(self, name, nbytes) -> str:
    rows = "; ".join(f"{n} {fmt_bytes(b)}" for n, b, s in self.live.values()
                     if s in (MemorySpace.VMEM, MemorySpace.VMEM_SHARED))
    return (f"VMEM over capacity on chip {self.chip_index} core {self.core_id} in kernel "
            f"'{self.kernel_name}': {name} needs {fmt_bytes(nbytes)} but {fmt_bytes(self.vmem_used)} of "
            f"the {fmt_bytes(self.vmem_limit)} scoped limit is in use ({rows or 'nothing else'}). "
            f"Reduce block sizes or buffer counts, or raise CompilerParams(vmem_limit_bytes=...).")

  def free(self, buf: Buffer) -> None:
    self.named_buffers.pop(buf.key, None)
    if self.checks is not None:
      self.checks.free(self, buf)
    if buf.core is not self:
      return  # a shared allocation owned by another core
    info = self.live.pop(id(buf), None)
    if info is None:
      if buf.sem_kind is not None:
        self._check_sem_zero(buf, "at the end of its run_scoped region")
        self.sem_buffers.remove(buf)
      return
    _, nbytes, space = info
    if space in (MemorySpace.VMEM, MemorySpace.VMEM_SHARED):
      self.vmem_used -= nbytes
    elif space == MemorySpace.SMEM:
      self.smem_used -= nbytes

  # ------------------------------------------------------------------ DMA
  def dma_start(self, req) -> None:
    if req.device_id is not None or req.core_index is not None or self.checks is not None:
      return self._dma_start_general(req)
    # a local copy with no checker (the common case): the general path's steps, in the same order
    issue = self._dma_issue
    now = self.now = self.now + issue
    self.unit_busy["scalar"] += issue
    m = self.machine
    m._seq = seq = m._seq + 1
    src_buf, dst_buf = req.src_buf, req.dst_buf
    src_ready = src_buf.ready_cycle
    start = now if now > src_ready else src_ready
    dst_space = dst_buf.memory_space
    fast = req.fast   # (this core, plan, semaphore slot or None): per request, shared per key
    if fast is None or fast[0] is not self:
      sem_buf = req.sem_buf
      key = (id(src_buf.memory_space), id(dst_space), id(sem_buf), req.sem_index)
      fast = self._dma_fast.get(key)
      if fast is None:
        fast = self._dma_fast[key] = (self, self._dma_plan(src_buf.memory_space, dst_space),
                                      None if sem_buf is None else m.slot(sem_buf, req.sem_index))
      req.fast = fast
    p, slot = fast[1], fast[2]
    kind = p[0]
    chans = self._chans
    if chans is None:
      chans = self._chans = self.dma_channels()
    nbytes = req.nbytes
    if p[1]:
      s, read_done = chans[2].reserve(start, nbytes)
    else:
      s, read_done = reserve2(chans[0], 1.0, chans[1], p[2], start, nbytes)
    done = math.ceil(read_done) + p[3]   # = dma.planned_timing, inlined
    rec = DmaRecord(req, seq, self, now, s, done, read_done, p[4])
    if done > self.horizon:
      self.horizon = done
    stats = self._dma_stats
    if stats is None:
      stats = self._dma_stats = (self.trace.events.stats["dma_bytes"],
                                 self.trace.events.stats["dma_count"])
    per_kind = stats[0]   # = trace.count_dma(kind, nbytes), inlined
    per_kind[kind] = per_kind.get(kind, 0) + int(nbytes)
    per_kind = stats[1]
    per_kind[kind] = per_kind.get(kind, 0) + 1
    trace = self.trace
    if trace.on:
      ev = trace.events
      if len(ev) < trace.cap:   # = trace.add, inlined
        ev.append((self.tid, "dma", kind, s, done, {"copy": req, "bytes": nbytes}))
      else:
        trace.add(self.tid, "dma", kind, s, done, {"copy": req, "bytes": nbytes})
    if self.timing_only and dst_space is not _SMEM:
      rec.moved = True  # timing only: payloads are skipped; only scalar (SMEM) data moves
    elif self._eager or m.dma_policy.move_at_start(rec):
      move_data(req, borrow=True)
      rec.moved = True
    # = m.add_arrival(req.sem_buf, req.sem_index, done, nbytes, rec), inlined (no checker)
    m.dma_count += 1
    m.hbm_bytes += nbytes * p[4]
    if slot is not None:   # (the machine's slot of req.sem_buf, req.sem_index: slots live as long
      m._seq = seq2 = m._seq + 1   # as the launch, so `fast` may hold it)
      slot.pending.append((done, seq2, nbytes, rec, False))
    if req.src_sem_buf is not None:
      m.add_arrival(req.src_sem_buf, req.src_sem_index, read_done, nbytes, rec, src=True)
    m.inflight[seq] = rec
    if m.dma_count & 1023 == 0:
      m.prune_channels()
    if m._sched is not None:
      m.maybe_yield(self)

  def _dma_start_general(self, req) -> None:
    issue = self.chip.dma_issue_cycles
    now = self.now = self.now + issue
    self.unit_busy["scalar"] += issue
    m = self.machine
    m._seq += 1
    rec = DmaRecord(req, m._seq, self)
    rec.issue_cycle = now
    src_ready = req.src_buf.ready_cycle
    start = now if now > src_ready else src_ready
    target_chip = self.chip_index
    if req.device_id is not None or req.core_index is not None:
      target_chip, core = req.device_id if req.device_id is not None else (self.chip_index,
                                                                          self.core_id)
      if req.core_index is not None:
        core = req.core_index
      # the copy lands in the target's buffer and signals the target's semaphore; the issuer's
      # descriptor keeps naming its own semaphores (its .wait_recv() waits on the local copy)
      req = copy.copy(req)
      req.dst_buf = m.peer_buffer(req.dst_buf, target_chip, core, self)
      if req.sem_buf is not None:
        req.sem_buf = m.peer_buffer(req.sem_buf, target_chip, core, self)
      rec.req = req
    if self.checks is not None:
      req = self.checks.dma_start(self, rec)
    dst_space = req.dst_buf.memory_space
    p = self._dma_plan(req.src_buf.memory_space, dst_space)
    kind = p[0]
    chans = self._chans
    if chans is None:
      chans = self._chans = self.dma_channels()
    if target_chip != self.chip_index:
      s, e, done = m.ici_transfer(self.chip_index, target_chip, start, req.nbytes)
      read_done = e
      kind = "ici"
    else:
      if p[1]:
        s, read_done = chans[2].reserve(start, req.nbytes)
      else:
        s, read_done = reserve2(chans[0], 1.0, chans[1], p[2], start, req.nbytes)
      done = math.ceil(read_done) + p[3]   # = dma.planned_timing, inlined
      rec.hbm_sides = p[4]
    rec.start_cycle, rec.done_cycle, rec.read_done_cycle = s, done, read_done
    if done > self.horizon:
      self.horizon = done
    trace = self.trace
    stats = trace.events.stats   # = trace.count_dma(kind, req.nbytes), inlined
    per_kind = stats["dma_bytes"]
    per_kind[kind] = per_kind.get(kind, 0) + int(req.nbytes)
    per_kind = stats["dma_count"]
    per_kind[kind] = per_kind.get(kind, 0) + 1
    if trace.on:
      ev = trace.events
      if len(ev) < trace.cap:   # = trace.add, inlined
        ev.append((self.tid, "dma", kind, s, done, {"copy": req, "bytes": req.nbytes}))
      else:
        trace.add(self.tid, "dma", kind, s, done, {"copy": req, "bytes": req.nbytes})
    if self.timing_only and dst_space != MemorySpace.SMEM:
      rec.moved = True  # timing only: payloads are skipped; only scalar (SMEM) data moves
    elif self._eager or m.dma_policy.move_at_start(rec):
      move_data(req, borrow=self.checks is None)  # the checkers track storage identity: no borrowing
      rec.moved = True
      if self.checks is not None:
        self.checks.moved(req)
    m.add_arrival(req.sem_buf, req.sem_index, done, req.nbytes, rec)
    if req.src_sem_buf is not None:
      m.add_arrival(req.src_sem_buf, req.src_sem_index, read_done, req.nbytes, rec, src=True)
    m.inflight[rec.seq] = rec
    if m.dma_count & 1023 == 0:
      m.prune_channels()
    if m._sched is not None:
      m.maybe_yield(self)

  def _dma_plan(self, src_space, dst_space) -> tuple:
    key = (id(src_space), id(dst_space))   # enum members are singletons; Enum.__hash__ is Python code
    p = self._dma_plans.get(key)
    if p is None:
      p = self._dma_plans[key] = plan(self.chip, src_space, dst_space)
    return p

  def dma_wait(self, req, which: str = "recv") -> None:
    if which == "send":
      self.sem_wait(req.src_sem_buf, req.src_sem_index, req.nbytes, True, dma=req)
      return
    buf, index = req.sem_buf, req.sem_index
    m = self.machine
    fast = req.fast   # set by dma_start: (this core, plan, the slot of (buf, index))
    slot = fast[2] if fast is not None and fast[0] is self else m.slots.get((id(buf), index))
    if slot is not None and m.checks is None:
      pending = slot.pending
      value = int(req.nbytes)
      if len(pending) == 1 and slot.value < value <= slot.value + pending[0][2]:
        # = sem_wait for its common case (the copy's own arrival satisfies the wait), inlined
        p = pending.pop()
        slot.value += p[2]
        rec = p[3]
        if rec is not None:
          if p[4] or rec.req.src_sem_buf is not None:
            m._apply(rec, p[4])
          else:   # = m._apply(rec, False) for a copy with no source semaphore, inlined
            if not rec.moved:
              move_data(rec.req)
              rec.moved = True
            rec.applied = True
            m.inflight.pop(rec.seq, None)
        t = p[0]
        now = self.now
        if t > now:
          trace = self.trace
          if trace.on:
            ev = trace.events
            if len(ev) < trace.cap:   # = trace.add, inlined
              ev.append((self.tid, "scalar", f"wait {buf.name}", now, t, None))
            else:
              trace.add(self.tid, "scalar", f"wait {buf.name}", now, t)
          now = t
        slot.value -= value
        self.now = now + self._scalar_cycles
        return
    self.sem_wait(buf, index, req.nbytes, True, dma=req)

  # ------------------------------------------------------------------ semaphores
  def sem_signal(self, buf, index, inc: int, device_id=None, core_index=None) -> None:
    """Signal a semaphore here, on core `core_index` of this chip, or at `device_id` = (chip, core)."""
    self.now += self.chip.scalar_op_cycles
    chip, core = device_id if device_id is not None else (self.chip_index, self.core_id)
    if core_index is not None:
      core = core_index
    target = self.machine.peer_buffer(buf, chip, core, self)
    at = self.now
    if chip != self.chip_index:
      at = self.machine.ici_signal_cycle(self.chip_index, chip, self.now)
    self.machine.add_arrival(target, index, at, int(inc), None)
    self.machine.maybe_yield(self)

  def resolve_device_id(self, device_id):
    """A device_id (dict of changed axes, tuple of coordinates, or int) -> (chip, core)."""
    return self.machine.resolve_device_id(self, device_id)

  def sem_wait(self, buf, index, value: int, decrement: bool = True, dma=None) -> None:
    value = int(value)
    m = self.machine
    slot = m.slots.get((id(buf), index))
    if slot is None:
      slot = m.slot(buf, index)
    pending = slot.pending
    if m.checks is None and len(pending) == 1 and slot.value < value <= slot.value + pending[0][2]:
      # = m.settle(slot, value) for its common case (one arrival in flight satisfies the wait), inlined
      p = pending.pop()
      slot.value += p[2]
      if p[3] is not None:
        m._apply(p[3], p[4])
      t = p[0]
    else:
      t = None
    while t is None:
      t = m.settle(slot, value)
      if t is not None:
        break
      self.blocked_on = (buf, index, value, slot, dma, user_site())
      m.block(self)
      self.blocked_on = None
    if t > self.now:
      if self.trace.on:
        self.trace.add(self.tid, "scalar", f"wait {buf.name}", self.now, t)
      self.now = t
    if decrement:
      slot.value -= value
    self.now += self.chip.scalar_op_cycles

  def sem_read(self, buf, index) -> int:
    m = self.machine
    slot = m.slot(buf, index)
    self.now += self.chip.scalar_op_cycles
    m.maybe_yield(self)  # a polling loop lets the cores it waits for run
    value = slot.value + sum(p[2] for p in slot.pending if p[0] <= self.now)
    if self.checks is not None:
      self.checks.peek(slot, self.now)
    key = (id(slot), value)
    self._polls = self._polls + 1 if self._poll == key else 0
    self._poll = key
    if self._polls >= 1000 and not slot.pending:
      stuck = m.stuck_cores(self)
      if stuck is not None:   # nothing can change the value: a livelock, reported as a deadlock
        self.blocked_on = (lambda: False, f"semaphore {buf.name} to change from {value} (polled with "
                           f"semaphore_read {self._polls} times)", user_site())
        raise m.deadlock_error([self] + stuck)
    return value

  def grid_step(self) -> None:
    # In-order VLIW issue with no software pipelining across grid steps (modelling assumption): the
    # next step's bundles issue after this step's last vector/MXU result, then the step overhead.
    self.steps += 1
    start = self.now if self.now > self.compute_done else self.compute_done
    cycles = self._step_cycles
    self.now = start + cycles
    self.unit_busy["scalar"] += cycles
    trace = self.trace
    if trace.on:
      ev = trace.events
      if len(ev) < trace.cap:   # = trace.add, inlined
        ev.append((self.tid, "scalar", "grid step", start, self.now, None))
      else:
        trace.add(self.tid, "scalar", "grid step", start, self.now)

  # ------------------------------------------------------------------ end of kernel
  def _check_sem_zero(self, buf, when: str) -> None:
    if not self.semaphore_checks:
      return
    for idx in np.ndindex(*buf.shape) if buf.shape else [()]:
      slot = self.machine.slots.get((id(buf), idx))
      # arrivals not yet applied by a wait (signals, DMA byte counts) count too
      value = None if slot is None else slot.value + sum(p[2] for p in slot.pending)
      if value:
        dma = next((p[3] for p in slot.pending if p[3] is not None), None)
        raise SyncError(
            f"Semaphore {buf.name}{list(idx) if idx else ''} ({buf.sem_kind}) is {value}, not 0, "
            f"{when} on chip {self.chip_index} core {self.core_id} in kernel '{self.kernel_name}'. " +
            ("" if dma is None else f"DMA {dma.req.describe} started at {fmt_site(dma.req.site)} was "
             f"never waited: did you forget .wait()? ") +
            "Every signal (and every DMA's byte count) must be waited for; check the matching "
            "semaphore_wait / .wait() calls.")

  def finish(self) -> int:
    for buf in list(self.sem_buffers):
      self._check_sem_zero(buf, "at kernel end")
    if self.unused_dmas:
      site, text = min((v[0], v[1]) for v in self.unused_dmas.values())
      raise SyncError(
          f"Kernel '{self.kernel_name}' made {len(self.unused_dmas)} DMA descriptor(s) that were never "
          f"started nor waited on chip {self.chip_index} core {self.core_id}: {text} made at "
          f"{fmt_site(site)}. Call .start() and .wait() on it, or remove it (JAX logs 'AsyncCopyDescriptor "
          f"was not used').")
    end = max(self.now, self.horizon, *self.unit_free.values())
    return end
