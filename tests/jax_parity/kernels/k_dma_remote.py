"""Parity kernels: manual DMAs and semaphores on one device, and remote DMAs over 4 devices."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NUM_DEVICES = 4
P = jax.sharding.PartitionSpec


def _ints(shape, seed, dtype=np.float32):
  return np.random.default_rng(seed).integers(-8, 8, shape).astype(dtype)


def _any():
  return pl.BlockSpec(memory_space=pl.ANY)


def case_dma_double_buffer():
  # HBM -> VMEM double-buffered loop with two DMA semaphores, result written by DMA back to HBM
  n, rows = 4, 16

  def kernel(x_hbm, o_hbm, buf, sems, obuf, osem):
    def copy(k, slot):
      return pltpu.make_async_copy(x_hbm.at[pl.ds(k * rows, rows)], buf.at[slot], sems.at[slot])
    copy(0, 0).start()
    obuf[...] = jnp.zeros_like(obuf)
    for k in range(n):
      slot = k % 2
      if k + 1 < n:
        copy(k + 1, 1 - slot).start()
      copy(k, slot).wait()
      obuf[...] += buf[slot] * float(k + 1)
    out = pltpu.make_async_copy(obuf, o_hbm, osem)
    out.start()
    out.wait()
  x = _ints((n * rows, 128), 40)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                     in_specs=[_any()], out_specs=_any(),
                     scratch_shapes=[pltpu.VMEM((2, rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                                     pltpu.VMEM((rows, 128), jnp.float32), pltpu.SemaphoreType.DMA])
  return f, (x,), None


def case_dma_hbm_to_hbm_scoped_sem():
  # reverse the row blocks with HBM -> HBM DMAs, semaphores allocated by run_scoped
  def kernel(x_hbm, o_hbm):
    def body(sem):
      for k in range(4):
        c = pltpu.make_async_copy(x_hbm.at[pl.ds(k * 8, 8)], o_hbm.at[pl.ds((3 - k) * 8, 8)], sem)
        c.start()
        c.wait()
    pl.run_scoped(body, pltpu.SemaphoreType.DMA)
  x = _ints((32, 128), 41)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     in_specs=[_any()], out_specs=_any())
  return f, (x,), None


def case_regular_semaphore_local():
  def kernel(x_ref, o_ref, sem):
    pl.semaphore_signal(sem, 3)
    pl.semaphore_wait(sem, 2)
    pl.semaphore_wait(sem, 1)
    o_ref[...] = x_ref[...] + 1.0
  x = _ints((8, 128), 42)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     scratch_shapes=[pltpu.SemaphoreType.REGULAR])
  return f, (x,), None


def _sharded(mesh, x, spec):
  return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def _ring_shift(x):
  mesh = jax.make_mesh((NUM_DEVICES,), ("x",))

  def kernel(x_ref, o_ref, send_sem, recv_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    barrier = pltpu.get_barrier_semaphore()   # the receiver's output must exist before we write it
    pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)})
    pl.semaphore_wait(barrier, 1)
    c = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id={"x": right})
    c.start()
    c.wait()

  def local(xs):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                          in_specs=[_any()], out_specs=_any(),
                          scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
                          compiler_params=pltpu.CompilerParams(collective_id=0))(xs)
  return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)(
      _sharded(mesh, x, P("x")))


def case_remote_ring_shift():
  return _ring_shift, (_ints((NUM_DEVICES * 8, 128), 43),), None


def _barrier_then_send(x):
  mesh = jax.make_mesh((NUM_DEVICES,), ("x",))

  def kernel(x_ref, o_ref, buf, send_sem, recv_sem):
    me = lax.axis_index("x")
    left = lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)
    right = lax.rem(me + 1, NUM_DEVICES)
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={"x": left})
    pl.semaphore_signal(barrier, 1, device_id={"x": right})
    pl.semaphore_wait(barrier, 2)
    buf[...] = x_ref[...] * (me + 1).astype(jnp.float32)
    c = pltpu.make_async_remote_copy(buf, o_ref, send_sem, recv_sem, device_id={"x": left})
    c.start()
    c.wait()

  def local(xs):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                          out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                          scratch_shapes=[pltpu.VMEM(xs.shape, xs.dtype), pltpu.SemaphoreType.DMA,
                                          pltpu.SemaphoreType.DMA],
                          compiler_params=pltpu.CompilerParams(collective_id=0))(xs)
  return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)(
      _sharded(mesh, x, P("x")))


def case_remote_barrier_and_vmem_send():
  return _barrier_then_send, (_ints((NUM_DEVICES * 8, 128), 44),), None


def _all_reduce_ring(x):
  # ring all-reduce (sum) of one (8, 128) block per device: n-1 hops, each forwarding what arrived
  mesh = jax.make_mesh((NUM_DEVICES,), ("x",))

  def kernel(x_ref, o_ref, cur, nxt, send_sem, recv_sem):
    me = lax.axis_index("x")
    right = lax.rem(me + 1, NUM_DEVICES)
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={"x": right})
    pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)})
    pl.semaphore_wait(barrier, 2)
    cur[...] = x_ref[...]
    o_ref[...] = x_ref[...]
    for hop in range(NUM_DEVICES - 1):
      src, dst = (cur, nxt) if hop % 2 == 0 else (nxt, cur)
      c = pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id={"x": right})
      c.start()
      c.wait()
      o_ref[...] += dst[...]
      pl.semaphore_signal(barrier, 1, device_id={"x": lax.rem(me + NUM_DEVICES - 1, NUM_DEVICES)})
      pl.semaphore_wait(barrier, 1)

  def local(xs):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                          in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                          out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                          scratch_shapes=[pltpu.VMEM(xs.shape, xs.dtype), pltpu.VMEM(xs.shape, xs.dtype),
                                          pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
                          compiler_params=pltpu.CompilerParams(collective_id=0))(xs)
  return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)(
      _sharded(mesh, x, P("x")))


def case_remote_ring_all_reduce():
  return _all_reduce_ring, (_ints((NUM_DEVICES * 8, 128), 45),), None


def case_remote_gather_to_device0():
  # every device DMAs its shard into slot `me` of device 0's output (HBM), device 0 waits for all
  mesh = jax.make_mesh((NUM_DEVICES,), ("x",))

  def kernel(x_ref, o_ref, send_sem, recv_sem):
    me = lax.axis_index("x")
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={"x": 0})

    @pl.when(me == 0)
    def _():
      pl.semaphore_wait(barrier, NUM_DEVICES)
      for d in range(1, NUM_DEVICES):
        pl.semaphore_signal(barrier, 1, device_id={"x": d})

    @pl.when(me != 0)
    def _():
      pl.semaphore_wait(barrier, 1)
    c = pltpu.make_async_remote_copy(x_ref, o_ref.at[me], send_sem, recv_sem, device_id={"x": 0})
    c.start()
    c.wait_send()

    @pl.when(me == 0)
    def _():
      for _ in range(NUM_DEVICES):
        pltpu.make_async_remote_copy(x_ref, o_ref.at[0], send_sem, recv_sem, device_id={"x": 0}).wait_recv()

  def local(xs):
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((NUM_DEVICES, *xs.shape), xs.dtype),
                         in_specs=[_any()], out_specs=_any(),
                         scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
                         compiler_params=pltpu.CompilerParams(collective_id=0))(xs)
    return out[None]

  # jitted once, outside `run` (which ends on the host and cannot be jitted itself): a shard_map
  # built per call is traced and compiled again by XLA on every call
  gather = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))

  def run(x):
    return np.asarray(gather(_sharded(mesh, x, P("x"))))[0]       # device 0's gathered copy
  return run, (_ints((NUM_DEVICES * 8, 128), 46),), None
