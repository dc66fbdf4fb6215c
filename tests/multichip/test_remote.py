"""Multi-chip: shard_map over a virtual pod, remote DMA, barrier semaphores, ring all-gather."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu


def ring_all_gather(x, mesh, axis="x"):
  """Each chip holds one (8, 128) shard; after N-1 ring steps every chip has all N shards."""
  n = mesh.shape[axis]
  shard_rows = x.shape[0] // n

  def per_chip(xs):
    @functools.partial(
        pl.kernel, out_type=pl.ShapeDtypeStruct((n * shard_rows, x.shape[1]), x.dtype),
        mesh=pltpu.TensorCoreMesh("core", 1),
        scratch_types=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0))
    def kernel(x_hbm, o_hbm, send_sem, recv_sem):
      me = lax.axis_index(axis)
      right = lax.rem(me + 1, n)
      left = lax.rem(me + n - 1, n)
      barrier = pltpu.get_barrier_semaphore()
      pl.semaphore_signal(barrier, 1, device_id={axis: left})
      pl.semaphore_signal(barrier, 1, device_id={axis: right})
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, o_hbm.at[pl.ds(me * shard_rows, shard_rows)])
      for step in range(n - 1):
        slot = lax.rem(me + n - step, n)
        copy = pltpu.make_async_remote_copy(
            o_hbm.at[pl.ds(slot * shard_rows, shard_rows)], o_hbm.at[pl.ds(slot * shard_rows, shard_rows)],
            send_sem, recv_sem, device_id={axis: right})
        copy.start()
        copy.wait()
        # after receiving, chips agree that the step is over before the next sends
        pl.semaphore_signal(barrier, 1, device_id={axis: left})
        pl.semaphore_wait(barrier, 1)

    return kernel(xs)

  return pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(axis), out_specs=pl.P(axis))(x)


@pytest.mark.parametrize("n,policy", [(2, "eager"), (4, "eager"), (8, "eager"), (4, "on_wait"),
                                      (4, "random")])
def test_ring_all_gather(n, policy):
  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=n, dma_policy=policy, seed=3) as tpu:
    mesh = pl.make_mesh((n,), ("x",))
    out = ring_all_gather(x, mesh)
  np.testing.assert_array_equal(out, np.tile(x, (n, 1)))
  r = tpu.reports[-1]
  assert r.num_chips == n and r.ici_bytes == n * (n - 1) * 8 * 128 * 4


def test_dict_and_tuple_device_ids_reach_the_same_chip():
  n = 4

  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((2, 8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.SemaphoreType.DMA] * 4)
    def k(x_hbm, o_hbm, s1, r1, s2, r2):
      me = lax.axis_index("y")
      nxt = lax.rem(me + 1, n)
      c1 = pltpu.make_async_remote_copy(x_hbm, o_hbm.at[0], s1, r1, device_id={"y": nxt})
      c2 = pltpu.make_async_remote_copy(x_hbm, o_hbm.at[1], s2, r2, device_id=(0, nxt))
      c1.start()
      c2.start()
      c1.wait()
      c2.wait()
    return k(xs)

  x = np.arange(n * 8 * 128, dtype=np.float32).reshape(n * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=n):
    mesh = pl.make_mesh((1, n), ("x", "y"))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("y"), out_specs=pl.P("y"))(x)
  out = out.reshape(n, 2, 8, 128)
  shards = x.reshape(n, 8, 128)
  for c in range(n):
    np.testing.assert_array_equal(out[c, 0], shards[(c - 1) % n])
    np.testing.assert_array_equal(out[c, 1], shards[(c - 1) % n])


def test_joint_axis_int_and_tuple_device_ids_reach_the_same_chip():
  """On a 2x2 mesh: {('x', 'y'): k} (a row-major index over both axes, wrapping as in JAX's TPU
  lowering), the int (logical) id k % 4 and the coordinates (k // 2 % 2, k % 2) name one chip."""
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((3, 8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.SemaphoreType.DMA] * 6)
    def k(x_hbm, o_hbm, *sems):
      me = lax.axis_index("x") * 2 + lax.axis_index("y")
      nxt = me + 5                        # the next chip, +4 to check the joint key wraps
      ids = ({("x", "y"): nxt}, lax.rem(nxt, 4), (lax.rem(lax.div(nxt, 2), 2), lax.rem(nxt, 2)))
      copies = [pltpu.make_async_remote_copy(x_hbm, o_hbm.at[i], sems[2 * i], sems[2 * i + 1],
                                             device_id=d) for i, d in enumerate(ids)]
      for c in copies:
        c.start()
      for c in copies:
        c.wait()
    return k(xs)

  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=4):
    mesh = pl.make_mesh((2, 2), ("x", "y"))
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(("x", "y")), out_specs=pl.P(("x", "y")))(x)
  out, shards = out.reshape(4, 3, 8, 128), x.reshape(4, 8, 128)
  for c in range(4):
    for i in range(3):
      np.testing.assert_array_equal(out[c, i], shards[(c - 1) % 4])


