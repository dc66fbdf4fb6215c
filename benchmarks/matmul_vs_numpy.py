"""Host speed of palace: a 2048^3 f32 tiled matmul (512 blocks) vs `x @ y` in NumPy, same process.

Prints the ratio (issue 2 asks for <= 2x); best of several runs so a busy machine does not dominate.
It also times the same block GEMMs without palace: on a loaded machine many mid-size multi-threaded BLAS
calls slow down far more than one big call, which is the BLAS floor and not palace overhead (with
OPENBLAS_NUM_THREADS=1 both sides run single-threaded and the ratio is stable).
Run: .venv/bin/python benchmarks/matmul_vs_numpy.py [size] [block]
"""
import sys
import time

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def _kernel(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def matmul(x, y, b):
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      _kernel, out_shape=pl.ShapeDtypeStruct((m, n), x.dtype), grid=(m // b, n // b, k // b),
      in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)), pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)


def _best(f, reps):
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f()
    best = min(best, time.perf_counter() - t)
  return best


def main(size=2048, block=512, reps=5):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((size, size), dtype=np.float32)
  y = rng.standard_normal((size, size), dtype=np.float32)
  z = matmul(x, y, block)
  np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-2)
  t_np = _best(lambda: x @ y, reps)
  t_pl = _best(lambda: matmul(x, y, block), reps)
  xb, yb = x[:block, :block], y[:block, :block]
  n = (size // block) ** 3
  t_blocks = _best(lambda: [xb @ yb for _ in range(n)], reps)   # the same GEMMs, without palace
  print(f"{size}^3 f32 matmul, {block} blocks: numpy {t_np * 1e3:.1f} ms, palace {t_pl * 1e3:.1f} ms, "
        f"ratio {t_pl / t_np:.2f}x (the {n} block GEMMs alone take {t_blocks * 1e3:.1f} ms: palace adds "
        f"{(t_pl - t_blocks) * 1e3:.1f} ms)")


if __name__ == "__main__":
  main(*[int(a) for a in sys.argv[1:3]])
