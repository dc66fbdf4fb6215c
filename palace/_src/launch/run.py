"""Running a launch plan (L5): the one function every front end's launch goes through.

`run(plan, operands)`:
1. host side: HBM buffers for the outputs (copies of aliased inputs; pipelined outputs start empty and
   only their never-written blocks are filled afterwards), one machine per launch, or the shard_map
   group's shared machine (spmd.py) when the call comes from a shard_map program;
2. per chip (`_Launch.build`): the operands' HBM buffers, the cores (grid launches: the megacore split
   of the grid over TensorCores, `megacore_split`; mesh launches: one core per mesh position) and one
   program per core;
3. per core (`_program`, run by the machine's scheduler): a fresh `KernelContext`, the barrier
   semaphore, the staged VMEM/SMEM copies, the scratch, then the kernel body: a mesh body is called
   once, a grid body through the pipeline (pipeline.run_pipeline: BlockSpecs -> DMAs), which calls it
   once per grid point. Everything is freed in reverse; after an error it is freed quietly.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np

from palace._src import executor
from palace._src.blocks import BLOCKED, SQUEEZED
from palace._src.core import (CORE_PARALLEL, PARALLEL, MemoryRef, MemorySpace, SemaphoreRefType,
                              SemaphoreType, TensorCoreMesh, canonical_semantics)
from palace._src.errors import ResourceError, UsageError
from palace._src.launch import host
from palace._src.launch.plan import ENTRIES, LEAVES, OPERAND, LaunchPlan
from palace._src.launch.sc_mesh import VectorSubcoreMesh, check_for_chip
from palace._src.lang import context
from palace._src.lang.primitives import close_scope, open_scope
from palace._src.lang.refs import Ref
from palace._src.lang.tpu_primitives import sync_copy
from palace._src.pipeline import run_pipeline
from palace._src.sim import memory
from palace._src.sim.machine import active_tpu
from palace._src.sim.subcore import SC_BASE, SCALAR_BASE
from palace._src.util import fmt_bytes, prod, tree_flatten, tree_unflatten


def run(plan: LaunchPlan, operands) -> list:
  """Run `plan` on the active virtual TPU with one HBM value per `plan.operands` entry (NumPy arrays
  with the operand's dtype, or mutable Refs); returns the outputs' NumPy arrays in `plan.outputs` order."""
  launch = _Launch(plan, list(operands))
  ctx = host.spmd_context()
  try:
    if ctx is not None:  # inside shard_map: every chip's thread reaches this launch; one machine runs them
      ctx[0].collective_launch(ctx[1], plan.kernel_name, launch.build, plan.num_points)
    else:
      replay = None if plan.replay_operands is None else _replay_key(plan, operands)
      with host.launch_machine(active_tpu(), plan.kernel_name, 1, plan.num_points, replay) as machine:
        machine.run(launch.build(machine, 0))
  finally:
    for i in launch.lazy:
      _fill_unwritten(launch.out_bufs[i].storage, plan.out_maps[i], launch.written.get(i, set()))
  return [b.storage for b in launch.out_bufs]


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


class _Launch:
  """The host-side state of one run: output buffers and which output blocks the pipelines wrote."""

  def __init__(self, plan: LaunchPlan, operands: list):
    self.plan, self.operands = plan, operands
    self.lazy = () if not plan.is_grid or host.eager_output_init() else _lazy_outputs(plan)
    timing_only = active_tpu().timing_only
    # Pipelined outputs start as np.empty and only blocks never written back are filled afterwards
    # (same result as filling everything first, without touching every page twice); on a timing-only
    # machine outputs are shape and dtype only (memory.hbm_output).
    self.out_bufs = [memory.hbm_output(o.shape, o.dtype, o.name, timing_only, lazy=i in self.lazy)
                     for i, o in enumerate(plan.outputs)]
    for a_in, a_out in plan.aliases.items():
      memory.alias_input(self.out_bufs[a_out], operands[a_in], timing_only)
    self.written = {}   # output index -> element offsets of the blocks written back (all cores)

  def build(self, machine, chip_index: int) -> list:
    """This chip's HBM buffers, cores and [(core, program)] (spmd.py calls it once per chip)."""
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
      work = [(c, body, None) for body, mesh in zip(plan.bodies, plan.meshes)
              for c in _mesh_cores(machine, chip_index, mesh, plan.params, plan.kernel_name)]
    machine.register_hbm(chip_index, [b.buf if isinstance(b, Ref) else b for b in in_bufs] + self.out_bufs)
    return [(c, functools.partial(_program, self, in_bufs, body, pts)) for c, body, pts in work]


def _program(launch: _Launch, in_bufs, body, points) -> None:
  """What one core runs: language context, barrier semaphore, staged copies, scratch, the body."""
  plan = launch.plan
  ex = executor.current()
  kctx = context.KernelContext()
  token = context.enter(kctx)
  scopes = []
  try:
    if plan.params.collective_id is not None:
      (kctx.barrier_sem,), _, bufs = open_scope(ex, (SemaphoreType.BARRIER,), {}, "barrier_semaphore")
      scopes.append(bufs)
    operands = [b if isinstance(b, Ref) else Ref(b) for b in in_bufs]
    outputs = [Ref(b) for b in launch.out_bufs]
    staged, _, bufs = open_scope(ex, [s.type for s in plan.staged], {}, "staged",
                                 names=[s.name for s in plan.staged])
    scopes.append(bufs)
    for s, r in zip(plan.staged, staged):
      if s.kind == OPERAND:
        sync_copy(operands[s.index], r)
        operands[s.index] = r
      else:
        outputs[s.index] = r
    scratch = plan.scratch
    is_dict = isinstance(scratch, dict)
    scr, kw_scr, bufs = open_scope(ex, () if is_dict else scratch, scratch if is_dict else {}, "scratch")
    scopes.append(bufs)
    if plan.is_grid:
      lead = tuple(tree_unflatten(plan.operand_tree, operands[:plan.num_prefetch]))
      run_pipeline(body, plan.grid, plan.in_maps, plan.out_maps, operands[plan.num_prefetch:], outputs,
                   lead_args=lead, tail_args=scr, tail_kwargs=kw_scr, index_args=lead, points=points,
                   written=launch.written, offsets_cache=plan.cache())
    else:
      if plan.outputs_as == LEAVES:
        out_args = outputs
      else:
        tree = tree_unflatten(plan.output_tree, outputs)
        out_args = tuple(tree) if plan.outputs_as == ENTRIES else (tree,)
      res = body(*tree_unflatten(plan.operand_tree, operands), *out_args, *scr, **kw_scr)
      if res is not None:
        raise UsageError(f"Kernel '{plan.kernel_name}' returned {type(res).__name__}; pl.kernel bodies "
                         f"must return None. Fix: write their results to output refs and drop the return.")
    close_scope(ex, scopes.pop())   # scratch
    for s, r in zip(plan.staged, staged):
      if s.kind != OPERAND:
        sync_copy(r, Ref(launch.out_bufs[s.index]))
    close_scope(ex, scopes.pop())   # staged copies
    if scopes:
      kctx.barrier_sem = None
      close_scope(ex, scopes.pop())
  except BaseException:
    kctx.barrier_sem = None
    for bufs in reversed(scopes):
      close_scope(ex, bufs, quiet=True)
    raise
  finally:
    context.leave(token)


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
    for c in cores:
      c.mesh_axes = [(mesh.axis_name, n)]
    return cores
  mesh = check_for_chip(mesh, chip)   # sizes of a mesh built before pl.virtual_tpu: this chip's
  if isinstance(mesh, VectorSubcoreMesh):
    nc, ns = mesh.num_cores, mesh.num_subcores
    cores = []
    for c in range(nc):
      for s in range(ns):
        core = machine.add_sparse_subcore(chip_index, c, s, {**env, mesh.core_axis_name: (c, nc),
                                                             mesh.subcore_axis_name: (s, ns)}, params)
        core.mesh_axes = [(mesh.core_axis_name, nc), (mesh.subcore_axis_name, ns)]
        core.core_id_base = SC_BASE
        cores.append(core)
    return cores
  cores = []
  for c in range(mesh.num_cores):
    core = machine.add_sparse_subcore(chip_index, c, 0, {**env, mesh.axis_name: (c, mesh.num_cores)},
                                      params, scalar=True)
    core.mesh_axes = [(mesh.axis_name, mesh.num_cores)]
    core.core_id_base = SCALAR_BASE
    cores.append(core)
  return cores


def _vmem_request(plan: LaunchPlan):
  """(bytes, pipelined block mappings, [(scratch index, VMEM type)]) of a grid plan's VMEM buffers."""
  blocks = [m for m in plan.in_maps + plan.out_maps if m.pipelined]
  scratch = plan.scratch
  leaves = tree_flatten(scratch, is_leaf=lambda x: isinstance(x, (MemoryRef, SemaphoreRefType)))[0] \
      if scratch else ()
  vmem = [(i, t) for i, t in enumerate(leaves)
          if isinstance(t, MemoryRef) and t.memory_space == MemorySpace.VMEM]
  return sum(m.buffer_count * m.block_bytes for m in blocks) + sum(t.nbytes for _, t in vmem), blocks, vmem


def _check_vmem(core, plan: LaunchPlan):
  """Fail before running when the pipeline buffers and scratch exceed the scoped VMEM limit."""
  cache = plan.cache()
  total = cache.get("vmem bytes")
  if total is None:   # (a function of the plan alone)
    total = cache["vmem bytes"] = _vmem_request(plan)[0]
  if total > core.vmem_limit:   # (the breakdown is formatted only for the error)
    kname = plan.kernel_name
    _, blocks, vmem = _vmem_request(plan)
    detail = " + ".join([f"{m.name} {m.buffer_count} x {fmt_bytes(m.block_bytes)} block "
                         f"{m.dtype}{list(m.block_shape)}" for m in blocks] +
                        [f"scratch[{i}] {fmt_bytes(t.nbytes)}" for i, t in vmem])
    chip = core.chip
    need = -(-(total + chip.internal_scratch_bytes) // 2**20) * 2**20   # whole MiB
    fix = (f"or raise CompilerParams(vmem_limit_bytes=...) to at least {need} ({fmt_bytes(need)}; "
           f"{chip.name} has {fmt_bytes(chip.vmem_bytes)} of VMEM)" if need <= chip.vmem_bytes else
           f"raising vmem_limit_bytes cannot help: {chip.name} has only {fmt_bytes(chip.vmem_bytes)} of VMEM")
    raise ResourceError(
        f"VMEM over capacity for kernel '{kname}' on chip 0 core 0 ({chip.name}): "
        f"{fmt_bytes(total)} requested ({detail}) but the scoped VMEM limit leaves "
        f"{fmt_bytes(core.vmem_limit)} (limit {fmt_bytes(core.vmem_limit + chip.internal_scratch_bytes)}"
        f" minus {fmt_bytes(chip.internal_scratch_bytes)} Mosaic internal scratch). Fix: reduce block "
        f"sizes or pipeline buffer_count (pl.Buffered(1) for blocks that do not change), {fix}.")


# ------------------------------------------------------------------ outputs never written
def _lazy_outputs(plan: LaunchPlan) -> frozenset:
  """Indices of the outputs a grid launch may leave as np.empty and fill afterwards where no block was
  written back: pipelined, not aliased to an input, tiled by their blocks (kept in the plan's cache)."""
  cache = plan.cache()
  lazy = cache.get("lazy outputs")
  if lazy is None:
    aliased = set(plan.aliases.values())
    lazy = cache["lazy outputs"] = frozenset(
        i for i, m in enumerate(plan.out_maps) if m.pipelined and i not in aliased and _tileable(m))
  return lazy


def _tileable(m) -> bool:
  """Blocks of this output tile its array (Blocked / squeezed dims), so unwritten ones are findable."""
  return all(kind in (BLOCKED, SQUEEZED) for kind, _, _ in m.dims)


def _fill_unwritten(storage, m, written) -> None:
  """Give every element outside the written-back blocks the uninitialised value (NaN / int min)."""
  counts = [-(-dim // size) if kind == BLOCKED else dim
            for (kind, size, _), dim in zip(m.dims, m.array_shape)]
  if len(written) == prod(counts):   # distinct block offsets, as many as blocks: every one written
    return
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
