"""Registry entries of refs (get/swap/addupdate and Pallas' masked load/store, with their indexer,
bitcast and reshape transforms) and of the Pallas / Mosaic-TPU primitives (program ids, semaphores,
DMAs, barrier semaphores, roll, bitcast, PRNG, debug prints).

Their operands are flattened pytrees (refs with transforms, a DMA's source, destination, semaphores and
device id): each entry's `Operands` (registry.py) is the one reading of that layout, used here to
compile the operands once per equation (ref_operands.py), by the schedule functions below and by the
lowering's device-id checks (callback.py)."""
from __future__ import annotations

import numpy as np

from palace._src.errors import MemorySpaceError, UnsupportedError
from palace._src.core import MemorySpace
from palace._src.jax.avals import physical
from palace._src.jax.interpret import grid_axes, result_unused, source_line, unsupported, user_site_of
from palace._src.jax.ref_operands import _Leaf, _compiled, _operand, _ref_operand, _unflatten, _value
from palace._src.jax.registry import DATA, Deciding, Never, Operands, rule
import palace._src.lang.numpy_ops as pjnp
from palace._src.lang import context, lax_ops
from palace._src.lang import primitives as prims
from palace._src.lang import sc_primitives as sc
from palace._src.lang import tpu_primitives as tpu
from palace._src.lang.array import Array
from palace._src.lang.refs import Ref


def _dropped(eqn) -> bool:
  """Nothing reads the old value (asked while the jaxpr is compiled, see interpret.result_unused)."""
  from jax._src import core as jax_core  # noqa: PLC0415
  return isinstance(eqn.outvars[0], jax_core.DropVar) or result_unused(eqn)


# ---- operand layouts (registry.Operands) and the schedule roles of ref accesses
_GET = Operands("tree", ("transforms",), lead=("ref",))
_SWAP = Operands("tree", ("transforms",), lead=("ref", "value"))   # (swap and addupdate)
_MASKED_LOAD = Operands("args_tree", ("ref", "transforms", "mask", "other"))
_MASKED_SWAP = Operands("args_tree", ("ref", "transforms", "value", "mask"))
_SEM_SIGNAL = Operands("args_tree", ("ref", "transforms", "inc", "device_id", "core_index"))
_SEM_WAIT = Operands("args_tree", ("ref", "transforms", "value", "decrement"))
_SEM_READ = Operands("args_tree", ("ref", "transforms"))
DMA = Operands("tree", ("src", "dst", "sem", "src_sem", "device_id"))   # (dma_start and dma_wait)


def _access(operands: Operands, deciding, value=None, writes: bool = False, loads_value: bool = False):
  """The schedule role of a ref access: its `deciding` operands (index, mask) decide what it touches;
  a write of its `value` operand into the ref; its result is loaded data unless the ref is keyed (or,
  `loads_value`, when its value operand is: a masked load's `other`)."""
  def schedule(eqn, taint):
    g = operands.groups(eqn)
    ref = g["ref"][0]
    taint.decide([v for name in deciding for v in g[name]], eqn, "ref index (or mask)")
    values = g[value] if value else []
    if writes:
      taint.write(ref, eqn, values)
    loaded = not taint.is_keyed(ref)
    if loads_value:
      loaded = loaded or taint.any(values)
    return [loaded] * len(eqn.outvars)
  return schedule


def _signal_or_wait(eqn, taint):
  """A semaphore signal or wait decides by its semaphore and count; one to another device or core
  is never replayed."""
  g = (_SEM_SIGNAL if eqn.primitive.name == "semaphore_signal" else _SEM_WAIT).groups(eqn)
  if g.get("device_id") or g.get("core_index"):
    taint.refuse("'semaphore_signal' signals another device or core")
  taint.decide(eqn.invars, eqn, "semaphore or count")
  return [False] * len(eqn.outvars)


