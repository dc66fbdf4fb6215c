"""End-to-end smoke test: the classic tiled matmul against NumPy."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from matmul_kernel import matmul_kernel as _matmul_kernel


def matmul(x, y, bm, bk, bn, out_dtype):
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      _matmul_kernel,
      out_shape=pl.ShapeDtypeStruct((m, n), out_dtype),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


@pytest.mark.parametrize("bm,bk,bn", [(128, 128, 128), (256, 128, 128), (128, 256, 256)])
def test_matmul_f32(rng, bm, bk, bn):
  x = rng.standard_normal((256, 512), dtype=np.float32)
  y = rng.standard_normal((512, 256), dtype=np.float32)
  z = matmul(x, y, bm, bk, bn, jnp.float32)
  # the chip's default precision: f32 operands rounded to bf16, f32 sums (docs/numerics.md)
  ref = x.astype(jnp.bfloat16).astype(np.float32) @ y.astype(jnp.bfloat16).astype(np.float32)
  np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-4)


def test_matmul_bf16_accumulates_in_f32(rng):
  x = rng.standard_normal((256, 256)).astype(jnp.bfloat16)
  y = rng.standard_normal((256, 256)).astype(jnp.bfloat16)
  z = matmul(x, y, 128, 128, 128, jnp.float32)
  ref = x.astype(np.float32) @ y.astype(np.float32)
  np.testing.assert_allclose(z, ref, rtol=1e-6, atol=1e-4)


def test_matmul_example_runs(capsys):
  import runpy
  import pathlib
  runpy.run_path(str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "matmul.py"),
                 run_name="__main__")
  out = capsys.readouterr().out
  assert "bf16 matmul 1024x1024x1024 on a virtual TPU v5e" in out
  assert out.count("compute") >= 1
