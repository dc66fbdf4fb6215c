"""Exact timelines of tiny kernels, derived by hand from the constants of UNIT_CHIP (helpers.py).

Every expected number below is written as the sum that produces it, so a change in the model shows up
as a change in one term.
"""
import dataclasses
import math

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src import hw
from palace._src.sim import cost

from timing_helpers import ANY_SPEC, UNIT_CHIP, run_four_copies

S, SYNC, ISSUE, SCALAR = 40, 260, 8, 1   # grid step, DMA-wait sync, DMA issue, scalar op (cycles); the
# first grid step of a launch pays no step overhead (its bookkeeping is the kernel's prologue)
BPC = 1000                            # bytes per cycle (1e12 B/s at 1 GHz)
LAT_READ, LAT_WRITE, LAT_LOCAL = 100, 50, 20


def _events(report, unit):
  return [(e[2], e[3], e[4]) for e in report.events if e[1] == unit]


def test_one_dma_and_wait():
  def k(x_hbm, o_hbm, buf, sem):
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    c2 = pltpu.make_async_copy(buf, o_hbm, sem)
    c2.start()
    c2.wait()

  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY_SPEC],
                         out_specs=ANY_SPEC,
                         scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])(x)
  np.testing.assert_array_equal(out, x)
  r = tpu.reports[-1]
  nbytes = 8 * 128 * 4
  issue1 = ISSUE                                              # the first step is free: the DMA issue
  done1 = math.ceil(issue1 + nbytes / BPC) + LAT_READ         # transfer, then the completion latency
  issue2 = done1 + SYNC + SCALAR + ISSUE                      # the wait: its sync and one scalar op
  done2 = math.ceil(issue2 + nbytes / BPC) + LAT_WRITE
  assert _events(r, "dma") == [("hbm->vmem", issue1, done1), ("vmem->hbm", issue2, done2)]
  assert not [e for e in _events(r, "scalar") if e[0] == "grid step"]
  assert r.device_cycles == done2 + SYNC + SCALAR == 698
  assert r.device_time_s == 698e-9
  assert r.launch_overhead_s == UNIT_CHIP.launch_overhead_s
  assert r.dma_bytes_by_direction == {"hbm->vmem": nbytes, "vmem->hbm": nbytes}
  assert r.dma_count == 2 and r.hbm_bytes == 2 * nbytes
  assert r.unit_busy_cycles["scalar"] == 2 * ISSUE


def test_local_and_hbm_to_hbm_latencies():
  def k(x_hbm, o_hbm, vbuf, sbuf, sem):
    c = pltpu.make_async_copy(x_hbm, o_hbm, sem)        # HBM -> HBM: bytes twice on the HBM channel
    c.start()
    c.wait()
    pltpu.sync_copy(x_hbm, vbuf)
    c3 = pltpu.make_async_copy(vbuf.at[0], sbuf, sem)   # VMEM -> SMEM on the local channel
    c3.start()
    c3.wait()

  x = np.ones((8, 128), np.float32)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY_SPEC],
                   out_specs=ANY_SPEC,
                   scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SMEM((128,), jnp.float32),
                                   pltpu.SemaphoreType.DMA])(x)
  r = tpu.reports[-1]
  dmas = _events(r, "dma")
  nbytes = 8 * 128 * 4
  issue1 = ISSUE
  done1 = math.ceil(issue1 + 2 * nbytes / BPC) + max(LAT_READ, LAT_WRITE)
  assert dmas[0] == ("hbm->hbm", issue1, done1)
  assert dmas[1][0] == "hbm->vmem"
  name, start, end = dmas[2]
  assert name == "vmem->smem"
  assert end == math.ceil(start + 128 * 4 / (2 * BPC)) + LAT_LOCAL
  assert r.dma_count_by_direction == {"hbm->hbm": 1, "hbm->vmem": 1, "vmem->smem": 1}


