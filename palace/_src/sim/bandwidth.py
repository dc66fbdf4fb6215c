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
  __slots__ = ("name", "bytes_per_cycle", "times", "used", "read_until", "wbuf_level", "wbuf_time")

  def __init__(self, name: str, bytes_per_s: float, clock_hz: float):
    self.name = name
    self.read_until = 0.0   # (an HBM channel: the last cycle of a reserved read, sim/dma.CopyPlan)
    self.wbuf_level = 0.0   # (an HBM channel: its write buffer's bytes at wbuf_time, sim/dma.CopyPlan)
    self.wbuf_time = 0.0
    self.bytes_per_cycle = bytes_per_s / clock_hz
    self.times = [0.0]
    self.used = [0.0]

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


def reserve(channels, start: float, nbytes: float) -> tuple[float, float]:
  """Reserve `nbytes` through every channel of `channels` = [(channel, weight)] from `start` on; a
  channel with weight w carries w bytes per byte of the transfer (HBM->HBM copies: 2). Returns
  (first cycle with data moving, last cycle).

  At each instant the transfer runs at the smallest free rate (per byte of the transfer) among its
  channels, until the next breakpoint of any of them; a transfer with nothing reserved after it on
  every channel (a stream of copies) takes the rest in one segment."""
  t = float(start)
  remaining = float(nbytes)
  first = None
  if remaining <= 0:
    return t, t
  bisect_right = bisect.bisect_right
  while True:
    avail = _INF   # the best free rate from t on, if nothing is reserved after t on any channel
    te = t + _EPS
    for c, w in channels:
      times = c.times
      if times[-1] > te:
        n = len(times)
        if n > 1 and times[-2] <= t and (c.bytes_per_cycle - c.used[n - 2]) / w <= _EPS:
          # queued behind a reservation that fills this channel up to its last breakpoint: nothing
          # moves before then, whatever the other channels do (the loop below would step there)
          avail = None   # (marks the jump)
          t = times[-1]
        break
      a = (c.bytes_per_cycle - c.used[-1]) / w
      if a < avail:
        avail = a
    else:  # nothing reserved from t on: run at the best free rate until done
      if avail > _EPS:
        if first is None:
          first = t
        end = t + remaining / avail
        for c, w in channels:   # add avail * w on [t, end) after the channel's last breakpoint
          times, used = c.times, c.used
          base = used[-1]
          if times[-1] < t - _EPS:
            times.append(t)
            used.append(base + avail * w)
          else:
            used[-1] = base + avail * w
            if len(used) > 1 and abs(used[-2] - used[-1]) <= _EPS:  # merge with the previous segment
              del times[-1]
              del used[-1]
          times.append(end)
          used.append(base)
        break
    if avail is None:
      continue
    avail = nxt = _INF
    for c, w in channels:
      times = c.times
      n = len(times)
      if n > 1 and times[-2] <= t and t + _EPS < times[-1]:
        # queued behind the last reservation: inside the second-to-last segment (bisections known)
        a = (c.bytes_per_cycle - c.used[n - 2]) / w
        j_time = times[n - 1]
      else:
        i = bisect_right(times, t) - 1
        a = (c.bytes_per_cycle - (c.used[i] if i >= 0 else 0.0)) / w
        j = bisect_right(times, t + _EPS)
        j_time = times[j] if j < n else _INF
      if a < avail:
        avail = a
      if j_time < nxt:
        nxt = j_time
    if avail <= _EPS:
      if nxt == _INF:
        raise AssertionError("a channel is over-subscribed forever")
      t = nxt
      continue
    if first is None:
      first = t
    end = t + remaining / avail
    if end <= nxt + _EPS:
      for c, w in channels:
        c.add(t, end, avail * w)
      break
    for c, w in channels:
      c.add(t, nxt, avail * w)
    remaining -= avail * (nxt - t)
    t = nxt
  return first, end
