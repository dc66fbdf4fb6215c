"""`pltpu.emit_pipeline` and `emit_pipeline_with_allocations` (L5, library code): a pipeline inside a
kernel body, over refs the kernel holds (HBM refs of pl.kernel, VMEM refs, views).

Built on `pipeline.run_pipeline`, the same step loop as pallas_call's grid (block copies are prepared
DMA copies, waited on DMA semaphores): this module only turns emit_pipeline's arguments into block
mappings and allocations, splits the grid over the cores of `core_axis_name` (parallel axes), and
rebuilds the body's arguments from the pipelined blocks.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools

from palace._src import executor, validate
from palace._src.blocks import BlockMapping, canonicalize
from palace._src.core import PARALLEL, BlockSpec, canonical_semantics, no_block_spec
from palace._src.errors import BlockSpecError, UnsupportedError, UsageError
from palace._src.lang.array import concrete_int
from palace._src.lang.indexed import IndexedRef
from palace._src.lang.primitives import _scalar, axis_index, axis_size, num_programs, program_id
from palace._src.lang.refs import Ref
from palace._src.pipeline import allocation_types, run_pipeline
from palace._src.util import tree_flatten, tree_unflatten


@dataclasses.dataclass(frozen=True)
class PipelineStep:
  """`pltpu.PipelineStep`: the grid indices of a step and its position in this core's loop."""
  index: tuple
  local_index: object


def _is_spec_leaf(x) -> bool:
  return x is None or x is no_block_spec or isinstance(x, BlockSpec)


def _spec_entries(specs) -> tuple:
  if _is_spec_leaf(specs):
    return (specs,)
  if isinstance(specs, (list, tuple)):
    return tuple(specs)
  return (specs,)


def _is_ref_leaf(x) -> bool:
  return isinstance(x, (Ref, IndexedRef))


def _operands(entries, ref_entries, what: str):
  """[(spec, ref)] flat, plus the ref treedef of each entry (to rebuild the body's arguments)."""
  flat, tds = [], []
  for i, (spec, ref) in enumerate(zip(entries, ref_entries)):
    refs, td = tree_flatten(ref, is_leaf=_is_ref_leaf)
    specs, _ = tree_flatten(spec, is_leaf=_is_spec_leaf)
    if len(specs) == 1 and len(refs) != 1:
      specs = specs * len(refs)
    if len(specs) != len(refs):
      raise UsageError(f"emit_pipeline {what}[{i}] has {len(specs)} BlockSpec(s) but its operand is a "
                       f"pytree of {len(refs)} ref(s). Fix: give one spec per ref (or one for all).")
    for j, r in enumerate(refs):
      if not isinstance(r, Ref):
        raise UsageError(f"emit_pipeline {what}[{i}] operand {j} is a {type(r).__name__}; a pipeline "
                         f"runs over refs. Fix: pass refs (HBM refs from pl.kernel, VMEM refs, views "
                         f"`.at[...]`).")
    flat += list(zip(specs, refs))
    tds.append(td)
  return flat, tds


def _mapping(spec, ref: Ref, what: str) -> BlockMapping:
  name = ref.origin()
  try:
    return canonicalize(spec, ref.shape, ref.dtype, name, 0)
  except BlockSpecError as e:
    raise BlockSpecError(f"{e} (emit_pipeline {what})") from None


def _core_info(core_axis, core_axis_name):
  """(number of cores, this core's index) that the pipeline grid is split over."""
  if core_axis is not None and core_axis_name is not None:
    raise UsageError("emit_pipeline: pass only one of core_axis (a grid axis of the enclosing kernel) "
                     "and core_axis_name (a mesh axis name). Fix: drop one of them.")
  if core_axis_name is not None:
    return axis_size(core_axis_name), concrete_int(axis_index(core_axis_name), "core index")
  if core_axis is not None:
    axes = core_axis if isinstance(core_axis, (tuple, list)) else (core_axis,)
    n, c = 1, 0
    for a in axes:
      size = num_programs(a)
      n, c = n * size, c * size + concrete_int(program_id(a), "core index")
    return n, c
  return 1, 0


