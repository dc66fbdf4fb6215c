"""Running a launch plan (L5): the one function every front end's launch goes through.

`run(plan, operands)`:
1. host side: HBM buffers for the outputs (copies of aliased inputs; pipelined outputs start empty and
   only their never-written blocks are filled afterwards), one machine per launch, or the shard_map
   group's shared machine (spmd.py) when the call comes from a shard_map program;
2. per chip (`_Launch.build`): the operands' HBM buffers, the cores (grid launches: the megacore split
   of the grid over TensorCores, `megacore_split`; mesh launches: one core per mesh position) and one
   program per core;
3. per core (`_CoreProgram`, run by the machine's scheduler): a fresh `KernelContext`, the barrier
   semaphore, the staged VMEM/SMEM copies, the scratch, then the kernel body: a mesh body is called
   once, a grid body through the pipeline (pipeline.Pipeline: BlockSpecs -> DMAs), which calls it
   once per grid point. Everything is freed in reverse; after an error it is freed quietly.
4. a replayed launch (sim/replay.py) is kept (`_Warm`): the next launch with the same plan and key
   reuses its core, refs, pipeline and buffers instead of making them again.
"""
from __future__ import annotations

import itertools

import numpy as np

from palace._src import executor, hw
from palace._src.blocks import BLOCKED, SQUEEZED
from palace._src.core import (CORE_PARALLEL, PARALLEL, MemoryRef, MemorySpace, SemaphoreRefType,
                              SemaphoreType, TensorCoreMesh, canonical_semantics)
from palace._src.errors import ResourceError, SyncError, UnsupportedError, UsageError
from palace._src.launch import host
from palace._src.launch.plan import ENTRIES, LEAVES, OPERAND, LaunchPlan
from palace._src.launch.sc_mesh import VectorSubcoreMesh, check_for_chip
from palace._src.lang import context, mxu_fifo
from palace._src.lang.primitives import close_scope, open_scope
from palace._src.lang.refs import Ref
from palace._src.lang.tpu_primitives import AsyncCopyDescriptor
from palace._src.pipeline import Pipeline
from palace._src.sim import memory
from palace._src.sim.machine import active_tpu
from palace._src.util import fmt_bytes, fmt_site, prod, tree_flatten, tree_unflatten


def run(plan: LaunchPlan, operands, out=None, tpu=None) -> list:
  """Run `plan` on the VirtualTPU `tpu` (None: the active one, looked up here, once per launch) with
  one HBM value per `plan.operands` entry (NumPy arrays with the operand's dtype, or mutable Refs);
  returns the outputs' NumPy arrays in `plan.outputs` order. `out`: per output, None or a writable
  array of its shape and dtype to compute it in (then returned as that output: palace.jax hands XLA's
  result buffers, so no copy follows the launch)."""
  operands = list(operands)
  if tpu is None:
    tpu = active_tpu()
  hw.check_internal_scratch(tpu.chip, plan.params.internal_scratch_in_bytes, plan.kernel_name,
                            plan.fixed_site or plan.site)
  ctx = host.spmd_context()
  if ctx is not None:  # inside shard_map: every chip's thread reaches this launch; one machine runs them
    launch = _Launch(plan, operands, tpu, out=out)
    try:
      ctx[0].collective_launch(ctx[1], plan.kernel_name, launch.build, plan.num_points)
    finally:
      launch.fill_unwritten()
    return [b.storage for b in launch.out_bufs]
  replay = None if plan.replay_operands is None else _replay_key(plan, operands)
  lm = host.launch_machine(tpu, plan.kernel_name, 1, plan.num_points, replay)
  launch = None
  try:
    with lm as machine:
      warm = lm.warm
      if warm is not None:   # a replayed launch kept from the last one with this plan and key
        launch = _Launch(plan, operands, tpu, warm.out_bufs, out)
        warm.run(launch, machine)
        lm.keep = warm
      else:
        launch = _Launch(plan, operands, tpu, out=out)
        keep = lm.may_keep and not any(isinstance(v, Ref) for v in operands)
        programs = launch.build(machine, 0, keep)
        try:
          machine.run(programs)
        except SyncError as e:
          barrier_notes(e, programs)
          raise
        if keep and len(programs) == 1:
          lm.keep = _Warm(*programs[0], launch.out_bufs)
      memory.settle(launch.out_bufs)   # (matmul outputs: one batch of GEMMs on the launch's threads)
  finally:
    if launch is not None:
      launch.fill_unwritten()
  results = [b.storage for b in launch.out_bufs]
  if lm.keep is not None:
    lm.keep.park()
    lm.give_back()
  return results


