"""Inter-chip interconnect (ICI) of a virtual pod (L4b).

Chips sit on the generation's torus (2-D on v5e/v6e, 3-D on v4/v5p/7x; tpu-hardware.md 1.1). An axis
has a wraparound link only where real slices have one: on v5e/v6e only on an axis of 16 chips; on
v4/v5p/7x only when every axis is a multiple of 4 (full cubes) [SB-tpus]. Routing is dimension-order
(axis 0 first), taking the shorter way round on wrapped axes. Every directed link is a bandwidth
calendar at the one-way link bandwidth; a transfer crosses all links of its route at once (cut-through)
and lands `hops x ici_hop_latency_ns` after its last byte leaves.
"""
from __future__ import annotations

import itertools

from palace._src.errors import UsageError
from palace._src.sim.bandwidth import Channel, reserve


def default_shape(num_chips: int, dims: int) -> tuple:
  """The most cube-like factorisation of num_chips into `dims` axes (largest first)."""
  best = None
  for shape in itertools.product(*[range(1, num_chips + 1)] * dims):
    p = 1
    for s in shape:
      p *= s
    if p != num_chips or list(shape) != sorted(shape, reverse=True):
      continue
    score = max(shape) - min(shape)
    if best is None or score < best[0]:
      best = (score, shape)
  return best[1]


class Topology:
  def __init__(self, chip, num_chips: int, shape=None):
    dims = chip.ici_dims
    if shape is None:
      shape = default_shape(num_chips, dims) if num_chips > 1 else (1,) * dims
    shape = tuple(int(s) for s in shape)
    p = 1
    for s in shape:
      p *= s
    if p != num_chips:
      raise UsageError(f"topology {shape} has {p} chips but num_chips={num_chips}.")
    if len(shape) > dims:
      raise UsageError(f"{chip.name} has a {dims}-D torus; topology {shape} has {len(shape)} axes.")
    self.shape = shape + (1,) * (dims - len(shape))
    if dims == 3:
      cube = all(s % chip.ici_wraparound_min_axis == 0 for s in self.shape)
      self.wrap = tuple(cube and s > 2 for s in self.shape)
    else:
      self.wrap = tuple(s >= chip.ici_wraparound_min_axis for s in self.shape)
    self.link_bytes_per_s = chip.ici_link_bytes_per_s_one_way
    self.hop_latency_ns = chip.ici_hop_latency_ns
    self.clock_hz = chip.clock_hz
    self.links = {}

  def coords(self, chip: int) -> tuple:
    out = []
    for s in reversed(self.shape):
      out.append(chip % s)
      chip //= s
    return tuple(reversed(out))

  def index(self, coords) -> int:
    i = 0
    for c, s in zip(coords, self.shape):
      i = i * s + c
    return i

  def route(self, src: int, dst: int) -> list:
    """Directed links (a, b) from src to dst, dimension-order."""
    cur = list(self.coords(src))
    goal = self.coords(dst)
    path = []
    for ax, size in enumerate(self.shape):
      d = (goal[ax] - cur[ax]) % size
      if d == 0:
        continue
      if self.wrap[ax]:
        step = 1 if d <= size - d else -1
        n = d if step == 1 else size - d
      else:
        step = 1 if goal[ax] > cur[ax] else -1
        n = abs(goal[ax] - cur[ax])
      for _ in range(n):
        a = self.index(cur)
        cur[ax] = (cur[ax] + step) % size
        path.append((a, self.index(cur)))
    return path

  def link(self, a: int, b: int) -> Channel:
    ch = self.links.get((a, b))
    if ch is None:
      ch = self.links[(a, b)] = Channel(f"ici {a}->{b}", self.link_bytes_per_s, self.clock_hz)
    return ch

  def hop_latency_cycles(self) -> float:
    return self.hop_latency_ns * 1e-9 * self.clock_hz

  def transfer(self, src: int, dst: int, start: float, nbytes: int):
    """(first byte, last byte, landing) cycles of a copy from chip src to chip dst."""
    path = self.route(src, dst)
    if not path:
      return start, start, start
    s, e = reserve([(self.link(a, b), 1.0) for a, b in path], start, nbytes)
    return s, e, e + len(path) * self.hop_latency_cycles()

  def signal_cycle(self, src: int, dst: int, now: float) -> float:
    return now + len(self.route(src, dst)) * self.hop_latency_cycles()
