"""What a vector load or store of a ref may reach and what a store writes (L4a): the memory-space
rules of vector access and the coercion of a stored value to the ref's dtype and shape (refs.Ref's
loads and stores)."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.core import MemorySpace, is_hbm
from palace._src.errors import MemorySpaceError, ShapeError, UsageError
from palace._src.lang import numpy_dtypes
from palace._src.lang.array import Array, WeakArray
from palace._src.lang.numpy_indexing import _where
from palace._src.util import user_frame_summary

_VMEM = MemorySpace.VMEM


def check_access(ref, what: str, scalar: bool) -> None:
  """A load or store of `ref` from the vector unit (`scalar`: of one element): refused, with the fix,
  where its memory space cannot be reached so (HBM/ANY, host memory, semaphores, SMEM vectors)."""
  space = ref.buf.memory_space
  if space is _VMEM:
    return
  if is_hbm(space):
    raise MemorySpaceError(
        f"{what} of {ref.buf.name} ({space}) from the vector unit{_where()}: buffers in HBM/ANY "
        f"cannot be referenced directly. Fix: copy a block into VMEM with pltpu.sync_copy / "
        f"pltpu.async_copy (or use a VMEM BlockSpec). ({user_frame_summary()})")
  if space is MemorySpace.HOST:
    raise MemorySpaceError(
        f"{what} of {ref.buf.name} (host memory) from the vector unit{_where()}: a kernel reaches the "
        f"host's pinned memory (pl.HOST) by DMA only. Fix: copy it into VMEM (or HBM) with "
        f"pltpu.sync_copy / pltpu.async_copy first. ({user_frame_summary()})")
  if space == MemorySpace.SEMAPHORE:
    raise MemorySpaceError(f"{what} of semaphore {ref.buf.name}{_where()}: semaphores are not data. Fix: "
                           f"use pl.semaphore_read / pl.semaphore_signal / pl.semaphore_wait.")
  if space == MemorySpace.SMEM and not scalar:
    raise MemorySpaceError(
        f"Vector {what.lower()} of {ref.origin()} (shape {ref.shape}) in SMEM{_where()}: SMEM holds "
        f"scalars only. Fix: index down to a single element (e.g. ref[i, j]) or put the array in VMEM. "
        f"({user_frame_summary()})")


def coerce_store(view, value, timing_only: bool):
  """(data, ready) for storing `value` into `view`: dtype must match (weak scalars are cast)."""
  d = view.buf.dtype
  if type(value) is WeakArray and value.dtype != d and (dt.is_float(d) or not dt.is_float(value.dtype)):
    # a weakly typed value (jnp.full(s, 10)) is cast to the ref's dtype, as JAX does (a float into an
    # integer ref stays an error, as for a Python float)
    data = None if value._data is None else numpy_dtypes._convert(value._data, d)
    value = WeakArray(data, value.shape, d, value._ready)
  if isinstance(value, Array):
    if value.dtype != d:
      raise ShapeError(
          f"Cannot store a value of dtype {value.dtype} into {view.origin()} of dtype {d}{_where()}: "
          f"stores require the ref's dtype. Fix: use .astype({d.name}). ({user_frame_summary()})")
    vshape, data, ready = value.shape, value._data, value._ready
  elif isinstance(value, (bool, int, float, np.generic)):
    if isinstance(value, np.generic) and dt.canonicalize(value.dtype) != d:
      raise ShapeError(f"Cannot store a {value.dtype} scalar into {view.origin()} of dtype {d}"
                       f"{_where()}. Fix: cast it first, e.g. jnp.{d.name}(value). ({user_frame_summary()})")
    if type(value) is float and not dt.is_float(d):
      raise ShapeError(f"Cannot store the Python float {value!r} into {view.origin()} of dtype {d}"
                       f"{_where()}: stores require the ref's dtype; expected an int. Fix: store an int, or "
                       f"round explicitly (int(x), jnp.round). ({user_frame_summary()})")
    try:
      data = np.asarray(value, dtype=d)
    except OverflowError:
      raise ShapeError(f"Cannot store the Python int {value!r} into {view.origin()} of dtype {d}"
                       f"{_where()}: out of range for {d}. Fix: store a value that fits {d}, or use a wider "
                       f"ref. ({user_frame_summary()})") from None
    vshape, ready = (), 0
  elif isinstance(value, np.ndarray):
    raise UsageError(f"Storing a NumPy array into {view.origin()} inside a kernel: kernels cannot close "
                     f"over array constants. Fix: pass the array as an input instead.")
  else:
    raise ShapeError(f"Cannot store a {type(value).__name__} into {view.origin()}{_where()}. Fix: store a "
                     f"kernel value (jnp array), a NumPy scalar or a Python number.")
  if vshape != view.shape:
    try:
      bshape = np.broadcast_shapes(vshape, view.shape)
    except ValueError:
      bshape = None
    if bshape != view.shape:
      raise ShapeError(
          f"Cannot store a value of shape {vshape} into {view.origin()} of shape {view.shape}"
          f"{_where()}: shapes must match or broadcast. Fix: store a value of shape {view.shape}, or index "
          f"the ref down to the value's shape. ({user_frame_summary()})")
    if data is not None and not timing_only:
      data = np.broadcast_to(data, view.shape)
  if timing_only and view.shape:
    data = None
  return data, ready
