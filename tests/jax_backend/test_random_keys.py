"""jax.random inside kernels under palace.jax (rules_random.py): key arrays held as their key data,
each key primitive evaluated as Mosaic lowers it (the traced JAX function), so threefry keys give
jax.random's own values bit for bit, and Pallas TPU keys seed palace's generator with their words."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import random as jr
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax._src.pallas.mosaic import random as plrandom

import palace.jax as pj

VMEM, SMEM = pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)


@pytest.mark.parametrize("shape", [(8, 128), (4, 16, 128)])
@pytest.mark.parametrize("sample", ["bits", "uniform"])
def test_threefry_samples_in_a_kernel_equal_jax_random(shape, sample):
  gen = {"bits": jr.bits, "uniform": jr.uniform}[sample]
  dtype = jnp.uint32 if sample == "bits" else jnp.float32
  key = jr.key(7, impl="threefry2x32")

  def body(key_ref, o_ref):
    o_ref[...] = gen(key_ref[...], shape=o_ref.shape)
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(body, in_specs=[VMEM], out_shape=jax.ShapeDtypeStruct(shape, dtype))(key)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(gen(key, shape=shape)))


def test_threefry_fold_in_and_key_output_equal_jax_random():
  key = jr.key(3, impl="threefry2x32")

  def body(key_ref, o_ref, k_ref):
    k = jr.fold_in(key_ref[...], 5)
    o_ref[...] = jr.bits(k, shape=o_ref.shape)
    k_ref[...] = k
  with pj.virtual_tpu("v5e"):
    bits, k = pl.pallas_call(body, in_specs=[VMEM], out_specs=(VMEM, VMEM),
                             out_shape=(jax.ShapeDtypeStruct((8, 128), jnp.uint32),
                                        jax.ShapeDtypeStruct((), key.dtype)))(key)
  want = jr.fold_in(key, 5)
  np.testing.assert_array_equal(np.asarray(jr.key_data(k)), np.asarray(jr.key_data(want)))
  np.testing.assert_array_equal(np.asarray(bits), np.asarray(jr.bits(want, (8, 128))))


def test_normal_samples_follow_jax_random_normal():
  # jax.random.normal's erf_inv is Mosaic's polynomial (rules_lax.py); XLA:CPU's differs from it in the
  # last bit where it fuses multiply-adds, so the comparison is to 2 ulp, not bit for bit
  key = jr.key(0, impl="threefry2x32")

  def body(key_ref, o_ref):
    o_ref[...] = jr.normal(key_ref[...], shape=o_ref.shape)
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(body, in_specs=[VMEM], out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(key)
  np.testing.assert_allclose(np.asarray(got), np.asarray(jr.normal(key, (8, 128))), rtol=3e-7, atol=3e-7)


def test_a_pallas_key_seeds_the_core_generator_with_its_words():
  key = pltpu.to_pallas_key(jr.key(0, impl="rbg"))
  words = np.asarray(jr.key_data(key)).reshape(-1)

  def by_key(key_ref, o_ref, w_ref):
    k0, k1 = plrandom.unwrap_pallas_seed(key_ref[...])
    w_ref[0, 0], w_ref[0, 1] = k0, k1
    o_ref[...] = jr.bits(key_ref[...], shape=o_ref.shape)

  def by_words(o_ref):
    pltpu.prng_seed(jnp.uint32(words[0]), jnp.uint32(words[1]))
    o_ref[...] = pltpu.prng_random_bits(o_ref.shape)
  out = jax.ShapeDtypeStruct((8, 128), jnp.uint32)
  with pj.virtual_tpu("v5e"):
    bits, w = pl.pallas_call(by_key, in_specs=[SMEM], out_specs=(VMEM, SMEM),
                             out_shape=(out, jax.ShapeDtypeStruct((1, 2), jnp.uint32)))(key)
    ref = pl.pallas_call(by_words, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))()
  np.testing.assert_array_equal(np.asarray(w).reshape(-1), words)
  np.testing.assert_array_equal(np.asarray(bits), np.asarray(ref).view(np.uint32))


def test_unstack_in_a_kernel():
  x = np.arange(3 * 8 * 128, dtype=np.float32).reshape(3, 8, 128)

  def body(x_ref, o_ref):
    a, b, c = jnp.unstack(x_ref[...], axis=0)
    o_ref[...] = a + 2 * b + 3 * c
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)
  np.testing.assert_array_equal(np.asarray(got), x[0] + 2 * x[1] + 3 * x[2])


def test_mosaic_refusals_of_the_prng():
  from palace import UnsupportedError

  def rank1(o_ref):
    pltpu.prng_seed(0)
    o_ref[...] = pltpu.prng_random_bits((128,))
  with pj.virtual_tpu("v5e"), pytest.raises(UnsupportedError, match="rank 2 or more only"):
    pl.pallas_call(rank1, out_shape=jax.ShapeDtypeStruct((128,), jnp.int32))()

  def from_vmem(key_ref, o_ref):
    o_ref[...] = jr.bits(key_ref[...], shape=o_ref.shape)
  key = pltpu.to_pallas_key(jr.key(0, impl="rbg"))
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match="Mosaic loads these keys from SMEM only"):
    pl.pallas_call(from_vmem, in_specs=[VMEM], out_shape=jax.ShapeDtypeStruct((8, 128), jnp.uint32))(key)
