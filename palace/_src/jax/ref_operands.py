"""Ref operands of palace.jax's state and DMA rules, compiled once per equation (rules_state.py,
rules_sc.py, rules_pipeline.py): an equation's flattened operand tree unflattened with a `_Leaf` per
flat operand, JAX's ref transforms (indexers, bitcasts, reshapes, select_ref) turned into view steps,
and `_ref_operand`: a function of the flat operands giving the palace Ref view (and the trailing index
of a read or write), its views cached per base ref and index values."""
from __future__ import annotations

import operator
import weakref

import numpy as np

from palace._src.jax.interpret import unsupported
from palace._src.jax.registry import Operands, literal
from palace._src.lang.array import Array, concrete_int
from palace._src.lang.indexed import Indices
from palace._src.lang.ref_index import bounds_checks, ds
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
    values, ignored = _index_builder((_index_entry(eqn, i.values),)), i.ignored_value
    return (_GENERAL, lambda flat: Indices(values(flat)[0], ignored), 0, 0)
  if type(i) is _Leaf:
    return (_DYNAMIC, i.k, 0, 0)
  return (_STATIC, i, 0, 0)


def _index_builder(entries):
  """fn(flat) -> the index `entries` select at run time (flat: the tuple of an equation's operands, as
  its evaluation receives them), made once per entry list. Runtime indices alone are one C call
  (`itemgetter`: several operands, or a lone one as the one-element slice of the operands, so a
  scalar read at a grid index costs no Python frame for its index); any other list is one generated
  function that builds the tuple (static entries as constants, `pl.ds` windows at a runtime start,
  the general entries' functions)."""
  if entries and all(e[0] == _DYNAMIC for e in entries):
    if len(entries) == 1:
      k = entries[0][1]
      return operator.itemgetter(slice(k, k + 1))
    return operator.itemgetter(*[e[1] for e in entries])
  names = {"ds": ds}
  parts = []
  for n, (kind, a, size, stride) in enumerate(entries):
    if kind == _STATIC:
      names[f"c{n}"] = a
      parts.append(f"c{n}")
    elif kind == _DYNAMIC:
      parts.append(f"flat[{int(a)}]")
    elif kind == _DYNAMIC_SLICE:
      parts.append(f"ds(flat[{int(a)}], {int(size)}, {int(stride)})")
    else:
      names[f"g{n}"] = a
      parts.append(f"g{n}(flat)")
  return eval("lambda flat: (" + "".join(p + ", " for p in parts) + ")", names)  # noqa: S307  (above)


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
  """The view `steps` make of `ref` (their indexers compiled: `(_AT, an _index_builder)`)."""
  for kind, a in steps:
    if kind == _AT:
      ref = ref.at[a(flat)]
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
  steps = tuple((kind, _index_builder(a) if kind == _AT else a) for kind, a in steps)
  index_of = None if last is None else _index_builder(last)   # (the read or write's own index)
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

  def ref_of(flat):
    ref = flat[k]
    if type(ref) is not Ref:
      _check_ref(eqn, ref)
    ref = view_of(ref, flat)
    if not last_index:
      return ref
    return ref, (... if index_of is None else index_of(flat))
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
