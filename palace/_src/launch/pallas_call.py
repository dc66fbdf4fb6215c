"""`pl.pallas_call` (L5): grid + BlockSpecs on the virtual TPU."""
from __future__ import annotations

import functools
import itertools

import numpy as np

from palace._src import validate
from palace._src.launch import host as launch
from palace._src.blocks import BLOCKED, SQUEEZED, canonicalize
from palace._src.core import (CORE_PARALLEL, PARALLEL, BlockSpec, CostEstimate, GridSpec, MemoryRef, MemorySpace,
                              SemaphoreRefType, canonical_semantics, no_block_spec)
from palace._src.errors import ResourceError, ShapeError, UsageError
from palace._src.lang.primitives import scoped
from palace._src.lang.refs import Ref
from palace._src.lang.tpu_primitives import sync_copy
from palace._src.pipeline import run_pipeline
from palace._src.util import fmt_bytes, tree_flatten, tree_unflatten
from palace._src.core import Buffer


def _is_spec_leaf(x):
  return x is None or x is no_block_spec or isinstance(x, BlockSpec)


def _flatten_specs(specs, n: int, what: str):
  if specs is no_block_spec:
    return [BlockSpec()] * n
  leaves, _ = tree_flatten(specs, is_leaf=_is_spec_leaf)
  if len(leaves) == 1 and n != 1 and not isinstance(specs, (list, tuple, dict)):
    leaves = leaves * n
  if len(leaves) != n:
    raise UsageError(f"pallas_call {what} has {len(leaves)} BlockSpecs but there are {n} "
                     f"operands. Fix: give {what} one BlockSpec per "
                     f"{'input (after the scalar-prefetch operands)' if what == 'in_specs' else 'output of out_shape'}"
                     f", in order (None for the whole array in VMEM).")
  # a `no_block_spec` leaf is the raw HBM ref (pallas-api.md 3.1); None is the default whole-VMEM spec
  return [BlockSpec() if x is None else BlockSpec(memory_space=MemorySpace.ANY) if x is no_block_spec else x
          for x in leaves]


def _absent_entries(kernel, nsp, args, in_specs, out_shape, out_specs, scratch):
  """JAX treats a None operand, output or scratch entry as an empty pytree: its in_specs/out_specs
  entry is dropped and the kernel gets None at its position (paged_attention's optional scales,
  flash_attention's optional residual outputs). Returns (kernel, in_specs, out_specs, scratch)."""
  def top(tree):
    return list(tree) if isinstance(tree, (list, tuple)) else None

  ins, outs, scr = top(args), top(out_shape), top(scratch)
  if not any(e is None for e in (ins or []) + (outs or []) + (scr or [])):
    return kernel, in_specs, out_specs, scratch

  def drop(specs, entries, what="in_specs", names="args"):
    if entries is None or not isinstance(specs, (list, tuple)) or len(specs) != len(entries):
      return specs
    for i, (sp, e) in enumerate(zip(specs, entries)):
      if e is None and isinstance(sp, BlockSpec):
        raise UsageError(
            f"pallas_call {names}[{i + (nsp if what == 'in_specs' else 0)}] is None but {what}[{i}] is a "
            f"BlockSpec: None is an empty pytree (no operand; the kernel gets None there), so it has no "
            f"block. Fix: pass an array, or None as its {what} entry for an absent operand.")
    return type(specs)(sp for sp, e in zip(specs, entries) if e is not None)

  is_sds = lambda x: hasattr(x, "shape")  # noqa: E731
  slots = [1] * nsp                    # per kernel position group: its ref count, or None if absent
  slots += [None if a is None else len(tree_flatten(a)[0]) for a in (ins or [])]
  slots += ([None if o is None else len(tree_flatten(o, is_leaf=is_sds)[0]) for o in outs] if outs is not None
            else [len(tree_flatten(out_shape, is_leaf=is_sds)[0])])
  slots += [None if t is None else 1 for t in scr] if scr is not None else []

  def with_nones(*refs, **kw):
    pos, k = [], 0
    for n in slots:
      if n is None:
        pos.append(None)
      else:
        pos += refs[k:k + n]
        k += n
    return kernel(*pos, *refs[k:], **kw)

  with_nones.__name__ = getattr(kernel, "__name__", "kernel")
  kept_scratch = type(scratch)(t for t in scratch if t is not None) if scr is not None else scratch
  return with_nones, drop(in_specs, ins), drop(out_specs, outs, "out_specs", "out_shape"), kept_scratch


