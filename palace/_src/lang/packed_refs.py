"""4-bit ref bitcasts with a width change (L4a): `PackedRef`, which loads and stores the whole view by
bitcasting the value (refs.Ref.bitcast and MappedRef.bitcast make it)."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.errors import ShapeError, UnsupportedError
from palace._src.lang import ref_maps
from palace._src.lang.array import Array
from palace._src.lang.numpy_indexing import _where
from palace._src.util import prod, user_frame_summary


class PackedRef:
  """A ref bitcast to or from a 4-bit type with a width change (int4 <-> int8, bf16, f32, ...): palace
  keeps one 4-bit element per byte, so no map of the buffer's memory expresses it (ref_maps). A load of
  the whole view loads the whole base ref and bitcasts the value (ref_maps.bitcast_data: rows packed
  along the second-minor axis, the first in the lowest bits, as pltpu.bitcast of a value); a store of
  the whole view bitcasts the value back and stores it. Windows of it, DMAs of it and further views
  are not covered (UnsupportedError naming them)."""
  __slots__ = ("_base", "dtype", "shape")

  def __init__(self, base, dtype):
    self._base, self.dtype = base, dtype
    self.shape = ref_maps.bitcast_shape(base.shape, base.dtype, dtype, f"Ref.bitcast of {base.origin()}")

  @staticmethod
  def packs(src, dst) -> bool:
    """Whether a bitcast from `src` to `dst` changes the width with a 4-bit type on one side."""
    bits = ref_maps.storage_bits
    return bits(src) != bits(dst) and 4 in (bits(src), bits(dst))

  ndim = property(lambda self: len(self.shape))
  size = property(lambda self: prod(self.shape))
  memory_space = property(lambda self: self._base.memory_space)
  at = property(lambda self: _PackedAt(self))

  def origin(self) -> str:
    return f"{self._base.origin()}.bitcast({self.dtype.name})"

  def __repr__(self):
    return f"Ref<{self.memory_space}>{{{self.dtype}{list(self.shape)}}} {self.origin()}"

  def _refuse(self, what: str) -> UnsupportedError:
    return UnsupportedError(
        f"{what} of {self.origin()}{_where()}: palace covers loads and stores of a whole 4-bit ref "
        f"bitcast view only (it keeps one 4-bit element per byte, so the view maps no window of the "
        f"buffer). Fix: load the whole view (ref.bitcast(...)[...]) and slice the value, or bitcast "
        f"the value with pltpu.bitcast. ({user_frame_summary()})")

  def _whole(self, idx, what: str) -> None:
    if idx is Ellipsis or (isinstance(idx, tuple) and (not idx or all(
        isinstance(i, slice) and i == slice(None) for i in idx))):
      return
    raise self._refuse(what)

  def __getitem__(self, idx):
    self._whole(idx, "A windowed load")
    v = self._base[...]
    data = v._data if isinstance(v, Array) else np.asarray(v)
    out = None if data is None else ref_maps.bitcast_data(data, self._base.dtype, self.dtype, -2)
    if not isinstance(v, Array):
      return out
    return Array(out, self.shape, self.dtype, v._ready)

  def __setitem__(self, idx, value):
    self._whole(idx, "A windowed store")
    if not isinstance(value, Array):
      value = np.broadcast_to(np.asarray(value, self.dtype), self.shape)
      self._base[...] = ref_maps.bitcast_data(value, self.dtype, self._base.dtype, -2)
      return
    if value.shape != self.shape or value.dtype != self.dtype:
      raise ShapeError(f"Store of {value.dtype}{list(value.shape)} into {self!r}{_where()}: expected "
                       f"{self.dtype}{list(self.shape)}. Fix: cast or broadcast the value first. "
                       f"({user_frame_summary()})")
    data = None if value._data is None else \
        ref_maps.bitcast_data(value._data, self.dtype, self._base.dtype, -2)
    self._base[...] = Array(data, self._base.shape, self._base.dtype, value._ready)

  def bitcast(self, dtype):
    raise self._refuse(f"A bitcast to {dt.canonicalize(dtype)}")

  def reshape(self, *shape):
    raise self._refuse("A reshape")


class _PackedAt:
  __slots__ = ("_ref",)

  def __init__(self, ref):
    self._ref = ref

  def __getitem__(self, idx):
    self._ref._whole(idx, "A window (.at[...])")
    return self._ref
