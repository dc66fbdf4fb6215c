"""`pl.pallas_call` (L5): grid + BlockSpecs on the virtual TPU."""
from __future__ import annotations

import functools

from palace._src.blocks import canonicalize
from palace._src.core import BlockSpec, CostEstimate, GridSpec, MemorySpace, no_block_spec
from palace._src.errors import ShapeError, UsageError
from palace._src import validate
from palace._src.launch import host as launch
from palace._src.launch.plan import LaunchPlan, Operand, Output, grid_stages
from palace._src.launch.run import run
from palace._src.sim.machine import active_tpu
from palace._src.util import tree_flatten, tree_unflatten, user_site


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
          f"arguments ({e}). Fix: define it as lambda {', '.join('ijklmn'[:len(grid)]) or ''}"
          f"{', *prefetch_refs' if nsp else ''}: (...)."))
  kw = tuple(scratch) if isinstance(scratch, dict) else ()
  n_scr = 0 if kw else len(tuple(scratch))
  _check_call(kernel, nsp + n_in + n_out + n_scr, kw, lambda e: (
      f"Kernel '{kname}' cannot take the refs pallas_call passes: {nsp} scalar-prefetch + {n_in} input + "
      f"{n_out} output + {n_scr} scratch positional refs"
      + (f" and scratch keywords {list(kw)}" if kw else "")
      + f" ({e}). Fix: define it as kernel(*prefetch_refs, *in_refs, *out_refs, *scratch_refs)."))


def _returns_none(kernel, kname):
  @functools.wraps(kernel)
  def body(*args, **kwargs):
    r = kernel(*args, **kwargs)
    if r is not None:
      raise UsageError(f"Kernel '{kname}' returned a value of type {type(r).__name__}; a Pallas kernel "
                       f"must return None. Fix: write its results into the output refs (o_ref[...] = value) "
                       f"and drop the return.")
  return body


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
  validate.as_callable(kernel, "pallas_call(kernel)", hint="pass the kernel body, a function taking "
                       "one ref per input, output and scratch (e.g. def kernel(x_ref, o_ref): ...).")
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
      raise UsageError("pallas_call got both grid_spec and grid/in_specs/out_specs/scratch_shapes. Fix: "
                       "pass either grid_spec or grid/in_specs/out_specs/scratch_shapes, not both.")
  else:
    grid_spec = GridSpec(grid, in_specs, out_specs, scratch_shapes)
  g = grid_spec.grid   # checked per call (validate.as_dims in _call)
  params = launch.check_params(compiler_params, "pallas_call")
  kname = name or getattr(kernel, "__name__", "kernel")
  aliases = launch.check_aliases(input_output_aliases, kname)

  plans = []   # [(chip, operand treedefs, operand shapes and dtypes, LaunchPlan)], newest last

  def plan(*args):
    """(LaunchPlan, operand arrays) of one call on the active VirtualTPU (`plan_on`)."""
    return plan_on(active_tpu(), args)

  def plan_on(tpu, args):
    """(LaunchPlan, operand arrays) of one call on `tpu`: planned once per chip and operand signature
    (pytree structure, shapes, dtypes), which fix everything a plan holds; later calls only convert
    their operands."""
    nsp = grid_spec.num_scalar_prefetch
    if len(args) < nsp:
      return _plan(kernel, kname, out_shape, g, grid_spec, aliases, params, args, tpu.chip)   # (its error)
    pre, pre_td = tree_flatten(tuple(args[:nsp]))
    ins, in_td = tree_flatten(tuple(args[nsp:]))
    arrays = [launch.to_host_array(a, f"scalar_prefetch[{i}]") for i, a in enumerate(pre)]
    arrays += [launch.to_host_array(a, f"args[{i + nsp}]") for i, a in enumerate(ins)]
    chip = tpu.chip
    sig = tuple([(a.shape, a.dtype) for a in arrays])
    for c, tds, s, p in plans:
      if c is chip and s == sig and tds == (pre_td, in_td):
        return p, arrays
    p, arrays = _plan(kernel, kname, out_shape, g, grid_spec, aliases, params, args, chip)
    if len(plans) >= _PLANS_KEPT:
      del plans[0]
    plans.append((chip, (pre_td, in_td), sig, p))
    return p, arrays

  @functools.wraps(kernel)
  def call(*args):
    launch.check_interpret(interpret, kname)
    with launch.interpret_context(interpret):
      tpu = active_tpu()   # (resolved once per launch, handed to the plan and the run)
      launch_plan, arrays = plan_on(tpu, args)
      return launch.like_inputs(tree_unflatten(launch_plan.output_tree, run(launch_plan, arrays, None, tpu)),
                                args)

  # `call.plan(*args) -> (LaunchPlan, operand arrays)`: one call's plan without running it, for front
  # ends that run one launch many times on operands of fixed shapes (palace.jax plans once per lowering)
  call.plan = plan
  return call