def _copy(eqn, taint):
  """A local copy decides by its windows and semaphores and writes its destination and semaphores;
  a remote one is never replayed."""
  g = DMA.groups(eqn)
  if g["device_id"]:
    taint.refuse(f"'{eqn.primitive.name}' is a remote copy (device_id)")
  if eqn.primitive.name == "dma_start":
    for v in (*g["dst"], *g["sem"], *g["src_sem"]):
      taint.write(v, eqn)
  taint.decide(eqn.invars, eqn, "copy window or semaphore")
  return [False] * len(eqn.outvars)


# ---- ref accesses
@rule("get", compiles=True, schedule=_access(_GET, ("transforms",)), operands=_GET)
def _get(eqn):
  target = _ref_operand(eqn, _Leaf(0), _compiled(_GET, eqn)["transforms"], last_index=True,
                        element=not eqn.outvars[0].aval.shape)
  if physical(eqn.outvars[0].aval) is not eqn.outvars[0].aval:
    return _key_get(eqn, target)

  def get(*operands):
    r, idx = target(operands)
    # (an element at a runtime index, kept apart by _ref_operand: read without composing a view)
    return r[idx] if idx is ... else r.load_element(idx)
  return get


def _key_get(eqn, target):
  """A PRNG key array read from a ref: its key data; from SMEM one scalar load per word, as Mosaic
  loads a Pallas TPU key (its words then seed the core's generator, rules_random.py)."""
  from jax._src.pallas.mosaic import random as pl_random  # noqa: PLC0415
  pallas_key = pl_random.is_pallas_impl(eqn.outvars[0].aval.dtype._impl)

  def get(*operands):
    r, idx = target(operands)
    view = r if idx is ... else r.at[idx]
    if view.memory_space != MemorySpace.SMEM:
      if pallas_key:
        raise MemorySpaceError(
            f"palace.jax: a Pallas TPU key read from {view.memory_space} at kernel line "
            f"{source_line(eqn)}: Mosaic loads these keys from SMEM only (\"PRNG keys must be loaded "
            f"from SMEM\"). Fix: give the key operand pl.BlockSpec(memory_space=pltpu.SMEM).")
      return view[...]
    words = [view[pos] for pos in np.ndindex(*view.shape)]
    return pjnp.reshape(pjnp.stack(words), view.shape)
  return get


@rule("swap", compiles=True, schedule=_access(_SWAP, ("transforms",), "value", writes=True), operands=_SWAP)
def _swap(eqn):
  if "add" in eqn.params:   # SparseCore's store primitive, also named "swap"
    return _sc_swap(eqn)
  target = _ref_operand(eqn, _Leaf(0), _compiled(_SWAP, eqn)["transforms"], last_index=True,
                        element=not eqn.outvars[0].aval.shape)
  load_old = not _dropped(eqn)

  def swap(*operands):
    r, idx = target(operands)
    if idx is ...:
      old = r[idx] if load_old else None
      r[idx] = operands[1]
      return old
    # (an element at a runtime index, kept apart by _ref_operand: accessed without composing a view)
    old = r.load_element(idx) if load_old else None
    r.store_element(idx, operands[1])
    return old
  return swap


def _sc_swap(eqn):
  """jax/_src/pallas/mosaic/sc_primitives.py `swap_p` (ref, value, *transforms[, mask]): a store
  (`add`: an atomic add, plsc.addupdate), masked, or (`compress`) of the masked lanes packed to the
  front of the ref (plsc.store_compressed / addupdate_compressed). Its result is the value."""
  p = eqn.params
  has_mask, add, compress = bool(p["has_mask"]), bool(p["add"]), bool(p["compress"])
  stop = -1 if has_mask else None
  target = _ref_operand(eqn, _Leaf(0), _unflatten(eqn, p["tree"], 2, stop), last_index=True)
  mask = _operand(eqn, len(eqn.invars) - 1) if has_mask else None

  def sc_swap(*operands):
    r, idx = target(operands)
    view = r if idx is ... else r.at[idx]
    x = operands[1]
    m = None if mask is None else _value(mask, operands)
    if compress:
      (sc.addupdate_compressed if add else sc.store_compressed)(view, x, mask=m)
    elif m is None:
      if add:
        sc.addupdate(view, x)
      else:
        view[...] = x
    else:
      tpu.store(view, view[...] + x if add else x, mask=m)
    return x
  return sc_swap


