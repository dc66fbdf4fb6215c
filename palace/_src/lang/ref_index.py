"""Indices of refs (L4a): `pl.ds` windows and the one composition of an index with a ref's view
(`RefIndexing._compose`, the base of refs.Ref and its MappedRef), bounds-checked.

Every index is bounds-checked, each form in one place: ints (negative ones count from the end, as in
NumPy), `pl.ds(start, size, stride)` (start >= 0 and the window inside the axis) and static Python
slices (validate.static_slice: legal negative bounds keep NumPy's meaning, but a bound outside
[-size, size] is an OutOfBoundsError instead of NumPy's silent clipping; JAX rejects an out-of-range
start too but clamps a stop beyond the end, which palace rejects as well, since the shortened window
is almost always a kernel bug). Indices must be integers: floats and bools are errors, never truncated.
"""
from __future__ import annotations

import dataclasses
import itertools
import operator

import numpy as np

from palace._src import executor, validate
from palace._src.errors import OutOfBoundsError, UsageError
from palace._src.lang import hbm_tiles
from palace._src.lang.array import Array, concrete_int
from palace._src.lang.numpy_indexing import _where
from palace._src.util import user_frame_summary

_STATIC_BOUND = (int, type(None))   # slice bound types that are certainly not runtime values
_current_ex = executor.maybe_current   # (the context variable's getter: no Python frame)


@dataclasses.dataclass(frozen=True)
class Slice:
  """`pl.ds(start, size, stride)` / `pl.Slice`: start may be a runtime scalar; size is static."""
  start: object
  size: int
  stride: int = 1

  def __post_init__(self):
    start, size, stride = self.start, self.size, self.stride
    if (type(size) is int and size >= 0 and type(stride) is int and stride >= 1 and
        (type(start) is int or type(start) is Array)):
      return   # the common case, cheap (pl.ds is built on every step of a kernel loop)
    if isinstance(self.size, Array) or isinstance(self.stride, Array):
      raise UsageError(f"pl.ds size must be a static Python int (only the start may be dynamic); got "
                       f"size={self.size!r}, stride={self.stride!r}. Fix: pass the size as a Python int (e.g. "
                       f"the block size); a dynamic extent needs a fixed-size window and a mask. "
                       f"({user_frame_summary()})")
    hint = "pass an integer; floats are never truncated."
    if not isinstance(self.start, Array):
      object.__setattr__(self, "start", validate.as_int(
          self.start, f"pl.ds start ({user_frame_summary()})", hint=hint))
    object.__setattr__(self, "size", validate.as_int(
        self.size, f"pl.ds size ({user_frame_summary()})", min_value=0, hint=hint))
    object.__setattr__(self, "stride", validate.as_int(
        self.stride, f"pl.ds stride ({user_frame_summary()})", min_value=1, hint=hint))


def ds(start, size=None, stride: int = 1) -> Slice:
  if size is None:
    start, size = 0, start
  return Slice(start, size, stride)


def np_index_of(dims) -> tuple:
  """A view's dims as the NumPy index of its elements in the array it views."""
  return tuple([d if type(d) is int else slice(d[0], d[0] + (d[1] - 1) * d[2] + 1 if d[1] else d[0], d[2])
                for d in dims])


def bounds_checks() -> bool:
  """Whether ref views made here are bounds-checked: the current core's setting
  (CompilerParams(disable_bounds_checks)), True outside a kernel (what `Ref.at` composes with)."""
  ex = _current_ex()
  return True if ex is None else ex.bounds_checks


