"""Host speed of palace's tiled f32 matmul vs one NumPy `x @ y`, same run, default environment (issue 35).

Rows (issue 35's table): 1024^3 with 256 blocks and 2048^3 with 512 blocks inside
`with pl.virtual_tpu("v5e")`, and 2048^3 with 512 blocks without it (palace's default virtual TPU).
Each row alternates palace and NumPy call by call and keeps the best of each, so both sides see the same
load; the ratio is printed against the issue's limit (1.3x). Each call starts SETTLE_S after the last
one ended: OpenBLAS's idle threads spin for ~0.1 s after each multi-threaded product (NumPy's `x @ y`
here) before they sleep, and a palace launch started in that window shares its second core with them
(`--no-settle` times back to back). Also printed per row: what the GEMMs palace
computes cost alone (one (block x K) @ (K x block) GEMM per output block, lang/deferred.py): on
OpenBLAS's own threads, as palace ran them before issue 35; each split over palace's threads with
OpenBLAS on one, as a launch ran them until session 22; and as one batch of whole products over those
threads, as a launch runs them now (sim/memory.PendingBlocks, palace/_src/blas.py). The header says which BLAS threading
the run had: the figures are meant for the default environment (no OPENBLAS_NUM_THREADS); a run with
one set says so.

`--crossover` instead times single products of growing size three ways (OpenBLAS on all its threads,
on one, and palace's split over the launch budget) alternately: the measured crossover of blas.py's
SMALL_MATMUL_FLOPS (docs/host-speed.md).

`--threads` instead runs a launch's 128^3 products on a thread that does not control threadpoolctl
(another live thread set a count first, as XLA's first callback thread does under palace.jax) and
prints the OpenBLAS thread count inside that launch and the process CPU time per product (mean, every
thread's: OpenBLAS's spinning ones too), against the same
products with OpenBLAS left on all its threads (what such a launch got before blas._set_counts used
the library's own setter).

Run from the repo root: .venv/bin/python -m benchmarks.matmul_vs_numpy [--reps=N] [--crossover | --threads]
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import palace as pl
from benchmarks.kernels import tiled_matmul
from palace._src import blas

LIMIT = 1.3
ROWS = [(1024, 256, True), (2048, 512, True), (2048, 512, False)]


def environment() -> str:
  ctrls = blas._blas_controllers()
  threads = ",".join(str(c.num_threads) for c in ctrls) or "?"
  env = {k: v for k, v in os.environ.items()
         if k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  kind = "default environment" if not env else f"SPECIAL environment {env} (not the default install)"
  return (f"{kind}; NumPy's BLAS threads {threads}; {os.cpu_count()} CPUs; load average {load:.2f}")


SETTLE_S = 0.25   # pause before each timed call: OpenBLAS's idle threads spin ~2^28 cycles (~0.1 s)
                  # after each multi-threaded call before they sleep, holding a core


def alternate(fns, reps: int, settle: float = 0.0) -> list:
  """Best wall time of each fn, calling them in turn `reps` times (same load for all); `settle`
  seconds of sleep before each call, untimed."""
  best = [float("inf")] * len(fns)
  for _ in range(reps):
    for i, fn in enumerate(fns):
      if settle:
        time.sleep(settle)
      t0 = time.perf_counter()
      fn()
      best[i] = min(best[i], time.perf_counter() - t0)
  return best


def panel_gemms(x, y, block, matmul=np.matmul):
  """What palace's deferred sums compute: one (block x K) @ (K x block) GEMM per output block."""
  z = np.empty((x.shape[0], y.shape[1]), x.dtype)
  for i in range(0, x.shape[0], block):
    for j in range(0, y.shape[1], block):
      matmul(x[i:i + block], y[:, j:j + block], out=z[i:i + block, j:j + block])
  return z


def panel_batch(x, y, block):
  """The same GEMMs as one batch (blas.matmuls), as a launch computes its pending output blocks at its
  end (sim/memory.PendingBlocks): whole products spread over the launch's threads."""
  z = np.empty((x.shape[0], y.shape[1]), x.dtype)
  blas.matmuls([(x[i:i + block], y[:, j:j + block], z[i:i + block, j:j + block])
                for i in range(0, x.shape[0], block) for j in range(0, y.shape[1], block)])
  return z


def _in_launch(fn):
  """fn() under a launch's BLAS policy (blas.kernel_mode), as palace's products run."""
  def run():
    with blas.kernel_mode():
      return fn()
  return run


def rows(reps: int, settle: float):
  rng = np.random.default_rng(0)
  out = []
  for size, block, inside in ROWS:
    x = rng.standard_normal((size, size), dtype=np.float32)
    y = rng.standard_normal((size, size), dtype=np.float32)

    def palace_call(x=x, y=y, block=block, inside=inside):
      if not inside:
        return tiled_matmul(x, y, block)
      with pl.virtual_tpu("v5e"):
        return tiled_matmul(x, y, block)

    z = palace_call()
    bf = lambda v: v.astype(pl.numpy.bfloat16).astype(np.float32)   # noqa: E731  DEFAULT precision
    np.testing.assert_allclose(z, bf(x) @ bf(y), rtol=1e-4, atol=1e-2)
    t_pl, t_np, t_g1, t_gs, t_gb = alternate(
        [palace_call, lambda: x @ y, lambda: panel_gemms(x, y, block, np.matmul),
         _in_launch(lambda: panel_gemms(x, y, block, blas.matmul)),
         _in_launch(lambda: panel_batch(x, y, block))], reps, settle)
    out.append((size, block, inside, t_pl, t_np, t_g1, t_gs, t_gb))
  return out


