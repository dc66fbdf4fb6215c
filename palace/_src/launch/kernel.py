"""`pl.kernel` (L5): one body per core of a mesh; refs live in HBM; no automatic pipelining."""
from __future__ import annotations

import functools

import numpy as np

from palace._src import validate
from palace._src.core import MemoryRef, MemorySpace, SemaphoreRefType, TensorCoreMesh
from palace._src.errors import UsageError
from palace._src.launch import host as launch
from palace._src.launch.plan import ENTRIES, OPERAND, OUTPUT, TREE, LaunchPlan, Operand, Output, Stage
from palace._src.launch.run import run
from palace._src.launch.sc_mesh import ScalarSubcoreMesh, VectorSubcoreMesh
from palace._src.lang.refs import Ref
from palace._src.util import tree_flatten, tree_unflatten, user_site

_NOT_GIVEN = object()


def kernel(body=_NOT_GIVEN, out_type=(), *, mesh, scratch_types=(), compiler_params=None,
           interpret=False, cost_estimate=None, debug=False, name=None, metadata=None):
  """Run `body(*input_refs, *output_refs, *scratch_refs)` once per core of `mesh`.

  Inputs and `ShapeDtypeStruct` outputs arrive as HBM (`pl.ANY`) refs; move data with
  `pltpu.sync_copy` / `async_copy` / `emit_pipeline`. Mutable refs (`pl.new_ref`) passed as inputs
  are updated in place and produce no output.

  Example:
    >>> @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), jnp.float32),
    ...                    mesh=pltpu.TensorCoreMesh("core", num_cores=1))
    ... def double(x_hbm, o_hbm):
    ...   pl.run_scoped(lambda buf: (pltpu.sync_copy(x_hbm, buf), ...), pltpu.VMEM((8, 128), jnp.float32))
  """
  if body is _NOT_GIVEN:
    return functools.partial(kernel, out_type=out_type, mesh=mesh, scratch_types=scratch_types,
                             compiler_params=compiler_params, interpret=interpret,
                             cost_estimate=cost_estimate, debug=debug, name=name, metadata=metadata)
  for i, b in enumerate(body if isinstance(body, (list, tuple)) else [body]):
    validate.as_callable(b, "pl.kernel(body)" if not isinstance(body, (list, tuple)) else
                         f"pl.kernel(body[{i}])", hint="pass the kernel body, a function taking one "
                         "ref per input, output and scratch (e.g. def body(x_hbm, o_hbm): ...).")
  if isinstance(body, (list, tuple)):
    return _mpmd_kernel(body, out_type, mesh, scratch_types, compiler_params, name)
  params = launch.check_params(compiler_params, "pl.kernel")
  kname = name or getattr(body, "__name__", "kernel")

  def plan(*args):
    return _plan([body], kname, out_type, [mesh], scratch_types, params, args)

  @functools.wraps(body)
  def call(*args):
    launch.check_interpret(interpret, kname)
    with launch.interpret_context(interpret):
      launch_plan, operands = plan(*args)
      return launch.like_inputs(tree_unflatten(launch_plan.output_tree, run(launch_plan, operands)), args)

  call.plan = plan   # (LaunchPlan, operands) of one call without running it, as pl.pallas_call's
  return call


def _mpmd_kernel(bodies, out_type, meshes, scratch_types, compiler_params, name):
  if not isinstance(meshes, (list, tuple)) or len(meshes) != len(bodies):
    raise UsageError(f"MPMD pl.kernel needs one mesh per body; got {len(bodies)} bodies and mesh="
                     f"{meshes!r}. Fix: pass mesh=[mesh_0, mesh_1, ...], one per body.")
  params = launch.check_params(compiler_params, "pl.kernel")
  kname = name or "_".join(getattr(b, "__name__", "kernel") for b in bodies)

  def call(*args):
    plan, operands = _plan(list(bodies), kname, out_type, list(meshes), scratch_types, params, args)
    return launch.like_inputs(tree_unflatten(plan.output_tree, run(plan, operands)), args)

  return call


def _closure_check(body, passed_bufs, kname):
  cells = getattr(body, "__closure__", None) or ()
  for cell in cells:
    try:
      v = cell.cell_contents
    except ValueError:
      continue
    if isinstance(v, Ref) and v.buf in passed_bufs:
      raise UsageError(f"Kernel '{kname}' closes over {v.buf.name} and also receives it as an input: "
                       f"a closed-over ref may not alias a passed-in ref. Fix: pass it once (as an "
                       f"input or by closure).")
    if isinstance(v, np.ndarray) and v.size > 1:
      raise UsageError(
          f"Kernel '{kname}' captures a non-scalar array constant of shape {v.shape} "
          f"({body.__code__.co_filename.rsplit('/', 1)[-1]}:{body.__code__.co_firstlineno}). You can "
          f"only close over scalars and refs. Fix: pass the array as an input instead.")


