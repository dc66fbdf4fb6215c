"""Host speed of palace: a 2048^3 f32 tiled matmul (512 blocks) vs `x @ y` in NumPy, same process.

Prints the ratio (issue 10 asks for <= 1.5x) and what the GEMMs alone cost: palace computes each output
block's K sum as one GEMM of a row panel by a column panel (lang/deferred.py), so the floor is those
(size/block)^2 panel GEMMs written into the output, timed here without palace. Best of several runs.
Run from the repo root: .venv/bin/python -m benchmarks.matmul_vs_numpy [size] [block]
"""
import sys

import numpy as np

from benchmarks.kernels import best_of, tiled_matmul


def panel_gemms(x, y, block):
  """What palace's deferred sums compute: one (block x K) @ (K x block) GEMM per output block."""
  z = np.empty((x.shape[0], y.shape[1]), x.dtype)
  for i in range(0, x.shape[0], block):
    for j in range(0, y.shape[1], block):
      np.matmul(x[i:i + block], y[:, j:j + block], out=z[i:i + block, j:j + block])
  return z


def main(size=2048, block=512, reps=5):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((size, size), dtype=np.float32)
  y = rng.standard_normal((size, size), dtype=np.float32)
  z = tiled_matmul(x, y, block)
  np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-2)
  t_np = best_of(lambda: x @ y, reps)[0]
  t_pl = best_of(lambda: tiled_matmul(x, y, block), reps)[0]
  t_panels = best_of(lambda: panel_gemms(x, y, block), reps)[0]
  n = (size // block) ** 2
  print(f"{size}^3 f32 matmul, {block} blocks: numpy {t_np * 1e3:.1f} ms, palace {t_pl * 1e3:.1f} ms, "
        f"ratio {t_pl / t_np:.2f}x (the {n} panel GEMMs alone take {t_panels * 1e3:.1f} ms = "
        f"{t_panels / t_np:.2f}x: palace adds {(t_pl - t_panels) * 1e3:.1f} ms)")


if __name__ == "__main__":
  main(*[int(a) for a in sys.argv[1:3]])
