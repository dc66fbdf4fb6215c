"""Raw bits of the chip's matmuls, for palace's dot rule (session 22's chip run).

    python3 -m benchmarks.hw.dot_bits --out DIR        (on a TPU: writes DIR/dot_bits.npz)

Session 22's numeric probes (benchmarks/hw/probes_s22.py) found that on a v5e an in-kernel f32 matmul
whose K is accumulated in blocks of 128 equals XLA's one jnp.dot bit for bit, and that both are within
2 ulps (of the output's largest magnitude) of the exact product of the bf16-rounded operands. This
records the outputs themselves, on fixed inputs palace regenerates from the same seeds, so a candidate
summation rule can be checked bit for bit without the chip (`tests/jax_backend/test_chip_numerics.py`).
Inputs: `_inputs(k, dtype)`; outputs: one XLA dot of (256, k) x (k, 256) per (k, dtype, precision), and
one pallas_call dot of the whole K in one block for k <= 512. Public JAX API shared by 0.10.2 and 0.12.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

KS = (128, 256, 512, 2048)
CASES = [(k, dtype, prec) for k in KS for dtype, prec in
         (("float32", "default"), ("bfloat16", "default"), ("float32", "highest"))]


def _inputs(k: int, dtype: str):
  """The fixed operands of one case (float32 arrays; bf16 cases are rounded by the caller's cast)."""
  rng = np.random.default_rng(1000 + k)
  x = rng.standard_normal((256, k)).astype(np.float32)
  y = rng.standard_normal((k, 256)).astype(np.float32)
  return x, y


def mxu_rule(x, y):
  """The v5e's DEFAULT-precision dot as measured (session 22): operands rounded to bf16 (the caller
  passes them rounded), products exact; per 128-long chunk of K, each group of 8 products is two exact
  sums of 4, each rounded to float32 once, added in float32; the chunk's 16 group sums are added in
  order from zero in float32; the chunks' sums are added in order in float32. Bit-identical to the chip
  on all but 3-9 of 65536 outputs (1 ulp) for K = 128-2048 (`v5e-dot-bits-k128-2026-12-06.npz` keeps K
  = 128). NumPy float64 work of K/4 batched products: a reference, far slower than a BLAS dot, kept
  as the independent oracle of palace's block-level form (lang/mxu.chip_product, VirtualTPU(
  dot_numerics="mxu"); tests/lang/test_dot_numerics.py compares the two bit for bit)."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  m, k = x.shape
  total = None
  for c in range(0, k, 128):
    acc = np.zeros((m, y.shape[1]), np.float32)
    for s in range(c, min(c + 128, k), 8):
      lo = (x[:, s:s + 4] @ y[s:s + 4]).astype(np.float32)        # 4 exact products, exactly summed
      hi = (x[:, s + 4:s + 8] @ y[s + 4:s + 8]).astype(np.float32)
      acc = (acc + (lo + hi)).astype(np.float32)
    total = acc if total is None else (total + acc).astype(np.float32)
  return total


def name(k: int, dtype: str, prec: str, where: str = "xla") -> str:
  return f"{where}_k{k}_{dtype}_{prec}"


RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "v5e-dot-bits-k128-2026-12-06.npz")


def recorded(dtype: str, k: int = 128, prec: str = "default"):
  """(x, y, chip output) of a recorded case: the operands in `dtype` (float32 or bfloat16, as the chip
  got them) and the chip's float32 result of x @ y (RECORD keeps K = 128)."""
  import ml_dtypes  # noqa: PLC0415
  x, y = _inputs(k, dtype)
  if dtype == "bfloat16":
    x, y = x.astype(ml_dtypes.bfloat16), y.astype(ml_dtypes.bfloat16)
  return x, y, np.load(RECORD)[name(k, dtype, prec)]


def ulps(got, want) -> np.ndarray:
  """|got - want| in float32 units in the last place (same-sign values: their bit patterns' distance)."""
  return np.abs(np.asarray(got, np.float32).view(np.int32).astype(np.int64)
                - np.asarray(want, np.float32).view(np.int32).astype(np.int64))


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.experimental import pallas as pl  # noqa: PLC0415

  out = {}
  for k, dtype, prec in CASES:
    x, y = _inputs(k, dtype)
    xd, yd = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
    p = jax.lax.Precision.HIGHEST if prec == "highest" else None
    f = jax.jit(lambda u, v, p=p: jnp.dot(u, v, precision=p, preferred_element_type=jnp.float32))
    out[name(k, dtype, prec)] = np.asarray(f(xd, yd))
    if k <= 512:
      def kernel(u_ref, v_ref, o_ref, p=p):
        o_ref[...] = jnp.dot(u_ref[...], v_ref[...], precision=p, preferred_element_type=jnp.float32)
      call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32))
      try:
        out[name(k, dtype, prec, "kernel")] = np.asarray(jax.jit(call)(xd, yd))
      except Exception as e:  # noqa: BLE001 - a rejected form is recorded, the rest go on
        print(json.dumps({"case": name(k, dtype, prec, "kernel"), "error": str(e).splitlines()[0]}))
  os.makedirs(a.out, exist_ok=True)
  np.savez_compressed(os.path.join(a.out, "dot_bits.npz"), **out)
  print(json.dumps({"jax": jax.__version__, "device": jax.devices()[0].device_kind,
                    "arrays": sorted(out)}))


if __name__ == "__main__":
  main()
