"""Bandwidth calendars (L4b): shared channels that transfers fill over time.

A channel records how much of its bandwidth (bytes per cycle) is in use on each interval of time. A
transfer that starts at `start` runs, at every instant, at the largest rate that every channel it
crosses still has free (a DMA engine, the chip's HBM, an ICI link), and ends when its bytes are
through. So:
  * one stream of copies behaves like a FIFO (each copy waits for the previous one's bandwidth);
  * copies from different cores (TensorCores, SparseCore subcores) that overlap in time share the
    bandwidth, whatever order the scheduler issued them in: a later-issued copy with an earlier start
    uses what earlier reservations left free instead of queueing behind them.
Reservations are greedy in issue order (no re-timing of copies already reserved). Deterministic.
"""
from __future__ import annotations

import bisect

_EPS = 1e-9
_INF = float("inf")


class Channel:
  """Piecewise-constant bandwidth usage: `times[i]` starts a segment using `used[i]` bytes/cycle; the
  last segment runs to infinity."""
  __slots__ = ("name", "bytes_per_cycle", "times", "used", "busy_cycles", "bytes", "free_cycle")

  def __init__(self, name: str, bytes_per_s: float, clock_hz: float):
    self.name = name
    self.bytes_per_cycle = bytes_per_s / clock_hz
    self.times = [0.0]
    self.used = [0.0]
    self.busy_cycles = 0.0
    self.bytes = 0
    self.free_cycle = 0.0  # end of the last reservation (for reports)

  # -- segment helpers
  def _split(self, t: float) -> int:
    """Index of the segment starting exactly at t (inserting a breakpoint if needed)."""
    i = bisect.bisect_right(self.times, t) - 1
    if i >= 0 and abs(self.times[i] - t) <= _EPS:
      return i
    if i < 0:
      self.times.insert(0, t)
      self.used.insert(0, 0.0)
      return 0
    self.times.insert(i + 1, t)
    self.used.insert(i + 1, self.used[i])
    return i + 1

  def free_at(self, t: float) -> float:
    i = bisect.bisect_right(self.times, t) - 1
    return self.bytes_per_cycle - (self.used[i] if i >= 0 else 0.0)

  def next_break(self, t: float) -> float:
    i = bisect.bisect_right(self.times, t + _EPS)
    return self.times[i] if i < len(self.times) else float("inf")

  def add(self, t0: float, t1: float, rate: float) -> None:
    if t1 - t0 <= _EPS:
      return
    i = self._split(t0)
    j = self._split(t1)
    for k in range(i, j):
      self.used[k] += rate

  def prune(self, before: float) -> None:
    """Forget usage that ends before `before` (no reservation can start earlier any more)."""
    i = bisect.bisect_right(self.times, before) - 1
    if i > 0:
      del self.times[:i]
      del self.used[:i]

  # -- single-channel API
  def reserve(self, start: float, nbytes: float) -> tuple[float, float]:
    return reserve([(self, 1.0)], start, nbytes)


def _append_tail(c: Channel, t: float, end: float, rate: float) -> None:
  """Add `rate` on [t, end) to a channel with nothing reserved after its last breakpoint <= t."""
  times, used = c.times, c.used
  base = used[-1]
  if times[-1] < t - _EPS:
    times.append(t)
    used.append(base + rate)
  else:
    used[-1] = base + rate
    if len(used) > 1 and abs(used[-2] - used[-1]) <= _EPS:  # merge with the previous segment
      del times[-1]
      del used[-1]
  times.append(end)
  used.append(base)


def reserve(channels, start: float, nbytes: float) -> tuple[float, float]:
  """Reserve `nbytes` through every channel of `channels` = [(channel, weight)] from `start` on; a
  channel with weight w carries w bytes per byte of the transfer (HBM->HBM copies: 2). Returns
  (first cycle with data moving, last cycle)."""
  t = float(start)
  remaining = float(nbytes)
  first = None
  if remaining <= 0:
    return t, t
  while True:
    tail = True
    avail = float("inf")
    for c, w in channels:
      if c.times[-1] > t + _EPS:
        tail = False
        break
      a = (c.bytes_per_cycle - c.used[-1]) / w
      if a < avail:
        avail = a
    if tail:  # nothing reserved from t on: run at the best free rate until done (fast path)
      if avail > _EPS:
        if first is None:
          first = t
        end = t + remaining / avail
        for c, w in channels:
          _append_tail(c, t, end, avail * w)
        break
    avail = nxt = float("inf")
    for c, w in channels:
      times = c.times
      i = bisect.bisect_right(times, t) - 1
      a = (c.bytes_per_cycle - (c.used[i] if i >= 0 else 0.0)) / w
      if a < avail:
        avail = a
      j = bisect.bisect_right(times, t + _EPS)
      if j < len(times) and times[j] < nxt:
        nxt = times[j]
    if avail <= _EPS:
      if nxt == float("inf"):
        raise AssertionError("a channel is over-subscribed forever")
      t = nxt
      continue
    if first is None:
      first = t
    dt = remaining / avail
    end = t + dt
    if end <= nxt + _EPS:
      for c, w in channels:
        c.add(t, end, avail * w)
      break
    for c, w in channels:
      c.add(t, nxt, avail * w)
    remaining -= avail * (nxt - t)
    t = nxt
  for c, w in channels:
    c.busy_cycles += end - first
    c.bytes += int(nbytes * w)
    if end > c.free_cycle:
      c.free_cycle = end
  return first, end


