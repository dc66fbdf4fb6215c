"""Collectives over a virtual pod (examples/collectives.py) vs NumPy, barrier handshakes, ring layout."""
import functools
import pathlib
import runpy

import numpy as np
import pytest

import palace as pl
from palace import lax
from palace import tpu as pltpu

EX = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "examples" / "collectives.py"))


def _mesh(n):
  return pl.make_mesh((n,), ("x",))


# ---------------------------------------------------------------------- barrier handshake
def _handshake_kernel(n, skip_signal_from=None, delay_chip=None):
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       compiler_params=pltpu.CompilerParams(collective_id=7))
    def handshake(x_hbm, o_hbm):
      me = lax.axis_index("x")
      if delay_chip is not None:
        @pl.when(me == delay_chip)
        def _():
          pltpu.sync_copy(x_hbm, o_hbm)   # some work before the handshake
      barrier = pltpu.get_barrier_semaphore()

      @pl.when(me != (-1 if skip_signal_from is None else skip_signal_from))
      def _():
        pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + 1, n)})
        pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + n - 1, n)})
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, o_hbm)
    return handshake(xs)
  return per_chip


def test_barrier_handshake_waits_for_both_neighbours_one_hop_away():
  n = 4
  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=n, trace=True) as tpu:
    out = pl.shard_map(_handshake_kernel(n), mesh=_mesh(n), in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  np.testing.assert_array_equal(out, x)
  hop = tpu.chip.ns_to_cycles(tpu.chip.ici_hop_latency_ns)
  waits = [e for e in tpu.reports[-1].events if e[2] == "wait barrier_semaphore[0]"]
  assert len(waits) == n
  for tid, _, _, start, end, _ in waits:
    # both signals were issued a few scalar cycles into the kernel and cross one link (ring layout)
    assert hop - 10 <= end - start <= hop + 1e-6


def test_barrier_handshake_orders_chips_after_a_late_neighbour():
  n = 2
  x = np.ones((n * 8, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=n, trace=True) as tpu:
    pl.shard_map(_handshake_kernel(n, delay_chip=1), mesh=_mesh(n), in_specs=pl.P("x"),
                 out_specs=pl.P("x"))(x)
  ev = tpu.reports[-1].events
  late_copy_end = min(e[4] for e in ev if e[0][0] == 1 and e[1] == "dma")
  (wait0,) = [e for e in ev if e[0][0] == 0 and e[2] == "wait barrier_semaphore[0]"]
  assert wait0[4] >= late_copy_end + tpu.chip.ns_to_cycles(tpu.chip.ici_hop_latency_ns) - 1


def test_missing_barrier_signal_is_a_deadlock_naming_every_chip():
  n = 2
  x = np.ones((n * 8, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=n), pytest.raises(pl.SyncError, match=r"(?s)Deadlock.*chip 0 .*"
                                                         r"semaphore barrier_semaphore.*needs 2, has 0"):
    pl.shard_map(_handshake_kernel(n, skip_signal_from=1), mesh=_mesh(n), in_specs=pl.P("x"),
                 out_specs=pl.P("x"))(x)


# ---------------------------------------------------------------------- collectives vs NumPy
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", ["ring_all_gather", "bidirectional_all_gather"])
def test_all_gather_matches_numpy(name, n):
  x = np.random.default_rng(n).standard_normal((n * 16, 128)).astype(np.float32)
  with pl.virtual_tpu("v5e", num_chips=n) as tpu:
    out = EX[name](x, _mesh(n))
  np.testing.assert_array_equal(out, np.concatenate([x] * n))
  assert tpu.reports[-1].ici_bytes == n * (n - 1) * x.nbytes // n


@pytest.mark.parametrize("n", [2, 4, 8])
def test_reduce_scatter_and_all_reduce_match_numpy(n):
  xs = np.random.default_rng(n).integers(-50, 50, size=(n, n * 8, 128)).astype(np.float32)
  with pl.virtual_tpu("v6e", num_chips=n, dma_policy="random", seed=n):
    rs = EX["reduce_scatter"](xs, _mesh(n))
    ar = EX["all_reduce"](xs, _mesh(n))
  np.testing.assert_array_equal(rs, xs.sum(0))
  np.testing.assert_array_equal(ar, np.broadcast_to(xs.sum(0), xs.shape))


def test_collective_times_approach_the_ici_roofline_when_bandwidth_bound():
  rows = EX["run_all"](chip="v5e", chip_counts=(4, 8), rows=512, cols=256, verbose=False)
  by = {(name, n): (t, roof) for name, n, t, roof in rows}
  for (name, n), (t, roof) in by.items():
    # within 20%: the local HBM copies of a step run at v5e's measured (not datasheet) HBM rates
    assert roof <= t <= 1.2 * roof, (name, n, t, roof)
  for n in (4, 8):
    ring, bidi = by[("ring all-gather", n)][0], by[("bidirectional all-gather", n)][0]
    assert bidi < 0.75 * ring                        # both directions of every link carry data
    ar, rs = by[("all-reduce", n)][0], by[("reduce-scatter", n)][0]
    assert ar == pytest.approx(rs + ring, rel=0.05)  # all-reduce = reduce-scatter + all-gather


def test_examples_collectives_quick():
  rows = EX["main"](quick=True)
  assert len(rows) == 8 and all(t >= roof for _, _, t, roof in rows)


# ---------------------------------------------------------------------- ring layout of 1-D meshes
@pytest.mark.parametrize("chip,n", [("v6e", 8), ("v5p", 8), ("v5e", 4), ("v5p", 64), ("v5e", 32)])
def test_one_d_mesh_is_laid_out_as_a_ring_of_neighbours(chip, n):
  from palace._src.sim.ici import Topology
  with pl.virtual_tpu(chip, num_chips=n) as tpu:
    mesh = _mesh(n)
  ids = [int(d) for d in mesh.devices]
  assert sorted(ids) == list(range(n)) and ids[0] == 0
  topo = Topology(tpu.chip, n)
  assert all(len(topo.route(ids[i], ids[(i + 1) % n])) == 1 for i in range(n))


def test_make_mesh_devices_sets_the_placement():
  with pl.virtual_tpu("v5e", num_chips=4, topology=(4,)):
    mesh = pl.make_mesh((4,), ("x",), devices=[0, 2, 1, 3])
    assert [int(d) for d in mesh.devices] == [0, 2, 1, 3]
    with pytest.raises(pl.UsageError, match="must list each of the 4 chips once"):
      pl.make_mesh((4,), ("x",), devices=[0, 0, 1, 3])


def test_replicated_inputs_are_private_per_chip():
  """A kernel that overwrites its (replicated) input on chip 0 does not change chip 1's copy."""
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1))
    def k(x_hbm, o_hbm):
      @pl.when(lax.axis_index("x") == 0)
      def _():
        pltpu.sync_copy(o_hbm, x_hbm)   # uninitialised (NaN) output over the input
      pltpu.sync_copy(x_hbm, o_hbm)
    return k(xs)

  x = np.ones((8, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=2):
    out = pl.shard_map(per_chip, mesh=_mesh(2), in_specs=pl.P(), out_specs=pl.P("x"))(x.copy())
  assert np.isnan(out[:8]).all()
  np.testing.assert_array_equal(out[8:], x)


def test_a_failing_kernel_raises_once_from_shard_map():
  """Every chip's thread stops; the caller sees the original error once (not one frame chain per chip)."""
  n = 8
  x = np.ones((n * 8, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=n), pytest.raises(pl.SyncError, match="Deadlock") as info:
    pl.shard_map(_handshake_kernel(n, skip_signal_from=3), mesh=_mesh(n), in_specs=pl.P("x"),
                 out_specs=pl.P("x"))(x)
  frames = [f.name for f in __import__("traceback").extract_tb(info.value.__traceback__)]
  assert frames.count("collective_launch") == 1
