"""The trace keeps the newest `cap` events (sim/trace.Trace): memory stays bounded on long kernels, and a
truncated timeline says so in its first event."""
from palace._src.sim.trace import Trace


def test_events_are_kept_in_order_below_the_cap():
  t = Trace(cap=4)
  for i in range(3):
    t.add(((0, 0), "vpu", f"op{i}", i, i + 1, None))
  assert [e[2] for e in t.events] == ["op0", "op1", "op2"]
  assert t.events.stats == {"dma_bytes": {}, "dma_count": {}}


def test_past_the_cap_only_the_newest_events_remain_behind_a_marker():
  t = Trace(cap=3)
  for i in range(10):
    t.add(((0, 1), "mxu", f"op{i}", 10 * i, 10 * i + 5, None))
  events = t.events
  assert [e[2] for e in events[1:]] == ["op7", "op8", "op9"]
  marker = events[0]
  assert marker[:2] == ((0, 1), "scalar") and "only the last 3 events" in marker[2]
  assert marker[3] == marker[4] == 70


def test_dma_totals_are_kept_whether_or_not_events_are():
  t = Trace(on=False, cap=2)
  t.count_dma("hbm->vmem", 4096, copies=2)
  t.count_dma("hbm->vmem", 1024)
  assert t.events.stats == {"dma_bytes": {"hbm->vmem": 5120}, "dma_count": {"hbm->vmem": 3}}
  assert list(t.events) == []


def _copy_launches(tpu_kwargs, n):
  import numpy as np
  import palace as pl

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0
  x = np.zeros((32, 128), np.float32)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pl.virtual_tpu("v5e", **tpu_kwargs) as tpu:
    for _ in range(n):
      np.testing.assert_array_equal(f(x), x + 1.0)
  return tpu


def test_reports_keep_at_most_keep_trace_events_in_all_and_the_oldest_drop_theirs(tmp_path):
  """A loop of launches keeps bounded memory: past the budget the oldest reports drop their timelines
  (never the newest one, never their figures); exporting a dropped one says why and what to do."""
  import pytest
  import palace as pl
  full = _copy_launches({}, 1).reports[0]
  per_launch = len(full.events)
  tpu = _copy_launches({"keep_trace_events": 3 * per_launch}, 5)
  assert [len(r.events) for r in tpu.reports] == [0, 0, per_launch, per_launch, per_launch]
  assert all(r.device_cycles == full.device_cycles and r.dma_count_by_direction == full.dma_count_by_direction
             for r in tpu.reports)
  tpu.reports[-1].to_perfetto(tmp_path / "newest.json")
  with pytest.raises(pl.UsageError, match=r"trace of kernel 'kernel' \(\d+ events\) was dropped to bound "
                                          r"memory.*keep_trace_events=None"):
    tpu.reports[0].to_perfetto(tmp_path / "old.json")
  # the newest launch keeps its trace even when it alone exceeds the budget; None keeps every trace
  assert [len(r.events) for r in _copy_launches({"keep_trace_events": 1}, 3).reports] == [0, 0, per_launch]
  assert all(len(r.events) == per_launch for r in _copy_launches({"keep_trace_events": None}, 3).reports)
