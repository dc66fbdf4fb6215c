"""Property tests: the machine's hot paths against straightforward reference models.

- `bandwidth.reserve` (the one calendar reservation, with its tail and known-bisection shortcuts)
  against a model that keeps every reservation as an interval and recomputes each channel's usage;
- DMA timing of random sets of copies on one core against the FIFO recomputation that a single
  stream of copies obeys on the round-number chip (issue, bandwidth queue, completion latency).
(Semaphore settle against a reference: tests/timing/test_sync.py.)
"""
import functools
import inspect
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.core import MemorySpace
from palace._src.hw import get_chip
from palace._src.sim import dma
from palace._src.sim.bandwidth import Channel, reserve

from timing_helpers import ANY_SPEC, UNIT_CHIP

INF = float("inf")


class _RefChannel:
  """Every reservation as (start, end, rate); usage at t is the sum of the rates covering t."""

  def __init__(self, bytes_per_cycle):
    self.cap = bytes_per_cycle
    self.res = []

  def used(self, t):
    return sum(r for a, b, r in self.res if a <= t < b)

  def breaks_after(self, t):
    return [x for a, b, _ in self.res for x in (a, b) if x > t + 1e-9]


def _ref_reserve(channels, start, nbytes):
  t, rem, first = float(start), float(nbytes), None
  while rem > 1e-9:
    free = min((c.cap - c.used(t)) / w for c, w in channels)
    nxt = min([x for c, _ in channels for x in c.breaks_after(t)], default=INF)
    if free <= 1e-9:
      t = nxt
      continue
    first = t if first is None else first
    if t + rem / free <= nxt + 1e-9:
      end = t + rem / free
      for c, w in channels:
        c.res.append((t, end, free * w))
      return first, end
    for c, w in channels:
      c.res.append((t, nxt, free * w))
    rem -= free * (nxt - t)
    t = nxt
  return t, t


_transfer = st.tuples(st.integers(0, 3), st.integers(0, 400), st.integers(1, 4000))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=1, max_size=3),
       st.lists(_transfer, min_size=1, max_size=12), st.sampled_from([1.0, 2.0]))
def test_reserve_agrees_with_an_interval_model(caps, transfers, hbm_weight):
  """Random transfers over random subsets of up to three channels (a second channel weighing 1 or 2,
  as HBM does for HBM->HBM copies), issued in any start order: same first and last cycle."""
  real = [Channel(f"c{i}", cap, 1.0) for i, cap in enumerate(caps)]
  ref = [_RefChannel(cap) for cap in caps]
  for mask, start, nbytes in transfers:
    pick = [i for i in range(len(caps)) if (mask + 1) >> i & 1] or [0]
    weights = [1.0 if k == 0 else hbm_weight for k in range(len(pick))]
    got = reserve([(real[i], w) for i, w in zip(pick, weights)], start, nbytes)
    want = _ref_reserve([(ref[i], w) for i, w in zip(pick, weights)], start, nbytes)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6)
  for c, r in zip(real, ref):   # and the same usage everywhere (sampled at the segment midpoints)
    for a, b in zip(c.times, c.times[1:] + [c.times[-1] + 1]):
      mid = (a + b) / 2
      i = max(k for k, x in enumerate(c.times) if x <= mid)
      assert c.used[i] == pytest.approx(r.used(mid), abs=1e-6)


S, ISSUE, SCALAR, BPC = 0, 8, 1, 1000   # UNIT_CHIP: the (free) first grid step, DMA issue, scalar op, B/cycle
LAT = {"hbm->vmem": 100, "vmem->hbm": 50}


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["hbm->vmem", "vmem->hbm"]), st.integers(1, 16)),
                min_size=1, max_size=6))
