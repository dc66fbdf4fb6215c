"""JAX launch parameters -> one palace launch.

`run_pallas_call` (a `pallas_call`: kernel jaxpr + GridMapping) and `run_mpmd_map` (`pl.kernel` /
`core_map`: kernel jaxpr + mesh) are the only adapters between the two worlds: today they build
palace's own `pl.pallas_call` / `pl.kernel` (BlockSpecs whose index maps and a kernel body that run
the jaxprs through the interpreter); when palace's flat `LaunchPlan` (launch/plan.py) lands, only
these two functions change.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from palace._src import core as pcore
from palace._src.blocks import INDEX_DTYPE, PURE_INDEX_MAP
from palace._src.errors import BlockSpecError, UnsupportedError
from palace._src.jax.avals import alloc_type, memory_space
from palace._src.jax.interpret import grid_axes, kernel_site, program, run_program
from palace._src.jax.registry import RULES, literal, sub_jaxprs
from palace._src.jax.schedule import replay_blocker
from palace._src.launch.host import with_memory_space_constraint
from palace._src.launch.host_refs import freeze, new_ref
from palace._src.launch.kernel import kernel as palace_kernel
from palace._src.launch.pallas_call import pallas_call
from palace._src.launch.run import run


def kernel_name(params) -> str:
  name = params.get("name")
  if name:
    return str(name)
  dbg = getattr(params["jaxpr"], "debug_info", None)
  return str(getattr(dbg, "func_name", None) or "kernel")


def _fail(params, what: str, fix: str = "") -> UnsupportedError:
  return UnsupportedError(f"palace.jax: pallas_call '{kernel_name(params)}': {what} is not supported "
                          f"yet. Fix: " + (fix or "run this launch with JAX's interpret mode, or call "
                                                  "palace's own pl.pallas_call outside jax.jit."))


def check_launch(params, avals_in=()) -> None:
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
    _block_shape(params, bm)


def _block_shape(params, bm):
  from jax._src.pallas import core as jpc  # noqa: PLC0415
  out = []
  for d in bm.block_shape:
    if isinstance(d, jpc.Blocked):
      out.append(int(d.block_size))
    elif isinstance(d, jpc.Squeezed) or d is None:
      out.append(pcore.squeezed)
    elif isinstance(d, jpc.Element):
      out.append(pcore.Element(int(d.block_size), tuple(int(p) for p in d.padding)))
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


def _index_map(bm):
  """The BlockSpec index map: its jaxpr compiled once (interpret.program); one with no equations
  (`lambda i, j: (i, 0)`, the common case) becomes a plain tuple of its inputs and literals. Both it
  and a map of scalar index arithmetic alone (`lambda i: (2 * i + 1, 0)`, `_pure_index_jaxpr`) are
  marked pure (blocks.PURE_INDEX_MAP): they charge nothing and run on whole index columns, so a plan
  keeps every step's offsets, found in one vectorised evaluation on any grid
  (block_offsets.grid_offsets), instead of running the map per step. A JAX map computes in int32:
  its columns are int32 (blocks.INDEX_DTYPE), so it wraps where JAX's does."""
  closed = bm.index_map_jaxpr
  if not closed.eqns and not closed.constvars:
    from jax._src import core as jax_core  # noqa: PLC0415
    pos = {v: k for k, v in enumerate(closed.invars)}
    picks = tuple((True, _static_index(literal(v))) if type(v) is jax_core.Literal else (False, pos[v])
                  for v in closed.outvars)
    index_map = lambda *args: tuple(v if static else args[v] for static, v in picks)  # noqa: E731
    setattr(index_map, PURE_INDEX_MAP, True)
    return index_map
  prog, consts = program(closed), closed.consts
  index_map = lambda *args: tuple(run_program(prog, consts, args))  # noqa: E731
  setattr(index_map, INDEX_DTYPE, np.int32)
  if _pure_index_jaxpr(closed.jaxpr):
    setattr(index_map, PURE_INDEX_MAP, True)
  return index_map


def _static_index(x):
  """A literal block index as a Python int (what the pipeline would make of it per step)."""
  return int(x) if isinstance(x, np.integer) else x


