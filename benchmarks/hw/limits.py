"""Accept / reject probes of the real TPU v5e Pallas compiler (Mosaic), compared with palace.

Each probe builds one small `pallas_call` with the public JAX Pallas API (`jax.experimental.pallas`,
`jax.experimental.pallas.tpu`, names shared by JAX 0.10.2 and 0.12) at an edge of what the TPU
compiler may take: block shapes per dtype, scoped VMEM and its limit, SMEM (scalar prefetch, scratch),
dot precisions and operand dtypes, vector ops, grids, semaphores and DMAs. The same probe code runs on
both sides:

* **On the chip** (a TPU v5e host with JAX, no palace): `chip_probes(out_path)` lowers, compiles and
  runs every probe once (`jax.jit(f).lower(*args)`, `.compile()`, one call; some errors, e.g. VMEM
  exhaustion, may only come at run time) and writes one JSON line per probe:
  `{"name", "what", "accepted", "stage", "error", "error_type"}` (`stage` is "lower", "compile" or
  "run" where it was rejected, null when accepted; `error` the first lines of the message). This file
  imports nothing of palace at module level, so it can be copied alone to the TPU host:

      python -m benchmarks.hw.limits --chip                # -> benchmarks/hw/data/v5e-limits-<date>.jsonl
      python benchmarks/hw/limits.py --chip OUT.jsonl      # the file alone, any output path
      python -c "from benchmarks.hw.limits import chip_probes; chip_probes('OUT.jsonl')"

  `python -m benchmarks.hw.chip --out DIR` calls it too (and puts an environment line first, which the
  local side reads). Recorded on 2026-12-05: the first 89 probes (`v5e-limits-2026-12-05.jsonl`), then
  all 152 with the 63 follow-up ones (the bounds the first run's messages pointed at;
  `v5e-limits-2026-12-05-followup.jsonl`, same JAX and libtpu, no environment line); the probes after
  those (`THIRD_RUN`) have no chip data yet. Each is a few small arrays; 15 s on the CPU in interpret
  mode, meant to stay under ~90 s on a v5e (each probe's time goes to stderr).
  `LIMITS_SKIP=name1,name2` leaves probes out; the DMA probes most likely to misbehave at run time
  come last, and records are flushed line by line.

* **Locally** (`.venv-jax`, JAX 0.12 + palace): every probe runs inside `palace.jax.virtual_tpu("v5e")`
  and is set beside the chip's record (default: every `benchmarks/hw/data/v5e-limits-*.jsonl` merged
  by `load_all`, a later run's record of a probe replacing an earlier one's; `--data` names files):

      PYTHONPATH=$PWD .venv-jax/bin/python -m benchmarks.hw.limits [--data PATH ...] [--only SUBSTR]

  It prints, per probe, the chip's verdict, palace's verdict with its error's first line, whether they
  agree, and the probe author's expectation for Mosaic (`exp`, a guess, `?` where unknown); then the
  counts. `compare(records)` returns the same rows as dicts (for tests).

* **Without a chip**: `LIMITS_INTERPRET=1 python -m benchmarks.hw.limits --chip` runs the chip side in
  JAX's TPU interpret mode on the CPU (`interpret=pltpu.InterpretParams()`), writing
  `/tmp/fake-limits.jsonl` (never under `benchmarks/hw/data/`). Interpret mode accepts nearly
  everything; this only checks the plumbing.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import glob
import json
import os
import sys
import time
from typing import Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MiB = 2**20
HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(HERE, "data")
FAKE_PATH = "/tmp/fake-limits.jsonl"
F32, BF16, I8, I16, I32 = jnp.float32, jnp.bfloat16, jnp.int8, jnp.int16, jnp.int32


@dataclasses.dataclass(frozen=True)
class Probe:
  name: str
  what: str
  expect: bool | None            # the author's guess for Mosaic on v5e (None: unknown); not data
  build: Callable                # build(pc) -> (fn, args); pc is pl.pallas_call (maybe with interpret)
  context: Callable | None = None  # a context manager factory the probe is built and run in


PROBES: list[Probe] = []


def probe(name, what, expect=None, context=None):
  def deco(build):
    PROBES.append(Probe(name, what, expect, build, context))
    return build
  return deco


# ---------------------------------------------------------------------------------------------------
# helpers

def _arange(shape, dtype):
  """Small distinct values that fit every dtype used (int8 included)."""
  n = int(np.prod(shape))
  x = (np.arange(n) % 7 + 1).reshape(shape)
  return jnp.asarray(x, dtype=dtype)


def _copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def _blocked_copy(pc, shape, dtype, block, *, vmem_limit=None, pipeline_mode=None):
  """o = x through blocks of `block` (None = squeezed dim) over the grid that covers `shape`."""
  dims = [1 if b is None else b for b in block]
  grid = tuple(-(-s // b) for s, b in zip(shape, dims))
  spec = pl.BlockSpec(tuple(block), lambda *g: g) if pipeline_mode is None else \
      pl.BlockSpec(tuple(block), lambda *g: g, pipeline_mode=pipeline_mode)
  params = None if vmem_limit is None else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit)
  f = pc(_copy_kernel, out_shape=jax.ShapeDtypeStruct(shape, dtype), grid=grid, in_specs=[spec],
         out_specs=pl.BlockSpec(tuple(block), lambda *g: g), compiler_params=params)
  return f, (_arange(shape, dtype),)


def _whole(pc, kernel, args, out_shape, **kw):
  """No grid: every operand whole in VMEM."""
  return pc(kernel, out_shape=out_shape, **kw), tuple(args)


def _sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


# ---------------------------------------------------------------------------------------------------
# block shapes by dtype (f32 array (16, 256) unless said)

def _block_probe(name, shape, dtype, block, expect, what):
  probe(name, what, expect)(lambda pc: _blocked_copy(pc, shape, dtype, block))


_block_probe("block_f32_8x128", (16, 256), F32, (8, 128), True, "f32 (16,256) in (8,128) blocks")
_block_probe("block_f32_16x128", (32, 256), F32, (16, 128), True, "f32 (32,256) in (16,128) blocks")
_block_probe("block_f32_4x128", (16, 256), F32, (4, 128), False, "f32 second-minor 4 (not 8k, not full)")
_block_probe("block_f32_8x64", (16, 256), F32, (8, 64), False, "f32 lane dim 64 (not 128k, not full)")
_block_probe("block_f32_1x128_full", (1, 256), F32, (1, 128), True,
             "f32 (1,256) in (1,128): second-minor 1 = full array dim")
_block_probe("block_f32_12x128_full", (12, 256), F32, (12, 128), True,
             "f32 (12,256) in (12,128): second-minor = full dim, not a multiple of 8")
_block_probe("block_f32_8x256", (16, 768), F32, (8, 256), True, "f32 lane block 256")
_block_probe("block_f32_8x192", (16, 768), F32, (8, 192), False, "f32 lane block 192 (not 128k)")
_block_probe("block_f32_whole_64x200", (64, 200), F32, (64, 200), True,
             "f32 (64,200) as one block: lane dim 200 = full, not 128k")
_block_probe("block_f32_8x200_full_lane", (64, 200), F32, (8, 200), True,
             "f32 (64,200) in (8,200): lane dim = full 200, second-minor 8")
_block_probe("block_bf16_8x128", (32, 256), BF16, (8, 128), None,
             "bf16 (8,128): second-minor 8 < bf16 native tile 16")
_block_probe("block_bf16_16x128", (32, 256), BF16, (16, 128), True, "bf16 (16,128) native tile")
_block_probe("block_int8_8x128", (64, 256), I8, (8, 128), None, "int8 (8,128): < int8 native tile 32")
_block_probe("block_int8_16x128", (64, 256), I8, (16, 128), None, "int8 (16,128): < int8 native tile 32")
_block_probe("block_int8_32x128", (64, 256), I8, (32, 128), True, "int8 (32,128) native tile")
_block_probe("block_int16_8x128", (32, 256), I16, (8, 128), None, "int16 (8,128): < native tile 16")
_block_probe("block_int16_16x128", (32, 256), I16, (16, 128), None, "int16 (16,128)")
_block_probe("block_3d_1x8x128", (4, 16, 256), F32, (1, 8, 128), True, "3-D f32 block, leading dim 1")
_block_probe("block_3d_squeezed", (4, 16, 256), F32, (None, 8, 128), True,
             "3-D f32 block, leading dim squeezed (None)")
_block_probe("block_3d_bf16_1x8x128", (4, 16, 256), BF16, (1, 8, 128), None,
             "3-D bf16 block (1,8,128): second-minor 8 < 16")
_block_probe("block_1d_f32_128", (2048,), F32, (128,), True, "rank-1 f32 block 128 (power of 2 >= 128)")
_block_probe("block_1d_f32_384", (1536,), F32, (384,), False,
             "rank-1 f32 block 384 (not 1024k, not a power of 2)")
_block_probe("block_1d_bf16_128", (2048,), BF16, (128,), False, "rank-1 bf16 block 128 (< 256)")


@probe("buffered_1", "input BlockSpec with pipeline_mode=pl.Buffered(1)", True)
def _(pc):
  return _blocked_copy(pc, (32, 256), F32, (8, 128), pipeline_mode=pl.Buffered(1))


@probe("buffered_3", "input BlockSpec with pipeline_mode=pl.Buffered(3)", None)
def _(pc):
  return _blocked_copy(pc, (32, 256), F32, (8, 128), pipeline_mode=pl.Buffered(3))


# ---------------------------------------------------------------------------------------------------
# scoped VMEM (default scoped limit on v5e: 16 MiB; VMEM: 128 MiB)

def _vmem_blocks(pc, block_mib, vmem_limit=None):
  """in + out f32, grid (2,): 4 block buffers of `block_mib` MiB each (double-buffered)."""
  rows = block_mib * MiB // (1024 * 4)
  return _blocked_copy(pc, (2 * rows, 1024), F32, (rows, 1024), vmem_limit=vmem_limit)


probe("vmem_blocks_12MiB_default", "in+out 3 MiB blocks double-buffered = 12 MiB, default limit",
      True)(lambda pc: _vmem_blocks(pc, 3))
probe("vmem_blocks_20MiB_default", "in+out 5 MiB blocks double-buffered = 20 MiB, default (16 MiB) "
      "limit", False)(lambda pc: _vmem_blocks(pc, 5))
probe("vmem_blocks_20MiB_limit64", "20 MiB of blocks with vmem_limit_bytes=64 MiB",
      True)(lambda pc: _vmem_blocks(pc, 5, 64 * MiB))
probe("vmem_blocks_100MiB_limit110", "100 MiB of blocks (4 x 25 MiB) with vmem_limit_bytes=110 MiB",
      None)(lambda pc: _vmem_blocks(pc, 25, 110 * MiB))
for _mib, _exp in ((100, True), (128, None), (130, None), (256, False)):
  probe(f"vmem_limit_{_mib}MiB", f"small (8,128) kernel with vmem_limit_bytes={_mib} MiB (VMEM is "
        "128 MiB)", _exp)(functools.partial(
            lambda pc, mib: _blocked_copy(pc, (16, 256), F32, (8, 128), vmem_limit=mib * MiB),
            mib=_mib))


def _vmem_scratch(pc, mib, vmem_limit=None):
  rows = mib * MiB // (1024 * 4)

  def kernel(x_ref, o_ref, s_ref):
    s_ref[pl.ds(rows - 8, 8), :] = x_ref[...]
    o_ref[...] = s_ref[pl.ds(rows - 8, 8), :] + 1.0
  params = None if vmem_limit is None else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit)
  return _whole(pc, kernel, [_arange((8, 1024), F32)], _sds((8, 1024), F32),
                scratch_shapes=[pltpu.VMEM((rows, 1024), F32)], compiler_params=params)


probe("vmem_scratch_8MiB_default", "8 MiB VMEM scratch, default limit",
      True)(lambda pc: _vmem_scratch(pc, 8))
probe("vmem_scratch_20MiB_default", "20 MiB VMEM scratch, default (16 MiB) limit",
      False)(lambda pc: _vmem_scratch(pc, 20))
probe("vmem_scratch_120MiB_limit128", "120 MiB VMEM scratch with vmem_limit_bytes=128 MiB",
      None)(lambda pc: _vmem_scratch(pc, 120, 128 * MiB))
probe("vmem_scratch_130MiB_limit128", "130 MiB VMEM scratch (> VMEM) with vmem_limit_bytes=128 MiB",
      False)(lambda pc: _vmem_scratch(pc, 130, 128 * MiB))


# ---------------------------------------------------------------------------------------------------
# SMEM (1 MiB on v5e per tpu_info; scalar prefetch and SMEM scratch live there)

def _prefetch(pc, n):
  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + s_ref[n - 1].astype(jnp.float32)
  gs = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(2,),
      in_specs=[pl.BlockSpec((8, 128), lambda i, s: (s[i], 0))],
      out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))
  f = pc(kernel, out_shape=_sds((16, 128), F32), grid_spec=gs)
  s = jnp.zeros((n,), I32).at[1].set(1)
  return f, (s, _arange((16, 128), F32))


for _k, _exp in ((1, True), (64, True), (128, None), (200, None), (300, False)):
  probe(f"prefetch_{_k}K_int32", f"scalar prefetch of {_k}K int32 ({_k * 4} KiB) in SMEM",
        _exp)(functools.partial(lambda pc, n: _prefetch(pc, n), n=_k * 1024))


def _smem_scratch(pc, n):
  def kernel(x_ref, o_ref, s_ref):
    s_ref[0] = 1
    s_ref[n - 1] = 2
    o_ref[...] = x_ref[...] + (s_ref[0] + s_ref[n - 1]).astype(jnp.float32)
  return _whole(pc, kernel, [_arange((8, 128), F32)], _sds((8, 128), F32),
                scratch_shapes=[pltpu.SMEM((n,), I32)])


for _k, _exp in ((1, True), (128, None), (256, False), (300, False)):
  probe(f"smem_scratch_{_k}K_int32", f"SMEM scratch of {_k}K int32 ({_k * 4} KiB)",
        _exp)(functools.partial(lambda pc, n: _smem_scratch(pc, n), n=_k * 1024))


@probe("smem_input_f32_8x128", "an (8,128) f32 input whole in SMEM, read as scalars", True)
def _(pc):
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.full((8, 128), x_ref[7, 127], jnp.float32)
  return _whole(pc, kernel, [_arange((8, 128), F32)], _sds((8, 128), F32),
                in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])


# ---------------------------------------------------------------------------------------------------
# dots

def _dot_probe(name, what, expect, a_shape, a_dtype, b_shape, b_dtype, out_dtype, fn):
  def build(pc):
    def kernel(a_ref, b_ref, o_ref):
      o_ref[...] = fn(a_ref[...], b_ref[...]).astype(o_ref.dtype)
    a, b = _arange(a_shape, a_dtype), _arange(b_shape, b_dtype)
    out = jax.eval_shape(fn, a, b)
    return _whole(pc, kernel, [a, b], _sds(out.shape, out_dtype))
  probe(name, what, expect)(build)


def _dg(precision=None, pref=None, dims=(((1,), (0,)), ((), ()))):
  return lambda a, b: lax.dot_general(a, b, dims, precision=precision, preferred_element_type=pref)


P = lax.Precision
_S = (128, 128)
_dot_probe("dot_f32_default", "f32 dot, precision DEFAULT", True, _S, F32, _S, F32, F32,
           _dg(P.DEFAULT, F32))
_dot_probe("dot_f32_highest", "f32 dot, precision HIGHEST", True, _S, F32, _S, F32, F32,
           _dg(P.HIGHEST, F32))
_dot_probe("dot_f32_high", "f32 dot, precision HIGH (bf16_3x)", False, _S, F32, _S, F32, F32,
           _dg(P.HIGH, F32))
_dot_probe("dot_f32_precision_mixed", "f32 dot, precision=(HIGHEST, DEFAULT) per operand", False,
           _S, F32, _S, F32, F32, _dg((P.HIGHEST, P.DEFAULT), F32))
_dot_probe("dot_bf16_to_f32", "bf16 x bf16 -> f32", True, _S, BF16, _S, BF16, F32, _dg(None, F32))
_dot_probe("dot_bf16_to_bf16", "bf16 x bf16 with preferred_element_type=bf16", False, _S, BF16, _S,
           BF16, BF16, _dg(None, BF16))
_dot_probe("dot_int8_to_int32", "int8 x int8 -> int32", True, _S, I8, _S, I8, I32, _dg(None, I32))
_dot_probe("dot_uint8_to_int32", "uint8 x uint8 -> int32 (unsigned dot)", False, _S, jnp.uint8, _S,
           jnp.uint8, I32, _dg(None, I32))
_dot_probe("dot_int8_x_bf16", "int8 x bf16 -> f32 (mixed operand dtypes)", None, _S, I8, _S, BF16, F32,
           _dg(None, F32))
_dot_probe("dot_f32_x_bf16", "f32 x bf16 -> f32 (mixed operand dtypes)", None, _S, F32, _S, BF16, F32,
           _dg(None, F32))
_dot_probe("dot_fp8_e4m3fn", "float8_e4m3fn x float8_e4m3fn -> f32 (v5e has no fp8 MXU)", None, _S,
           jnp.float8_e4m3fn, _S, jnp.float8_e4m3fn, F32, _dg(None, F32))
_dot_probe("dot_fp8_e5m2", "float8_e5m2 x float8_e5m2 -> f32", None, _S, jnp.float8_e5m2, _S,
           jnp.float8_e5m2, F32, _dg(None, F32))
_dot_probe("dot_small_m8_k64_n64", "f32 (8,64) x (64,64): M=8, K=64, N=64", None, (8, 64), F32,
           (64, 64), F32, F32, _dg(None, F32))
_dot_probe("dot_batched_3d", "f32 einsum 'bqd,bkd->bqk' on (2,128,128)", True, (2, 128, 128), F32,
           (2, 128, 128), F32, F32,
           lambda a, b: jnp.einsum("bqd,bkd->bqk", a, b, preferred_element_type=jnp.float32))
_dot_probe("dot_contract_0_0", "f32 dot_general contracting (0,0): lhs transposed", None, _S, F32, _S,
           F32, F32, _dg(None, F32, (((0,), (0,)), ((), ()))))
_dot_probe("dot_contract_1_1", "f32 dot_general contracting (1,1): rhs transposed (NT)", True, _S,
           F32, _S, F32, F32, _dg(None, F32, (((1,), (1,)), ((), ()))))


# ---------------------------------------------------------------------------------------------------
# vector ops (whole arrays in VMEM)

def _op_probe(name, what, expect, shapes_dtypes, fn, context=None):
  def build(pc):
    args = [_arange(s, d) for s, d in shapes_dtypes]

    def kernel(*refs):
      *ins, o_ref = refs
      o_ref[...] = fn(*(r[...] for r in ins))
    out = jax.eval_shape(fn, *args)
    return _whole(pc, kernel, args, _sds(out.shape, out.dtype))
  probe(name, what, expect, context)(build)


_op_probe("int8_div", "int8 (32,128) // int8 (32,128)", None, [((32, 128), I8)] * 2, lambda a, b: a // b)
_op_probe("int16_div", "int16 (16,128) // int16", None, [((16, 128), I16)] * 2, lambda a, b: a // b)
_op_probe("int16_add", "int16 (16,128) + int16", None, [((16, 128), I16)] * 2, lambda a, b: a + b)
_op_probe("int32_div_rem", "int32 (8,128) // and % int32", True, [((8, 128), I32)] * 2,
          lambda a, b: a // b + a % b)
_op_probe("bool_ops", "bool and/or/not of comparisons, where -> f32", True, [((8, 128), F32)] * 2,
          lambda a, b: jnp.where(((a > 2) & ~(b < 3)) | (a == b), a, b))
_op_probe("bool_output", "a bool (8,128) output ref", None, [((8, 128), F32)], lambda a: a > 3)
_op_probe("f64_add", "float64 (8,128) add (jax_enable_x64)", False, [((8, 128), jnp.float64)] * 2,
          lambda a, b: a + b, context=lambda: jax.enable_x64(True))
_op_probe("sort_last_axis", "jnp.sort of f32 (8,128) along lanes", False, [((8, 128), F32)],
          lambda a: jnp.sort(a, axis=-1))
_op_probe("argmax_last_axis", "jnp.argmax of f32 (8,128) along lanes (keepdims)", None,
          [((8, 128), F32)], lambda a: jnp.argmax(a, axis=-1, keepdims=True).astype(jnp.int32))
_op_probe("cumsum_last_axis", "jnp.cumsum of f32 (8,128) along lanes", False, [((8, 128), F32)],
          lambda a: jnp.cumsum(a, axis=-1))
_op_probe("gather_take_along_lanes", "jnp.take_along_axis on the lane axis (tpu.dynamic_gather)", True,
          [((8, 128), F32), ((8, 128), I32)], lambda a, i: jnp.take_along_axis(a, i % 128, axis=-1))
_op_probe("gather_rows_take", "jnp.take of rows by an index vector (general gather)", False,
          [((8, 128), F32), ((8,), I32)], lambda a, i: jnp.take(a, i % 8, axis=0))
_op_probe("reshape_split_lanes", "f32 reshape (8,256) -> (16,128) (splits the lane dim)", None,
          [((8, 256), F32)], lambda a: a.reshape(16, 128))
_op_probe("reshape_merge_sublanes", "f32 reshape (16,128) -> (8,256)", None, [((16, 128), F32)],
          lambda a: a.reshape(8, 256))
_op_probe("transpose_bf16_128", "bf16 (128,128) transpose", True, [((128, 128), BF16)], lambda a: a.T)
_op_probe("transpose_f32_8x128", "f32 (8,128) -> (128,8) transpose", None, [((8, 128), F32)],
          lambda a: a.T)
_op_probe("iota_1d_broadcast", "1-D iota (128,) broadcast to (8,128) and added", None,
          [((8, 128), I32)], lambda a: a + jnp.broadcast_to(lax.iota(jnp.int32, 128), (8, 128)))
_op_probe("reduce_sum_1d_out", "f32 (8,128) sum over lanes -> (8,) rank-1 output", None,
          [((8, 128), F32)], lambda a: jnp.sum(a, axis=-1))


# ---------------------------------------------------------------------------------------------------
# grids, compiler params

@probe("grid_zero", "grid=(0,): no steps", None)
def _(pc):
  f = pc(_copy_kernel, out_shape=_sds((8, 128), F32), grid=(0,),
         in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
         out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
  return f, (_arange((8, 128), F32),)


@probe("dimsem_length_mismatch", "grid (2,) with dimension_semantics of length 2", False)
def _(pc):
  f = pc(_copy_kernel, out_shape=_sds((16, 128), F32), grid=(2,),
         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
         compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")))
  return f, (_arange((16, 128), F32),)


# ---------------------------------------------------------------------------------------------------
# DMAs and semaphores

def _dma_sems(pc, n):
  def kernel(x_hbm, o_hbm, sems):
    c = pltpu.make_async_copy(x_hbm, o_hbm, sems.at[n - 1])
    c.start()
    c.wait()
  f = pc(kernel, out_shape=_sds((16, 128), F32), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
         out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])
  return f, (_arange((16, 128), F32),)


for _n, _exp in ((16, True), (1024, None), (65536, None)):
  probe(f"dma_semaphores_{_n}", f"HBM->HBM DMA with a DMA semaphore array of {_n}",
        _exp)(functools.partial(lambda pc, n: _dma_sems(pc, n), n=_n))


def _mismatched_dma(pc, src_shape, src_dtype, dst_dtype):
  """An HBM (src_shape, src_dtype) -> VMEM scratch (8, 128) dst_dtype DMA."""
  def kernel(x_hbm, o_ref, buf, sem):
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    o_ref[...] = buf[...]
  f = pc(kernel, out_shape=_sds((8, 128), dst_dtype), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
         scratch_shapes=[pltpu.VMEM((8, 128), dst_dtype), pltpu.SemaphoreType.DMA(())])
  return f, (_arange(src_shape, src_dtype),)


probe("dma_shape_mismatch", "HBM (16,128) -> VMEM scratch (8,128) DMA", False)(
    lambda pc: _mismatched_dma(pc, (16, 128), F32, F32))
probe("dma_dtype_mismatch", "HBM f32 (8,128) -> VMEM int32 (8,128) DMA", False)(
    lambda pc: _mismatched_dma(pc, (8, 128), F32, I32))


@probe("block_any_space_windowed", "a BlockSpec in memory space ANY with a real window (not the whole "
       "array)", False)
def _(pc):
  def kernel(x_hbm, o_ref):
    pltpu.sync_copy(x_hbm.at[pl.ds(0, 8)], o_ref)   # valid whether x_hbm is (8,128) or (16,128)
  f = pc(kernel, out_shape=_sds((16, 128), F32), grid=(2,),
         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pl.ANY)],
         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  return f, (_arange((16, 128), F32),)



# ---------------------------------------------------------------------------------------------------
# follow-up probes (second run, 2026-12-05): the bounds the first run's messages pointed at

U8, F8 = jnp.uint8, jnp.float8_e4m3fn
for _nm, _sh, _dt, _bl in (("int8_16x256_8x128", (16, 256), I8, (8, 128)),
                           ("int8_32x256_8x128", (32, 256), I8, (8, 128)),
                           ("int8_96x256_32x128", (96, 256), I8, (32, 128)),
                           ("int8_48x256_16x128", (48, 256), I8, (16, 128)),
                           ("uint8_64x256_16x128", (64, 256), U8, (16, 128)),
                           ("fp8_64x256_16x128", (64, 256), F8, (16, 128)),
                           ("fp8_64x256_32x128", (64, 256), F8, (32, 128)),
                           ("bool_64x256_8x128", (64, 256), jnp.bool_, (8, 128)),
                           ("int16_128x256_8x128", (128, 256), I16, (8, 128)),
                           ("bf16_128x256_8x128", (128, 256), BF16, (8, 128))):
  _block_probe(f"block_{_nm}", _sh, _dt, _bl, None, f"{_dt.__name__} {_sh} in {_bl} blocks")

for _nm, _dt, _fn in (("add", I8, lambda a, b: a + b), ("mul", I8, lambda a, b: a * b),
                      ("max", I8, jnp.maximum), ("neg", I8, lambda a, b: -a),
                      ("and", I8, lambda a, b: a & b), ("shift", I8, lambda a, b: a >> 1),
                      ("where", I8, lambda a, b: jnp.where(a > b, a, b)),
                      ("compare", I8, lambda a, b: (a > b).astype(I32)),
                      ("cast_add", I8, lambda a, b: a.astype(I32) + b.astype(I32)),
                      ("to_f32", I8, lambda a, b: a.astype(F32) * 2.0),
                      ("add", U8, lambda a, b: a + b),
                      ("mul", I16, lambda a, b: a * b), ("rem", I16, lambda a, b: a % b),
                      ("max", I16, jnp.maximum), ("shift", I16, lambda a, b: a >> 1),
                      ("where", I16, lambda a, b: jnp.where(a > b, a, b)),
                      ("to_f32", I16, lambda a, b: a.astype(F32) * 2.0)):
  _op_probe(f"{_dt.__name__}_{_nm}_op", f"{_dt.__name__} (32,128) {_nm}", None,
            [((32, 128), _dt)] * 2, _fn)

_op_probe("gather_take_along_sublanes", "jnp.take_along_axis on the sublane axis (axis 0)", None,
          [((8, 128), F32), ((8, 128), I32)], lambda a, i: jnp.take_along_axis(a, i % 8, axis=0))

for _w in (256, 144, 128, 64, 36, 35, 0):          # bytes below 1 MiB
  probe(f"prefetch_1MiB_minus_{_w * 4}B", f"scalar prefetch of 1 MiB - {_w * 4} B of int32", None)(
      functools.partial(lambda pc, n: _prefetch(pc, n), n=262144 - _w))
for _w in (256, 128, 64, 36):
  probe(f"smem_scratch_1MiB_minus_{_w * 4}B", f"SMEM scratch of 1 MiB - {_w * 4} B of int32", None)(
      functools.partial(lambda pc, n: _smem_scratch(pc, n), n=262144 - _w))


def _regular_sems(pc, n):
  def kernel(x_ref, o_ref, sems):
    (getattr(pl, "semaphore_signal", None) or pltpu.semaphore_signal)(sems.at[n - 1], 1)
    (getattr(pl, "semaphore_wait", None) or pltpu.semaphore_wait)(sems.at[n - 1], 1)
    o_ref[...] = x_ref[...]
  return _whole(pc, kernel, [_arange((8, 128), F32)], _sds((8, 128), F32),
                scratch_shapes=[pltpu.SemaphoreType.REGULAR((n,))])


def _grid_dma_sems(pc, n):
  def kernel(x_ref, o_ref, sems):
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[n - 1])
    c.start()
    c.wait()
  f = pc(kernel, out_shape=_sds((16, 128), F32), grid=(2,),
         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
         scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])
  return f, (_arange((16, 128), F32),)


for _n in (256, 500, 508, 511, 512, 513):
  probe(f"dma_semaphores_{_n}", f"HBM->HBM DMA with a DMA semaphore array of {_n}", None)(
      functools.partial(lambda pc, n: _dma_sems(pc, n), n=_n))
for _n in (508, 512, 513):
  probe(f"regular_semaphores_{_n}", f"a REGULAR semaphore array of {_n}", None)(
      functools.partial(lambda pc, n: _regular_sems(pc, n), n=_n))
  probe(f"grid_dma_semaphores_{_n}", f"grid (2,), pipelined blocks + {_n} DMA semaphores", None)(
      functools.partial(lambda pc, n: _grid_dma_sems(pc, n), n=_n))


def _scratch_and_blocks(pc, scratch_mib, block_mib, vmem_limit=None):
  """grid (2,), in + out f32 blocks of `block_mib` MiB (double-buffered) and a VMEM scratch."""
  rows, srows = block_mib * MiB // 4096, scratch_mib * MiB // 4096

  def kernel(x_ref, o_ref, s_ref):
    s_ref[pl.ds(srows - 8, 8), :] = x_ref[pl.ds(0, 8), :]
    o_ref[...] = x_ref[...]
    o_ref[pl.ds(0, 8), :] = s_ref[pl.ds(srows - 8, 8), :] + 1.0
  params = None if vmem_limit is None else pltpu.CompilerParams(vmem_limit_bytes=vmem_limit)
  f = pc(kernel, out_shape=_sds((2 * rows, 1024), F32), grid=(2,),
         in_specs=[pl.BlockSpec((rows, 1024), lambda i: (i, 0))],
         out_specs=pl.BlockSpec((rows, 1024), lambda i: (i, 0)),
         scratch_shapes=[pltpu.VMEM((srows, 1024), F32)], compiler_params=params)
  return f, (_arange((2 * rows, 1024), F32),)


def _run_scoped_vmem(pc, mib):
  rows = mib * MiB // 4096

  def kernel(x_ref, o_ref):
    def body(s_ref):
      s_ref[pl.ds(rows - 8, 8), :] = x_ref[...]
      o_ref[...] = s_ref[pl.ds(rows - 8, 8), :] + 1.0
    pl.run_scoped(body, pltpu.VMEM((rows, 1024), F32))
  return _whole(pc, kernel, [_arange((8, 1024), F32)], _sds((8, 1024), F32))


probe("vmem_scratch_20MiB_limit16", "20 MiB VMEM scratch, vmem_limit_bytes=16 MiB explicitly", None)(
    lambda pc: _vmem_scratch(pc, 20, 16 * MiB))
probe("vmem_scratch_100MiB_default", "100 MiB VMEM scratch, default limit", None)(
    lambda pc: _vmem_scratch(pc, 100))
probe("vmem_scratch_127MiB_default", "127 MiB VMEM scratch, default limit", None)(
    lambda pc: _vmem_scratch(pc, 127))
probe("vmem_scratch_100MiB_blocks_12MiB", "100 MiB scratch + 12 MiB of blocks, default limit", None)(
    lambda pc: _scratch_and_blocks(pc, 100, 3))
probe("vmem_scratch_120MiB_blocks_12MiB", "120 MiB scratch + 12 MiB of blocks, default limit", None)(
    lambda pc: _scratch_and_blocks(pc, 120, 3))
probe("vmem_scratch_8MiB_blocks_12MiB", "8 MiB scratch + 12 MiB of blocks, default limit", None)(
    lambda pc: _scratch_and_blocks(pc, 8, 3))
probe("vmem_run_scoped_12MiB_default", "run_scoped 12 MiB VMEM, default limit", None)(
    lambda pc: _run_scoped_vmem(pc, 12))
probe("vmem_run_scoped_20MiB_default", "run_scoped 20 MiB VMEM, default limit", None)(
    lambda pc: _run_scoped_vmem(pc, 20))
probe("vmem_run_scoped_100MiB_default", "run_scoped 100 MiB VMEM, default limit", None)(
    lambda pc: _run_scoped_vmem(pc, 100))
probe("vmem_blocks_132MiB_limit256", "132 MiB of blocks (4 x 33 MiB) with vmem_limit_bytes=256 MiB",
      None)(lambda pc: _vmem_blocks(pc, 33, 256 * MiB))
probe("vmem_blocks_24MiB_limit20", "24 MiB of blocks with vmem_limit_bytes=20 MiB", None)(
    lambda pc: _vmem_blocks(pc, 6, 20 * MiB))


@probe("block_any_space_whole", "a BlockSpec in memory space ANY: whole array, index map all 0s", None)
def _(pc):
  def kernel(x_hbm, o_ref):
    pltpu.sync_copy(x_hbm.at[pl.ds(0, 8)], o_ref)
  f = pc(kernel, out_shape=_sds((16, 128), F32), grid=(2,),
         in_specs=[pl.BlockSpec((16, 128), lambda i: (0, 0), memory_space=pl.ANY)],
         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  return f, (_arange((16, 128), F32),)


# ---------------------------------------------------------------------------------------------------
# third run (no chip data yet): why 120 MiB of scratch + 12 MiB of blocks compiled (> 128 MiB of VMEM)

def _scratch_carried(pc, scratch_mib, block_mib):
  """As `_scratch_and_blocks`, but the scratch rows are written at grid step 0 and read at step 1: a
  value carried across steps, which no store-to-load forwarding inside one step can remove."""
  rows, srows = block_mib * MiB // 4096, scratch_mib * MiB // 4096

  def kernel(x_ref, o_ref, s_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
      s_ref[pl.ds(srows - 8, 8), :] = x_ref[pl.ds(0, 8), :]
    o_ref[...] = x_ref[...]

    @pl.when(i == 1)
    def _():
      o_ref[pl.ds(0, 8), :] = s_ref[pl.ds(srows - 8, 8), :] + 1.0
  f = pc(kernel, out_shape=_sds((2 * rows, 1024), F32), grid=(2,),
         in_specs=[pl.BlockSpec((rows, 1024), lambda i: (i, 0))],
         out_specs=pl.BlockSpec((rows, 1024), lambda i: (i, 0)),
         scratch_shapes=[pltpu.VMEM((srows, 1024), F32)])
  return f, (_arange((2 * rows, 1024), F32),)


THIRD_RUN = ("vmem_scratch_120MiB_blocks_12MiB_carried", "vmem_scratch_124MiB_blocks_12MiB")
probe(THIRD_RUN[0], "120 MiB scratch written at step 0, read at step 1, + 12 MiB of blocks", None)(
    lambda pc: _scratch_carried(pc, 120, 3))
probe(THIRD_RUN[1], "124 MiB scratch + 12 MiB of blocks (136 MiB), default limit", None)(
    lambda pc: _scratch_and_blocks(pc, 124, 3))

# Recorded probes where palace keeps its rule against the chip's verdict, with the reason
# (docs/limits.md); `main` lists them, tests/jax_backend/test_chip_limits.py holds them to this list.
KNOWN_DISAGREEMENTS = {
    "vmem_scratch_120MiB_blocks_12MiB": (
        "the chip compiled 120 MiB of scratch beside 12 MiB of double-buffered blocks (132 MiB > its "
        "128 MiB of VMEM); palace keeps the sum rule (blocks + scratch <= VMEM less internal scratch), "
        "which 130 MiB of scratch alone and 132 MiB of blocks alone confirm. Why the chip fits it is "
        "not known: the probe stores and loads the same 8 scratch rows in one step (the compiler may "
        "forward them and drop the scratch), or the compiler's plan does not keep both live at once; "
        "the THIRD_RUN probes would tell"),
}


# ---------------------------------------------------------------------------------------------------
# running a probe (shared by both sides)

def _first_lines(e: BaseException, n: int = 3, width: int = 400) -> str:
  lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
  if any(ln.startswith("Traceback") for ln in lines[:3]):   # a wrapped Python error: keep its end
    lines = lines[:1] + lines[-(n - 1):]
  return "\n".join(ln[:width] for ln in lines[:n]) or type(e).__name__


def _stages(p: Probe, pc, state: dict) -> None:
  state["stage"] = "lower"           # building the call counts as lowering (tracing happens there)
  fn, args = p.build(pc)
  lowered = jax.jit(fn).lower(*args)
  state["stage"] = "compile"
  compiled = lowered.compile()
  state["stage"] = "run"
  jax.block_until_ready(compiled(*args))
  state["stage"] = None


def _record(p: Probe, state: dict, err: BaseException | None) -> dict:
  return {"name": p.name, "what": p.what, "accepted": err is None,
          "stage": None if err is None else state["stage"],
          "error": None if err is None else _first_lines(err),
          "error_type": None if err is None else type(err).__name__}


def run_probe(p: Probe, pc) -> dict:
  """Build, lower, compile and run `p` with `pc` as pallas_call; never raises (but KeyboardInterrupt)."""
  state = {"stage": "lower"}
  try:
    with (p.context() if p.context else contextlib.nullcontext()):
      _stages(p, pc, state)
  except Exception as e:  # noqa: BLE001 -- every rejection is data
    return _record(p, state, e)
  return _record(p, state, None)


def _in_data_dir(path: str) -> bool:
  return os.path.commonpath([os.path.abspath(path), DATA_DIR]) == DATA_DIR


def chip_probes(out_path: str) -> None:
  """Run every probe on the default JAX backend (a TPU v5e) and write one JSON line per probe.

  With LIMITS_INTERPRET=1 the probes run in JAX's TPU interpret mode on the CPU instead, and the
  records go to /tmp/fake-limits.jsonl whatever `out_path` says (fake data never under data/).
  LIMITS_SKIP=name1,name2 leaves those probes out (e.g. one that hangs or kills the process: records
  are flushed line by line, and the probes most likely to misbehave at run time come last)."""
  interpret = os.environ.get("LIMITS_INTERPRET", "") not in ("", "0")
  if interpret:
    if out_path != FAKE_PATH:
      print(f"LIMITS_INTERPRET=1: writing {FAKE_PATH}, not {out_path}", file=sys.stderr)
    out_path = FAKE_PATH
    pc = functools.partial(pl.pallas_call, interpret=pltpu.InterpretParams())
  else:
    pc = pl.pallas_call
  dev = jax.devices()[0]
  print(f"jax {jax.__version__}, {dev.platform} {getattr(dev, 'device_kind', '?')}, "
        f"{len(PROBES)} probes{' (interpret mode)' if interpret else ''}", file=sys.stderr)
  if os.path.dirname(out_path):
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
  t_all = time.perf_counter()
  skip = {n for n in os.environ.get("LIMITS_SKIP", "").split(",") if n}
  with open(out_path, "w") as fh:
    for p in PROBES:
      if p.name in skip:
        continue
      t0 = time.perf_counter()
      rec = run_probe(p, pc)
      fh.write(json.dumps(rec) + "\n")
      fh.flush()
      verdict = "ok  " if rec["accepted"] else f"REJ ({rec['stage']}: {rec['error_type']})"
      print(f"{time.perf_counter() - t0:6.2f}s {p.name:32s} {verdict}", file=sys.stderr)
  print(f"{time.perf_counter() - t_all:.1f}s in all; wrote {out_path}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# local side: palace

def palace_probe(p: Probe, chip: str = "v5e") -> dict:
  """The probe's record with palace.jax as the TPU engine (plain pallas_call, no interpret)."""
  import palace.jax  # noqa: PLC0415 -- local side only
  state = {"stage": "lower"}
  try:
    with (p.context() if p.context else contextlib.nullcontext()):
      with palace.jax.virtual_tpu(chip):
        _stages(p, pl.pallas_call, state)
  except Exception as e:  # noqa: BLE001
    return _record(p, state, e)
  return _record(p, state, None)


