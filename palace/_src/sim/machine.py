"""The virtual TPU: chips x cores, DMA channels, semaphores, the core scheduler (L4b).

`VirtualTPU` is the user-visible configuration (chip, chip count, policies) and collects one Report per
launch. Each launch builds a fresh `Machine`; nothing survives between launches except HBM contents
that the caller owns (inputs, outputs, mutable refs) and the semaphores a launch takes or returns
(sim/carried.py: the VirtualTPU's `carried` store, JAX's async copies split over two launches).

Semaphores, waits and the scheduler that runs the cores (earliest clock first, each to its next
blocking wait) are sim/sync.py's.
"""
from __future__ import annotations

import collections
import contextvars
import gc
import importlib.util
import itertools
import random

from palace._src import executor as executor_mod
from palace._src import hostmem, hw, validate
from palace._src.errors import SyncError, UnsupportedError, UsageError
from palace._src.sim import carried as carried_mod
from palace._src.sim import dma
from palace._src.sim import memory
from palace._src.sim.bandwidth import Channel
from palace._src.sim.ici import Topology, check_topology
from palace._src.sim.checks import make_checks
from palace._src.sim.replay import ReplayMemo
from palace._src.sim.report import Report
from palace._src.sim.subcore import SC_BASE, SCALAR_BASE, SparseSubcore
from palace._src.sim.sync import ConditionWait, Scheduler, Semaphores, Solo
from palace._src.sim.tensorcore import TensorCore, cost_memos
from palace._src.sim.trace import Trace
from palace._src.util import fmt_site, user_site

DMA_POLICIES = ("eager", "on_wait", "random")
DOT_NUMERICS = ("blas", "mxu")   # who orders a float dot's sums in a kernel (lang/mxu.follows_chip)
# trace events the reports of one VirtualTPU keep in all (about 150 MB); older launches drop theirs
KEEP_TRACE_EVENTS = 1_000_000


class DmaPolicy:
  """When a DMA's data moves: at start (eager), when its semaphore is waited (on_wait), or a seeded
  coin flip per DMA (random). Under eager a copy into another core's or chip's memory lands at its
  completion on the modelled clock instead (sim/dma.py `land_due`: after the receiver's own earlier
  accesses, as on the chip). Race-free kernels give bit-identical results under all three. `random` also
  picks the next core to run at random among the runnable ones (seeded), so the modelled times of a
  multi-core kernel can differ from the clock-ordered schedule of eager/on_wait."""

  def __init__(self, name: str, seed: int):
    if name not in DMA_POLICIES:
      raise UsageError(f"dma_policy={name!r}: expected one of {DMA_POLICIES}. Fix: pass one of those.")
    self.name = name
    self.rng = random.Random(seed) if name == "random" else None   # (only `random` draws from it)

  def move_at_start(self, rec) -> bool:
    if self.name == "eager":
      return True
    if self.name == "on_wait":
      return False
    return self.rng.random() < 0.5


class paused_gc:
  """`with paused_gc():` Python's cyclic GC paused for the block, then resumed. Every launch
  (launch/host.launch_machine, for launch/run.py and launch/spmd.py) holds it from before its machine is
  built until the machine is released. A launch allocates many short-lived objects (requests, views, values)
  while its trace and caches keep many live ones, and the collector would re-scan the live ones again and
  again for nothing: palace's per-step objects form no reference cycles (reference counting frees them), so
  the cyclic garbage a launch leaves does not grow with its step count (tests/test_launch_gc.py). The
  collector cost 6% of a small kernel's instructions per grid step even with its young-generation threshold
  raised to 50,000 (callgrind, the copy kernel of benchmarks.speed); held until the release, the collection
  that follows a launch finds only what outlives it (the report), not its machine. A nested launch, or one
  running while another thread's launch holds the pause, leaves the switch alone; a collector the user
  switched off stays off. (A class, not a generator context manager: it is entered on every launch.)"""
  __slots__ = ("paused",)

  def __enter__(self):
    self.paused = gc.isenabled()
    if self.paused:
      gc.disable()

  def __exit__(self, *exc):
    if self.paused:
      gc.enable()


