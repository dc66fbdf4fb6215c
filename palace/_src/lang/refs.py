"""Refs: mutable views of buffers that kernels read and write (L4a).

A Ref is a Buffer plus a view: one entry per buffer dimension, either an int (that dimension is indexed
away) or a (start, size, stride) window. `ref.at[...]` composes views without touching data; `ref[...]`
loads through the executor and returns an Array; `ref[...] = v` stores. Every index is bounds-checked
(ref_index.py: `pl.ds` and the composition of an index with a view); what a load or store may reach
and how a stored value is coerced are ref_access.py's; a bitcast or reshape that no strided window
expresses is a MappedRef (below), a 4-bit bitcast with a width change a PackedRef (packed_refs.py).
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.core import MemorySpace
from palace._src.errors import ShapeError, UnsupportedError, UsageError
from palace._src.lang import numpy_indexing, numpy_linalg, numpy_ops  # noqa: F401  (bind Array operators)
from palace._src.lang import ref_maps
from palace._src.lang.array import Array
from palace._src.lang.deferred import Deferred
from palace._src.lang.indexed import is_index_source, make_indexed
from palace._src.lang.numpy_indexing import plain_index
from palace._src.lang.packed_refs import PackedRef
from palace._src.lang.ref_access import check_access, coerce_store
from palace._src.lang.ref_index import RefIndexing, Slice, np_index_of
from palace._src.util import describe_dims, keep, prod


class _AtIndexer:
  __slots__ = ("_ref",)

  def __init__(self, ref):
    self._ref = ref

  def __getitem__(self, idx):
    first = idx[0] if isinstance(idx, tuple) and idx else idx
    if is_index_source(first):
      return make_indexed(self._ref, idx)  # SparseCore gather/scatter view
    return self._ref._view(idx)


_FULL_DIMS: dict = {}   # buffer shape -> the dims of its whole view (a cache of a pure function)
# Composed static indices of refs (Ref._target): (HBM or not, dtype and shape of the buffer, view
# dims, index, index types, bounds checked) -> the view's parts, or (dims,) for one element. A cache
# of a pure function of its key (an index that raises is never kept), cleared past _VIEWS_MAX entries.
_VIEWS: dict = {}
_VIEWS_MAX = 4096
_STATIC_KINDS = frozenset({int, Slice, slice, type(Ellipsis)})


class Ref(RefIndexing):
  """A mutable view of a buffer (VMEM, SMEM, HBM/ANY, semaphores)."""
  __slots__ = ("buf", "dims", "shape", "_np_index", "_full", "__weakref__")
  _mapped = False   # a MappedRef (below): its elements are found through an element map

  def __init__(self, buf: "Buffer", dims=None):
    self.buf = buf
    if dims is None:
      self.dims = tuple([(0, s, 1) for s in buf.shape])
      self.shape = tuple(buf.shape)
      self._full = True
      self._np_index = ()
      return
    if type(dims) is not tuple:
      dims = tuple(dims)
    self.dims = dims
    full = _FULL_DIMS.get(buf.shape)
    if full is None:
      full = _FULL_DIMS[buf.shape] = tuple([(0, n, 1) for n in buf.shape])
    if dims == full:
      self._full, self.shape, self._np_index = True, tuple(buf.shape), ()
      return
    self._full = False
    self.shape = tuple([d[1] for d in dims if type(d) is tuple])
    self._np_index = np_index_of(dims)

  @classmethod
  def window(cls, buf: "Buffer", starts, sizes, squeezed=()) -> "Ref":
    """A unit-stride view at element `starts` with `sizes` (dims in `squeezed` are indexed away).
    The caller has bounds-checked it; used by pipelines on every step, so it skips validation."""
    self = cls.__new__(cls)
    self.buf = buf
    if not squeezed:
      self.shape = sizes = tuple(sizes)
      self.dims = tuple([(st, sz, 1) for st, sz in zip(starts, sizes)])
      self._full = sizes == buf.shape and not any(starts)
      self._np_index = () if self._full else tuple([slice(st, st + sz) for st, sz in zip(starts, sizes)])
      return self
    dims, shape, npi = [], [], []
    for d, (st, sz) in enumerate(zip(starts, sizes)):
      if d in squeezed:
        dims.append(st)
        npi.append(st)
      else:
        dims.append((st, sz, 1))
        shape.append(sz)
        npi.append(slice(st, st + sz))
    self.dims = tuple(dims)
    self.shape = tuple(shape)
    self._full = not squeezed and tuple(starts) == (0,) * len(starts) and tuple(sizes) == buf.shape
    self._np_index = () if self._full else tuple(npi)
    return self

  def parts(self) -> tuple:
    """(dims, shape, NumPy index, whole?): what a view is besides its buffer; `from_parts` rebuilds it
    on another buffer of the same shape (palace.jax keeps the parts of the views a compiled kernel
    derives, which are pure functions of the base view and the index values, across launches)."""
    return self.dims, self.shape, self._np_index, self._full

  @classmethod
  def from_parts(cls, buf: "Buffer", parts: tuple) -> "Ref":
    self = cls.__new__(cls)
    self.buf = buf
    self.dims, self.shape, self._np_index, self._full = parts
    return self

  # ---- metadata ----
  dtype = property(lambda self: self.buf.dtype)
  memory_space = property(lambda self: self.buf.memory_space)
  ndim = property(lambda self: len(self.shape))
  size = property(lambda self: prod(self.shape))
  at = property(_AtIndexer)   # (the class is the getter: no lambda frame per `ref.at`)

  @property
  def nbytes(self) -> int:
    return prod(self.shape) * self.buf.dtype.itemsize

  def __len__(self):
    return self.shape[0]

  def __repr__(self):
    view = "" if self._full else f" view {self.describe_index()}"
    return f"Ref<{self.buf.memory_space}>{{{self.buf.dtype}{list(self.shape)}}} {self.buf.name}{view}"

  def describe_index(self) -> str:
    return describe_dims(self.dims)

  def origin(self) -> str:
    return self.buf.name + ("" if self._full else self.describe_index())

  def label_part(self) -> tuple:
    """`origin()` unformatted and without the buffer, as one side of a copy's label (executor.flat_label):
    (name, None, None), or (name, dims, None) for a part view (executor.label_text formats it when a
    report is read)."""
    return (self.buf.name, None, None) if self._full else (self.buf.name, self.dims, None)

  # ---- views ----
  def _view(self, idx) -> "Ref":
    view, index, _ = self._target(idx)
    return Ref(self.buf, index) if view is None else view   # (an element: a 0-d view of it)



  # ---- loads and stores ----
  def _target(self, idx) -> tuple:
    """(view, NumPy index, shape) of what `self[idx]` loads or stores. A whole-ref index (`...`, what
    nearly every load and store of a pipelined block uses) is tested first and answered from the ref's
    own fields. An index that selects one element makes no view (None): its composed dims are its NumPy
    index. Kernels read and write SMEM scalars at a new index on nearly every grid step, where a view
    would be built for one access. A static index (Python ints, `pl.ds` with an int start, `:`, `...`:
    `q_ref[b, h]` in a kernel body every grid step, `x_hbm.at[pl.ds(k * n, n)]` for a DMA) is composed
    once per (HBM or not, dtype and shape of the buffer, view, index, index types, bounds-check
    setting): `_VIEWS`."""
    if idx is Ellipsis or (type(idx) is tuple and not idx):
      return self, self._np_index, self.shape
    if self._mapped:   # (a mapped view has an element map)
      view = self._view(idx)
      return view, view._np_index, view.shape
    buf = self.buf
    t = idx if type(idx) is tuple else (idx,)
    kinds = tuple(map(type, t))
    key = None
    # (only exact ints, int-start pl.ds, `:` and `...`: a slice's bounds are not in `kinds`, and
    # 1.0 == 1, so a slice other than `:` is composed every time and its bounds checked as written)
    static = _STATIC_KINDS.issuperset(kinds)
    if static and slice in kinds:   # (each `:` keyed as None)
      t = plain_index(t)
      static = t is not None
    if static:
      ex = _current_ex()
      # (whether the buffer is in HBM, its dtype and shape: an HBM dim may reach into its tile padding)
      space = buf.memory_space
      key = (space is _HBM or space is _ANY, buf.dtype, buf.shape, self.dims, t, kinds,
             True if ex is None else ex.bounds_checks)
      try:
        hit = _VIEWS.get(key)
      except TypeError:   # a pl.ds with a runtime start
        hit = key = None
      if hit is not None:
        if len(hit) == 1:
          return None, hit[0], ()
        view = Ref.from_parts(buf, hit)
        return view, view._np_index, view.shape
    dims = self._compose(idx)
    if tuple in map(type, dims):
      view = Ref(buf, dims)
      if key is not None:
        keep(_VIEWS, key, view.parts(), _VIEWS_MAX)
      return view, view._np_index, view.shape
    if key is not None:
      keep(_VIEWS, key, (dims,), _VIEWS_MAX)
    return None, dims, ()

  def __getitem__(self, idx):
    ex = _current_ex()
    if ex is None:
      return self._host_get(idx)
    view, index, shape = self._target(idx)
    buf = self.buf
    if buf.memory_space is not _VMEM and (view is not None or buf.memory_space is not _SMEM):
      check_access(Ref(buf, index) if view is None else view, "Load", not shape)
    data, ready = ex.load(buf, index, shape)
    if type(data) is Deferred:
      return data._again(ready)
    value = Array(data, shape, buf.dtype, ready)
    if data is not None and data.base is not None and data.ndim:
      buf.watch(value)   # a zero-copy view of the buffer: detached by its next write (copy on write)
    return value

  def _element_index(self, idx: tuple):
    """The NumPy index of the element `idx` selects, when `idx` holds one index per dimension of this
    VMEM / SMEM ref (unmapped, none indexed away), each a Python int or a 0-d integer Array, all in
    range; else None. (An SMEM table read at a grid index is the scalar access of nearly every grid
    step; `load_element` / `store_element` then compose no view.)"""
    space, dims = self.buf.memory_space, self.dims
    if (space is not _SMEM and space is not _VMEM) or self._mapped or len(idx) != len(dims) or \
        len(dims) != len(self.shape):
      return None
    index = []
    for i, d in zip(idx, dims):
      if type(i) is not int:
        if type(i) is not Array or i.shape or i.dtype.kind not in "iu" or i._data is None:
          return None
        i = int(i._data)
      if not 0 <= i < d[1]:
        return None
      index.append(d[0] + i * d[2])
    return tuple(index)

  def load_element(self, idx: tuple):
    """`self[idx]` for an element index (`_element_index`); any other index, or no kernel, is
    `self[idx]` itself, whose conversions, checks and errors apply as they are."""
    ex = _current_ex()
    index = None if ex is None else self._element_index(idx)
    if index is None:
      return self[idx]
    buf = self.buf
    data, ready = ex.load(buf, index, ())
    return Array(data, (), buf.dtype, ready)

  def store_element(self, idx: tuple, value) -> None:
    """`self[idx] = value` for an element index (`_element_index`) and a 0-d Array of the ref's
    dtype; anything else is `self[idx] = value` itself. (Such a store never adopts the value's
    array, so nothing is registered for copy on write: Buffer.stored.)"""
    ex = _current_ex()
    index = None if ex is None or type(value) is not Array or value.shape or \
        value.dtype != self.buf.dtype else self._element_index(idx)
    if index is None:
      self[idx] = value
      return
    ex.store(self.buf, index, (), value._data, value._ready)

  def __setitem__(self, idx, value):
    ex = _current_ex()
    if ex is None:
      return self._host_set(idx, value)
    view, index, shape = self._target(idx)
    buf = self.buf
    if buf.memory_space is not _VMEM and (view is not None or buf.memory_space is not _SMEM):
      check_access(Ref(buf, index) if view is None else view, "Store", not shape)
    if type(value) is Array and value.shape == shape and value.dtype == buf.dtype:
      data, ready = (None if ex.timing_only and shape else value._data), value._ready
    elif (type(value) is Deferred and index == () and value.shape == shape
          and value.dtype == buf.dtype and buf.memory_space is _VMEM and not buf.aliased
          and ex.deferred_values):
      data, ready = value, value._ready  # the buffer keeps the deferred sum (lang/deferred.py)
    else:
      data, ready = coerce_store(Ref(buf, index) if view is None else view, value, ex.timing_only)
    ex.store(buf, index, shape, data, ready)
    if type(data) is np.ndarray:
      buf.stored(data, value if type(value) is Array else None)   # (an adopted array: copy on write)

  def get(self, idx=()):
    return self[... if isinstance(idx, tuple) and not idx else idx]

  def set(self, idx, value):
    self[... if isinstance(idx, tuple) and not idx else idx] = value

  def swap(self, value, idx=...):
    old = self[idx]
    self[idx] = value
    return old

  def addupdate(self, x, idx=...):
    self[idx] = self[idx] + x

  # ---- host access (mutable refs created by pl.new_ref) ----
  def _host_get(self, idx):
    if self.buf.core is not None:
      raise UsageError(f"{self.buf.name} ({self.buf.memory_space}) belongs to a kernel's core; it can "
                       f"only be read inside that kernel. Fix: read it in the kernel body, or return it as an "
                       f"output.")
    if self.buf.storage is None:
      raise UsageError(f"{self.buf.name} has been frozen or freed; it can no longer be read. Fix: read the "
                       f"array pl.freeze returned, or make a new ref with pl.new_ref.")
    view = self._view(idx)
    return np.array(self.buf.storage[view._np_index], copy=True)

  def _host_set(self, idx, value):
    if self.buf.storage is None:
      raise UsageError(f"{self.buf.name} has been frozen or freed; it can no longer be written. Fix: make "
                       f"a new ref with pl.new_ref(value).")
    view = self._view(idx)
    v = np.asarray(value)
    self.buf.detach_readers()
    try:
      self.buf.storage[view._np_index] = v.astype(self.buf.dtype, copy=False)
    except ValueError as e:
      raise ShapeError(f"Cannot store a value of shape {v.shape} into {view.origin()} of shape "
                       f"{view.shape}. Fix: store a value of shape {view.shape} (or one that broadcasts to "
                       f"it).") from e

  # ---- view transforms ----
  def bitcast(self, dtype) -> "Ref":
    """This ref's memory as `dtype`. The same width keeps the shape (a NumPy view of the buffer); another
    width scales the second-minor dimension, packing consecutive rows as a TPU does (a MappedRef)."""
    d = dt.canonicalize(dtype)
    what = f"Ref.bitcast of {self.origin()} to {d}"
    ref_maps.bitcast_shape(self.shape, self.dtype, d, what)   # (checks the types and the shape)
    if PackedRef.packs(self.dtype, d):
      return PackedRef(self, d)
    if d.itemsize != self.buf.dtype.itemsize:
      return MappedRef.of(self).bitcast(d)
    alias = self._alias(lambda s: s.view(d), shape=self.buf.shape, dtype=d)
    return Ref(alias) if self._full else Ref(alias, self.dims)

  def reshape(self, *shape) -> "Ref":
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
      shape = tuple(shape[0])
    shape = ref_maps.reshape_shape(self.shape, shape, f"Ref.reshape of {self.origin()}")
    if self._full:
      return Ref(self._alias(lambda s: s.reshape(shape, copy=False), shape=shape))
    # a contiguous view (e.g. `bufs.at[slot].reshape(...)`) aliases the buffer's storage; others map
    probe = np.empty(self.buf.shape, np.int8)[self._np_index]
    if probe.shape != tuple(self.shape) or not probe.flags.c_contiguous:
      return MappedRef.of(self).reshape(shape)
    index = self._np_index
    return Ref(self._alias(lambda s: s[index].reshape(shape, copy=False), shape=shape))

  def _alias(self, view_of, **changes) -> "Buffer":
    """A buffer sharing this one's storage (bitcast/reshape views, Buffer.alias) as `view_of(storage)`:
    the storage is read after the buffer stopped borrowing another's (Buffer.detach_readers), so the
    alias views memory the buffer owns, not a lender's read-only array."""
    buf = self.buf
    buf.detach_readers()
    storage = buf.storage
    return buf.alias(storage=None if storage is None else view_of(storage), **changes)


