"""The timing suite measured on a real TPU and modelled by palace: kernels written against JAX Pallas.

Every case is a JAX program with exactly one TPU kernel launch, built from public Pallas API that JAX
0.10.2 (the chip's) and JAX 0.12 (palace.jax's) share. The same builder runs on both sides: on the chip
(`benchmarks/hw/chip.py`, real JAX + libtpu, timed with the profiler) and here (`python -m
benchmarks.hw`, JAX 0.12 with palace.jax as the engine, modelled on `v5e`). Nothing here imports palace.

A case is `Case(name, family, build)`; `build()` returns `(fn, args)`: `fn` is a plain (un-jitted)
function of `args`, which are device arrays. Sizes are picked as a kernel engineer would: HBM-bound
streams big enough that fixed costs are a few percent (8-64 MiB), blocks from the tiling minimum to the
scoped-VMEM limit, short (128-lane) and long rows, and small launches whose time is mostly fixed cost.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from typing import Callable

import numpy as np

MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  family: str
  build: Callable[[], tuple]
  note: str = ""


def _jax():
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.experimental import pallas as pl  # noqa: PLC0415
  from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415
  return jax, jnp, pl, pltpu


# What `_rand` makes: "random" (on the chip, and wherever values are compared) or "zeros" (the model's
# timing-only runs, benchmarks/hw/model.py: palace computes no vector data there, so the values cannot
# change a modelled time, and jax.random's per-shape compilations cost the comparison a tenth of its CPU).
DATA = contextvars.ContextVar("benchmarks_hw_data", default="random")


@contextlib.contextmanager
def data_values(kind: str):
  """Build cases with `_rand` making `kind` ("random" or "zeros") arrays."""
  if kind not in ("random", "zeros"):
    raise ValueError(f"data_values({kind!r}): expected 'random' or 'zeros'")
  token = DATA.set(kind)
  try:
    yield
  finally:
    DATA.reset(token)


def _rand(shape, dtype, seed=0):
  jax, jnp, _, _ = _jax()
  dt = jnp.dtype(dtype)
  if DATA.get() == "zeros":
    return jax.device_put(np.zeros(shape, dt))
  key = jax.random.PRNGKey(seed)
  if jnp.issubdtype(dt, jnp.integer):
    return jax.random.randint(key, shape, -100, 100, jnp.int32).astype(dt)
  return jax.random.normal(key, shape, jnp.float32).astype(dt)


def _params(pltpu, sem=None, vmem=None):
  kw = {}
  if sem is not None:
    kw["dimension_semantics"] = sem
  if vmem is not None:
    kw["vmem_limit_bytes"] = vmem
  return pltpu.CompilerParams(**kw) if kw else None


# ------------------------------------------------------------------------------------------- matmul
def _matmul(m, k, n, bm, bk, bn, dtype="bfloat16", vmem=None):
  def build():
    jax, jnp, pl, pltpu = _jax()
    dt = jnp.dtype(dtype)
    acc_dt = jnp.int32 if jnp.issubdtype(dt, jnp.integer) else jnp.float32
    out_dt = acc_dt if dt.itemsize == 1 else dt
    nk = k // bk

    def kernel(x_ref, y_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(2) == 0)
      def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
      acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_dt)

      @pl.when(pl.program_id(2) == nk - 1)
      def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dt), grid=(m // bm, n // bn, nk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, s: (i, s)),
                  pl.BlockSpec((bk, bn), lambda i, j, s: (s, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), acc_dt)],
        compiler_params=_params(pltpu, ("parallel", "parallel", "arbitrary"), vmem))
    return call, (_rand((m, k), dt, 1), _rand((k, n), dt, 2))
  return build


def _matmul_cases():
  out = []
  for (m, k, n, bm, bk, bn) in [(1024, 1024, 1024, 128, 128, 128), (1024, 1024, 1024, 256, 256, 256),
                                (1024, 1024, 1024, 512, 512, 512), (2048, 2048, 2048, 256, 256, 256),
                                (2048, 2048, 2048, 512, 512, 512), (4096, 4096, 4096, 512, 512, 512),
                                (4096, 4096, 4096, 512, 1024, 512), (2048, 2048, 2048, 128, 512, 256)]:
    out.append(Case(f"mm_bf16_{m}x{k}x{n}_b{bm}x{bk}x{bn}", "matmul", _matmul(m, k, n, bm, bk, bn)))
  out.append(Case("mm_bf16_4096_b1024", "matmul",
                  _matmul(4096, 4096, 4096, 1024, 1024, 1024, vmem=64 * MiB), "vmem_limit 64 MiB"))
  for (m, k, n, bm, bk, bn) in [(1024, 1024, 1024, 256, 256, 256), (2048, 2048, 2048, 512, 512, 512),
                                (2048, 2048, 2048, 256, 512, 256)]:
    out.append(Case(f"mm_f32_{m}_b{bm}x{bk}x{bn}", "matmul_dtype", _matmul(m, k, n, bm, bk, bn, "float32")))
  for (m, k, n, bm, bk, bn) in [(2048, 2048, 2048, 512, 512, 512), (2048, 2048, 2048, 256, 256, 256),
                                (4096, 4096, 4096, 512, 1024, 512)]:
    out.append(Case(f"mm_int8_{m}_b{bm}x{bk}x{bn}", "matmul_dtype", _matmul(m, k, n, bm, bk, bn, "int8")))
  for (m, k, n, bm, bk, bn) in [(16, 4096, 4096, 16, 512, 512), (128, 8192, 1024, 128, 1024, 512),
                                (4096, 128, 4096, 512, 128, 512), (8192, 1024, 128, 512, 1024, 128),
                                (256, 4096, 4096, 256, 512, 1024)]:
    out.append(Case(f"mm_skinny_{m}x{k}x{n}_b{bm}x{bk}x{bn}", "matmul_skinny", _matmul(m, k, n, bm, bk, bn)))
  return out


# ------------------------------------------------------------------------------- streaming kernels
def _rowwise(shape, block, dtype, body, n_in=1, out_dtype=None, sem=("parallel",), vmem=None):
  """A 1-D grid over rows: n_in inputs and one output, all blocked (block, cols)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows, cols = shape
    br, bc = block
    odt = jnp.dtype(out_dtype or dtype)
    grid = (rows // br, cols // bc)

    def kernel(*refs):
      refs[-1][...] = body(jnp, *[r[...] for r in refs[:-1]]).astype(odt)

    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, odt), grid=grid,
                          in_specs=[spec] * n_in, out_specs=spec,
                          compiler_params=_params(pltpu, sem + ("parallel",), vmem))
    return call, tuple(_rand(shape, dtype, s) for s in range(n_in))
  return build