_check_call = validate.check_call


def _check_arities(kernel, kname, grid, nsp, specs, maps, n_in, n_out, scratch):
  for s, m in zip(specs, maps):
    if isinstance(s, BlockSpec) and s.index_map is not None:
      _check_call(s.index_map, len(grid) + nsp, (), lambda e, m=m: (
          f"index_map of {m.name} cannot be called with the grid indices: the grid {grid} has {len(grid)} "
          f"axes{f' plus {nsp} scalar-prefetch refs' if nsp else ''}, so it gets {len(grid) + nsp} "
          f"arguments ({e}); expected e.g. lambda {', '.join('ijklmn'[:len(grid)]) or ''}"
          f"{', *prefetch_refs' if nsp else ''}: (...)."))
  kw = tuple(scratch) if isinstance(scratch, dict) else ()
  n_scr = 0 if kw else len(tuple(scratch))
  _check_call(kernel, nsp + n_in + n_out + n_scr, kw, lambda e: (
      f"Kernel '{kname}' cannot take the refs pallas_call passes: {nsp} scalar-prefetch + {n_in} input + "
      f"{n_out} output + {n_scr} scratch positional refs"
      + (f" and scratch keywords {list(kw)}" if kw else "")
      + f" ({e}); expected kernel(*prefetch_refs, *in_refs, *out_refs, *scratch_refs)."))


def _returns_none(kernel, kname):
  @functools.wraps(kernel)
  def body(*args, **kwargs):
    r = kernel(*args, **kwargs)
    if r is not None:
      raise UsageError(f"Kernel '{kname}' returned a value of type {type(r).__name__}; a Pallas kernel "
                       f"must return None and write its results into the output refs (o_ref[...] = value).")
  return body


def _is_type_leaf(x):
  return isinstance(x, (MemoryRef, SemaphoreRefType))


def pallas_call(kernel, out_shape, *, grid_spec=None, grid=(), in_specs=no_block_spec,
                out_specs=no_block_spec, scratch_shapes=(), input_output_aliases=None, debug=False,
                interpret=False, name=None, compiler_params=None, cost_estimate=None, metadata=None,
                **unsupported):
  """Run `kernel` once per grid point with BlockSpec'd operands pipelined HBM->VMEM.

  Example:
    >>> def add_kernel(x_ref, y_ref, o_ref):
    ...   o_ref[...] = x_ref[...] + y_ref[...]
    >>> f = pl.pallas_call(add_kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32))
  """
  if unsupported:
    raise UsageError(f"pallas_call got unexpected keyword(s) {sorted(unsupported)}. Fix: check the "
                     f"spelling; the keywords are grid_spec, grid, in_specs, out_specs, scratch_shapes, "
                     f"input_output_aliases, compiler_params, interpret, name, cost_estimate, debug, metadata.")
  if grid_spec is not None and not isinstance(grid_spec, GridSpec):
    raise UsageError(f"pallas_call grid_spec must be a pl.GridSpec or pltpu.PrefetchScalarGridSpec; got "
                     f"{grid_spec!r}. Fix: pass grid_spec=pltpu.PrefetchScalarGridSpec(...), or grid=, "
                     f"in_specs=, out_specs= directly.")
  if cost_estimate is not None and not isinstance(cost_estimate, CostEstimate):
    raise UsageError(f"pallas_call cost_estimate must be a pl.CostEstimate; got {cost_estimate!r}. Fix: "
                     f"pass pl.CostEstimate(flops=..., transcendentals=..., bytes_accessed=...) or None.")
  if grid_spec is not None:
    if grid != () or in_specs is not no_block_spec or out_specs is not no_block_spec or scratch_shapes:
      raise UsageError("pallas_call: pass either grid_spec or grid/in_specs/out_specs/scratch_shapes, "
                       "not both.")
  else:
    grid_spec = GridSpec(grid, in_specs, out_specs, scratch_shapes)
  g = grid_spec.grid
  g = (g,) if isinstance(g, int) else tuple(g)
  params = launch.check_params(compiler_params, "pallas_call")
  kname = name or getattr(kernel, "__name__", "kernel")
  aliases = launch.check_aliases(input_output_aliases, kname)

  @functools.wraps(kernel)
  def call(*args):
    launch.check_interpret(interpret, kname)
    with launch.interpret_context(interpret):
      return _call(kernel, kname, out_shape, g, grid_spec, aliases, params, args)

  return call