def load_data(path: str) -> tuple[dict, list[dict]]:
  """(environment, probe records) of a limits file; `benchmarks.hw.chip` puts a first line
  {"kind": "environment", ...} before chip_probes' records."""
  env, recs = {}, []
  with open(path) as fh:
    for ln in fh:
      if not ln.strip():
        continue
      r = json.loads(ln)
      if r.get("kind") == "environment":
        env = r
      elif "name" in r:
        recs.append(r)
  return env, recs


def load_records(path: str) -> list[dict]:
  return load_data(path)[1]


def data_files() -> list[str]:
  """The recorded limits files, oldest run first: by name without the extension, so that a run's
  follow-up (`...-2026-12-05-followup.jsonl`) comes after the run itself (`...-2026-12-05.jsonl`)."""
  return sorted(glob.glob(os.path.join(DATA_DIR, "v5e-limits-*.jsonl")),
                key=lambda p: os.path.basename(p)[:-len(".jsonl")])


def newest_data() -> str | None:
  files = data_files()
  return files[-1] if files else None


def load_all(paths=None) -> tuple[dict, list[dict]]:
  """(environment, records) of several limits files (default: `data_files()`), merged by probe
  name in the files' order: a later run's record of a probe replaces an earlier one's (the verdicts of
  the recorded runs agree; only line numbers in messages differ). The environment is the last one
  recorded, with `files` added."""
  paths = data_files() if paths is None else list(paths)
  env, merged = {}, {}
  for path in paths:
    e, recs = load_data(path)
    env = e or env
    merged.update((r["name"], r) for r in recs)
  return ({**env, "files": [os.path.basename(p) for p in paths]} if paths else env), list(merged.values())