def barrier_notes(error, programs) -> None:
  """A launch that failed with cores left waiting in pltpu.core_barrier (a deadlock, or a core gone
  past the barrier): name each such core and the cores of the launch that never reached a barrier."""
  waiting = [(core, prog.kctx.in_barrier) for core, prog in programs
             if getattr(prog, "kctx", None) is not None and prog.kctx.in_barrier]
  if not waiting:
    return
  absent = [f"chip {core.chip_index} core {core.core_id}" for core, prog in programs
            if getattr(prog, "kctx", None) is None or not prog.kctx.in_barrier]
  for core, where in waiting:
    error.add_note(f"chip {core.chip_index} core {core.core_id} is left waiting in {where}: "
                   f"{', '.join(absent) or 'no other core'} never reached a core_barrier. Fix: every core "
                   f"of the axis must call core_barrier the same number of times; do not put it under "
                   f"pl.when or a core-dependent loop.")


class _Warm:
  """A replayed launch kept for the next launch with the same plan and key (sim/replay.py keeps it
  with the memo's report): its ReplayCore, its program with the scopes open and the pipeline made (the
  block copies prepared per block and slot), and its HBM buffers, which each launch rebinds to its own
  operands and outputs. Between launches it is parked: every buffer as freshly allocated and no
  reference to a launch's arrays kept. So a launch on it computes what a fresh replayed launch would,
  without making the core, the refs, the pipeline and the buffers again."""
  __slots__ = ("core", "program", "out_bufs")

  def __init__(self, core, program: _CoreProgram, out_bufs):
    self.core, self.program, self.out_bufs = core, program, out_bufs

  def run(self, launch: _Launch, machine) -> None:
    prog = self.program
    plan = launch.plan
    for k, (o, v) in enumerate(zip(plan.operands, launch.operands)):
      if k not in plan.aliases:
        host.hbm_input(v, o.name, 0, into=prog.in_bufs[k])
    prog.launch = launch
    machine.fixed_site = plan.fixed_site
    self.core.unused_dmas.clear()
    machine.adopt(self.core)
    machine.run([(self.core, prog.rerun)])

  def park(self) -> None:
    prog = self.program
    prog.park()
    prog.launch = None
    for b in (*prog.in_bufs, *self.out_bufs):
      b.rebind(None)


def _replay_key(plan: LaunchPlan, operands):
  """(plan, the bytes of its keyed operands): the key under which a replayable plan's launches share
  one schedule (sim/replay.py); None when a keyed operand is a mutable ref (its contents change)."""
  key = []
  for i in plan.replay_operands:
    a = operands[i]
    if not isinstance(a, np.ndarray):
      return None
    key.append((a.dtype.str, a.shape, a.tobytes()))
  return plan, tuple(key)


def _in_host_memory(plan: LaunchPlan) -> tuple:
  """(operand indices, output indices) of a grid launch's operands and outputs in the host's pinned
  memory (pl.HOST block mappings): their buffers live there, reached by DMA across the host link."""
  if not plan.is_grid:
    return frozenset(), frozenset()
  nsp = plan.num_prefetch
  return (frozenset(nsp + k for k, m in enumerate(plan.in_maps) if m.space is MemorySpace.HOST),
          frozenset(i for i, m in enumerate(plan.out_maps) if m.space is MemorySpace.HOST))


