"""Host BLAS threading for block-sized matmuls (L0).

OpenBLAS (NumPy's BLAS) runs every product on all its threads. For kernel-block-sized products that
costs more than it saves, and on a busy machine it collapses: a 128^3 product measured 27 us idle but
4.6 ms per grid step with other processes on the cores, against 0.3 ms single-threaded. So products
below `SMALL_MATMUL_FLOPS` run with one BLAS thread; large ones keep NumPy's setting. The switch uses
threadpoolctl's handle on the loaded BLAS when threadpoolctl is installed (the `perf`, `test` and `cli`
extras include it); without it palace leaves BLAS threading alone.
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


@contextlib.contextmanager
def single_threaded():
  ctrls = _blas_controllers()
  saved = [c.num_threads for c in ctrls]
  for c in ctrls:
    if c.num_threads != 1:
      c.set_num_threads(1)
  try:
    yield
  finally:
    for c, n in zip(ctrls, saved):
      if n != 1:
        c.set_num_threads(n)


def matmul(a, b):
  """np.matmul, single-threaded below SMALL_MATMUL_FLOPS."""
  m, k = a.shape[-2], a.shape[-1]
  n = b.shape[-1]
  batch = a.size // (m * k) if m * k else 1
  if 2 * batch * m * k * n < SMALL_MATMUL_FLOPS and _blas_controllers():
    with single_threaded():
      return np.matmul(a, b)
  return np.matmul(a, b)
