"""ICI topology: hop counts on wrapped and unwrapped axes, exact link-model times, link sharing."""
import functools

import numpy as np
import pytest

import palace as pl
from palace import lax
from palace import tpu as pltpu
from palace._src import hw
from palace._src.sim.ici import Topology

ROWS = 64   # (64, 128) f32 = 32 KiB per copy


def _one_copy_time(chip, num_chips, topology, src, dst, rows=ROWS):
  """Cycles from first byte to landing of one remote copy src -> dst (mesh = torus positions)."""
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((rows, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      me = lax.axis_index("x")

      @pl.when(me == src)
      def _():
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": dst})
        c.start()
        c.wait_send()

      @pl.when(me == dst)
      def _():
        pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": src}).wait_recv()
    return k(xs)

  x = np.arange(num_chips * rows * 128, dtype=np.float32).reshape(num_chips * rows, 128)
  with pl.virtual_tpu(chip, num_chips=num_chips, topology=topology) as tpu:
    mesh = pl.make_mesh((num_chips,), ("x",), devices=list(range(num_chips)))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(out[dst * rows:(dst + 1) * rows], x[src * rows:(src + 1) * rows])
  (ev,) = [e for e in tpu.reports[-1].events if e[1] == "ici"]
  return ev[4] - ev[3]


def _expected(chip_name, hops, rows=ROWS):
  chip = hw.get_chip(chip_name)
  return rows * 128 * 4 / (chip.ici_link_bytes_per_s_one_way / chip.clock_hz) + \
      hops * chip.ici_hop_latency_ns * 1e-9 * chip.clock_hz


def test_two_hops_on_an_unwrapped_axis_cost_two_hop_latencies():
  assert _one_copy_time("v5e", 4, (4,), 0, 2) == pytest.approx(_expected("v5e", 2), abs=1e-6)
  assert _one_copy_time("v5e", 4, (4,), 3, 0) == pytest.approx(_expected("v5e", 3), abs=1e-6)
  one = _one_copy_time("v5e", 4, (4,), 1, 2)
  assert _one_copy_time("v5e", 4, (4,), 0, 2) - one == pytest.approx(1500, abs=1e-6)  # 1 us at 1.5 GHz


@pytest.mark.parametrize("src,dst,hops", [(0, 15, 1), (15, 0, 1), (0, 8, 8), (2, 13, 5), (0, 1, 1)])
def test_v5e_16_chip_axis_wraps_around_and_takes_the_short_way(src, dst, hops):
  assert _one_copy_time("v5e", 16, (16,), src, dst) == pytest.approx(_expected("v5e", hops), abs=1e-6)


def test_v5e_8_chip_axis_has_no_wraparound():
  assert _one_copy_time("v5e", 8, (8,), 0, 7) == pytest.approx(_expected("v5e", 7), abs=1e-6)


@pytest.mark.parametrize("chip,shape,wrap", [
    ("v5e", (16, 16), (True, True)), ("v5e", (8, 16), (False, True)), ("v6e", (4, 4), (False, False)),
    ("v5p", (4, 4, 4), (True, True, True)), ("v5p", (2, 2, 4), (False, False, False)),
    ("v4", (4, 4, 8), (True, True, True)), ("7x", (4, 4, 2), (False, False, False))])
def test_wraparound_only_where_real_slices_have_it(chip, shape, wrap):
  assert Topology(hw.get_chip(chip), int(np.prod(shape)), shape).wrap == wrap


def test_dimension_order_routing_on_a_2d_torus():
  t = Topology(hw.get_chip("v5e"), 16, (4, 4))
  # (0, 0) -> (2, 3): axis 0 first (2 hops down), then axis 1 (3 hops right; no wraparound on 4)
  path = t.route(t.index((0, 0)), t.index((2, 3)))
  assert [t.coords(b) for _, b in path] == [(1, 0), (2, 0), (2, 1), (2, 2), (2, 3)]


def test_copies_sharing_a_link_share_its_bandwidth():
  """Chips 0 and 1 both send to chip 2 on a line: both cross link 1->2, so the second copy's bytes
  go through after the first's (bandwidth calendars are greedy in issue order)."""
  rows = 256
  nbytes = rows * 128 * 4

  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((2, rows, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      me = lax.axis_index("x")

      @pl.when(me < 2)
      def _():
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm.at[me], s, r, device_id={"x": 2})
        c.start()
        c.wait_send()

      @pl.when(me == 2)
      def _():
        pl.semaphore_wait(r, 2 * nbytes)
    return k(xs)

  x = np.ones((3 * rows, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=3, topology=(3,)) as tpu:
    mesh = pl.make_mesh((3,), ("x",))
    pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  (a,), (b,) = ([e[3:5] for e in tpu.reports[-1].events if e[1] == "ici" and e[0][0] == c] for c in (0, 1))
  chip = tpu.chip
  per = nbytes / (chip.ici_link_bytes_per_s_one_way / chip.clock_hz)
  hop = chip.ns_to_cycles(chip.ici_hop_latency_ns)
  # chip 0's copy (2 hops) holds link 1->2 at full rate; chip 1's (1 hop) gets its bytes through after
  assert a == pytest.approx((a[0], a[0] + per + 2 * hop), abs=1e-6)
  assert b == pytest.approx((a[0] + per, a[0] + 2 * per + hop), abs=1e-6)


def test_remote_copy_from_a_sparsecore_vector_subcore():
  """Each vector subcore of SparseCore 0 sends its row to the same subcore of the other chip,
  naming only the chip axis in device_id (the subcore axes stay mine)."""
  from palace import tpu_sc as plsc
  import palace.numpy as jnp
  n, subcores, lanes = 2, 4, 8

  def per_chip(xs):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=subcores)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((subcores, lanes), jnp.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32),
                                      pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def k(x_hbm, o_hbm, mine, got, send_sem, recv_sem):
      s = lax.axis_index("s")
      pltpu.sync_copy(x_hbm.at[s], mine)
      c = pltpu.make_async_remote_copy(mine, got, send_sem, recv_sem,
                                       device_id={"x": lax.rem(lax.axis_index("x") + 1, n)})
      c.start()
      c.wait()
      pltpu.sync_copy(got, o_hbm.at[s])
    return k(xs)

  x = np.arange(n * subcores * lanes, dtype=np.int32).reshape(n * subcores, lanes)
  with pl.virtual_tpu("v5p", num_chips=n) as tpu:
    out = pl.shard_map(per_chip, mesh=pl.make_mesh((n,), ("x",)), in_specs=pl.P("x"),
                       out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(out, np.concatenate([x[subcores:], x[:subcores]]))
  ici = [e for e in tpu.reports[-1].events if e[1] == "dma" and e[2] == "ici"]
  assert len(ici) == n * subcores and all(e[0][1] >= 64 for e in ici)   # issued by SC subcores


def test_two_d_mesh_routes_dimension_order_with_exact_hop_latencies():
  """A (4, 4) mesh on a v5e 4x4 slice (no wraparound): (0, 0) -> (2, 3) is 2 + 3 hops."""
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((ROWS, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      me = (lax.axis_index("x"), lax.axis_index("y"))

      @pl.when((me[0] == 0) & (me[1] == 0))
      def _():
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": 2, "y": 3})
        c.start()
        c.wait_send()

      @pl.when((me[0] == 2) & (me[1] == 3))
      def _():
        pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id=(0, 0)).wait_recv()
    return k(xs)

  x = np.arange(16 * ROWS * 128, dtype=np.float32).reshape(4 * ROWS, 4 * 128)
  with pl.virtual_tpu("v5e", num_chips=16, topology=(4, 4)) as tpu:
    mesh = pl.make_mesh((4, 4), ("x", "y"))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x", "y"), out_specs=pl.P("x", "y"))(x)
  np.testing.assert_array_equal(out[2 * ROWS:3 * ROWS, 3 * 128:], x[:ROWS, :128])
  (ev,) = [e for e in tpu.reports[-1].events if e[1] == "ici"]
  assert ev[4] - ev[3] == pytest.approx(_expected("v5e", 5), abs=1e-6)


def test_ici_events_are_charged_to_the_issuing_core():
  """The ICI trace row of a remote copy is the issuing core's (SparseCore subcores are >= 64), not
  core 0's; the transfer times themselves do not depend on the row."""
  from palace import tpu_sc as plsc
  import palace.numpy as jnp
  n, subcores, lanes = 2, 2, 8

  def per_chip(xs):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=subcores)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((subcores, lanes), jnp.int32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes,), jnp.int32),
                                      pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def k(x_hbm, o_hbm, mine, got, send_sem, recv_sem):
      s = lax.axis_index("s")
      pltpu.sync_copy(x_hbm.at[s], mine)
      c = pltpu.make_async_remote_copy(mine, got, send_sem, recv_sem,
                                       device_id={"x": lax.rem(lax.axis_index("x") + 1, n)})
      c.start()
      c.wait()
      pltpu.sync_copy(got, o_hbm.at[s])
    return k(xs)

  x = np.arange(n * subcores * lanes, dtype=np.int32).reshape(n * subcores, lanes)
  with pl.virtual_tpu("v5p", num_chips=n) as tpu:
    pl.shard_map(per_chip, mesh=pl.make_mesh((n,), ("x",)), in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  events = tpu.reports[-1].events
  ici = sorted(e[0] for e in events if e[1] == "ici")
  dma = sorted(e[0] for e in events if e[1] == "dma" and e[2] == "ici")
  assert len(ici) == n * subcores and ici == dma and all(core >= 64 for _, core in ici)


def test_prune_forgets_ici_link_history_behind_every_core():
  """Machine.prune_channels also prunes the ICI link calendars (they grew for the whole run), keeping
  the segment that holds the slowest core's clock, so later reservations see the same usage."""
  from palace._src.sim.machine import VirtualTPU
  m = VirtualTPU("v5e", num_chips=2).new_machine("k", num_chips=2)

  class _Core:
    now = 0
  core = _Core()
  m.cores.append(core)
  for i in range(5):
    m.topology.transfer(0, 1, i * 10_000, 4096)
  link = m.topology.link(0, 1)
  before = list(zip(link.times, link.used))
  core.now = 30_000.0
  m.prune_channels()
  kept = list(zip(link.times, link.used))
  assert len(kept) < len(before) and kept == before[-len(kept):]
  assert link.times[0] <= core.now < link.times[1]