@rule("addupdate", compiles=True, schedule=_access(_SWAP, ("transforms",), "value", writes=True),
      operands=_SWAP)
def _addupdate(eqn):
  target = _ref_operand(eqn, _Leaf(0), _compiled(_SWAP, eqn)["transforms"], last_index=True)

  def addupdate(*operands):
    r, idx = target(operands)
    r[idx] = r[idx] + operands[1]
  return addupdate


@rule("masked_load", compiles=True, operands=_MASKED_LOAD,
      schedule=_access(_MASKED_LOAD, ("transforms", "mask"), "other", loads_value=True))
def _masked_load(eqn):
  ref, transforms, mask, other = _compiled(_MASKED_LOAD, eqn).values()
  target = _ref_operand(eqn, ref, transforms, last_index=True)

  def masked_load(*flat):
    r, idx = target(flat)
    m = _value(mask, flat)
    val = tpu.load(r.at[idx] if idx is not ... else r, mask=m)
    if other is None or m is None:
      return val
    return lax_ops.select(m, val, _value(other, flat))   # masked-off lanes read `other`
  return masked_load


@rule("masked_swap", compiles=True,
      schedule=_access(_MASKED_SWAP, ("transforms", "mask"), "value", writes=True), operands=_MASKED_SWAP)
def _masked_swap(eqn):
  ref, transforms, val, mask = _compiled(_MASKED_SWAP, eqn).values()
  target = _ref_operand(eqn, ref, transforms, last_index=True)
  load_old = not _dropped(eqn)

  def masked_swap(*flat):
    r, idx = target(flat)
    target_ref = r.at[idx] if idx is not ... else r
    old = target_ref[...] if load_old else None
    tpu.store(target_ref, _value(val, flat), mask=_value(mask, flat))
    return old
  return masked_swap


# ------------------------------------------------------------------ grid and hints
def _grid_axis(eqn) -> int:
  axis = int(eqn.params["axis"])
  axes = grid_axes.get()
  return axis if axes is None else axes[axis]


@rule("program_id", schedule=DATA)
def _program_id(eqn):
  return prims.program_id(_grid_axis(eqn))


@rule("num_programs", schedule=DATA)
def _num_programs(eqn):
  return np.int32(prims.num_programs(_grid_axis(eqn)))


@rule("multiple_of", schedule=DATA)
def _multiple_of(eqn, x):
  return prims.multiple_of(x, eqn.params["values"])


@rule("axis_index", schedule=Never("reads a mesh axis index"))
def _axis_index(eqn):
  return prims.axis_index(eqn.params["axis_name"])


# ------------------------------------------------------------------ semaphores
def _device_id(eqn, device_id):
  """The (compiled) device id of a remote signal or copy in palace's form, mapped as JAX's TPU
  lowering maps it (jax/_src/pallas/primitives.py: device_id_to_logical), by palace's own rules for
  a typed id (lang/primitives.typed_device_id): MESH coordinates (a tuple, a scalar on a 1-D mesh,
  or a dict of the axes that change, a joint key such as ('x', 'y') a row-major index over those
  axes: sim/machine.resolve_device_id), or a LOGICAL scalar, the device's row-major position in the
  mesh, which is palace's chip index. Forms are checked at lowering (callback.check_device_ids)."""
  if device_id is None:
    return None
  device_id_type = eqn.params.get("device_id_type")
  kind = str(getattr(device_id_type, "value", device_id_type) or "mesh").lower()
  if kind not in ("mesh", "logical"):
    raise unsupported(eqn, f"device_id_type={device_id_type}",
                      "use DeviceIdType.MESH or DeviceIdType.LOGICAL device ids.")
  return prims.typed_device_id(device_id, kind, eqn.primitive.name)


