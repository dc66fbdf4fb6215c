"""Host speed of palace: a 2048^3 f32 tiled matmul (512 blocks) vs `x @ y` in NumPy, same process.

Prints the ratio (issue 2 asks for <= 2x); best of several runs so a busy machine does not dominate.
It also times the same block GEMMs without palace: on a loaded machine many mid-size multi-threaded BLAS
calls slow down far more than one big call, which is the BLAS floor and not palace overhead (with
OPENBLAS_NUM_THREADS=1 both sides run single-threaded and the ratio is stable).
Run from the repo root: .venv/bin/python -m benchmarks.matmul_vs_numpy [size] [block]
"""
import sys

import numpy as np

from benchmarks.kernels import best_of, tiled_matmul


def main(size=2048, block=512, reps=5):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((size, size), dtype=np.float32)
  y = rng.standard_normal((size, size), dtype=np.float32)
  z = tiled_matmul(x, y, block)
  np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-2)
  t_np = best_of(lambda: x @ y, reps)[0]
  t_pl = best_of(lambda: tiled_matmul(x, y, block), reps)[0]
  xb, yb = x[:block, :block], y[:block, :block]
  n = (size // block) ** 3
  t_blocks = best_of(lambda: [xb @ yb for _ in range(n)], reps)[0]   # the same GEMMs, without palace
  print(f"{size}^3 f32 matmul, {block} blocks: numpy {t_np * 1e3:.1f} ms, palace {t_pl * 1e3:.1f} ms, "
        f"ratio {t_pl / t_np:.2f}x (the {n} block GEMMs alone take {t_blocks * 1e3:.1f} ms: palace adds "
        f"{(t_pl - t_blocks) * 1e3:.1f} ms)")


if __name__ == "__main__":
  main(*[int(a) for a in sys.argv[1:3]])
