"""The issue rules measured on a TPU v5e in session 21 (docs/timing-model.md 1.1 and 1.2), as exact
timelines on UNIT_CHIP (timing_helpers.py): ops on a busy unit interleave, a rolled loop's back edge
drains, and a core's DMA engine serves HBM writes ahead of the tails of its reads."""
import dataclasses
import math

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

from timing_helpers import ANY_SPEC, UNIT_CHIP

SYNC, ISSUE, SCALAR, BPC, LAT_READ, LAT_WRITE = 260, 8, 1, 1000, 100, 50


def _events(report, unit):
  return [(e[2], e[3], e[4]) for e in report.events if e[1] == unit]


def test_ops_on_a_busy_unit_interleave():
  """x * 2 + 1 over 64 vregs: the add does not wait for the multiply to finish on the VPU (their vregs
  interleave: it issues with it and its work queues behind it), and the store streams from the same
  cycle: 64 stores, not 16 cycles of multiply and then 64 stores (measured: `pipe_fence`)."""
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0

  x = np.ones((512, 128), np.float32)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  np.testing.assert_array_equal(out, x * 2 + 1)
  r = tpu.reports[-1]
  (load,) = _events(r, "vld")
  t = load[1]
  vpu = 64 // UNIT_CHIP.vpu_alus_per_lane   # 16 cycles per op on 4 ALUs
  assert _events(r, "vpu") == [("cheap", t, t + vpu), ("cheap", t, t + 2 * vpu)]
  assert _events(r, "vst") == [("store", t, t + 64)]


@pytest.mark.parametrize("back_edge,floor", [(3, 0), (11, 0), (0, 9), (3, 30)])
def test_a_rolled_loop_pays_its_back_edge_and_drains(back_edge, floor):
  """A rolled fori_loop's iteration ends when its vector results are ready, then the back edge's
  cycles, and lasts at least `loop_min_iteration_cycles` from the previous back edge (the loop's branch
  and counter work overlapping the body: measured on a v5e, a one-vreg multiply-add chain of 4.2 cycles
  a link takes 9.1 an iteration rolled, a 12.7-cycle chain 12.9); unrolled (unroll=True) there is no
  back edge and the chain streams. One more iteration of v + 1 on one vreg: the counter's scalar op,
  the add (1 cycle, latency 2), the back edge, or the floor when that is longer."""
  chip = dataclasses.replace(UNIT_CHIP, loop_back_edge_cycles=back_edge, loop_min_iteration_cycles=floor)

  def cycles(n, unroll):
    def k(x_ref, o_ref):
      o_ref[...] = lax.fori_loop(0, n, lambda i, v: v + 1.0, x_ref[...], unroll=unroll)

    x = np.ones((8, 128), np.float32)
    with pl.virtual_tpu(chip) as tpu:
      out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
    np.testing.assert_array_equal(out, x + n)
    return tpu.reports[-1].device_cycles

  assert cycles(5, None) - cycles(4, None) == max(SCALAR + 1 + 2 + back_edge, floor)
  assert cycles(5, True) - cycles(4, True) == SCALAR + 1    # unrolled: no drain, no back edge
  assert cycles(5, 0) == cycles(5, True)                    # (JAX: unroll=0 unrolls the whole loop)
  # unroll=4: one back edge per 4 iterations, after a chain of 4 dependent adds (latency 2 each) that
  # started after one scalar op and one cycle of issue
  assert cycles(8, 4) - cycles(4, 4) == max(SCALAR + 1 + 4 * 2 + back_edge, floor)