def _block_spec(params, bm):
  space = memory_space(getattr(bm.transformed_block_aval, "memory_space", None), None, bm.origin)
  mode = None
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
    mode = pcore.Buffered(int(n))
  if space in (pcore.MemorySpace.ANY, pcore.MemorySpace.HBM):
    if not bm.has_trivial_window():
      raise BlockSpecError(
          f"palace.jax: pallas_call '{kernel_name(params)}': {bm.origin} is in memory space {space} with "
          f"block shape {tuple(_block_shape(params, bm))} over an array of shape "
          f"{tuple(bm.array_aval.shape)}; expected the whole array (block shape = array shape, index "
          f"map returning all 0s): the TPU compiler does not window ANY/HBM operands ('The Pallas TPU "
          f"lowering currently supports in memory space ANY only blocks having the same block shape as "
          f"the array shape and a trivial index_map', measured on a TPU v5e). Fix: "
          f"pl.BlockSpec(memory_space=pl.ANY) and slice the HBM ref in the kernel "
          f"(x_hbm.at[pl.ds(start, size)]), or use VMEM blocks.")
    return pcore.BlockSpec(memory_space=space)
  return pcore.BlockSpec(_block_shape(params, bm), _index_map(bm), mode, memory_space=space)


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
  sem = kw.get("dimension_semantics")
  if sem is not None:
    user = iter(str(getattr(s, "value", s)).lower() if not isinstance(s, str) else s.lower()
                for s in sem)
    kw["dimension_semantics"] = tuple("parallel" if d in vmapped else next(user)
                                      for d in range(grid_rank)) if vmapped else tuple(user)
  return pcore.CompilerParams(**kw)


def _grid(gm, bounds) -> tuple:
  """The grid with its dynamic bounds (the launch's leading operands, concrete by now) filled in."""
  it = iter(bounds)
  return tuple(int(g) if isinstance(g, (int, np.integer)) else int(np.asarray(next(it))) for g in gm.grid)


def run_pallas_call(params, args, cache=None, out=None):
  """Run one JAX `pallas_call` (its primitive parameters and NumPy operands) on the active palace
  VirtualTPU; returns the list of NumPy outputs. `cache` (a dict the lowering keeps for its one
  launch site, whose operand shapes, dtypes and engine are fixed) holds the palace LaunchPlan made
  for each grid by the first call, so later calls only run it. `out`: launch.run's (XLA's result
  buffers to compute the outputs in)."""
  gm = params["grid_mapping"]
  nd = gm.num_dynamic_grid_bounds
  # (the cache's key: the grid, or None for a static grid, which is then not rebuilt per call)
  key = _grid(gm, args[:nd]) if nd else None
  operands = args[nd:] if nd else args
  plan = None if cache is None else cache.get(key)
  if plan is None:
    plan, operands = _palace_launch(params, key if nd else _grid(gm, ())).plan(*operands)
    # (no user frame is on the stack while a jaxpr runs: messages name the kernel's line)
    plan = dataclasses.replace(plan, fixed_site=kernel_site(params["jaxpr"]),
                               replay_operands=_grid_replay_operands(params))
    if cache is not None:
      cache[key] = plan
  return run(plan, operands, out)


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


def _palace_launch(params, grid):
  """The palace `pl.pallas_call` for a JAX pallas_call's parameters at one (concrete) grid."""
  check_launch(params)
  gm = params["grid_mapping"]
  nsp, n_in, n_out = gm.num_index_operands, gm.num_inputs, gm.num_outputs
  jaxpr = params["jaxpr"]
  specs = [_block_spec(params, bm) for bm in gm.block_mappings]
  in_specs, out_specs = specs[:n_in], specs[n_in:n_in + n_out]
  scratch = [alloc_type(a, f"scratch[{i}]") for i, a in enumerate(gm.scratch_avals)]
  out_shape = [pcore.ShapeDtypeStruct(tuple(a.shape), np.dtype(a.dtype)) for a in params["out_avals"]]

  vmapped = tuple(int(d) for d in getattr(gm, "vmapped_dims", ()))
  user_axes = tuple(d for d in range(len(grid)) if d not in vmapped)

  prog = program(jaxpr)

  def kernel(*refs):
    if not vmapped:
      run_program(prog, (), refs)
      return
    # program_id / num_programs count the user's grid axes only (not the ones jax.vmap added)
    token = grid_axes.set(user_axes)
    try:
      run_program(prog, (), refs)
    finally:
      grid_axes.reset(token)

  kernel.__name__ = kernel_name(params)
  grid_spec = pcore.PrefetchScalarGridSpec(nsp, grid, in_specs, out_specs, scratch)
  return pallas_call(kernel, out_shape, grid_spec=grid_spec,
                     input_output_aliases=dict(params.get("input_output_aliases") or ()),
                     compiler_params=_compiler_params(params.get("compiler_params"), len(grid),
                                                      vmapped),
                     name=kernel_name(params))


def _palace_mesh(mesh):
  """palace's mesh for a JAX TPU mesh (TensorCore, or SparseCore vector / scalar subcores)."""
  from palace._src.launch import sc_mesh  # noqa: PLC0415
  kind = type(mesh).__name__
  if kind == "TensorCoreMesh":
    (axis, size), = mesh.shape.items()
    return pcore.TensorCoreMesh(str(axis), int(size))
  if kind == "VectorSubcoreMesh":
    return sc_mesh.VectorSubcoreMesh(str(mesh.core_axis_name), str(mesh.subcore_axis_name),
                                     int(mesh.num_cores), int(mesh.num_subcores))
  return sc_mesh.ScalarSubcoreMesh(str(mesh.axis_name), int(mesh.num_cores))