def test_one_matmul():
  def mm(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  a = np.ones((128, 128), jnp.bfloat16)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    pl.pallas_call(mm, out_shape=pl.ShapeDtypeStruct((128, 128), np.float32))(a, a)
  r = tpu.reports[-1]
  in_bytes, out_bytes = 128 * 128 * 2, 128 * 128 * 4
  # Step 0 issues both input copies back to back (they share the DMA channel FIFO), then waits them.
  x_issue = ISSUE
  y_issue = x_issue + ISSUE
  x_end = x_issue + in_bytes / BPC
  x_done = math.ceil(x_end) + LAT_READ
  y_done = math.ceil(max(y_issue, x_end) + in_bytes / BPC) + LAT_READ
  body = max(x_done + SYNC + SCALAR, y_done) + SCALAR          # one sync for the run of two waits
  # Loads: a bf16 (128,128) block is 8 packed vregs, 3 loads per cycle -> 3 cycles each. The second
  # interleaves with the first on the load unit: it issues with it and its vregs end 3 cycles later.
  assert _events(r, "vld") == [("load", body, body + 3), ("load", body, body + 6)]
  # MXU (v5e rules): 1 latch, 128/16 = 8 vmatmuls spread over 4 MXUs -> 2 * cadence 16 = 32 cycles,
  # plus the first latch, 4 * 128 / 16 = 32 cycles, never hidden. Result after the 131-cycle latency.
  mxu_busy = 2 * 16 + 32
  # It issues with the loads (its operands stream in behind them: ready at body + 6 + 4, before its end).
  assert _events(r, "mxu") == [("matmul 128x128x128", body, body + mxu_busy)]
  result = body + mxu_busy + 131
  # The f32 (128,128) store is 16 vregs at 1 per cycle; it ends 1 cycle (a store's latency, measured
  # on a v5e: docs/timing-model.md 1.4) after the result it streams.
  store_done = result + 1
  wb_start = store_done                                       # the write-back waits for the store
  wb_done = math.ceil(wb_start + out_bytes / BPC) + LAT_WRITE
  assert _events(r, "dma")[-1] == ("vmem->hbm", wb_start, wb_done)
  assert r.device_cycles == wb_done + SYNC + SCALAR
  assert r.flops == 2 * 128 ** 3
  assert r.unit_busy_cycles["mxu"] == mxu_busy


def test_grid_steps_cost_the_step_overhead_each():
  def k(o_ref):
    pass

  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), grid=(5,),
                   out_specs=ANY_SPEC)()
  r = tpu.reports[-1]
  # the first step is the prologue; each later step pays the step overhead (nothing is copied)
  assert [e[1:] for e in _events(r, "scalar")] == [(i * S, (i + 1) * S) for i in range(4)]
  assert r.device_cycles == 4 * S
  assert r.grid_steps == 5 and r.bound == "overhead"


def test_a_run_of_dma_waits_pays_one_sync():
  """A DMA wait whose copy landed after the last DMA-wait sync pays SYNC after it landed; copies that
  landed before that sync ended cost their scalar op only (measured on a v5e: a (start; wait) loop of
  4 KiB reads takes 0.35 us a copy; one that starts each copy three iterations ahead 0.09 us)."""
  cycles, dones = {}, {}
  for name, chip in (("sync", UNIT_CHIP), ("none", dataclasses.replace(UNIT_CHIP, dma_wait_sync_cycles=0))):
    cycles[name], dones[name] = run_four_copies(chip)
  assert dones["sync"] == dones["none"]
  # the first wait returns SYNC after its copy landed (the other three have landed by then), then each
  # wait is one scalar op; without the sync the run ends one scalar op after the last copy lands
  assert cycles["sync"] == dones["sync"][0] + SYNC + 4 * SCALAR
  assert cycles["none"] == dones["none"][-1] + SCALAR