@rule("semaphore_signal", compiles=True, schedule=_signal_or_wait, operands=_SEM_SIGNAL)
def _sem_signal(eqn):
  ref, transforms, inc, device_id, core_index = _compiled(_SEM_SIGNAL, eqn).values()
  sem = _ref_operand(eqn, ref, transforms)
  device_id = _device_id(eqn, device_id)

  barrier = _in_core_barrier(eqn)

  def signal(*flat):
    if barrier is not None:
      context.current().in_barrier = barrier
    prims.semaphore_signal(sem(flat), _value(inc, flat), device_id=_value(device_id, flat),
                           core_index=_value(core_index, flat))
    return []
  return signal


def _in_core_barrier(eqn):
  """'pltpu.core_barrier at line' for the semaphore ops of JAX's core_barrier (a composite of signals
  and a wait in the named scope 'sync_cores', jax/_src/pallas/mosaic/helpers.py): set on the core's
  KernelContext while it is in one, so a launch that fails there names the core left waiting
  (launch/run.barrier_notes), as palace's own pltpu.core_barrier does."""
  if "sync_cores" not in str(getattr(eqn.source_info, "name_stack", "")):
    return None
  return f"pltpu.core_barrier at {source_line(eqn)}"


@rule("semaphore_wait", compiles=True, schedule=_signal_or_wait, operands=_SEM_WAIT)
def _sem_wait(eqn):
  ref, transforms, value, decrement = _compiled(_SEM_WAIT, eqn).values()
  sem = _ref_operand(eqn, ref, transforms)

  barrier = _in_core_barrier(eqn)

  def wait(*flat):
    if barrier is None:
      prims.semaphore_wait(sem(flat), _value(value, flat), decrement=bool(_value(decrement, flat)))
      return []
    kctx = context.current()
    kctx.in_barrier = barrier
    prims.semaphore_wait(sem(flat), _value(value, flat), decrement=bool(_value(decrement, flat)))
    kctx.in_barrier = None
    return []
  return wait


@rule("semaphore_read", compiles=True,
      schedule=Never("reads a semaphore's value (it depends on when copies land)"), operands=_SEM_READ)
def _sem_read(eqn):
  ref, transforms = _compiled(_SEM_READ, eqn).values()
  sem = _ref_operand(eqn, ref, transforms)
  return lambda *flat: prims.semaphore_read(sem(flat))


@rule("get_barrier_semaphore", schedule=Never("uses the barrier semaphore (a multi-device launch)"))
def _barrier_sem(eqn):
  return tpu.get_barrier_semaphore()


# ------------------------------------------------------------------ DMAs
class _StartedCopies(dict):
  """The copies a core's local `dma_start` equations issued in this launch and no wait has taken yet
  (kept per core in `Executor.host_cache`, released with the launch): per destination semaphore (its
  buffer id and Ref.dims) the prepared copies (tpu_primitives.PreparedCopy) started on it, oldest
  first. A wait is a semaphore wait for a byte count (sim/sync.wait_copy reads the request's
  semaphore, bytes and, in a deadlock message, its description), so a local `dma_wait` whose bytes
  are those of the oldest copy on its semaphore waits on that copy instead of making a descriptor and
  a prepared copy of its own: the same wait, and a message names the copy actually started. A wait
  for other bytes (the wheel's paged attention waits once for all the pages it started one by one)
  takes its own path and turns queueing off for the start equations of the copies it found (their
  `queued` flag), so they stop paying for it. A prepared copy holds its semaphore's buffer, so no
  other buffer has that id while it is queued."""
  __slots__ = ()

  def release(self) -> None:
    self.clear()


_STARTED = "palace.jax started copies"


def _queue_key(sem) -> tuple:
  """A semaphore view's key in _StartedCopies (the one key both dma_start and dma_wait use)."""
  return id(sem.buf), sem.dims