def _stream_cases():
  out = []
  add = lambda jnp, x, y: x + y  # noqa: E731
  for shape, block, dt in [((4096, 2048), (256, 2048), "float32"), ((4096, 2048), (512, 2048), "float32"),
                           ((4096, 2048), (128, 2048), "float32"), ((4096, 2048), (64, 2048), "float32"),
                           ((4096, 2048), (512, 512), "float32"), ((65536, 128), (2048, 128), "float32"),
                           ((65536, 128), (8192, 128), "float32"), ((65536, 128), (512, 128), "float32"),
                           ((4096, 2048), (512, 2048), "bfloat16"), ((8192, 1024), (1024, 1024), "bfloat16"),
                           ((16384, 1024), (1024, 1024), "int8"), ((1024, 16384), (64, 16384), "float32")]:
    vm = 32 * MiB if block[0] * block[1] * np.dtype(np.float32).itemsize * 6 > 14 * MiB else None
    out.append(Case(f"add_{dt}_{shape[0]}x{shape[1]}_b{block[0]}x{block[1]}", "elementwise",
                    _rowwise(shape, block, dt, add, 2, vmem=vm)))
  ident = lambda jnp, x: x  # noqa: E731
  for shape, block, dt in [((4096, 2048), (256, 2048), "float32"), ((4096, 2048), (1024, 2048), "float32"),
                           ((8192, 4096), (512, 4096), "float32"), ((65536, 128), (4096, 128), "float32"),
                           ((131072, 128), (1024, 128), "float32"), ((8192, 2048), (512, 2048), "bfloat16"),
                           ((8192, 2048), (512, 2048), "int8"), ((2048, 2048), (8, 2048), "float32")]:
    vm = 48 * MiB if block[0] * block[1] * 4 * 4 > 14 * MiB else None
    out.append(Case(f"copy_{dt}_{shape[0]}x{shape[1]}_b{block[0]}x{block[1]}", "copy",
                    _rowwise(shape, block, dt, ident, 1, vmem=vm)))
  for name, f in [("exp", lambda jnp, x: jnp.exp(x)), ("tanh", lambda jnp, x: jnp.tanh(x)),
                  ("log", lambda jnp, x: jnp.log(jnp.abs(x) + 1.0)),
                  ("sigmoid", lambda jnp, x: 1.0 / (1.0 + jnp.exp(-x))),
                  ("gelu_tanh", lambda jnp, x: 0.5 * x * (1 + jnp.tanh(0.79788456 * (x + 0.044715 * x * x * x)))),
                  ("silu_bf16", lambda jnp, x: x * (1.0 / (1.0 + jnp.exp(-x)))),
                  ("poly8", lambda jnp, x: ((((((x * 0.5 + 1) * x + 2) * x + 3) * x + 4) * x + 5) * x + 6) * x),
                  ("div", lambda jnp, x: x / (jnp.abs(x) + 1.0))]:
    dt = "bfloat16" if name.endswith("bf16") else "float32"
    out.append(Case(f"ew_{name}_4096x2048", "transcendental",
                    _rowwise((4096, 2048), (256, 2048), dt, f, 1)))
  return out


