"""Chip probes for session 22's numeric classification of JAX's own Pallas TPU tests (docs/jax.md).

Each probe asks one question whose answer decides how a failing JAX test is classified under palace:
does the chip give, for the arithmetic the test compares, what the test's tolerance assumes? The kernel
and its reference both run ON THE CHIP here (the reference is XLA:TPU's, as in JAX's CI), so a probe
measures what palace cannot: the difference between Mosaic's in-kernel arithmetic and XLA:TPU's.

Self-contained: only the public JAX API shared by JAX 0.10.2 and 0.12 (`jax.experimental.pallas` and
`pallas.tpu`; the paged-attention probe also imports `jax.experimental.pallas.ops.tpu.paged_attention`
and is skipped when it does not import). Inputs come from fixed NumPy seeds. Prints ONE JSON line per
probe: the max abs difference, the max ulp difference (in the compared dtype) and how many elements
differ, for the kernel against the on-chip reference, and both against the exact (float64) value of the
same arithmetic on the host (operands as given, and operands rounded to bfloat16 as DEFAULT precision
does on the chip). Saves small raw outputs (`np.save`, < 2 MB in all) under --out (default $OUT).

On the TPU (JAX 0.10.2 or 0.12, about 30 s):

    python benchmarks/hw/probes_s22.py --out "$OUT" > "$OUT/probes_s22.jsonl"

Smoke test on the CPU (JAX's interpret mode; the "chip" reference is then XLA:CPU's, so the figures
are NOT the chip's):

    python benchmarks/hw/probes_s22.py --interpret --out /tmp/probes_s22
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu  # noqa: F401  (the TPU dialect must import)

F32 = np.float32
BF16 = jnp.bfloat16
SAVE_ROWS = 16   # rows of each 512-wide output saved (16 x 512 x 4 B = 32 KiB an array)
INTERPRET = False


# --------------------------------------------------------------------------- measures


def _ordered(a: np.ndarray) -> np.ndarray:
  """Float bits as integers ordered like the floats (adjacent floats differ by 1)."""
  a = np.asarray(a)
  if a.dtype == np.float32:
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)
  if a.dtype == np.dtype(BF16):
    i = a.view(np.int16).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFF), i)
  raise TypeError(a.dtype)


def diff(a, b, dtype=None) -> dict:
  """max abs, max ulp (in `dtype`, default a's) and count of differing elements of a and b."""
  a, b = np.asarray(a), np.asarray(b)
  dtype = np.dtype(dtype or a.dtype)
  if dtype.kind in "ui":
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    return {"max_abs": int(d.max(initial=0)), "n_diff": int((d != 0).sum()), "n": int(a.size)}
  fa, fb = a.astype(np.float64), b.astype(np.float64)
  ulp = np.abs(_ordered(a.astype(dtype)) - _ordered(b.astype(dtype)))
  max_abs = float(np.abs(fa - fb).max(initial=0))
  # near zero an ulp is meaningless: also the max abs difference in ulps of the largest |b|
  scale = float(np.spacing(np.asarray(np.abs(fb).max(initial=0), dtype)).astype(np.float64))
  return {"max_abs": max_abs, "max_ulp": int(ulp.max(initial=0)),
          "max_abs_in_ulps_of_max": round(max_abs / scale, 3) if scale > 0 else None,
          "n_diff": int((a.astype(dtype) != b.astype(dtype)).sum()), "n": int(a.size)}


def as_bf16_f64(x: np.ndarray) -> np.ndarray:
  """Operands as DEFAULT precision multiplies them on the chip: rounded to bf16 (nearest even)."""
  return np.asarray(x).astype(BF16).astype(np.float64)


def emit(name: str, what: str, out_dir: str, saved: dict, **fields) -> None:
  for k, v in saved.items():
    v = np.asarray(v)
    if v.dtype == np.dtype(BF16):
      v = v.view(np.uint16)   # np.save round-trips the bits; the JSON line says the dtype
    np.save(os.path.join(out_dir, f"{name}.{k}.npy"), v[:SAVE_ROWS] if v.ndim >= 2 else v)
  print(json.dumps({"probe": name, "what": what, **fields}), flush=True)


def normal(seed, shape, dtype=F32):
  return np.random.default_rng(seed).standard_normal(shape).astype(F32).astype(dtype)


def uniform(seed, shape):
  return np.random.default_rng(seed).random(shape, dtype=F32)


# --------------------------------------------------------------------------- kernels


def kblocked_matmul(x, y, bm=128, bk=128, bn=128):
  """out = x @ y as JAX's fusible / pipeline matmul tests compute it: a grid (m, n, k) of 128 blocks,
  float32 partial products accumulated over k in the resident output block (default precision)."""
  m, k = x.shape
  n = y.shape[1]

  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  return pl.pallas_call(
      kernel, grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), interpret=INTERPRET)(x, y)


