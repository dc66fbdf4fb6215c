"""Simulation-speed benchmarks (issue 10): palace wall time against baselines measured in the same run.

Run from the repo root: python -m benchmarks.speed  (or python -m benchmarks for everything). The
machine is noisy: every figure is a best-of-N wall time and each target is printed as a ratio to a
baseline measured in the same process, never asserted in tests.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np

import palace as pl
import palace.numpy as jnp

from benchmarks.kernels import best_of, tiled_matmul

JAX_TPU_INTERPRET_STEP_S = 1.8e-3   # JAX TPU interpret mode, trivial copy kernel, per grid step (issue 10)


def _copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0


def step_overhead(n=4096):
  x = np.ones((8 * n, 128), np.float32)
  f = pl.pallas_call(_copy_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))

  def run():
    with pl.virtual_tpu("v5e"):
      return f(x)

  t, y = best_of(run)
  assert (y == 2).all()
  return t / n


def matmul(x, y, b, **tpu_kw):
  """The tutorial matmul with b-blocks on a v5e; (result, its report)."""
  with pl.virtual_tpu("v5e", **tpu_kw) as tpu:
    return tiled_matmul(x, y, b, vmem_limit_bytes=64 * 2**20), tpu.reports[-1]


_RSS_SNIPPET = """
import numpy as np
from benchmarks.speed import matmul
def hwm():  # peak RSS of this process image (VmHWM resets at exec, unlike ru_maxrss)
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) / 1024
base = hwm()
x = np.ones((4096, 4096), np.float32); y = np.ones((4096, 4096), np.float32)
matmul(x, y, 1024)
print(base, 3 * 4096 * 4096 * 4 / 2**20, hwm())
"""


def rss_check():
  """(base MiB, operand MiB, peak MiB) of a 4096^2 f32 matmul in a fresh interpreter."""
  root = pathlib.Path(__file__).resolve().parent.parent
  out = subprocess.run([sys.executable, "-c", _RSS_SNIPPET], cwd=root, capture_output=True, text=True,
                       check=True).stdout.split()
  return tuple(float(v) for v in out)


def main():
  rng = np.random.default_rng(0)
  rows = []
  per_step = step_overhead()
  rows.append(("per-grid-step overhead, 1-in/1-out (8,128) f32", f"{per_step * 1e6:.1f} us",
               f"{JAX_TPU_INTERPRET_STEP_S / per_step:.0f}x faster than JAX TPU interpret (1.8 ms)",
               "<= 40 us"))
  x32 = rng.standard_normal((2048, 2048), dtype=np.float32)
  y32 = rng.standard_normal((2048, 2048), dtype=np.float32)
  t_np, _ = best_of(lambda: x32 @ y32)
  for name, dtype in (("f32", np.float32), ("bf16", jnp.bfloat16)):
    x, y = x32.astype(dtype), y32.astype(dtype)
    t, (z, _) = best_of(lambda: matmul(x, y, 512))
    rows.append((f"2048^3 {name} matmul, 512 blocks", f"{t:.3f} s",
                 f"{t / t_np:.2f}x NumPy f32 x @ y ({t_np:.3f} s)", "<= 1.5x"))
  xb, yb = x32.astype(jnp.bfloat16), y32.astype(jnp.bfloat16)
  t, _ = best_of(lambda: matmul(xb, yb, 128), reps=1)
  rows.append(("2048^3 bf16 matmul, 128 blocks (4096 steps)", f"{t:.3f} s",
               f"{t / t_np:.1f}x NumPy f32", "<= 0.5 s"))
  xt = np.ones((8192, 8192), jnp.bfloat16)
  t, (_, rep) = best_of(lambda: matmul(xt, xt, 128, timing_only=True, trace=False), reps=1)
  steps = rep.grid_steps
  rows.append((f"timing_only matmul, {steps:,} steps", f"{t:.2f} s",
               f"{steps / t * 60 / 1e6:.2f} M steps/min", ">= 1 M steps/min"))
  base, ops, peak = rss_check()
  rows.append(("peak RSS, 4096^2 f32 matmul (fresh process)", f"{peak - base:.0f} MiB",
               f"{(peak - base) / ops:.2f}x the operands ({ops:.0f} MiB) above a {base:.0f} MiB base",
               "<= 2x operands + base"))
  width = max(len(r[0]) for r in rows)
  for r in rows:
    print(f"{r[0]:<{width}}  {r[1]:>10}  {r[2]:<50} target {r[3]}")


if __name__ == "__main__":
  main()
