"""One TensorCore of the virtual TPU: the executor the language talks to, and the issue model (L4b).

The core owns its clock and units and delegates the rest: storage and capacity to sim/memory.py (an
`Allocator`, `memory.read` / `write`), copies to sim/dma.py (its `DmaEngine`), semaphores and waits to
sim/sync.py (the machine's `Semaphores` and scheduler), bug checks to sim/checks.py.

Time model of the core (cycles of the chip clock):
  * `now` is the in-order issue point of the scalar core. Every vector op issues at or after `now`;
    issuing moves `now` to the op's start (in-order VLIW issue). An op on a unit still busy with
    earlier ops does not wait for it to finish: the compiled bundles interleave consecutive ops' vregs,
    so it starts when the unit's previous op started (or at `now`, if later) and its work queues behind
    the unit's (it ends `busy` cycles after the unit frees up). Measured on a v5e: a multiply, an add
    and a store over 512 vregs take the store's 512 cycles, not the multiply's then the store's
    (benchmarks/hw `pipe_fence`, `dma_fence`).
  * A rolled loop's iteration ends its basic block: the next issues after the last vector/MXU result
    (`loop_back_edge`). A grid step's bookkeeping starts once the step's work has issued and its MXU
    results are out, overlapping the vector results in flight (`grid_step`, measured on a v5e).
  * An op's result is ready at max(start + busy, inputs ready + latency): consumers stream behind their
    producers, as the pipelined VLIW schedule does; only the MXU fill/drain latency is exposed.
  * Waits (DMA, semaphores) move `now` to the moment the awaited count arrived.
"""
from __future__ import annotations

import functools

from palace._src.core import MemorySpace, SemaphoreRefType
from palace._src.errors import ResourceError, SyncError, UnsupportedError
from palace._src.sim import cost, memory
from palace._src.sim.dma import DmaEngine, land_due
from palace._src.sim.memory import Buffer
from palace._src.sim.steady import SteadyState
from palace._src.util import fmt_site, prod

_SMEM = MemorySpace.SMEM


class CostMemo(dict):
  """A memo of a pure function of its key's items (cost rules of one chip): misses compute and keep
  (at most `LIMIT` entries: a long-lived VirtualTPU meeting ever new shapes starts over)."""
  __slots__ = ("fn",)
  LIMIT = 1 << 16

  def __init__(self, fn):
    super().__init__()
    self.fn = fn

  def __missing__(self, key):
    if len(self) >= self.LIMIT:
      self.clear()
    value = self[key] = self.fn(*key)
    return value


def cost_memos(chip) -> tuple:
  """(vector costs, MXU charges, copy timings) memos of `chip`: (op class, shape, dtype) -> (unit,
  busy, latency), (m, k, n, batch, dtypes, weights kept latched) -> (cycles on the MXU unit, latency
  from then, flops, label: cost.matmul_issue) and (id(source space),
  id(destination space)) -> dma.copy_timing (filled by DmaEngine._prepare; a few memory-space
  pairs). Pure functions of the frozen chip spec, so a VirtualTPU keeps one set for all its launches
  (machine.VirtualTPU.cost_memos)."""
  return (CostMemo(functools.partial(cost.vector_cost, chip)),
          CostMemo(functools.partial(_matmul_charge, chip)), {})


def _matmul_charge(chip, m, k, n, batch, lhs_dtype, rhs_dtype, latched) -> tuple:
  return (*cost.matmul_issue(chip, m, k, n, batch, lhs_dtype, rhs_dtype, latched),
          cost.matmul_flops(m, k, n, batch), f"matmul {m}x{k}x{n}")


@functools.cache
def core_tid(chip_index: int, core_id: int) -> tuple:
  """The `(chip, core)` tuple naming a core in trace events and race clocks, one object per pair for
  the process: a report keeps it in every event, and an event tuple is untracked by the cyclic GC's
  first young collection only when its items already are (a tuple made anew per launch is tracked
  until a collection examines it, so each launch's events reached an older generation still tracked;
  docs/host-speed.md, session 27)."""
  return (chip_index, core_id)


