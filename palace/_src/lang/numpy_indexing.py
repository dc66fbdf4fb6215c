"""Indexing palace values (L4a): `x[idx]` and `x.at[idx].set(...)` with static indices.

Runtime indices belong on refs (`ref[pl.ds(i, n)]`) or in `lax.dynamic_slice`.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.executor import OpClass
from palace._src.errors import OutOfBoundsError, UnsupportedError, UsageError
from palace._src.lang.array import Array, ready_of
from palace._src.lang.numpy_base import _broadcast_shapes, _compute_dtype, _has_data, _np, _out
from palace._src.lang.numpy_shape import _shape_op, reshape
from palace._src.util import keep, user_frame_summary


def _where() -> str:
  """' <grid point, core, chip, kernel>' of the running core, for error messages ('' outside one)."""
  ex = executor.maybe_current()
  return (" " + ex.where()) if ex is not None else ""


def _static_index(shape, idx):
  """(idx as a tuple, shape of x[idx]) for a static index; runtime indices and bad ones are errors."""
  if not isinstance(idx, tuple):
    idx = (idx,)
  for i in idx:
    if isinstance(i, Array):
      raise UsageError(f"Indexing a value with a runtime index is not supported in kernels "
                       f"({user_frame_summary()}). Fix: store the value in a ref and index the ref with "
                       f"pl.ds(start, size), or use lax.dynamic_slice.")
  _check_static(shape, idx)
  try:
    probe = np.broadcast_to(np.zeros((), np.int8), shape)[idx]
  except IndexError as e:
    if str(e).startswith("only integers"):
      raise UsageError(f"Index {idx!r} of a value of shape {shape}: {e}. Fix: index with ints, "
                       f"slices, None or ... ({user_frame_summary()})") \
          from None
    raise OutOfBoundsError(f"Index {idx!r} out of bounds for a value of shape {shape}: {e}. Fix: "
                           f"keep each index inside its dimension. ({user_frame_summary()})") from None
  return idx, probe.shape


_SIMPLE = (int, np.integer, slice, type(None), type(Ellipsis))


def _check_static(shape, idx) -> None:
  """Slices of a value are bounds-checked like refs' (validate.static_slice: no silent clipping) and
  non-integer indices are errors; ints are left to NumPy's own check (raised as OutOfBoundsError)."""
  for i in idx:
    if type(i).__name__ == "Slice" and hasattr(i, "stride"):
      raise UsageError(f"Index [{validate.fmt_index(idx)}] of a value of shape {shape}{_where()} at "
                       f"{user_frame_summary()}: pl.ds indexes refs, not values (as in JAX). Fix: "
                       f"use a static slice (v[8:16]) or lax.dynamic_slice, or index the ref.")
    if isinstance(i, (float, np.floating)) or type(i) is bool:
      raise UsageError(f"Index {i!r} of a value of shape {shape}{_where()} at {user_frame_summary()}: "
                       f"indices must be integers (floats are never truncated, bools are not masks "
                       f"here). Fix: pass an int.")
  if not all(isinstance(i, _SIMPLE) for i in idx):
    return   # advanced (array) indices: NumPy's rules
  n_axes = sum(1 for i in idx if i is not None and i is not Ellipsis)
  axis = 0
  for i in idx:
    if i is Ellipsis:
      axis += len(shape) - n_axes
    elif i is not None:
      if type(i) is slice and axis < len(shape):
        validate.static_slice(i, shape[axis], lambda: f"Index [{validate.fmt_index(idx)}] (axis "
                              f"{axis} of a value of shape {shape}){_where()} at "
                              f"{user_frame_summary()}")
      axis += 1


def plain_index(t: tuple):
  """The index `t` with each `:` as None, a memo key on every Python (slices are unhashable before
  3.12), or None when it holds a slice with bounds (their types are not in the index's, and 1.0 == 1:
  such an index is never a memo key). Keys also hold the entries' types, so a None that was `:` stays
  apart from a None that is a new axis."""
  plain = []
  for i in t:
    if type(i) is slice:
      if i.start is not None or i.stop is not None or i.step is not None:
        return None
      i = None
    plain.append(i)
  return tuple(plain)