def _softmax_body(jnp, x):
  x = x.astype(jnp.float32)
  e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
  return e / jnp.sum(e, axis=-1, keepdims=True)


def _rms_body(jnp, x):
  x = x.astype(jnp.float32)
  return x * (1.0 / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6))


def _ln_body(jnp, x):
  x = x.astype(jnp.float32)
  mu = jnp.mean(x, axis=-1, keepdims=True)
  c = x - mu
  return c * (1.0 / jnp.sqrt(jnp.mean(c * c, axis=-1, keepdims=True) + 1e-6))


def _row_cases():
  out = []
  for shape, br, dt in [((8192, 1024), 256, "float32"), ((4096, 4096), 64, "float32"),
                        ((8192, 1024), 512, "bfloat16"), ((16384, 128), 1024, "float32"),
                        ((2048, 8192), 32, "bfloat16")]:
    out.append(Case(f"softmax_{dt}_{shape[0]}x{shape[1]}_b{br}", "softmax",
                    _rowwise(shape, (br, shape[1]), dt, _softmax_body, 1)))
  for shape, br, dt in [((8192, 2048), 256, "bfloat16"), ((8192, 2048), 256, "float32"),
                        ((16384, 1024), 512, "bfloat16"), ((32768, 128), 2048, "float32")]:
    out.append(Case(f"rmsnorm_{dt}_{shape[0]}x{shape[1]}_b{br}", "norm",
                    _rowwise(shape, (br, shape[1]), dt, _rms_body, 1)))
  for shape, br, dt in [((8192, 2048), 256, "bfloat16"), ((8192, 1024), 512, "float32")]:
    out.append(Case(f"layernorm_{dt}_{shape[0]}x{shape[1]}_b{br}", "norm",
                    _rowwise(shape, (br, shape[1]), dt, _ln_body, 1)))
  return out


# -------------------------------------------------------------------------- transpose / reduce / fill
def _transpose(n, m, b, dtype):
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...].T

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(dtype)),
                          grid=(n // b, m // b),
                          in_specs=[pl.BlockSpec((b, b), lambda i, j: (i, j))],
                          out_specs=pl.BlockSpec((b, b), lambda i, j: (j, i)),
                          compiler_params=_params(pltpu, ("parallel", "parallel")))
    return call, (_rand((n, m), dtype),)
  return build


def _colsum(rows, cols, br, dtype):
  """Sum over rows into an (8, cols) f32 output revisited along the 'arbitrary' grid axis."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
      x = x_ref[...].astype(jnp.float32)
      o_ref[...] += x.reshape(br // 8, 8, cols).sum(axis=0)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, cols), jnp.float32),
                          grid=(rows // br,), in_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, cols), lambda i: (0, 0)),
                          compiler_params=_params(pltpu, ("arbitrary",)))
    return call, (_rand((rows, cols), dtype),)
  return build


def _rowsum(rows, cols, br):
  """Row sums, broadcast to a lane-dense (rows, 128) output."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      s = jnp.sum(x_ref[...], axis=-1, keepdims=True)
      o_ref[...] = jnp.broadcast_to(s, o_ref.shape)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                          grid=(rows // br,), in_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((br, 128), lambda i: (i, 0)),
                          compiler_params=_params(pltpu, ("parallel",)))
    return call, (_rand((rows, cols), "float32"),)
  return build


def _fill(rows, cols, br, dtype):
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      o_ref[...] = jnp.full(o_ref.shape, 1, o_ref.dtype) * x_ref[0, 0].astype(o_ref.dtype)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.dtype(dtype)),
                          grid=(rows // br,), in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((br, cols), lambda i: (i, 0)),
                          compiler_params=_params(pltpu, ("parallel",)))
    return call, (_rand((8, 128), "float32"),)
  return build