def test_next_step_waits_for_the_mxu_to_drain():
  def k(x_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.float32)

  a = np.ones((128, 128), jnp.bfloat16)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((256, 128), np.float32), grid=(2,),
                   in_specs=[pl.BlockSpec((128, 128), lambda i: (0, 0))],
                   out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)))(a)
  r = tpu.reports[-1]
  (_, mxu_start, mxu_end), = _events(r, "mxu")[:1]
  steps = [e for e in _events(r, "scalar") if e[0] == "grid step"]
  # step 1's bookkeeping (the first step with an event: step 0 is free) starts when step 0's MXU result
  # is out (MXU end + latency: results leave through issue slots); the store's 1-cycle latency overlaps
  # it, so the next step issues after the 37 cycles of bookkeeping, not after the drain + 10.
  assert steps[0][1] == mxu_end + 131
  assert steps[0][2] == mxu_end + 131 + max(UNIT_CHIP.grid_step_overhead_cycles,
                                            1 + UNIT_CHIP.grid_step_drain_cycles)


def test_matmul_cadence_rules():
  v5e, v6e, v4 = hw.get_chip("v5e"), hw.get_chip("v6e"), hw.get_chip("v4")
  bf16, f32, i8 = jnp.bfloat16, np.float32, np.int8
  fp8 = jnp.float8_e4m3fn
  # v5e (512,1024)@(1024,1024): 64 latches of 128x128, 512/16 = 32 vmatmuls each, over 4 MXUs.
  assert cost.matmul_cycles(v5e, 512, 1024, 1024, 1, bf16, bf16) == (64 * 32 // 4 * 16 + 32, 131)
  # int8: 32 rows per vmatmul, cadence 16 -> twice the rate; latch 4*128/32 = 16; int latency 121.
  assert cost.matmul_cycles(v5e, 512, 1024, 1024, 1, i8, i8) == (64 * 16 // 4 * 16 + 16, 121)
  # f32: 8 rows, cadence 8 -> the bf16 rate; latch 2*128/8 = 32.
  assert cost.matmul_cycles(v5e, 512, 1024, 1024, 1, f32, f32) == (64 * 64 // 4 * 8 + 32, 131)
  # fp8 on v5e: 32 rows at cadence 32 -> the bf16 rate (no fp8 speed-up).
  assert cost.matmul_cycles(v5e, 512, 1024, 1024, 1, fp8, fp8)[0] == 64 * 16 // 4 * 32 + 16
  # v6e: 256-wide MXU, 2 MXUs, cadence 8: 16 latches of 32 vmatmuls; latch 4*256/16 = 64.
  assert cost.matmul_cycles(v6e, 512, 1024, 1024, 1, bf16, bf16) == (16 * 32 // 2 * 8 + 64, 192)
  # v4: int8 has no speed-up (cadence 32 for 32 rows).
  assert cost.matmul_cycles(v4, 512, 1024, 1024, 1, i8, i8)[0] == 64 * 16 // 4 * 32 + 16
  # One vmatmul per latch (16 latches, 4 per MXU): the 32-cycle latch shows beyond the 16 cycles of
  # vmatmul between latches, and +4 cycles per chained vmatmul (MRB reuse hazard).
  assert cost.matmul_cycles(v5e, 16, 512, 512, 1, bf16, bf16)[0] == 4 * 16 + 32 + 3 * (32 - 16) + 4 * 4
  # A (128,128) weight is padded to the MXU: the same cycles for K = N = 100.
  assert cost.matmul_cycles(v5e, 128, 100, 100, 1, bf16, bf16) == cost.matmul_cycles(
      v5e, 128, 128, 128, 1, bf16, bf16)


def test_peaks_follow_from_the_cadence():
  for name, cls, peak in [("v5e", "bf16", 196.6e12), ("v5e", "int8", 393.2e12), ("v5p", "bf16", 458.8e12),
                          ("v6e", "bf16", 917.5e12), ("7x", "fp8", 2306.9e12), ("7x", "bf16", 1153.4e12),
                          ("v4", "bf16", 275.3e12)]:
    assert hw.get_chip(name).peak_flops_per_s(cls) == pytest.approx(peak, rel=2e-3), name


def test_vector_costs_count_padded_tiles():
  v5e, v4 = hw.get_chip("v5e"), hw.get_chip("v4")
  assert cost.vector_cost(v5e, "cheap", (1, 1)) == ("vpu", 1, 2)          # padded to one (8,128) tile
  assert cost.vector_cost(v5e, "cheap", (64, 128))[1] == 8 // 4          # 8 tiles, 4 ALUs per lane
  assert cost.vector_cost(v4, "cheap", (64, 128))[1] == 8 // 2           # 2 ALUs per lane on v4
  assert cost.vector_cost(v5e, "store", (32, 128), jnp.bfloat16)[1] == 2  # (16,128) packed bf16 vregs
  assert cost.vector_cost(v5e, "store", (32, 128), np.float32)[1] == 4
  assert cost.vector_cost(v5e, "load", (96, 128), np.float32)[1] == 12 // 3
  assert cost.vector_cost(v5e, "reduce_lane", (64, 128))[0] == "xlu"
  assert cost.vector_cost(v5e, "transcendental", (64, 128))[0] == "eup"
  assert cost.vector_cost(v5e, "free", (64, 128)) == (None, 0, 0)


@pytest.mark.parametrize("steps", [4, 16])   # below and above the grids whose maps are vectorised
def test_index_map_arithmetic_costs_nothing_on_any_grid(steps):
  """Index-map arithmetic is part of the calibrated grid-step overhead: a map computing its block with
  palace ops costs what the plain map giving the same blocks costs, whether the pipeline evaluates it
  per step (small grids) or once for the whole grid (before, a small grid's maps charged scalar ops
  and the same maps on a long grid did not). A map reading prefetched scalars (SMEM loads) is charged
  one load per step on every grid."""
  def kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]
  x = np.arange(steps * 8 * 128, dtype=np.float32).reshape(steps * 8, 128)
  cycles = []
  for index_map in (lambda i, idx: (jnp.minimum(i, i + 1), 0), lambda i, idx: (i, 0),
                    lambda i, idx: (idx[i], 0)):
    spec = pl.BlockSpec((8, 128), index_map)
    f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                       grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(steps,),
                                                              in_specs=[spec], out_specs=spec))
    with pl.virtual_tpu(UNIT_CHIP) as tpu:
      np.testing.assert_array_equal(f(np.arange(steps, dtype=np.int32), x), x)
    cycles.append(tpu.reports[-1].device_cycles)
  computed, plain, loaded = cycles
  assert computed == plain
  # the in and out maps' loads (one scalar load per map per step) are charged; the ones issued while a
  # DMA wait is pending overlap it, so between one and two per step reach the critical path
  assert plain + SCALAR * steps <= loaded <= plain + 2 * SCALAR * steps


@pytest.mark.parametrize("dtype,shape,index,moves", [
    (np.float32, (16, 512), (slice(None), slice(128, 384)), False),    # whole (8,128) vregs
    (np.float32, (16, 512), (slice(8, 16), slice(None)), False),
    (np.float32, (16, 200), (slice(None), slice(128, 200)), False),    # to the end: the last tile as is
    (np.float32, (4, 16, 512), (2, slice(None), slice(0, 256)), False),  # an int on a leading dim
    (np.float32, (16, 512), (slice(None), slice(0, 1)), False),        # a column at a tile's start
    (np.float32, (16, 512), (slice(8, 11), slice(128, 200)), False),   # starts on the tiles, ends inside
    (np.float32, (16, 512), (slice(None), slice(64, 192)), True),      # lanes off the 128 grid
    (np.float32, (16, 512), (slice(4, 12), slice(None)), True),        # sublanes off the 8 grid
    (np.float32, (16, 512), (3, slice(None)), True),                   # one row: a relayout
    (np.float32, (16, 512), (slice(None), slice(0, 512, 2)), True),    # strided
    (jnp.bfloat16, (32, 256), (slice(16, 32), slice(None)), False),    # bf16 vregs hold 16 rows
    (jnp.bfloat16, (32, 256), (slice(8, 16), slice(None)), True),
])
def test_value_slices_cost_an_xlu_relayout_unless_they_pick_whole_vregs(dtype, shape, index, moves):
  """A value slice whose minor-two-dim offsets are multiples of the (8 * packing, 128) tiling only
  selects vregs (Mosaic's extract_strided_slice lowering; a partial last tile is the operand's own
  vreg, measured on a v5e: benchmarks/hw `colbcast`): no XLU work. Other slices relayout on the XLU."""
  x = (np.arange(np.prod(shape)) % 7).reshape(shape).astype(dtype)

  def kernel(x_ref, o_ref):
    v = x_ref[...][index]
    o_ref[...] = v
  want = x[index]
  with pl.virtual_tpu("v5e") as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(want.shape, want.dtype))(x)
  np.testing.assert_array_equal(out, want)
  assert (tpu.reports[-1].unit_busy_cycles.get("xlu", 0) > 0) == moves