def compare(records: list[dict], all_probes: bool = False, names=None) -> list[dict]:
  """One row per probe named in `records` (chip records; with all_probes, every probe of this file),
  in this file's probe order, each with the chip's and palace's verdicts and `agree` (None where
  either side is missing). `names`, if given, restricts the rows to those probe names."""
  by_name = {r["name"]: r for r in records if "name" in r}   # (skips an environment line)
  probes = {p.name: p for p in PROBES}
  order = [p.name for p in PROBES if all_probes or p.name in by_name]
  order += [n for n in by_name if n not in probes]          # records of probes this file lacks
  if names is not None:
    order = [n for n in order if n in set(names)]
  rows = []
  for name in order:
    chip_rec, p = by_name.get(name), probes.get(name)
    pal = palace_probe(p) if p is not None else None
    chip_ok = None if chip_rec is None else bool(chip_rec["accepted"])
    pal_ok = None if pal is None else pal["accepted"]
    rows.append({
        "name": name, "what": (p.what if p else chip_rec.get("what")),
        "expect": p.expect if p else None,
        "chip_accepted": chip_ok, "chip_stage": chip_rec and chip_rec.get("stage"),
        "chip_error": chip_rec and chip_rec.get("error"),
        "palace_accepted": pal_ok, "palace_stage": pal and pal["stage"],
        "palace_error": pal and pal["error"], "palace_error_type": pal and pal["error_type"],
        "agree": None if chip_ok is None or pal_ok is None else chip_ok == pal_ok})
  return rows