class _Launch:
  """The host-side state of one run: output buffers and which output blocks the pipelines wrote."""

  def __init__(self, plan: LaunchPlan, operands: list, tpu, out_bufs=None, out=None):
    self.plan, self.operands = plan, operands
    self.lazy = {} if not plan.is_grid or host.eager_output_init(tpu) else _lazy_outputs(plan)
    timing_only = tpu.timing_only
    # Pipelined outputs start as np.empty and only blocks never written back are filled afterwards
    # (same result as filling everything first, without touching every page twice); on a timing-only
    # machine outputs are shape and dtype only (memory.hbm_output).
    # (`out_bufs`: a kept launch's output buffers (`_Warm`), given this launch's storage; `out`: run's)
    out = out or [None] * len(plan.outputs)
    self.out_bufs = [memory.hbm_output(o.shape, o.dtype, o.name, timing_only, lazy=i in self.lazy,
                                       into=None if out_bufs is None else out_bufs[i], storage=out[i])
                     for i, o in enumerate(plan.outputs)]
    host_ins, host_outs = _in_host_memory(plan)
    for i in host_outs:
      self.out_bufs[i].memory_space = MemorySpace.HOST
    for i in plan.xla_vmem[1]:   # (outputs XLA takes from VMEM: palace.jax, jax/xla_placement.py)
      self.out_bufs[i].memory_space = MemorySpace.VMEM
    self.host_ins = host_ins
    for a_in, a_out in plan.aliases.items():
      memory.alias_input(self.out_bufs[a_out], operands[a_in], timing_only, own=out[a_out] is not None)
    self.written = {}   # output index -> element offsets of the blocks written back (all cores)
    self.homes = {}     # mesh launches: chip -> the MeshHome of each of plan.meshes there

  def fill_unwritten(self) -> None:
    """After the run (or its error): the never-written blocks of lazy outputs get the fill value."""
    for i, num_blocks in self.lazy.items():
      _fill_unwritten(self.out_bufs[i].storage, self.plan.out_maps[i], self.written.get(i, ()), num_blocks)

  def build(self, machine, chip_index: int, keep: bool = False) -> list:
    """This chip's HBM buffers, cores and [(core, program)] (spmd.py calls it once per chip); `keep`:
    the programs may be kept for the next launch (`_CoreProgram`)."""
    plan = self.plan
    machine.fixed_site = plan.fixed_site
    in_bufs = []
    for k, (o, v) in enumerate(zip(plan.operands, self.operands)):
      if isinstance(v, Ref):
        v.buf.chip = chip_index
        in_bufs.append(v)
      elif k in plan.aliases:
        # an aliased input IS its output's HBM buffer, as on a TPU (and in JAX's interpret mode):
        # what the kernel writes through the input ref is in the output, and the reverse
        in_bufs.append(self.out_bufs[plan.aliases[k]])
      else:
        in_bufs.append(host.hbm_input(v, o.name, chip_index))
        if k in self.host_ins:
          in_bufs[-1].memory_space = MemorySpace.HOST
        elif k in plan.xla_vmem[0]:
          in_bufs[-1].memory_space = MemorySpace.VMEM
    for b in self.out_bufs:
      b.chip = chip_index  # each chip's outputs live on it (remote DMAs to chip 0 found the sender's own)
    if plan.is_grid:
      cache = plan.cache()
      key = ("megacore split", machine.chip.num_tensorcores_per_device)
      core_points = cache.get(key)
      if core_points is None:   # (the split of the plan's grid over this many TensorCores)
        core_points = cache[key] = megacore_split(machine.chip, plan.grid, plan.params.dimension_semantics,
                                                  plan.kernel_name)
      env = machine.chip_axis_env(chip_index)
      cores = [machine.add_core(chip_index, c, env, plan.params) for c in range(len(core_points))]
      _check_vmem(cores[0], plan)
      work = [(c, plan.bodies[0], pts) for c, pts in zip(cores, core_points)]
    else:
      work, homes = [], []
      for body, mesh in zip(plan.bodies, plan.meshes):
        cores = _mesh_cores(machine, chip_index, mesh, plan.params, plan.kernel_name)
        homes.append(cores[0].mesh_home)
        work += [(c, body, None) for c in cores]
      self.homes[chip_index] = homes
    if plan.semaphores and len(work) > 1:
      raise UnsupportedError(
          f"Kernel '{plan.kernel_name}' takes or returns a semaphore and runs on {len(work)} cores of "
          f"chip {chip_index}: a semaphore carried between launches belongs to one core here, and "
          f"which core's copy a later launch would wait on is not modelled. Fix: run it on one core "
          f"(dimension_semantics 'arbitrary', or a one-core mesh), or start and wait the copy in the "
          f"same kernel.")
    machine.register_hbm(chip_index, [b.buf if isinstance(b, Ref) else b for b in in_bufs] + self.out_bufs)
    return [(c, _CoreProgram(self, in_bufs, body, pts, keep)) for c, body, pts in work]


