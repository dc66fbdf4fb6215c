"""Chapter 9: all-gather overlapped with a matmul across chips. x is sharded by rows over 8 chips; each
chip needs all of x. In a ring, a chip forwards the chunk it holds to its right neighbour over ICI (an
async remote DMA) while its MXU multiplies that same chunk, so the communication hides the compute (or
the other way around). Run: python docs/examples/ch09_overlapped_all_gather.py
"""
import functools

import numpy as np

import palace as pl
import palace.lax as lax
import palace.numpy as jnp
from palace import tpu as pltpu

REQUIRES = ("palace.shard_map", "palace.make_mesh", "palace.P", "palace.tpu.make_async_remote_copy",
            "palace.tpu.get_barrier_semaphore")
CHIPS = 8


def collective_matmul(x, y, *, overlap):
  (m, k), n = x.shape, y.shape[1]
  mc, nc = m // CHIPS, n // CHIPS

  @functools.partial(
      pl.kernel, out_type=pl.ShapeDtypeStruct((m, nc), x.dtype), mesh=pltpu.TensorCoreMesh("core", 1),
      scratch_types=[pltpu.VMEM((m, k), x.dtype), pltpu.VMEM((k, nc), x.dtype),
                     pltpu.VMEM((mc, nc), x.dtype), pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
      compiler_params=pltpu.CompilerParams(collective_id=0))
  def kernel(x_hbm, y_hbm, o_hbm, xg, yv, ov, send_sem, recv_sem):
    me = lax.axis_index("x")
    right, left = lax.rem(me + 1, CHIPS), lax.rem(me + CHIPS - 1, CHIPS)
    barrier = pltpu.get_barrier_semaphore()       # wait until both neighbours are in the kernel
    pl.semaphore_signal(barrier, 1, device_id={"x": left})
    pl.semaphore_signal(barrier, 1, device_id={"x": right})
    pl.semaphore_wait(barrier, 2)
    pltpu.sync_copy(x_hbm, xg.at[pl.ds(me * mc, mc)])
    pltpu.sync_copy(y_hbm, yv)

    def chunk(step):                              # the chunk this chip holds at ring step `step`
      return pl.ds(lax.rem(me + CHIPS - step, CHIPS) * mc, mc)

    def forward(step):
      return pltpu.make_async_remote_copy(xg.at[chunk(step)], xg.at[chunk(step)], send_sem, recv_sem,
                                          device_id={"x": right})

    if not overlap:                               # blocking: the whole all-gather first
      for step in range(CHIPS - 1):
        copy = forward(step)
        copy.start()
        copy.wait()
    for step in range(CHIPS):
      copy = forward(step) if overlap and step < CHIPS - 1 else None
      if copy is not None:
        copy.start()                              # send chunk `step` on ...
      ov[...] = jnp.dot(xg[chunk(step), :], yv[...], preferred_element_type=jnp.float32).astype(ov.dtype)
      pltpu.sync_copy(ov, o_hbm.at[chunk(step)])  # ... while the MXU multiplies it
      if copy is not None:
        copy.wait()                               # the next chunk has arrived from the left

  mesh = pl.make_mesh((CHIPS,), ("x",))
  return pl.shard_map(kernel, mesh=mesh, in_specs=(pl.P("x", None), pl.P(None, "x")),
                      out_specs=pl.P(None, "x"))(x, y)


def main():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((CHIPS * 64, 256)).astype(jnp.bfloat16)
  y = rng.standard_normal((256, CHIPS * 256)).astype(jnp.bfloat16)
  want = x.astype(np.float32) @ y.astype(np.float32)
  times = {}
  for overlap in (False, True):
    with pl.virtual_tpu("v5e", num_chips=CHIPS) as tpu:
      z = collective_matmul(x, y, overlap=overlap)
    assert np.max(np.abs(z.astype(np.float32) - want) / (np.abs(want) + 1)) < 2e-2
    times[overlap] = tpu.reports[-1].device_time_s
  print(f"blocking all-gather then matmul: {times[False] * 1e6:.1f} us; "
        f"overlapped: {times[True] * 1e6:.1f} us")
  assert times[True] < times[False]


if __name__ == "__main__":
  main()
