"""TPU numerics probes: what a real chip computes, bit for bit, versus palace.

Each probe is a small Pallas TPU kernel (one `pallas_call`, grid=(), whole arrays in VMEM) applied to
fixed deterministic inputs built with NumPy: matmuls (`jnp.dot` / `lax.dot_general` at each
precision, bf16, int8, mixed), f32 and bf16 transcendentals on sweeps of each op's range (tiny, huge
and special points included), reductions, softmax, cumsum, casts (f32->bf16 ties and NaNs, f32->int32
out of range, f8) and integer division with negatives. A probe that fails to lower or run is recorded
with its error: a rejection is a finding too.

On the chip (JAX only, no palace; about one compile per probe):

    python -m benchmarks.hw.numerics --chip benchmarks/hw/data/v5e-numerics-YYYYMMDD.jsonl
    # or, from Python:  from benchmarks.hw.numerics import chip_probes; chip_probes(path)

writes one JSON line per probe: {"name", "what", "inputs": {name: b64-npy}, "output": b64-npy or
null, "error": first line of the error or null}, plus "dtypes" (the dtype names of the inputs and the
output: bfloat16 and float8 arrays are stored as their unsigned-integer bit views, which `np.save`
can round-trip) and "backend" / "jax" (where it ran). With `NUMERICS_INTERPRET=1` the kernels run in
JAX's interpret mode (CPU), for testing the pipeline without a chip; never put such a file in
benchmarks/hw/data/.

Locally (.venv-jax), recompute every recorded probe on palace (`palace.jax.virtual_tpu("v5e")`) on
the recorded inputs and compare with the recorded output:

    .venv-jax/bin/python -m benchmarks.hw.numerics [--data PATH]   # default: newest data/v5e-numerics-*.jsonl

prints per probe bit-identical or not, the max ulp difference (in the output dtype), the max
relative error, and a summary. `compare(records)` returns the same as a list of dicts.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import glob
import io
import json
import os
import sys
import time
from typing import Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

F32 = np.float32
BF16 = jnp.bfloat16
F8E4M3 = jnp.float8_e4m3fn
F8E5M2 = jnp.float8_e5m2
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
P = jax.lax.Precision


# --------------------------------------------------------------------------- probe definitions


@dataclasses.dataclass(frozen=True)
class Probe:
  name: str
  what: str
  fn: Callable  # jnp arrays -> array or tuple of arrays (traced inside the kernel)
  inputs: Callable[[], dict]  # -> {name: np.ndarray}, deterministic
  context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


PROBES: list[Probe] = []


def probe(name, what, inputs, context=contextlib.nullcontext):
  def register(fn):
    PROBES.append(Probe(name, what, fn, inputs, context))
    return fn
  return register


def _rng(seed):
  return np.random.default_rng(seed)


def _bits_f32(u):
  return np.asarray(u, dtype=np.uint32).view(np.float32)


def _fit(values, shape, seed=0):
  """`values` (1-D), cut or padded with random normals to `shape`, as float32."""
  values = np.asarray(values, dtype=np.float64).astype(F32).ravel()
  n = int(np.prod(shape))
  if values.size < n:
    values = np.concatenate([values, _rng(seed + 999).standard_normal(n - values.size).astype(F32)])
  return values[:n].reshape(shape)


# Inputs that expose rounding.
_TINY = [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.1754942e-38, 1.17549435e-38, -1.17549435e-38, 2e-38]
_HUGE = [3.4028235e38, -3.4028235e38, 1e38, 1e30, -1e30]
_SPECIAL = [np.inf, -np.inf, np.nan, 1.0, -1.0, np.nextafter(F32(1), F32(2)), np.nextafter(F32(1), F32(0)),
            0.5, 2.0, -2.0]


def _signed_logspace(lo_exp, hi_exp, n, seed):
  r = _rng(seed)
  mag = 2.0 ** r.uniform(lo_exp, hi_exp, n)
  return mag * r.choice([-1.0, 1.0], n)


def _sweep(lo, hi, *, extra=(), positive_log=None, signed_log=None, seed=1, shape=(64, 128)):
  """An 8K-value sweep: dense linspace over [lo, hi], random uniform in it, log-spaced magnitudes,
  values within a few ulps of 1 and of the ends, special points."""
  r = _rng(seed)
  n = int(np.prod(shape))
  parts = [np.array(list(_SPECIAL) + list(_TINY) + list(_HUGE) + list(extra), dtype=np.float64)]
  near = []
  for c in (lo, hi, 1.0, -1.0, 0.5):
    c32 = F32(c)
    up = down = c32
    for _ in range(8):
      up, down = np.nextafter(up, F32(np.inf)), np.nextafter(down, F32(-np.inf))
      near += [up, down]
  parts.append(np.array(near, dtype=np.float64))
  parts.append(1.0 + r.standard_normal(512) * 2.0 ** -r.integers(8, 24, 512))  # near 1
  if positive_log is not None:
    parts.append(2.0 ** r.uniform(positive_log[0], positive_log[1], n // 8))
  if signed_log is not None:
    parts.append(_signed_logspace(signed_log[0], signed_log[1], n // 8, seed + 1))
  used = sum(p.size for p in parts)
  rest = n - used
  parts.append(np.linspace(lo, hi, rest // 2))
  parts.append(r.uniform(lo, hi, rest - rest // 2))
  return _fit(np.concatenate(parts), shape, seed)


def _matrix(shape, seed, *, axis=0):
  """A matmul operand, in four bands along `axis`: normals, values near 1, normals times 2^[-30,30],
  and full-24-bit-mantissa values (bf16 truncation and 3-pass splits differ on them)."""
  r = _rng(seed)
  a = r.standard_normal(shape)
  n = shape[axis]
  q = n // 4
  idx = [slice(None)] * 2
  def band(k):
    idx2 = list(idx)
    idx2[axis] = slice(k * q, (k + 1) * q)
    return tuple(idx2)
  sub = a[band(1)].shape
  a[band(1)] = 1.0 + r.standard_normal(sub) * 2.0 ** -r.integers(6, 20, sub)
  a[band(2)] = r.standard_normal(sub) * 2.0 ** r.integers(-30, 30, sub)
  m = r.integers(1 << 23, 1 << 24, sub).astype(np.float64) / (1 << 23)  # 24 significant bits
  a[band(3)] = m * r.choice([-1.0, 1.0], sub) * 2.0 ** r.integers(-3, 3, sub)
  return a.astype(F32)


def _mm_inputs(m, k, n, dtype_a=F32, dtype_b=F32, seed=10):
  def build():
    a = _matrix((m, k), seed, axis=0)
    b = _matrix((k, n), seed + 1, axis=1)
    return {"a": a.astype(dtype_a), "b": b.astype(dtype_b)}
  return build


# ---- 1. matmuls

for _prec_name, _prec in [("none", None), ("default", P.DEFAULT), ("high", P.HIGH), ("highest", P.HIGHEST)]:
  # precision=None and DEFAULT are the same request; the big shape only for None (keeps the file small).
  for _shape in [(128, 256, 128), (8, 128, 128)] if _prec_name != "default" else [(8, 128, 128)]:
    probe(f"dot_f32_{_prec_name}_{_shape[0]}x{_shape[1]}x{_shape[2]}",
          f"jnp.dot f32 x f32 -> f32, precision={_prec}",
          _mm_inputs(*_shape))(
        lambda a, b, _p=_prec: jnp.dot(a, b, precision=_p, preferred_element_type=jnp.float32))

for _prec_name, _prec in [("default", P.DEFAULT), ("high", P.HIGH), ("highest", P.HIGHEST)]:
  probe(f"dot_general_f32_{_prec_name}_8x128x128",
        f"lax.dot_general f32 x f32 -> f32 (NN), precision={_prec}",
        _mm_inputs(8, 128, 128, seed=20))(
      lambda a, b, _p=_prec: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=_p,
                                                 preferred_element_type=jnp.float32))
  probe(f"dot_general_nt_f32_{_prec_name}_8x128x128",
        f"lax.dot_general f32 x f32 -> f32 contracting both last dims (a @ b.T), precision={_prec}",
        _mm_inputs(8, 128, 128, seed=21))(
      lambda a, b, _p=_prec: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_p,
                                                 preferred_element_type=jnp.float32))

probe("dot_f32_ctx_highest_128x256x128",
      "jnp.dot f32 x f32 (no precision argument) traced under jax.default_matmul_precision('highest')",
      _mm_inputs(128, 256, 128), context=lambda: jax.default_matmul_precision("highest"))(
    lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
probe("dot_bf16_f32acc_128x256x128", "jnp.dot bf16 x bf16 -> f32 (preferred_element_type)",
      _mm_inputs(128, 256, 128, BF16, BF16))(
    lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
probe("dot_bf16_bf16out_128x256x128", "jnp.dot bf16 x bf16 -> bf16 (preferred_element_type=bf16)",
      _mm_inputs(128, 256, 128, BF16, BF16))(
    lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16))
probe("dot_bf16_default_out_128x256x128", "jnp.dot bf16 x bf16, no preferred_element_type (bf16 out)",
      _mm_inputs(128, 256, 128, BF16, BF16))(
    lambda a, b: jnp.dot(a, b))


def _int8_inputs():
  r = _rng(30)
  a = r.integers(-128, 128, (128, 256)).astype(np.int8)
  b = r.integers(-128, 128, (256, 128)).astype(np.int8)
  a[0, :] = -128
  b[:, 0] = -128  # out[0, 0] = 256 * 16384 = 2^22
  a[1, :] = 127
  return {"a": a, "b": b}


probe("dot_int8_int32_128x256x128", "jnp.dot int8 x int8 -> int32", _int8_inputs)(
    lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.int32))
probe("dot_f32_bf16_mixed_128x256x128", "jnp.dot f32 x bf16 -> f32 (mixed operands, default precision)",
      _mm_inputs(128, 256, 128, F32, BF16))(
    lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
probe("dot_f32_bf16_mixed_highest_128x256x128", "jnp.dot f32 x bf16 -> f32, precision=HIGHEST",
      _mm_inputs(128, 256, 128, F32, BF16))(
    lambda a, b: jnp.dot(a, b, precision=P.HIGHEST, preferred_element_type=jnp.float32))


# ---- 2. transcendentals and arithmetic, f32


def _unary(name, what, fn, **sweep):
  seed = 100 + len(PROBES)
  probe(name, what, lambda: {"x": _sweep(seed=seed, **sweep)})(fn)


_unary("exp_f32", "jnp.exp f32 over [-104, 89] (overflow 88.72, denormal results below -87.3)",
       jnp.exp, lo=-104.0, hi=89.0, extra=[88.72283, 88.72284, -87.33654, -103.27893], signed_log=(-30, 7))
_unary("exp2_f32", "jnp.exp2 f32 over [-150, 129]", jnp.exp2, lo=-150.0, hi=129.0,
       extra=[127.99999, 128.0, -126.0, -149.0, -149.5], signed_log=(-30, 7))
_unary("expm1_f32", "jnp.expm1 f32 over [-20, 89], dense near 0", jnp.expm1, lo=-20.0, hi=89.0,
       signed_log=(-40, 3))
_unary("log_f32", "jnp.log f32 on log-spaced positives 2^-149..2^128, near 1, <= 0", jnp.log,
       lo=0.0, hi=4.0, positive_log=(-149, 128), signed_log=(-126, 127))
_unary("log2_f32", "jnp.log2 f32 on log-spaced positives, exact powers of two", jnp.log2,
       lo=0.0, hi=4.0, positive_log=(-149, 128), extra=[2.0 ** k for k in range(-149, 128)])
_unary("log1p_f32", "jnp.log1p f32 on (-1, 1e38], dense near 0 and near -1", jnp.log1p,
       lo=-1.0, hi=8.0, signed_log=(-40, -1), positive_log=(-30, 127),
       extra=[-1.0 + 2.0 ** -k for k in range(1, 25)])
_unary("tanh_f32", "jnp.tanh f32 over [-12, 12], tiny and huge", jnp.tanh, lo=-12.0, hi=12.0,
       signed_log=(-40, 20))
_unary("sigmoid_f32", "jax.nn.sigmoid f32 over [-110, 110]", jax.nn.sigmoid, lo=-110.0, hi=110.0,
       signed_log=(-40, 20))
_unary("sin_f32", "jnp.sin f32 over [-10, 10], multiples of pi, large arguments", jnp.sin, lo=-10.0,
       hi=10.0, signed_log=(-30, 40), extra=list(np.pi * np.arange(-64, 65)) + [1e4, 1e6, 1e20, 3e38])
_unary("cos_f32", "jnp.cos f32 over [-10, 10], multiples of pi/2, large arguments", jnp.cos, lo=-10.0,
       hi=10.0, signed_log=(-30, 40), extra=list(np.pi / 2 * np.arange(-64, 65)) + [1e4, 1e6, 1e20])
_unary("sqrt_f32", "jnp.sqrt f32 on log-spaced positives incl. denormals, exact squares, negatives",
       jnp.sqrt, lo=0.0, hi=16.0, positive_log=(-149, 128),
       extra=[float(k * k) for k in range(1, 200)] + [-1.0, -0.0])
_unary("rsqrt_f32", "lax.rsqrt f32 on log-spaced positives incl. denormals, powers of 4", jax.lax.rsqrt,
       lo=0.0, hi=16.0, positive_log=(-149, 128), extra=[4.0 ** k for k in range(-60, 60)] + [-1.0])
_unary("reciprocal_f32", "1.0 / x f32 on signed log-spaced values incl. denormals, powers of two",
       lambda x: 1.0 / x, lo=-4.0, hi=4.0, signed_log=(-149, 128),
       extra=[2.0 ** k for k in range(-130, 128)] + [3.0, 7.0, 10.0])
# pltpu.reciprocal in JAX 0.12 (pl.reciprocal is deprecated there), pl.reciprocal in 0.10.
_reciprocal = getattr(pltpu, "reciprocal", None) or pl.reciprocal
_unary("pl_reciprocal_f32", "pltpu.reciprocal(x) (approx=False) f32", lambda x: _reciprocal(x),
       lo=-4.0, hi=4.0, signed_log=(-126, 126))
_unary("pl_reciprocal_approx_f32", "pltpu.reciprocal(x, approx=True) f32 (EUP approximation)",
       lambda x: _reciprocal(x, approx=True), lo=-4.0, hi=4.0, signed_log=(-126, 126))
_unary("erf_f32", "jax.lax.erf f32 over [-6, 6], tiny", jax.lax.erf, lo=-6.0, hi=6.0,
       signed_log=(-40, 4))
_unary("square_plus_fma_f32", "x * x + x f32 (is a*b+c fused?)", lambda x: x * x + x,
       lo=-4.0, hi=4.0, signed_log=(-70, 60))
_unary("denormal_f32", "(x * 1.0 + 0.0, x * 2^-10) f32 on denormal and near-denormal values (FTZ?)",
       lambda x: (x * jnp.float32(1.0) + jnp.float32(0.0), x * jnp.float32(2.0 ** -10)),
       lo=-1e-37, hi=1e-37, signed_log=(-149, -110), shape=(32, 128))


def _pow_inputs():
  r = _rng(200)
  n = 64 * 128
  x = 2.0 ** r.uniform(-40, 40, n)
  y = r.uniform(-8, 8, n)
  # Integer exponents on negative bases, exact powers, and the special cases of pow.
  k = n // 8
  x[:k] = r.uniform(-10, 10, k)
  y[:k] = r.integers(-6, 7, k)
  x[k:2 * k] = 2.0 ** r.integers(-20, 20, k)
  y[k:2 * k] = r.integers(-4, 5, k)
  sx = [0.0, 0.0, -0.0, 1.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0, 0.5, -2.0, 1e30, 1e-30, 10.0]
  sy = [0.0, -1.0, 3.0, np.nan, np.inf, np.inf, -0.5, 3.0, 0.0, 128.0, 150.0, 0.5, 2.0, 2.0, 38.5]
  x[2 * k:2 * k + len(sx)] = sx
  y[2 * k:2 * k + len(sy)] = sy
  return {"x": x.astype(F32).reshape(64, 128), "y": y.astype(F32).reshape(64, 128)}


probe("pow_f32", "jnp.power(x, y) f32: log-spaced x, fractional y, integer y on negative x, specials",
      _pow_inputs)(jnp.power)


def _div_inputs():
  r = _rng(201)
  n = 64 * 128
  x = _signed_logspace(-60, 60, n, 202)
  y = _signed_logspace(-60, 60, n, 203)
  k = n // 4
  # Exact quotients: x = y * q with q small integers or dyadic; a correctly rounded divide returns q.
  q = r.integers(-1000, 1000, k).astype(np.float64)
  yy = r.integers(1, 1 << 12, k).astype(np.float64) * 2.0 ** r.integers(-10, 10, k)
  x[:k], y[:k] = q * yy, yy
  # Near-1 quotients and big/small magnitudes.
  x[k:2 * k] = 1.0 + r.standard_normal(k) * 1e-6
  y[k:2 * k] = 1.0 + r.standard_normal(k) * 1e-6
  sx = [1.0, -1.0, 0.0, 1.0, np.inf, np.nan, 1e38, 1e-38, 3e38, 1.0, 1.0, 7.0, 1.0]
  sy = [0.0, 0.0, 0.0, np.inf, np.inf, 1.0, 1e-38, 1e38, 0.5, 3.0, 1e-45, 7.0, 1e38]
  x[2 * k:2 * k + len(sx)] = sx
  y[2 * k:2 * k + len(sy)] = sy
  return {"x": x.astype(F32).reshape(64, 128), "y": y.astype(F32).reshape(64, 128)}


probe("div_f32", "x / y f32: exact quotients, near-1, signed log-spaced, zeros/infs", _div_inputs)(
    lambda x, y: x / y)


def _fma_inputs():
  r = _rng(204)
  a = _matrix((64, 128), 205)
  b = _matrix((64, 128), 206, axis=1)
  c = -(a.astype(np.float64) * b).astype(F32)  # a*b + c is exactly the rounding error of a*b if fused
  c[:16] = r.standard_normal((16, 128)).astype(F32)
  return {"a": a, "b": b, "c": c}


probe("mul_add_f32", "a * b + c f32 with c = -fl(a*b): 0 unless the multiply-add is fused", _fma_inputs)(
    lambda a, b, c: a * b + c)


# ---- 2b. transcendentals, bf16


def _bf16_range(lo_exp, hi_exp):
  """Every bf16 value with exponent in [lo_exp, hi_exp], both signs, plus specials, as (rows, 128)
  bfloat16 with rows a multiple of 16."""
  bits = []
  for e in range(lo_exp, hi_exp + 1):
    for m in range(128):
      bits.append(((e + 127) << 7) | m)
  bits = np.array(bits, dtype=np.uint16)
  specials = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF7F],
                      dtype=np.uint16)
  allbits = np.concatenate([bits, bits | 0x8000, specials])
  n = -(-allbits.size // 2048) * 2048
  allbits = np.concatenate([allbits, np.full(n - allbits.size, 0x3F80, np.uint16)])
  return allbits.view(BF16).reshape(-1, 128)


def _bf16_unary(name, what, fn, lo_exp=-24, hi_exp=7):
  probe(name, what, lambda: {"x": _bf16_range(lo_exp, hi_exp)})(fn)


_bf16_unary("exp_bf16", "jnp.exp bf16 on every bf16 with |x| in [2^-24, 2^8)", jnp.exp)
_bf16_unary("tanh_bf16", "jnp.tanh bf16 on every bf16 with |x| in [2^-24, 2^8)", jnp.tanh)
_bf16_unary("silu_bf16", "x * jax.nn.sigmoid(x) bf16 on every bf16 with |x| in [2^-24, 2^8)",
            lambda x: x * jax.nn.sigmoid(x))
_bf16_unary("gelu_tanh_bf16", "jax.nn.gelu(x, approximate=True) bf16 on every bf16 with |x| in [2^-24, 2^8)",
            lambda x: jax.nn.gelu(x, approximate=True))
_bf16_unary("add_mul_bf16", "(x + 1) * x bf16: bf16 elementwise arithmetic rounding", lambda x: (x + 1) * x)


# ---- 3. reductions


def _reduce_input(shape, seed, dtype=F32):
  def build():
    a = _matrix(shape, seed, axis=0)
    a[:, :7] *= 1e4  # a few large terms per row: cancellation order matters
    a[:, 7:14] = -a[:, :7]
    return {"x": a.astype(dtype)}
  return build


probe("sum_f32_256x1024", "jnp.sum f32 (256,1024): axis -1 (256 values) then axis 0 (1024 values)",
      _reduce_input((256, 1024), 300))(
    lambda x: (jnp.sum(x, axis=-1, keepdims=True), jnp.sum(x, axis=0, keepdims=True)))
probe("sum_bf16_f32acc_64x1024", "jnp.sum(bf16, dtype=f32) (64,1024): axis -1 then axis 0",
      _reduce_input((64, 1024), 301, BF16))(
    lambda x: (jnp.sum(x, axis=-1, keepdims=True, dtype=jnp.float32),
               jnp.sum(x, axis=0, keepdims=True, dtype=jnp.float32)))
probe("sum_bf16_bf16out_64x1024", "jnp.sum bf16 -> bf16 (64,1024): axis -1 then axis 0",
      _reduce_input((64, 1024), 301, BF16))(
    lambda x: (jnp.sum(x, axis=-1, keepdims=True), jnp.sum(x, axis=0, keepdims=True)))


def _max_input():
  r = _rng(302)
  x = r.standard_normal((32, 1024)).astype(F32)
  x[0, 5] = np.nan
  x[1, :] = -0.0
  x[1, 3] = 0.0
  x[2, :] = -np.inf
  x[3, 9] = np.inf
  x[4, :] = 0.0
  x[4, 100] = -0.0
  x[5, 17] = np.nan
  x[5, 18] = np.inf
  return {"x": x}


probe("max_min_f32_32x1024", "jnp.max / jnp.min f32 (32,1024) axis -1 and 0, with NaN, +-0, +-inf",
      _max_input)(
    lambda x: (jnp.max(x, axis=-1, keepdims=True), jnp.max(x, axis=0, keepdims=True),
               jnp.min(x, axis=-1, keepdims=True), jnp.min(x, axis=0, keepdims=True)))


def _softmax_input():
  r = _rng(303)
  x = r.standard_normal((16, 1024)) * (2.0 ** r.integers(-4, 6, (16, 1)))
  x[0, :] = 0.0
  x[1, :] = 1e4 * r.standard_normal(1024)
  x[2, :] = -1e30
  return {"x": x.astype(F32)}


probe("softmax_f32_16x1024", "jax.nn.softmax f32 rows of 1024", _softmax_input)(
    lambda x: jax.nn.softmax(x, axis=-1))


@probe("softmax_manual_f32_16x1024", "exp(x - max) / sum(exp(x - max)) f32 rows of 1024", _softmax_input)
def _softmax_manual(x):
  e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  return e / jnp.sum(e, axis=-1, keepdims=True)


probe("cumsum_f32_64x128", "jnp.cumsum f32 (64,128) axis -1", _reduce_input((64, 128), 304))(
    lambda x: jnp.cumsum(x, axis=-1))
probe("cumsum_f32_axis0_64x128", "jnp.cumsum f32 (64,128) axis 0", _reduce_input((64, 128), 305))(
    lambda x: jnp.cumsum(x, axis=0))


# ---- 4. casts and integer arithmetic


def _f32_to_bf16_inputs():
  r = _rng(400)
  n = 128 * 128
  hi = r.integers(0, 0x7F80, n).astype(np.uint32)  # finite positive bf16 patterns
  lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
  lo = lows[r.integers(0, lows.size, n)]
  lo[: n // 4] = r.integers(0, 1 << 16, n // 4)
  sign = r.integers(0, 2, n).astype(np.uint32) << 31
  bits = sign | (hi << 16) | lo
  specials = np.array([
      0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F80FFFF, 0x7FBFFFFF, 0xFF800001,
      0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x80000001,
      0x007FFFFF, 0x00400000, 0x00008000, 0x00018000, 0x00000000, 0x80000000, 0x3F808000, 0x3F818000,
      0x3F80C000, 0x3F807FFF], dtype=np.uint32)
  bits[: specials.size] = specials
  return {"x": bits.view(F32).reshape(128, 128)}


probe("cast_f32_bf16", "f32 -> bf16 (x.astype): ties to even, NaN payloads, max f32, denormals",
      _f32_to_bf16_inputs)(lambda x: x.astype(jnp.bfloat16))


def _f32_to_int_inputs():
  r = _rng(401)
  v = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.99999994, -0.99999994, 1.7, -1.7, 2147483520.0, 2147483648.0,
       2147483904.0, -2147483648.0, -2147483904.0, 4294967296.0, 1e10, -1e10, 3e38, -3e38, np.inf,
       -np.inf, np.nan, -np.nan, 16777217.0, 8388608.5, -8388608.5, 1e-30, -1e-30, -0.0]
  x = np.concatenate([v, r.standard_normal(2048) * 1e6, _signed_logspace(-5, 40, 6000, 402)])
  return {"x": _fit(x, (64, 128), 401)}


probe("cast_f32_int32", "f32 -> int32 (x.astype): truncation, +-2^31, out of range, inf, NaN",
      _f32_to_int_inputs)(lambda x: x.astype(jnp.int32))


def _int_to_f32_inputs():
  r = _rng(403)
  v = [0, 1, -1, 2 ** 24, 2 ** 24 + 1, 2 ** 24 + 3, 2 ** 25 + 2, 2 ** 25 + 6, 2 ** 31 - 1, -2 ** 31,
       -2 ** 31 + 1, 2 ** 31 - 64, 2 ** 31 - 65, 2 ** 31 - 128, 2 ** 30 + 64, 2 ** 30 + 192, -(2 ** 24 + 1)]
  x = np.concatenate([v, r.integers(-2 ** 31, 2 ** 31, 4096), r.integers(2 ** 24, 2 ** 26, 2048),
                      r.integers(-2 ** 26, -2 ** 24, 2048)]).astype(np.int64)
  x = x[: 64 * 128]
  x = np.concatenate([x, np.zeros(64 * 128 - x.size, np.int64)]).astype(np.int32)
  return {"x": x.reshape(64, 128)}


probe("cast_int32_f32", "int32 -> f32: values beyond 2^24, ties, +-2^31", _int_to_f32_inputs)(
    lambda x: x.astype(jnp.float32))


def _f8_inputs(max_finite, min_sub, seed):
  def build():
    r = _rng(seed)
    n = 64 * 128
    x = _signed_logspace(np.log2(min_sub) - 3, np.log2(max_finite) + 2, n, seed)
    # Exactly representable values and their midpoints (ties).
    sp = [0.0, -0.0, np.inf, -np.inf, np.nan, max_finite, -max_finite, max_finite * 1.03,
          max_finite * 1.0625, max_finite * 1.07, max_finite * 2, 1e30, min_sub, min_sub / 2,
          min_sub * 0.51, min_sub * 1.5, min_sub * 2.5, 1.0, 1.0625, 1.125, 1.1875, 1.25, 1.5]
    x[: len(sp)] = sp
    x[len(sp):len(sp) + 2048] = r.uniform(-4, 4, 2048)
    return {"x": x.astype(F32).reshape(64, 128)}
  return build


probe("cast_f32_f8e4m3fn", "f32 -> float8_e4m3fn (ties, > 448 saturation or NaN, subnormals)",
      _f8_inputs(448.0, 2.0 ** -9, 404))(lambda x: x.astype(F8E4M3))
probe("cast_f32_f8e4m3fn_f32", "f32 -> float8_e4m3fn -> f32 round trip",
      _f8_inputs(448.0, 2.0 ** -9, 404))(lambda x: x.astype(F8E4M3).astype(jnp.float32))
probe("cast_f32_f8e5m2", "f32 -> float8_e5m2 (ties, overflow to inf, subnormals)",
      _f8_inputs(57344.0, 2.0 ** -16, 405))(lambda x: x.astype(F8E5M2))
probe("cast_f32_f8e5m2_f32", "f32 -> float8_e5m2 -> f32 round trip",
      _f8_inputs(57344.0, 2.0 ** -16, 405))(lambda x: x.astype(F8E5M2).astype(jnp.float32))


def _all_bf16():
  return {"x": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(512, 128)}


probe("cast_bf16_f32", "bf16 -> f32 on all 65536 bf16 bit patterns (denormals, NaN payloads)",
      _all_bf16)(lambda x: x.astype(jnp.float32))


def _int_div_inputs():
  r = _rng(406)
  n = 64 * 128
  a = r.integers(-1000, 1000, n)
  b = r.integers(1, 50, n) * r.choice([-1, 1], n)
  k = n // 4
  a[:k] = r.integers(-2 ** 31, 2 ** 31, k)
  b[:k] = r.integers(1, 2 ** 16, k) * r.choice([-1, 1], k)
  sa = [7, -7, 7, -7, -2 ** 31, -2 ** 31, 2 ** 31 - 1, 0, -1, 1]
  sb = [2, 2, -2, -2, 2, -2 ** 31, -2 ** 31, 5, 2 ** 31 - 1, -1]
  a[k:k + len(sa)] = sa
  b[k:k + len(sb)] = sb
  return {"a": a.astype(np.int32).reshape(64, 128), "b": b.astype(np.int32).reshape(64, 128)}


probe("int_div_rem", "int32 lax.div, lax.rem (C), // and % (floor) with negatives, INT_MIN",
      _int_div_inputs)(
    lambda a, b: (jax.lax.div(a, b), jax.lax.rem(a, b), a // b, a % b))


def _int_div_edge_inputs():
  a = np.array([1, -1, 0, 2 ** 31 - 1, -2 ** 31, -2 ** 31, 5, -5] * 128, dtype=np.int32)
  b = np.array([0, 0, 0, 0, 0, -1, 0, 0] * 128, dtype=np.int32)
  return {"a": a.reshape(8, 128), "b": b.reshape(8, 128)}


probe("int_div_edge", "int32 lax.div, lax.rem by zero and INT_MIN / -1 (undefined: what does it give?)",
      _int_div_edge_inputs)(lambda a, b: (jax.lax.div(a, b), jax.lax.rem(a, b)))


# --------------------------------------------------------------------------- running a probe


def _probe_call(p: Probe, arrays, interpret):
  structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
  out = jax.eval_shape(p.fn, *structs)
  multi = isinstance(out, (tuple, list))
  outs = tuple(out) if multi else (out,)
  n_in = len(arrays)

  def kernel(*refs):
    res = p.fn(*[r[...] for r in refs[:n_in]])
    res = tuple(res) if multi else (res,)
    for ref, v in zip(refs[n_in:], res):
      ref[...] = v

  spec = pl.BlockSpec(memory_space=pltpu.VMEM)
  kwargs = {"interpret": True} if interpret else {}
  call = pl.pallas_call(
      kernel,
      out_shape=tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs),
      in_specs=[spec] * n_in,
      out_specs=tuple(spec for _ in outs),
      name=f"numerics_{p.name}",
      **kwargs,
  )
  return call


def run_probe(p: Probe, inputs: dict, interpret: bool = False) -> np.ndarray:
  """Runs probe `p` on `inputs` (in `p.inputs()` order) on the current backend; returns its output
  (several outputs: flattened and concatenated)."""
  arrays = [np.asarray(v) for v in inputs.values()]
  with p.context():
    call = _probe_call(p, arrays, interpret)
    res = jax.jit(call)(*arrays)
    res = [np.asarray(jax.device_get(r)) for r in res]
  if len(res) == 1:
    return res[0]
  return np.concatenate([r.ravel() for r in res])


# --------------------------------------------------------------------------- encoding


_BITVIEW = {1: np.uint8, 2: np.uint16}


def _dtype_name(a):
  return np.dtype(a.dtype).name


def encode(a: np.ndarray) -> str:
  a = np.asarray(a)
  if a.dtype.kind == "V" or _dtype_name(a) in ("bfloat16",) or "float8" in _dtype_name(a):
    a = a.view(_BITVIEW[a.dtype.itemsize])
  buf = io.BytesIO()
  np.save(buf, a, allow_pickle=False)
  return base64.b64encode(buf.getvalue()).decode("ascii")


def decode(s: str, dtype_name: str | None = None) -> np.ndarray:
  a = np.load(io.BytesIO(base64.b64decode(s)), allow_pickle=False)
  if dtype_name is not None and dtype_name != a.dtype.name:
    a = a.view(jnp.dtype(dtype_name))
  return a


def _first_line(e: BaseException) -> str:
  text = f"{type(e).__name__}: {e}".strip()
  for line in text.splitlines():
    if line.strip():
      return line.strip()[:500]
  return type(e).__name__


# --------------------------------------------------------------------------- chip side


def chip_probes(out_path: str) -> None:
  """Runs every probe on JAX's default backend and writes one JSON line per probe to `out_path`.
  With NUMERICS_INTERPRET=1 in the environment the kernels run in JAX's interpret mode."""
  interpret = os.environ.get("NUMERICS_INTERPRET", "") not in ("", "0")
  backend = jax.default_backend()
  try:
    kind = jax.devices()[0].device_kind
  except Exception:  # noqa: BLE001
    kind = "?"
  where = f"{backend} ({kind}){' interpret' if interpret else ''}"
  t_all = time.perf_counter()
  n_err = 0
  with open(out_path, "w") as f:
    for p in PROBES:
      t0 = time.perf_counter()
      rec = {"name": p.name, "what": p.what, "inputs": {}, "output": None, "error": None,
             "dtypes": {}, "backend": where, "jax": jax.__version__}
      try:
        inputs = p.inputs()
        rec["inputs"] = {k: encode(v) for k, v in inputs.items()}
        rec["dtypes"] = {k: _dtype_name(np.asarray(v)) for k, v in inputs.items()}
        out = run_probe(p, inputs, interpret)
        rec["output"] = encode(out)
        rec["dtypes"]["output"] = _dtype_name(out)
      except Exception as e:  # noqa: BLE001  (a rejection is a finding)
        rec["error"] = _first_line(e)
        n_err += 1
      f.write(json.dumps(rec) + "\n")
      f.flush()
      status = "ok" if rec["error"] is None else f"ERROR {rec['error'][:100]}"
      print(f"{p.name:40s} {time.perf_counter() - t0:6.2f} s  {status}", flush=True)
  size = os.path.getsize(out_path)
  print(f"{len(PROBES)} probes ({n_err} errors) on {where} in {time.perf_counter() - t_all:.1f} s; "
        f"{out_path}: {size / 1e6:.2f} MB")