def crossover(reps: int) -> None:
  ctrls = blas._blas_controllers()
  saved = [c.num_threads for c in ctrls]
  print(f"products alternately on OpenBLAS's {max(saved, default=1)} threads, on 1 thread, and split "
        f"by palace over the launch budget (blas.py); best of {reps}, ms:")
  print(f"{'m x k x n':>18} {'MFlop':>7} {'openblas':>9} {'1 thread':>9} {'palace':>9}  split/1")
  rng = np.random.default_rng(0)
  for m, k, n in [(64, 256, 256), (128, 128, 128), (128, 256, 256), (256, 256, 256), (128, 512, 512),
                  (256, 512, 256), (256, 1024, 256), (512, 512, 512), (512, 2048, 512),
                  (1024, 1024, 1024)]:
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    o = np.empty((m, n), np.float32)

    def one(threads, a=a, b=b, o=o):
      for c in ctrls:
        c.set_num_threads(threads)
      np.matmul(a, b, out=o)

    def split(a=a, b=b, o=o):
      with blas.kernel_mode():
        blas._begin(blas._launches[-1])    # OpenBLAS on one thread, as in a launch
        if blas._split(a, b, o, max(saved)) is None:
          np.matmul(a, b, out=o)

    t_all, t_one, t_split = alternate([lambda: one(max(saved)), lambda: one(1), split], reps)
    for c, s in zip(ctrls, saved):
      c.set_num_threads(s)
    mark = " <- SMALL_MATMUL_FLOPS" if 2 * m * k * n == blas.SMALL_MATMUL_FLOPS else ""
    print(f"{f'{m}x{k}x{n}':>18} {2 * m * k * n / 1e6:7.1f} {t_all * 1e3:9.3f} {t_one * 1e3:9.3f} "
          f"{t_split * 1e3:9.3f}  {t_split / t_one:5.2f}x{mark}")


def second_thread(reps: int) -> None:
  import threading  # noqa: PLC0415
  ctrls = blas._blas_controllers()
  saved = [c.num_threads for c in ctrls]
  if not ctrls or max(saved) < 2:
    print("--threads: needs threadpoolctl and a BLAS on more than one thread")
    return
  took, stop = threading.Event(), threading.Event()

  def owner():   # threadpoolctl's controlling thread from now on (a no-op count change), kept alive
    for c, n in zip(ctrls, saved):
      c.set_num_threads(n)
    took.set()
    stop.wait()

  threading.Thread(target=owner, daemon=True).start()
  took.wait()
  a = np.random.default_rng(0).standard_normal((128, 128), dtype=np.float32)

  def products(n: int = 50) -> float:
    t = time.process_time()
    for _ in range(n * reps):
      blas.matmul(a, a)
    return (time.process_time() - t) / (n * reps)

  with blas.kernel_mode():
    blas.matmul(a, a)
    inside = [c.num_threads for c in ctrls]
    t_launch = products()
  t_all = products()   # outside a launch a product this small runs on one thread too
  assert [c.num_threads for c in ctrls] == saved   # the launch gave them back
  t0 = time.process_time()
  for _ in range(50 * reps):
    np.matmul(a, a)
  t_raw = (time.process_time() - t0) / (50 * reps)
  stop.set()
  print(f"a launch on a thread that does not control threadpoolctl: OpenBLAS threads inside it "
        f"{inside} (outside: {saved}); 128^3 product CPU {t_launch * 1e3:.3f} ms in the launch, "
        f"{t_raw * 1e3:.3f} ms on OpenBLAS's {max(saved)} threads (what such a launch got before), "
        f"{t_all * 1e3:.3f} ms outside a launch; mean of {reps} x 50")


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  reps = next((int(a.split("=")[1]) for a in argv if a.startswith("--reps=")), 7)
  print(environment())
  if "--crossover" in argv:
    crossover(reps * 3)
    return None
  if "--threads" in argv:
    second_thread(reps)
    return None
  settle = 0.0 if "--no-settle" in argv else SETTLE_S
  res = rows(reps, settle)
  met = 0
  for size, block, inside, t_pl, t_np, t_g1, t_gs, t_gb in res:
    ok = t_pl / t_np <= LIMIT
    met += ok
    where = 'inside `with pl.virtual_tpu("v5e")`' if inside else "no `with`"
    print(f"{size}^3 f32, {block} blocks, {where}: palace {t_pl * 1e3:.1f} ms, NumPy x @ y "
          f"{t_np * 1e3:.1f} ms, ratio {t_pl / t_np:.2f}x (limit {LIMIT}x: {'met' if ok else 'NO'}); "
          f"its {(size // block) ** 2} panel GEMMs alone {t_g1 * 1e3:.1f} ms on OpenBLAS's threads, "
          f"{t_gs * 1e3:.1f} ms each split over palace's threads, {t_gb * 1e3:.1f} ms as one batch "
          f"(as a launch runs them)")
  print(f"{met}/{len(res)} rows within {LIMIT}x of NumPy (best of {reps}, alternated, {settle} s apart)")
  return res


if __name__ == "__main__":
  main()