class Machine:
  def __init__(self, tpu: "VirtualTPU", kernel_name: str, timing_only: bool, num_chips: int = 1):
    self.tpu = tpu
    self.chip = tpu.chip
    self.num_chips = num_chips
    self.topology = Topology(tpu.chip, tpu.num_chips, tpu.topology) if num_chips > 1 else None
    self.kernel_name = kernel_name
    self.timing_only = timing_only
    self.dma_policy = DmaPolicy(tpu.dma_policy, tpu.seed + len(tpu.reports))
    self.trace = Trace(on=tpu.trace)
    self.inflight = {}          # seq -> DmaRecord of every copy not completed on both sides
    self.landings = {}          # id -> buffer with copies from other cores or chips still to land
    # there (sim/dma.py `defer`)
    # the machine's one counter of sequence numbers: DMA records and semaphore arrivals (sim/dma.py,
    # sim/sync.py) take the next one, so events at one cycle keep their issue order
    self.sequence = itertools.count(1)
    self.cores = []
    self._chans = {}
    self._hbm = {}
    self.hbm_bytes = 0
    self.ici_bytes = 0
    self.grid_steps = 0
    self.dma_count = 0
    self.axes = []              # [(axis name, size, "chip" | "core")], set by the launcher
    self.hbm_peers = {}         # (chip, operand name) -> Buffer
    self.shared_buffers = {}    # (chip, allocation key) -> Buffer shared by the cores of a chip
    # (file, line) every record and message of this launch names when no user frame is on the stack:
    # the kernel's line for kernels that run as JAX jaxprs (palace.jax), set by the launcher; None: the
    # user's line from the stack, at each record (`site`)
    self.fixed_site = None
    self.checks = make_checks(self)   # opt-in bug checks (races, uninitialised reads); NO_CHECKS by default
    self.sems = Semaphores(self, self.checks)   # every semaphore element of the launch (sim/sync.py)
    self.sched = Solo(self)     # the core scheduler (a sync.Scheduler while a multi-core launch runs)
    self.cost_memos = tpu.cost_memos()   # the chip's memoised cost rules, kept across launches
    self._unchecked = None
    self.carried = []   # [(core, buf, handles, name, origins)]: semaphore operands/results (sim/carried.py)

  def unchecked_checks(self):
    """The checks of a core running with disable_bounds_checks=True (clips out-of-bounds accesses)."""
    if self._unchecked is None:
      self._unchecked = self.checks.with_unchecked()
    return self._unchecked

  # ------------------------------------------------------------------ construction
  def add_core(self, chip_index: int, core_id: int, axis_env: dict, params) -> TensorCore:
    core = TensorCore(self, chip_index, core_id, axis_env, params)
    core.dot_numerics = self.tpu.dot_numerics
    self.cores.append(core)
    return core

  def add_sparse_subcore(self, chip_index: int, sc_index: int, subcore: int, axis_env: dict, params,
                         scalar: bool = False):
    spec = self.chip.sparsecore
    core_id = (SCALAR_BASE + sc_index) if scalar else (SC_BASE + sc_index * spec.num_subcores + subcore)
    core = SparseSubcore(self, chip_index, core_id, axis_env, params, sc_index, subcore, scalar)
    core.dot_numerics = self.tpu.dot_numerics
    self.cores.append(core)
    return core

  def channels(self, chip_index: int, core_id: int):
    key = (chip_index, core_id)
    ch = self._chans.get(key)
    if ch is None:
      hbm = self._hbm.get(chip_index)
      if hbm is None:
        hbm = self._hbm[chip_index] = Channel("hbm", self.chip.hbm_bytes_per_s_per_device,
                                              self.chip.clock_hz)
      ch = self._chans[key] = (
          Channel("tc-dma", self.chip.dma_bytes_per_s_per_tc, self.chip.clock_hz), hbm,
          Channel("local", self.chip.vmem_vmem_dma_bytes_per_s, self.chip.clock_hz))
    return ch

  def host_link(self, chip_index: int, way: str):
    """Chip `chip_index`'s link to its host's memory in one direction (`way`: "host->" or "->host"),
    shared by its cores (ChipSpec.host_link_bytes_per_s_one_way each way)."""
    key = (chip_index, way)
    ch = self._chans.get(key)
    if ch is None:
      ch = self._chans[key] = (Channel(f"host-link {way}", self.chip.host_link_bytes_per_s_one_way,
                                       self.chip.clock_hz),)
    return ch[0]

  def chip_axis_env(self, chip_index: int) -> dict:
    """{mesh axis: (coordinate, size)} of a chip for the chip-level (shard_map) axes."""
    env = {}
    rest = chip_index
    for name, size, lvl in reversed(self.axes):
      if lvl == "chip":
        env[name] = (rest % size, size)
        rest //= size
    return env

  def register_hbm(self, chip_index: int, bufs) -> None:
    """Make chip `chip_index`'s HBM operands reachable by name from other chips (remote DMA)."""
    for b in bufs:
      self.hbm_peers[(chip_index, b.name)] = b

  def prune_channels(self) -> None:
    """Drop bandwidth-calendar history that no core can reach any more (bounded memory and time): every
    later reservation, on a DMA channel, HBM or an ICI link, starts at or after its issuing core's clock,
    and clocks only move forward, so nothing before the slowest clock can be reserved again."""
    horizon = min(c.now for c in self.cores) if self.cores else 0
    for chans in self._chans.values():
      for ch in chans:
        ch.prune(horizon)
    if self.topology is not None:
      self.topology.prune(horizon)

  def debug_print(self, text: str) -> None:
    self.tpu.debug_print(text)

  # ------------------------------------------------------------------ DMA completion
  def dma_arrived(self, rec, src: bool) -> None:
    """A wait applied copy `rec`'s completion (`src`: of its source side). A copy's source side
    completes only once its data has been read (the sender may reuse the buffer after .wait_send()),
    so the data moves at the first of the two completions; a copy from another core or chip that
    lands later (sim/dma.py `land`) holds its data since its start, and lands at its destination's."""
    if rec.landing is not None:
      if not src:
        dma.land(rec)
    elif not rec.moved:
      memory.copy(rec.req)
      if self.checks.active:
        self.checks.moved(rec.req)
      rec.moved = True
    if src:
      rec.src_applied = True
    else:
      rec.applied = True
    if rec.applied and rec.src_applied:
      self.inflight.pop(rec.seq, None)

  def peer_buffer(self, buf, chip: int, core_id: int, me):
    """The buffer that plays `buf`'s role on (chip, core): the same allocation on every core of an
    SPMD program, or the same-named HBM operand on every chip."""
    if chip == me.chip_index and core_id == me.core_id:
      return buf
    if not (0 <= chip < self.num_chips):
      raise UsageError(f"Remote target chip {chip} is outside the mesh of {self.num_chips} chip(s) in "
                       f"kernel '{self.kernel_name}' (from chip {me.chip_index} core {me.core_id}). "
                       f"Fix: target a chip in 0..{self.num_chips - 1} (e.g. wrap ring neighbours with "
                       f"lax.rem(i + 1, n)), or launch on more chips.")
    if buf.core is None:  # HBM
      if chip == buf.chip:
        return buf
      peer = self.hbm_peers.get((chip, buf.name))
      if peer is None:
        raise UsageError(f"{buf.name} has no copy on chip {chip} in kernel '{self.kernel_name}'. Fix: "
                       f"target a buffer every chip of the launch has (a kernel operand or scratch).")
      return peer
    for c in self.cores:
      if c.chip_index == chip and c.core_id == core_id:
        peer = c.named_buffers.get(buf.key)
        if peer is None and not self.sched.finished(c) and c.alloc_seq < buf.key[1]:
          # the peer has not reached this allocation yet: wait for it (scratch is per-core state)
          me.blocked_on = ConditionWait(lambda: buf.key in c.named_buffers or self.sched.finished(c),
                                        f"{buf.name} to be allocated on chip {chip} core {core_id}",
                                        self.site())
          self.sched.block(me)
          me.blocked_on = None
          peer = c.named_buffers.get(buf.key)
        if peer is None:
          raise SyncError(
              f"{buf.name} is not allocated on chip {chip} core {core_id} (target of a remote access "
              f"from chip {me.chip_index} core {me.core_id}) in kernel '{self.kernel_name}': every "
              f"core must allocate the same scratch in the same order, and it must still be live. Fix: "
              f"allocate it outside any core-dependent branch, and keep the pl.run_scoped open until "
              f"the remote copy was waited.")
        return peer
    raise UsageError(f"Core {core_id} does not exist on chip {chip} in kernel '{self.kernel_name}'; "
                     f"the kernel runs on {len(self.cores)} core(s). Fix: pass a core index in "
                     f"0..{len(self.cores) - 1}.")

  def resolve_device_id(self, me, device_id, home=None):
    """device_id -> (chip, core). Dicts name the axes that change (others: mine; a tuple key names
    several axes, its value a row-major index over them); tuples give every chip-level mesh
    coordinate (plus core axes, if present); ints are logical chip ids (row-major mesh positions).
    `home`: the MeshHome of another mesh of an MPMD launch (a semaphore tied to it), whose core axes
    the id addresses instead of mine; there None is this chip's core of that mesh at my coordinates."""
    chip_axes = [(n, s) for n, s, lvl in self.axes if lvl == "chip"]
    home = me.mesh_home if home is None else home
    core_axes = list(home.axes) if home is not None else []
    if device_id is None:
      device_id = {}
    all_axes = [(n, s, "chip") for n, s in chip_axes] + [(n, s, "core") for n, s in core_axes]
    coords = {n: me.axis_env[n][0] for n, _, _ in all_axes if n in me.axis_env}
    if isinstance(device_id, dict):
      sizes = {n: s for n, s, _ in all_axes}
      for key, v in device_id.items():
        names = key if isinstance(key, tuple) else (key,)
        for name in names:
          if name not in sizes:
            raise UsageError(f"device_id names axis {name!r}, which is not a mesh axis here; axes: "
                             f"{[n for n, _, _ in all_axes] or 'none'}. Fix: name one of those axes.")
        if len(names) == 1:
          coords[names[0]] = int(v)
          continue
        # a joint key ('x', 'y'): a row-major index over those axes, each coordinate wrapping
        # around its axis (as JAX's TPU lowering splits it)
        inner = 1
        for name in reversed(names):
          coords[name] = int(v) // inner % sizes[name]
          inner *= sizes[name]
    elif isinstance(device_id, tuple):
      names = [n for n, _ in chip_axes]
      if len(device_id) == len(chip_axes) + len(core_axes):
        names += [n for n, _ in core_axes]
      elif len(device_id) != len(chip_axes):
        raise UsageError(f"device_id {device_id} has {len(device_id)} coordinates; the mesh axes are "
                         f"{[n for n, _ in chip_axes]}. Fix: give one coordinate per mesh axis, or a dict "
                         f"of the axes that change.")
      coords.update(zip(names, (int(v) for v in device_id)))
    else:
      return int(device_id), me.core_id
    for n, s, _ in all_axes:
      if not 0 <= coords.get(n, 0) < s:
        raise UsageError(f"device_id coordinate {n}={coords[n]} is outside the mesh axis of size {s} "
                         f"(from chip {me.chip_index} core {me.core_id}); a remote copy or signal to a "
                         f"chip outside the mesh is an error. Fix: keep {n} in 0..{s - 1} "
                         f"(e.g. lax.rem(i + 1, {s}) for a ring neighbour).")
    missing = [n for n, _ in core_axes if n not in coords]
    if missing:   # (only a core of another mesh lacks an axis of the target's: JAX refuses it too)
      raise UsageError(f"device_id {device_id} from chip {me.chip_index} core {me.core_id} addresses "
                       f"{home.label}, whose axes {missing} this core's mesh does not have; expected "
                       f"them named in the device_id (JAX's TPU lowering: 'the following axes are "
                       f"missing from the mesh'). Fix: add them, e.g. {{{missing[0]!r}: 0}}.")
    chip = 0
    for n, s in chip_axes:
      chip = chip * s + coords.get(n, 0)
    if not core_axes:
      return chip, me.core_id
    return chip, home.core_ids[tuple(coords[n] for n, _ in core_axes)]

  # ------------------------------------------------------------------ ICI (multi-chip issue)
  def ici_transfer(self, core, dst_chip, start, nbytes):
    """Reserve the ICI route of a copy issued by `core` (its trace row shows the transfer)."""
    s, e, done = self.topology.transfer(core.chip_index, dst_chip, start, nbytes)
    self.ici_bytes += nbytes
    if self.trace.on:
      self.trace.add((core.tid, "ici", f"to chip {dst_chip}", s, done, {"bytes": nbytes}))
    return s, e, done

  def ici_signal_cycle(self, src_chip, dst_chip, now):
    return self.topology.signal_cycle(src_chip, dst_chip, now)

  # ------------------------------------------------------------------ running cores
  def run(self, programs) -> None:
    """programs: list of (core, fn); runs each fn with its core as the current executor (the launch
    holds `paused_gc` around it)."""
    if len(programs) == 1:
      core, fn = programs[0]
      with executor_mod.running_on(core):
        fn()
      return
    Scheduler(self, programs).run()

  # ------------------------------------------------------------------ end of launch
  def release(self) -> None:
    """After the launch's report is recorded: drop every reference the machine and its cores hold. A
    machine is cyclic (cores <-> machine, buffers -> cores, bound methods), so without this its buffers
    (HBM operands, VMEM) would wait for the cyclic GC, which is paused while launches run (`run`): a
    process running launch after launch would hold the memory of old machines longer. The report keeps
    only its events (whose requests name buffers, not machines). Nothing may use the machine after.
    Copies still to land (a launch that failed) are dropped from their buffers."""
    for buf in self.landings.values():
      buf.landing = None
    for c in self.cores:
      c.__dict__.clear()
    self.__dict__.clear()

  def site(self) -> tuple:
    """(file, line) of the user's code issuing the current operation (`util.user_site`), or the
    launch's `fixed_site`."""
    return self.fixed_site or user_site()

  def carry_semaphores(self, core, buf, handles, name: str, imported: bool):
    """`buf` (a semaphore allocation of `core`) is a semaphore operand or result of the launch, kept
    under `handles` (one per element) between launches: `imported` gives it their state now, and the
    launch's end stores its state under them (sim/carried.py). Returns the handles (an imported
    handle the VirtualTPU never issued is replaced: `carried.import_state`)."""
    origins = {}
    if imported:
      handles, origins = carried_mod.import_state(self, buf, handles)
    self.carried.append((core, buf, handles, name, origins))
    return handles

  def finish(self) -> Report:
    # semaphores carried to later launches first: their copies are no longer this launch's to wait
    states = carried_mod.export_states(self, self.carried) if self.carried else None
    if states and any(arrivals for _, _, arrivals, _ in states):
      # a carried copy lands after the launch, not within it: a core's end is its clock and its
      # units' (every other copy was waited, by a core whose clock is past its completion)
      for c in self.cores:
        c.horizon = c.compute_done
    if self.inflight:
      rec = min(self.inflight.values(), key=lambda r: r.seq)
      raise SyncError(
          f"Kernel '{self.kernel_name}' ended with {len(self.inflight)} DMA(s) in flight: "
          f"{rec.req.describe} started at {fmt_site(rec.req.site)} on chip {rec.core.chip_index} core "
          f"{rec.core.core_id}. Did you forget .wait()? Fix: wait for every started copy "
          f"(copy.wait()) before the kernel body returns.")
    end = 0
    busy = {}
    vmem_peak = 0
    flops = 0
    events = []
    for c in self.cores:
      end = max(end, c.finish())
      for _, p, _ in c.dma.prepared.values():   # the local copies each CopyPlan timed (sim/dma.py)
        if p.copies:
          self.trace.count_dma(p.kind, p.bytes, p.copies)
          self.hbm_bytes += p.bytes * p.hbm_sides
          p.copies = p.bytes = 0
      for u, v in c.unit_busy.items():
        busy[u] = max(busy.get(u, 0), v)
      vmem_peak = max(vmem_peak, c.vmem_peak)
      flops += c.flops
    self.checks.finish()
    if states:
      carried_mod.rebase(self.tpu, states, end)
    events = self.trace.events
    return Report(self.kernel_name, self.chip, self.num_chips, int(round(end)), flops, self.hbm_bytes,
                  busy, vmem_peak, sum(c.steps for c in self.cores) or self.grid_steps,
                  self.dma_count, events, self.ici_bytes,
                  self.timing_only, exact_f32_dots=self.tpu.exact_f32_dots,
                  shared_dots=self.tpu.shared_dots, host_math=self.tpu.host_math)