# (value shape, index with each ':' as None, index types, dtype) -> (index, result shape, how): a memo of
# _array_getitem's checks for indices of ints, None, '...' and ':' (a bounded slice's bounds are not in
# its type, and 1.0 == 1: such indices are checked every time); `how` is "reshape", "free" or "xlu"
_GETITEMS: dict = {}
_MEMO_KINDS = frozenset({int, slice, type(None), type(Ellipsis)})


def _array_getitem(self, idx):
  """Static indexing of a value (slices, ints, None, Ellipsis); dynamic indices need refs + pl.ds.
  Costs an XLU relayout, unless it only selects whole vregs (`_whole_vregs`): then nothing."""
  t = idx if type(idx) is tuple else (idx,)
  kinds = tuple(map(type, t))
  key = None
  if _MEMO_KINDS.issuperset(kinds):   # (`m[:, None]` on every grid step of a kernel)
    plain = plain_index(t) if slice in kinds else t
    if plain is not None:
      key = (self.shape, plain, kinds, self.dtype)
  hit = None if key is None else _GETITEMS.get(key)
  if hit is not None:
    idx, shape, how = hit
  else:
    idx, shape = _static_index(self.shape, idx)
    if all(i is None or i is Ellipsis or i == slice(None) for i in idx) and None in idx:
      how = "reshape"   # only new unit axes (x[:, None]): a reshape, costed as one
    else:
      how = "free" if _whole_vregs(self.shape, idx, dt.packing(self.dtype)) else "xlu"
    if key is not None:
      keep(_GETITEMS, key, (idx, shape, how))
  if how == "reshape":
    return reshape(self, shape)
  return _shape_op(self, lambda v: v[idx], shape, OpClass.FREE if how == "free" else OpClass.XLU)


def _whole_vregs(shape, idx, pack: int) -> bool:
  """True when `x[idx]` only picks whole vregs of x, so no data moves: Mosaic lowers a slice whose
  minor-two-dim offsets and sizes are multiples of the native (8 * packing, 128) tiling by taking the
  sub-array of the operand's vregs, without touching any (apply_vector_layout's
  vector.extract_strided_slice rule, jax-ml/jax jaxlib/mosaic/dialect/tpu/transforms). Leading dims
  index vregs directly (ints and unit-step slices are free there); a slice that starts on a tile may
  end anywhere (its last, partial tile is the operand's own vreg: measured on a v5e, `x[:, 0:1]`
  broadcast back across lanes costs what a loaded column's broadcast does, benchmarks/hw loop_chain
  and step_chain `colbcast`). None (new axes), strides, ints on the minor two dims and other indices
  move data."""
  if len(shape) < 2:
    return False
  full = []
  for i in idx:
    if i is Ellipsis:
      full += [slice(None)] * (len(shape) - (len(idx) - 1))
    else:
      full.append(i)
  full += [slice(None)] * (len(shape) - len(full))
  if len(full) != len(shape):
    return False   # (None in the index: a new axis)
  n = len(shape)
  for d, (i, size) in enumerate(zip(full, shape)):
    if type(i) is slice:
      start, stop, step = i.indices(size)
      if step != 1:
        return False
      if d >= n - 2:
        tile = 128 if d == n - 1 else 8 * pack
        if start % tile:
          return False
    elif not (isinstance(i, (int, np.integer)) and d < n - 2):
      return False
  return True


