"""Registry entries of JAX's `emit_pipeline` as a primitive (`emit_pipeline`, `pipeline_body`).

With `jax_use_emit_pipeline_primitive` on (JAX 0.12's flag; its fusible-matmul and pipeline tests
turn it on), `pltpu.emit_pipeline(...)` binds one `emit_pipeline` equation instead of tracing the
pipeline into the kernel: the body stays a jaxpr and the pipeline is made when the kernel is
lowered. Mosaic's lowering traces JAX's own pipeline library over the equation
(`emit_pipeline_to_jaxpr`: block copies, semaphores and loops, each step calling the body through a
`pipeline_body` equation) and lowers that jaxpr; these entries do the same, once per compiled
kernel, and palace's interpreter runs the traced jaxpr. So the pipeline is JAX's library code on top
of the DMA and semaphore primitives, and its copies go through palace's machine (timed, checked),
exactly as when JAX traces the pipeline into the kernel (the flag off).

A `pipeline_body` equation runs the body jaxpr on one step's block refs (its operands: the step's
grid indices, the body's consts, the refs, some of them views: JAX's TransformedRefs). Inside it
`pl.program_id(k)` is the step's index on pipeline axis k and `pl.num_programs(k)` the pipeline
grid's size, as Mosaic's lowering binds them; axes past the pipeline's are the enclosing grid's
(`lang.primitives.at_grid_point`).
"""
from __future__ import annotations

import collections

from palace._src.jax.interpret import grid_axes, program, run_program, unsupported
from palace._src.jax.registry import rule
from palace._src.jax.ref_operands import _Leaf, _ref_operand, _unflatten, _value
from palace._src.lang import primitives as prims
from palace._src.lang.array import concrete_int

# id(equation) -> (the emit_pipeline equation, its traced pipeline), the last few: a kernel's plan
# traces each pipeline once for its compilation and its schedule analysis (bounded: the traced jaxpr
# refers to the body jaxpr, so no weak-keyed cache could let an entry go)
_TRACED: collections.OrderedDict = collections.OrderedDict()
_TRACED_KEPT = 16


def _traced(eqn):
  """(jaxpr, consts) of an `emit_pipeline` equation (`_trace`), traced once per equation: the
  kernel's compilation and its schedule analysis read the same one."""
  hit = _TRACED.get(id(eqn))
  if hit is None or hit[0] is not eqn:
    hit = _TRACED[id(eqn)] = (eqn, _trace(eqn))
    while len(_TRACED) > _TRACED_KEPT:
      _TRACED.popitem(last=False)
  return hit[1]


def _trace(eqn):
  """The jaxpr Mosaic's lowering makes of an `emit_pipeline` equation (JAX's pipeline library
  traced over the equation's operands), with its consts. The kernel's core axis (when the pipeline
  names one) is bound while tracing, as the lowering binds the kernel's grid names; JAX's jaxpr
  checks are off, as in its lowering of the body (a body may name other mesh axes of the kernel)."""
  from jax._src import config  # noqa: PLC0415
  from jax._src.pallas.mosaic import pipeline as jax_pipeline  # noqa: PLC0415
  p = eqn.params
  name, cores = p.get("core_axis_name"), p.get("num_cores")
  names, sizes = ((name,), (int(cores),)) if isinstance(name, str) and cores else (None, ())
  with config.enable_checks(False):
    closed = jax_pipeline.emit_pipeline_to_jaxpr([v.aval for v in eqn.invars], grid_names=names,
                                                 grid_sizes=sizes, **p)
  return closed.jaxpr, closed.consts


def _emit_pipeline_schedule(eqn, taint):
  """The traced pipeline's schedule, its operands the equation's."""
  return taint.sub(_traced(eqn)[0], eqn.invars)


@rule("emit_pipeline", compiles=True, schedule=_emit_pipeline_schedule)
def _emit_pipeline(eqn):
  """pltpu.emit_pipeline as one equation: JAX's pipeline traced over its operands (`_traced`) and
  run, its grid (dynamic sizes from their operands) the one its bodies' num_programs read."""
  gm = eqn.params["grid_mapping"]
  args = _unflatten(eqn, eqn.params["args_tree"])
  vmapped = set(int(d) for d in getattr(gm, "vmapped_dims", ()))
  dynamic = iter(tuple(getattr(args, "dynamic_grid_spec", ()) or ()))
  grid = [g if isinstance(g, int) else next(dynamic) for g in gm.grid]
  user = [g for d, g in enumerate(grid) if d not in vmapped]
  jaxpr, consts = _traced(eqn)
  prog = program(jaxpr)

  def emit_pipeline(*flat):
    sizes = [concrete_int(_value(g, flat), "emit_pipeline grid size") for g in user]
    prims.at_grid_point((), sizes, run_program, prog, consts, flat)
    return []
  return emit_pipeline


def _pipeline_body_schedule(eqn, taint):
  """A step's grid indices and its views' indices decide what it touches; the body's schedule, its
  consts, indices and (base) refs bound to its constvars and invars."""
  from jax._src import tree_util  # noqa: PLC0415
  from jax._src.state import types  # noqa: PLC0415
  p = eqn.params
  ps, consts, refs = tree_util.tree_unflatten(p["in_tree"], list(eqn.invars))
  bases = []
  for r in refs:
    if isinstance(r, types.TransformedRef):
      taint.decide(tree_util.tree_leaves(r.transforms), eqn, "block view")
      r = r.ref
    bases.append(r)
  taint.decide(tree_util.tree_leaves(ps), eqn, "grid point")
  lead = tree_util.tree_leaves(ps) if p.get("_explicit_indices", False) else []
  j = p["jaxpr"]
  return taint.sub(j, [*tree_util.tree_leaves(consts), *lead, *bases], bound=[*j.constvars, *j.invars])


@rule("pipeline_body", compiles=True, schedule=_pipeline_body_schedule)
def _pipeline_body(eqn):
  """One pipeline step's body call: the body jaxpr on the step's refs (views resolved as a ref
  access resolves them) at the step's grid point."""
  from jax._src import tree_util  # noqa: PLC0415
  p = eqn.params
  ps, body_consts, refs = _unflatten(eqn, p["in_tree"])
  index = tuple(ps.index)
  lead = tree_util.tree_leaves(ps) if p.get("_explicit_indices", False) else []
  consts = tree_util.tree_leaves(body_consts)
  ref_ofs = [_ref_operand(eqn, r) for r in refs]
  jaxpr = p["jaxpr"]
  if len(jaxpr.constvars) != len(consts):
    raise unsupported(eqn, f"{len(consts)} body consts for {len(jaxpr.constvars)} constvars")
  prog = program(jaxpr)

  def pipeline_body(*flat):
    args = ([_value(i, flat) for i in index], None, run_program, prog, [_value(c, flat) for c in consts],
            [*(_value(x, flat) for x in lead), *(r(flat) for r in ref_ofs)])
    if grid_axes.get() is None:
      return prims.at_grid_point(*args)
    token = grid_axes.set(None)   # (a vmapped launch's axis map is for its own grid, not the pipeline's)
    try:
      return prims.at_grid_point(*args)
    finally:
      grid_axes.reset(token)
  return pipeline_body