class VirtualTPU:
  """A virtual TPU system: `with pl.virtual_tpu("v5e") as tpu: ...; tpu.reports[-1]`.

  Bug checks (docs in sim/races.py): `detect_races=True` runs a happens-before race detector over every
  load, store, DMA, semaphore and barrier (RaceError); `uninitialized="raise"` makes the first read of
  never-written scratch or output memory raise UninitializedReadError (default "nan": it reads as NaN or
  an int sentinel). Deadlocks, DMAs in flight or semaphores non-zero at the end, unused DMA descriptors,
  out-of-bounds accesses and non-consecutive output revisits are always checked. `p_state=` selects a
  clock of a chip with P-states (7x: 0-7 = 1.6-2.2 GHz; the preset is P-state 7, the published peak).
  `keep_trace_events=` bounds the trace events its reports keep in all (default 1,000,000, about
  150 MB; None keeps every launch's trace): past it the oldest reports drop their timelines, never
  their figures. `replay=True` (default) lets a launch that its front end proved to have a
  data-independent schedule (palace.jax kernels: jax/schedule.py) reuse the report of an earlier launch
  of the same plan and keyed operands, computing its data on an untimed core (sim/replay.py); the
  report is the one the full machine would give. `replay=False` runs every launch on the full machine.
  `steady_state=True` (default) lets a timing-only grid whose steps provably repeat time one period
  and advance over the rest (pipeline_steady.py; the report is the one stepping every point gives);
  `steady_state=False` steps every grid point. `exact_f32_dots=True` is a diagnostic, NOT the chip:
  float32 dots at the default precision multiply their operands unrounded (as XLA:CPU and JAX's
  interpret mode do) instead of rounded to bfloat16 as the chip's MXU does (lang/mxu.py); every report
  made under it says so. It tells a test whose reference was computed exactly on the CPU apart from a
  wrong kernel (docs/jax.md, "Diagnostic: exact float32 dots"). `shared_dots=True`, also a diagnostic
  and NOT the chip, keeps the chip's rounding and sums every float dot by one fixed rule
  (lang/mxu.shared_product), which palace.jax applies to XLA:CPU's dots outside the kernel too
  (docs/jax.md, "Diagnostic: shared dots"). `dot_numerics=` chooses who orders the sums of a float dot
  in a kernel: "blas" (default) the host BLAS's float32 GEMM (the chip's rounding of operands, the
  machine's summation order); "mxu" the v5e's measured order, bit for bit on the recorded chip outputs
  but about ten times the host CPU (lang/mxu.chip_product, docs/numerics.md). Timing is the same in both.
  `host_math=True`, a diagnostic and NOT the chip (combinable with either dot diagnostic), evaluates a
  kernel's transcendentals (exp, log, tanh, erf_inv, ...) by XLA:CPU through JAX instead of palace's rule
  of the chip's (lang/host_math.py; docs/jax.md, "Diagnostic: math on XLA:CPU"); timing is unchanged."""

  def __init__(self, chip="v5e", num_chips: int = 1, *, timing_only: bool = False,
               dma_policy: str = "eager", seed: int = 0, trace: bool = True, topology=None,
               detect_races: bool = False, uninitialized: str = "nan", p_state=None,
               keep_trace_events=KEEP_TRACE_EVENTS, replay: bool = True, steady_state: bool = True,
               exact_f32_dots: bool = False, shared_dots: bool = False, dot_numerics: str = "blas",
               host_math: bool = False):
    hostmem.tune_allocator()   # (process-wide host tuning, once: keeps block-sized pages mapped)
    if not isinstance(chip, hw.ChipSpec):
      validate.as_name(chip, "pl.virtual_tpu(chip)", hint=f"pass a chip name: {', '.join(hw.CHIPS)}.")
    self.chip = hw.get_chip(chip)
    if p_state is not None:  # a P-state of a chip with several clocks (7x): hw.with_p_state
      self.chip = hw.with_p_state(self.chip, p_state)
    self.num_chips = validate.as_int(num_chips, "pl.virtual_tpu(num_chips)", min_value=1)
    pod = self.chip.max_pod_devices
    if self.num_chips > pod:
      raise UsageError(
          f"pl.virtual_tpu({self.chip.name!r}, num_chips={self.num_chips}): the largest {self.chip.name} "
          f"pod (ICI domain) has {pod} devices. Fix: pass num_chips <= {pod}, or model a multi-pod "
          f"system as separate launches per pod.")
    self.timing_only = validate.as_bool(timing_only, "pl.virtual_tpu(timing_only)")
    self.dma_policy = validate.as_choice(dma_policy, "pl.virtual_tpu(dma_policy)", DMA_POLICIES)
    self.seed = validate.as_int(seed, "pl.virtual_tpu(seed)")
    self.trace = validate.as_bool(trace, "pl.virtual_tpu(trace)")
    self.topology = None if topology is None else check_topology(self.chip, self.num_chips, topology)
    Topology(self.chip, self.num_chips, self.topology)  # validate early
    self.detect_races = validate.as_bool(detect_races, "pl.virtual_tpu(detect_races)")
    if not isinstance(uninitialized, str) or uninitialized not in ("nan", "raise"):
      raise UsageError(f"pl.virtual_tpu(uninitialized={uninitialized!r}): expected 'nan' (never-written "
                       f"memory reads as NaN or an int sentinel) or 'raise' (the first such read raises). "
                       f"Fix: pass one of those two strings.")
    self.uninitialized = uninitialized
    self.keep_trace_events = None if keep_trace_events is None else validate.as_int(
        keep_trace_events, "pl.virtual_tpu(keep_trace_events)", min_value=0)
    # reports of replayable launches (sim/replay.py), None with replay=False
    self.replays = ReplayMemo() if validate.as_bool(replay, "pl.virtual_tpu(replay)") else None
    # timing-only grids whose steps provably repeat are timed per period and extrapolated
    # (pipeline_steady.py, sim/steady.py); False steps every grid point. `extrapolated_steps` counts
    # the grid steps advanced over instead of stepped, over all launches
    self.steady_state = validate.as_bool(steady_state, "pl.virtual_tpu(steady_state)")
    # a diagnostic that is not the chip: DEFAULT-precision f32 dots unrounded (lang/mxu.rounds_to_bf16)
    self.exact_f32_dots = validate.as_bool(exact_f32_dots, "pl.virtual_tpu(exact_f32_dots)")
    # a diagnostic that is not the chip: float dots by one summation rule (lang/mxu.shared_product)
    self.shared_dots = validate.as_bool(shared_dots, "pl.virtual_tpu(shared_dots)")
    if self.exact_f32_dots and self.shared_dots:
      raise UsageError("pl.virtual_tpu(exact_f32_dots=True, shared_dots=True): two diagnostics that "
                       "compute float32 dots differently, observed both on; expected at most one. Fix: "
                       "pass one of them.")
    # a diagnostic that is not the chip: transcendentals as XLA:CPU computes them (lang/host_math.py)
    self.host_math = validate.as_bool(host_math, "pl.virtual_tpu(host_math)")
    if self.host_math and importlib.util.find_spec("jax") is None:
      raise UnsupportedError("pl.virtual_tpu(host_math=True): the diagnostic evaluates a kernel's "
                             "transcendentals by XLA:CPU through JAX, which is not installed here. Fix: "
                             "install jax, or leave host_math off (the chip's rule).")
    # who orders a float dot's sums: the host BLAS, or the chip's measured rule (lang/mxu.chip_product)
    self.dot_numerics = validate.as_choice(dot_numerics, "pl.virtual_tpu(dot_numerics)", DOT_NUMERICS)
    self.extrapolated_steps = 0
    self._traced = collections.deque()   # the reports still holding trace events, oldest first
    self._traced_events = 0
    self.reports: list[Report] = []
    self.carried = carried_mod.CarriedSemaphores()   # semaphores kept between launches (sim/carried.py)
    self.debug_output: list[str] = []
    self._parent = None
    self._cost_memos = None

  def __enter__(self):
    # Entered contexts form a stack per thread/context: (tpu, what was active before it). Re-entering
    # the same object, nesting and out-of-order exits all leave the right TPU active (never a stale one).
    stack = _entered.get()
    if not any(t is self for t, _ in stack):
      self._parent = _active.get()
    _entered.set(stack + ((self, _active.get()),))
    _active.set(self)
    return self

  def __exit__(self, *exc):
    stack = list(_entered.get())
    k = max((i for i, (t, _) in enumerate(stack) if t is self), default=None)
    if k is None:   # exited more often than entered: nothing of this object is active
      return False
    _, prior = stack.pop(k)
    if k < len(stack):   # an inner context is still open: it inherits what was active before this one
      stack[k] = (stack[k][0], prior)
    _entered.set(tuple(stack))
    _active.set(stack[-1][0] if stack else prior)
    if not any(t is self for t, _ in stack):
      self._parent = None
    return False

  def record(self, report) -> None:
    """Keep a launch's report here and in every enclosing `virtual_tpu` context: the launches of a
    nested context (a script's own `with pl.virtual_tpu(...)` under `palace run`) count for both."""
    stack = [t for t, _ in reversed(_entered.get())]
    if any(t is self for t in stack):   # the contexts open in this thread, innermost first
      chain = stack
    else:                               # a shard_map chip thread: the entered TPU and its parents
      chain, tpu = [], self
      while tpu is not None and not any(tpu is t for t in chain):
        chain.append(tpu)
        tpu = tpu._parent
    seen = []
    for tpu in [self] + chain:
      if not any(tpu is t for t in seen):   # each context once, however often it was entered
        tpu.reports.append(report)
        seen.append(tpu)
    self._keep_trace(report)

  def _keep_trace(self, report) -> None:
    """Bound the memory of the traces kept by `reports`: once they hold more than `keep_trace_events`
    events, the oldest reports drop theirs (never the newest launch's). Every report keeps its figures;
    only its timeline goes (to_perfetto and plot_timeline then say so). A loop of launches (a jitted
    training step under palace.jax, a test suite under PALACE_JAX) would otherwise grow without bound:
    a launch keeps up to 200,000 events, about 150 bytes each."""
    if self.keep_trace_events is None or not report.trace_log:
      return
    self._traced.append(report)
    self._traced_events += len(report.trace_log)
    while self._traced_events > self.keep_trace_events and len(self._traced) > 1:
      old = self._traced.popleft()
      self._traced_events -= len(old.trace_log)
      old.drop_trace(self.keep_trace_events)

  def debug_print(self, text: str) -> None:
    """A kernel's debug print (pl.debug_print): kept in `debug_output` and printed."""
    self.debug_output.append(text)
    print(text)

  def cost_memos(self) -> tuple:
    """The memoised cost rules of this TPU's chip (tensorcore.cost_memos), made at the first launch
    and shared by every core of every launch: pure functions of the frozen chip spec, which a launch
    would otherwise recompute for each op kind and shape it meets."""
    memos = self._cost_memos
    if memos is None or memos[0] is not self.chip:
      memos = self._cost_memos = (self.chip, *cost_memos(self.chip))
    return memos[1:]

  def chip_coords(self, chip: int) -> tuple:
    """(x, y, z) of logical chip `chip` in this system's ICI torus, as a JAX TPU device's `coords`
    reads (2-D tori: z = 0)."""
    c = Topology(self.chip, self.num_chips, self.topology).coords(chip)
    return tuple(c) + (0,) * (3 - len(c))

  def new_machine(self, kernel_name: str, num_chips: int = 1) -> Machine:
    """A fresh machine for one launch: chip 0 only, or the whole pod for an SPMD (shard_map) launch."""
    return Machine(self, kernel_name, self.timing_only, num_chips)

  def __repr__(self):
    return (f"VirtualTPU(chip={self.chip.name!r}, num_chips={self.num_chips}, timing_only="
            f"{self.timing_only}, dma_policy={self.dma_policy!r}, launches={len(self.reports)}"
            + (", exact_f32_dots=True (a diagnostic: not the chip's numerics)" if self.exact_f32_dots
               else "")
            + (", shared_dots=True (a diagnostic: not the chip's numerics)" if self.shared_dots else "")
            + (", host_math=True (a diagnostic: not the chip's numerics)" if self.host_math else "")
            + (f", dot_numerics={self.dot_numerics!r}" if self.dot_numerics != "blas" else "")
            + ")")


_active: contextvars.ContextVar = contextvars.ContextVar("palace_virtual_tpu", default=None)
_entered: contextvars.ContextVar = contextvars.ContextVar("palace_virtual_tpu_stack", default=())


def active_tpu() -> VirtualTPU:
  """The VirtualTPU of the innermost `with pl.virtual_tpu(...)`, or a fresh default one (v5e)."""
  tpu = _active.get()
  return tpu if tpu is not None else VirtualTPU(hw.DEFAULT_CHIP)


def explicit_tpu() -> VirtualTPU | None:
  """The VirtualTPU of the innermost `with pl.virtual_tpu(...)`, or None outside any."""
  return _active.get()


def activate(tpu: VirtualTPU):
  """Make `tpu` the active VirtualTPU of this thread (shard_map's per-chip threads); returns a token
  for `deactivate`."""
  return _active.set(tpu)


def deactivate(token) -> None:
  """Undo the `activate` that returned `token` (threads that outlive the launch: workers, XLA's)."""
  _active.reset(token)
