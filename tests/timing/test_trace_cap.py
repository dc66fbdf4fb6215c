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