def test_remote_copy_outside_the_mesh_is_an_error():
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": 5}).start()
    return k(xs)

  x = np.zeros((16, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=2), pytest.raises(pl.UsageError, match=r"x=5 is outside"):
    mesh = pl.make_mesh((2,), ("x",))
    pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)


def test_transfer_time_matches_the_link_model_exactly():
  """One 64 KiB copy to the neighbour: bytes / link bandwidth + one hop of latency."""
  nbytes = 128 * 128 * 4

  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((128, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      @pl.when(lax.axis_index("x") == 0)
      def _():
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": 1})
        c.start()
        c.wait_send()

      @pl.when(lax.axis_index("x") == 1)
      def _():
        pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id={"x": 0}).wait_recv()
    return k(xs)

  x = np.ones((256, 128), np.float32)
  with pl.virtual_tpu("v5e", num_chips=2, trace=True) as tpu:
    mesh = pl.make_mesh((2,), ("x",))
    pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
  chip = tpu.chip
  (ev,) = [e for e in tpu.reports[-1].events if e[1] == "ici"]
  _, _, _, start, end, args = ev
  cycles = nbytes / (chip.ici_link_bytes_per_s_one_way / chip.clock_hz) + \
      chip.ici_hop_latency_ns * 1e-9 * chip.clock_hz
  assert end - start == pytest.approx(cycles, abs=1e-6)


def test_bandwidth_bound_transfers_scale_with_bytes():
  times = []
  for rows in (256, 512, 1024):
    def per_chip(xs, rows=rows):
      @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((rows, 128), np.float32),
                         mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
      def k(x_hbm, o_hbm, s, r):
        c = pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r,
                                         device_id={"x": lax.rem(lax.axis_index("x") + 1, 2)})
        c.start()
        c.wait()
      return k(xs)
    x = np.ones((2 * rows, 128), np.float32)
    with pl.virtual_tpu("v5e", num_chips=2) as tpu:
      mesh = pl.make_mesh((2,), ("x",))
      pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
    times.append(tpu.reports[-1].device_time_s)
  # time = fixed latency + bytes / link bandwidth: the increments double exactly with the bytes
  assert times[2] - times[1] == pytest.approx(2 * (times[1] - times[0]), rel=1e-6)
  assert times[2] / times[0] > 3


def _typed_id_kernel(device_id, device_id_type):
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                       mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.SemaphoreType.DMA] * 2)
    def k(x_hbm, o_hbm, s, r):
      me = lax.axis_index("x") * 2 + lax.axis_index("y")
      c = pltpu.make_async_remote_copy(x_hbm, o_hbm, s, r, device_id=device_id(me),
                                       device_id_type=device_id_type)
      c.start()
      c.wait()
    return k(xs)
  return per_chip


def _on_2x2(per_chip):
  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
  with pl.virtual_tpu("v5e", num_chips=4):
    mesh = pl.make_mesh((2, 2), ("x", "y"))
    return x, pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(("x", "y")),
                           out_specs=pl.P(("x", "y")))(x)


@pytest.mark.parametrize("device_id,device_id_type", [
    (lambda me: lax.rem(me + 1, 4), pl.DeviceIdType.LOGICAL),
    (lambda me: lax.rem(me + 1, 4), None),   # palace's own default: an int is a logical id
    (lambda me: (lax.div(lax.rem(me + 1, 4), 2), lax.rem(me + 1, 4) % 2), pl.DeviceIdType.MESH),
], ids=["logical", "untyped-int", "mesh-tuple"])
def test_typed_device_ids(device_id, device_id_type):
  x, out = _on_2x2(_typed_id_kernel(device_id, device_id_type))
  np.testing.assert_array_equal(out, np.roll(x.reshape(4, 8, 128), 1, axis=0).reshape(32, 128))


def test_a_mesh_typed_scalar_device_id_on_a_2d_mesh_is_an_error_as_in_jax():
  """JAX's TPU lowering: 'Number of device ids must match the number of mesh axes'."""
  with pytest.raises(pl.UsageError, match=r"device_id \(\d,\) has 1 coordinates; the mesh axes are "
                                          r"\['x', 'y'\]"):
    _on_2x2(_typed_id_kernel(lambda me: lax.rem(me + 1, 4), pl.DeviceIdType.MESH))


def test_a_logical_device_id_is_an_int():
  with pytest.raises(pl.UsageError, match=r"pltpu.make_async_remote_copy: a DeviceIdType.LOGICAL "
                                          r"device_id is an int, the chip's row-major position in the "
                                          r"mesh; got a tuple \(test_remote.py:\d+"):
    _on_2x2(_typed_id_kernel(lambda me: (0, 1), pl.DeviceIdType.LOGICAL))
