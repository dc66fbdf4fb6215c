"""JAX launch parameters -> a palace `LaunchPlan`, run by the one `run` of launch/run.py.

`plan_pallas_call` reads a JAX `pallas_call` (kernel jaxpr + GridMapping) as JAX's own interpret mode
does: each of `grid_mapping.block_mappings` (block shape, index-map jaxpr, memory space, pipeline
mode) becomes a palace `blocks.BlockMapping` directly, checked by palace's block rules
(`blocks.check_block`, `blocks.buffer_count`); the scalar-prefetch operands, scratch avals, aliases
and compiler params (dimension semantics) fill the plan's other fields. `plan_mpmd_map` does the
same for `pl.kernel` / `core_map` (kernel jaxpr + mesh). `run_pallas_call` / `run_mpmd_map` plan
once per lowering (and grid) and then only run the plan, on the VirtualTPU their caller hands down.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from palace._src import blocks, hw
from palace._src import dtypes as dt
from palace._src import core as pcore
from palace._src.errors import BlockSpecError, PalaceError, ResourceError, UnsupportedError, UsageError
from palace._src.jax.avals import alloc_type, host_dtype, memory_space, physical, semaphore_kind
from palace._src.jax.interpret import grid_axes, kernel_site, program, run_program, used_vars
from palace._src.jax.registry import RULES, literal, sub_jaxprs
from palace._src.jax.schedule import replay_blocker
from palace._src.jax.xla_placement import xla_vmem
from palace._src.launch import host, sc_mesh
from palace._src.jax import rules_sc
from palace._src.launch.host_refs import freeze, owning_ref, ref_name
from palace._src.launch.plan import ENTRIES, OPERAND, OUTPUT, LaunchPlan, Operand, Output, Stage, grid_stages
from palace._src.launch.run import check_vmem_request, run
from palace._src.util import fmt_site, tree_flatten


def kernel_name(params) -> str:
  """The kernel's name: a pallas_call's `name`, else its (or an mpmd_map's first) kernel function's."""
  name = params.get("name")
  if name:
    return str(name)
  dbg = getattr(_first_jaxpr(params), "debug_info", None)
  return str(getattr(dbg, "func_name", None) or "kernel")


def _first_jaxpr(params):
  """A pallas_call's kernel jaxpr, or an mpmd_map's first one."""
  return params["jaxpr"] if "jaxpr" in params else params["jaxprs"][0]


def _fail(params, what: str, fix: str = "") -> UnsupportedError:
  return UnsupportedError(f"palace.jax: pallas_call '{kernel_name(params)}': {what} is not supported "
                          f"yet. Fix: " + (fix or "run this launch with JAX's interpret mode, or call "
                                                  "palace's own pl.pallas_call outside jax.jit."))


def check_launch(params) -> None:
  """Raise UnsupportedError (at lowering time) for launch features the adapter does not cover."""
  gm = params["grid_mapping"]
  if params.get("mesh") is not None:
    raise _fail(params, "a pallas_call over a mesh (core_map / pl.kernel)")
  if params["jaxpr"].constvars:
    raise _fail(params, "a kernel that captures constants")
  n_dyn = sum(1 for g in gm.grid if not isinstance(g, (int, np.integer)))
  if n_dyn != gm.num_dynamic_grid_bounds:
    raise _fail(params, f"the grid {gm.grid}")
  for bm in gm.block_mappings:
    if bm.transforms:
      raise _fail(params, f"block transforms {bm.transforms} of {bm.origin}")
    _dims(params, bm)
    memory_space(getattr(bm.transformed_block_aval, "memory_space", None), pcore.MemorySpace.VMEM,
                 bm.origin)
  host.check_params(_compiler_params(params.get("compiler_params"), len(gm.grid)), "pallas_call")


def _dims(params, bm) -> tuple:
  """A JAX block mapping's block shape as palace's canonical dims: (kind, size, low padding) per dim."""
  from jax._src.pallas import core as jpc  # noqa: PLC0415
  out = []
  for d in bm.block_shape:
    if isinstance(d, jpc.Blocked):
      out.append((blocks.BLOCKED, int(d.block_size), 0))
    elif isinstance(d, jpc.Squeezed) or d is None:
      out.append((blocks.SQUEEZED, 1, 0))
    elif isinstance(d, jpc.Element):
      out.append((blocks.ELEMENT, int(d.block_size), int(d.padding[0])))
    elif isinstance(d, jpc.BoundedSlice):   # (Mosaic's pallas_call lowering raises NotImplementedError)
      raise UnsupportedError(
          f"palace.jax: pallas_call '{kernel_name(params)}': pl.BoundedSlice block dims ({bm.origin}) "
          f"are not supported, as JAX's TPU compiler rejects them in a pallas_call too (Mosaic's "
          f"lowering: 'Unsupported block dimension type'). Fix: use a full pl.Blocked dimension and "
          f"mask the rows past the bound in the kernel, or JAX's emit_pipeline inside a pl.kernel, "
          f"which takes BoundedSlice blocks (and runs on palace).")
    else:
      raise _fail(params, f"block dim {d!r} of {bm.origin}")
  return tuple(out)


def _pure_index_jaxpr(jaxpr) -> bool:
  """True when an index map's `jaxpr` computes its block indices from its grid indices alone: only
  scalar index arithmetic (registry entries marked `pure_index`: what `i // 2`, `jnp.minimum`,
  `lax.select`, `x % n` trace to, pure functions of their operands that palace's rules also evaluate
  on whole index columns), in nested calls too, so its scalar-prefetch refs (operands after the grid
  indices) are never read (no such primitive takes a ref)."""
  for e in jaxpr.eqns:
    entry = RULES.get(e.primitive.name)
    if entry is None or not entry.pure_index or not all(map(_pure_index_jaxpr, sub_jaxprs(e))):
      return False
  return True


def _index_map(bm, extra: int = 0):
  """The block mapping's index map: its jaxpr compiled once (interpret.program); one with no
  equations (`lambda i, j: (i, 0)`, the common case) becomes a plain tuple of its inputs and literals.
  Both it and a map of scalar index arithmetic alone (`lambda i: (2 * i + 1, 0)`, `_pure_index_jaxpr`)
  are marked pure (blocks.PURE_INDEX_MAP): they charge nothing and run on whole index columns, so a
  plan keeps every step's offsets, found in one vectorised evaluation on any grid
  (block_offsets.grid_offsets), instead of running the map per step. A JAX map computes in int32:
  its columns are int32 (blocks.INDEX_DTYPE), so it wraps where JAX's does. `extra`: trailing
  dimensions the array has beyond the map's (a key array's key data), each block index 0."""
  closed = bm.index_map_jaxpr
  if not closed.eqns and not closed.constvars:
    from jax._src import core as jax_core  # noqa: PLC0415
    pos = {v: k for k, v in enumerate(closed.invars)}
    picks = tuple((True, _static_index(literal(v))) if type(v) is jax_core.Literal else (False, pos[v])
                  for v in closed.outvars) + ((True, 0),) * extra
    index_map = lambda *args: tuple(v if static else args[v] for static, v in picks)  # noqa: E731
    setattr(index_map, blocks.PURE_INDEX_MAP, True)
    return index_map
  prog, consts, zeros = program(closed), closed.consts, (0,) * extra
  index_map = lambda *args: (*run_program(prog, consts, args), *zeros)  # noqa: E731
  setattr(index_map, blocks.INDEX_DTYPE, np.int32)
  if closed.eqns:
    setattr(index_map, blocks.COMPUTED_INDEX_MAP, True)
  if _pure_index_jaxpr(closed.jaxpr):
    setattr(index_map, blocks.PURE_INDEX_MAP, True)
  return index_map


def _static_index(x):
  """A literal block index as a Python int (what the pipeline would make of it per step)."""
  return int(x) if isinstance(x, np.integer) else x


def _block_mapping(params, bm, name: str) -> blocks.BlockMapping:
  """palace's BlockMapping of one of JAX's block mappings (of the operand or output `name`). A key
  array's blocks take its key data's trailing dimensions whole (avals.physical); a semaphore operand
  or result is its whole array of int32 handles (`LaunchPlan.semaphores`)."""
  aval = physical(bm.array_aval)
  shape, dtype = tuple(aval.shape), host_dtype(aval.dtype)
  if semaphore_kind(aval.dtype) is not None:
    return blocks.whole_hbm(name, shape, dtype)
  extra = len(shape) - len(bm.array_aval.shape)
  space = memory_space(getattr(bm.transformed_block_aval, "memory_space", None), pcore.MemorySpace.VMEM,
                       bm.origin)
  if space in (pcore.MemorySpace.ANY, pcore.MemorySpace.HBM, pcore.MemorySpace.HOST):
    if not bm.has_trivial_window():
      raise BlockSpecError(
          f"palace.jax: pallas_call '{kernel_name(params)}': {bm.origin} is in memory space {space} with "
          f"block shape {tuple(bm.block_shape)} over an array of shape "
          f"{tuple(bm.array_aval.shape)}; expected the whole array (block shape = array shape, index "
          f"map returning all 0s): the TPU compiler does not window ANY/HBM operands ('The Pallas TPU "
          f"lowering currently supports in memory space ANY only blocks having the same block shape as "
          f"the array shape and a trivial index_map', measured on a TPU v5e). Fix: "
          f"pl.BlockSpec(memory_space=pl.ANY) and slice the HBM ref in the kernel "
          f"(x_hbm.at[pl.ds(start, size)]), or use VMEM blocks.")
    return blocks.whole_hbm(name, shape, dtype, pcore.MemorySpace.ANY if space is pcore.MemorySpace.HBM
                            else space)
  requested, revisit_any = (1 if _single_window(params, bm) else None), False
  if bm.pipeline_mode is not None:
    n = bm.pipeline_mode.buffer_count
    if not isinstance(n, int) or not 1 <= n <= 2 or getattr(bm.pipeline_mode, "use_lookahead", False):
      raise BlockSpecError(
          f"palace.jax: pallas_call '{kernel_name(params)}': {bm.origin} has pipeline_mode "
          f"{bm.pipeline_mode!r}; expected pl.Buffered(1) or pl.Buffered(2) without lookahead, as JAX's "
          f"TPU pallas_call lowering takes only single and double buffering ('Only single (1) and "
          f"double (2) buffering are supported. Got 3.', measured on a TPU v5e with JAX 0.10.2; JAX "
          f"0.12's lowering has the same rule). Fix: use pl.Buffered(2), or deeper buffering through "
          f"pltpu.emit_pipeline inside a pl.kernel.")
    requested = int(n)
    revisit_any = _revisit_any(params, bm, requested)
  dims = _dims(params, bm) + tuple((blocks.BLOCKED, n, 0) for n in shape[len(shape) - extra:])
  blocks.check_block(name, shape, dtype, dims, space)
  index_map = _index_map(bm, extra)
  pure = getattr(index_map, blocks.PURE_INDEX_MAP, False) is True
  return blocks.BlockMapping(name, shape, dtype, dims, index_map, space,
                             blocks.buffer_count(dims, shape, space, requested), False, pure, revisit_any,
                             not pure and _reads_unwritten_tables(params, bm))


def _reads_unwritten_tables(params, bm) -> bool:
  """Does the index map read scalar-prefetch refs, none of which the kernel writes (blocks.BlockMapping.
  prefetch_index_map)? JAX types every ref a kernel writes, in any nested jaxpr or by a DMA into it,
  as a write (or accumulate) effect of the kernel jaxpr on that input; an operand aliased to an output
  counts as written too; and the map itself must write nothing."""
  from jax._src.state import types as state_types  # noqa: PLC0415
  writes = (state_types.WriteEffect, state_types.AccumEffect)
  closed, jaxpr = bm.index_map_jaxpr, params["jaxpr"]
  nsp = params["grid_mapping"].num_index_operands
  if not nsp or not closed.jaxpr.eqns or any(isinstance(e, writes) for e in closed.jaxpr.effects):
    return False
  written = {e.input for e in jaxpr.effects if isinstance(e, writes)}   # (a Var, or an index)
  aliased = {int(i) for i in dict(params.get("input_output_aliases") or {})}
  kernel_refs, map_refs = jaxpr.invars[:nsp], closed.jaxpr.invars[len(closed.jaxpr.invars) - nsp:]
  used = used_vars(closed.jaxpr)
  read = [k for k, v in enumerate(map_refs) if v in used]
  return bool(read) and not any(k in aliased or k in written or kernel_refs[k] in written for k in read)


def _single_window(params, bm) -> bool:
  """Does the block's index map give one block for the whole grid (its outputs depend on no grid index
  of a dimension larger than 1, nor on a scalar-prefetch operand)? The TPU compiler then gives a block
  without a pipeline_mode one buffer, not two (JAX's test_automatic_single_buffering: a 10 MiB window
  indexed by a size-1 grid dim compiles under v5e's 16 MiB scoped limit, one indexed by a size-4 dim
  runs out of memory)."""
  closed = bm.index_map_jaxpr
  grid = params["grid_mapping"].grid
  invars = closed.jaxpr.invars
  varying = {v for k, v in enumerate(invars)
             if k >= len(grid) or not isinstance(grid[k], (int, np.integer)) or grid[k] != 1}
  for eqn in closed.jaxpr.eqns:
    if any(not hasattr(v, "val") and v in varying for v in eqn.invars):
      varying.update(eqn.outvars)
  return not any(not hasattr(v, "val") and v in varying for v in closed.jaxpr.outvars)


def _revisit_any(params, bm, buffer_count: int) -> bool:
  """Whether the block spec asks for pl.RevisitMode.ANY (a block revisited at any later step is read
  back first); refused with double buffering, as JAX's TPU lowering refuses it."""
  mode = getattr(bm.pipeline_mode, "revisit", None)
  if mode is None or getattr(mode, "value", mode) != "any":
    return False
  if buffer_count > 1:
    raise BlockSpecError(
        f"palace.jax: pallas_call '{kernel_name(params)}': {bm.origin} has pipeline_mode "
        f"{bm.pipeline_mode!r}: RevisitMode.ANY with double buffering, which JAX's TPU lowering refuses "
        f"('RevisitMode.ANY is not supported with double buffering.', jax/_src/pallas/mosaic/"
        f"lowering.py). Fix: pl.Buffered(1, revisit=pl.RevisitMode.ANY).")
  return True


