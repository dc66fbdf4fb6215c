"""Host memory (L0): recycled arrays for palace's own temporaries, and the C allocator's tuning (below).

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


# ------------------------------------------------------------------ the C allocator
# glibc's malloc maps arrays from 128 KiB up (a (128, 256) float32 block is 128 KiB) as fresh mmap
# regions and gives the heap top back to the kernel whenever more than a few hundred KiB is free there.
# It adapts (each freed mapping raises both thresholds to its size), so a process that has run a kernel
# for a while stops faulting; but every new block size, and every launch whose temporaries outgrow the
# last, faulted its pages in again (first touch of a page costs ~1.6 us, ~8x writing it). Raising both
# thresholds up front keeps freed block-sized memory mapped for the next array: 8 different kernels
# launched once each in a fresh process, 1800-2300 minor faults -> 70-200 and 1.2-1.6x faster; a repeated
# launch of one kernel is unchanged (`python -m benchmarks.host_numpy`); `palace demo` 7.1 -> 6.8 s.
# Like the BLAS thread count (blas.py) this is process-wide host tuning: it never changes a result; it
# keeps at most TRIM_THRESHOLD_BYTES of freed memory per malloc arena. Arrays above MMAP_THRESHOLD_BYTES
# (HBM operands) still get their own mappings, returned to the system when freed.
MMAP_THRESHOLD_BYTES = 32 * 2**20     # glibc's largest allowed value on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 128 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt parameter numbers (glibc malloc.h)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_tuned = []   # [outcome] once tried (process-wide, like the BLAS handle: not simulator state)


def tune_allocator() -> str:
  """Once per process, when a virtual TPU is made: raise glibc malloc's mmap and trim thresholds (see
  above). Left alone when the C library is not glibc, when the user set any MALLOC_*_ variable, or with
  PALACE_MALLOC_TUNING=0. Returns what was done ("tuned", "disabled", "user settings", "not glibc")."""
  if _tuned:
    return _tuned[0]
  with _lock:
    if not _tuned:
      _tuned.append(_tune())
  return _tuned[0]


def _tune() -> str:
  import ctypes  # noqa: PLC0415
  import os  # noqa: PLC0415
  import platform  # noqa: PLC0415
  if os.environ.get("PALACE_MALLOC_TUNING", "1") == "0":
    return "disabled"
  if any(v in os.environ for v in _USER_SETTINGS):
    return "user settings"
  if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
    return "not glibc"
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (OSError, AttributeError):
    return "not glibc"
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
  ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
  return "tuned" if ok else "not glibc"