def test_dma_timing_of_random_copy_sets_matches_a_fifo_recomputation(copies):
  """Copies started back to back on one core share its DMA engine and HBM (both 1000 B/cycle): each
  starts when issued or when the previous one's bytes are through, whichever is later, and completes
  its direction's latency after its last byte (rounded up to a cycle)."""
  n = len(copies)

  def k(x_hbm, o_hbm, buf, sems):
    descs = []
    for i, (kind, rows) in enumerate(copies):
      if kind == "hbm->vmem":
        d = pltpu.make_async_copy(x_hbm.at[i, pl.ds(0, rows)], buf.at[i, pl.ds(0, rows)], sems.at[i])
      else:
        d = pltpu.make_async_copy(buf.at[i, pl.ds(0, rows)], o_hbm.at[i, pl.ds(0, rows)], sems.at[i])
      d.start()
      descs.append(d)
    for d in descs:
      d.wait()

  x = np.ones((n, 16, 128), np.float32)
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY_SPEC],
                   out_specs=ANY_SPEC,
                   scratch_shapes=[pltpu.VMEM((n, 16, 128), jnp.float32),
                                   pltpu.SemaphoreType.DMA((n,))])(x)
  got = [(e[2], e[3], e[4]) for e in tpu.reports[-1].events if e[1] == "dma"]
  want, now, busy_until = [], S, 0.0
  for kind, rows in copies:
    now += ISSUE
    start = max(now, busy_until)
    busy_until = start + rows * 128 * 4 / BPC
    want.append((kind, start, math.ceil(busy_until) + LAT[kind]))
  assert got == want
  end, synced = now, -1
  for _, _, done in want:   # a wait whose copy landed after the last DMA-wait sync pays a new one
    end = max(end, done)
    if done > synced:
      end += UNIT_CHIP.dma_wait_sync_cycles
      synced = end
    end += SCALAR
  assert tpu.reports[-1].device_cycles == end


def _reserve_steps(run):
  """(run()'s result, how many times `bandwidth.reserve` ran its general stepping loop in it, the
  pass that walks the calendars' breakpoints): line events on its first line, counted (not timed)."""
  code = reserve.__code__
  line = code.co_firstlineno + next(i for i, text in enumerate(inspect.getsource(reserve).splitlines())
                                    if text.strip() == "avail = nxt = _INF")
  steps = [0]

  def tracer(frame, event, arg):
    if frame.f_code is not code:
      return None
    if event == "line" and frame.f_lineno == line:
      steps[0] += 1
    return tracer
  sys.settrace(tracer)
  try:
    out = run()
  finally:
    sys.settrace(None)
  return out, steps[0]


def test_a_stream_of_reads_reserves_each_copy_without_stepping_whatever_its_channel_order():
  """A stream of HBM->VMEM copies on a v5e core is queued behind its previous copy, which fills the
  slower of its two channels (HBM: its read weight makes it slower than the DMA engine) to its end.
  With the slowest channel first (the CopyPlan's order) each reservation jumps there and takes the
  rest in one segment; listed second (the order before), every copy after the first ran the general
  stepping loop once more. Same cycles, bit for bit, in either order."""
  chip = get_chip("v5e")

  def stream(order):
    chans = (Channel("tc-dma", chip.dma_bytes_per_s_per_tc, chip.clock_hz),
             Channel("hbm", chip.hbm_bytes_per_s_per_device, chip.clock_hz),
             Channel("local", chip.vmem_vmem_dma_bytes_per_s, chip.clock_hz))
    p = dma.plan(dma.copy_timing(chip, MemorySpace.HBM, MemorySpace.VMEM), chans)
    channels = p.channels if order == "plan" else p.channels[::-1]
    return [reserve(channels, 10.0 * i, 256 * 1024) for i in range(32)]

  (planned, steps), (reversed_, steps_rev) = _reserve_steps(lambda: stream("plan")), \
      _reserve_steps(lambda: stream("reversed"))
  assert planned == reversed_    # bit for bit
  assert [c.name for c, _ in dma.plan(dma.copy_timing(chip, MemorySpace.HBM, MemorySpace.VMEM),
                                       (Channel("tc-dma", 1.0, 1.0), Channel("hbm", 1.0, 1.0),
                                        Channel("local", 1.0, 1.0))).channels] == ["hbm", "tc-dma"]
  assert steps == 0
  assert steps_rev == 31