def reserve2(a: Channel, wa: float, b: Channel, wb: float, start: float, nbytes: float):
  """reserve([(a, wa), (b, wb)], start, nbytes) for two channels (a DMA engine and HBM), unrolled:
  the same steps in the same order, so the same floating-point results."""
  if nbytes <= 0:
    return reserve([(a, wa), (b, wb)], start, nbytes)
  t = float(start)
  remaining = float(nbytes)
  first = None
  inf = _INF
  bisect_right = bisect.bisect_right
  ta, tb = a.times, b.times   # (lists are only ever changed in place)
  ua, ub = a.used, b.used
  while True:
    if ta[-1] <= t + _EPS and tb[-1] <= t + _EPS:  # nothing reserved from t on (fast path)
      avail = inf
      x = (a.bytes_per_cycle - ua[-1]) / wa
      if x < avail:
        avail = x
      x = (b.bytes_per_cycle - ub[-1]) / wb
      if x < avail:
        avail = x
      if avail > _EPS:
        if first is None:
          first = t
        end = t + remaining / avail
        # = _append_tail(a, t, end, avail * wa); _append_tail(b, t, end, avail * wb), inlined
        rate = avail * wa
        base = ua[-1]
        if ta[-1] < t - _EPS:
          ta.append(t)
          ua.append(base + rate)
        else:
          ua[-1] = base + rate
          if len(ua) > 1 and abs(ua[-2] - ua[-1]) <= _EPS:
            del ta[-1]
            del ua[-1]
        ta.append(end)
        ua.append(base)
        rate = avail * wb
        base = ub[-1]
        if tb[-1] < t - _EPS:
          tb.append(t)
          ub.append(base + rate)
        else:
          ub[-1] = base + rate
          if len(ub) > 1 and abs(ub[-2] - ub[-1]) <= _EPS:
            del tb[-1]
            del ub[-1]
        tb.append(end)
        ub.append(base)
        break
    # = for c, w, times in ((a, wa, ta), (b, wb, tb)): ..., unrolled. A copy queued behind the last
    # reservation starts inside the second-to-last segment: its bisections are known
    n = len(ta)
    if n > 1 and ta[-2] <= t and t + _EPS < ta[-1]:
      avail = (a.bytes_per_cycle - ua[n - 2]) / wa
      nxt = ta[n - 1]
    else:
      i = bisect_right(ta, t) - 1
      avail = (a.bytes_per_cycle - (ua[i] if i >= 0 else 0.0)) / wa
      j = bisect_right(ta, t + _EPS)
      nxt = ta[j] if j < n else inf
    n = len(tb)
    if n > 1 and tb[-2] <= t and t + _EPS < tb[-1]:
      x = (b.bytes_per_cycle - ub[n - 2]) / wb
      if x < avail:
        avail = x
      if tb[n - 1] < nxt:
        nxt = tb[n - 1]
    else:
      i = bisect_right(tb, t) - 1
      x = (b.bytes_per_cycle - (ub[i] if i >= 0 else 0.0)) / wb
      if x < avail:
        avail = x
      j = bisect_right(tb, t + _EPS)
      if j < n and tb[j] < nxt:
        nxt = tb[j]
    if avail <= _EPS:
      if nxt == inf:
        raise AssertionError("a channel is over-subscribed forever")
      t = nxt
      continue
    if first is None:
      first = t
    end = t + remaining / avail
    if end <= nxt + _EPS:
      a.add(t, end, avail * wa)
      b.add(t, end, avail * wb)
      break
    a.add(t, nxt, avail * wa)
    b.add(t, nxt, avail * wb)
    remaining -= avail * (nxt - t)
    t = nxt
  # = for c, w in ((a, wa), (b, wb)): bookkeeping, unrolled
  a.busy_cycles += end - first
  a.bytes += int(nbytes * wa)
  if end > a.free_cycle:
    a.free_cycle = end
  b.busy_cycles += end - first
  b.bytes += int(nbytes * wb)
  if end > b.free_cycle:
    b.free_cycle = end
  return first, end