def _partition(grid, semantics, num_cores: int, core_id: int):
  """Per grid dim, the range of indices this core runs (JAX's partitioning: the first parallel dim
  divisible by the core count, else the largest parallel dim split as evenly as possible)."""
  ranges = [range(g) for g in grid]
  if num_cores == 1:
    return ranges
  parallel = [d for d, s in enumerate(semantics or ()) if s == PARALLEL]
  if not parallel:
    raise UnsupportedError(
        f"emit_pipeline cannot split grid {grid} across {num_cores} cores: no grid dimension is "
        f"'parallel' (dimension_semantics={tuple(str(s) for s in semantics) if semantics else None}). "
        f"Fix: mark the independent dimensions pltpu.PARALLEL.")
  divisible = [d for d in parallel if grid[d] % num_cores == 0]
  if divisible:
    d = divisible[0]
    size = grid[d] // num_cores
    ranges[d] = range(core_id * size, (core_id + 1) * size)
    return ranges
  d = max(parallel, key=lambda i: (grid[i], -i))
  base, rem = divmod(grid[d], num_cores)
  count = base + 1 if core_id < rem else base
  start = core_id * count if core_id < rem else core_id * base + rem
  ranges[d] = range(start, start + count)
  return ranges


def emit_pipeline(body, *, grid, in_specs=(), out_specs=(), tiling=None, core_axis=None,
                  core_axis_name=None, dimension_semantics=None, trace_scopes=True,
                  no_pipelining=False, output_wait_read_only=False, _explicit_indices=False):
  """A software pipeline over refs a kernel already holds: `pipeline(*in_refs, *out_refs)`.

  Runs `body(*in_blocks, *out_blocks, *scratches)` for every point of `grid` with the BlockSpec
  semantics of pallas_call: blocks are copied HBM->VMEM into scoped buffers with DMAs and DMA
  semaphores (double-buffered by default, `pl.Buffered(n)` per spec), outputs are written back when
  their block index changes. Specs with `memory_space=pltpu.HBM` (or `pl.ANY`) pass the ref itself; a
  `pl.no_block_spec` (or None) entry removes the operand from the pipeline and the body gets None for
  it; a ref already in VMEM is windowed by views, not copied. `pl.program_id` in the body is the
  pipeline's grid index. `no_pipelining=True` waits every copy at once. With `core_axis_name` (a mesh
  axis) or `core_axis` (an enclosing grid axis) the grid is split across cores along its first
  divisible PARALLEL dimension; program_id stays the global index, num_programs is this core's share.

  Example:
    >>> def kernel(x_hbm, o_hbm):
    ...   def body(x_ref, o_ref):
    ...     o_ref[...] = x_ref[...] * 2
    ...   pltpu.emit_pipeline(body, grid=(4,), in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0))],
    ...                       out_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0))])(x_hbm, o_hbm)
  """
  grid = (grid,) if not isinstance(grid, (tuple, list)) else tuple(grid)
  grid = tuple(concrete_int(g, "emit_pipeline grid size") for g in grid)
  if any(g <= 0 for g in grid):
    raise UsageError(f"emit_pipeline grid {grid}: every grid size must be strictly positive. Fix: give "
                     f"each axis at least one step (skip the pipeline with pl.when for an empty one).")
  semantics = None
  if dimension_semantics is not None:
    semantics = tuple(canonical_semantics(s) for s in dimension_semantics)
    if len(semantics) != len(grid):
      raise UsageError(f"emit_pipeline dimension_semantics has {len(semantics)} entries for the "
                       f"{len(grid)}-d grid {grid}. Fix: give one per grid dimension.")
  in_entries, out_entries = _spec_entries(in_specs), _spec_entries(out_specs)

  def pipeline(*refs, scratches=None, allocations=None):
    ex = executor.current("an emit_pipeline pipeline")
    setup = _setup(refs, in_entries, out_entries, grid)
    in_maps, out_maps, in_refs, out_refs, in_tds, out_tds, keep = setup
    num_cores, core_id = _core_info(core_axis, core_axis_name)
    ranges = _partition(grid, semantics, num_cores, core_id)
    points = list(itertools.product(*ranges))
    local_grid = tuple(len(r) for r in ranges)
    scr = () if scratches is None else tuple(scratches) if isinstance(scratches, (list, tuple)) \
        else (scratches,)
    step = [0]

    def run_body(*blocks):
      it = iter(blocks)
      flat = [next(it) if k else None for k in keep]   # dropped operands (no_block_spec) are None
      extra = tuple(it)
      n_in_leaves = sum(td.num_leaves for td in in_tds)
      ins = _rebuild(in_tds, flat[:n_in_leaves])
      outs = _rebuild(out_tds, flat[n_in_leaves:])
      lead = ()
      if _explicit_indices:
        if ex.grid_reads is not None:   # (a step counter of its own: the steps are not a function of
          ex.grid_reads.append(None)    # the grid indices a steady-state detector sees)
        idx = tuple(_scalar_index(v) for v in ex.grid_stack[-1][0])
        lead = (PipelineStep(idx, _scalar_index(step[0])),)
      step[0] += 1
      if step[0] == 1:   # the first step checks the body's arity (not every step: it is a hot path)
        validate.check_call(body, len(lead) + len(ins) + len(outs) + len(extra), (), lambda e: (
            f"The emit_pipeline body {getattr(body, '__name__', body)!r} cannot take the refs it is "
            f"given: {len(ins)} input + {len(outs)} output block refs"
            + (" after the PipelineStep" if lead else "") + (f" + {len(extra)} extra" if extra else "")
            + f" ({e}). Fix: define it as body(*in_refs, *out_refs), one parameter per BlockSpec of "
            f"in_specs and out_specs."))
      res = body(*lead, *ins, *outs, *extra)
      if res is not None:
        raise UsageError(f"The emit_pipeline body {getattr(body, '__name__', body)!r} returned "
                         f"{type(res).__name__}; pipeline bodies must return None and write outputs "
                         f"to their output refs. Fix: drop the return statement.")

    if not points:
      return None
    run_pipeline(run_body, local_grid, in_maps, out_maps, in_refs, out_refs, tail_args=scr,
                 points=points, sync=no_pipelining, allocations=allocations, smem_blocks=True)
    return None

  pipeline.__name__ = f"pipeline_{getattr(body, '__name__', 'body')}"
  pipeline._specs = (in_entries, out_entries, grid)
  return pipeline