class RefIndexing:
  """What an index does to a ref's view (`dims`, `shape`, `buf`, `_mapped`, `origin()` of refs.Ref):
  the base of Ref and MappedRef, so that every index form is composed and checked in one place."""
  __slots__ = ()

  def _index_site(self, idx, axis: int) -> str:
    """`x_ref[200:208, :]` (axis 0 of args[0], shape (128, 256), VMEM) at grid point ... line: the
    place of a bad index, for its error message."""
    return (f"Index {self.buf.name}[{validate.fmt_index(idx)}] (axis {axis} of {self.origin()}, shape "
            f"{self.shape}, {self.buf.memory_space}){_where()} at {user_frame_summary()}")

  def _compose(self, idx) -> tuple:
    """The dims of the view `self[idx]` selects (ints for the dims indexed away), every index checked
    against its axis unless bounds checks are off (a mapped view: always)."""
    if type(idx) is not tuple:
      idx = tuple(idx) if isinstance(idx, tuple) else (idx,)
    dims = self.dims
    # the positions of the dims not indexed away yet (all of them unless a dim is an int)
    free = range(len(dims)) if len(self.shape) == len(dims) else \
        [i for i, d in enumerate(dims) if not isinstance(d, int)]
    n_ell = sum(map(operator.is_, idx, itertools.repeat(Ellipsis)))
    if n_ell > 1:
      raise UsageError(f"An index of {self.buf.name} can only have a single ellipsis ('...'){_where()}. "
                         f"Fix: keep one '...' and spell out the other dimensions with ':'.")
    if n_ell:
      k = idx.index(Ellipsis)
      idx = idx[:k] + (slice(None),) * (len(free) - len(idx) + 1) + idx[k + 1:]
    if len(idx) > len(free):
      raise OutOfBoundsError(f"Too many indices for {self.buf.name} of shape {self.shape}: got "
                             f"{len(idx)}{_where()}. Fix: give at most {len(free)} indices, one per "
                             f"dimension.")
    new = list(dims)
    # (a mapped view is always checked: its element map has no out-of-bounds form to clip)
    check = True if self._mapped else bounds_checks()
    for axis, (pos, i) in enumerate(zip(free, idx)):
      start, size, stride = new[pos]
      if type(i) is slice and i.start is None and i.stop is None and i.step is None:
        continue   # `:` keeps the dim as it is (static_slice gives (0, size, 1), always in bounds)
      if isinstance(i, (Array, int, np.integer)):   # (first: indexing by ints is the common case)
        if type(i) is bool:
          raise UsageError(f"{self._index_site(idx, axis)}: a bool is not an index. Fix: index with an "
                           f"integer, a slice or pl.ds (boolean masks are not supported on refs).")
        v = concrete_int(i, "index")
        if isinstance(i, (int, np.integer)) and v < 0:
          v += size
        if check and not 0 <= v < size:
          raise OutOfBoundsError(
              f"Index {v} out of bounds for axis {axis} of {self.origin()} (shape {self.shape}, "
              f"{self.buf.memory_space}){_where()}: expected 0 <= index < {size}. Fix: keep the index "
              f"in 0..{size - 1}. ({user_frame_summary()})")
        new[pos] = start + v * stride
        continue
      if isinstance(i, Slice):
        s0 = concrete_int(i.start, "pl.ds start")
        sz, st = i.size, i.stride
      elif type(i) is slice:
        if not (type(i.start) in _STATIC_BOUND and type(i.stop) in _STATIC_BOUND and
                type(i.step) in _STATIC_BOUND) and \
            any(isinstance(v, Array) for v in (i.start, i.stop, i.step)):
          raise UsageError(f"Slicing {self.buf.name} with runtime bounds needs pl.ds(start, size): a "
                           f"Python slice must be static. Fix: use x_ref[pl.ds(start, size)] with a static "
                           f"size.")
        s0, sz, st = validate.static_slice(i, size, lambda: self._index_site(idx, axis))
      elif isinstance(i, RefIndexing):
        raise UsageError(f"Indexing {self.buf.name} with a ref (indexed DMA) is a SparseCore feature; "
                         f"Fix: use it as the source or destination of pltpu.sync_copy/async_copy.")
      else:
        raise UsageError(f"Unsupported index {i!r} for {self.buf.name}{_where()}. Fix: use ints, slices or "
                         f"pl.ds.")
      if check and sz > 0 and (s0 < 0 or s0 + (sz - 1) * st >= size) and \
          not hbm_tiles.allows(self.buf, pos, new[pos], s0, sz, st):   # (an HBM tile's padding)
        raise OutOfBoundsError(
            f"Slice [{s0}:{s0 + sz * st}] out of bounds for axis {axis} of {self.origin()} (shape "
            f"{self.shape}, {self.buf.memory_space}){_where()}: expected 0 <= start and "
            f"start + size <= {size}{hbm_tiles.padding_note(self.buf, pos, new[pos])}. Fix: keep the "
            f"slice inside the {size} elements of axis {axis}. ({user_frame_summary()})")
      new[pos] = (start + s0 * stride, sz, stride * st)
    return tuple(new)
