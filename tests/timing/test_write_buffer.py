"""HBM's write buffer (hw.ChipSpec.hbm_write_buffer_bytes, sim/dma.CopyPlan): a write while no read
streams is taken at the read rate while the buffer, drained at the write rate, has room, then at the
write rate. Exact on a round-number chip: 1000 B/cycle, reads at the full rate, writes alone at half
(beside reads at 0.4)."""
import dataclasses

import numpy as np

import palace as pl
from palace._src import hw
from palace._src.core import MemorySpace
from palace._src.sim import dma
from palace._src.sim.bandwidth import Channel

from timing_helpers import UNIT_CHIP


def _write_plan(cap):
  chip = dataclasses.replace(UNIT_CHIP, hbm_read_fraction=1.0, hbm_write_fraction=0.5,
                             hbm_write_with_reads_fraction=0.4, hbm_write_buffer_bytes=cap)
  chans = (Channel("tc-dma", 1e12, 1e9), Channel("hbm", 1e12, 1e9), Channel("local", 2e12, 1e9))
  return dma.plan(dma.copy_timing(chip, MemorySpace.VMEM, MemorySpace.HBM), chans), chans[1]


def test_without_a_buffer_a_write_alone_runs_at_the_write_rate():
  p, _ = _write_plan(0)
  assert p.wbuf is None and p.reserve(0, 8000) == (0, 16)


def test_a_write_fills_the_buffer_at_the_read_rate_then_runs_at_the_write_rate():
  p, hbm = _write_plan(2000)
  # 2000 B of room, filling at 1 - 500/1000 of each byte taken: 4000 B in 4 cycles, 4000 B in 8
  assert p.reserve(0, 8000) == (0, 12)
  assert (hbm.wbuf_level, hbm.wbuf_time) == (2000, 12)
  assert p.reserve(12, 1000) == (12, 14)           # full: the write rate
  assert p.reserve(18, 1000) == (18, 19)           # 4 cycles at 500 B/cycle drained it: the read rate
  assert (hbm.wbuf_level, hbm.wbuf_time) == (500, 19)


def test_a_write_queued_behind_another_finds_the_buffer_as_it_left_it():
  p, hbm = _write_plan(2000)
  assert p.reserve(0, 2000) == (0, 2)               # 1000 B in the buffer at cycle 2
  assert p.reserve(1, 4000) == (2, 8)               # from 2: 2000 B fast (2 cycles), 2000 B at 500
  assert hbm.wbuf_level == 2000


def _broadcast(steps, rows=64):
  """Every output block x + 1 of one fixed input block: read once, then writes alone (32 KiB each)."""
  x = np.zeros((rows, 128), np.float32)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1.0),
                     out_shape=pl.ShapeDtypeStruct((steps * rows, 128), np.float32), grid=(steps,),
                     in_specs=[pl.BlockSpec((rows, 128), lambda i: (0, 0))],
                     out_specs=pl.BlockSpec((rows, 128), lambda i: (i, 0)))
  return f, x


def test_v5e_writes_a_burst_faster_than_a_sustained_stream_and_extrapolates_exactly():
  """v5e's buffer (144 KB, measured: docs/validation.md "Session 33"): a pipeline writing 32 KiB
  blocks alone costs less with it, and its steady state is extrapolated to exactly what stepping
  gives (237,175 cycles against 242,306 without the buffer; session 33's 246,381 / 252,024 had a
  33-cycle grid step, 24 since session 34: 241,782 / 247,425; since session 35 the consecutive output
  blocks' writes continue one stream and pay no per-copy 4 KiB, dma_sequential_no_overhead)."""
  v5e = hw.get_chip("v5e")
  assert v5e.hbm_write_buffer_bytes == 144_000
  without = dataclasses.replace(v5e, hbm_write_buffer_bytes=0)
  cycles = {}
  for chip in (v5e, without):
    for steady in (False, True):
      f, x = _broadcast(1024)
      with pl.virtual_tpu(chip, timing_only=True, steady_state=steady) as tpu:
        f(x)
      cycles[chip.hbm_write_buffer_bytes, steady] = (tpu.reports[-1].device_cycles, tpu.extrapolated_steps)
  assert cycles[144_000, True][0] == cycles[144_000, False][0] == 237_175
  assert cycles[0, True][0] == cycles[0, False][0] == 242_306
  assert cycles[144_000, True][1] > 900   # (steps advanced over, not stepped)