def _scalar_index(v):
  return _scalar(v, executor.current().now)


def _rebuild(tds, blocks):
  out, k = [], 0
  for td in tds:
    nl = td.num_leaves
    out.append(tree_unflatten(td, list(blocks[k:k + nl])))
    k += nl
  return out


def _setup(refs, in_entries, out_entries, grid):
  n_in, n_out = len(in_entries), len(out_entries)
  if len(refs) != n_in + n_out:
    raise UsageError(f"This pipeline has {n_in} input spec(s) and {n_out} output spec(s) but was "
                     f"called with {len(refs)} ref(s). Fix: call it as pipeline(*in_refs, *out_refs).")
  ins, in_tds = _operands(in_entries, refs[:n_in], "in_specs")
  outs, out_tds = _operands(out_entries, refs[n_in:], "out_specs")
  keep = [not _dropped(sp) for sp, _ in ins + outs]
  in_maps = [_mapping(s, r, f"in_specs[{i}]") for i, (s, r) in enumerate(ins) if not _dropped(s)]
  out_maps = [_mapping(s, r, f"out_specs[{i}]") for i, (s, r) in enumerate(outs) if not _dropped(s)]
  ins = [(s, r) for s, r in ins if not _dropped(s)]
  outs = [(s, r) for s, r in outs if not _dropped(s)]
  for m in out_maps:
    if m.use_lookahead:
      raise UsageError(f"Output buffering does not support lookahead: the out spec of {m.name} has "
                       f"pl.Buffered(use_lookahead=True); lookahead only prefetches inputs. Fix: drop "
                       f"use_lookahead from the out spec.")
  for m in in_maps + out_maps:
    if m.index_map is not None:
      nargs = _positional_arity(m.index_map)
      if nargs is not None and nargs != len(grid):
        raise BlockSpecError(f"index_map of {m.name} takes {nargs} argument(s) but the pipeline grid "
                             f"{grid} has {len(grid)} dimension(s); emit_pipeline index maps receive "
                             f"only the grid indices. Fix: define it as lambda "
                             f"{', '.join('ijklmn'[:len(grid)])}: (...) and close over refs for "
                             f"scalar data.")
  return in_maps, out_maps, [r for _, r in ins], [r for _, r in outs], in_tds, out_tds, keep


def _dropped(spec) -> bool:
  return spec is None or spec is no_block_spec


def _positional_arity(f):
  try:
    sig = inspect.signature(f)
  except (TypeError, ValueError):
    return None
  n = 0
  for p in sig.parameters.values():
    if p.kind == p.VAR_POSITIONAL:
      return None
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
      n += 1
  return n


def emit_pipeline_with_allocations(body, *, grid, in_specs=(), out_specs=()):
  """(pipeline, make_allocations): allocate the pipeline's buffers once with
  `pl.run_scoped(run, make_allocations(*refs))` and pass them as `pipeline(*refs, allocations=a)`."""
  pipeline = emit_pipeline(body, grid=grid, in_specs=in_specs, out_specs=out_specs)
  in_entries, out_entries, g = pipeline._specs

  def make_allocations(*refs):
    in_maps, out_maps, in_refs, out_refs, _, _, _ = _setup(refs, in_entries, out_entries, g)
    return tuple(allocation_types(in_maps, out_maps, in_refs, out_refs, smem_blocks=True))

  return pipeline, make_allocations
