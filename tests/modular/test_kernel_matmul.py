"""Acceptance: a pl.kernel + emit_pipeline matmul equals the pallas_call one, overlaps DMA with the MXU
and is modelled within 10% of the pallas_call time."""
import pathlib
import runpy

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp

EX = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "examples" / "kernel_matmul.py"))
kernel_matmul, pallas_call_matmul = EX["kernel_matmul"], EX["pallas_call_matmul"]


@pytest.mark.parametrize("shape,blocks,dtype", [
    ((256, 512, 256), (128, 128, 128), np.float32),
    ((256, 512, 384), (256, 256, 128), np.float32),
    ((512, 256, 256), (128, 256, 256), jnp.bfloat16),
])
def test_kernel_matmul_equals_pallas_call(rng, shape, blocks, dtype):
  m, k, n = shape
  bm, bk, bn = blocks
  x = rng.standard_normal((m, k)).astype(dtype)
  y = rng.standard_normal((k, n)).astype(dtype)
  z_kernel = kernel_matmul(x, y, bm=bm, bk=bk, bn=bn)
  z_call = pallas_call_matmul(x, y, bm=bm, bk=bk, bn=bn)
  assert z_kernel.tobytes() == z_call.tobytes()
  # default precision: f32 operands rounded to bf16 as the chip does (docs/numerics.md)
  ref = x.astype(jnp.bfloat16).astype(np.float32) @ y.astype(jnp.bfloat16).astype(np.float32)
  np.testing.assert_allclose(z_kernel, ref, rtol=1e-5, atol=1e-3)


def _block_of(src: str) -> str:
  return src.split(" -> ")[0]


def test_timeline_dma_of_next_block_overlaps_compute():
  """For every step s but the last, the DMA bringing x's block for step s+1 starts before the MXU has
  finished step s (double buffering as seen on the modelled timeline: it is issued before step s's
  wait, and with 32 KiB blocks it lands during that wait's DMA-wait sync, before the MXU starts)."""
  rng = np.random.default_rng(1)
  m, k, n, b = 256, 512, 256, 128
  x = rng.standard_normal((m, k)).astype(jnp.bfloat16)
  y = rng.standard_normal((k, n)).astype(jnp.bfloat16)
  with pl.virtual_tpu("v5e") as tpu:
    kernel_matmul(x, y, bm=b, bk=b, bn=b)
  events = tpu.reports[-1].events
  mxu = sorted((e for e in events if e[1] == "mxu"), key=lambda e: e[3])
  x_fetch = sorted((e for e in events if e[1] == "dma" and e[2] == "hbm->vmem"
                    and _block_of(str(e[5]["copy"])).startswith("args[0][")), key=lambda e: e[3])
  steps = [(i, j, kk) for i in range(m // b) for j in range(n // b) for kk in range(k // b)]
  assert len(mxu) == len(steps) and len(x_fetch) == len(steps)
  for s, (compute, (i, j, kk)) in enumerate(zip(mxu[:-1], steps[:-1])):
    ni, _, nk = steps[s + 1]
    want = f"args[0][{ni * b}:{(ni + 1) * b}, {nk * b}:{(nk + 1) * b}]"
    dma = x_fetch[s + 1]  # x's block changes every step, so its fetches come one per step, in order
    assert _block_of(str(dma[5]["copy"])) == want
    assert dma[3] < compute[3] < compute[4], (s, dma[:5], compute[:5])


def test_kernel_time_within_10_percent_of_pallas_call():
  rng = np.random.default_rng(2)
  x = rng.standard_normal((1024, 1024)).astype(jnp.bfloat16)
  y = rng.standard_normal((1024, 1024)).astype(jnp.bfloat16)
  with pl.virtual_tpu("v5e") as tpu:
    kernel_matmul(x, y, bm=256, bk=256, bn=256)
    pallas_call_matmul(x, y, bm=256, bk=256, bn=256)
  t_kernel, t_call = (r.device_time_s for r in tpu.reports)
  assert abs(t_kernel - t_call) <= 0.10 * t_call, (t_kernel, t_call)
  assert tpu.reports[0].flops == tpu.reports[1].flops == 2 * 1024 ** 3