def _read_and_write(read_rows, turnaround=142, write_rows=128, write_first=False):
  """A read of `read_rows` x 128 f32 and a write of `write_rows` x 128 f32 (64 KiB) started together
  (the read first, or the write with `write_first`), both waited."""
  def k(x_hbm, o_hbm, rbuf, wbuf, sem):
    rd = pltpu.make_async_copy(x_hbm, rbuf, sem.at[0])
    wr = pltpu.make_async_copy(wbuf, o_hbm, sem.at[1])
    for cp in ((wr, rd) if write_first else (rd, wr)):
      cp.start()
    rd.wait()
    wr.wait()

  chip = dataclasses.replace(UNIT_CHIP, dma_write_turnaround_cycles=turnaround)
  x = np.ones((read_rows, 128), np.float32)
  with pl.virtual_tpu(chip) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((write_rows, 128), np.float32), in_specs=[ANY_SPEC],
                   out_specs=ANY_SPEC,
                   scratch_shapes=[pltpu.VMEM((read_rows, 128), jnp.float32),
                                   pltpu.VMEM((write_rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))])(x)
  return tpu.reports[-1]


@pytest.mark.parametrize("turnaround", [142, 30])
def test_a_write_goes_ahead_of_a_reads_tail(turnaround):
  """A 64 KiB read (over the 32 KiB head) started just before a 64 KiB write lands after the write's
  transfer and the turnaround (measured: `dma_curve` pairs); the write runs from its own start."""
  r = _read_and_write(128, turnaround)
  nbytes = 128 * 128 * 4
  read_end = ISSUE + nbytes / BPC
  read_done = math.ceil(read_end) + LAT_READ
  w_start = 2 * ISSUE
  held = read_done + math.ceil(nbytes / BPC) + turnaround
  assert _events(r, "dma") == [("hbm->vmem", ISSUE, read_done),
                               ("read held behind a write", read_done, held),
                               ("vmem->hbm", w_start, math.ceil(w_start + nbytes / BPC) + LAT_WRITE)]
  assert r.device_cycles == held + SYNC + SCALAR + SCALAR


@pytest.mark.parametrize("read_kib", [40, 48, 56])
def test_a_read_shorter_than_twice_the_head_waits_for_its_share_of_the_write(read_kib):
  """A read of 40 / 48 / 56 KiB (head 32 KiB) held behind a 64 KiB write waits a quarter / half / three
  quarters of the write's transfer, and the turnaround (measured: `dma_chunk`, session 37's reading)."""
  rows = read_kib * 1024 // 512
  r = _read_and_write(rows)
  nbytes = rows * 128 * 4
  read_done = math.ceil(ISSUE + nbytes / BPC) + LAT_READ
  share = (read_kib - 32) / 32
  held = read_done + math.ceil(128 * 128 * 4 / BPC * share) + 142
  assert _events(r, "dma")[:2] == [("hbm->vmem", ISSUE, read_done),
                                   ("read held behind a write", read_done, held)]


def test_a_read_within_the_head_is_not_held():
  """A 16 KiB read beside the same write is not held: the write queues behind it on the calendar."""
  r = _read_and_write(32)
  nbytes = 32 * 128 * 4
  read_end = ISSUE + nbytes / BPC
  assert _events(r, "dma")[0] == ("hbm->vmem", ISSUE, math.ceil(read_end) + LAT_READ)
  assert [e[0] for e in _events(r, "dma")] == ["hbm->vmem", "vmem->hbm"]


def _write_then_read(read_rows, write_rows=512):
  """A write of `write_rows` x 128 f32 started, then a read of `read_rows` x 128 f32, both waited: (the
  report, the write's end of transfer)."""
  r = _read_and_write(read_rows, UNIT_CHIP.dma_write_turnaround_cycles, write_rows, write_first=True)
  return r, ISSUE + write_rows * 128 * 4 / BPC


def test_a_read_within_the_head_overtakes_a_write_in_transfer():
  """Measured (session 37, `dma_order`): a 16 KiB read started after a 256 KiB write lands as if alone,
  before the write; after a 16 KiB write, which it would not beat, it queues behind it as the calendar
  has it; a 64 KiB read (over the head) queues behind the write and pays the turnaround."""
  r, w_end = _write_then_read(32)
  start = 2 * ISSUE
  small = 32 * 128 * 4
  assert _events(r, "dma")[1] == ("hbm->vmem", start, math.ceil(start + small / BPC) + LAT_READ)
  assert _events(r, "dma")[1][2] < w_end
  r, w_end = _write_then_read(32, write_rows=32)
  assert _events(r, "dma")[1] == ("hbm->vmem", pytest.approx(w_end),
                                  math.ceil(w_end + small / BPC) + LAT_READ)
  r, w_end = _write_then_read(128)
  big = 128 * 128 * 4
  ev = _events(r, "dma")[1]
  turnaround = UNIT_CHIP.dma_write_turnaround_cycles
  assert ev[0] == "hbm->vmem" and ev[2] == math.ceil(w_end + big / BPC + turnaround) + LAT_READ


