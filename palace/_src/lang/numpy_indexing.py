"""Indexing palace values (L4a): `x[idx]` and `x.at[idx].set(...)` with static indices.

Runtime indices belong on refs (`ref[pl.ds(i, n)]`) or in `lax.dynamic_slice`.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.executor import OpClass
from palace._src.errors import OutOfBoundsError, UsageError
from palace._src.lang.array import Array, ready_of
from palace._src.lang.numpy_base import _broadcast_shapes, _compute_dtype, _has_data, _np, _out
from palace._src.lang.numpy_shape import _shape_op
from palace._src.util import user_frame_summary


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


def _array_getitem(self, idx):
  """Static indexing of a value (slices, ints, None, Ellipsis); dynamic indices need refs + pl.ds.
  Costs an XLU relayout, unless it only selects whole vregs (`_whole_vregs`): then nothing."""
  idx, shape = _static_index(self.shape, idx)
  free = _whole_vregs(self.shape, idx, dt.packing(self.dtype))
  return _shape_op(self, lambda v: v[idx], shape, OpClass.FREE if free else OpClass.XLU)


def _whole_vregs(shape, idx, pack: int) -> bool:
  """True when `x[idx]` only picks whole vregs of x, so no data moves: Mosaic lowers a slice whose
  minor-two-dim offsets and sizes are multiples of the native (8 * packing, 128) tiling by taking the
  sub-array of the operand's vregs, without touching any (apply_vector_layout's
  vector.extract_strided_slice rule, jax-ml/jax jaxlib/mosaic/dialect/tpu/transforms). Leading dims
  index vregs directly (ints and unit-step slices are free there); a slice may end at its dim's end
  (the last, partial tile is the operand's own). None (new axes), strides, ints on the minor two dims
  and other indices move data."""
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
        if start % tile or (stop % tile and stop != size):
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