class TensorCore:
  """Executor for one core. `machine` owns chips, channels, the scheduler and the trace."""

  def __init__(self, machine, chip_index: int, core_id: int, axis_env: dict, params):
    self.machine = machine
    self.chip = machine.chip
    self.chip_index = chip_index
    self.core_id = core_id
    self.axis_env = dict(axis_env)
    self.timing_only = machine.timing_only
    self.exact_f32_dots = machine.tpu.exact_f32_dots
    self.shared_dots = machine.tpu.shared_dots
    self.host_math = machine.tpu.host_math
    self.bounds_checks = not params.disable_bounds_checks
    self.semaphore_checks = not params.disable_semaphore_checks
    self.checks = machine.checks if self.bounds_checks else machine.unchecked_checks()
    # whole-buffer stores may leave deferred values (lang/deferred.py) unless a checker follows storage
    self.deferred_values = not self.checks.active and not self.timing_only
    self.host_cache = {}      # the language side's host caches for this launch (opaque to the machine)
    self._poll, self._polls = None, 0   # semaphore_read polling (livelock detection)
    self.unused_dmas = {}     # descriptors made but never started nor waited: key -> (site, describer, desc)
    self.grid_stack = []
    # a list while a pipeline's steady-state detector watches a body (pipeline_steady.py): the grid
    # axes pl.program_id read, and None for each read whose value the grid does not determine
    self.grid_reads = None
    self.kernel_name = machine.kernel_name
    self.now = 0
    self.unit_free = dict.fromkeys(cost.UNITS, 0)
    self.unit_issued = dict.fromkeys(cost.UNITS, 0)   # start of each unit's latest op (_issue)
    self.store_hold = 0   # the in-order store unit's next store waits for this (`store`)
    self._store_hold_rule = self.chip.stores_in_order
    self._store_stream_rule = self.chip.stores_stream_behind_values
    self.unit_busy = dict.fromkeys(cost.UNITS, 0)
    self.horizon = 0
    self.compute_done = 0     # latest result of any vector/MXU op (loop back edges drain it; grid_step)
    # measured rules (hw.ChipSpec: on for v5e, off elsewhere): MXU results by ready cycle -> result vregs, for
    # the hand-off and chain rules (this grid step's only), and the XLU's last (op class, result)
    chip = self.chip
    self._handoff = chip.mxu_handoff_cycles_per_vreg
    self._chain_waits = chip.mxu_chain_waits
    self._xlu_turn = chip.xlu_class_turnaround
    self.mxu_results = {} if self._handoff or self._chain_waits else None
    self.xlu_last = (None, 0)
    self.mxu_done = 0         # latest MXU result (popped by issue slots before a step's bookkeeping)
    self.mxu_weights = []     # the right operands of the basic block's latest products (still latched)
    # (hw.ChipSpec.dma_issue_bare_cycles) whether the current basic block has issued a vector or MXU op
    # and started a copy, and whether the latest block that did either did no vector work
    self.block_vector = self.block_starts = False
    self.dma_only = False
    self.flops = 0
    # this core's memories (capacity, live allocations; VMEM_SHARED is modelled as VMEM on a TensorCore)
    self.memory = memory.Allocator.of_core(self, params.vmem_limit_bytes)
    self.sem_buffers = []
    self.sems_in_use = 0      # semaphore elements of sem_buffers (capacity check)
    self.trace = machine.trace
    self.tid = core_tid(chip_index, core_id)
    self.blocked_on = None
    self.alloc_seq = 0
    self.steps = 0            # grid steps run on this core (pallas_call and emit_pipeline)
    self.synced_until = -1    # end of the last DMA-wait sync: copies landed by then need none (sim/sync.py)
    self.dma = DmaEngine(self)  # this core's DMA issue, timing and data movement (sim/dma.py)
    # Executor.dma_start / dma_wait are the engine's and the semaphores' own bound methods (one call
    # from the language to the code that does the work, no forwarding frame)
    self.dma_start = self.dma.start
    self.dma_wait = functools.partial(machine.sems.wait_copy, self)
    self._scalar_cycles = self.chip.scalar_op_cycles
    self._loop_cycles = self.chip.loop_back_edge_cycles
    self._queue_gap = cost.QUEUE_GAP_CYCLES
    self._loop_floor = self.chip.loop_min_iteration_cycles
    self.last_back_edge = 0   # where the last back edge let its loop go on (loop_min_iteration_cycles)
    self._branch_cycles = self.chip.branch_cycles
    self._step_cycles = self.chip.grid_step_overhead_cycles
    self._step_drain = self.chip.grid_step_drain_cycles
    # this chip's cost rules and copy timings (DmaEngine), memoised (cost_memos)
    self._vcost, self._mcost, self.copy_timings = machine.cost_memos
    self.share_group = (chip_index,)   # cores that see the same shared allocations
    self.dma_granule_bytes = 0
    self.label = f"core {core_id}"
    self.mesh_home = None     # executor.MeshHome of the core-level mesh it runs in: axes, core ids
    self.sparsecore = None    # executor.SparseCoreExecutor on SparseCore subcores
    self.named_buffers = {}   # key -> Buffer, to find "the same" buffer on another core or chip

  # ------------------------------------------------------------------ messages
  def where(self) -> str:
    gp = f"at grid point {self.grid_stack[-1][0]} " if self.grid_stack else ""
    return f"{gp}on chip {self.chip_index} core {self.core_id} in kernel '{self.kernel_name}'"

  def site(self) -> tuple:
    return self.machine.site()

  def debug_print(self, text: str) -> None:
    if self.grid_reads is not None:   # (output per step: a grid that prints is stepped)
      self.grid_reads.append(None)
    self.machine.debug_print(text)

  def trace_value(self, label: str, value) -> None:
    """`pltpu.trace_value`: one scalar op (the store to the trace), and the value on the scalar lane of
    the launch's trace, an instant event named `trace_value <label>` (what xprof shows on a TPU)."""
    if self.grid_reads is not None:   # (a value per step: a grid that traces values is stepped)
      self.grid_reads.append(None)
    self.scalar_op()
    if self.trace.on:
      self.trace.add((self.tid, "scalar", f"trace_value {label}", self.now, self.now,
                      {"label": label, "value": value}))

  def steady_state(self):
    """The machine side of a pipeline's steady-state detector (sim/steady.py) on this core, or None
    where the launch may not extrapolate: not timing-only, several cores or chips, bug checks, the
    random DMA policy, or `pl.virtual_tpu(steady_state=False)`."""
    # (a SparseCore subcore has state of its own the signature does not cover)
    return SteadyState(self) if type(self) is TensorCore and SteadyState.eligible(self) else None

  # ------------------------------------------------------------------ compute
  def _issue(self, unit: str, busy: int, latency: int, ready: int, what: str) -> int:
    """Issue `busy` cycles on `unit` (in order after its previous op); the result is ready `latency`
    cycles after it ends, or at `ready` if its operands come later. The one issue model of every
    vector, MXU, load and store op."""
    unit_free = self.unit_free
    now = self.now
    free = unit_free[unit]
    if free > now:   # the unit is still busy: this op's vregs interleave with the earlier ops' there
      last = self.unit_issued[unit]
      start = self.now = now if now > last else last
      end = unit_free[unit] = free + busy + self._queue_gap.get(unit, 0)
    else:
      start = self.now = now
      end = unit_free[unit] = now + busy
    if unit == "xlu" and self._xlu_turn:   # (hw.ChipSpec.xlu_class_turnaround, v5e)
      what_last, last_done = self.xlu_last
      if what_last is not None and what_last != what and last_done > start:
        start = last_done
        end = unit_free[unit] = last_done + busy
    self.unit_issued[unit] = start
    self.unit_busy[unit] += busy
    self.block_vector = True
    if unit == "xlu" and ready > end:   # the in-order XLU holds an op until its last input vreg came
      unit_free[unit] = ready            # (measured on a v5e, session 23: docs/timing-model.md 1.4)
    done = (end if end > ready else ready) + latency
    if unit == "xlu" and self._xlu_turn:
      self.xlu_last = (what, done)
    if done > self.compute_done:
      self.compute_done = done
      if done > self.horizon:
        self.horizon = done
    trace = self.trace
    if trace.on:
      trace.add((self.tid, unit, what, start, end, None))
    return done

  def vector_op(self, op_class: str, shape, dtype, ready: int, links: int = 0) -> int:
    unit, busy, lat = self._vcost[(op_class, shape, None)]   # (arithmetic is costed in 32-bit tiles)
    if unit is None:
      return ready
    if links > 1:   # `links` dependent steps (a reduction's accumulation): at least links latencies long
      done = self.vector_op(op_class, shape, dtype, ready)
      chain = self.unit_issued[unit] + links * lat
      if chain > done:
        results = self.mxu_results
        if results and done in results:   # (an MXU result passed on: the hand-off rule follows it)
          results[chain] = results[done]
        done = chain
        if done > self.compute_done:
          self.compute_done = done
          if done > self.horizon:
            self.horizon = done
      return done
    results = self.mxu_results
    if results and self._handoff and ready in results:   # (hw.ChipSpec, v5e)
      vregs = results[ready]
      if unit == "xlu":     # an MXU result reaching the XLU: its hand-off
        cap = self.chip.mxu_handoff_max_vregs
        ready += int(self._handoff * (vregs if vregs < cap else cap))
      elif unit == "vpu":   # a VPU op passes the MXU result on
        done = self._issue(unit, busy, lat, ready, op_class)
        results[done] = vregs
        return done
    return self._issue(unit, busy, lat, ready, op_class)

  def matmul(self, m, k, n, batch, lhs_dtype, rhs_dtype, ready: int, weights=None) -> int:
    # weights kept latched from a recent product of this basic block, one set per MXU (cost.matmul_issue)
    kept = self.mxu_weights
    latched = False
    if weights is not None:
      for i, w in enumerate(kept):
        if w is weights:
          latched = True
          del kept[i]
          break
      kept.append(weights)   # (the most recent last; the least recent leaves when the MXUs are full)
      if len(kept) > self.chip.num_mxus:
        del kept[0]
    key = (m, k, n, batch, lhs_dtype, rhs_dtype, latched)
    hit = self._mcost.get(key)
    if hit is None:
      bad = cost.mxu_operand_error(self.chip, lhs_dtype, rhs_dtype)
      if bad is not None:
        raise UnsupportedError(f"{fmt_site(self.site())}: {bad} ({self.where()})")
      hit = self._mcost[key]
    busy, lat, flops, label = hit
    self.flops += flops
    results = self.mxu_results
    if results is not None:   # (hw.ChipSpec rules, v5e)
      if self._chain_waits and ready >= self.mxu_done > self.now and self.unit_free["mxu"] < ready:
        self.unit_free["mxu"] = self.unit_issued["mxu"] = ready   # computed from the MXU's last result
      done = self._issue("mxu", busy, lat, ready, label)
      if len(results) >= 256:
        results.clear()
      results[done] = -(-m // self.chip.sublanes) * -(-n // self.chip.lanes) * batch
    else:
      done = self._issue("mxu", busy, lat, ready, label)
    if done > self.mxu_done:
      self.mxu_done = done
    return done

  def scalar_op(self, ready: int = 0) -> int:
    cycles = self._scalar_cycles
    now = self.now = self.now + cycles
    self.unit_busy["scalar"] += cycles
    return now if now > ready else ready

  def scalar_ops(self, n: int) -> tuple:
    """`n` scalar_op calls issued back to back, charged at once (palace.jax's fused runs of scalar
    equations): returns (the clock before them, the cycles of one), so the k-th op's result (k from
    1) is ready at max(start + k * cycles, its operands' ready), as scalar_op would give it."""
    cycles = self._scalar_cycles
    start = self.now
    self.now = start + n * cycles
    self.unit_busy["scalar"] += n * cycles
    return start, cycles

  def delay(self, cycles: int) -> None:
    """`pl.delay`: the scalar core sleeps `cycles` (issue stops; ops already issued, DMAs in flight and
    other cores go on). Idle time, so no unit counts it busy; it shows on the scalar lane of a trace."""
    start = self.now
    self.now = start + cycles
    if self.trace.on and cycles:
      self.trace.add((self.tid, "scalar", "delay", start, self.now, None))

  # ------------------------------------------------------------------ memory
  def load(self, buf: Buffer, index, shape, site=None):
    if buf.landing is not None:   # copies from other cores or chips that landed by now
      land_due(buf, self.now)
    checks = self.checks
    if checks.active:   # (a launch without checkers makes no hook call per access)
      alt = checks.load(self, buf, index, shape)
      if alt is not None:
        buf, index = alt
    if not shape or buf.memory_space is _SMEM:
      if self.grid_reads is not None:   # a scalar read: control flow may depend on its value
        self.grid_reads.append(None)
      self.now += self.chip.scalar_op_cycles
      ready = self.now if self.now > buf.ready_cycle else buf.ready_cycle
      return memory.read_scalar(buf, index), ready
    unit, busy, lat = self._vcost[("load", shape, buf.dtype)]
    ready = self._issue(unit, busy, lat, buf.ready_cycle, "load")
    return memory.read(buf, index, self.timing_only), ready

  def store(self, buf: Buffer, index, shape, data, ready: int) -> None:
    if buf.landing is not None:
      land_due(buf, self.now)
    checks = self.checks
    if checks.active:
      alt = checks.store(self, buf, index, shape, data)
      if alt is not None:
        index, data = alt
    memory.write(buf, index, data, not checks.active)
    if not shape or buf.memory_space is _SMEM:
      self.now += self.chip.scalar_op_cycles
      done = self.now if self.now > ready else ready
    else:
      unit, busy, lat = self._vcost[("store", shape, buf.dtype)]
      held = self._store_hold_rule   # (hw.ChipSpec.stores_in_order, v5e)
      free = self.unit_free
      exempt = False
      if held:
        # a store ends no earlier than `busy` cycles after the value of the store before it came
        # (`store_hold`), unless it stores an (N, 1) column or an MXU result (directly or through VPU
        # ops: `mxu_results`); it holds the next one until its own value comes (measured: session 35's
        # eup_stream, a second independent block stream's stores wait for the first's)
        mxu = self.mxu_results
        exempt = (shape[-1] == 1 and len(shape) > 1) or bool(mxu and ready in mxu)
        if not exempt and self.store_hold > free[unit]:
          free[unit] = self.store_hold
      done = self._issue(unit, busy, lat, ready, "store")
      if busy > 1 and self._store_stream_rule and not exempt and ready >= free[unit]:
        # (hw.ChipSpec.stores_stream_behind_values, v5e) a block's stores stream behind its value: the
        # unit is busy until its last vreg is stored (measured: session 36's step_raw)
        free[unit] = done
      if held and ready > free[unit]:
        self.store_hold = ready
    if done > buf.ready_cycle:
      buf.ready_cycle = done

  def note_access(self, buf: Buffer, index, kind: str, shape, atomic: bool = False) -> None:
    """A read ('r') or write ('w') of `buf[index]` the language side performs itself (SparseCore
    vector gathers, scatters, expanded loads, compressed stores, fetch_and_add): shown to the race
    detector like a vector load or store (not for `atomic` updates) and to the uninitialised-read
    tracker. `index` may hold index arrays."""
    if buf.landing is not None:
      land_due(buf, self.now)
    checks = self.checks
    if not checks.active:
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
      in_use = self.sems_in_use
      cap, kept = self.chip.semaphores_per_core, self.chip.semaphores_reserved
      if in_use + count > cap - kept:
        raise ResourceError(
            f"Semaphores over capacity for {name} {self.where()}: {in_use} in use + {count} requested "
            f"{mem_type.kind} semaphores > {cap} per core on {self.chip.name}"
            + (f" less {kept} the compiler keeps ({cap - kept} usable; a TPU v5e with 500 DMA "
               f"semaphores: 'Ran out of memory in memory space sflag. Used 2.0K of 2.0K sflag. "
               f"Exceeded sflag capacity by 28B')" if kept else "")
            + ". A launch's pipelined blocks take one DMA semaphore per buffer. Fix: reuse semaphores "
            f"(one per in-flight DMA slot, e.g. SemaphoreType.DMA((2,)) for double buffering) instead "
            f"of one per copy.")
      buf = memory.new_semaphore(mem_type, name, self)
      self.sem_buffers.append(buf)
      self.sems_in_use += count
      return buf
    return self.memory.allocate(mem_type, name)

  @property
  def vmem_limit(self) -> int:
    """The scoped VMEM this core's allocations may use (bytes)."""
    return self.memory.vmem_limit

  @property
  def vmem_peak(self) -> int:
    return self.memory.vmem_peak

  def free(self, buf: Buffer) -> None:
    self.named_buffers.pop(buf.key, None)
    self.checks.free(self, buf)
    if buf.core is not self:
      return  # a shared allocation owned by another core
    if not self.memory.release(buf) and buf.sem_kind is not None:
      self._check_sem_zero(buf, "at the end of its run_scoped region")
      self.sem_buffers.remove(buf)
      self.sems_in_use -= prod(buf.shape)

  # ------------------------------------------------------------------ DMA
  # dma_start(req) is DmaEngine.start and dma_wait(req, which="recv") is Semaphores.wait_copy, bound to
  # this core in __init__.

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
    sems = self.machine.sems
    sems.arrive(sems.slot(target, index), at, int(inc))
    sched = self.machine.sched
    if sched.yields:
      sched.maybe_yield(self)

  def resolve_device_id(self, device_id, home=None):
    """A device_id (dict of changed axes, tuple of coordinates, int, or None) -> (chip, core), a
    core of this core's mesh or of the mesh `home` (a MeshHome: a semaphore of another mesh)."""
    return self.machine.resolve_device_id(self, device_id, home)

  def sem_wait(self, buf, index, value: int, decrement: bool = True, dma=None) -> None:
    self.machine.sems.wait(self, buf, index, int(value), decrement, dma)

  def sem_read(self, buf, index) -> int:
    if self.grid_reads is not None:
      self.grid_reads.append(None)
    return self.machine.sems.read(self, buf, index)

  def carry_semaphores(self, buf, name: str, handles=None):
    """`buf`, a semaphore allocation of this core, is a launch's semaphore operand (`handles`: the
    int32 handles it came with, one per element) or result (`handles` None: new ones): it starts with
    the state kept under them and leaves its state there at the end of the launch (sim/carried.py).
    Returns the handles it is kept under (new ones for an operand's handle the VirtualTPU never
    issued: a semaphore ref JAX made empty)."""
    imported = handles is not None
    if not imported:
      handles = self.machine.tpu.carried.new_handles(prod(buf.shape))
    return self.machine.carry_semaphores(self, buf, handles, name, imported)

  def loop_back_edge(self) -> None:
    # A rolled loop's iteration is a basic block of the compiled kernel: the VLIW schedule has no
    # interlocks, so the next iteration issues after this one's last vector/MXU result, then the back
    # edge's own cycles, and no earlier than the loop's branch and counter work allow, which overlaps
    # the body's results (measured: ChipSpec.loop_back_edge_cycles and loop_min_iteration_cycles,
    # docs/timing-model.md 1.1).
    start = self.now if self.now > self.compute_done else self.compute_done
    cycles = self._loop_cycles
    now = start + cycles
    floor = self.last_back_edge + self._loop_floor   # (the iteration's own minimum, measured)
    if floor > now:
      now = floor
    self.now = self.last_back_edge = now
    self.unit_busy["scalar"] += cycles
    self.block_boundary()

  def block_boundary(self) -> None:
    # The end of a basic block (a loop back edge, a grid step): no MXU weights stay latched past it
    # (cost.matmul_issue), and a block that did vector work makes the next blocks' DMA starts full ones,
    # a block of starts without any makes them bare ones (DmaEngine.start)
    self.mxu_weights.clear()
    if self.block_vector:
      self.dma_only = False
    elif self.block_starts:
      self.dma_only = True
    self.block_vector = self.block_starts = False

  def branch(self, tested: int) -> None:
    # A conditional branch: `tested` scalar ops of its condition's test (pl.when's; a front end's
    # comparisons are charged where they run) and its own ChipSpec.branch_cycles
    cycles = self._branch_cycles + tested * self._scalar_cycles
    if cycles:
      self.now += cycles
      self.unit_busy["scalar"] += cycles

  def grid_step(self) -> None:
    # No software pipelining across grid steps: the step's bookkeeping starts once its vector work has
    # issued (every unit's queue) and its MXU results are out, overlapping the vector results still in
    # flight; the next step issues after the bookkeeping and `grid_step_drain_cycles` after the last
    # result (measured on a v5e: docs/timing-model.md 1.1).
    self.steps += 1
    self.block_boundary()
    if self.mxu_results:
      self.mxu_results.clear()   # (a later step reads an earlier step's results from memory)
    if self.steps == 1:   # the first step's bookkeeping is the kernel's prologue
      self.now = self.now if self.now > self.compute_done else self.compute_done
      return
    start = self.now if self.now > self.mxu_done else self.mxu_done
    for t in self.unit_free.values():
      if t > start:
        start = t
    cycles = self._step_cycles
    end = start + cycles
    drained = self.compute_done + self._step_drain
    self.now = end if end > drained else drained
    self.unit_busy["scalar"] += cycles
    trace = self.trace
    if trace.on and cycles:
      trace.add((self.tid, "scalar", "grid step", start, self.now, None))

  # ------------------------------------------------------------------ end of kernel
  def _check_sem_zero(self, buf, when: str) -> None:
    if self.semaphore_checks:
      self.machine.sems.check_zero(self, buf, when)

  def finish(self) -> int:
    for buf in list(self.sem_buffers):
      self._check_sem_zero(buf, "at kernel end")
    if self.unused_dmas:
      site, text = min((v[0], str(v[1])) for v in self.unused_dmas.values())
      raise SyncError(
          f"Kernel '{self.kernel_name}' made {len(self.unused_dmas)} DMA descriptor(s) that were never "
          f"started nor waited on chip {self.chip_index} core {self.core_id}: {text} made at "
          f"{fmt_site(site)}. Fix: call .start() and .wait() on it, or remove it (JAX logs "
          f"'AsyncCopyDescriptor was not used').")
    end = max(self.now, self.horizon, *self.unit_free.values())
    return end
