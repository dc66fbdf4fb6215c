"""Shared kernels and a round-number chip for the timing tests."""
import dataclasses

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src import hw
from matmul_kernel import matmul_kernel

# A v5e with round numbers so that timelines can be derived by hand: 1 GHz, 1000 B/cycle in every
# direction (the datasheet rate: no measured read/write fractions), 100-cycle HBM->VMEM and 50-cycle
# VMEM->HBM latency (HBM->HBM: the larger), a 40-cycle grid step, a 260-cycle sync for the first DMA wait
# of a run of waits, 8-cycle DMA issue, 1-cycle scalar op.
UNIT_CHIP = dataclasses.replace(
    hw.get_chip("v5e"), name="unit", clock_hz=1e9, hbm_bytes_per_s_per_device=1e12,
    dma_bytes_per_s_per_tc=1e12, vmem_vmem_dma_bytes_per_s=2e12, dma_hbm_to_vmem_latency_ns=100,
    dma_vmem_to_hbm_latency_ns=50, dma_local_latency_cycles=20, grid_step_overhead_cycles=40,
    dma_wait_sync_cycles=260, dma_issue_cycles=8, scalar_op_cycles=1, hbm_read_fraction=None,
    hbm_write_fraction=None, hbm_write_with_reads_fraction=None, hbm_copy_fraction=None,
    dma_hbm_hbm_latency_ns=None, **hw.RULES_OFF)

ANY_SPEC = pl.BlockSpec(memory_space=pl.ANY)


def matmul(x, y, bm, bk, bn):
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
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


def run_matmul(chip, m, bm, bk, bn, dtype=jnp.bfloat16, timing_only=True, k=None, n=None):
  x = np.ones((m, k or m), dtype)
  y = np.ones((k or m, n or m), dtype)
  with pl.virtual_tpu(chip, timing_only=timing_only, trace=not timing_only) as tpu:
    matmul(x, y, bm, bk, bn)
  return tpu.reports[-1]


def add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def run_add(chip, rows, block_rows, cols=512, buffers=None, timing_only=True, trace=False):
  """A bandwidth-bound elementwise add over `rows` rows in blocks of `block_rows`."""
  mode = None if buffers is None else pl.Buffered(buffers)
  spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0), pipeline_mode=mode)
  x = np.ones((rows, cols), np.float32)
  with pl.virtual_tpu(chip, timing_only=timing_only, trace=trace) as tpu:
    out = pl.pallas_call(add_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                         grid=(rows // block_rows,), in_specs=[spec, spec], out_specs=spec)(x, x)
  return tpu.reports[-1], out


def run_four_copies(chip):
  """Four (8, 128) f32 HBM->VMEM copies on one semaphore, all started, then all waited: (device cycles,
  each copy's completion cycle)."""
  def k(x_hbm, o_hbm, buf, sem):
    copies = [pltpu.make_async_copy(x_hbm.at[i], buf.at[i], sem.at[0]) for i in range(4)]
    for c in copies:
      c.start()
    for c in copies:
      c.wait()

  x = np.ones((4, 8, 128), np.float32)
  with pl.virtual_tpu(chip) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), in_specs=[ANY_SPEC],
                   out_specs=ANY_SPEC,
                   scratch_shapes=[pltpu.VMEM((4, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))])(x)
  r = tpu.reports[-1]
  return r.device_cycles, [e[4] for e in r.events if e[1] == "dma"]
