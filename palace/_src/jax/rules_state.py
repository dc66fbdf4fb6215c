"""Registry entries of refs (get/swap/addupdate and Pallas' masked load/store, with their indexer,
bitcast and reshape transforms) and of the Pallas / Mosaic-TPU primitives (program ids, semaphores,
DMAs, barrier semaphores, roll, bitcast, PRNG, debug prints).

Their operands are flattened pytrees (refs with transforms, a DMA's source, destination, semaphores and
device id): each entry's `Operands` (registry.py) is the one reading of that layout, used here to
compile the operands once per equation, by the schedule functions below and by the lowering's
device-id checks (callback.py)."""
from __future__ import annotations

import weakref

import numpy as np

from palace._src.errors import MemorySpaceError, UnsupportedError
from palace._src.core import MemorySpace
from palace._src.jax.avals import physical
from palace._src.jax.interpret import grid_axes, result_unused, source_line, unsupported, user_site_of
from palace._src.jax.registry import DATA, Deciding, Never, Operands, literal, rule
import palace._src.lang.numpy_ops as pjnp
from palace._src.lang import context, lax_ops
from palace._src.lang import primitives as prims
from palace._src.lang import sc_primitives as sc
from palace._src.lang.ref_index import bounds_checks, ds
from palace._src.lang import tpu_primitives as tpu
from palace._src.lang.array import Array, concrete_int
from palace._src.lang.indexed import Indices
from palace._src.lang.refs import Ref


def _jax_types():
  from jax._src.state import indexing, types  # noqa: PLC0415
  return indexing, types


# ------------------------------------------------------------------ operand trees, compiled
# A ref equation's operands are a flattened pytree (refs, their transforms with dynamic indices,
# values). It is unflattened ONCE, when the jaxpr is compiled, with a `_Leaf(k)` for flat operand k
# (literal operands folded in), and turned into plain tuples evaluated against the flat operands.
class _Leaf:
  """Stands for flat operand `k` in an equation's operand tree unflattened at compile time."""
  __slots__ = ("k",)

  def __init__(self, k: int):
    self.k = k


def _compiled(operands: Operands, eqn) -> dict:
  """`eqn`'s operands decoded (`Operands.decode`) for compiling: a _Leaf(k) for flat operand k,
  literal operands as their values."""
  from jax._src import core as jax_core  # noqa: PLC0415
  return operands.decode(eqn, lambda k, v: literal(v) if type(v) is jax_core.Literal else _Leaf(k))


def _unflatten(eqn, tree, first: int = 0, stop=None):
  """`tree` unflattened from the operands `first`...`stop` : a _Leaf(k) for operand k (numbered over
  all of the equation's operands), literal operands as their values."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from jax._src import tree_util  # noqa: PLC0415
  leaves = [literal(v) if type(v) is jax_core.Literal else _Leaf(k)
            for k, v in enumerate(eqn.invars[first:stop], first)]
  return tree_util.tree_unflatten(tree, leaves)


def _operand(eqn, k: int):
  """Operand `k` compiled: a _Leaf, or a literal's value."""
  from jax._src import core as jax_core  # noqa: PLC0415
  v = eqn.invars[k]
  return literal(v) if type(v) is jax_core.Literal else _Leaf(k)


def _value(x, flat):
  """A compiled operand (a _Leaf, a dict / tuple of them, or a static value) at run time."""
  if type(x) is _Leaf:
    return flat[x.k]
  if isinstance(x, dict):
    return {k: _value(v, flat) for k, v in x.items()}
  if isinstance(x, (tuple, list)):
    return type(x)(_value(v, flat) for v in x)
  return x


# index entries: (kind, a, size, stride); _GENERAL entries hold a function flat -> the index (dynamic-size
# slices, index refs), and views with one are not cached
_STATIC, _DYNAMIC, _DYNAMIC_SLICE, _GENERAL = 0, 1, 2, 3