def chained_matmul(x, y, w, fused: bool, bm=128, bk=128, bn=128):
  """(x @ y -> bf16) @ w blocked as tpu_fusible_matmul_test's test_dot_dot_fusion (bf16): fused, the
  first dot runs in the kernel per (i, k) block over the whole K; unfused, XLA computes it first."""
  m, kdim = x.shape
  n = w.shape[1]
  if not fused:
    t = jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
    return kblocked_matmul(t, w, bm, bk, bn)

  def kernel(x_ref, y_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    t = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32).astype(x_ref.dtype)
    o_ref[...] += jnp.dot(t, w_ref[...], preferred_element_type=jnp.float32)

  return pl.pallas_call(
      kernel, grid=(m // bm, n // bn, kdim // bk),
      in_specs=[pl.BlockSpec((bm, kdim), lambda i, j, kk: (i, 0)),
                pl.BlockSpec((kdim, bk), lambda i, j, kk: (0, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), interpret=INTERPRET)(x, y, w)


def elementwise(fn, x):
  """fn(x) in one whole-array kernel (grid=())."""
  def kernel(x_ref, o_ref):
    o_ref[...] = fn(x_ref[...])
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        interpret=INTERPRET)(x)


def xla_dot(x, y):
  return jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))(x, y)


# --------------------------------------------------------------------------- probes


def probe_kblocked(out_dir, name, x, y, bk, test, atol):
  kern = np.asarray(jax.jit(functools.partial(kblocked_matmul, bk=bk))(x, y))
  ref = np.asarray(xla_dot(x, y))
  xf, yf = np.asarray(x).astype(np.float64), np.asarray(y).astype(np.float64)
  exact = xf @ yf
  exact_bf = as_bf16_f64(x) @ as_bf16_f64(y)
  emit(name, f"K-blocked (bk={bk}) f32-accumulated in-kernel matmul vs XLA's one jnp.dot on the chip "
       f"({test}, atol {atol})", out_dir, {"kernel": kern, "xla": ref},
       shape=list(kern.shape), dtype=str(np.asarray(x).dtype), test=test, atol=atol,
       kernel_vs_xla=diff(kern, ref), passes_atol=bool(np.abs(kern - ref).max() <= atol),
       kernel_vs_exact_bf16_operands=diff(kern, exact_bf.astype(F32)),
       xla_vs_exact_bf16_operands=diff(ref, exact_bf.astype(F32)),
       kernel_vs_exact_operands=diff(kern, exact.astype(F32)),
       xla_vs_exact_operands=diff(ref, exact.astype(F32)))


def probe_chained(out_dir):
  x, y, w = (normal(s, (512, 512), BF16) for s in (10, 11, 12))
  fused = np.asarray(jax.jit(functools.partial(chained_matmul, fused=True))(x, y, w))
  unfused = np.asarray(jax.jit(functools.partial(chained_matmul, fused=False))(x, y, w))
  t_kernel = np.asarray(elementwise_dot_rows(x, y))
  t_xla = np.asarray(xla_dot(x, y))
  emit("dot_dot_bf16", "(x @ y -> bf16) @ w: first dot in the kernel (fused) vs by XLA (unfused); "
       "test_dot_dot_fusion3-5 assert_array_equal on v5e. Also the inner 512-K dot alone, in-kernel "
       "vs XLA, in f32", out_dir, {"fused": fused, "unfused": unfused},
       fused_vs_unfused=diff(fused, unfused), bit_equal=bool((fused == unfused).all()),
       inner_dot_kernel_vs_xla=diff(t_kernel, t_xla),
       inner_dot_bf16_kernel_vs_xla=diff(t_kernel.astype(BF16), t_xla.astype(BF16)))


