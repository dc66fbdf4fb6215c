"""palace.jax: a remote copy lands in the receiver at its completion on the modelled clock, after the
receiver's own earlier stores (sim/dma.py `land_due`), as on the chip.

The kernel is JAX's test_interpret_remote_dma_asymmetrical_indexer (tests/pallas/
tpu_pallas_distributed_test.py), written here anew: every chip zeroes its output, then copies its
input into one half of the next chip's output and waits. On a TPU the zeroing is done long before a
neighbour's copy arrives; before session 27 palace wrote the copy's data when the sender issued it, in
the order palace runs the chips, and a later chip's zeroing erased it.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import palace.jax as pj


def _kernel(n):
  def kernel(x_ref, o_ref, send, recv):
    o_ref[...] = jnp.zeros_like(o_ref[...])
    me = lax.axis_index("x")
    odd = lax.rem(me, 2)
    for half, when in ((1, odd == 1), (0, odd == 0)):
      @pl.when(when)
      def _():
        copy = pltpu.make_async_remote_copy(x_ref, o_ref.at[half], send, recv,
                                            device_id=lax.rem(me + 1, n),
                                            device_id_type=pl.DeviceIdType.LOGICAL)
        copy.start()
        copy.wait()
  return kernel


def _reference(x, n):
  """The chip's answer: chip i holds chip i - 1's input in half 1 (i - 1 odd) or half 0, zeros in the
  other half."""
  blocks = np.split(x, n, axis=1)
  out = []
  for i in range(n):
    pair = [np.zeros_like(blocks[0]), np.zeros_like(blocks[0])]
    pair[1 if (i - 1) % 2 else 0] = blocks[(i - 1) % n]
    out.append(np.stack(pair))
  return np.concatenate(out, axis=1)


@pytest.mark.filterwarnings("ignore:.*(DeviceIdType|device_id_type) is deprecated:DeprecationWarning")
@pytest.mark.parametrize("n", [2, 4])
def test_zeroing_then_a_remote_copy_into_the_neighbour_gives_the_chips_answer(n):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("x",))
  call = pl.pallas_call(_kernel(n), out_shape=jax.ShapeDtypeStruct((2, 8, 128), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
  f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"),
                            check_vma=False))
  x = np.arange(8 * 128 * n, dtype=np.float32).reshape(8, 128 * n) + 1
  runs = []
  for _ in range(2):
    with pj.virtual_tpu("v5e", num_chips=4) as tpu:
      got = np.asarray(f(jax.device_put(x, jax.sharding.NamedSharding(mesh, P(None, "x")))))
    np.testing.assert_array_equal(got, _reference(x, n))
    (report,) = tpu.reports
    runs.append((report.num_chips, report.device_cycles))
  assert runs[0] == runs[1] and runs[0][0] == n   # deterministic: the same modelled time again