def _compiler_params(cp, grid_rank: int = 0, vmapped=()):
  """palace CompilerParams from JAX's; vmapped grid dims (jax.vmap) are independent: parallel."""
  if cp is None:
    if not vmapped:
      return None
    kw = {"dimension_semantics": tuple("parallel" if d in vmapped else "arbitrary"
                                       for d in range(grid_rank))}
    return pcore.CompilerParams(**kw)
  fields = {f.name for f in dataclasses.fields(pcore.CompilerParams)}
  kw = {k: getattr(cp, k) for k in fields if hasattr(cp, k)}
  level = getattr(kw.get("opt_level"), "value", None)
  if isinstance(level, str) and level[:1] == "O" and level[1:].isdigit():   # jax.OptLevel.O2: level 2
    kw["opt_level"] = int(level[1:])
  sem = kw.get("dimension_semantics")
  if sem is not None:
    user = iter(str(getattr(s, "value", s)).lower() if not isinstance(s, str) else s.lower()
                for s in sem)
    kw["dimension_semantics"] = tuple("parallel" if d in vmapped else next(user)
                                      for d in range(grid_rank)) if vmapped else tuple(user)
  return pcore.CompilerParams(**kw)


def _grid(gm, bounds, kname: str) -> tuple:
  """The grid with its dynamic bounds (the launch's leading operands, concrete by now) filled in. JAX
  passes each bound as a size-1 array (a scalar, or a shape-(1,) array such as `jax.random.randint(key,
  (1,), ...)`, which its TPU lowering also takes)."""
  it = iter(bounds)
  return tuple(int(g) if isinstance(g, (int, np.integer)) else _bound(next(it), kname, axis)
               for axis, g in enumerate(gm.grid))


