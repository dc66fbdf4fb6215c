"""`pl.kernel` (L5): one body per core of a mesh; refs live in HBM; no automatic pipelining."""
from __future__ import annotations

import functools

import numpy as np

from palace._src import validate
from palace._src.launch import host as launch
from palace._src.core import Buffer, MemoryRef, MemorySpace, SemaphoreRefType, TensorCoreMesh
from palace._src.sim.subcore import SC_BASE, SCALAR_BASE
from palace._src.launch.sc_mesh import ScalarSubcoreMesh, VectorSubcoreMesh, check_for_chip
from palace._src.errors import UsageError
from palace._src.lang.primitives import scoped
from palace._src.lang.refs import Ref
from palace._src.lang.tpu_primitives import sync_copy
from palace._src.util import tree_flatten, tree_unflatten

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
  if isinstance(body, (list, tuple)):
    return _mpmd_kernel(body, out_type, mesh, scratch_types, compiler_params, name)
  params = launch.check_params(compiler_params, "pl.kernel")
  kname = name or getattr(body, "__name__", "kernel")

  @functools.wraps(body)
  def call(*args):
    launch.check_interpret(interpret, kname)
    with launch.interpret_context(interpret):
      return _run(body, kname, out_type, mesh, scratch_types, params, args)

  return call


def _mpmd_kernel(bodies, out_type, meshes, scratch_types, compiler_params, name):
  if not isinstance(meshes, (list, tuple)) or len(meshes) != len(bodies):
    raise UsageError(f"MPMD pl.kernel needs one mesh per body; got {len(bodies)} bodies and mesh="
                     f"{meshes!r}. Fix: pass mesh=[mesh_0, mesh_1, ...], one per body.")
  params = launch.check_params(compiler_params, "pl.kernel")
  kname = name or "_".join(getattr(b, "__name__", "kernel") for b in bodies)

  def call(*args):
    return _run(list(bodies), kname, out_type, list(meshes), scratch_types, params, args)

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
                       f"a closed-over ref may not alias a passed-in ref. Pass it once.")
    if isinstance(v, np.ndarray) and v.size > 1:
      raise UsageError(
          f"Kernel '{kname}' captures a non-scalar array constant of shape {v.shape} "
          f"({body.__code__.co_filename.rsplit('/', 1)[-1]}:{body.__code__.co_firstlineno}). You can "
          f"only close over scalars and refs; pass the array as an input instead.")


def _run(body, kname, out_type, mesh, scratch_types, params, args):
  bodies = body if isinstance(body, list) else [body]
  meshes = mesh if isinstance(mesh, list) else [mesh]
  for m in meshes:
    if not isinstance(m, (TensorCoreMesh, VectorSubcoreMesh, ScalarSubcoreMesh)):
      raise UsageError(f"pl.kernel mesh must be a pltpu.TensorCoreMesh, plsc.VectorSubcoreMesh or "
                       f"plsc.ScalarSubcoreMesh; got {m!r}. Fix: pass e.g. "
                       f"mesh=pltpu.TensorCoreMesh('core', num_cores=1).")
  in_leaves, in_td = tree_flatten(tuple(args), is_leaf=lambda x: isinstance(x, Ref))
  in_bufs, passed = [], set()
  for i, a in enumerate(in_leaves):
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
      in_bufs.append(a)
    else:
      arr = launch.to_host_array(a, f"args[{i}]")
      in_bufs.append(Ref(launch.hbm_input(arr, f"args[{i}]")))
  for b in bodies:
    _closure_check(b, passed, kname)
  out_leaves, out_td = tree_flatten(out_type, is_leaf=lambda x: hasattr(x, "shape"))
  outs = [launch.out_struct(o, f"out_type[{i}]") for i, o in enumerate(out_leaves)]
  launch.check_hbm(kname, {r.buf.name: r.buf for r in in_bufs},
                   {f"outputs[{i}]": o for i, o in enumerate(outs)}, scratch_types)
  out_hbm = [Buffer(launch.uninitialized(s, d), s, d, MemorySpace.ANY, f"outputs[{i}]")
             for i, (s, d, sp) in enumerate(outs)]
  vmem_outs = [(i, MemoryRef(s, d, sp)) for i, (s, d, sp) in enumerate(outs)
               if sp in (MemorySpace.VMEM, MemorySpace.SMEM)]
  scratch_is_dict = isinstance(scratch_types, dict)
  n_outs = len(out_type) if isinstance(out_type, (list, tuple)) else 1
  n_scr = 0 if scratch_is_dict else len(_as_tuple(scratch_types))
  kw = tuple(scratch_types) if scratch_is_dict else ()
  for b in bodies:
    validate.check_call(b, len(args) + n_outs + n_scr, kw, lambda e: (
        f"Kernel '{kname}' cannot take the refs pl.kernel passes: {len(args)} input + {n_outs} output + "
        f"{n_scr} scratch positional refs" + (f" and scratch keywords {list(kw)}" if kw else "") +
        f" ({e}). Fix: define it as body(*input_refs, *output_refs, *scratch_refs), one parameter each."))

  def program(body):
    def with_out_mem(*mem_refs):
      out_refs = [Ref(b) for b in out_hbm]
      for (i, _), r in zip(vmem_outs, mem_refs):
        out_refs[i] = r

      def with_scratch(*scr, **kw_scr):
        # as in JAX: inputs keep their pytree structure; a sequence out_type is splatted, any other
        # out_type (one struct, a dict, ...) is passed as one argument
        ins = tree_unflatten(in_td, in_bufs)
        outs = tree_unflatten(out_td, out_refs)
        outs = tuple(outs) if isinstance(out_type, (list, tuple)) else (outs,)
        res = body(*ins, *outs, *scr, **kw_scr)
        if res is not None:
          raise UsageError(f"Kernel '{kname}' returned {type(res).__name__}; pl.kernel bodies must "
                           f"return None and write their results to output refs.")

      if scratch_is_dict:
        scoped(with_scratch, (), scratch_types, "scratch")
      else:
        scoped(with_scratch, _as_tuple(scratch_types), {}, "scratch")
      for (i, _), r in zip(vmem_outs, mem_refs):
        sync_copy(r, Ref(out_hbm[i]))

    launch.with_barrier_semaphore(
        params, lambda: scoped(with_out_mem, [t for _, t in vmem_outs], {}, "outputs"))

  def build(machine, chip_index):
    for r in in_bufs:
      r.buf.chip = chip_index
    for b in out_hbm:
      b.chip = chip_index
    machine.register_hbm(chip_index, [r.buf for r in in_bufs] + out_hbm)
    programs = []
    for b, m in zip(bodies, meshes):
      for core in _make_cores(machine, chip_index, m, params, kname):
        programs.append((core, functools.partial(program, b)))
    return programs

  launch.execute(kname, build)
  return launch.like_inputs(tree_unflatten(out_td, [b.storage for b in out_hbm]), args)


def _make_cores(machine, chip_index, mesh, params, kname):
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
  check_for_chip(mesh, chip)
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


def _as_tuple(x):
  if isinstance(x, (list, tuple)):
    return tuple(x)
  if isinstance(x, (MemoryRef, SemaphoreRefType)):
    return (x,)
  return tuple(x)