class _CoreProgram:
  """What one core runs (the machine's scheduler calls it): language context, barrier semaphore, staged
  copies, scratch, the body (a grid body through its `Pipeline`). `keep`: the launch is a replayed
  one that may be kept for the next launch of its plan and key (`_Warm`): the scopes stay open and the
  pipeline made after the run, and `rerun` runs the body again on the same buffers."""

  def __init__(self, launch: _Launch, in_bufs, body, points, keep: bool = False):
    self.launch, self.in_bufs, self.body, self.points, self.keep = launch, in_bufs, body, points, keep
    self.scopes = []       # the buffers of each open scope (barrier, staged, scratch), in order
    self.pipe = None
    self.barrier = None
    self.kctx = None       # the KernelContext of the last run (barrier_notes reads it after a failure)

  def __call__(self) -> None:
    ex = executor.current()
    kctx = self.kctx = context.KernelContext()
    token = context.enter(kctx)
    try:
      self._open(ex)
      self._run(kctx)
      mxu_fifo.check_end(kctx)
      if not self.keep:
        self._close(ex)
    except BaseException:
      kctx.barrier_sem = None
      self._close(ex, quiet=True)
      raise
    finally:
      context.leave(token)

  def rerun(self) -> None:
    """The run of a kept program (`_Warm.run`), on the buffers `_Warm.park` renewed."""
    kctx = context.KernelContext()
    token = context.enter(kctx)
    try:
      self._run(kctx)
      mxu_fifo.check_end(kctx)
    finally:
      context.leave(token)

  def _open(self, ex) -> None:
    """Allocate the scopes and make the kernel's refs (and its pipeline, for a grid launch)."""
    launch, plan = self.launch, self.launch.plan
    if plan.params.collective_id is not None:
      (self.barrier,), _, bufs = open_scope(ex, (SemaphoreType.BARRIER,), {}, "barrier_semaphore")
      self.scopes.append(bufs)
    operands = [b if isinstance(b, Ref) else Ref(b) for b in self.in_bufs]
    outputs = [Ref(b) for b in launch.out_bufs]
    if plan.semaphores:
      self._carried_semaphores(ex, operands, outputs)
    # the staged copies: prepared once (a kept program runs them again), on one DMA semaphore
    types, names = [s.type for s in plan.staged], [s.name for s in plan.staged]
    if types:
      types.append(SemaphoreType.DMA)
      names.append("staged copies' DMA semaphore")
    staged, _, bufs = open_scope(ex, types, {}, "staged", names=names)
    self.scopes.append(bufs)
    self.copy_in, self.copy_out = [], []
    for s, r in zip(plan.staged, staged):
      if s.kind == OPERAND:
        self.copy_in.append(AsyncCopyDescriptor(operands[s.index], r, staged[-1], api="pltpu.sync_copy")
                            .prepare(ex))
        if s.write_back:   # the aliased output's ref too: its buffer is the operand's (Stage)
          self.copy_out.append(AsyncCopyDescriptor(r, operands[s.index], staged[-1], api="pltpu.sync_copy")
                               .prepare(ex))
          if s.index in plan.aliases:   # (a mesh launch's mutable ref is its own output)
            outputs[plan.aliases[s.index]] = r
        operands[s.index] = r
      else:
        self.copy_out.append(AsyncCopyDescriptor(r, outputs[s.index], staged[-1], api="pltpu.sync_copy")
                             .prepare(ex))
        outputs[s.index] = r
    scratch = plan.scratch
    is_dict = isinstance(scratch, dict)
    # (scratch counts against the whole VMEM, not the scoped limit: sim/memory.Allocator)
    scr, kw_scr, bufs = open_scope(ex, () if is_dict else scratch, scratch if is_dict else {}, "scratch")
    self.scopes.append(bufs)
    if not plan.is_grid:
      _tie_to_meshes(plan, launch.homes[ex.chip_index], scratch, bufs)
    if plan.is_grid:
      lead = tuple(tree_unflatten(plan.operand_tree, operands[:plan.num_prefetch]))
      self.pipe = Pipeline(self.body, plan.grid, plan.in_maps, plan.out_maps, operands[plan.num_prefetch:],
                           outputs, lead_args=lead, tail_args=scr, tail_kwargs=kw_scr, index_args=lead,
                           points=self.points, offsets_cache=plan.cache())
    else:
      if plan.outputs_as == LEAVES:
        out_args = outputs
      else:
        tree = tree_unflatten(plan.output_tree, outputs)
        out_args = tuple(tree) if plan.outputs_as == ENTRIES else (tree,)
      self.args = (*tree_unflatten(plan.operand_tree, operands), *out_args, *scr)
      self.kwargs = kw_scr

  def _carried_semaphores(self, ex, operands, outputs) -> None:
    """The launch's semaphore operands and results (`LaunchPlan.semaphores`): semaphore refs in place
    of their HBM refs, carrying the state kept under their int32 handles (sim/carried.py). Not in a
    scope of the program: the machine keeps them to the launch's end, where a peer chip's remote copy
    may still signal them after this core's body returned."""
    launch, plan = self.launch, self.launch.plan
    sems = plan.semaphores
    refs, _, _ = open_scope(ex, [t for _, _, t in sems], {}, "semaphores",
                            names=[(plan.operands if kind == OPERAND else plan.outputs)[i].name
                                   for kind, i, _ in sems])
    aliased = {o: i for i, o in plan.aliases.items()}
    by_operand = {}
    for (kind, i, _), ref in zip(sems, refs):
      if kind == OPERAND:
        v = launch.operands[i]
        given = v.buf.storage if isinstance(v, Ref) else np.asarray(v)   # (a JAX mutable ref: a Ref)
        handles = ex.carry_semaphores(ref.buf, plan.operands[i].name, given)
        if isinstance(v, Ref) and not np.array_equal(handles, given):   # a fresh semaphore ref's
          _put_handles(v.buf, handles)
        operands[i] = ref
        by_operand[i] = (ref, handles)
    for (kind, i, _), ref in zip(sems, refs):
      if kind == OPERAND:
        continue
      if i in aliased and aliased[i] in by_operand:   # the operand's semaphore, under its handles
        outputs[i], handles = by_operand[aliased[i]]
      else:
        outputs[i], handles = ref, ex.carry_semaphores(ref.buf, plan.outputs[i].name)
      _put_handles(launch.out_bufs[i], handles)

  def _run(self, kctx) -> None:
    """The staged copies in, the body (through the pipeline), the staged copies out."""
    kctx.barrier_sem = self.barrier
    for copy in self.copy_in:
      copy.start()
      copy.wait()
    if self.pipe is not None:
      self.pipe.run(self.launch.written)
    else:
      res = self.body(*self.args, **self.kwargs)
      if res is not None:
        raise UsageError(f"Kernel '{self.launch.plan.kernel_name}' returned {type(res).__name__}; pl.kernel "
                         f"bodies must return None. Fix: write their results to output refs and drop the "
                         f"return.")
    for copy in self.copy_out:
      copy.start()
      copy.wait()
    kctx.barrier_sem = None

  def _close(self, ex, quiet: bool = False) -> None:
    """Free the pipeline's buffers and the scopes, last opened first (`quiet`: after an error)."""
    if self.pipe is not None:
      pipe, self.pipe = self.pipe, None
      pipe.close(quiet)
    while self.scopes:
      close_scope(ex, self.scopes.pop(), quiet)

  def park(self) -> None:
    """After a kept run: the pipeline's state and every buffer of the program as freshly made."""
    if self.pipe is not None:
      self.pipe.park()
      if self.pipe.bufs is not None:
        memory.renew(self.pipe.bufs)
    for bufs in self.scopes:
      memory.renew(bufs)