def _descriptor(eqn):
  """(fn(flat, views=None) -> the AsyncCopyDescriptor of a dma_start / dma_wait, and for a local copy
  with a semaphore fn(flat) -> its (source, destination, semaphore) views, else None), operands
  compiled once."""
  src, dst, dst_sem, src_sem, device_id = _compiled(DMA, eqn).values()
  refs = [None if x is None else _ref_operand(eqn, x) for x in (src, dst, dst_sem, src_sem)]
  device_id = _device_id(eqn, device_id)
  remote = device_id is not None
  site = user_site_of(eqn)   # the kernel's line (None: the executor's site at the start)

  r_src, r_dst, r_dst_sem, r_src_sem = refs

  def views(flat):
    return r_src(flat), r_dst(flat), r_dst_sem(flat)

  def descriptor(flat, v=None):
    src, dst, sem = v if v is not None else \
        (r_src(flat), r_dst(flat), None if r_dst_sem is None else r_dst_sem(flat))
    return tpu.AsyncCopyDescriptor(
        src, dst, sem, None if r_src_sem is None else r_src_sem(flat), device_id=_value(device_id, flat),
        is_remote=remote, site=site)
  return descriptor, (views if not remote and r_dst_sem is not None else None)


def _dma_rejects(eqn, sparsecore: bool = False) -> None:
  """A DMA of bool refs: Mosaic refuses it ('DMAs with bool dtypes are not supported.', which JAX's
  test_bool_dma_not_implemented expects from a TPU, before the device id's checks); a pallas_call's
  bool blocks are not such DMAs."""
  g = DMA.groups(eqn)
  for part in ("src", "dst"):
    for v in g.get(part, ()):
      aval = v.aval
      if getattr(aval, "inner_aval", None) is not None and str(aval.dtype) == "bool":   # (a key: no np dtype)
        raise UnsupportedError(
            f"DMAs with bool dtypes are not supported. (palace.jax: the {part} of dma_start at kernel "
            f"line {source_line(eqn)} is a bool ref, which the TPU compiler refuses to copy.) Fix: "
            f"copy the mask as int32 (x.astype(jnp.int32)) and compare it after the copy.")


@rule("dma_start", compiles=True, schedule=_copy, operands=DMA, rejects=_dma_rejects)
def _dma_start(eqn):
  descriptor, views = _descriptor(eqn)
  priority, add = int(eqn.params.get("priority", 0)), bool(eqn.params.get("add"))

  queued = [True]   # this equation's copies are queued for waits (until a wait could not use them)

  def start(*flat):
    if views is None or not queued[0]:
      descriptor(flat).start(priority, add=add)
      return []
    v = views(flat)
    d = descriptor(flat, v)
    d.start(priority, add=add)
    if type(v[0]) is Ref and type(v[1]) is Ref:   # (not SparseCore's indexed views)
      started = prims.launch_cache(_STARTED, _StartedCopies)
      if started is not None:
        key = _queue_key(v[2])
        queue = started.get(key)
        if queue is None:
          started[key] = [(d._prepared, queued)]
        else:
          queue.append((d._prepared, queued))
    return []
  return start


@rule("dma_wait", compiles=True, schedule=_copy, operands=DMA)
def _dma_wait(eqn):
  descriptor, views = _descriptor(eqn)
  wait_send = bool(eqn.params.get("is_wait_send"))
  if wait_send:
    views = None

  def wait(*flat):
    if views is not None:
      v = views(flat)
      started = prims.launch_cache(_STARTED)
      sem = v[2]
      if started and type(sem) is Ref:
        queue = started.get(_queue_key(sem))
        if queue:
          p = queue[0][0]
          src, dst = v[0], v[1]
          # (the oldest copy on this semaphore, of these bytes; a descriptor whose sides differ takes
          # the checked path, which rejects it as make_async_copy does)
          if type(src) is Ref and type(dst) is Ref and p.nbytes == src.nbytes and \
              src.shape == dst.shape and src.dtype == dst.dtype:
            del queue[0]
            p.wait()
            return []
          for _, flag in queue:   # (waits here take other byte counts: stop queueing those copies)
            flag[0] = False
          queue.clear()
      d = descriptor(flat, v)
    else:
      d = descriptor(flat)
    # JAX binds a wait on the source side with src/dst (and their semaphores) swapped: the waited
    # semaphore is always the third operand, and the bytes are those of the (swapped) destination.
    if d.is_remote and wait_send:
      d.sem, d.src_sem = d.src_sem, d.sem
      d.src_ref, d.dst_ref = d.dst_ref, d.src_ref
      d.wait_send()
    else:
      d.wait_recv()
    return []
  return wait