def test_a_negative_unroll_is_refused_with_its_place():
  def k(x_ref, o_ref):
    o_ref[...] = lax.fori_loop(0, 4, lambda i, v: v + 1.0, x_ref[...], unroll=-1)

  x = np.ones((8, 128), np.float32)
  with pytest.raises(pl.UsageError, match=r"lax.fori_loop unroll at grid point \(\) on chip 0 core 0 "
                     r"in kernel 'k' at test_issue_rules.py:\d+ must be >= 0; got -1. Fix: pass an "
                     r"integer >= 0"):
    with pl.virtual_tpu(UNIT_CHIP):
      pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _write_read_write(buffer_bytes, rule=True):
  """A 64 KiB write W1, a 64 KiB read R (over the 32 KiB head) and a 64 KiB write W2 started back to
  back, then all waited, with an HBM write buffer of `buffer_bytes`: the DMA events."""
  def k(x_hbm, wbuf, o_hbm, rbuf, sem):
    w1 = pltpu.make_async_copy(wbuf.at[0], o_hbm.at[0], sem.at[0])
    rd = pltpu.make_async_copy(x_hbm, rbuf, sem.at[1])
    w2 = pltpu.make_async_copy(wbuf.at[1], o_hbm.at[1], sem.at[2])
    for cp in (w1, rd, w2):
      cp.start()
    for cp in (rd, w1, w2):
      cp.wait()

  chip = dataclasses.replace(UNIT_CHIP, hbm_write_buffer_bytes=buffer_bytes,
                             dma_big_write_waits_queued_read=rule)
  x = np.ones((128, 128), np.float32)
  w = np.stack([np.full((128, 128), 1.0, np.float32), np.full((128, 128), 2.0, np.float32)])
  with pl.virtual_tpu(chip) as tpu:   # (w: a VMEM input, in place before the body starts)
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((2, 128, 128), np.float32),
                         in_specs=[ANY_SPEC, pl.BlockSpec(memory_space=pltpu.VMEM)], out_specs=ANY_SPEC,
                         scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32), pltpu.SemaphoreType.DMA((3,))])(x, w)
  np.testing.assert_array_equal(out, w)
  return _events(tpu.reports[-1], "dma")[1:]   # (after the input's prologue copy)


def test_a_write_the_buffer_cannot_take_waits_for_a_read_queued_behind_a_write():
  """Measured (session 38, `write_queue`): a read that queued behind a write (started while it was
  transferring) goes before a later write larger than the HBM write buffer: it is not held, and that
  write runs after it as the calendar has it; a write the buffer takes (or any write, the rule off)
  goes ahead and holds the read for its transfer and the turnaround."""
  ev = _write_read_write(32 * 1024)
  assert [e[0] for e in ev] == ["vmem->hbm", "hbm->vmem", "vmem->hbm"]
  (_, w1_start, _), (_, r_start, _), (_, w2_start, _) = ev
  assert r_start >= w1_start + 64 * 1024 / BPC and w2_start >= r_start + 64 * 1024 / BPC
  for buffer_bytes, rule in ((128 * 1024, True), (32 * 1024, False)):
    ev = _write_read_write(buffer_bytes, rule)
    assert [e[0] for e in ev] == ["vmem->hbm", "hbm->vmem", "read held behind a write", "vmem->hbm"]
    held = ev[2]
    assert held[1] == ev[1][2] and held[2] > ev[3][2] - LAT_WRITE