def _bound(value, kname: str, axis: int) -> int:
  """One dynamic grid bound (of grid axis `axis` of pallas_call `kname`): the element of a size-1 array."""
  a = np.asarray(value)
  if a.size != 1:
    raise UsageError(f"palace.jax: pallas_call '{kname}': the dynamic bound of grid axis {axis} is an "
                     f"array of shape {a.shape}; expected one value (a scalar or a size-1 array). Fix: "
                     f"pass the grid size as a scalar.")
  return int(a.reshape(-1)[0])


def _grid_body(params, grid):
  """The kernel body of a grid launch: the kernel jaxpr, compiled once, run on the block refs.
  program_id / num_programs count the user's grid axes only (not the ones jax.vmap added)."""
  prog = program(params["jaxpr"])
  vmapped = tuple(int(d) for d in getattr(params["grid_mapping"], "vmapped_dims", ()))
  user_axes = tuple(d for d in range(len(grid)) if d not in vmapped)

  def kernel(*refs):
    if not vmapped:
      run_program(prog, (), refs)
      return
    token = grid_axes.set(user_axes)
    try:
      run_program(prog, (), refs)
    finally:
      grid_axes.reset(token)
  kernel.__name__ = kernel_name(params)
  return kernel


def plan_pallas_call(params, grid: tuple, args, chip) -> tuple:
  """(LaunchPlan, operand arrays) of a JAX pallas_call at one (concrete) grid, for operands like
  `args` (NumPy arrays, dynamic grid bounds removed), on `chip`."""
  check_launch(params)
  gm, jaxpr, kname = params["grid_mapping"], params["jaxpr"], kernel_name(params)
  nsp, n_in = gm.num_index_operands, gm.num_inputs
  names = [f"scalar_prefetch[{i}]" if i < nsp else f"args[{i}]" for i in range(len(args))]
  sems = _semaphores(params)
  out_avals = [physical(a) for a in params["out_avals"]]
  _check_32_bit(kname, {**{n: a for k, (n, a) in enumerate(zip(names, args))
                           if not any(kind == OPERAND and i == k for kind, i, _ in sems)},
                        **{f"outputs[{i}]": a for i, a in enumerate(out_avals)
                           if semaphore_kind(a.dtype) is None}})
  arrays = [host.to_host_array(a, name) for a, name in zip(args, names)]
  in_maps = [_block_mapping(params, bm, f"args[{nsp + i}]") for i, bm in enumerate(gm.block_mappings[:n_in])]
  outs = [host.out_struct(pcore.ShapeDtypeStruct(tuple(a.shape), host_dtype(a.dtype)), f"out_shape[{i}]")
          for i, a in enumerate(out_avals)]
  out_maps = [_block_mapping(params, bm, f"outputs[{i}]")
              for i, bm in enumerate(gm.block_mappings[n_in:n_in + len(outs)])]
  resident = _resident_in_vmem(params, grid, in_maps, out_maps)
  scratch = tuple(alloc_type(a, f"scratch[{i}]") for i, a in enumerate(gm.scratch_avals))
  host.check_hbm(kname, {f"args[{i}]": a for i, a in enumerate(arrays)},
                 {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch, chip)
  vmapped = tuple(int(d) for d in getattr(gm, "vmapped_dims", ()))
  fixed_site = kernel_site(jaxpr)   # (no user frame is on the stack while a jaxpr runs)
  cparams = host.check_params(_compiler_params(params.get("compiler_params"), len(grid), vmapped), "pallas_call")
  plan = LaunchPlan(
      kname, fixed_site or ("<unknown>", 0), cparams,
      tuple(Operand(name, a.shape, a.dtype) for name, a in zip(names, arrays)),
      tree_flatten(tuple(range(nsp)))[1],
      tuple(Output(f"outputs[{i}]", *o) for i, o in enumerate(outs)), tree_flatten(list(range(len(outs))))[1],
      aliases=host.check_aliases(dict(params.get("input_output_aliases") or ()), kname),
      staged=grid_stages(arrays[:nsp], in_maps, out_maps) + resident, scratch=scratch,
      bodies=(_grid_body(params, grid),), grid=grid, in_maps=tuple(in_maps), out_maps=tuple(out_maps),
      fixed_site=fixed_site, replay_operands=None if sems else _grid_replay_operands(params),
      semaphores=sems, xla_vmem=_xla_vmem(params, cparams, nsp, in_maps, out_maps, arrays, outs, sems, chip))
  return plan, arrays


def _xla_vmem(params, cparams, nsp, in_maps, out_maps, arrays, outs, sems, chip) -> tuple:
  """The LaunchPlan's `xla_vmem`: the operands and outputs XLA would hand the kernel in VMEM
  (jax/xla_placement.py), within the chip's VMEM less the kernel's scoped limit."""
  aliases = {int(k): int(j) for k, j in dict(params.get("input_output_aliases") or {}).items()}
  semaphore = {(kind, i) for kind, i, _ in sems}
  smem = pcore.MemorySpace.SMEM
  ins = [(nsp + i, tuple(arrays[nsp + i].shape), arrays[nsp + i].dtype) for i, m in enumerate(in_maps)
         if m.space != smem and nsp + i not in aliases and (OPERAND, nsp + i) not in semaphore]
  out = [(i, tuple(o[0]), o[1]) for i, (o, m) in enumerate(zip(outs, out_maps))
         if m.space != smem and o[2] is pcore.MemorySpace.ANY and i not in aliases.values()
         and (OUTPUT, i) not in semaphore]
  scoped = getattr(cparams, "vmem_limit_bytes", None) or chip.default_scoped_vmem_bytes
  return xla_vmem(ins, out, chip.vmem_bytes - scoped)


def check_vmem_when_lowered(params, chip) -> None:
  """A static-grid pallas_call whose pipelined blocks and VMEM scratch do not fit VMEM is refused
  while palace.jax lowers it, where the TPU compiler refuses it (`.lower().compile()` raises on a TPU
  before anything runs; JAX's test_automatic_single_buffering), by the check every launch makes
  (launch/run.py `check_vmem_request`). Any other error making the block mappings is left to the
  launch, which raises it as before."""
  gm = params["grid_mapping"]
  if gm.num_dynamic_grid_bounds:
    return
  nsp, n_in, n_out = gm.num_index_operands, gm.num_inputs, len(params["out_avals"])
  try:
    maps = [_block_mapping(params, bm, f"args[{nsp + i}]") for i, bm in enumerate(gm.block_mappings[:n_in])]
    maps += [_block_mapping(params, bm, f"outputs[{i}]")
             for i, bm in enumerate(gm.block_mappings[n_in:n_in + n_out])]
    scratch = tuple(alloc_type(a, f"scratch[{i}]") for i, a in enumerate(gm.scratch_avals))
    cp = _compiler_params(params.get("compiler_params"), len(gm.grid),
                          tuple(int(d) for d in getattr(gm, "vmapped_dims", ())))
  except PalaceError:
    return
  try:
    check_vmem_request(kernel_name(params), chip, cp, maps, scratch)
  except ResourceError as e:
    raise e.with_traceback(None) from None


def check_scratch_when_lowered(params, chip) -> None:
  """A launch (pallas_call or pl.kernel) whose CompilerParams ask for less Mosaic internal scratch than
  `chip`'s minimum is refused while palace.jax lowers it (hw.check_internal_scratch), as the TPU
  compiler refuses it when it compiles it. Parameters palace cannot read are left to the launch's own
  check (check_launch / the plan), which raises them as before."""
  try:
    cp = _compiler_params(params.get("compiler_params"))
  except PalaceError:
    return
  if cp is not None:
    hw.check_internal_scratch(chip, cp.internal_scratch_in_bytes, kernel_name(params),
                              kernel_site(_first_jaxpr(params)))


def _resident_in_vmem(params, grid, in_maps: list, out_maps: list) -> tuple:
  """The `write_back` stages of a grid-free pallas_call's outputs that XLA places in VMEM
  (`out_shape=pltpu.VMEM(...)`) and that are aliased to an input, both with VMEM BlockSpecs: Mosaic
  windows no operand of a grid-free kernel, so the kernel's refs are the buffers themselves, and the
  aliased input and output are one VMEM buffer (JAX's async copy into VMEM: the kernel waiting for the
  copy writes nothing, and the output is what the copy put there). Their block mappings become raw
  (the stage is the ref); without this the output's own VMEM block, never written, went back."""
  if grid:
    return ()
  stages = []
  nsp = params["grid_mapping"].num_index_operands
  for k, j in dict(params.get("input_output_aliases") or {}).items():
    k, j = int(k) - nsp, int(j)
    space = getattr(params["out_avals"][j], "memory_space", None)
    if (str(getattr(space, "value", space)).lower() != "vmem" or not 0 <= k < len(in_maps)
        or in_maps[k].space != pcore.MemorySpace.VMEM or out_maps[j].space != pcore.MemorySpace.VMEM):
      continue
    m = in_maps[k]
    stages.append(Stage(OPERAND, nsp + k, pcore.MemoryRef(m.array_shape, m.dtype, pcore.MemorySpace.VMEM),
                        m.name, write_back=True))
    in_maps[k] = blocks.whole_hbm(m.name, m.array_shape, m.dtype)
    out_maps[j] = blocks.whole_hbm(out_maps[j].name, out_maps[j].array_shape, out_maps[j].dtype)
  return tuple(stages)


def _semaphores(params) -> tuple:
  """A pallas_call's `LaunchPlan.semaphores`: its semaphore operands (by operand index, scalar
  prefetch counted) and results."""
  gm = params["grid_mapping"]
  nsp, n_in = gm.num_index_operands, gm.num_inputs
  out = [(OPERAND, nsp + i, semaphore_kind(bm.array_aval.dtype)(tuple(bm.array_aval.shape)))
         for i, bm in enumerate(gm.block_mappings[:n_in]) if semaphore_kind(bm.array_aval.dtype) is not None]
  out += [(OUTPUT, i, semaphore_kind(a.dtype)(tuple(a.shape))) for i, a in enumerate(params["out_avals"])
          if semaphore_kind(a.dtype) is not None]
  return tuple(out)


def _check_32_bit(kname: str, avals) -> None:
  """{name: aval} of a launch's operands and outputs: a 64-bit type (JAX with jax_enable_x64) is
  refused as XLA refuses it for a TPU custom call (measured on a TPU v5e: 'While rewriting
  computation to not contain X64 element types, XLA encountered an HLO for which this rewriting is
  not implemented'); palace's own front ends narrow 64-bit host arrays as JAX without x64 does."""
  for name, aval in avals.items():
    d = np.dtype(aval.dtype)
    if dt.canonicalize(d) != d:
      raise UnsupportedError(
          f"palace.jax: kernel '{kname}': {name} is {d}{list(aval.shape)}, a 64-bit type, which a TPU "
          f"kernel cannot take (XLA: 'While rewriting computation to not contain X64 element types, "
          f"XLA encountered an HLO for which this rewriting is not implemented'). Fix: cast it to a "
          f"32-bit type before the call, or run without jax_enable_x64.")


def run_pallas_call(params, args, tpu, cache=None, out=None):
  """Run one JAX `pallas_call` (its primitive parameters and NumPy operands) on the VirtualTPU `tpu`;
  returns the list of NumPy outputs. `cache` (a dict the lowering keeps for its one launch site,
  whose operand shapes, dtypes and engine are fixed) holds the LaunchPlan made for each grid by the
  first call, so later calls only run it. `out`: launch.run's (XLA's result buffers to compute the
  outputs in)."""
  gm = params["grid_mapping"]
  nd = gm.num_dynamic_grid_bounds
  # (the cache's key: the grid, or None for a static grid, which is then not rebuilt per call)
  key = _grid(gm, args[:nd], kernel_name(params)) if nd else None
  operands = args[nd:] if nd else args
  plan = None if cache is None else cache.get(key)
  if plan is None:
    plan, operands = plan_pallas_call(params, key if nd else _grid(gm, (), ""), operands, tpu.chip)
    if cache is not None:
      cache[key] = plan
  return run(plan, operands, out, tpu)


def _replay_operands(jaxpr, keyed) -> tuple | None:
  """The plan's `replay_operands`: the operands `keyed` (scalar prefetch, SMEM inputs; kernel invars
  at the same positions) when the kernel's schedule depends on no other data (jax/schedule.py)."""
  return None if replay_blocker(jaxpr, keyed) is not None else tuple(keyed)


def _grid_replay_operands(params) -> tuple | None:
  """A pallas_call's keyed operands: its scalar-prefetch operands and SMEM-blocked inputs, except
  those aliased to an output (the kernel writes them)."""
  gm = params["grid_mapping"]
  nsp = gm.num_index_operands
  aliased = {int(i) for i in dict(params.get("input_output_aliases") or {})}
  smem = [nsp + i for i, bm in enumerate(gm.block_mappings[:gm.num_inputs])
          if memory_space(getattr(bm.transformed_block_aval, "memory_space", None), None,
                          bm.origin) is pcore.MemorySpace.SMEM]
  return _replay_operands(params["jaxpr"], [k for k in [*range(nsp), *smem] if k not in aliased])


# ------------------------------------------------------------------ pl.kernel / core_map
# JAX's pallas Mesh is a protocol (jax/_src/pallas/core.py): a TPU mesh is known by its `core_type`
# (pltpu.CoreType, whose values these are) and its axes by its `shape` (axis name -> size, the core
# axis first), as JAX's own lowering reads any mesh, not by its class
_MESHES = {"tc": "TensorCoreMesh", "sc_vector_subcore": "VectorSubcoreMesh",
           "sc_scalar_subcore": "ScalarSubcoreMesh"}
_MESH_RANKS = {"tc": 1, "sc_vector_subcore": 2, "sc_scalar_subcore": 1}


def _mesh_kind(mesh) -> str | None:
  """'tc', 'sc_vector_subcore' or 'sc_scalar_subcore' for a TPU mesh of that core type and rank."""
  kind = getattr(getattr(mesh, "core_type", None), "value", None)
  if kind not in _MESHES:
    return None
  try:
    ok = len(dict(mesh.shape)) == _MESH_RANKS[kind]
  except (TypeError, ValueError):
    ok = False
  return kind if ok else None


def _palace_mesh(mesh):
  """palace's mesh for a JAX TPU mesh (TensorCore, or SparseCore vector / scalar subcores)."""
  kind = _mesh_kind(mesh)
  axes = [(str(a), int(n)) for a, n in dict(mesh.shape).items()]
  if kind == "tc":
    return pcore.TensorCoreMesh(*axes[0])
  if kind == "sc_vector_subcore":
    (core_axis, cores), (subcore_axis, subcores) = axes
    return sc_mesh.VectorSubcoreMesh(core_axis, subcore_axis, cores, subcores)
  return sc_mesh.ScalarSubcoreMesh(*axes[0])


def on_sparsecore(params) -> bool:
  """Does a JAX mesh launch (checked by `check_mpmd`) run on SparseCore subcores?"""
  return _mesh_kind(params["meshes"][0]) != "tc"


def mpmd_name(params) -> str:
  """The launch's name: its `name`, else its kernel functions' names joined by '_' (JAX's TPU
  lowering names an MPMD custom call so)."""
  names = [str(getattr(getattr(j, "debug_info", None), "func_name", None) or "kernel")
           for j in params["jaxprs"]]
  return str(params.get("name") or "_".join(names))


def check_mpmd(params) -> None:
  """Raise UnsupportedError (at lowering time) for mesh launches the adapter does not cover. Several
  (mesh, body) pairs (MPMD) are covered on SparseCore: a scalar subcore body and a vector subcore
  body, each run on its own mesh's cores by palace's MPMD launch."""
  name = mpmd_name(params)
  site = kernel_site(params["jaxprs"][0])
  where = f" (kernel defined at {fmt_site(site)})" if site else ""
  external = list(params.get("external_meshes") or ())
  for v in params["jaxprs"][0].invars:   # (JAX lists only operands' meshes as external, not scratch's)
    mesh = getattr(getattr(v.aval, "memory_space", None), "mesh", None)
    if mesh is not None and mesh not in params["meshes"] and mesh not in external:
      external.append(mesh)
  if external:
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' with external meshes (a ref or semaphore "
                           f"tied to a mesh the kernel has no body for: "
                           f"{[type(m).__name__ for m in external]}) is not supported yet. Fix: pass a "
                           f"body for that mesh, or tie the ref to one of the kernel's meshes.{where}")
  kinds = []
  for mesh in params["meshes"]:
    kind = _mesh_kind(mesh)
    if kind is None:
      raise UnsupportedError(f"palace.jax: pl.kernel '{name}' over a {type(mesh).__name__} (core type "
                             f"{getattr(mesh, 'core_type', None)!r}) is not supported yet (meshes of core "
                             f"type {', '.join(_MESHES)}: {', '.join(_MESHES.values())}, are). Fix: call "
                             f"palace's pl.kernel outside jax.jit for this mesh.{where}")
    kinds.append(kind)
  if len(kinds) > 1 and "tc" in kinds:
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' with a TensorCoreMesh body beside SparseCore "
                           f"bodies (MPMD over {[_MESHES[k] for k in kinds]}) is not supported, as JAX's "
                           f"TPU lowering refuses it ('mpmd_map does not support TC kernels yet'). Fix: "
                           f"launch the TensorCore body as its own pl.kernel.{where}")
  if len(set(kinds)) != len(kinds):
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' with two bodies on meshes of one core type "
                           f"({[_MESHES[k] for k in kinds]}) is not supported: each core runs one body. "
                           f"Fix: give each core type one mesh and one body.{where}")
  for mesh, jaxpr in zip(params["meshes"], params["jaxprs"]):
    if jaxpr.constvars:
      raise UnsupportedError(f"palace.jax: pl.kernel '{name}' captures constants. Fix: pass them as "
                             f"inputs.{where}")
    if _mesh_kind(mesh) == "sc_vector_subcore":
      rules_sc.check_vector_subcore_kernel(jaxpr)


