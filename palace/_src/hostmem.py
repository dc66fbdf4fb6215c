"""Recycled host arrays for palace's own temporaries (L0).

Fresh memory is expensive on the machines palace runs on: the first touch of every page faults, and a
4 MiB array costs ~0.7 ms to fill the first time against ~0.2 ms when its pages are already mapped. The
deferred matmul sums (lang/deferred.py) widen bf16 operand spans into float32 arrays that live for one
launch; handing those arrays to the next launch instead of to the allocator keeps their pages mapped.

This is a process-wide free list, like the BLAS thread pool it sits beside: it holds no simulator state
and never changes a result (an array is only handed out for a caller to overwrite completely). It holds
at most MAX_BYTES and takes an array back only when nothing else references it.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

MAX_BYTES = 96 * 2**20

_lock = threading.Lock()
_free: dict = {}      # (shape, dtype) -> [arrays]
_held = [0]           # bytes on the free lists


def take(shape, dtype) -> np.ndarray:
  """An array of this shape and dtype with unspecified contents (recycled when possible)."""
  key = (tuple(shape), np.dtype(dtype))
  with _lock:
    arrays = _free.get(key)
    if arrays:
      arr = arrays.pop()
      _held[0] -= arr.nbytes
      return arr
  return np.empty(shape, dtype)


def give_back(arrays: list) -> None:
  """Return arrays made by `take` once their user is done (the list is emptied)."""
  with _lock:
    while arrays:
      arr = arrays.pop()
      # referenced only by this frame and getrefcount's argument: nobody can still read it
      if arr.base is not None or sys.getrefcount(arr) > 2 or _held[0] + arr.nbytes > MAX_BYTES:
        continue
      arr.flags.writeable = True
      _free.setdefault((arr.shape, arr.dtype), []).append(arr)
      _held[0] += arr.nbytes