def _tie_to_meshes(plan: LaunchPlan, homes: list, scratch, bufs: list) -> None:
  """A mesh launch's scratch semaphores tied to one of its meshes (`SemaphoreType.REGULAR(()) @ mesh`,
  MPMD): each core allocates every scratch entry, so a core of another mesh holds a stand-in of the
  same name, through which it signals the semaphore on that mesh's cores (its `home`: a device id then
  addresses that mesh's axes, sim/machine.resolve_device_id; waits and DMAs on it are refused,
  lang/primitives.sem_target). A mesh the launch does not run on is refused."""
  leaves = tree_flatten(scratch, is_leaf=lambda x: isinstance(x, (MemoryRef, SemaphoreRefType)))[0]
  for t, b in zip(leaves, bufs):
    mesh = getattr(t, "mesh", None)
    if mesh is None or b is None:
      continue
    if mesh not in plan.meshes:
      raise UnsupportedError(
          f"{fmt_site(plan.fixed_site or plan.site)}: "
          f"{b.name} of kernel '{plan.kernel_name}' is a semaphore tied to {mesh!r}, a mesh the kernel "
          f"does not run a body on (meshes: {list(plan.meshes)}): a semaphore of an external mesh is "
          f"not supported in palace yet. Fix: tie it to one of the kernel's meshes, or pass a body for "
          f"that mesh.")
    b.home = homes[plan.meshes.index(mesh)]


