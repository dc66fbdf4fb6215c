"""Chapter 4: emit_pipeline. Inside a pl.kernel, `pltpu.emit_pipeline` builds the same software pipeline
that pallas_call uses, over HBM refs you already hold. Run: python docs/examples/ch04_emit_pipeline.py
"""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

REQUIRES = ("palace.tpu.emit_pipeline",)


def matmul_step(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)      # program_id refers to the pipeline's grid
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def matmul(x, y, bm=256, bk=512, bn=512):
  m, k = x.shape
  n = y.shape[1]

  def body(x_hbm, y_hbm, z_hbm):
    def with_acc(acc_ref):
      pltpu.emit_pipeline(
          lambda xb, yb, zb: matmul_step(xb, yb, zb, acc_ref), grid=(m // bm, n // bn, k // bk),
          in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                    pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
          out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))])(x_hbm, y_hbm, z_hbm)
    pl.run_scoped(with_acc, pltpu.VMEM((bm, bn), jnp.float32))

  return pl.kernel(body, out_type=pl.ShapeDtypeStruct((m, n), x.dtype),
                   mesh=pltpu.TensorCoreMesh("core", num_cores=1))(x, y)


def main():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((512, 1024)).astype(jnp.bfloat16)
  y = rng.standard_normal((1024, 512)).astype(jnp.bfloat16)
  with pl.virtual_tpu("v5e") as tpu:
    z = matmul(x, y)
  ref = x.astype(np.float32) @ y.astype(np.float32)
  assert np.max(np.abs(z.astype(np.float32) - ref) / (np.abs(ref) + 1)) < 2e-2
  print(tpu.reports[-1])


if __name__ == "__main__":
  main()
