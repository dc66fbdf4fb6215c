"""Host BLAS threading for block-sized matmuls (L0).

OpenBLAS (NumPy's BLAS) runs every product on all its threads. For kernel-block-sized products that
costs more than it saves, and on a busy machine it collapses: a 128^3 product measured 27 us idle but
4.6 ms per grid step with other processes on the cores, against 0.3 ms single-threaded. So products
below `SMALL_MATMUL_FLOPS` run with one BLAS thread; large ones keep NumPy's setting. The switch uses
threadpoolctl's handle on the loaded BLAS (a core dependency); should it be missing or unable to
inspect the BLAS, palace leaves BLAS threading alone.
"""
from __future__ import annotations

import contextlib

import numpy as np

SMALL_MATMUL_FLOPS = 2 * 512 * 512 * 256   # below this, one BLAS thread is faster on 2 cores

_controllers = None


def _blas_controllers():
  global _controllers  # a lazily built handle on process-wide libraries, not simulator state
  if _controllers is None:
    try:
      from threadpoolctl import ThreadpoolController
      _controllers = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    except Exception:  # noqa: BLE001  threadpoolctl missing or unable to inspect: leave BLAS alone
      _controllers = []
  return _controllers


_kernel_threads = []  # per enclosing launch: [saved counts, counts set now] (process-wide, like BLAS)


class kernel_mode:
  """`with kernel_mode():` around a launch: each product runs on the thread count of its size class
  (one thread below SMALL_MATMUL_FLOPS, the saved count above), switching only when the class
  changes, so a kernel of block-sized products switches once and one of large products never. The
  saved counts come back at the end. (Switching around every large product cost up to 2x on kernels
  run in core threads. A class, not a generator context manager: entered once per launch.)"""
  __slots__ = ("state",)

  def __enter__(self):
    # [saved counts, counts set now], both read at the launch's first product (`matmul`): a launch
    # without one never asks the BLAS (threadpoolctl's queries cost microseconds each)
    self.state = [None, None]
    _kernel_threads.append(self.state)

  def __exit__(self, *exc):
    _kernel_threads.pop()
    saved, now = self.state
    if saved is not None and now != saved:
      _set_counts(_blas_controllers(), saved)


@contextlib.contextmanager
def _threads(counts):
  ctrls = _blas_controllers()
  now = [c.num_threads for c in ctrls]
  _set_counts(ctrls, counts)
  try:
    yield
  finally:
    _set_counts(ctrls, now)


def _set_counts(ctrls, counts) -> None:
  """Give each BLAS controller its count, setting only those that differ."""
  for c, n in zip(ctrls, counts):
    if c.num_threads != n:
      c.set_num_threads(n)


def single_threaded():
  return _threads([1] * len(_blas_controllers()))


def matmul(a, b, out=None):
  """np.matmul on one BLAS thread below SMALL_MATMUL_FLOPS, on the usual threads above it."""
  m, k = a.shape[-2], a.shape[-1]
  n = b.shape[-1]
  batch = a.size // (m * k) if m * k else 1
  small = 2 * batch * m * k * n < SMALL_MATMUL_FLOPS
  if _kernel_threads:  # inside a launch: switch only when the size class changes
    ctrls = _blas_controllers()
    if ctrls:
      state = _kernel_threads[-1]
      if state[0] is None:
        state[0] = [c.num_threads for c in ctrls]
        state[1] = list(state[0])
      want = [1] * len(ctrls) if small else state[0]
      if state[1] != want:
        for c, w in zip(ctrls, want):
          c.set_num_threads(w)
        state[1] = list(want)
    return np.matmul(a, b, out=out)
  if small and _blas_controllers():
    with single_threaded():
      return np.matmul(a, b, out=out)
  return np.matmul(a, b, out=out)
