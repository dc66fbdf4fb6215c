"""Semaphores carried between launches under palace.jax (issue 37; sim/carried.py): JAX's async pattern,
where one pallas_call starts a DMA and returns its semaphore and a later one waits on it. Each checks
the data against NumPy and the modelled time against the same copy started and waited in one kernel.
(Before session 20 palace refused every semaphore result by name.)"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import palace as ppl
import palace.jax as pj
from async_kernels import ANY, DMA_SEM, SEM, _x, copy_between_kernels, copy_done, copy_start


def test_a_copy_started_in_one_launch_and_waited_in_the_next_moves_the_data_and_is_timed_as_one_kernel():
  def both(x_ref, o_ref, sem):
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()

  x = _x()
  split = jax.jit(lambda x: copy_done(*copy_start(x)))
  one = jax.jit(pl.pallas_call(both, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY],
                               out_specs=ANY, scratch_shapes=[pltpu.SemaphoreType.DMA]))
  with pj.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(np.asarray(split(x)), x)
    np.testing.assert_array_equal(np.asarray(one(x)), x)
  start, done, whole = (r.device_cycles for r in tpu.reports)
  assert start < 50 < whole            # the start's launch ends at the issue, the copy goes on
  assert start + done == whole         # the wait of the next launch takes the rest of the transfer


@pytest.mark.parametrize("policy", ["eager", "on_wait"])
def test_two_copies_in_flight_between_launches_land_whatever_the_dma_policy(policy):
  """Under on_wait a copy's data would move at its wait; a carried one moves when its launch ends (its
  destination is a result XLA reads then)."""
  @jax.jit
  def f(x):
    x1, fut1 = copy_start(x)
    x2, fut2 = copy_start(x1 * 2)
    return copy_done(x1, fut1), copy_done(x2, fut2)

  x = _x((16, 128))
  with pj.virtual_tpu("v5e", dma_policy=policy):
    y1, y2 = f(x)
    np.testing.assert_array_equal(np.asarray(y1), x)
    np.testing.assert_array_equal(np.asarray(y2), x * 2)


def test_a_copy_of_a_slice_picked_by_a_scalar_prefetch_index_in_one_launch_waited_in_another():
  def start(idx_ref, x_ref, _aliased, o_ref, sem):
    pltpu.make_async_copy(x_ref.at[idx_ref[0]], o_ref, sem).start()

  def done(x_ref, o_ref, sem, _aliased):
    pltpu.make_async_copy(x_ref.at[0], o_ref, sem).wait()

  @jax.jit
  def f(x, i):
    row = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
    x, out, sem = pl.pallas_call(
        start, out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), row, DMA_SEM),
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, in_specs=[ANY],
                                               out_specs=(ANY, ANY, SEM)),
        input_output_aliases={1: 0})(i[None], x)
    return pl.pallas_call(done, out_shape=row, in_specs=[ANY, ANY, SEM], out_specs=ANY,
                          input_output_aliases={1: 0})(x, out, sem)

  x = _x((4, 8, 128))
  with pj.virtual_tpu("v5e"):
    for i in (2, 3):
      np.testing.assert_array_equal(np.asarray(f(x, jnp.int32(i))), x[i])


def test_a_semaphore_result_never_waited_is_reported_when_the_context_ends():
  x = _x((8, 128))
  with pytest.raises(ppl.SyncError, match=r"1 semaphore\(s\) carried between launches ended non-zero: "
                     r"outputs\[2\] of kernel '_start' on chip 0 \(DMA outputs\[0\] -> outputs\[1\] "
                     r"started at "
                     r"async_kernels.py:\d+\) holds 4096 that no later launch waited for"):
    with pj.virtual_tpu("v5e"):
      out = jax.jit(lambda x: copy_start(x)[1][0])(x)   # (a jitted function cannot return a semaphore)
      np.testing.assert_array_equal(np.asarray(out), x)


def test_a_semaphore_result_of_a_kernel_split_over_two_tensorcores_is_refused():
  def k(o_ref, sem):
    pl.semaphore_signal(sem, 1)
    o_ref[...] = jnp.zeros_like(o_ref)

  call = pl.pallas_call(
      k, grid=(2,), out_shape=(jax.ShapeDtypeStruct((16, 128), jnp.float32), pltpu.SemaphoreType.REGULAR(())),
      out_specs=(pl.BlockSpec((8, 128), lambda i: (i, 0)), SEM),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))
  with pytest.raises(ppl.UnsupportedError, match=r"Kernel 'k' takes or returns a semaphore and runs on 2 "
                     r"cores of chip 0.*Fix: run it on one core"):
    with pj.virtual_tpu("v5p"):
      jax.block_until_ready(jax.jit(lambda: call()[0])())


def test_a_remote_copy_started_in_a_pod_launch_is_waited_in_each_device_own_launch():
  """JAX's collective-permute pattern on 4 devices: the start (a barrier, then a copy to the right
  neighbour) is one pod launch; each device then waits its send and its receive in launches of its own."""
  def start(x_ref, _aliased, o_ref, send, recv):
    n, me = lax.axis_size("x"), lax.axis_index("x")
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=lax.rem(me + n - 1, n))
    pl.semaphore_wait(barrier, 1)
    pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=lax.rem(me + 1, n)).start()

  def send_done(x_ref, send, _aliased):
    pltpu.make_async_copy(x_ref, x_ref, send).wait()

  def recv_done(x_ref, o_ref, recv, _aliased):
    pltpu.make_async_copy(x_ref, o_ref, recv).wait()

  mesh = jax.make_mesh((4,), ("x",))

  @jax.jit
  @jax.shard_map(mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
  def f(x):
    s = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, send, recv = pl.pallas_call(
        start, out_shape=(s, s, DMA_SEM, DMA_SEM), in_specs=[ANY], out_specs=(ANY, ANY, SEM, SEM),
        input_output_aliases={0: 0}, compiler_params=pltpu.CompilerParams(collective_id=0))(x)
    x = pl.pallas_call(send_done, out_shape=s, in_specs=[ANY, SEM], out_specs=ANY,
                       input_output_aliases={0: 0})(x, send)
    return pl.pallas_call(recv_done, out_shape=s, in_specs=[ANY, ANY, SEM], out_specs=ANY,
                          input_output_aliases={1: 0})(x, out, recv)

  x = _x((4 * 8, 128))
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    got = f(jax.device_put(x, jax.sharding.NamedSharding(mesh, P("x"))))
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 8, axis=0))
  assert sorted(r.kernel_name for r in tpu.reports) == ["recv_done"] * 4 + ["send_done"] * 4 + ["start"]


def test_device_time_of_a_split_copy_without_data_equals_its_timing_with_data():
  """device_time's timing-only run (no data) still hands the semaphore's handle to the waiting launch."""
  split = jax.jit(lambda x: copy_done(*copy_start(x)))
  x = _x()
  with pj.virtual_tpu("v5e"):
    timed = pj.device_time(split, x, timing_only=True)
    with_data = pj.device_time(split, x, timing_only=False)
  assert [r.device_cycles for r in timed.reports] == [r.device_cycles for r in with_data.reports]
  assert len(timed.reports) == 2 and timed.reports[1].device_cycles > 1000


def test_a_semaphore_ref_carries_a_copy_from_one_pl_kernel_to_the_next():
  """JAX's stateful form (tpu_pallas_memory_space_test's async copy): a semaphore made with
  pl.empty_ref_like, closed over by a kernel that starts a copy and by a later one that waits on it."""
  @jax.jit
  def f(x):
    x_ref = jax.new_ref(x)
    y_ref = pl.empty_ref_like(pltpu.HBM(x.shape, x.dtype))
    copy_between_kernels(x_ref, y_ref, pl.empty_ref_like(pltpu.SemaphoreType.DMA(())))
    return y_ref[...]

  x = _x()
  with pj.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(np.asarray(f(x)), x)
  start, done = (r.device_cycles for r in tpu.reports)
  assert start < 50 and done > 1000


def test_two_fresh_semaphore_refs_are_two_semaphores():
  """A semaphore ref JAX makes empty holds 0, as every other one does: each gets a handle of its own
  when a launch first takes it, so a wait on one is not satisfied by a copy signalling the other."""
  @jax.jit
  def f(x):
    x_ref = jax.new_ref(x)
    y_ref = pl.empty_ref_like(pltpu.HBM(x.shape, x.dtype))
    signalled = pl.empty_ref_like(pltpu.SemaphoreType.DMA(()))
    other = pl.empty_ref_like(pltpu.SemaphoreType.DMA(()))
    copy_between_kernels(x_ref, y_ref, signalled, wait_sem=other)
    return y_ref[...]

  with pytest.raises(ppl.SyncError,
                     match=r"(?s)Deadlock in kernel '_'.*for DMA args\[0\] -> .*needs 4096, has 0"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(f(_x((8, 128))))



def test_a_copy_waited_only_in_part_is_reported_with_the_launch_that_started_it():
  """A later launch that waits for less than the copy's bytes leaves the rest on the semaphore: the
  report at the context's end still names the copy and the launch that started it."""
  def half_done(x_ref, o_ref, sem, _aliased):
    pltpu.make_async_copy(x_ref.at[:4], o_ref.at[:4], sem).wait()

  @jax.jit
  def f(x):
    x, (out, sem) = copy_start(x)
    return pl.pallas_call(half_done, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          in_specs=[ANY, ANY, SEM], out_specs=ANY, input_output_aliases={1: 0})(x, out, sem)

  with pytest.raises(ppl.SyncError, match=r"outputs\[2\] of kernel '_start' on chip 0 \(DMA outputs\[0\] -> "
                     r"outputs\[1\] started at async_kernels.py:\d+\) holds 2048 that no later launch"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(f(_x((8, 128))))
