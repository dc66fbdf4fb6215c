"""Kernels and timing helpers shared by the benchmarks (one definition of the tutorial matmul)."""
from __future__ import annotations

import time

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  """The Pallas TPU matmul tutorial kernel: f32 accumulator scratch, K innermost."""
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def window_copies(n: int = 8, rows: int = 16):
  """(call, x): a kernel summing the `n` windows `x_hbm.at[pl.ds(k * rows, rows)]` of x, each copied
  into one VMEM slot by make_async_copy, start and wait (DMAs between views, as JAX's paged attention
  makes them); its output is x.reshape(n, rows, 128).sum(axis=0)."""
  def kernel(x_hbm, o_ref, buf, sem):
    o_ref[...] = jnp.zeros_like(o_ref)
    for k in range(n):
      copy = pltpu.make_async_copy(x_hbm.at[pl.ds(k * rows, rows)], buf, sem)
      copy.start()
      copy.wait()
      o_ref[...] += buf[...]
  x = np.arange(n * rows * 128, dtype=np.float32).reshape(n * rows, 128)
  call = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((rows, 128), np.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        scratch_shapes=[pltpu.VMEM((rows, 128), np.float32), pltpu.SemaphoreType.DMA])
  return call, x


def tiled_matmul(x, y, bm, bk=None, bn=None, *, vmem_limit_bytes=None):
  """x @ y through `matmul_kernel` on the grid (m/bm, n/bn, k/bk); bk and bn default to bm."""
  bk = bm if bk is None else bk
  bn = bm if bn is None else bn
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      matmul_kernel,
      out_shape=pl.ShapeDtypeStruct((m, n), x.dtype),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                           vmem_limit_bytes=vmem_limit_bytes),
  )(x, y)


def best_of(fn, reps=3):
  """(best wall time in s, last result) over `reps` calls: a busy machine only ever slows a run down."""
  best = float("inf")
  out = None
  for _ in range(reps):
    t0 = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t0)
  return best, out
