"""Questions issue 37 left to the chip: what a real TPU computes where palace.jax and a JAX test disagree.

Run on the TPU (JAX only, no palace):  python3 -m benchmarks.hw.chip_decide --out DIR
writes DIR/v5e-decide-<date>.jsonl: the environment, then one record per question. Locally,
`.venv-jax/bin/python -m benchmarks.hw.chip_decide` recomputes each on palace.jax (v5e) and compares.

1. `paged_f32_gqa`: the jax wheel's paged attention on float32 pages with grouped queries (4 query
   heads per KV head), as `tests/pallas/tpu_paged_attention_kernel_test.py::test_paged_attention`
   runs it. Palace.jax's output differs from that test's reference (computed by XLA, which on a CPU
   multiplies f32 exactly). Recorded: the chip kernel's output and XLA's reference on the chip at
   default precision, both on inputs made here with NumPy (regenerated identically on both sides).
2. `select_oob_scalar`: a kernel that reads `idx_ref[i + 1]` one past a scalar-prefetch array's end at
   its last grid step and discards the value with `jnp.where`. Recorded: whether the chip runs it and
   its output.
3. `paged_quant_bf16_gqa` (session 20): the same kernel with bfloat16 queries and int8-quantized K/V
   pages (`QuantizedTensor`, 8 query heads per KV head, head_dim 256, 64-row pages, as the failing
   `test_paged_attention861` / `863` / `429` cases); the kernel dequantizes to float32 and its dots run
   at default precision. Recorded: the chip kernel's output and XLA's reference at default and highest
   precision on the chip, on NumPy-made, NumPy-quantized inputs.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import io
import json
import os
import sys

import ml_dtypes
import numpy as np

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PAGED = dict(batch=4, kv_heads=2, ratio=4, d=128, page=16, max_len=512, block=128)
SEQ_LENS = (3, 256, 300, 512)


def _enc(a) -> str:
  buf = io.BytesIO()
  np.save(buf, np.asarray(a), allow_pickle=False)
  return base64.b64encode(buf.getvalue()).decode()


def _dec(s: str) -> np.ndarray:
  return np.load(io.BytesIO(base64.b64decode(s)), allow_pickle=False)


def paged_inputs():
  """NumPy-made inputs (the same on every machine): q, k_pages, v_pages, lengths, page_indices."""
  p = PAGED
  rng = np.random.default_rng(37)
  pps = p["max_len"] // p["page"]
  total = p["batch"] * pps
  q = rng.standard_normal((p["batch"], p["kv_heads"] * p["ratio"], p["d"])).astype(np.float32)
  k = rng.standard_normal((p["kv_heads"], total, p["page"], p["d"])).astype(np.float32)
  v = rng.standard_normal((p["kv_heads"], total, p["page"], p["d"])).astype(np.float32)
  idx = rng.permutation(total).astype(np.int32).reshape(p["batch"], pps)
  return q, k, v, np.asarray(SEQ_LENS, np.int32), idx


PAGED_Q = dict(batch=4, kv_heads=2, ratio=8, d=256, page=64, max_len=512, block=128)
SEQ_LENS_Q = (3, 200, 300, 512)


def paged_quant_inputs():
  """bf16-valued q (as float32), int8 K/V pages with their float32 per-row scales (quantized here in
  NumPy, so both sides hold the same bits), lengths and page indices."""
  p = PAGED_Q
  rng = np.random.default_rng(861)
  pps = p["max_len"] // p["page"]
  total = p["batch"] * pps
  q = rng.standard_normal((p["batch"], p["kv_heads"] * p["ratio"], p["d"])).astype(np.float32)
  q = _bf16_values(q)
  out = [q]
  for _ in range(2):
    x = rng.standard_normal((p["kv_heads"], total, p["page"], p["d"])).astype(np.float32)
    h = np.max(np.abs(x), axis=-1, keepdims=True)
    w = np.rint(x.astype(np.float64) * (127.5 / h.astype(np.float64))).clip(-128, 127).astype(np.int8)
    out += [w, h]
  idx = rng.permutation(total).astype(np.int32).reshape(p["batch"], pps)
  return (*out, np.asarray(SEQ_LENS_Q, np.int32), idx)


def _bf16_values(a):
  """`a` rounded to the nearest bfloat16 value (ties to even), kept as float32."""
  return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def run_paged_quant(q, kw, ks, vw, vs, lengths, idx):
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention  # noqa: PLC0415
  from jax.experimental.pallas.ops.tpu.paged_attention.quantization_utils import QuantizedTensor  # noqa: PLC0415

  def f(q, kw, ks, vw, vs, lengths, idx):
    return paged_attention(q.astype(jnp.bfloat16), QuantizedTensor(kw, ks), QuantizedTensor(vw, vs),
                           lengths, idx, pages_per_compute_block=PAGED_Q["block"] // PAGED_Q["page"])
  return np.asarray(jax.jit(f)(q, kw, ks, vw, vs, lengths, idx).astype(jnp.float32))


def paged_quant_reference(q, kw, ks, vw, vs, lengths, idx, precision=None):
  """The reference on the dequantized (float32) pages."""
  k = kw.astype(np.float32) * ks / np.float32(127.5)
  v = vw.astype(np.float32) * vs / np.float32(127.5)
  return paged_reference(q, k, v, lengths, idx, precision)


def paged_bf16_reference(q, k, v, lengths, idx):
  """The reference on bf16-rounded q, k and v, exact products (what default-precision dots compute)."""
  r = _bf16_values
  return paged_reference(r(q), r(k), r(v), lengths, idx, precision="highest")


def paged_quant_bf16_reference(q, kw, ks, vw, vs, lengths, idx):
  """The reference on the dequantized pages rounded to bf16 (q is bf16-valued already)."""
  r = _bf16_values
  return paged_reference(q, r(kw * ks / np.float32(127.5)), r(vw * vs / np.float32(127.5)), lengths, idx,
                         precision="highest")


def paged_reference(q, k, v, lengths, idx, precision=None):
  """Grouped-query attention over the gathered pages, in jnp (XLA), masked past each length."""
  import jax.numpy as jnp  # noqa: PLC0415
  b, hq, d = q.shape
  hkv = k.shape[0]
  kk = jnp.take(jnp.asarray(k), jnp.asarray(idx), axis=1).transpose(1, 0, 2, 3, 4).reshape(b, hkv, -1, d)
  vv = jnp.take(jnp.asarray(v), jnp.asarray(idx), axis=1).transpose(1, 0, 2, 3, 4).reshape(b, hkv, -1, d)
  qq = jnp.asarray(q).reshape(b, hkv, hq // hkv, d)
  s = jnp.einsum("bhgd,bhtd->bhgt", qq, kk, precision=precision)
  mask = jnp.arange(kk.shape[2])[None, None, None, :] < jnp.asarray(lengths)[:, None, None, None]
  s = jnp.where(mask, s, -jnp.inf)
  w = jnp.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  o = jnp.einsum("bhgt,bhtd->bhgd", w, vv, precision=precision)
  return np.asarray(o.reshape(b, hq, d))


def run_paged(q, k, v, lengths, idx):
  import jax  # noqa: PLC0415
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention  # noqa: PLC0415
  fn = jax.jit(lambda *a: paged_attention(*a, pages_per_compute_block=PAGED["block"] // PAGED["page"]))
  return np.asarray(fn(q, k, v, lengths, idx))


def run_select_oob():
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.experimental import pallas as pl  # noqa: PLC0415
  from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415
  n = 8
  idx = jnp.arange(10, 10 + n, dtype=jnp.int32)

  def kernel(idx_ref, x_ref, o_ref):
    i = pl.program_id(0)
    nxt = idx_ref[jnp.minimum(i + 1, n)]          # i + 1 == n at the last step: one past the end
    val = jnp.where(i + 1 < n, nxt, -1)
    o_ref[...] = x_ref[...] + val.astype(jnp.float32)

  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(n,),
                                    in_specs=[pl.BlockSpec((8, 128), lambda i, s: (i, 0))],
                                    out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8 * n, 128), jnp.float32), grid_spec=gs)
  x = jnp.zeros((8 * n, 128), jnp.float32)
  out = np.asarray(jax.jit(call)(idx, x))
  return out[::8, 0]


# name -> (inputs, kernel, reference, bf16-operand reference): the questions answered by a kernel's output
KERNEL_QUESTIONS = {
    "paged_f32_gqa": (paged_inputs, run_paged, paged_reference, paged_bf16_reference),
    "paged_quant_bf16_gqa": (paged_quant_inputs, run_paged_quant, paged_quant_reference,
                             paged_quant_bf16_reference),
}


def _attempt(fn):
  try:
    return fn(), None
  except Exception as e:  # noqa: BLE001  a rejection is a finding
    return None, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def chip(out_dir: str) -> str:
  import jax  # noqa: PLC0415
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"v5e-decide-{datetime.date.today().isoformat()}.jsonl")
  env = {"kind": "env", "jax_version": jax.__version__, "device_kind": jax.devices()[0].device_kind,
         "date": datetime.date.today().isoformat()}
  recs = [env]
  for name, (inputs, run, reference, _) in KERNEL_QUESTIONS.items():
    args = inputs()
    out, err = _attempt(lambda: run(*args))
    ref_default, _ = _attempt(lambda: reference(*args))
    ref_highest, _ = _attempt(lambda: reference(*args, precision="highest"))
    recs.append({"name": name, "error": err,
                 **{k: (None if a is None else _enc(a)) for k, a in
                    (("kernel", out), ("xla_default", ref_default), ("xla_highest", ref_highest))}})
  out, err = _attempt(run_select_oob)
  recs.append({"name": "select_oob_scalar", "error": err, "output": None if out is None else _enc(out)})
  with open(path, "w") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")
  print(f"wrote {path}")
  return path


def _rel(a, b) -> float:
  return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def compare(path: str) -> None:
  """palace.jax (v5e) against the chip's records, printed."""
  import palace.jax as pj  # noqa: PLC0415
  recs = {r.get("name", "env"): r for r in map(json.loads, open(path))}
  print(f"chip: {recs['env']}")
  for name, (inputs, run, reference, bf16_reference) in KERNEL_QUESTIONS.items():
    r = recs.get(name)
    if r is None:   # (an older record asked fewer questions)
      continue
    args = inputs()
    chip_k, chip_xla, chip_hi = (_dec(r[k]) for k in ("kernel", "xla_default", "xla_highest"))
    with pj.virtual_tpu("v5e"):
      pal = run(*args)
    exact = reference(*args, precision="highest")   # here: XLA on the CPU, exact f32 products
    for what, a in (("palace.jax kernel", pal), ("exact f32 (CPU)", exact),
                    ("bf16-rounded operands (CPU)", bf16_reference(*args)), ("chip XLA default", chip_xla),
                    ("chip XLA highest", chip_hi)):
      print(f"{name}: chip kernel vs {what:27s} max rel {_rel(chip_k, a):.2e}")
  print(f"select_oob_scalar: chip error={recs['select_oob_scalar']['error']}, output="
        f"{None if recs['select_oob_scalar']['output'] is None else _dec(recs['select_oob_scalar']['output'])}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", help="chip side: write the records here")
  ap.add_argument("--data", default=os.path.join(DATA_DIR, "v5e-decide-2026-12-06.jsonl"))
  a = ap.parse_args(argv)
  if a.out:
    chip(a.out)
  else:
    compare(a.data)
  return 0


if __name__ == "__main__":
  sys.exit(main())
