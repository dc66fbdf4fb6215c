"""The lowering of one palace-run `pallas_call`: a single host callback for the whole launch.

Before emitting it, the kernel's jaxpr (and its index maps) are checked for primitives the interpreter
does not cover, so an UnsupportedError is raised while lowering, in the caller's thread, naming the
primitive and the kernel line. Errors raised later inside the callback (out-of-bounds, races, ...) reach
the caller wrapped by XLA in a JaxRuntimeError; the Engine keeps the original and `virtual_tpu`'s exit
re-raises it, so `pytest.raises(pl.OutOfBoundsError)` around the `with` block works.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from palace._src.errors import ResourceError, UnsupportedError, UsageError
from palace._src.jax import compiler_errors, launch
from palace._src.jax.avals import host_dtype, physical, semaphore_kind
from palace._src.jax.interpret import check_covered, source_line
from palace._src.jax.pinned import unpinned
from palace._src.jax.registry import RULES, sub_jaxprs
from palace._src.launch import host as palace_host, spmd


# palace launches whose host callback is running now, on XLA's threads (process-wide host bookkeeping,
# like the lowering's registration): the interpreter's exit waits for them (`drain_at_exit`)
_running = threading.Condition()
_running_count = [0, 0]   # [running now, started so far]


class running:
  """`with running():` around every palace host callback (callback.py; counted, so that the exit can
  wait for it). (A class, not a generator context manager: entered once per launch.)"""
  __slots__ = ()

  def __enter__(self):
    with _running:
      _running_count[0] += 1
      _running_count[1] += 1

  def __exit__(self, *exc):
    with _running:
      _running_count[0] -= 1
      _running.notify_all()


def drain_at_exit(timeout_s: float = 120.0, quiet_s: float = 0.1) -> None:
  """At interpreter exit: wait for the computations dispatched so far and for palace launches still
  running on XLA's threads. JAX dispatches asynchronously, so a program may end (or a notebook cell
  raise) while a launch's callback runs palace code; XLA then tears its thread pools down under it and
  the process crashes (SIGSEGV or abort) in JAX's teardown: JAX's distributed tutorial, whose last cell
  raises after dispatching pod launches, did so on every run. A computation whose results were dropped
  is not visible to JAX's live arrays, so the wait also lasts until no palace launch has started for
  `quiet_s` (the next queued one starts within microseconds of the last one's end). JAX alone has the
  same race with any host callback still queued at exit (a plain jax.pure_callback in a dropped
  shard_map result crashes the same way); this narrows palace's share of it to nothing measurable.
  Errors are not raised here: whoever reads the results sees them. A launch still running after
  `timeout_s` (a pod launch whose peers never come) is left to the teardown rather than hang the exit."""
  if not _running_count[1]:   # no palace launch ran in this process
    return
  try:
    wait_for_dispatched()
  except Exception:  # noqa: BLE001  (a failed launch's error belongs to whoever reads its result)
    pass
  with _running:
    while True:
      started = _running_count[1]
      if not _running.wait_for(lambda: _running_count[0] == 0, timeout=timeout_s):
        return
      _running.wait_for(lambda: _running_count[1] != started, timeout=quiet_s)
      if _running_count[1] == started and _running_count[0] == 0:
        return


def wait_for_dispatched() -> None:
  """Block until every computation dispatched so far has finished. JAX dispatches asynchronously, so
  a jitted call whose result was not read yet may still be running its launches: leaving
  `virtual_tpu` waits for them (their reports and errors belong to it), and so does device_time
  around its timing-only scope (no launch of another call may run inside it)."""
  import jax  # noqa: PLC0415
  jax.block_until_ready(jax.live_arrays())



def _remote_ids(jaxpr, outer=()):
  """(equation, its device_id operand tree, its device_id_type, enclosing equations) of every remote
  copy (its start and waits) and remote signal in `jaxpr` and its sub-jaxprs (registry entries whose
  operands have a device_id)."""
  for eqn in jaxpr.eqns:
    entry = RULES.get(eqn.primitive.name)
    operands = None if entry is None else entry.operands
    dev = operands.decode(eqn).get("device_id") if operands is not None and "device_id" in operands.names \
        else None
    if dev is not None:
      yield eqn, dev, str(getattr(eqn.params.get("device_id_type"), "value", "mesh")).lower(), outer
    for sub in sub_jaxprs(eqn):
      yield from _remote_ids(sub, (*outer, eqn))


def _communication(jaxpr, manual):
  """An equation of `jaxpr` (or a sub-jaxpr) that talks to other devices, or None: a remote copy or
  signal, a barrier semaphore, or an axis_index over a manual (shard_map) axis."""
  remote = next(_remote_ids(jaxpr), None)
  return remote[0] if remote is not None else _named(jaxpr, manual)


def _named(jaxpr, manual):
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "axis_index":
      axes = eqn.params["axis_name"]
      if set(axes if isinstance(axes, (tuple, list)) else (axes,)) & manual:
        return eqn
    elif name == "get_barrier_semaphore":
      return eqn
    for sub in sub_jaxprs(eqn):
      hit = _named(sub, manual)
      if hit is not None:
        return hit
  return None


def check_device_ids(jaxprs, mesh_axes) -> None:
  """The device ids of remote copies and signals checked as JAX's TPU lowering checks them
  (jax/_src/pallas/primitives.py: device_id_to_logical), against the shard_map's mesh axes (none
  outside a shard_map): a MESH id that is not a dict has one coordinate per mesh axis, and a joint
  dict key such as ('x', 'y') names mesh axes only. (LOGICAL ids are scalars: JAX asserts that when
  the kernel is traced.)"""
  from jax._src import tree_util  # noqa: PLC0415
  axes = tuple(map(str, mesh_axes))
  for jaxpr in jaxprs:
    for eqn, dev, kind, outer in _remote_ids(jaxpr):
      where = f"{eqn.primitive.name} at kernel line {source_line(eqn, outer)}"
      if kind != "mesh":
        continue
      if isinstance(dev, dict):
        for key in dev:
          if not isinstance(key, tuple) or len(key) < 2 or all(str(a) in axes for a in key):
            continue
          mixed = any(str(a) in axes for a in key)
          raise (UnsupportedError if mixed else UsageError)(
              f"palace.jax: the device_id of {where} joins the axes {key}, "
              + (f"which mix shard_map mesh axes {axes} with kernel mesh axes" if mixed else
                 f"which are not shard_map mesh axes {axes}")
              + " (JAX's TPU lowering refuses this too). Fix: join shard_map mesh axes only, and "
                "give a kernel mesh axis its own dict entry.")
        continue
      n = len(tree_util.tree_leaves(dev))
      example = axes[0] if axes else "x"
      if n != len(axes):
        mesh = f"the {len(axes)}-D mesh {axes}" if axes else "no mesh (not inside a jax.shard_map)"
        raise UsageError(f"palace.jax: the device_id of {where} has {n} coordinate(s) for {mesh}; "
                         f"a DeviceIdType.MESH device id has one coordinate per mesh axis (JAX's TPU "
                         f"lowering refuses it too: 'Number of device ids must match the number of "
                         f"mesh axes'). Fix: pass one coordinate per mesh axis, or a dict of the "
                         f"axes that change (e.g. {{{example!r}: i}}).")


def _check_covered(params, kind) -> None:
  """Launch features and primitives the adapter and the interpreter cover, checked while lowering."""
  sparsecore = False
  if kind == "pallas_call":
    launch.check_launch(params)
    for bm in params["grid_mapping"].block_mappings:
      check_covered(bm.index_map_jaxpr)
  else:
    launch.check_mpmd(params)
    sparsecore = launch.on_sparsecore(params)
  for j in _kernel_jaxprs(params, kind):
    check_covered(j, sparsecore=sparsecore)


def _emit_callback(ctx, host, in_nodes, direct_out: bool = False):
  """One XLA host callback running `host(*numpy_operands) -> [numpy outputs]`: XLA's buffer callback
  (`xla_buffer_python_cpu_callback`, what `jax.experimental.buffer_callback` emits, with the op
  sharding `jax.pure_callback` gives its own), which hands the callback XLA's operand and result
  buffers themselves. The operands reach palace as read-only NumPy views of XLA's buffers (no copy;
  operands under 64 KiB are copied, `_view_of`); the outputs are copied into XLA's result buffers,
  except with `direct_out`: then `host(*operands, out=[...])` gets a writable view of each result
  buffer of 64 KiB or more (None for the others) to compute that output in, and an output returned
  in it is not copied (no copy, and none of the page faults of a fresh output array).
  `jax.pure_callback`'s custom call instead copies every operand into a fresh array, and its
  host-side wrapper `device_put`s each into a jax.Array first (about 150 us per launch of two
  512 KiB operands). Operands or results of a sub-byte dtype
  (int4, fp4: packed in XLA's buffers) take XLA's ordinary Python callback, which unpacks them.

  The views are made from the buffers' addresses (`_view_of`), never kept as `np.asarray(buffer)`:
  an array whose base is XLA's `Buffer` object must not outlive the callback. Kept past it (as a
  failed launch keeps its operands, in the traceback and the machine of the error the Engine keeps
  for `virtual_tpu`'s exit), later callbacks received corrupt `Buffer` objects ("Buffer.__array__ is
  only supported on CPU", once a segfault): measured 2026-12-05 with jax 0.12.0.1, keeping
  `np.asarray(buffer)` arrays past the callback corrupts a later launch even with no error, while
  keeping the `Buffer` objects themselves, or views made from their addresses, does not (docs/jax.md,
  "The buffer callback"; tests/jax_backend/test_activation.py)."""
  from jax._src import callback as jax_callback  # noqa: PLC0415
  from jax._src import dtypes as jax_dtypes  # noqa: PLC0415
  from jax._src import ffi  # noqa: PLC0415
  from jax._src.interpreters import mlir  # noqa: PLC0415

  avals = [physical(a) for a in (*ctx.avals_in, *ctx.avals_out)]   # (keys: their key data)
  if any(semaphore_kind(a.dtype) is None and jax_dtypes.itemsize_bits(a.dtype) < 8 for a in avals):
    return _emit_python_callback(ctx, host, in_nodes)
  n_in = len(in_nodes)
  in_avals = [(tuple(a.shape), host_dtype(a.dtype)) for a in avals[:n_in]]
  out_avals = [(tuple(a.shape), host_dtype(a.dtype)) for a in avals[n_in:]]

  def call(exec_ctx, *buffers):
    # (all of it inside `running`, the one count of palace launches on XLA's threads: the
    # interpreter's exit waits for the copies into XLA's buffers too)
    with running():
      args = [_view_of(b, shape, dtype) for b, (shape, dtype) in zip(buffers, in_avals)]
      if not direct_out:
        outs = host(*args)
        views = (None,) * len(outs)
      else:
        views = [_view_of(b, shape, dtype, writable=True)
                 for b, (shape, dtype) in zip(buffers[n_in:], out_avals)]
        outs = host(*args, out=views)
      for b, o, v in zip(buffers[n_in:], outs, views):
        if v is not None and o.__array_interface__["data"][0] == v.__array_interface__["data"][0]:
          continue   # computed in XLA's result buffer
        if o.size:
          np.copyto(np.asarray(b), o, casting="no")
  ctx.module_context.add_host_callback(call)
  index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
  result = ffi.build_ffi_lowering_function("xla_buffer_python_cpu_callback", has_side_effect=False)(
      ctx, *in_nodes, index=index)
  sharding = jax_callback._callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
  if sharding is not None:
    mlir.set_sharding(ctx.module_context, result, sharding)
  return result.results


class _Window:
  """A NumPy array interface over one XLA buffer's memory (`_view_of`)."""
  __slots__ = ("__array_interface__",)

  def __init__(self, interface: dict):
    self.__array_interface__ = interface


_COPY_BELOW_BYTES = 64 * 1024   # smaller operands are copied: cheaper than building a view (~3 us)


def _view_of(buffer, shape: tuple, dtype: np.dtype, writable: bool = False):
  """A read-only view of an XLA operand buffer, of the operand's shape and dtype, whose base is not
  XLA's `Buffer` object (`_emit_callback`); an operand under _COPY_BELOW_BYTES is copied instead
  (a 4 KiB copy costs well under a microsecond; the view's interface ~3 us), and an empty one gets an
  array of its own. `writable`: a writable view of a result buffer instead, or None under
  _COPY_BELOW_BYTES or when empty (the result is then copied in)."""
  if not all(shape):
    return None if writable else np.empty(shape, dtype)
  a = np.asarray(buffer)
  if a.nbytes < _COPY_BELOW_BYTES:
    if writable:
      return None
    v = a.copy()
    v.flags.writeable = False
    return v
  address = a.__array_interface__["data"][0]
  del a   # (the Buffer-based array goes before the callback returns)
  window = _Window({"data": (address, not writable), "shape": shape, "typestr": f"|V{dtype.itemsize}",
                    "version": 3})
  return np.asarray(window).view(dtype)


def _emit_python_callback(ctx, host, in_nodes):
  """`host` as XLA's ordinary Python callback (`jax.pure_callback`'s custom call and op sharding,
  without its host-side wrapper, which `device_put`s every operand into a jax.Array first and sets a
  default device and an empty mesh for callbacks that call JAX, which palace's never do). XLA hands
  the callback operands as read-only NumPy arrays that own their data (copies made by its handler)."""
  from jax._src import callback as jax_callback  # noqa: PLC0415

  def flat(*args):
    with running():   # (counted for the interpreter's exit, as `_emit_callback`'s callback is)
      return tuple(host(*args))
  sharding = jax_callback._callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
  results, _, _ = jax_callback.emit_python_callback(
      ctx, flat, None, list(in_nodes), ctx.avals_in, ctx.avals_out, has_side_effect=False,
      returns_token=False, sharding=sharding)
  return results


def _check_fully_manual(params, kind, axis_ctx, manual) -> None:
  """A kernel inside a jax.shard_map over only some mesh axes (`axis_names=` a subset: the others
  automatic) is refused, as JAX 0.12's TPU lowering refuses it for every Mosaic kernel
  (jax/_src/tpu_custom_call.py: "Mosaic kernels cannot be automatically partitioned"; its interpret
  mode cannot run there either: XLA host callbacks need every axis manual). Running it would model
  a program no TPU runs: each device would get its manual shard replicated over the automatic axes."""
  mesh = axis_ctx.mesh
  axes = [str(a) for a in mesh.axis_names]
  if manual | frozenset(getattr(mesh, "manual_axes", ()) or ()) == frozenset(mesh.axis_names):
    return
  auto = [a for a in axes if a not in set(map(str, manual))]
  name = launch.kernel_name(params)
  raise UnsupportedError(
      f"palace.jax: {'pallas_call' if kind == 'pallas_call' else 'pl.kernel'} '{name}' inside a "
      f"jax.shard_map over only some mesh axes (manual {sorted(map(str, manual))}, automatic {auto} "
      f"of the mesh {axes}) is not supported: JAX's TPU lowering refuses every Mosaic kernel there "
      f"too ('Mosaic kernels cannot be automatically partitioned'), and its interpret mode cannot "
      f"run host callbacks there. Fix: wrap the call in a jax.shard_map over the remaining axes "
      f"(axis_names={set(auto)!r}, in_specs=P() for operands replicated over them), or shard_map "
      f"over every mesh axis.")


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

  mesh = axis_ctx.mesh
  _check_covered(params, kind)
  check_device_ids(_kernel_jaxprs(params, kind), mesh.axis_names)
  # palace's make_mesh checks the chip count and lays a mesh of every chip out as a ring (as JAX's
  # make_mesh does on a TPU); a mesh over some of the devices (jax.devices()[:2] of 4) sits on those
  # (an abstract mesh, of a nested shard_map, names no devices)
  size = int(np.prod(tuple(mesh.shape.values())))
  ids = [int(d.id) for d in np.asarray(mesh.devices).reshape(-1)] \
      if size < engine.tpu.num_chips and type(mesh).__name__ != "AbstractMesh" else None
  with palace_host.on_tpu(engine.tpu):
    pmesh = spmd.make_mesh(tuple(mesh.shape.values()), tuple(map(str, mesh.axis_names)), devices=ids)
  groups = spmd.CallGroups(pmesh, engine.tpu)   # one rendezvous per call of this launch site
  out_avals = [physical(a) for a in params["out_avals"]]
  run = functools.partial(launch.run_pallas_call if kind == "pallas_call" else launch.run_mpmd_map,
                          cache={})   # one palace launch and plan per lowering, reused by every call

  def host(chip, *arrays):
    call, group = groups.enter(int(chip))
    spmd_token = palace_host.set_spmd_context((group, int(chip)))
    error = None
    try:
      outs = run(params, [np.asarray(a) for a in arrays], engine.tpu)
    except spmd._PeerFailed:
      raise spmd.peer_error(group, int(chip)) from None
    except BaseException as e:  # noqa: BLE001  kept for virtual_tpu's exit, then XLA wraps it
      engine.errors.append(e)
      error = e
      raise
    finally:
      groups.leave(call, error)
      palace_host.reset_spmd_context(spmd_token)
    return [np.asarray(o, dtype=host_dtype(a.dtype)).reshape(a.shape) for o, a in zip(outs, out_avals)]

  pid = hlo.convert(ir.RankedTensorType.get([], ir.IntegerType.get_signless(32)), hlo.partition_id())
  chip_aval = jax_core.ShapedArray((), np.dtype("int32"))
  return _emit_callback(ctx.replace(avals_in=(chip_aval, *ctx.avals_in)), host, (pid, *in_nodes))


def lower_on_palace(ctx, in_nodes, engine, params, kind: str = "pallas_call"):
  """Lower one launch (`pallas_call` or `mpmd_map`, i.e. pl.kernel / core_map) to one host callback. A
  pinned operand or result (JAX's `pin`, aliased in and out) is its array (pinned.py)."""
  from jax._src import core as jax_core  # noqa: PLC0415

  ctx = ctx.replace(avals_in=[unpinned(a) for a in ctx.avals_in],
                    avals_out=[unpinned(a) for a in ctx.avals_out])
  params = dict(params, out_avals=tuple(unpinned(a) for a in params["out_avals"]))

  axis_ctx = ctx.module_context.axis_context
  manual = frozenset(getattr(axis_ctx, "manual_axes", ()) or ())
  if manual:
    _check_fully_manual(params, kind, axis_ctx, manual)
  try:
    launch.check_scratch_when_lowered(params, engine.tpu.chip)
  except UsageError as e:
    raise compiler_errors.as_jax_usage_error(e) from None
  if manual and any(_communication(j, manual) is not None for j in _kernel_jaxprs(params, kind)):
    return _lower_pod_launch(ctx, in_nodes, engine, params, axis_ctx, manual, kind)
  if any(not isinstance(a, jax_core.ShapedArray) for a in ctx.avals_in):
    raise UnsupportedError(f"palace.jax: a {kind} operand that is not an array (a closed-over ref "
                           f"or a hi-type) is not supported yet. Fix: pass the value as an array operand.")
  _check_covered(params, kind)
  check_device_ids(_kernel_jaxprs(params, kind), ())
  if kind == "pallas_call":
    try:
      launch.check_vmem_when_lowered(params, engine.tpu.chip)
    except ResourceError as e:
      raise compiler_errors.as_jax_resource_error(e) from None
  # one palace launch and plan per lowering (and grid), reused by every call
  run = functools.partial(launch.run_pallas_call if kind == "pallas_call" else launch.run_mpmd_map,
                          cache={})
  out_avals = [physical(a) for a in params["out_avals"]]

  def host(*arrays, **out):
    try:
      with engine.lock:  # per-device callbacks of a shard_map may come from several XLA threads
        # (the engine's VirtualTPU, handed to the launch: this XLA thread has none active)
        outs = run(params, [np.asarray(a) for a in arrays], engine.tpu, **out)
    except BaseException as e:  # noqa: BLE001  kept for virtual_tpu's exit, then XLA wraps it
      engine.errors.append(e)
      raise
    return [np.asarray(o, dtype=host_dtype(a.dtype)).reshape(a.shape) for o, a in zip(outs, out_avals)]

  # (a pallas_call computes its outputs in XLA's result buffers; a pl.kernel's may be mutable refs)
  return _emit_callback(ctx, host, in_nodes, direct_out=kind == "pallas_call")