def _misc_cases():
  out = []
  for n, m, b, dt in [(4096, 4096, 512, "float32"), (4096, 4096, 256, "float32"),
                      (4096, 4096, 512, "bfloat16"), (2048, 8192, 128, "float32")]:
    out.append(Case(f"transpose_{dt}_{n}x{m}_b{b}", "transpose", _transpose(n, m, b, dt)))
  for rows, cols, br, dt in [(8192, 2048, 512, "float32"), (32768, 512, 2048, "float32"),
                             (8192, 2048, 1024, "bfloat16")]:
    out.append(Case(f"colsum_{dt}_{rows}x{cols}_b{br}", "reduce", _colsum(rows, cols, br, dt)))
  for rows, cols, br in [(8192, 2048, 256), (65536, 256, 2048)]:
    out.append(Case(f"rowsum_f32_{rows}x{cols}_b{br}", "reduce", _rowsum(rows, cols, br)))
  for rows, cols, br, dt in [(8192, 2048, 512, "float32"), (65536, 128, 4096, "float32"),
                             (8192, 2048, 1024, "bfloat16")]:
    out.append(Case(f"fill_{dt}_{rows}x{cols}_b{br}", "fill", _fill(rows, cols, br, dt)))
  return out


# ------------------------------------------------------------------------------------- manual DMA
def _dma_hbm(shape, dtype, chunks, cols=None):
  """HBM -> HBM copies of a whole array (pl.ANY refs), `chunks` DMAs in flight at once; with
  `cols`, only the first `cols` columns move (strided rows)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows, c = shape
    oc = cols or c
    per = rows // chunks

    def kernel(x_hbm, o_hbm, sems):
      src = x_hbm if cols is None else x_hbm.at[:, pl.ds(0, oc)]
      copies = [pltpu.make_async_copy(src.at[pl.ds(i * per, per)], o_hbm.at[pl.ds(i * per, per)],
                                      sems.at[i]) for i in range(chunks)]
      for cp in copies:
        cp.start()
      for cp in copies:
        cp.wait()

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, oc), jnp.dtype(dtype)),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.SemaphoreType.DMA((chunks,))])
    return call, (_rand(shape, dtype),)
  return build


def _dma_loop(rows, cols, br, dtype):
  """A hand-written double-buffered stream: HBM -> VMEM, y = 2x + 1, VMEM -> HBM, with the next
  block's read started before the current block is computed."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    n = rows // br
    dt = jnp.dtype(dtype)

    def kernel(x_hbm, o_hbm, xbuf, obuf, isem, osem):
      def rd(i, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(i * br, br)], xbuf.at[slot], isem.at[slot])

      def wr(i, slot):
        return pltpu.make_async_copy(obuf.at[slot], o_hbm.at[pl.ds(i * br, br)], osem.at[slot])

      rd(0, 0).start()

      def step(i, carry):
        slot = i % 2

        @pl.when(i + 1 < n)
        def _():
          rd(i + 1, 1 - slot).start()
        rd(i, slot).wait()

        @pl.when(i >= 2)
        def _():
          wr(i - 2, slot).wait()
        obuf[slot] = xbuf[slot] * 2 + 1
        wr(i, slot).start()
        return carry

      jax.lax.fori_loop(0, n, step, 0)
      for j in range(max(0, n - 2), n):
        wr(j, j % 2).wait()

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), dt),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((2, br, cols), dt), pltpu.VMEM((2, br, cols), dt),
                                          pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))])
    return call, (_rand((rows, cols), dtype),)
  return build


def _emit_pipeline_add(rows, cols, br):
  def build():
    jax, jnp, pl, pltpu = _jax()

    def inner(x_ref, y_ref, o_ref):
      o_ref[...] = x_ref[...] + y_ref[...]

    def kernel(x_hbm, y_hbm, o_hbm):
      spec = pl.BlockSpec((br, cols), lambda i: (i, 0))
      pltpu.emit_pipeline(inner, grid=(rows // br,), in_specs=[spec, spec], out_specs=spec)(
          x_hbm, y_hbm, o_hbm)

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                          in_specs=[any_spec, any_spec], out_specs=any_spec)
    return call, (_rand((rows, cols), "float32", 1), _rand((rows, cols), "float32", 2))
  return build