def _plan(bodies, kname, out_type, meshes, scratch_types, params, args):
  """(LaunchPlan, operands) of one call: arrays converted, mutable refs checked, outputs typed."""
  for m in meshes:
    if not isinstance(m, (TensorCoreMesh, VectorSubcoreMesh, ScalarSubcoreMesh)):
      raise UsageError(f"pl.kernel mesh must be a pltpu.TensorCoreMesh, plsc.VectorSubcoreMesh or "
                       f"plsc.ScalarSubcoreMesh; got {m!r}. Fix: pass e.g. "
                       f"mesh=pltpu.TensorCoreMesh('core', num_cores=1).")
  in_leaves, in_td = tree_flatten(tuple(args),
                                  is_leaf=lambda x: isinstance(x, (Ref, launch.SpaceConstrained)))
  values, passed, in_spaces = [], set(), {}
  for i, a in enumerate(in_leaves):
    if isinstance(a, launch.SpaceConstrained):   # (pltpu.with_memory_space_constraint: staged below)
      in_spaces[i], a = a.memory_space, a.value
    if isinstance(a, Ref):
      if a.buf.storage is None:
        raise UsageError(f"args[{i}] of kernel '{kname}' is a frozen or freed ref. Fix: pass a live "
                         f"ref (pl.new_ref(...)) or the frozen array itself.")
      if a.buf in passed:
        raise UsageError(f"args[{i}] of kernel '{kname}': the same ref is passed twice; each mutable "
                         f"ref may be passed once (it is updated in place). Fix: pass it once and "
                         f"use it for both roles in the body.")
      if a.buf.memory_space not in (MemorySpace.ANY, MemorySpace.HBM):
        raise UsageError(f"args[{i}] is a {a.buf.memory_space} ref; only HBM refs exist on the host. "
                         f"Fix: pass arrays or pl.new_ref(...) refs (HBM).")
      passed.add(a.buf)
      values.append(a)
    else:
      values.append(launch.to_host_array(a, f"args[{i}]"))
  for b in bodies:
    _closure_check(b, passed, kname)
  out_leaves, out_td = tree_flatten(out_type, is_leaf=lambda x: hasattr(x, "shape"))
  outs = [launch.out_struct(o, f"out_type[{i}]") for i, o in enumerate(out_leaves)]
  launch.check_hbm(kname, {(v.buf.name if isinstance(v, Ref) else f"args[{i}]"): (v.buf if isinstance(v, Ref) else v)
                           for i, v in enumerate(values)},
                   {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch_types)
  scratch_is_dict = isinstance(scratch_types, dict)
  n_outs = len(out_type) if isinstance(out_type, (list, tuple)) else 1
  n_scr = 0 if scratch_is_dict else len(_as_tuple(scratch_types))
  kw = tuple(scratch_types) if scratch_is_dict else ()
  for b in bodies:
    validate.check_call(b, len(args) + n_outs + n_scr, kw, lambda e: (
        f"Kernel '{kname}' cannot take the refs pl.kernel passes: {len(args)} input + {n_outs} output + "
        f"{n_scr} scratch positional refs" + (f" and scratch keywords {list(kw)}" if kw else "") +
        f" ({e}). Fix: define it as body(*input_refs, *output_refs, *scratch_refs), one parameter each."))
  outputs = tuple(Output(f"outputs[{i}]", s, d, sp) for i, (s, d, sp) in enumerate(outs))
  # outputs typed pltpu.VMEM/SMEM: the body writes a scoped copy, copied to HBM after it
  staged = [(i, MemoryRef(s, d, sp)) for i, (s, d, sp) in enumerate(outs)
            if sp in (MemorySpace.VMEM, MemorySpace.SMEM)]
  staged = tuple(Stage(OUTPUT, i, t, f"outputs[{j}]") for j, (i, t) in enumerate(staged))
  # inputs constrained to VMEM/SMEM: the body gets a scoped copy, made before it runs
  staged += tuple(Stage(OPERAND, i, MemoryRef(values[i].shape, values[i].dtype, sp), f"args[{i}]")
                  for i, sp in in_spaces.items())
  operands = tuple(Operand(v.buf.name if isinstance(v, Ref) else f"args[{i}]", v.shape, v.dtype)
                   for i, v in enumerate(values))
  # as in JAX: inputs keep their pytree structure; a sequence out_type is splatted, any other
  # out_type (one struct, a dict, ...) is passed as one argument
  plan = LaunchPlan(kname, user_site(), params, operands, in_td, outputs, out_td,
                    outputs_as=ENTRIES if isinstance(out_type, (list, tuple)) else TREE, staged=staged,
                    scratch=scratch_types if isinstance(scratch_types, dict) else _as_tuple(scratch_types),
                    bodies=tuple(bodies), meshes=tuple(meshes))
  return plan, values


def _as_tuple(x):
  if isinstance(x, (list, tuple)):
    return tuple(x)
  if isinstance(x, (MemoryRef, SemaphoreRefType)):
    return (x,)
  return tuple(x)