# ------------------------------------------------------------------ vector helpers
@rule("roll", schedule=Deciding(1))   # (the shift decides the lane movement)
def _roll(eqn, x, shift):
  p = eqn.params
  return tpu.roll(x, shift, int(p["axis"]), stride=p.get("stride"), stride_axis=p.get("stride_axis"))


@rule("bitcast", schedule=DATA)
def _bitcast(eqn, x):
  return tpu.bitcast(x, np.dtype(eqn.params["ty"]), int(eqn.params.get("dim", -2)))


@rule("prng_seed", schedule=DATA)
def _prng_seed(eqn, *seeds):
  """Seeded with scalars, or with a Pallas TPU key: its words, in order, as Mosaic seeds the
  generator with the key's scalars (rules_random.py)."""
  words = []
  for s in seeds:
    if isinstance(s, Array) and s.shape and s._data is not None:
      words.extend(int(w) for w in np.asarray(s._data).reshape(-1))
    else:
      words.append(s)
  tpu.prng_seed(*words)
  return []


def _prng_bits_rejects(eqn, sparsecore: bool = False) -> None:
  shape = tuple(eqn.params["shape"])
  if len(shape) < 2:
    raise UnsupportedError(
        f"palace.jax: pltpu.prng_random_bits of shape {shape} at kernel line {source_line(eqn)}: "
        f"Mosaic draws random bits into arrays of rank 2 or more only (NotImplementedError at "
        f"lowering: 'random_bits only supports rank>=2 outputs'). Fix: draw a 2-D block, e.g. "
        f"(8, 128), and reshape or slice it.")


@rule("prng_random_bits", schedule=DATA, rejects=_prng_bits_rejects)
def _prng_bits(eqn):
  return tpu.prng_random_bits(tuple(eqn.params["shape"]))


@rule("trace_value", schedule=Never("records a value on the timeline"))
def _trace_value(eqn, value):
  tpu.trace_value(eqn.params["label"], value)
  return []


@rule("delay", schedule=Deciding(0))
def _delay(eqn, nanos):
  prims.delay(nanos)
  return []


@rule("debug_callback", schedule=DATA)
def _debug_callback(eqn, *args):
  """`jax.debug.callback` / `jax.debug.print` with keyword arguments inside a kernel: the callback
  runs with the values as NumPy data, as JAX's interpret mode runs it (Mosaic compiles it to nothing
  on a TPU, so it costs no cycle). On a timing-only machine values carry no data: it does not run."""
  if any(isinstance(a, Array) and a._data is None for a in args):
    return []
  eqn.params["callback"](*[np.asarray(a._data) if isinstance(a, Array) else np.asarray(a) for a in args])
  return []


@rule("debug_print", schedule=DATA)
def _debug_print(eqn, *args):
  """pl.debug_print on TPU: `{}` placeholders are filled with the values, else they follow the text
  (palace's debug_print does the same); the text goes to the VirtualTPU's debug output."""
  p = eqn.params
  if p.get("static_args") or (p.get("in_tree") is not None and p["in_tree"].unflatten(args)[1]):
    raise UnsupportedError(
        f"palace.jax: jax.debug.print / pl.debug_print with keyword or static format arguments at kernel "
        f"line {source_line(eqn, ())}: a TPU kernel prints positional values only (Mosaic: \"Only "
        f"positional arguments are supported by debug_print on Pallas\"), so palace rejects it as the "
        f"chip's compiler does. Fix: pass the values positionally, e.g. jax.debug.print('x={{}}', x).")
  prims.debug_print(p["fmt"], *args)
  return []