def _put_handles(buf, handles) -> None:
  """A semaphore result's HBM value: its handles (`LaunchPlan.semaphores`)."""
  handles = np.asarray(handles).reshape(buf.shape).astype(buf.dtype)
  if buf.storage is not None and buf.storage.flags.writeable:
    buf.storage[...] = handles
  else:   # (a timing-only launch's outputs hold no data; the handles are the result all the same)
    buf.rebind(handles)


# ------------------------------------------------------------------ cores
def megacore_split(chip, grid, semantics, kname):
  """Grid points per TensorCore. On megacore chips (v4, v5p) the first 'parallel'/'core_parallel' axis
  of the leading run of such axes is split into contiguous ranges, one per core (uneven when it does
  not divide); 'arbitrary' axes stay on one core. Elsewhere every point runs on core 0."""
  points = list(itertools.product(*[range(g) for g in grid]))
  if semantics is None:
    return [points]
  sem = [canonical_semantics(x) for x in semantics]
  if len(sem) != len(grid):
    raise UsageError(f"pallas_call '{kname}': dimension_semantics has {len(sem)} entries for a grid of "
                     f"{len(grid)} axes {grid}. Fix: give one entry per grid axis.")
  n = chip.num_tensorcores_per_device
  if n < 2:
    return [points]
  axis = None
  for a, x in enumerate(sem):
    if x not in (PARALLEL, CORE_PARALLEL):
      break
    if grid[a] >= n:
      axis = a
      break
  if axis is None:
    return [points]
  size = grid[axis]
  bounds = [(c * size) // n for c in range(n + 1)]
  return [[p for p in points if bounds[c] <= p[axis] < bounds[c + 1]] for c in range(n)]


def _mesh_cores(machine, chip_index, mesh, params, kname):
  """The cores of one pl.kernel mesh on this chip, with their mesh axes (for device_id)."""
  chip = machine.chip
  env = machine.chip_axis_env(chip_index)
  if isinstance(mesh, TensorCoreMesh):
    n = chip.num_tensorcores_per_device if mesh.num_cores is None else mesh.num_cores
    if n > chip.num_tensorcores_per_device or n < 1:
      raise UsageError(
          f"TensorCoreMesh(num_cores={n}) for kernel '{kname}': {chip.name} has "
          f"{chip.num_tensorcores_per_device} TensorCore(s) per device"
          + (" (7x exposes each TensorCore as its own device)" if chip.name == "7x" else "")
          + f". Fix: pass num_cores={chip.num_tensorcores_per_device} or fewer (or omit it for all of them), "
          f"or use a megacore chip (v4, v5p) for 2.")
    cores = [machine.add_core(chip_index, c, {**env, mesh.axis_name: (c, n)}, params) for c in range(n)]
    return _home(cores, [(mesh.axis_name, n)], "TensorCoreMesh")
  mesh = check_for_chip(mesh, chip)   # sizes of a mesh built before pl.virtual_tpu: this chip's
  if isinstance(mesh, VectorSubcoreMesh):
    nc, ns = mesh.num_cores, mesh.num_subcores
    cores = [machine.add_sparse_subcore(chip_index, c, s, {**env, mesh.core_axis_name: (c, nc),
                                                           mesh.subcore_axis_name: (s, ns)}, params)
             for c in range(nc) for s in range(ns)]
    return _home(cores, [(mesh.core_axis_name, nc), (mesh.subcore_axis_name, ns)], "VectorSubcoreMesh")
  cores = [machine.add_sparse_subcore(chip_index, c, 0, {**env, mesh.axis_name: (c, mesh.num_cores)},
                                      params, scalar=True) for c in range(mesh.num_cores)]
  return _home(cores, [(mesh.axis_name, mesh.num_cores)], "ScalarSubcoreMesh")


def _home(cores: list, axes: list, kind: str) -> list:
  """`cores` (one mesh's, in row-major order of its `axes`) given their MeshHome (axes and core ids)."""
  home = executor.MeshHome(tuple(axes), {c: core.core_id for c, core in
                                         zip(itertools.product(*(range(n) for _, n in axes)), cores)},
                           f"{kind}({', '.join(f'{a}={n}' for a, n in axes)})")
  for core in cores:
    core.mesh_home = home
  return cores


def _vmem_request(plan: LaunchPlan):
  """(block bytes, scratch bytes, pipelined block mappings, [(scratch index, VMEM type)]) of a grid
  plan's VMEM buffers."""
  return _vmem_request_of(plan.in_maps + plan.out_maps, plan.scratch)


def _vmem_request_of(maps, scratch):
  blocks = [m for m in maps if m.pipelined]
  leaves = tree_flatten(scratch, is_leaf=lambda x: isinstance(x, (MemoryRef, SemaphoreRefType)))[0] \
      if scratch else ()
  vmem = [(i, t) for i, t in enumerate(leaves)
          if isinstance(t, MemoryRef) and t.memory_space == MemorySpace.VMEM]
  return (sum(m.buffer_count * m.block_bytes for m in blocks), sum(t.nbytes for _, t in vmem), blocks,
          vmem)


def _check_vmem(core, plan: LaunchPlan):
  """Fail before running when the pipeline buffers exceed the scoped VMEM limit (the one place that
  limit is checked: it bounds these buffers only), or buffers and VMEM scratch operands the chip's
  VMEM (scratch operands and run_scoped buffers are not scoped: sim/memory.Allocator)."""
  cache = plan.cache()
  sizes = cache.get("vmem bytes")
  if sizes is None:   # (a function of the plan alone)
    sizes = cache["vmem bytes"] = _vmem_request(plan)[:2]
  chip = core.chip
  if sizes[0] <= core.vmem_limit and sizes[0] + sizes[1] <= chip.vmem_bytes - chip.internal_scratch_bytes:
    return
  _vmem_error(plan.kernel_name, chip, core.vmem_limit, plan.in_maps + plan.out_maps, plan.scratch)


def check_vmem_request(kname: str, chip, params, maps, scratch) -> None:
  """`_check_vmem` for a grid launch not planned yet, from its block mappings `maps`, `scratch` types
  and CompilerParams `params` on `chip` (palace.jax while it lowers a pallas_call: the TPU compiler
  refuses such a kernel when it compiles it, before any run)."""
  blocks_total, scratch_total, _, _ = _vmem_request_of(maps, scratch)
  limit = memory.scoped_vmem_limit(chip, getattr(params, "vmem_limit_bytes", None))
  if blocks_total > limit or blocks_total + scratch_total > chip.vmem_bytes - chip.internal_scratch_bytes:
    _vmem_error(kname, chip, limit, maps, scratch)


def _vmem_error(kname: str, chip, vmem_limit: int, maps, scratch):
  whole = chip.vmem_bytes - chip.internal_scratch_bytes
  blocks_total, scratch_total, blocks, vmem = _vmem_request_of(maps, scratch)
  detail = " + ".join([f"{m.name} {m.buffer_count} x {fmt_bytes(m.block_bytes)} block "
                       f"{m.dtype}{list(m.block_shape)}" for m in blocks])
  if blocks_total <= vmem_limit:
    scr = " + ".join(f"scratch[{i}] {fmt_bytes(t.nbytes)}" for i, t in vmem)
    raise ResourceError(
        f"VMEM over capacity for kernel '{kname}' on each TensorCore ({chip.name}): "
        f"{fmt_bytes(blocks_total + scratch_total)} requested ({' + '.join(x for x in (detail, scr) if x)}) but "
        f"{chip.name} has {fmt_bytes(whole)} of VMEM ({fmt_bytes(chip.vmem_bytes)} minus "
        f"{fmt_bytes(chip.internal_scratch_bytes)} Mosaic internal scratch); scratch operands count "
        f"against the whole VMEM, not the scoped limit. Fix: reduce the scratch or block sizes.")
  need = -(-blocks_total // 2**20) * 2**20   # whole MiB
  fix = (f"or raise CompilerParams(vmem_limit_bytes=...) to at least {need} ({fmt_bytes(need)}; "
         f"{chip.name} has {fmt_bytes(chip.vmem_bytes)} of VMEM)" if need <= chip.vmem_bytes else
         f"raising vmem_limit_bytes cannot help: {chip.name} has only {fmt_bytes(chip.vmem_bytes)} of VMEM")
  raise ResourceError(
      f"VMEM over capacity for kernel '{kname}' on each TensorCore ({chip.name}): "
      f"{fmt_bytes(blocks_total)} of pipelined blocks requested ({detail}) but the scoped VMEM limit "
      f"is {fmt_bytes(vmem_limit)} (scratch operands are not scoped). Fix: reduce block sizes or "
      f"pipeline buffer_count (pl.Buffered(1) for blocks "
      f"that do not change), {fix}.")


# ------------------------------------------------------------------ outputs never written
def _lazy_outputs(plan: LaunchPlan) -> dict:
  """{index: number of blocks} of the outputs a grid launch may leave as np.empty and fill afterwards
  where no block was written back: pipelined, not aliased to an input, tiled by their blocks (kept in
  the plan's cache)."""
  cache = plan.cache()
  lazy = cache.get("lazy outputs")
  if lazy is None:
    aliased = set(plan.aliases.values())
    in_vmem = plan.xla_vmem[1]   # (outputs in VMEM: the pipeline writes them through views, untracked)
    lazy = cache["lazy outputs"] = {i: prod(_block_counts(m)) for i, m in enumerate(plan.out_maps)
                                    if m.pipelined and i not in aliased and i not in in_vmem
                                    and _tileable(m)}
  return lazy


def _tileable(m) -> bool:
  """Blocks of this output tile its array (Blocked / squeezed dims), so unwritten ones are findable."""
  return all(kind in (BLOCKED, SQUEEZED) for kind, _, _ in m.dims)


def _block_counts(m) -> list:
  """Blocks per dim of a tileable output's block mapping (`_tileable`)."""
  return [-(-dim // size) if kind == BLOCKED else dim for (kind, size, _), dim in zip(m.dims, m.array_shape)]


def _fill_unwritten(storage, m, written, num_blocks: int) -> None:
  """Give every element outside the written-back blocks the uninitialised value (NaN / int min);
  `num_blocks`: how many blocks the output has (prod of `_block_counts`)."""
  if len(written) == num_blocks:   # distinct block offsets, as many as blocks: every one written
    return
  counts = _block_counts(m)
  done = np.zeros(counts, bool)
  if written:   # block coordinates of every written block, one NumPy op per dim
    offs = np.array(list(written), np.int64).reshape(len(written), len(m.dims))
    done[tuple(offs[:, d] // size if kind == BLOCKED else offs[:, d]
               for d, (kind, size, _) in enumerate(m.dims))] = True
  if done.all():
    return
  fill = memory.fill_value(storage.dtype)
  for blk in zip(*np.nonzero(~done)):
    storage[tuple(slice(b * size, (b + 1) * size) if kind == BLOCKED else b
                  for (kind, size, _), b in zip(m.dims, blk))] = fill