def _verdict(ok) -> str:
  return {True: "acc", False: "REJ", None: "?"}[ok]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--data", nargs="+", help="chip records (.jsonl), merged in this order; default: "
                  "every benchmarks/hw/data/v5e-limits-*.jsonl (load_all)")
  ap.add_argument("--chip", nargs="?", const="", metavar="OUT",
                  help="run the chip side (no palace) and write OUT (default: "
                  "benchmarks/hw/data/v5e-limits-<date>.jsonl; /tmp/fake-limits.jsonl with "
                  "LIMITS_INTERPRET=1)")
  ap.add_argument("--only", help="local side: only probes whose name contains this")
  a = ap.parse_args(argv)

  if a.chip is not None:
    out = a.chip or os.path.join(
        DATA_DIR, f"v5e-limits-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.jsonl")
    chip_probes(out)
    return 0

  paths = a.data if a.data else data_files()
  env, records = load_all(paths)
  print(f"chip data: {', '.join(paths) or 'none found (chip column ?)'}; palace: "
        f"palace.jax.virtual_tpu('v5e'), jax {jax.__version__}")
  if env:
    print("recorded on: " + ", ".join(f"{k}={v}" for k, v in env.items() if k not in ("kind", "files")))
  if any(os.path.abspath(p) == FAKE_PATH for p in paths):
    print("(fake interpret-mode data, not a chip)")
  names = None if not a.only else [p.name for p in PROBES if a.only in p.name]
  t0 = time.perf_counter()
  rows = compare(records, all_probes=True, names=names)
  w = max(len(r["name"]) for r in rows) if rows else 10
  print(f"{'probe':{w}s}  exp  chip palace agree  palace error (first line)")
  for r in rows:
    agree = {True: "yes", False: "NO", None: "-"}[r["agree"]]
    err = "" if r["palace_error"] is None else \
        f"[{r['palace_stage']}] {r['palace_error_type']}: {r['palace_error'].splitlines()[0][:110]}"
    print(f"{r['name']:{w}s}  {_verdict(r['expect']):3s}  {_verdict(r['chip_accepted']):4s} "
          f"{_verdict(r['palace_accepted']):6s} {agree:5s}  {err}")
  known = [r for r in rows if r["agree"] is not None]
  n_agree = sum(r["agree"] for r in known)
  more = [r["name"] for r in known if r["palace_accepted"] and not r["chip_accepted"]]
  less = [r["name"] for r in known if r["chip_accepted"] and not r["palace_accepted"]]
  print(f"\n{len(rows)} probes, {len(known)} with chip data: {n_agree} agree, "
        f"{len(more)} palace more permissive, {len(less)} palace stricter "
        f"({time.perf_counter() - t0:.1f}s)")
  if more:
    print("palace accepts, chip rejects: " + ", ".join(more))
  if less:
    print("palace rejects, chip accepts: " + ", ".join(less))
  exp_more = [r["name"] for r in rows if r["expect"] is False and r["palace_accepted"] and
              r["chip_accepted"] is None]
  if exp_more:
    print("no chip data; palace accepts, expected rejected by Mosaic (guess): " + ", ".join(exp_more))
  gaps = [n for n in KNOWN_DISAGREEMENTS if any(r["name"] == n and r["agree"] is False for r in rows)]
  if gaps:
    print("known disagreements (docs/limits.md): " + "; ".join(f"{n}: {KNOWN_DISAGREEMENTS[n]}"
                                                             for n in gaps))
  return 0


if __name__ == "__main__":
  sys.exit(main())