def _index_entry(eqn, i):
  indexing, _ = _jax_types()
  _, types = _jax_types()
  if isinstance(i, indexing.Slice):
    if not isinstance(i.stride, (int, np.integer)):
      raise unsupported(eqn, "a slice of dynamic stride")
    if type(i.size) is _Leaf or not isinstance(i.size, (int, np.integer)):
      # a dynamic size (pl.BoundedSlice blocks: JAX's emit_pipeline DMAs a window of runtime size)
      # is known when the kernel runs, as it is to a TPU's DMA engine
      start, size, stride = i.start, i.size, int(i.stride)
      return (_GENERAL, lambda flat: ds(_value(start, flat), concrete_int(_value(size, flat), "slice size"),
                                        stride), 0, 0)
    if type(i.start) is _Leaf:
      return (_DYNAMIC_SLICE, i.start.k, int(i.size), int(i.stride))
    return (_STATIC, ds(i.start, int(i.size), int(i.stride)), 0, 0)
  if isinstance(i, types.TransformedRef):   # an index ref (SparseCore gather / scatter DMAs)
    return (_GENERAL, _ref_operand(eqn, i), 0, 0)
  if type(i).__name__ == "Indices" and hasattr(i, "ignored_value"):   # plsc.Indices(values, ignored_value)
    values, ignored = _index_entry(eqn, i.values), i.ignored_value
    return (_GENERAL, lambda flat: Indices(_index((values,), flat)[0], ignored), 0, 0)
  if type(i) is _Leaf:
    return (_DYNAMIC, i.k, 0, 0)
  return (_STATIC, i, 0, 0)


def _index(entries, flat) -> tuple:
  return tuple(a if kind == _STATIC else flat[a] if kind == _DYNAMIC else
               ds(flat[a], size, stride) if kind == _DYNAMIC_SLICE else a(flat)
               for kind, a, size, stride in entries)


_AT, _BITCAST, _RESHAPE = 0, 1, 2


def _transforms(eqn, transforms, last_index: bool = False):
  """JAX ref transforms -> (view steps, trailing index entries or None). With last_index, a trailing
  indexer is kept apart (so the read/write itself indexes, as `ref[idx]` does)."""
  indexing, types = _jax_types()
  transforms = list(transforms or ())
  last = None
  if last_index and transforms and isinstance(transforms[-1], indexing.NDIndexer):
    last = tuple(_index_entry(eqn, i) for i in transforms.pop().indices)
  steps = []
  for t in transforms:
    if isinstance(t, indexing.NDIndexer):
      steps.append((_AT, tuple(_index_entry(eqn, i) for i in t.indices)))
    elif isinstance(t, types.BitcastTransform) or type(t).__name__ == "RefBitcaster":
      steps.append((_BITCAST, np.dtype(t.dtype)))
    elif isinstance(t, types.ReshapeTransform) or type(t).__name__ == "RefReshaper":
      steps.append((_RESHAPE, tuple(t.shape)))
    else:
      raise unsupported(eqn, f"the ref transform {type(t).__name__}")
  return tuple(steps), last


def _view(steps, ref, flat):
  for kind, a in steps:
    if kind == _AT:
      ref = ref.at[_index(a, flat)]
    elif kind == _BITCAST:
      ref = ref.bitcast(a)
    else:
      ref = ref.reshape(*a)
  return ref


def _index_key(x):
  """A dynamic index as the int it selects, for the view cache; None when it is not a plain integer
  scalar with data (the view is then built, and checked, as usual)."""
  t = type(x)
  if t is int:
    return x
  if t is Array:
    if x.shape or x._data is None or x.dtype.kind not in "iu":
      return None
    return int(x._data)
  if isinstance(x, np.integer):
    return int(x)
  return None