def _scratch_type(aval, what: str, meshes: dict):
  """A mesh launch's scratch entry as a palace allocation type: a semaphore tied to one of the
  kernel's meshes (`pltpu.SemaphoreType.REGULAR(()) @ mesh`, JAX's CoreMemorySpace) tied to its
  palace mesh (launch/run.py: the other meshes' bodies signal it there)."""
  t = alloc_type(aval, what)
  mesh = getattr(getattr(aval, "memory_space", None), "mesh", None)
  if mesh is not None and isinstance(t, pcore.SemaphoreRefType):
    t = t @ next(ours for theirs, ours in meshes if theirs == mesh)   # (external meshes: refused)
  return t


def plan_mpmd_map(params, args, chip) -> tuple:
  """(LaunchPlan, operand arrays, aliased input indices, output -> input) of a JAX mpmd_map (one body
  per mesh, every body taking the same refs) for operands like `args`, on `chip`. Aliased inputs (JAX
  mutable refs handed to the kernel, after state discharge) are operands the kernel updates in place
  (mutable refs, made per call by `run_mpmd_map`); their outputs are those refs' final values, the
  other outputs the plan's."""
  check_mpmd(params)
  jaxprs, name = params["jaxprs"], mpmd_name(params)
  jaxpr = jaxprs[0]   # (the refs' avals: every body's are the same)
  meshes = [(m, _palace_mesh(m)) for m in params["meshes"]]
  out_avals, n_in = [physical(a) for a in params["out_avals"]], len(args)
  n_out = len(out_avals)
  in_sems = {i: semaphore_kind(v.aval.inner_aval.dtype if hasattr(v.aval, "inner_aval") else v.aval.dtype)
             for i, v in enumerate(jaxpr.invars[:n_in])}
  _check_32_bit(name, {**{f"args[{i}]": a for i, a in enumerate(args) if in_sems[i] is None},
                       **{f"outputs[{i}]": a for i, a in enumerate(out_avals)
                          if semaphore_kind(a.dtype) is None}})
  aliases = {int(i): int(o) for i, o in dict(params.get("input_output_aliases") or {}).items()}
  in_of_out = {o: i for i, o in aliases.items()}
  fresh = [o for o in range(n_out) if o not in in_of_out]
  outs = [host.out_struct(pcore.ShapeDtypeStruct(tuple(out_avals[o].shape), host_dtype(out_avals[o].dtype)),
                          f"out_type[{j}]") for j, o in enumerate(fresh)]
  # semaphores carried between launches (LaunchPlan.semaphores): JAX semaphore refs handed to the
  # kernel (pl.empty_ref_like(pltpu.SemaphoreType.DMA(())), aliased after state discharge), results
  sems = tuple((OPERAND, i, k(tuple(np.shape(args[i])))) for i, k in in_sems.items() if k is not None) + \
      tuple((OUTPUT, j, semaphore_kind(out_avals[o].dtype)(tuple(out_avals[o].shape)))
            for j, o in enumerate(fresh) if semaphore_kind(out_avals[o].dtype) is not None)
  scratch = tuple(_scratch_type(v.aval, f"scratch[{k}]", meshes)
                  for k, v in enumerate(jaxpr.invars[n_in + n_out:]))
  names = [ref_name(np.shape(a), a.dtype) if i in aliases else f"args[{i}]" for i, a in enumerate(args)]
  arrays = [np.asarray(a) if i in aliases else host.to_host_array(a, f"args[{i}]")
            for i, a in enumerate(args)]
  host.check_hbm(name, dict(zip(names, arrays)), {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch,
                 chip)
  # inputs whose kernel ref is in VMEM/SMEM (its aval's memory space): staged there; a JAX mutable ref
  # in VMEM/SMEM (pl.empty_ref_like(pltpu.SMEM(...)), aliased) is staged and written back after the body
  staged = []
  # inputs the body takes as values, not refs (a scalar the kernel function closes over, e.g. a traced
  # index; JAX refuses other captured arrays): staged in SMEM and read once before the body
  values = {i for i, v in enumerate(jaxpr.invars[:n_in]) if getattr(v.aval, "inner_aval", None) is None}
  for i, v in enumerate(jaxpr.invars[:n_in]):
    if i in values:
      staged.append(Stage(OPERAND, i, pcore.MemoryRef(arrays[i].shape, arrays[i].dtype,
                                                      pcore.MemorySpace.SMEM), f"args[{i}]"))
      continue
    sp = memory_space(getattr(v.aval, "memory_space", None), pcore.MemorySpace.ANY, f"args[{i}] of {name}")
    if sp in (pcore.MemorySpace.VMEM, pcore.MemorySpace.SMEM):
      staged.append(Stage(OPERAND, i, pcore.MemoryRef(arrays[i].shape, arrays[i].dtype, sp), names[i],
                          write_back=i in aliases))
  for j, o in enumerate(fresh):   # results typed pltpu.VMEM / SMEM: computed there, copied out after
    sp = memory_space(getattr(jaxpr.invars[n_in + o].aval, "memory_space", None), pcore.MemorySpace.ANY,
                      f"outputs[{o}] of {name}")
    if sp in (pcore.MemorySpace.VMEM, pcore.MemorySpace.SMEM) and semaphore_kind(out_avals[o].dtype) is None:
      staged.append(Stage(OUTPUT, j, pcore.MemoryRef(outs[j][0], outs[j][1], sp), f"outputs[{j}]"))

  def make_body(jaxpr):
    prog = program(jaxpr)

    def body(*refs):
      ins, outs_, scr = refs[:n_in], refs[n_in:n_in + len(fresh)], refs[n_in + len(fresh):]
      if values:
        ins = [r[...] if k in values else r for k, r in enumerate(ins)]
      it = iter(outs_)
      all_outs = [ins[in_of_out[o]] if o in in_of_out else next(it) for o in range(n_out)]
      run_program(prog, (), (*ins, *all_outs, *scr))
    body.__name__ = str(getattr(getattr(jaxpr, "debug_info", None), "func_name", None) or name)
    return body

  keyed = [s.index for s in staged if s.type.memory_space is pcore.MemorySpace.SMEM and not s.write_back]
  replayable = not sems and all(_replay_operands(j, keyed) is not None for j in jaxprs)   # (every body)
  fixed_site = kernel_site(jaxpr)
  plan = LaunchPlan(
      name, fixed_site or ("<unknown>", 0),
      host.check_params(_compiler_params(params.get("compiler_params")), "pl.kernel"),
      tuple(Operand(n, a.shape, a.dtype) for n, a in zip(names, arrays)),
      tree_flatten(tuple(range(n_in)))[1],
      tuple(Output(f"outputs[{i}]", *o) for i, o in enumerate(outs)),
      tree_flatten(list(range(len(fresh))))[1], outputs_as=ENTRIES, staged=tuple(staged), scratch=scratch,
      bodies=tuple(map(make_body, jaxprs)), meshes=tuple(ours for _, ours in meshes),
      fixed_site=fixed_site, replay_operands=tuple(keyed) if replayable else None,
      semaphores=sems)
  return plan, arrays, tuple(aliases), in_of_out


def run_mpmd_map(params, args, tpu, cache=None):
  """Run one JAX `mpmd_map` (pl.kernel / core_map over a TensorCore or SparseCore mesh, or MPMD over
  SparseCore meshes) on the VirtualTPU `tpu`. `cache` (the lowering's dict) keeps the plan from the
  first call."""
  entry = None if cache is None else cache.get("plan")
  if entry is None:
    entry = plan_mpmd_map(params, args, tpu.chip)
    if cache is not None:
      cache["plan"] = entry
    args = entry[1]
  plan, _, aliases, in_of_out = entry
  mutable = {i: owning_ref(np.array(args[i])) for i in aliases}   # a private copy updated in place
  res = iter(run(plan, [mutable.get(i, a) for i, a in enumerate(args)], None, tpu))
  return [freeze(mutable[in_of_out[o]]) if o in in_of_out else next(res)
          for o in range(len(params["out_avals"]))]