# --------------------------------------------------------------------------- compare (palace side)
# lives in benchmarks/hw/numerics_compare.py; `compare`, `load`, `report`, `diff_stats`, `BOUNDS` are
# also reachable from here.


def __getattr__(name):
  if name in ("compare", "load", "report", "diff_stats", "BOUNDS", "classify"):
    from benchmarks.hw import numerics_compare  # noqa: PLC0415
    return getattr(numerics_compare, name)
  raise AttributeError(name)


def _newest_data():
  files = sorted(glob.glob(os.path.join(DATA_DIR, "v5e-numerics-*.jsonl")), key=os.path.getmtime)
  return files[-1] if files else None


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m benchmarks.hw.numerics", description=__doc__.splitlines()[0])
  ap.add_argument("--data", help="recorded probes (default: newest benchmarks/hw/data/v5e-numerics-*.jsonl)")
  ap.add_argument("--chip", metavar="OUT", help="run the probes on JAX's default backend and write OUT")
  ap.add_argument("--only", help="comma-separated probe names (compare only those)")
  args = ap.parse_args(argv)
  if args.chip:
    chip_probes(args.chip)
    return 0
  from benchmarks.hw.numerics_compare import compare, load, report  # noqa: PLC0415
  path = args.data or _newest_data()
  if path is None:
    print(f"no data file: pass --data, or put v5e-numerics-*.jsonl in {DATA_DIR}")
    return 2
  records = load(path)
  if args.only:
    keep = set(args.only.split(","))
    records = [r for r in records if r["name"] in keep]
  print(f"{path}: {len(records)} probes recorded on {records[0].get('backend', '?') if records else '?'}"
        f" (jax {records[0].get('jax', '?') if records else '?'}); recomputed on palace v5e")
  report(compare(records))
  return 0


if __name__ == "__main__":
  sys.exit(main())