def _ref_operand(eqn, x, transforms=(), last_index: bool = False, element: bool = False):
  """A compiled ref operand (a _Leaf, or a TransformedRef of one, plus `transforms`): a function
  flat -> the palace Ref view (and, with last_index, the trailing index: ... when there is none).
  Views are cached per base ref and dynamic index values (a view is an immutable function of them;
  JAX's emit_pipeline re-derives the same few block and slot views on every step). An `element`
  access (a scalar read or write) at a runtime index keeps its index apart: such indices change
  nearly every step (SMEM tables indexed by the grid), and a ref indexed down to one element makes
  no view (Ref._target)."""
  _, types = _jax_types()
  transforms = tuple(transforms or ())
  while isinstance(x, types.TransformedRef):   # (a view of a select_ref nests one: ref=TransformedRef)
    x, transforms = x.ref, tuple(x.transforms) + transforms
  if isinstance(x, (tuple, list)) and transforms and isinstance(transforms[0], types.SelectTransform):
    return _selected_ref(eqn, x, transforms, last_index)
  if type(x) is not _Leaf:
    raise unsupported(eqn, f"an operand of type {type(x).__name__} where a ref belongs")
  k = x.k
  steps, last = _transforms(eqn, transforms, last_index)
  if last is not None and element and any(e[0] == _DYNAMIC for e in last) and \
      all(e[0] == _DYNAMIC or (e[0] == _STATIC and isinstance(e[1], (int, np.integer))) for e in last):
    # (an element at a runtime index: indexed by the read or write itself; its static entries as
    # Python ints, which Ref.load_element / store_element take as they are, as the ref's own indexing
    # takes an integer NumPy scalar)
    last = tuple((_STATIC, int(e[1]), 0, 0) if e[0] == _STATIC else e for e in last)
  elif last is not None and all(e[0] != _GENERAL for e in last):
    # the read/write's own index becomes the last view step, cached like the others: `r[idx]` is
    # then `view[...]`, the same view built once per base ref and index values, not every step
    steps, last = (*steps, (_AT, last)), None
  dynamic = tuple(sorted({a for kind, entries in steps if kind == _AT
                          for e_kind, a, _, _ in entries if e_kind in (_DYNAMIC, _DYNAMIC_SLICE)}))
  cacheable = not any(e[0] == _GENERAL for kind, entries in steps if kind == _AT for e in entries)
  # views made only of indexing are also kept across launches as their parts (Ref.parts: dims, shape,
  # NumPy index), per base view, index values and bounds-check setting: a pure function of those, so
  # a later launch rebuilds the view on its own buffer without composing and checking the index again
  at_only = all(kind == _AT for kind, _ in steps)
  composed: dict = {}
  views: dict = {}
  # a weak reference to the base ref the cached views belong to (a new launch brings new refs): a
  # compiled jaxpr outlives its launches (JAX's caches keep it), so views held past their launch
  # would keep its buffers alive (HBM operands, outputs, scratch: 1.5 GiB per traced kernel for
  # tokamax's gmm_v2 at m=65536); they go when the base ref does, at the end of its launch
  base = [None]

  def forget(w):
    if base[0] is w:
      views.clear()
      base[0] = None

  one = dynamic[0] if len(dynamic) == 1 else None   # (the common case: one runtime index)

  def view_of(ref, flat):
    if not steps:
      return ref
    if not cacheable:
      return _view(steps, ref, flat)
    if one is not None:
      key = _index_key(flat[one])
      if key is None:
        return _view(steps, ref, flat)
    else:
      key = tuple(_index_key(flat[a]) for a in dynamic)
      if None in key:
        return _view(steps, ref, flat)
    b = base[0]
    if b is None or b() is not ref:
      views.clear()
      base[0] = weakref.ref(ref, forget)
    v = views.get(key)
    if not at_only:
      # a bitcast / reshape view aliases the storage its base buffer had when it was made; a kept
      # launch (launch/run._Warm) rebinds the same buffers to each launch's data: remade then
      if v is not None and v[1] is ref.buf.storage:
        return v[0]
      v = _view(steps, ref, flat)
      views[key] = (v, ref.buf.storage)
      return v
    if v is None:
      if type(ref) is not Ref:
        v = views[key] = _view(steps, ref, flat)
        return v
      ckey = (ref.buf.shape, ref.dims, key, bounds_checks())   # (the setting Ref.at composes with)
      parts = composed.get(ckey)
      if parts is None:
        v = _view(steps, ref, flat)
        if type(v) is Ref:
          if len(composed) > 4096:
            composed.clear()
          composed[ckey] = v.parts()
      else:
        v = Ref.from_parts(ref.buf, parts)
      views[key] = v
    return v

  # (an element's index: one runtime index alone, the common case, without _index's generator)
  lone = last[0][1] if last is not None and len(last) == 1 and last[0][0] == _DYNAMIC else None

  def ref_of(flat):
    ref = flat[k]
    if type(ref) is not Ref:
      _check_ref(eqn, ref)
    ref = view_of(ref, flat)
    if not last_index:
      return ref
    return ref, (... if last is None else (flat[lone],) if lone is not None else _index(last, flat))
  return ref_of


def _selected_ref(eqn, refs, transforms, last_index: bool):
  """`pl.select_ref(idx, *refs)` (JAX's SelectTransform, first of `transforms`): the ref a runtime
  scalar picks, with the remaining transforms applied to it; JAX takes it as a DMA's source,
  destination or semaphore. Each candidate is compiled as its own ref operand (views cached as
  usual). The index picks as JAX's TPU lowering computes it (`_select_to_ifop`: a chain of `idx == 0`
  tests, each else branch taking idx - 1 on to the remaining refs, the last else the last ref): 0..n-2
  pick their ref, any other index (n - 1 and beyond, or negative) the last one."""
  idx, rest = transforms[0].idx, tuple(transforms[1:])
  picks = [_ref_operand(eqn, r, rest, last_index) for r in refs]
  last = len(picks) - 1

  def ref_of(flat):
    i = int(idx) if type(idx) is not _Leaf else concrete_int(flat[idx.k], "pl.select_ref index")
    return picks[i if 0 <= i < last else last](flat)
  return ref_of


def _check_ref(eqn, ref):
  if not isinstance(ref, Ref):
    raise unsupported(eqn, f"an operand of type {type(ref).__name__} where a ref belongs")


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
