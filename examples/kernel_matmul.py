"""A matmul written with the modular API: `pl.kernel` + `pltpu.emit_pipeline`.

The kernel receives its operands as HBM refs and runs the classic (i, j, k) block pipeline itself:
`emit_pipeline` double-buffers the x/y blocks into VMEM with DMAs while the MXU works on the previous
ones. Same body and BlockSpecs as the `pallas_call` version in examples/matmul.py, so the results are
bit-identical and the modelled times agree. Run: python examples/kernel_matmul.py
"""
import functools

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def matmul_body(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def _specs(bm, bk, bn):
  in_specs = [pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
              pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))]
  out_specs = [pl.BlockSpec((bm, bn), lambda i, j, k: (i, j))]
  return in_specs, out_specs


def kernel_matmul(x, y, *, bm=256, bk=256, bn=256, out_dtype=jnp.float32):
  """z = x @ y with pl.kernel: the body pipelines HBM blocks itself with emit_pipeline."""
  m, k = x.shape
  n = y.shape[1]
  in_specs, out_specs = _specs(bm, bk, bn)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((m, n), out_dtype),
                     mesh=pltpu.TensorCoreMesh("core", num_cores=1),
                     scratch_types=[pltpu.VMEM((bm, bn), jnp.float32)])
  def matmul_kernel(x_hbm_ref, y_hbm_ref, z_hbm_ref, acc_ref):
    pltpu.emit_pipeline(matmul_body, grid=(m // bm, n // bn, k // bk), in_specs=in_specs,
                        out_specs=out_specs,
                        dimension_semantics=(pltpu.PARALLEL, pltpu.PARALLEL, pltpu.ARBITRARY))(
        x_hbm_ref, y_hbm_ref, z_hbm_ref, scratches=[acc_ref])

  return matmul_kernel(x, y)


def pallas_call_matmul(x, y, *, bm=256, bk=256, bn=256, out_dtype=jnp.float32):
  """The same matmul as a grid + BlockSpec pallas_call."""
  m, k = x.shape
  n = y.shape[1]
  in_specs, out_specs = _specs(bm, bk, bn)
  return pl.pallas_call(
      matmul_body, out_shape=pl.ShapeDtypeStruct((m, n), out_dtype), grid=(m // bm, n // bn, k // bk),
      in_specs=in_specs, out_specs=out_specs[0], scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


def overlapped_steps(report) -> tuple[int, int]:
  """(compute steps during which an input DMA was in flight, compute steps) from the timeline."""
  mxu = [e for e in report.events if e[1] == "mxu"]
  fetch = [e for e in report.events if e[1] == "dma" and e[2] == "hbm->vmem"]
  hit = sum(1 for m in mxu if any(d[3] < m[4] and d[4] > m[3] for d in fetch))
  return hit, len(mxu)


def main():
  rng = np.random.default_rng(0)
  print("bf16 matmul, f32 accumulation, on a virtual TPU v5e: pl.kernel + emit_pipeline vs pallas_call")
  print(f"{'m=k=n':>6} {'block':>6} {'kernel us':>10} {'pallas us':>10} {'ratio':>6} {'overlap':>8}")
  for size, block in [(512, 128), (1024, 256), (1024, 512)]:
    x = rng.standard_normal((size, size)).astype(jnp.bfloat16)
    y = rng.standard_normal((size, size)).astype(jnp.bfloat16)
    with pl.virtual_tpu("v5e") as tpu:
      z_kernel = kernel_matmul(x, y, bm=block, bk=block, bn=block)
      z_call = pallas_call_matmul(x, y, bm=block, bk=block, bn=block)
    ref = x.astype(np.float32) @ y.astype(np.float32)
    np.testing.assert_allclose(z_kernel, ref, rtol=1e-4, atol=1e-2)
    assert z_kernel.tobytes() == z_call.tobytes()
    r_kernel, r_call = tpu.reports
    hit, steps = overlapped_steps(r_kernel)
    print(f"{size:>6} {block:>6} {r_kernel.device_time_s * 1e6:>10.2f} {r_call.device_time_s * 1e6:>10.2f} "
          f"{r_kernel.device_time_s / r_call.device_time_s:>6.3f} {hit:>3}/{steps:<4}")
  print()
  print(r_kernel)


if __name__ == "__main__":
  main()
