"""Host work per grid step, counted (not timed): Python bytecodes and Python-level calls per step of
two kernels, so two trees can be compared exactly on any machine, however busy.

Run from the repo root:  python -m benchmarks.step_profile
Compare another checkout:  PYTHONPATH=/path/to/other python benchmarks/step_profile.py
(the file imports only palace's public API and the benchmark kernels, which older trees have too;
its `benchmarks` package then comes from that tree).

Kernels: the (8, 128) f32 copy kernel of benchmarks.speed (512 steps), the 1024^3 f32 tiled matmul
in 128^3 blocks under timing_only (512 steps), the same matmul with data in 256^3 blocks (issue 35's
first row: 64 steps, the launch and its deferred sums' GEMM bookkeeping included; BLAS held to one
thread with threadpoolctl while counted, so that every conversion runs on the calling thread in a fixed
order), and benchmarks.allgather_64's ring all-gather on 16 chips
of 16 KiB shards (counted per remote DMA: 240, with the launch, the chip threads and the check). Counts come from sys.settrace opcode events and
sys.setprofile call events over the second of two identical launches (the first warms the caches);
they are deterministic for a given Python version. Wall time follows them closely but not exactly
(C-level work such as NumPy and the cyclic GC is not counted).
"""
from __future__ import annotations

import sys
import threading

import numpy as np

import palace as pl
# the kernels benchmarks.speed and benchmarks.kernels time (present, unchanged, in older trees too)
from benchmarks.kernels import tiled_matmul
from benchmarks.speed import _copy_kernel


def _copy(n=512):
  x = np.ones((8 * n, 128), np.float32)
  f = pl.pallas_call(_copy_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))

  def run():
    with pl.virtual_tpu("v5e"):
      return f(x)
  return run, n


def _matmul(n=1024, b=128):
  x = (np.arange(n * n) % 7).reshape(n, n).astype(np.float32)

  def run():
    with pl.virtual_tpu("v5e", timing_only=True):
      return tiled_matmul(x, x, b)
  return run, (n // b) ** 3


def _matmul_data(n=1024, b=256):
  x = (np.arange(n * n) % 7 - 3).reshape(n, n).astype(np.float32)

  def run():
    try:
      from threadpoolctl import threadpool_limits  # noqa: PLC0415
    except ImportError:
      limit = None
    else:
      limit = threadpool_limits(1)
    try:
      with pl.virtual_tpu("v5e"):
        return tiled_matmul(x, x, b)
    finally:
      if limit is not None:
        limit.restore_original_limits()
  return run, (n // b) ** 3


def _allgather(chips=16, shard_kib=16):
  from benchmarks.allgather_64 import run as all_gather  # noqa: PLC0415

  def run():
    return all_gather(chips, shard_kib)
  return run, chips * (chips - 1)   # per remote DMA


def count(run) -> tuple[int, int]:
  """(bytecodes, Python calls) of one call of `run` (all threads)."""
  ops = [0]
  calls = [0]

  def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
      ops[0] += 1
    return trace

  def profile(frame, event, arg):
    if event == "call":
      calls[0] += 1

  run()
  threading.settrace(trace)
  sys.settrace(trace)
  try:
    run()
  finally:
    sys.settrace(None)
    threading.settrace(None)
  threading.setprofile(profile)
  sys.setprofile(profile)
  try:
    run()
  finally:
    sys.setprofile(None)
    threading.setprofile(None)
  return ops[0], calls[0]


def main():
  for name, make in (("copy kernel, (8,128) f32 blocks", _copy),
                     ("tiled matmul 1024^3, 128 blocks, timing_only", _matmul),
                     ("tiled matmul 1024^3 f32, 256 blocks, data", _matmul_data),
                     ("ring all-gather, 16 chips x 16 KiB (per DMA)", _allgather)):
    run, steps = make()
    ops, calls = count(run)
    unit = "DMA" if make is _allgather else "step"
    print(f"{name:48s} {ops / steps:8.0f} bytecodes/{unit} {calls / steps:7.1f} Python calls/{unit}")


if __name__ == "__main__":
  main()
