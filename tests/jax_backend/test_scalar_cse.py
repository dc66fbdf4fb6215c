"""A kernel's repeated scalar arithmetic is charged once, as Mosaic's CSE compiles it
(palace/_src/jax/scalar_cse.py): 16 copies into `buf.at[(i % 2) * K + j]` cost what copies into a slot
computed once cost, loads are never merged, and results are unchanged."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace._src.jax.scalar_cse import scalar_cse

K, ROUNDS, ROWS = 8, 4, 8


def _burst(hoisted: bool):
  """ROUNDS rounds of K (8, 128) copies into the half of a 2K-slot buffer chosen by the round's parity:
  the slot `(i % 2) * K + j` written per copy (as a kernel author writes it) or computed once."""
  def kernel(x_hbm, o_ref, buf, sem):
    def body(i, acc):
      half = (i % 2) * K
      copies = [pltpu.make_async_copy(x_hbm.at[pl.ds((i * K + j) * ROWS, ROWS)],
                                      buf.at[(half if hoisted else (i % 2) * K) + j], sem.at[0])
                for j in range(K)]
      for cp in copies:
        cp.start()
      for cp in copies:
        cp.wait()
      return acc + buf[pl.ds((i % 2) * K, K)].sum(axis=0)
    o_ref[...] = jax.lax.fori_loop(0, ROUNDS, body, jnp.zeros((ROWS, 128), jnp.float32))

  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
      in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
      scratch_shapes=[pltpu.VMEM((2 * K, ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))])


def _x():
  # (small integers: their f32 sums are exact in any order)
  return jnp.asarray(np.random.default_rng(5).integers(-64, 64, (ROUNDS * K * ROWS, 128)).astype(np.float32))


def _run(hoisted):
  x = _x()
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.block_until_ready(_burst(hoisted)(x)))
  np.testing.assert_array_equal(out, np.asarray(x).reshape(ROUNDS * K, ROWS, 128).sum(axis=0))
  return tpu.reports[0]


def test_a_slot_recomputed_per_copy_costs_what_one_computed_once_costs():
  assert _run(False).device_cycles == _run(True).device_cycles


def test_repeated_remainders_merge():
  jaxpr = jax.make_jaxpr(lambda i, j: ((i % 2) * 8 + j, (i % 2) * 8 + j + 1, (j % 2)))(3, 4).jaxpr
  merged = scalar_cse(jaxpr)
  names = [e.primitive.name for e in merged.eqns]
  before = [e.primitive.name for e in jaxpr.eqns]
  assert before.count("jit") == 3 and names.count("jit") == 2   # (i % 2 once; j % 2 is another)
  assert names.count("mul") == 1 and before.count("mul") == 2
  out = jax.core.eval_jaxpr(merged, [], 3, 4)
  assert [int(v) for v in out] == [12, 13, 0]


def test_a_kernel_reading_smem_twice_around_a_store_sees_the_store():
  def kernel(s_ref, o_ref):
    a = s_ref[0] * 2
    s_ref[0] = a + 1
    b = s_ref[0] * 2   # (the same expression on a new load: 2 * (2 * s + 1))
    o_ref[...] = jnp.full((8, 128), a + b, jnp.int32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32),
                        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM))
  with pj.virtual_tpu("v5e"):
    out = np.asarray(call(jnp.asarray([5], jnp.int32)))
  assert (out == 10 + 22).all()