def elementwise_dot_rows(x, y, bm=128, bn=128):
  """x @ y with the whole K in each block (the fused first dot of test_dot_dot_fusion)."""
  m, k = x.shape
  n = y.shape[1]

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  return jax.jit(lambda a, b: pl.pallas_call(
      kernel, grid=(m // bm, n // bn),
      in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((k, bn), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), interpret=INTERPRET)(a, b))(x, y)


def probe_xla_default_rounding(out_dir):
  """The reference side of paged attention (and of every f32 jnp.dot outside a kernel): does XLA:TPU's
  DEFAULT-precision f32 einsum round its operands to bf16, like Mosaic's in-kernel dot?"""
  q, k = normal(20, (32, 128)), normal(21, (2048, 128))
  ref = np.asarray(jax.jit(lambda a, b: jnp.einsum("gd,td->gt", a, b))(q, k))
  emit("xla_default_f32_einsum", "XLA's f32 einsum at DEFAULT precision on the chip vs the exact "
       "product of the f32 operands and of their bf16 roundings", out_dir, {"xla": ref},
       xla_vs_exact_bf16_operands=diff(ref, (as_bf16_f64(q) @ as_bf16_f64(k).T).astype(F32)),
       xla_vs_exact_operands=diff(ref, (q.astype(np.float64) @ k.astype(np.float64).T).astype(F32)))


def probe_paged_attention(out_dir):
  """tpu_paged_attention_kernel_test's f32 case with 4 q heads per kv head (atol 1e-2, rtol 2e-2), the
  kernel against the test's reference, both on the chip."""
  try:
    from jax.experimental.pallas.ops.tpu import paged_attention  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu.paged_attention import util  # noqa: PLC0415
  except Exception as e:   # not in this JAX: say so, and go on with the other probes
    print(json.dumps({"probe": "paged_attention_f32", "skipped": f"{type(e).__name__}: {e}"}))
    return
  seq_lens = np.asarray([0, 3, 256, 513, 1023, 2048], np.int32)
  page_size, max_len, nkv, ratio, hd = 16, 2048, 1, 4, 128
  pages_per_seq = max_len // page_size
  total = len(seq_lens) * pages_per_seq
  k_pages = normal(30, (nkv, total, page_size, hd))
  v_pages = normal(31, (nkv, total, page_size, hd))
  page_indices = np.random.default_rng(32).permutation(total).astype(np.int32).reshape(len(seq_lens), -1)
  q = normal(33, (len(seq_lens), nkv * ratio, hd))
  interpret = pltpu.force_tpu_interpret_mode() if INTERPRET else contextlib.nullcontext()
  with interpret:
    o = np.asarray(paged_attention.paged_attention(
        q, k_pages, v_pages, seq_lens, page_indices, pages_per_compute_block=512 // page_size))
  k = np.transpose(k_pages[:, page_indices], (1, 0, 2, 3, 4)).reshape(len(seq_lens), nkv, max_len, hd)
  v = np.transpose(v_pages[:, page_indices], (1, 0, 2, 3, 4)).reshape(len(seq_lens), nkv, max_len, hd)
  ref = np.asarray(util.grouped_query_attention_reference(q, k, v, seq_lens))
  ref_hi = np.asarray(jax.jit(lambda *a: _with_highest(util.grouped_query_attention_reference, *a))(
      q, k, v, seq_lens))
  live = seq_lens > 0
  err = np.abs(o[live] - ref[live]) - 2e-2 * np.abs(ref[live])
  emit("paged_attention_f32", "paged_attention (f32 pages, 4 q heads per kv head, page 16, head_dim 128, "
       "no soft cap) vs the test's reference (DEFAULT precision, and HIGHEST) on the chip", out_dir,
       {"kernel": o, "ref": ref, "ref_highest": ref_hi},
       kernel_vs_ref=diff(o[live], ref[live]), passes_tolerance=bool((err <= 1e-2).all()),
       worst_excess_over_tolerance=float(err.max() - 1e-2),
       kernel_vs_ref_highest=diff(o[live], ref_hi[live]), ref_vs_ref_highest=diff(ref[live], ref_hi[live]))


def _with_highest(f, *a):
  with jax.default_matmul_precision("highest"):
    return f(*a)


def probe_threefry(out_dir):
  """tpu_pallas_random_test test_pallas_matches_jax_threefry1 (normal, (8, 128)): the kernel's
  jax.random.normal vs XLA's, assert_array_equal."""
  key = jax.random.key(0, impl="threefry2x32")

  def body(key_ref, o_ref):
    o_ref[...] = jax.random.normal(key_ref[...], shape=o_ref[...].shape)

  with jax.threefry_partitionable(True):
    kern = np.asarray(pl.pallas_call(body, in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                                     out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                     interpret=INTERPRET)(key))
    ref = np.asarray(jax.random.normal(key, shape=(8, 128)))
  emit("threefry_normal", "jax.random.normal (threefry2x32) in a kernel vs XLA's, bit equality",
       out_dir, {"kernel": kern, "xla": ref}, kernel_vs_xla=diff(kern, ref))


def probe_transcendentals(out_dir):
  """Mosaic's f32 exp / log / erf_inv / tanh vs XLA:TPU's on the same inputs: bit-equal on the chip?
  (jax.random.normal's erf_inv uses log and sqrt; the SparseCore exp tests compare with jnp.exp.)"""
  rng = np.random.default_rng(40)
  u = np.concatenate([rng.uniform(-1, 1, 4096 - 8), [-0.999999, 0.999999, -1e-7, 1e-7, 0.5, -0.5, 0, 0.9]])
  cases = {
      "exp": (jnp.exp, rng.uniform(-80, 80, 4096)),
      "log": (jnp.log, np.exp(rng.uniform(-80, 80, 4096))),
      "log_near_1": (jnp.log, 1 + rng.uniform(-1e-2, 1e-2, 4096)),
      "erf_inv": (jax.lax.erf_inv, u),
      "tanh": (jnp.tanh, rng.uniform(-10, 10, 4096)),
      "sqrt": (jnp.sqrt, np.exp(rng.uniform(-40, 40, 4096))),
  }
  for op, (fn, x) in cases.items():
    x = x.astype(F32).reshape(32, 128)
    kern = np.asarray(elementwise(fn, x))
    ref = np.asarray(jax.jit(fn)(x))
    emit(f"eltwise_{op}", f"f32 {op} in a kernel vs XLA's on the same inputs", out_dir,
         {"input": x, "kernel": kern, "xla": ref}, kernel_vs_xla=diff(kern, ref))


def main(argv=None) -> int:
  global INTERPRET
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "probes_s22_out"),
                  help="folder for the raw outputs (default $OUT)")
  ap.add_argument("--interpret", action="store_true",
                  help="run the kernels in JAX's interpret mode (a CPU smoke test; NOT the chip)")
  ap.add_argument("--only", default="", help="comma-separated probe name prefixes")
  args = ap.parse_args(argv)
  INTERPRET = args.interpret
  os.makedirs(args.out, exist_ok=True)
  t0 = time.time()
  print(json.dumps({"probe": "_env", "jax": jax.__version__, "backend": jax.default_backend(),
                    "devices": [d.device_kind for d in jax.devices()], "interpret": INTERPRET}), flush=True)
  # (name, operands, K block, the JAX tests whose tolerance the answer decides)
  kblocked = (
      ("kblocked_f32_normal", lambda: (normal(1, (512, 512)), normal(2, (512, 512))), 128,
       "tpu_fusible_matmul_test test_matmul0-2 (f32)"),
      ("kblocked_f32_uniform", lambda: (uniform(3, (512, 512)), uniform(4, (512, 512))), 128,
       "tpu_pallas_pipeline_test test_matmul*, test_pipeline_matmul*"),
      ("kblocked_bf16_normal", lambda: (normal(1, (512, 512), BF16), normal(2, (512, 512), BF16)), 128,
       "tpu_fusible_matmul_test test_matmul3-5 (bf16)"),
      ("kblocked256_f32_normal", lambda: (normal(1, (512, 512)), normal(2, (512, 512))), 256,
       "K blocked by 256 (two MXU passes a block on v5e)"),
      ("fullk_f32_normal", lambda: (normal(1, (512, 512)), normal(2, (512, 512))), 512,
       "the whole K in one in-kernel dot"),
  )
  runs = [(name, functools.partial(lambda o, name, operands, bk, test: probe_kblocked(
      o, name, *operands(), bk, test, 5e-5), name=name, operands=operands, bk=bk, test=test))
          for name, operands, bk, test in kblocked]
  runs += [
      ("dot_dot_bf16", probe_chained),
      ("xla_default_f32_einsum", probe_xla_default_rounding),
      ("paged_attention_f32", probe_paged_attention),
      ("threefry_normal", probe_threefry),
      ("eltwise", probe_transcendentals),
  ]
  only = [p for p in args.only.split(",") if p]
  failed = 0
  for name, run in runs:
    if only and not any(name.startswith(p) for p in only):
      continue
    try:
      run(args.out)
    except Exception as e:   # a probe that fails to lower or run is a finding too: record it, go on
      failed += 1
      print(json.dumps({"probe": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}),
            flush=True)
  print(json.dumps({"probe": "_done", "seconds": round(time.time() - t0, 1), "errors": failed}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
