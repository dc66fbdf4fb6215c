"""The lowering of one palace-run `pallas_call`: a single host callback for the whole launch.

Before emitting it, the kernel's jaxpr (and its index maps) are checked for primitives the interpreter
does not cover, so an UnsupportedError is raised while lowering, in the caller's thread, naming the
primitive and the kernel line. Errors raised later inside the callback (out-of-bounds, races, ...) reach
the caller wrapped by XLA in a JaxRuntimeError; the Engine keeps the original and `virtual_tpu`'s exit
re-raises it, so `pytest.raises(pl.OutOfBoundsError)` around the `with` block works.
"""
from __future__ import annotations

import functools

import numpy as np

from palace._src.errors import UnsupportedError


def _communication(jaxpr, manual):
  """The first equation of `jaxpr` (or a sub-jaxpr) that talks to other devices, or None."""
  from palace._src.jax.interpret import sub_jaxprs  # noqa: PLC0415
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "axis_index":
      axes = eqn.params["axis_name"]
      if set(axes if isinstance(axes, (tuple, list)) else (axes,)) & manual:
        return eqn
    elif name == "get_barrier_semaphore":
      return eqn
    elif name == "dma_start" and eqn.params["tree"].unflatten(eqn.invars)[4] is not None:
      return eqn
    elif name == "semaphore_signal" and eqn.params["args_tree"].unflatten(eqn.invars)[3] is not None:
      return eqn
    for sub in sub_jaxprs(eqn):
      hit = _communication(sub, manual)
      if hit is not None:
        return hit
  return None


def _check_covered(params, kind) -> None:
  """Launch features and primitives the adapter and the interpreter cover, checked while lowering."""
  from palace._src.jax import launch  # noqa: PLC0415
  from palace._src.jax.interpret import check_covered  # noqa: PLC0415
  if kind == "pallas_call":
    launch.check_launch(params)
    for bm in params["grid_mapping"].block_mappings:
      check_covered(bm.index_map_jaxpr)
  else:
    launch.check_mpmd(params)
  for j in _kernel_jaxprs(params, kind):
    check_covered(j)


def _emit_callback(ctx, host, in_nodes):
  """One XLA host callback running `host(*numpy_operands) -> [numpy outputs]`, as `jax.pure_callback`.
  (Emitting JAX's `emit_python_callback` directly saved its per-call `device_put` of every operand,
  about 100 us per launch, but a process that ran pod launches through it crashed at exit (the
  distributed tutorial, tests/jax_backend/test_tutorials.py): not used until that is understood.)"""
  import jax  # noqa: PLC0415
  from jax._src.interpreters import mlir  # noqa: PLC0415
  result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]

  def body(*args):
    return jax.pure_callback(host, result_shapes, *args)
  return mlir.lower_fun(body, multiple_results=True)(ctx, *in_nodes)


def _kernel_jaxprs(params, kind):
  return (params["jaxpr"],) if kind == "pallas_call" else tuple(params["jaxprs"])


def _lower_pod_launch(ctx, in_nodes, engine, params, axis_ctx, manual, kind):
  """A communicating kernel inside jax.shard_map: each device's callback gets its partition id (its
  chip: row-major over the mesh, as JAX's axis_index computes it) and the N callbacks, which XLA
  runs concurrently, meet in one palace pod launch through palace's own shard_map rendezvous
  (launch/spmd.py), so remote DMAs, barriers and device ids work and are timed as in pl.shard_map."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.mlir.dialects import hlo  # noqa: PLC0415
  from palace._src.jax import launch  # noqa: PLC0415
  from palace._src.launch import host as palace_host, spmd  # noqa: PLC0415
  from palace._src.sim.machine import activate  # noqa: PLC0415

  mesh = axis_ctx.mesh
  if set(map(str, mesh.axis_names)) != set(map(str, manual)):
    raise UnsupportedError(f"palace.jax: a communicating kernel in a shard_map over only some mesh "
                           f"axes ({sorted(map(str, manual))} of {list(mesh.axis_names)}) is not "
                           f"supported yet. Fix: shard_map over every mesh axis, or run it with JAX's "
                           f"interpret mode.")
  _check_covered(params, kind)
  from palace._src.sim import machine as _machine  # noqa: PLC0415
  token = activate(engine.tpu)   # palace's make_mesh checks the chip count and picks the ring order
  try:
    pmesh = spmd.make_mesh(tuple(mesh.shape.values()), tuple(map(str, mesh.axis_names)))
  finally:
    _machine._active.reset(token)
  group = spmd._Group(pmesh, engine.tpu)   # one rendezvous per launch site, one generation per call
  out_avals = params["out_avals"]
  run = functools.partial(launch.run_pallas_call if kind == "pallas_call" else launch.run_mpmd_map,
                          cache={})   # one palace launch and plan per lowering, reused by every call

  def host(chip, *arrays):
    token = activate(engine.tpu)
    spmd_token = palace_host.set_spmd_context((group, int(chip)))
    try:
      outs = run(params, [np.asarray(a) for a in arrays])
    except spmd._PeerFailed:
      raise
    except BaseException as e:  # noqa: BLE001  kept for virtual_tpu's exit, then XLA wraps it
      engine.errors.append(e)
      raise
    finally:
      palace_host._spmd.reset(spmd_token)
      _machine._active.reset(token)
    return [np.asarray(o, dtype=a.dtype).reshape(a.shape) for o, a in zip(outs, out_avals)]

  pid = hlo.convert(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), hlo.partition_id())
  chip_aval = jax_core.ShapedArray((), np.dtype("int32"))
  return _emit_callback(ctx.replace(avals_in=(chip_aval, *ctx.avals_in)), host, (pid, *in_nodes))


def lower_on_palace(ctx, in_nodes, engine, params, kind: str = "pallas_call"):
  """Lower one launch (`pallas_call` or `mpmd_map`, i.e. pl.kernel / core_map) to one host callback."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from palace._src.jax import launch  # noqa: PLC0415

  axis_ctx = ctx.module_context.axis_context
  manual = frozenset(getattr(axis_ctx, "manual_axes", ()) or ())
  if manual and any(_communication(j, manual) is not None for j in _kernel_jaxprs(params, kind)):
    return _lower_pod_launch(ctx, in_nodes, engine, params, axis_ctx, manual, kind)
  if any(not isinstance(a, jax_core.ShapedArray) for a in ctx.avals_in):
    raise UnsupportedError(f"palace.jax: a {kind} operand that is not an array (a closed-over ref "
                           f"or a hi-type) is not supported yet. Fix: pass the value as an array operand.")
  _check_covered(params, kind)
  # one palace launch and plan per lowering (and grid), reused by every call
  run = functools.partial(launch.run_pallas_call if kind == "pallas_call" else launch.run_mpmd_map,
                          cache={})
  out_avals = params["out_avals"]

  def host(*arrays):
    try:
      with engine.lock:  # per-device callbacks of a shard_map may come from several XLA threads
        outs = engine.run(run, params, [np.asarray(a) for a in arrays])
    except BaseException as e:  # noqa: BLE001  kept for virtual_tpu's exit, then XLA wraps it
      engine.errors.append(e)
      raise
    return [np.asarray(o, dtype=a.dtype).reshape(a.shape) for o, a in zip(outs, out_avals)]

  return _emit_callback(ctx, host, in_nodes)
