"""Cost of the opt-in bug checks: a 2048^3 f32 tiled matmul (512 blocks) with and without
`detect_races=True` (and `uninitialized="raise"`), plus a step-bound kernel (grid 4096, (8, 128) blocks)
where the per-access bookkeeping is not hidden behind NumPy matmuls.

Prints wall-time ratios (best of several runs, so a busy machine does not dominate) on v5e (one core) and
v5p (megacore: two cores, so access records are kept and compared across cores).
Run from the repo root: OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.race_cost [size] [block]
(single-threaded BLAS keeps the ratio stable on a busy machine). Measured on the 2-vCPU dev box: matmul
1.07x (v5e) / 0.99x (v5p) with detect_races, 1.2-1.3x adding uninitialized="raise"; the step-bound
kernel 2.2x / 3.0x (about 60 us of bookkeeping per grid step: two DMAs, a load and a store).
"""
import sys

import numpy as np

import palace as pl

from benchmarks.kernels import best_of, tiled_matmul


def _timed(chip, fn, reps, **checks):
  def run():
    with pl.virtual_tpu(chip, trace=False, **checks):
      fn()
  return best_of(run, reps)[0]


def _step_kernel(n=4096):
  x = np.ones((8 * n, 128), np.float32)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2.0),
                     out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  return lambda: f(x)


def main():
  size = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
  block = int(sys.argv[2]) if len(sys.argv) > 2 else 512
  rng = np.random.default_rng(0)
  x = rng.standard_normal((size, size)).astype(np.float32)
  y = rng.standard_normal((size, size)).astype(np.float32)
  mm = lambda: tiled_matmul(x, y, block)  # noqa: E731
  with pl.virtual_tpu("v5e", detect_races=True):
    np.testing.assert_allclose(tiled_matmul(x, y, block), x @ y, rtol=2e-3, atol=2e-3)
  rows = []
  for chip in ("v5e", "v5p"):
    base = _timed(chip, mm, 3)
    races = _timed(chip, mm, 3, detect_races=True)
    both = _timed(chip, mm, 3, detect_races=True, uninitialized="raise")
    rows.append((f"matmul {size}^3 f32, {block} blocks", chip, base, races, both))
  step = _step_kernel()
  base = _timed("v5e", step, 2)
  races = _timed("v5e", step, 2, detect_races=True)
  both = _timed("v5e", step, 2, detect_races=True, uninitialized="raise")
  rows.append(("elementwise, grid 4096, (8,128) blocks", "v5e", base, races, both))
  print(f"{'kernel':42s} {'chip':5s} {'default s':>10s} {'races s':>9s} {'ratio':>6s} "
        f"{'+uninit s':>10s} {'ratio':>6s}")
  for name, chip, b, r, u in rows:
    print(f"{name:42s} {chip:5s} {b:10.3f} {r:9.3f} {r / b:6.2f} {u:10.3f} {u / b:6.2f}")
  print(f"detect_races=True cost on the {size}^3 matmul (v5e): {rows[0][3] / rows[0][2]:.2f}x wall time")


if __name__ == "__main__":
  main()