def _emit_pipeline_matmul(m, k, n, bm, bk, bn):
  def build():
    jax, jnp, pl, pltpu = _jax()
    nk = k // bk

    def inner(x_ref, y_ref, o_ref):
      @pl.when(pl.program_id(2) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
      o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    def kernel(x_hbm, y_hbm, o_hbm):
      pltpu.emit_pipeline(
          inner, grid=(m // bm, n // bn, nk),
          in_specs=[pl.BlockSpec((bm, bk), lambda i, j, s: (i, s)),
                    pl.BlockSpec((bk, bn), lambda i, j, s: (s, j))],
          out_specs=pl.BlockSpec((bm, bn), lambda i, j, s: (i, j)))(x_hbm, y_hbm, o_hbm)

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                          in_specs=[any_spec, any_spec], out_specs=any_spec)
    return call, (_rand((m, k), "bfloat16", 1), _rand((k, n), "bfloat16", 2))
  return build


def _dma_cases():
  out = []
  for shape, chunks in [((1024, 1024), 1), ((2048, 2048), 1), ((4096, 2048), 1), ((8192, 4096), 1),
                        ((4096, 2048), 2), ((4096, 2048), 4), ((4096, 2048), 8), ((4096, 2048), 16)]:
    out.append(Case(f"dma_hbm_f32_{shape[0]}x{shape[1]}_x{chunks}", "dma_hbm", _dma_hbm(shape, "float32", chunks)))
  out.append(Case("dma_hbm_f32_65536x128_x1", "dma_hbm", _dma_hbm((65536, 128), "float32", 1)))
  out.append(Case("dma_hbm_f32_4096x2048_cols1024", "dma_hbm", _dma_hbm((4096, 2048), "float32", 1, 1024)))
  out.append(Case("dma_hbm_f32_4096x2048_cols128_x4", "dma_hbm", _dma_hbm((4096, 2048), "float32", 4, 128)))
  for rows, cols, br, dt in [(8192, 1024, 512, "float32"), (8192, 1024, 128, "float32"),
                             (65536, 128, 4096, "float32"), (8192, 2048, 512, "bfloat16")]:
    out.append(Case(f"dma_loop_{dt}_{rows}x{cols}_b{br}", "dma_loop", _dma_loop(rows, cols, br, dt)))
  out.append(Case("emit_add_f32_4096x2048_b256", "emit_pipeline", _emit_pipeline_add(4096, 2048, 256)))
  out.append(Case("emit_add_f32_65536x128_b2048", "emit_pipeline", _emit_pipeline_add(65536, 128, 2048)))
  out.append(Case("emit_mm_bf16_2048_b512", "emit_pipeline", _emit_pipeline_matmul(2048, 2048, 2048, 512, 512, 512)))
  out.append(Case("emit_mm_bf16_1024_b256", "emit_pipeline", _emit_pipeline_matmul(1024, 1024, 1024, 256, 256, 256)))
  return out


# ------------------------------------------------------------------------------ scalar prefetch
def _gather_rows(n_table, d, n_out, rows_per_block, dtype="float32"):
  """out[i] = table[idx[i]] with the indices prefetched into SMEM and used in the index map."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rng = np.random.default_rng(0)
    if rows_per_block == 1:
      idx = jnp.asarray(rng.integers(0, n_table, n_out), jnp.int32)
      table = _rand((n_table, 1, d), dtype)
      sq = pl.Squeezed() if hasattr(pl, "Squeezed") else None
      in_spec = pl.BlockSpec((sq, 1, d), lambda i, idx_ref: (idx_ref[i], 0, 0))
      out_spec = pl.BlockSpec((sq, 1, d), lambda i, idx_ref: (i, 0, 0))
      out_shape = (n_out, 1, d)
    else:
      nb = n_table // rows_per_block
      idx = jnp.asarray(rng.integers(0, nb, n_out // rows_per_block), jnp.int32)
      table = _rand((n_table, d), dtype)
      in_spec = pl.BlockSpec((rows_per_block, d), lambda i, idx_ref: (idx_ref[i], 0))
      out_spec = pl.BlockSpec((rows_per_block, d), lambda i, idx_ref: (i, 0))
      out_shape = (n_out, d)

    def kernel(idx_ref, x_ref, o_ref):
      o_ref[...] = x_ref[...]

    gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(n_out // rows_per_block,),
                                      in_specs=[in_spec], out_specs=out_spec)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(out_shape, jnp.dtype(dtype)), grid_spec=gs,
                          compiler_params=_params(pltpu, ("arbitrary",)))
    return call, (idx, table)
  return build


def _prefetch_cases():
  return [Case("gather_f32_rows8_8192x1024_n2048", "scalar_prefetch", _gather_rows(8192, 1024, 2048, 8)),
          Case("gather_f32_rows64_16384x1024_n4096", "scalar_prefetch", _gather_rows(16384, 1024, 4096, 64)),
          Case("gather_f32_rows1_8192x1024_n1024", "scalar_prefetch", _gather_rows(8192, 1024, 1024, 1)),
          Case("gather_bf16_rows1_8192x2048_n512", "scalar_prefetch", _gather_rows(8192, 2048, 512, 1, "bfloat16")),
          Case("gather_bf16_rows16_8192x2048_n2048", "scalar_prefetch",
               _gather_rows(8192, 2048, 2048, 16, "bfloat16"))]


# --------------------------------------------------------------------------------- small launches
def _small_cases():
  out = []
  add = lambda jnp, x, y: x + y  # noqa: E731
  for shape, block in [((8, 128), (8, 128)), ((128, 128), (128, 128)), ((512, 512), (512, 512)),
                       ((1024, 1024), (1024, 1024)), ((1024, 128), (8, 128)), ((4096, 128), (8, 128)),
                       ((2048, 512), (64, 512))]:
    out.append(Case(f"small_add_f32_{shape[0]}x{shape[1]}_b{block[0]}x{block[1]}", "small_launch",
                    _rowwise(shape, block, "float32", add, 2)))
  out.append(Case("small_mm_bf16_128", "small_launch", _matmul(128, 128, 128, 128, 128, 128)))
  out.append(Case("small_mm_bf16_256_b128", "small_launch", _matmul(256, 256, 256, 128, 128, 128)))
  out.append(Case("small_dma_hbm_8x128", "small_launch", _dma_hbm((8, 128), "float32", 1)))
  return out


# --------------------------------------------------------------------------- the jax wheel's kernels
def _flash(batch, heads, seq, d, causal, block=None):
  def build():
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: PLC0415
    kw = {}
    if block is not None:
      kw["block_sizes"] = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1,
                                        block_q_major_dkv=block, block_k_major_dkv=block,
                                        block_k_dkv=block, block_q_dkv=block,
                                        block_k_major_dq=block, block_k_dq=block, block_q_dq=block)
    fn = functools.partial(fa.flash_attention, causal=causal, sm_scale=d ** -0.5, **kw)
    shape = (batch, heads, seq, d)
    return fn, tuple(_rand(shape, jnp.bfloat16, s) for s in range(3))
  return build


def _splash(batch, heads, seq, d, causal):
  def build():
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # noqa: PLC0415
    from benchmarks.hw.chip_wheel import wheel_module  # noqa: PLC0415
    sk = wheel_module("splash_attention.splash_attention_kernel")   # the chip's JAX's file
    one = sm.CausalMask((seq, seq)) if causal else sm.FullMask((seq, seq))
    kernel = sk.make_splash_mha(mask=sm.MultiHeadMask([one] * heads), head_shards=1, q_seq_shards=1)
    fn = jax.vmap(kernel)
    shape = (batch, heads, seq, d)
    return fn, tuple(_rand(shape, jnp.bfloat16, s) for s in range(3))
  return build


def _gmm(m, k, n, groups, tiling):
  def build():
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu.megablox import gmm  # noqa: PLC0415
    sizes = jnp.full((groups,), m // groups, jnp.int32)
    fn = functools.partial(gmm, preferred_element_type=jnp.bfloat16, tiling=tiling)
    return fn, (_rand((m, k), jnp.bfloat16, 1), _rand((groups, k, n), jnp.bfloat16, 2), sizes)
  return build


def _paged(batch, q_heads, kv_heads, d, page, pages_per_seq, ppcb, length_frac=1.0):
  def build():
    import jax.numpy as jnp  # noqa: PLC0415
    from benchmarks.hw.chip_wheel import wheel_module  # noqa: PLC0415
    paged_attention = wheel_module("paged_attention.paged_attention_kernel").paged_attention  # the chip's
    total = batch * pages_per_seq
    rng = np.random.default_rng(0)
    page_indices = jnp.asarray(rng.permutation(total).reshape(batch, pages_per_seq), jnp.int32)
    lengths = jnp.full((batch,), int(page * pages_per_seq * length_frac), jnp.int32)
    q = _rand((batch, q_heads, d), jnp.bfloat16, 1)
    k = _rand((kv_heads, total, page, d), jnp.bfloat16, 2)
    v = _rand((kv_heads, total, page, d), jnp.bfloat16, 3)
    fn = functools.partial(paged_attention, pages_per_compute_block=ppcb)
    return fn, (q, k, v, lengths, page_indices)
  return build


def _wheel_cases():
  out = []
  for b, h, s, d, causal in [(2, 8, 1024, 128, False), (2, 8, 1024, 128, True), (1, 8, 2048, 128, False),
                             (1, 8, 2048, 128, True), (4, 8, 512, 64, False), (1, 4, 4096, 128, True)]:
    out.append(Case(f"flash_{'causal' if causal else 'full'}_b{b}h{h}s{s}d{d}", "flash",
                    _flash(b, h, s, d, causal)))
  out.append(Case("flash_full_b1h8s2048d128_blk512", "flash", _flash(1, 8, 2048, 128, False, 512)))
  out.append(Case("flash_causal_b1h8s2048d128_blk512", "flash", _flash(1, 8, 2048, 128, True, 512)))
  for b, h, s, d, causal in [(1, 8, 2048, 128, False), (1, 8, 2048, 128, True), (2, 4, 4096, 128, True)]:
    out.append(Case(f"splash_{'causal' if causal else 'full'}_b{b}h{h}s{s}d{d}", "splash",
                    _splash(b, h, s, d, causal)))
  for m, k, n, g, t in [(4096, 2048, 2048, 8, (128, 128, 128)), (4096, 2048, 2048, 8, (512, 512, 512)),
                        (8192, 1024, 1024, 16, (256, 512, 512))]:
    out.append(Case(f"gmm_bf16_{m}x{k}x{n}_g{g}_t{t[0]}x{t[1]}x{t[2]}", "gmm", _gmm(m, k, n, g, t)))
  for b, qh, kvh, d, page, pps, ppcb in [(8, 8, 8, 128, 16, 64, 8), (32, 8, 8, 128, 16, 32, 8),
                                         (16, 32, 8, 128, 64, 32, 4), (8, 16, 2, 128, 32, 128, 16)]:
    out.append(Case(f"paged_b{b}q{qh}kv{kvh}d{d}_p{page}x{pps}_c{ppcb}", "paged_attention",
                    _paged(b, qh, kvh, d, page, pps, ppcb)))
  return out


# ------------------------------------------------------------------- micro-probes of fixed costs
def _holdout_cases():
  """Kernels measured after the model was fitted on the others (session 18's third chip run): a check
  of what the rules predict on shapes they were not fitted on. Same builders, new sizes."""
  add = lambda jnp, x, y: x + y  # noqa: E731
  ident = lambda jnp, x: x  # noqa: E731
  exp = lambda jnp, x: jnp.exp(x)  # noqa: E731
  H = "holdout"
  return [
      Case("ho_add_f32_8192x1024_b512x1024", H, _rowwise((8192, 1024), (512, 1024), "float32", add, 2)),
      Case("ho_copy_bf16_16384x1024_b1024x1024", H, _rowwise((16384, 1024), (1024, 1024), "bfloat16", ident, 1)),
      Case("ho_rmsnorm_f32_4096x4096_b128", H, _rowwise((4096, 4096), (128, 4096), "float32", _rms_body, 1)),
      Case("ho_softmax_bf16_4096x2048_b128", H, _rowwise((4096, 2048), (128, 2048), "bfloat16", _softmax_body, 1)),
      Case("ho_exp_f32_8192x1024_b512", H, _rowwise((8192, 1024), (512, 1024), "float32", exp, 1)),
      Case("ho_small_add_f32_2048x128_b16x128", H, _rowwise((2048, 128), (16, 128), "float32", add, 2)),
      Case("ho_colsum_bf16_16384x1024_b1024", H, _colsum(16384, 1024, 1024, "bfloat16")),
      Case("ho_mm_bf16_3072_b512", H, _matmul(3072, 3072, 3072, 512, 512, 512)),
      Case("ho_mm_bf16_2048x4096x1024_b256x512x512", H, _matmul(2048, 4096, 1024, 256, 512, 512)),
      Case("ho_mm_int8_1024_b512", H, _matmul(1024, 1024, 1024, 512, 512, 512, "int8")),
      Case("ho_dma_hbm_f32_16384x1024_x4", H, _dma_hbm((16384, 1024), "float32", 4)),
      Case("ho_emit_add_f32_2048x128_b8", H, _emit_pipeline_add(2048, 128, 8)),
      Case("ho_gather_f32_rows32_8192x512_n2048", H, _gather_rows(8192, 512, 2048, 32)),
      Case("ho_flash_full_b2h4s2048d128", H, _flash(2, 4, 2048, 128, False)),
      Case("ho_flash_causal_b2h8s1024d64", H, _flash(2, 8, 1024, 64, True)),
      Case("ho_gmm_bf16_8192x2048x1024_g8_t256x512x512", H, _gmm(8192, 2048, 1024, 8, (256, 512, 512))),
      Case("ho_paged_b16q16kv4d128_p16x64_c8", H, _paged(16, 16, 4, 128, 16, 64, 8)),
      Case("ho_paged_b8q8kv8d128_p32x32_c4", H, _paged(8, 8, 8, 128, 32, 32, 4)),
  ]


def _step_cases() -> list[Case]:
  from benchmarks.hw.cases_probe import overlap_cases, probe_cases, sync_cases  # noqa: PLC0415  (imports this)
  from benchmarks.hw.cases_curve import curve_cases, order_cases  # noqa: PLC0415  (imports this)
  from benchmarks.hw.cases_fence import (chunk_cases, compute_part_cases, fence_cases,  # noqa: PLC0415
                                         flash_part_cases, ilp_cases, pipe_cases, sync_sweep_cases)
  from benchmarks.hw.cases_steps import loop_cases, mix_cases, step_cases  # noqa: PLC0415  (imports this)
  from benchmarks.hw.cases_chain import (chain_cases, eup_curve_cases, holdout_chain_cases,  # noqa: PLC0415
                                         step_raw_cases)
  from benchmarks.hw.cases_stream import (stream_pair_cases, sync_size_cases,  # noqa: PLC0415
                                          pv_part_cases, unit_overlap_cases, xlu_eup_cases,
                                          chain_dot_cases)
  from benchmarks.hw.cases_parts import (mm_part_cases, pv_more_cases,  # noqa: PLC0415
                                          step_op_cases, wheel_step_cases)  # noqa: PLC0415  (imports this)
  from benchmarks.hw.cases_move import (copy_cost_cases, mxu_chain_cases, out_switch_cases,  # noqa: PLC0415
                                        skip_step_cases, wheel_move_cases)  # noqa: PLC0415  (imports this)
  from benchmarks.hw.cases_gather import (causal_mask_cases, page_gather_cases,  # noqa: PLC0415
                                          out_heavy_cases, splash_machinery_cases,
                                          splash_step_cases)
  from benchmarks.hw.cases_branch import fa_published_cases, page_heavy_cases, step_branch_cases  # noqa: PLC0415
  from benchmarks.hw.cases_paged import (matmul_k_cases, page_cross_cases, page_kfirst_cases,  # noqa: PLC0415
                                         page_loop_cases, page_order_cases, page_wheelbody_cases, page_wheelcopy_cases,
                                         page_wheelgrid_cases, paged_sweep_cases)
  from benchmarks.hw.cases_mmstep import copy_shape_cases, copy_window_cases, mm_step_cases  # noqa: PLC0415
  from benchmarks.hw.cases_size import (flash_size_cases, gather_rows1_cases, head_dim_cases,  # noqa: PLC0415
                                        row_end_cases)
  from benchmarks.hw.cases_book import step_body_cases, step_book_cases  # noqa: PLC0415
  from benchmarks.hw.cases_issue import dma_issue_cases, issue_form_cases, write_burst_cases  # noqa: PLC0415
  from benchmarks.hw.cases_start import start_body_cases, start_form_cases  # noqa: PLC0415
  from benchmarks.hw.cases_eup import eup_stream_cases  # noqa: PLC0415
  from benchmarks.hw.cases_s37 import s37_cases  # noqa: PLC0415
  from benchmarks.hw.cases_s38 import s38_cases, vpu_chain_cases, write_queue_cases  # noqa: PLC0415
  return (probe_cases() + sync_cases() + overlap_cases() + step_cases() + loop_cases() + mix_cases() + curve_cases() + order_cases() + fence_cases()
          + ilp_cases() + chunk_cases() + pipe_cases() + flash_part_cases()
          + compute_part_cases() + chain_cases() + holdout_chain_cases() + sync_sweep_cases()
          + sync_size_cases() + stream_pair_cases() + unit_overlap_cases() + pv_part_cases()
          + xlu_eup_cases() + chain_dot_cases() + mm_part_cases() + pv_more_cases() + step_op_cases()
          + wheel_step_cases() + wheel_move_cases() + mxu_chain_cases()
          + out_switch_cases() + skip_step_cases() + copy_cost_cases() + page_gather_cases()
          + causal_mask_cases() + splash_step_cases() + out_heavy_cases() + splash_machinery_cases()
          + step_branch_cases() + fa_published_cases() + page_heavy_cases() + paged_sweep_cases()
          + matmul_k_cases() + page_loop_cases() + page_order_cases()
          + page_kfirst_cases() + page_cross_cases() + page_wheelbody_cases() + page_wheelgrid_cases()
          + page_wheelcopy_cases()
          + mm_step_cases() + copy_shape_cases() + copy_window_cases() + flash_size_cases()
          + gather_rows1_cases() + head_dim_cases() + row_end_cases() + step_book_cases()
          + dma_issue_cases() + write_burst_cases() + issue_form_cases()
          + step_body_cases() + start_form_cases() + eup_stream_cases() + eup_curve_cases()
          + step_raw_cases() + s37_cases() + start_body_cases() + s38_cases()
          + write_queue_cases() + vpu_chain_cases())


def all_cases() -> list[Case]:
  cases = (_matmul_cases() + _stream_cases() + _row_cases() + _misc_cases() + _dma_cases()
           + _prefetch_cases() + _small_cases() + _wheel_cases() + _holdout_cases() + _step_cases())
  names = [c.name for c in cases]
  assert len(names) == len(set(names)), "case names must be unique"
  return cases
