"""The classic Pallas TPU matmul: grid + BlockSpecs + an f32 accumulator scratch.

bf16 inputs, f32 accumulation, checked against NumPy for a few block sizes, with the modelled time on a
TPU v5e for each. Run: python examples/matmul.py
"""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def matmul(x, y, *, bm=128, bk=128, bn=128):
  m, k = x.shape
  _, n = y.shape
  return pl.pallas_call(
      matmul_kernel,
      out_shape=pl.ShapeDtypeStruct((m, n), x.dtype),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


def main():
  rng = np.random.default_rng(0)
  m = 1024
  x = rng.standard_normal((m, m)).astype(jnp.bfloat16)
  y = rng.standard_normal((m, m)).astype(jnp.bfloat16)
  ref = x.astype(np.float32) @ y.astype(np.float32)
  print(f"bf16 matmul {m}x{m}x{m} on a virtual TPU v5e (f32 accumulation)")
  print(f"{'bm':>5} {'bk':>5} {'bn':>5} {'max err':>9} {'device us':>10} {'TFLOP/s':>8} {'bound':>9}")
  for bm, bk, bn in [(128, 128, 128), (256, 256, 256), (512, 512, 512), (512, 1024, 1024)]:
    with pl.virtual_tpu("v5e") as tpu:
      z = matmul(x, y, bm=bm, bk=bk, bn=bn)
    err = float(np.max(np.abs(z.astype(np.float32) - ref) / (np.abs(ref) + 1)))
    assert err < 1e-2, err
    r = tpu.reports[-1]
    print(f"{bm:>5} {bk:>5} {bn:>5} {err:>9.2e} {r.device_time_s * 1e6:>10.1f} "
          f"{r.flops_per_s / 1e12:>8.1f} {r.bound:>9}")
  print(tpu.reports[-1])


if __name__ == "__main__":
  main()
