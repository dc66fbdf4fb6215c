"""Host cost of VirtualTPU(dot_numerics="mxu") against the default "blas" (docs/numerics.md).

Two tables, same run, the two sides alternated call by call, best CPU time (process_time: every thread
of this process) of each, so a busy machine slows both alike:
- one product: `lang/mxu.chip_product` (the chip's summation rule) vs the float32 BLAS GEMM of the
  same bf16-valued (s, s) @ (s, s) operands, on one BLAS thread, s = 128..1024;
- one launch: a 1024^3 float32 tiled matmul (benchmarks.kernels.tiled_matmul, blocks of 128..512) in
  `pl.virtual_tpu("v5e", dot_numerics=...)`, whole launches (palace's own work included).

Run from the repo root: .venv/bin/python -m benchmarks.dot_numerics_cost [--reps=N]
"""
from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np

import palace as pl
from benchmarks.kernels import tiled_matmul
from palace._src import blas
from palace._src.lang import mxu

SIZES = (128, 256, 512, 1024)
BLOCKS = (128, 256, 512)


def alternate(fns, reps: int) -> list:
  """Best CPU time of each fn, calling them in turn `reps` times."""
  best = [float("inf")] * len(fns)
  for _ in range(reps):
    for i, fn in enumerate(fns):
      t0 = time.process_time()
      fn()
      best[i] = min(best[i], time.process_time() - t0)
  return best


def _bf16_valued(shape, seed):
  v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return v.astype(ml_dtypes.bfloat16).astype(np.float32)


def products(reps: int) -> list:
  rows = []
  with blas.single_threaded():
    for s in SIZES:
      a, b = _bf16_valued((s, s), 1), _bf16_valued((s, s), 2)
      t_blas, t_mxu = alternate([lambda: a @ b, lambda: mxu.chip_product(a, b)], reps)
      rows.append((f"product {s}^3", t_blas, t_mxu))
  return rows


def launches(reps: int) -> list:
  x, y = _bf16_valued((1024, 1024), 3), _bf16_valued((1024, 1024), 4)
  rows = []
  for block in BLOCKS:
    def run(mode, block=block):
      with pl.virtual_tpu("v5e", dot_numerics=mode):
        np.asarray(tiled_matmul(x, y, block))
    t_blas, t_mxu = alternate([lambda: run("blas"), lambda: run("mxu")], reps)
    rows.append((f"launch 1024^3, {block} blocks", t_blas, t_mxu))
  return rows


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  reps = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--reps=")), 3)
  print(f"{'case':28s} {'blas ms':>9s} {'mxu ms':>9s} {'mxu/blas':>9s}")
  for name, t_blas, t_mxu in products(reps) + launches(reps):
    print(f"{name:28s} {t_blas * 1e3:9.2f} {t_mxu * 1e3:9.2f} {t_mxu / t_blas:8.1f}x")


if __name__ == "__main__":
  main()
