"""Indexed (gather/scatter) views for SparseCore DMAs (L4a).

`hbm.at[idx_ref]` with a 1-D int32 index ref (or value, or `plsc.Indices(values, ignored_value)`)
selects rows of the major dimension; further entries slice the minor dimensions. As a DMA source it
gathers, as a destination it scatters (`add=True`: scatter-add). Entries equal to `ignored_value`
are skipped on both sides.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from palace._src import executor
from palace._src.core import MemorySpace
from palace._src.errors import OutOfBoundsError, UnsupportedError, UsageError
from palace._src.lang.array import Array
from palace._src.util import prod


# Mosaic's rules for SparseCore scatter/gather DMAs (jax/_src/pallas/mosaic/sc_lowering.py), checked
# when palace issues one and, for JAX kernels, when palace.jax lowers them (rules_sc.check_kernel)
_FAR = (MemorySpace.HBM, MemorySpace.ANY, MemorySpace.VMEM_SHARED)


def check_index_source(shape, space, origin: str) -> None:
  """The index vector of an indexed DMA (`space`: its memory space, None for a value): 1-D, in VMEM."""
  if len(shape) != 1:
    raise UnsupportedError(f"Only 1D indices are supported by scatter/gather DMAs on a SparseCore "
                           f"(Mosaic): {origin} is indexed by one of shape {tuple(shape)}. Fix: index "
                           f"with a 1-D ref or vector.")
  if space is not None and space is not MemorySpace.VMEM:
    raise UnsupportedError(f"The indices of a scatter/gather DMA must be in VMEM, got {space.name} "
                           f"({origin}; Mosaic). Fix: copy the indices into a VMEM ref first.")


def transform_after_indexer(origin: str) -> UnsupportedError:
  return UnsupportedError(f"{origin}: the indexed ref of a scatter/gather DMA cannot have any "
                          f"transforms following the indexer (Mosaic). Fix: apply the slice, reshape "
                          f"or bitcast to the ref before indexing it with the index vector.")


def check_indexed_copy(s_space, d_space, src_indexed: bool, dst_indexed: bool, src_origin: str,
                       dst_origin: str, where: str) -> None:
  """A DMA with an indexed side: a gather from HBM / VMEM_SHARED into VMEM indexes its source only, a
  scatter from VMEM into HBM / VMEM_SHARED its destination only; no other pair of spaces."""
  if s_space in _FAR and d_space is MemorySpace.VMEM:
    if dst_indexed:
      raise UsageError(f"A gather DMA into {dst_origin} ({where}): only the source ref can be indexed "
                       f"when gathering from HBM/VMEM_SHARED into VMEM (Mosaic). Fix: gather into a "
                       f"plain VMEM ref, then scatter from it in a second copy.")
  elif s_space is MemorySpace.VMEM and d_space in _FAR:
    if src_indexed:
      raise UsageError(f"A scatter DMA from {src_origin} ({where}): only the destination ref can be "
                       f"indexed when scattering from VMEM into HBM/VMEM_SHARED (Mosaic). Fix: gather "
                       f"into a plain VMEM ref first.")
  else:
    name = {MemorySpace.ANY: "HBM"}
    raise UnsupportedError(
        f"Scatter/gather DMA from {name.get(s_space, s_space.name)} to {name.get(d_space, d_space.name)} "
        f"is not supported ({where}): a SparseCore indexes HBM or VMEM_SHARED against its VMEM "
        f"(Mosaic). Fix: gather into, or scatter from, a VMEM ref.")


@dataclasses.dataclass(frozen=True)
class Indices:
  """`plsc.Indices(values, ignored_value=None)`: an index vector whose `ignored_value` entries are
  skipped by indexed DMAs."""
  values: object
  ignored_value: int | None = None


def is_index_source(x) -> bool:
  from_ref = hasattr(x, "buf") and hasattr(x, "_np_index")
  return isinstance(x, Indices) or from_ref or (isinstance(x, Array) and x.ndim == 1)


class IndexedRef:
  """Rows `indices` of `base` (a Ref view), then `rest` applied to the minor dims."""
  __slots__ = ("base", "source", "ignored", "rest_view")

  def __init__(self, base, idx, rest=()):
    if isinstance(idx, Indices):
      self.source, self.ignored = idx.values, idx.ignored_value
    else:
      self.source, self.ignored = idx, None
    if base.ndim < 1:
      raise UsageError(f"Indexed access of {base.origin()}: the ref needs a major dimension. Fix: "
                     f"reshape the ref to at least rank 1 (.reshape(1, ...)).")
    src = self.source
    check_index_source(tuple(src.shape), getattr(getattr(src, "buf", None), "memory_space", None),
                       base.origin())
    self.base = base
    # minor-dim slicing is applied to a row view to validate it and get the window per row
    self.rest_view = base.at[(0,) + tuple(rest)] if rest else base.at[0]

  @property
  def buf(self):
    return self.base.buf

  @property
  def dtype(self):
    return self.base.dtype

  @property
  def n(self) -> int:
    src = self.source
    return int(src.shape[0])

  @property
  def shape(self):
    return (self.n,) + tuple(self.rest_view.shape)

  @property
  def nbytes(self) -> int:
    return prod(self.shape) * self.base.dtype.itemsize

  def origin(self) -> str:
    return f"{self.base.origin()}.at[indices]"

  def _transformed(self, *_, **__):
    raise transform_after_indexer(self.origin())

  at = property(_transformed)
  reshape = bitcast = _transformed

  def rows(self, ex):
    """(absolute row numbers in the buffer, mask of used entries or None)."""
    src = self.source
    if isinstance(src, Array):
      vals = src._data
    else:
      vals, _ = ex.load(src.buf, src._np_index, src.shape)
    if vals is None:  # timing-only: indices unknown, data movement is skipped anyway
      vals = np.zeros(self.n, np.int32)
    vals = np.asarray(vals).reshape(-1).astype(np.int64)
    mask = None if self.ignored is None else vals != self.ignored
    d0 = self.base.dims[self._major()]
    used = vals if mask is None else vals[mask]
    if ex.bounds_checks and used.size and (used.min() < 0 or used.max() >= d0[1]):
      bad = int(used[(used < 0) | (used >= d0[1])][0])
      raise OutOfBoundsError(
          f"Indexed DMA of {self.base.origin()} {ex.where()}: index {bad} is out of bounds for a major "
          f"dimension of size {d0[1]}. Fix: keep indices in 0..{d0[1] - 1}, or use "
          f"plsc.Indices(idx, ignored_value=...) to skip entries.")
    return d0[0] + vals * d0[2], mask

  def _major(self) -> int:
    """The buffer dimension the index vector selects along: the view's first (the base may be a view
    with leading dimensions indexed away, `x.at[1, 2].at[idx]`)."""
    return next(k for k, d in enumerate(self.base.dims) if type(d) is not int)

  def fancy_index(self, rows, mask):
    """NumPy index selecting the used rows and the minor window (the base view's indexed-away
    leading dimensions stay integers: with the row vector they are one advanced index, whose rows
    lead the result)."""
    sel = rows if mask is None else rows[mask]
    k = self._major()
    index = tuple(self.rest_view._np_index)
    return index[:k] + (sel,) + index[k + 1:]


def make_indexed(base, idx):
  if not isinstance(idx, tuple):
    idx = (idx,)
  if executor.maybe_current() is None:
    raise UsageError("Indexed ref views exist only inside kernels (as SparseCore DMA operands). Fix: index the "
                     "ref inside the kernel body.")
  return IndexedRef(base, idx[0], idx[1:])