class MappedRef(Ref):
  """A ref view that no strided window of its buffer expresses (lang/ref_maps.py): a bitcast that
  changes the element width (rows packed along the second-minor axis, as on a TPU) or a reshape of a
  strided view, of a whole ref or of a view, in any order and number. It views the final array of a
  chain of steps from a plain view (`_base`) as a Ref views its buffer (`dims`, `shape`); its `buf` is
  an alias of the base buffer holding that memory as one flat array of the chain's narrowest unit
  (of this ref's dtype when that is the narrowest: loads, stores and DMAs then index it directly;
  otherwise an element is `g` units, converted on each load and store)."""
  __slots__ = ("_base", "_steps", "_final", "_dtype", "_unit", "_desc", "_mem", "_index")
  _mapped = True

  @classmethod
  def of(cls, ref: Ref) -> "MappedRef":
    """`ref` itself as a chain of no steps."""
    if ref._mapped:
      return ref
    return cls._make(ref, (), ref.shape, ref.buf.dtype, ref.origin(), {}, None)

  @classmethod
  def _make(cls, base, steps, final, dtype, desc, mem, dims) -> "MappedRef":
    self = cls.__new__(cls)
    self._base, self._steps, self._final, self._dtype, self._desc = base, steps, final, dtype, desc
    self._unit = ref_maps.unit_of(base.buf.dtype.itemsize, steps)
    self._unit = min(self._unit, dtype.itemsize)
    self._mem = mem   # (storage dtype, dtype, desc) -> (the base storage it views, alias): shared by views
    self._index = None
    if dims is None:
      dims = tuple([(0, n, 1) for n in final])
    self.dims = dims
    self.shape = tuple([d[1] for d in dims if type(d) is tuple])
    self._full = dims == tuple([(0, n, 1) for n in final])
    return self

  def _with(self, step, final, dtype, desc) -> "MappedRef":
    steps = self._steps if self._full else self._steps + ((ref_maps.AT, self.dims),)
    if step is not None:
      steps = steps + (step,)
    return MappedRef._make(self._base, steps, final, dtype, desc, self._mem, None)

  def _view(self, idx) -> "MappedRef":
    return MappedRef._make(self._base, self._steps, self._final, self._dtype, self._desc, self._mem,
                           self._compose(idx))

  def bitcast(self, dtype) -> "MappedRef":
    d = dt.canonicalize(dtype)
    what = f"Ref.bitcast of {self.origin()} to {d}"
    shape = ref_maps.bitcast_shape(self.shape, self._dtype, d, what)
    if PackedRef.packs(self._dtype, d):
      return PackedRef(self, d)
    step = None if d.itemsize == self._dtype.itemsize else \
        (ref_maps.BITCAST, self._dtype.itemsize, d.itemsize)
    return self._with(step, shape, d, f"{self.origin()}.bitcast({d.name})")

  def reshape(self, *shape) -> "MappedRef":
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
      shape = tuple(shape[0])
    shape = ref_maps.reshape_shape(self.shape, shape, f"Ref.reshape of {self.origin()}")
    return self._with((ref_maps.RESHAPE, self.shape, shape), shape, self._dtype,
                      f"{self.origin()}.reshape{shape}")

  # ---- what a Ref reads from its buffer, from the chain instead
  dtype = property(lambda self: self._dtype)
  memory_space = property(lambda self: self._base.buf.memory_space)
  nbytes = property(lambda self: self.size * self._dtype.itemsize)
  at = property(lambda self: _MappedAt(self))

  @property
  def buf(self):
    return self.unit_buffer(self._unit)

  @property
  def _np_index(self) -> tuple:
    index = self._index
    if index is None:
      index = self._index = self.unit_index(self._unit)
    return index

  def unit_buffer(self, unit: int):
    """The alias of the base buffer holding its memory as a flat array of `unit`-byte elements (of
    this ref's dtype when that is its width), remade when the base buffer's storage changed."""
    base = self._base.buf
    storage_dtype = self._dtype if unit == self._dtype.itemsize else ref_maps.UNIT_DTYPES[unit]
    key = (storage_dtype, self._dtype, self._desc)
    hit = self._mem.get(key)
    if hit is not None and hit[0] is base.storage and base.borrowed is None:
      return hit[1]
    base.detach_readers()   # (a borrowed storage is a lender's read-only array: take our own first)
    storage = base.storage
    if storage is not None and not storage.flags.c_contiguous:
      raise UnsupportedError(f"{self.origin()}: a bitcast or reshape view of a buffer whose storage is "
                             f"not contiguous is not supported in palace yet. Fix: pass the operand as a contiguous "
                             f"array (np.ascontiguousarray).")
    n = prod(base.shape) * base.dtype.itemsize // unit
    alias = base.alias(storage=ref_maps.flat_units(storage, storage_dtype), shape=(n,),
                       dtype=self._dtype, name=self._desc)   # (messages name the chain)
    self._mem[key] = (storage, alias)
    return alias

  def unit_index(self, unit: int) -> tuple:
    """The index into `unit_buffer(unit)` of this view's elements (a trailing axis of units when an
    element is wider than `unit`)."""
    base = self._base
    return (ref_maps.positions(base.buf.shape, base.buf.dtype.itemsize, base.dims, self._steps,
                               self.dims, unit, self._dtype.itemsize),)

  def units(self) -> int:
    """Units per element at this ref's own grain (1: its buffer holds its dtype)."""
    return self._dtype.itemsize // self._unit

  # ---- loads and stores of elements wider than the unit convert
  def __getitem__(self, idx):
    if self.units() == 1:
      return Ref.__getitem__(self, idx)
    ex = _current_ex()
    view = self if (idx is Ellipsis or (isinstance(idx, tuple) and not idx)) else self._view(idx)
    if ex is None:
      return view._host_get(...)
    buf = view.buf
    if buf.memory_space is not _VMEM:
      check_access(view, "Load", not view.shape)
    data, ready = ex.load(buf, view._np_index, view.shape)
    if data is not None:
      data = ref_maps.from_units(data, view._dtype)
    return Array(data, view.shape, view._dtype, ready)

  def __setitem__(self, idx, value):
    if self.units() == 1:
      return Ref.__setitem__(self, idx, value)
    ex = _current_ex()
    view = self if (idx is Ellipsis or (isinstance(idx, tuple) and not idx)) else self._view(idx)
    if ex is None:
      return view._host_set(..., value)
    buf = view.buf
    if buf.memory_space is not _VMEM:
      check_access(view, "Store", not view.shape)
    data, ready = coerce_store(view, value, ex.timing_only)
    if data is not None:
      data = ref_maps.to_units(data, view.shape, view._dtype, buf.storage.dtype)
    ex.store(buf, view._np_index, view.shape, data, ready)

  def _host_get(self, idx):
    view = self._view(idx)
    data = np.array(view.buf.storage[view._np_index], copy=True)
    return data if view.units() == 1 else ref_maps.from_units(data, view._dtype)

  def _host_set(self, idx, value):
    view = self._view(idx)
    buf = view.buf
    v = np.broadcast_to(np.asarray(value).astype(view._dtype, copy=False), view.shape)
    buf.detach_readers()
    buf.storage[view._np_index] = v if view.units() == 1 else \
        ref_maps.to_units(v, view.shape, view._dtype, buf.storage.dtype)

  # ---- names
  def origin(self) -> str:
    return self._desc + ("" if self._full else describe_dims(self.dims))

  def label_part(self) -> tuple:
    return (self.origin(), None, None)

  def __repr__(self):
    return f"Ref<{self.memory_space}>{{{self._dtype}{list(self.shape)}}} {self.origin()}"




class _MappedAt(_AtIndexer):
  __slots__ = ()

  def __getitem__(self, idx):
    first = idx[0] if isinstance(idx, tuple) and idx else idx
    if is_index_source(first):
      raise UnsupportedError(f"An indexed (gather/scatter) view of {self._ref.origin()} is not "
                             f"supported in palace yet: it is a bitcast or reshape of a view. Fix: index "
                             f"the plain ref, or bitcast the gathered value.")
    return self._ref._view(idx)


_VMEM = MemorySpace.VMEM
_SMEM = MemorySpace.SMEM
_HBM, _ANY = MemorySpace.HBM, MemorySpace.ANY
_current_ex = executor.maybe_current   # (the context variable's getter: no Python frame)