_PLANS_KEPT = 8   # plans a pallas_call keeps (distinct operand signatures or chips it was called with)


def _plan(kernel, kname, out_shape, grid, grid_spec, aliases, params, args, chip):
  """(LaunchPlan, operand arrays) of one call on `chip`: operands converted and checked, BlockSpecs
  canonicalised into block mappings, arities and aliases validated."""
  nsp = grid_spec.num_scalar_prefetch
  if len(args) < nsp:
    raise UsageError(f"pallas_call '{kname}' expects {nsp} scalar-prefetch operands; got {len(args)} "
                     f"operands in all. Fix: pass the scalar-prefetch arrays first, then the inputs.")
  pre_leaves, pre_td = tree_flatten(tuple(args[:nsp]))
  in_leaves, _ = tree_flatten(tuple(args[nsp:]))
  out_leaves, out_td = tree_flatten(out_shape, is_leaf=lambda x: hasattr(x, "shape"))
  grid = validate.as_grid(grid, f"grid of pallas_call '{kname}'")
  pre_arrays = [launch.to_host_array(a, f"scalar_prefetch[{i}]") for i, a in enumerate(pre_leaves)]
  in_arrays = [launch.to_host_array(a, f"args[{i + nsp}]") for i, a in enumerate(in_leaves)]
  kernel, in_specs, out_specs, scratch = _absent_entries(
      kernel, nsp, args[nsp:], grid_spec.in_specs, out_shape, grid_spec.out_specs, grid_spec.scratch_shapes)
  in_specs = _flatten_specs(in_specs, len(in_arrays), "in_specs")
  out_specs = _flatten_specs(out_specs, len(out_leaves), "out_specs")
  in_maps = [canonicalize(s, a.shape, a.dtype, f"args[{i + nsp}]", nsp)
             for i, (s, a) in enumerate(zip(in_specs, in_arrays))]
  outs = [launch.out_struct(o, f"out_shape[{i}]") for i, o in enumerate(out_leaves)]
  launch.check_hbm(kname, {f"args[{i}]": a for i, a in enumerate(pre_arrays + in_arrays)},
                   {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch, chip)
  out_maps = []
  for i, (s, (shape, dtype, space)) in enumerate(zip(out_specs, outs)):
    if space in (MemorySpace.VMEM, MemorySpace.SMEM) and (s is no_block_spec or s.block_shape is None):
      s = BlockSpec(memory_space=space)
    out_maps.append(canonicalize(s, shape, dtype, f"outputs[{i}]", nsp))
  _check_arities(kernel, kname, grid, nsp, in_specs + out_specs, in_maps + out_maps, len(in_maps),
                 len(out_maps), scratch)
  arrays = pre_arrays + in_arrays
  operands = [Operand(f"scalar_prefetch[{i}]", a.shape, a.dtype) for i, a in enumerate(pre_arrays)]
  operands += [Operand(f"args[{i + nsp}]", a.shape, a.dtype) for i, a in enumerate(in_arrays)]
  outputs = [Output(f"outputs[{i}]", shape, dtype, space) for i, (shape, dtype, space) in enumerate(outs)]
  for a_in, a_out in aliases.items():
    if not (0 <= a_in < len(operands) and 0 <= a_out < len(outputs)):
      raise UsageError(f"input_output_aliases {{{a_in}: {a_out}}} refers to a missing operand; there "
                       f"are {len(operands)} inputs and {len(outputs)} outputs. Fix: use input indices "
                       f"0..{len(operands) - 1} (scalar-prefetch operands first) and output indices "
                       f"0..{len(outputs) - 1}.")
    src, ob = operands[a_in], outputs[a_out]
    if src.shape != ob.shape or src.dtype != ob.dtype:
      raise ShapeError(f"input_output_aliases {{{a_in}: {a_out}}}: input {src.dtype}{list(src.shape)} "
                       f"and output {ob.dtype}{list(ob.shape)} must have the same shape and dtype. Fix: "
                       f"make out_shape[{a_out}] match the input, or drop the alias.")
  plan = LaunchPlan(kname, user_site(), params, tuple(operands), pre_td, tuple(outputs), out_td,
                    aliases=dict(aliases), staged=grid_stages(pre_arrays, in_maps, out_maps),
                    scratch=scratch if isinstance(scratch, dict) else tuple(scratch),
                    bodies=(_returns_none(kernel, kname),), grid=grid, in_maps=tuple(in_maps),
                    out_maps=tuple(out_maps))
  return plan, arrays