_MESHES = ("TensorCoreMesh", "VectorSubcoreMesh", "ScalarSubcoreMesh")


def check_mpmd(params) -> None:
  """Raise UnsupportedError (at lowering time) for mesh launches the adapter does not cover."""
  name = params.get("name") or "kernel"
  if len(params["jaxprs"]) != 1 or params.get("external_meshes"):
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' with several (mesh, body) pairs (MPMD) or "
                           f"external meshes is not supported yet. Fix: use one TensorCoreMesh body, or call "
                           f"palace's pl.kernel outside jax.jit.")
  mesh = params["meshes"][0]
  if type(mesh).__name__ not in _MESHES:
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' over a {type(mesh).__name__} is not supported "
                           f"yet ({', '.join(_MESHES)} are). Fix: call palace's pl.kernel outside jax.jit "
                           f"for this mesh.")
  if params["jaxprs"][0].constvars:
    raise UnsupportedError(f"palace.jax: pl.kernel '{name}' captures constants. Fix: pass them as "
                           f"inputs.")


def run_mpmd_map(params, args, cache=None):
  """Run one JAX `mpmd_map` (pl.kernel / core_map over a TensorCore or SparseCore mesh) on the active
  VirtualTPU.

  Aliased inputs (JAX mutable refs handed to the kernel, after state discharge) become palace
  mutable refs that the kernel updates in place; their outputs are those refs' final values.
  `cache` (the lowering's dict) keeps the palace launch and its LaunchPlan from the first call."""
  entry = None if cache is None else cache.get("launch")
  if entry is None:
    entry = _mpmd_launch(params, len(args))
    if cache is not None:
      cache["launch"] = entry
  call, aliases, in_of_out, n_out, spaces = entry
  mutable = {i: new_ref(args[i]) for i in aliases}   # a private copy the kernel updates in place
  operands = [mutable.get(i, a) for i, a in enumerate(args)]
  plan = None if cache is None else cache.get("plan")
  if plan is None:
    # inputs whose kernel ref is in VMEM/SMEM (pltpu.with_memory_space_constraint on the argument):
    # the plan stages a copy there before the body (later calls run the plan on the plain arrays)
    plan, operands = call.plan(*[with_memory_space_constraint(a, spaces[i]) if spaces[i] is not None
                                 else a for i, a in enumerate(operands)])
    keyed = [i for i, sp in enumerate(spaces) if sp is pcore.MemorySpace.SMEM]   # (never aliased)
    plan = dataclasses.replace(plan, fixed_site=kernel_site(params["jaxprs"][0]),
                               replay_operands=_replay_operands(params["jaxprs"][0], keyed))
    if cache is not None:
      cache["plan"] = plan
  res = iter(run(plan, operands))
  return [freeze(mutable[in_of_out[o]]) if o in in_of_out else next(res) for o in range(n_out)]


def _mpmd_launch(params, n_in: int):
  """(palace pl.kernel call, aliased input indices, output -> input, output count) of an mpmd_map."""
  check_mpmd(params)
  jaxpr, mesh = params["jaxprs"][0], params["meshes"][0]
  dbg = getattr(jaxpr, "debug_info", None)
  name = str(params.get("name") or getattr(dbg, "func_name", None) or "kernel")
  out_avals = params["out_avals"]
  n_out = len(out_avals)
  aliases = {int(i): int(o) for i, o in dict(params.get("input_output_aliases") or {}).items()}
  in_of_out = {o: i for i, o in aliases.items()}
  scratch = [alloc_type(v.aval, f"scratch[{k}]") for k, v in enumerate(jaxpr.invars[n_in + n_out:])]
  fresh = [o for o in range(n_out) if o not in in_of_out]
  out_type = [pcore.ShapeDtypeStruct(tuple(out_avals[o].shape), np.dtype(out_avals[o].dtype))
              for o in fresh]
  prog = program(jaxpr)

  def body(*refs):
    ins, outs, scr = refs[:n_in], refs[n_in:n_in + len(fresh)], refs[n_in + len(fresh):]
    it = iter(outs)
    all_outs = [ins[in_of_out[o]] if o in in_of_out else next(it) for o in range(n_out)]
    run_program(prog, (), (*ins, *all_outs, *scr))

  body.__name__ = name
  call = palace_kernel(body, out_type, mesh=_palace_mesh(mesh),
                       scratch_types=scratch, compiler_params=_compiler_params(params.get("compiler_params")),
                       name=name)
  spaces = []   # per input: the VMEM/SMEM its kernel ref lives in, or None (HBM / ANY)
  for i, v in enumerate(jaxpr.invars[:n_in]):
    sp = memory_space(getattr(v.aval, "memory_space", None), pcore.MemorySpace.ANY, f"args[{i}] of {name}")
    spaces.append(sp if sp in (pcore.MemorySpace.VMEM, pcore.MemorySpace.SMEM) and i not in aliases
                  else None)
  return call, tuple(aliases), in_of_out, n_out, spaces
