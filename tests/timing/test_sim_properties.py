"""Property tests: the machine's hot paths against straightforward reference models.

- `bandwidth.reserve` (the one calendar reservation, with its tail and known-bisection shortcuts)
  against a model that keeps every reservation as an interval and recomputes each channel's usage;
- DMA timing of random sets of copies on one core against the FIFO recomputation that a single
  stream of copies obeys on the round-number chip (issue, bandwidth queue, completion latency).
(Semaphore settle against a reference: tests/timing/test_sync.py.)
"""
import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
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