def _call(kernel, kname, out_shape, grid, grid_spec, aliases, params, args):
  nsp = grid_spec.num_scalar_prefetch
  if len(args) < nsp:
    raise UsageError(f"pallas_call '{kname}' expects {nsp} scalar-prefetch operands; got {len(args)} "
                     f"operands in all. Fix: pass the scalar-prefetch arrays first, then the inputs.")
  pre_leaves, pre_td = tree_flatten(tuple(args[:nsp]))
  in_leaves, _ = tree_flatten(tuple(args[nsp:]))
  out_leaves, out_td = tree_flatten(out_shape, is_leaf=lambda x: hasattr(x, "shape"))
  grid = validate.as_grid(grid, f"pallas_call '{kname}' grid")
  pre_arrays = [launch.to_host_array(a, f"scalar_prefetch[{i}]") for i, a in enumerate(pre_leaves)]
  in_arrays = [launch.to_host_array(a, f"args[{i + nsp}]") for i, a in enumerate(in_leaves)]
  n_idx_args = nsp
  kernel, in_specs, out_specs, scratch = _absent_entries(
      kernel, nsp, args[nsp:], grid_spec.in_specs, out_shape, grid_spec.out_specs, grid_spec.scratch_shapes)
  in_specs = _flatten_specs(in_specs, len(in_arrays), "in_specs")
  out_specs = _flatten_specs(out_specs, len(out_leaves), "out_specs")
  in_maps = [canonicalize(s, a.shape, a.dtype, f"args[{i + nsp}]", n_idx_args)
             for i, (s, a) in enumerate(zip(in_specs, in_arrays))]
  outs = [launch.out_struct(o, f"out_shape[{i}]") for i, o in enumerate(out_leaves)]
  launch.check_hbm(kname, {f"args[{i}]": a for i, a in enumerate(pre_arrays + in_arrays)},
                   {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch)
  out_maps = []
  for i, (s, (shape, dtype, space)) in enumerate(zip(out_specs, outs)):
    if space in (MemorySpace.VMEM, MemorySpace.SMEM) and (s is no_block_spec or s.block_shape is None):
      s = BlockSpec(memory_space=space)
    out_maps.append(canonicalize(s, shape, dtype, f"outputs[{i}]", n_idx_args))
  _check_arities(kernel, kname, grid, nsp, in_specs + out_specs, in_maps + out_maps, len(in_maps),
                 len(out_maps), scratch)
  kernel = _returns_none(kernel, kname)
  # HBM buffers
  all_in = pre_arrays + in_arrays
  out_bufs = []
  aliased_outs = set(aliases.values())
  lazy = set() if launch.eager_output_init() else \
      {i for i, m in enumerate(out_maps) if m.pipelined and i not in aliased_outs and _tileable(m)}
  for i, (shape, dtype, _) in enumerate(outs):
    # Pipelined outputs start as np.empty and only blocks never written back are filled afterwards
    # (same result as filling everything first, without touching every page twice).
    storage = np.empty(shape, dtype) if i in lazy else launch.uninitialized(shape, dtype)
    out_bufs.append(Buffer(storage, shape, dtype, MemorySpace.ANY, f"outputs[{i}]"))
  written = {}
  for a_in, a_out in aliases.items():
    if not (0 <= a_in < len(all_in) and 0 <= a_out < len(out_bufs)):
      raise UsageError(f"input_output_aliases {{{a_in}: {a_out}}} refers to a missing operand; there "
                       f"are {len(all_in)} inputs and {len(out_bufs)} outputs. Fix: use input indices "
                       f"0..{len(all_in) - 1} (scalar-prefetch operands first) and output indices "
                       f"0..{len(out_bufs) - 1}.")
    src = all_in[a_in]
    ob = out_bufs[a_out]
    if src.shape != ob.shape or src.dtype != ob.dtype:
      raise ShapeError(f"input_output_aliases {{{a_in}: {a_out}}}: input {src.dtype}{list(src.shape)} "
                       f"and output {ob.dtype}{list(ob.shape)} must have the same shape and dtype. Fix: "
                       f"make out_shape[{a_out}] match the input, or drop the alias.")
    ob.storage = src.copy()
  scratch_is_dict = isinstance(scratch, dict)

  def program(points, pre_bufs, in_bufs):
    launch.with_barrier_semaphore(params, functools.partial(_program, points, pre_bufs, in_bufs))

  def _program(points, pre_bufs, in_bufs):
    smem_types = [MemoryRef(a.shape, a.dtype, MemorySpace.SMEM) for a in pre_arrays]
    smem_in = [(k, m) for k, m in enumerate(in_maps) if m.space == MemorySpace.SMEM]
    smem_out = [(k, m) for k, m in enumerate(out_maps) if m.space == MemorySpace.SMEM]
    smem_types += [MemoryRef(m.array_shape, m.dtype, MemorySpace.SMEM) for _, m in smem_in + smem_out]

    def with_smem(*smem_refs):
      pre_refs = list(smem_refs[:len(pre_arrays)])
      for r, b in zip(pre_refs, pre_bufs):
        sync_copy(Ref(b), r)
      in_refs = [Ref(b) for b in in_bufs]
      out_refs = [Ref(b) for b in out_bufs]
      rest = smem_refs[len(pre_arrays):]
      for (k, _), r in zip(smem_in, rest):
        sync_copy(in_refs[k], r)
        in_refs[k] = r
      for (k, _), r in zip(smem_out, rest[len(smem_in):]):
        out_refs[k] = r
      pre_tree = tree_unflatten(pre_td, pre_refs)

      def with_scratch(*scr, **kw_scr):
        run_pipeline(kernel, grid, in_maps, out_maps, in_refs, out_refs, lead_args=tuple(pre_tree),
                     tail_args=scr, tail_kwargs=kw_scr, index_args=tuple(pre_tree), points=points,
                     written=written)

      if scratch_is_dict:
        scoped(with_scratch, (), scratch, "scratch")
      else:
        scoped(with_scratch, tuple(scratch), {}, "scratch")
      for (k, _), r in zip(smem_out, rest[len(smem_in):]):
        sync_copy(r, Ref(out_bufs[k]))

    smem_names = ([f"scalar_prefetch[{i}]" for i in range(len(pre_arrays))] +
                  [m.name for _, m in smem_in + smem_out])
    scoped(with_smem, smem_types, {}, "smem", names=smem_names)

  def build(machine, chip_index):
    core_points = megacore_split(machine.chip, grid, params.dimension_semantics, kname)
    env = machine.chip_axis_env(chip_index)
    cores = [machine.add_core(chip_index, c, env, params) for c in range(len(core_points))]
    _check_vmem(cores[0], kname, in_maps + out_maps, scratch)
    pre_bufs = [launch.hbm_input(a, f"scalar_prefetch[{i}]", chip_index)
                for i, a in enumerate(pre_arrays)]
    in_bufs = [launch.hbm_input(a, f"args[{i + nsp}]", chip_index) for i, a in enumerate(in_arrays)]
    for b in out_bufs:
      b.chip = chip_index  # each chip's outputs live on it (remote DMAs to chip 0 found the sender's own)
    machine.register_hbm(chip_index, pre_bufs + in_bufs + out_bufs)
    return [(c, functools.partial(program, pts, pre_bufs, in_bufs)) for c, pts in zip(cores, core_points)]

  try:
    launch.execute(kname, build, _num_points(grid))
  finally:
    for i in lazy:
      _fill_unwritten(out_bufs[i].storage, out_maps[i], written.get(i, set()))
  results = [b.storage for b in out_bufs]
  return launch.like_inputs(tree_unflatten(out_td, results), args)


def _tileable(m) -> bool:
  """Blocks of this output tile its array (Blocked / squeezed dims), so unwritten ones are findable."""
  return all(kind in (BLOCKED, SQUEEZED) for kind, _, _ in m.dims)


def _fill_unwritten(storage, m, written) -> None:
  """Give every element outside the written-back blocks the uninitialised value (NaN / int min)."""
  counts = [-(-dim // size) if kind == BLOCKED else dim
            for (kind, size, _), dim in zip(m.dims, m.array_shape)]
  done = np.zeros(counts, bool)
  for offs in written:
    done[tuple(off // size if kind == BLOCKED else off
               for (kind, size, _), off in zip(m.dims, offs))] = True
  if done.all():
    return
  fill = launch.uninitialized((), storage.dtype)
  for blk in zip(*np.nonzero(~done)):
    storage[tuple(slice(b * size, (b + 1) * size) if kind == BLOCKED else b
                  for (kind, size, _), b in zip(m.dims, blk))] = fill


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


def _num_points(grid) -> int:
  n = 1
  for g in grid:
    n *= g
  return n


def _check_vmem(core, kname, maps, scratch):
  """Fail before running when the pipeline buffers and scratch exceed the scoped VMEM limit."""
  rows = []
  for m in maps:
    if m.pipelined:
      rows.append((f"{m.name} {m.buffer_count} x {fmt_bytes(m.block_bytes)} block "
                   f"{m.dtype}{list(m.block_shape)}", m.buffer_count * m.block_bytes))
  leaves, _ = tree_flatten(scratch, is_leaf=_is_type_leaf)
  for i, t in enumerate(leaves):
    if isinstance(t, MemoryRef) and t.memory_space == MemorySpace.VMEM:
      rows.append((f"scratch[{i}] {fmt_bytes(t.nbytes)}", t.nbytes))
  total = sum(b for _, b in rows)
  if total > core.vmem_limit:
    detail = " + ".join(r for r, _ in rows)
    chip = core.chip
    need = -(-(total + chip.internal_scratch_bytes) // 2**20) * 2**20   # whole MiB
    fix = (f"or raise CompilerParams(vmem_limit_bytes=...) to at least {need} ({fmt_bytes(need)}; "
           f"{chip.name} has {fmt_bytes(chip.vmem_bytes)} of VMEM)" if need <= chip.vmem_bytes else
           f"raising vmem_limit_bytes cannot help: {chip.name} has only {fmt_bytes(chip.vmem_bytes)} of VMEM")
    raise ResourceError(
        f"VMEM over capacity for kernel '{kname}' on chip 0 core 0 ({chip.name}): "
        f"{fmt_bytes(total)} requested ({detail}) but the scoped VMEM limit leaves "
        f"{fmt_bytes(core.vmem_limit)} (limit {fmt_bytes(core.vmem_limit + chip.internal_scratch_bytes)}"
        f" minus {fmt_bytes(chip.internal_scratch_bytes)} Mosaic internal scratch). Reduce block "
        f"sizes or pipeline buffer_count (pl.Buffered(1) for blocks that do not change), {fix}.")
