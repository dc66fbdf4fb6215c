"""Chapter 6: matmul tuning. Block sizes decide whether a matmul is bound by per-step overhead, by HBM or
by the MXU. `pl.autotune` runs each candidate in timing-only mode and ranks them by modelled time; those
that break a hardware limit are kept with the reason. Run: python docs/examples/ch06_matmul_tuning.py
"""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

REQUIRES = ("palace.autotune",)


def matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def make_matmul(m, k, n, *, bm, bk, bn):
  return pl.pallas_call(
      matmul_kernel, out_shape=pl.ShapeDtypeStruct((m, n), jnp.bfloat16), grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")))


def main(m=2048):
  x = np.zeros((m, m), jnp.bfloat16)      # timing-only runs never read the values
  candidates = {"bm": [256, 512, 1024], "bk": [512, 1024, 2048], "bn": [512, 1024]}
  result = pl.autotune(lambda c: make_matmul(m, m, m, **c), candidates, (x, x), chip="v5e")
  print(result)
  best = result.best
  print(f"best {best.config}: {best.time_s * 1e6:.1f} us, {100 * best.report.peak_fraction:.0f}% of the "
        f"bf16 peak; {len(result.rejected)} rejected, e.g. {result.rejected[0].reason[:100]}...")
  # The same search from the shell: palace tune matmul --m 4096 --n 4096 --k 4096 --chip v5e


if __name__ == "__main__":
  main()