class _ValueAt:
  """`x.at[idx].set(v)` / `.add` / `.multiply` / `.min` / `.max` / `.get()` with a static index."""
  __slots__ = ("_x", "_idx")

  def __init__(self, x, idx=None):
    self._x, self._idx = x, idx

  def __getitem__(self, idx):
    return _ValueAt(self._x, idx)

  def get(self):
    return self._x[self._idx]

  def _update(self, value, fn):
    x = self._x
    idx, shape = _static_index(x.shape, self._idx)
    _broadcast_shapes("at[].set", (value, np.empty(shape, np.int8)))
    data = None
    if _has_data(x, value):
      cd = _compute_dtype(x.dtype)
      data = np.array(_np(x, cd), copy=True)
      upd = _np(value, cd)
      data[idx] = upd if fn is None else fn(data[idx], upd)
      data = data.astype(x.dtype, copy=False)
    return _out(data, x.shape, x.dtype, ready_of(x, value), OpClass.CHEAP, True)

  def set(self, value):
    return self._update(value, None)

  def add(self, value):
    return self._update(value, np.add)

  def multiply(self, value):
    return self._update(value, np.multiply)

  def min(self, value):  # noqa: A003
    return self._update(value, np.minimum)

  def max(self, value):  # noqa: A003
    return self._update(value, np.maximum)


Array.__getitem__ = _array_getitem
Array.at = property(lambda self: _ValueAt(self))


def take_along_axis(arr, indices, axis):
  """`jnp.take_along_axis` of a kernel value along one of its two minor dims (on a TensorCore; any
  axis on a SparseCore vector subcore, as JAX's SparseCore tests take it), with `indices` of the
  value's shape but along that axis, where they may be longer or shorter (the result has their
  shape: JAX's tpu_ops_test gathers a 32-row result from an 8-row value): Mosaic's in-register
  gather (`tpu.dynamic_gather`, an XLU op; measured on a TPU v5e: take_along_axis on the lane axis
  compiles, a gather of rows by an index vector does not). The
  gather has no fill: an index outside the axis is an error."""
  if not isinstance(arr, Array) or not isinstance(indices, Array):
    raise UsageError(f"jnp.take_along_axis takes kernel values (arrays loaded from refs){_where()} "
                     f"({user_frame_summary()}). Fix: load them with ref[...] first.")
  shape, rank = arr.shape, len(arr.shape)
  ax = validate.as_int(axis, "jnp.take_along_axis(axis)")
  ax = ax + rank if ax < 0 else ax
  ishape = tuple(indices.shape)
  if not dt.is_int(indices.dtype) or rank < 1 or not 0 <= ax < rank or len(ishape) != rank or \
      any(i != n for k, (i, n) in enumerate(zip(ishape, shape)) if k != ax) or not ishape[ax]:
    raise UsageError(f"jnp.take_along_axis{_where()} ({user_frame_summary()}): indices {indices.dtype}"
                     f"{list(indices.shape)} for a value {arr.dtype}{list(shape)} along axis {axis}; "
                     f"expected integer indices of the value's shape but along the axis, and an axis "
                     f"of it. Fix: broadcast the indices to the value's shape (jnp.broadcast_to) but "
                     f"along the gather axis.")
  ex = executor.maybe_current()
  if ax < rank - 2 and (ex is None or ex.sparsecore is None):   # (a SparseCore gathers along any axis)
    raise UnsupportedError(
        f"jnp.take_along_axis along axis {ax} of a rank-{rank} value{_where()} "
        f"({user_frame_summary()}): the TPU compiler gathers only along the two minor dims on a "
        f"TensorCore (Mosaic: 'Only gathers along the two minormost dimensions supported on TC'). Fix: "
        f"move the axis last with jnp.transpose, or gather with DMAs from a ref.")
  data = None
  if _has_data(arr, indices):
    given = _np(indices, np.int64)
    idx = np.where(given < 0, given + shape[ax], given)
    bad = (idx < 0) | (idx >= shape[ax])
    if bad.any():
      raise OutOfBoundsError(
          f"jnp.take_along_axis{_where()} ({user_frame_summary()}): index {int(given[bad][0])} is "
          f"outside axis {ax} of size {shape[ax]}; the TPU's in-register gather has no fill for it. "
          f"Fix: clamp the indices (jnp.clip) or take them modulo {shape[ax]}.")
    data = np.take_along_axis(arr._data, idx, axis=ax)
  return _out(data, ishape, arr.dtype, ready_of(arr, indices), OpClass.XLU, True)
