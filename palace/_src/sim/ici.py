"""Inter-chip interconnect (ICI) of a virtual pod (L4b).

Chips sit on the generation's torus (2-D on v5e/v6e, 3-D on v4/v5p/7x; tpu-hardware.md 1.1). An axis
has a wraparound link only where real slices have one: on v5e/v6e only on an axis of 16 chips; on
v4/v5p/7x only when every axis is a multiple of 4 (full cubes) [SB-tpus]. Routing is dimension-order
(axis 0 first), taking the shorter way round on wrapped axes. Every directed link is a bandwidth
calendar at the one-way link bandwidth; a transfer crosses all links of its route at once (cut-through)
and lands `hops x ici_hop_latency_ns` after its last byte leaves. Transfers are not charged to the
chips' DMA engines or HBM (ICI links are 10-20x slower than HBM; modelling simplification).

Chips are addressed by logical id (mesh position); `placement[i]` is the torus position of logical
chip i (identity unless the launcher sets it, e.g. a 1-D mesh laid out along `ring_order()`).
"""
from __future__ import annotations

import itertools

from palace._src.errors import UsageError
from palace._src.validate import as_dims
from palace._src.sim.bandwidth import Channel, reserve


def default_shape(num_chips: int, dims: int) -> tuple:
  """The most cube-like factorisation of num_chips into `dims` axes (largest first). Walks divisors
  only, so it is quick for any pod size."""
  def shapes(n, k, cap):   # non-increasing k-tuples of divisors with product n, entries <= cap
    if k == 1:
      if n <= cap:
        yield (n,)
      return
    for d in range(min(n, cap), 0, -1):
      if n % d == 0 and d ** k >= n:
        for rest in shapes(n // d, k - 1, d):
          yield (d,) + rest

  return min(shapes(num_chips, dims, num_chips), key=lambda s: (max(s) - min(s), s))


def check_topology(chip, num_chips: int, shape) -> tuple:
  """A user topology: a non-empty tuple of positive ints, at most the chip's torus rank, whose product
  is num_chips."""
  hint = (f"pass a tuple of positive chip counts per torus axis whose product is num_chips, e.g. "
          f"topology={default_shape(num_chips, chip.ici_dims) if num_chips > 1 else (1,) * chip.ici_dims}.")
  shape = as_dims(shape, "pl.virtual_tpu(topology)", hint=hint)
  if not shape:
    raise UsageError(f"pl.virtual_tpu(topology) is empty. Fix: {hint}")
  for i, s in enumerate(shape):
    if s < 1:
      raise UsageError(f"pl.virtual_tpu(topology)[{i}] is {s}; every torus axis has at least one chip. "
                       f"Fix: {hint}")
  if len(shape) > chip.ici_dims:
    raise UsageError(f"pl.virtual_tpu(topology) {shape} has {len(shape)} axes but {chip.name} has a "
                     f"{chip.ici_dims}-D torus. Fix: {hint}")
  p = 1
  for s in shape:
    p *= s
  if p != num_chips:
    raise UsageError(f"pl.virtual_tpu(topology) {shape} has {p} chips but num_chips={num_chips}. "
                     f"Fix: {hint}")
  return shape


class Topology:
  def __init__(self, chip, num_chips: int, shape=None):
    dims = chip.ici_dims
    if shape is None:
      shape = default_shape(num_chips, dims) if num_chips > 1 else (1,) * dims
    shape = check_topology(chip, num_chips, shape)
    self.shape = shape + (1,) * (dims - len(shape))
    if dims == 3:
      cube = all(s % chip.ici_wraparound_min_axis == 0 for s in self.shape)
      self.wrap = tuple(cube and s > 2 for s in self.shape)
    else:
      self.wrap = tuple(s >= chip.ici_wraparound_min_axis for s in self.shape)
    self.link_bytes_per_s = chip.ici_link_bytes_per_s_one_way
    self.hop_latency_ns = chip.ici_hop_latency_ns
    self.clock_hz = chip.clock_hz
    self.num_chips = num_chips
    self.links = {}
    self.placement = None
    self._routes = {}

  def place(self, placement) -> None:
    """Logical chip i sits at torus position placement[i] (a launch over some of the chips, e.g. a
    JAX mesh over jax.devices()[:2] of 4, lists fewer positions than the torus has)."""
    placement = tuple(int(p) for p in placement)
    if len(set(placement)) != len(placement) or not all(0 <= p < self.num_chips for p in placement):
      raise UsageError(f"device placement {placement} does not list distinct chips of the "
                       f"{self.num_chips}. Fix: list chip indices in 0..{self.num_chips - 1}, each at most "
                       f"once.")
    self.placement = None if placement == tuple(range(len(placement))) else placement
    self._routes = {}

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

  def ring_order(self) -> list:
    """Torus positions in an order where consecutive chips (and the last and the first) are
    neighbours, when the torus allows it (a Hamiltonian cycle; JAX's device meshes order 1-D axes
    the same way). A single axis keeps its order (a ring only if it wraps); an odd x odd grid without
    wraparound has no such cycle and keeps row-major order."""
    axes = [ax for ax, s in enumerate(self.shape) if s > 1]
    if len(axes) <= 1:
      return list(range(self.num_chips))
    rows = self.shape[axes[0]]
    path = _snake([self.shape[ax] for ax in axes[1:]])
    cells = [[(r,) + p for p in path] for r in range(rows)]   # rows x len(path) grid of neighbours
    if rows % 2 and len(path) % 2:
      return list(range(self.num_chips))
    if rows % 2:  # make the row count even: walk the grid transposed
      cells = [list(col) for col in zip(*cells)]
    cycle = []
    for r, row in enumerate(cells):
      cycle += row[1:] if r % 2 == 0 else row[:0:-1]
    cycle += [row[0] for row in reversed(cells)]
    out = []
    for cell in cycle:
      coords = [0] * len(self.shape)
      for ax, c in zip(axes, cell):
        coords[ax] = c
      out.append(self.index(coords))
    i = out.index(0)
    return out[i:] + out[:i]

  def link(self, a: int, b: int) -> Channel:
    ch = self.links.get((a, b))
    if ch is None:
      ch = self.links[(a, b)] = Channel(f"ici {a}->{b}", self.link_bytes_per_s, self.clock_hz)
    return ch

  def hop_latency_cycles(self) -> float:
    return self.hop_latency_ns * 1e-9 * self.clock_hz

  def _links(self, src: int, dst: int) -> list:
    """[(link channel, 1.0)] on the route between logical chips src and dst (cached)."""
    key = (src, dst)
    links = self._routes.get(key)
    if links is None:
      p = self.placement
      path = self.route(src, dst) if p is None else self.route(p[src], p[dst])
      links = self._routes[key] = [(self.link(a, b), 1.0) for a, b in path]
    return links

  def hops(self, src: int, dst: int) -> int:
    return len(self._links(src, dst))

  def transfer(self, src: int, dst: int, start: float, nbytes: int):
    """(first byte, last byte, landing) cycles of a copy from logical chip src to dst."""
    links = self._links(src, dst)
    if not links:
      return start, start, start
    s, e = reserve(links, start, nbytes)
    return s, e, e + len(links) * self.hop_latency_cycles()

  def signal_cycle(self, src: int, dst: int, now: float) -> float:
    return now + len(self._links(src, dst)) * self.hop_latency_cycles()

  def prune(self, before: float) -> None:
    for ch in self.links.values():
      ch.prune(before)


def _snake(sizes) -> list:
  """Boustrophedon order of the cells of a grid: consecutive cells are neighbours."""
  if not sizes:
    return [()]
  sub = _snake(sizes[1:])
  out = []
  for i in range(sizes[0]):
    out += [(i,) + c for c in (sub if i % 2 == 0 else sub[::-1])]
  return out