@pytest.mark.parametrize("dtype,src,dst,moves", [
    (np.float32, (4, 16, 128), (64, 128), False),     # leading dim folded into whole 8-row tiles
    (np.float32, (64, 128), (8, 8, 128), False),      # and unfolded
    (jnp.bfloat16, (2, 16, 128), (32, 128), False),   # bf16: 16-row tiles
    (jnp.bfloat16, (4, 8, 128), (32, 128), True),     # 8 rows of bf16: half a vreg each
    (np.float32, (16, 256), (32, 128), True),         # the lane dim changes
])
def test_reshapes_that_keep_whole_vregs_are_free(dtype, src, dst, moves):
  x = (np.arange(np.prod(src)) % 5).reshape(src).astype(dtype)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].reshape(dst)
  with pl.virtual_tpu("v5e") as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(dst, x.dtype))(x)
  np.testing.assert_array_equal(out, x.reshape(dst))
  assert (tpu.reports[-1].unit_busy_cycles.get("xlu", 0) > 0) == moves


def _vpu_busy(body, shape=(64, 256), dtype=np.float32):
  x = np.ones(shape, dtype)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    out = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(shape, dtype))(x)
  return tpu.reports[-1].unit_busy_cycles["vpu"], np.asarray(out)


def test_a_filled_vector_costs_no_vector_op():
  """jnp.full / zeros inside a kernel cost no VPU op: the VPU takes a scalar operand, and a stored
  fill is one splat vreg stored again (its stores are charged). x + full(2.0) costs what x + x does:
  one add over its 16 vregs (docs/timing-model.md 1.4, the v5e's causal flash)."""
  add = cost.vector_cost(UNIT_CHIP, "cheap", (64, 256))[1]
  filled, out = _vpu_busy(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + jnp.full((64, 256), 2.0)))
  np.testing.assert_array_equal(out, 3.0)
  doubled, _ = _vpu_busy(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + x_ref[...]))
  assert filled == doubled == add


@pytest.mark.parametrize("dimension,distinct", [(0, (64, 1)), (1, (1, 256))])
def test_an_iota_costs_its_distinct_vregs(dimension, distinct):
  """lax.broadcasted_iota over (64, 256) repeats its vregs along the other dim: the compiler makes each
  distinct one once (along sublanes 8 vregs, along lanes 2), then the add over all 16 is charged."""
  from palace import lax
  iota_cost = cost.vector_cost(UNIT_CHIP, "cheap", distinct)[1]
  add = cost.vector_cost(UNIT_CHIP, "cheap", (64, 256))[1]

  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + lax.broadcasted_iota(jnp.float32, (64, 256), dimension)

  busy, out = _vpu_busy(body)
  np.testing.assert_array_equal(out, 1 + np.broadcast_to(
      np.arange((64, 256)[dimension], dtype=np.float32).reshape((-1, 1) if dimension == 0 else (1, -1)),
      (64, 256)))
  assert busy == iota_cost + add
  assert iota_cost < add
