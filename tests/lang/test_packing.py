"""pltpu.pack_elementwise / unpack_elementwise / stochastic_round in palace's own API (lang/packing.py),
against NumPy written from the definitions (source k in bits [k*b, (k+1)*b), lowest first; unpack
sign-extends; a stochastic round picks one of the two neighbours). palace.jax's tests
(tests/jax_backend/test_tpu_packing.py) cover every dtype pair."""
import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import ShapeError
from palace import tpu as pltpu


def test_pack_then_unpack_int8_in_int32_round_trips():
  rng = np.random.default_rng(0)
  xs = rng.integers(-128, 128, (4, 8, 128)).astype(np.int32)

  def kernel(x_ref, p_ref, o_ref):
    packed = pltpu.pack_elementwise([x_ref[i] for i in range(4)], packed_dtype=jnp.int8)
    p_ref[...] = packed
    for i in range(4):
      o_ref[i] = pltpu.unpack_elementwise(pltpu.bitcast(packed, jnp.int32), index=i,
                                          packed_dtype=jnp.int8, unpacked_dtype=jnp.int32)
  packed, back = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct((8, 128), jnp.uint32),
                                                   pl.ShapeDtypeStruct(xs.shape, jnp.int32)))(xs)
  want = sum((xs[i].astype(np.int64) & 0xFF) << (8 * i) for i in range(4)).astype(np.uint32)
  np.testing.assert_array_equal(packed, want)
  np.testing.assert_array_equal(back, xs)


def test_pack_f32_rounds_to_bf16_to_nearest_even():
  x = np.array([[1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8] * 64] * 8, np.float32)   # two ties

  def kernel(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[...], x_ref[...]], packed_dtype=jnp.bfloat16)
  got = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, jnp.uint32))(x)
  lo = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
  np.testing.assert_array_equal(got, lo | (lo << 16))


def test_pack_with_the_wrong_number_of_sources_is_an_error():
  def kernel(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[...]] * 3, packed_dtype=jnp.int8)
  with pytest.raises(ShapeError, match="3 sources of int32 into int8, whose packing factor is 4"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.uint32))(
        np.zeros((8, 128), np.int32))


def test_stochastic_round_to_bf16_rounds_up_below_the_fraction():
  x = np.full((8, 128), 1.0 + 2.0 ** -9, np.float32)   # a quarter of the way from 1 to the next bf16
  bits = np.arange(8 * 128, dtype=np.uint32).reshape(8, 128) * np.uint32(4194304)   # 0 .. 2**32 - 2**22

  def kernel(x_ref, b_ref, o_ref):
    r = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=jnp.bfloat16)
    o_ref[...] = r.astype(jnp.float32)
  got = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, jnp.float32))(x, bits)
  up = bits.astype(np.float64) < 0.25 * 2.0 ** 32
  np.testing.assert_array_equal(got, np.where(up, np.float32(1.0 + 2.0 ** -7), np.float32(1.0)))


def test_pack_int4_into_int2_fields():
  """int2 is a field type only (no kernel dtype): two int4 sources, truncated to 2 bits, lowest first."""
  rng = np.random.default_rng(5)
  xs = rng.integers(-8, 8, (2, 128, 128)).astype(ml_dtypes.int4)

  def kernel(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[0], x_ref[1]], packed_dtype=ml_dtypes.int2)
  got = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((128, 128), jnp.uint4))(xs)
  f = xs.astype(np.int64) & 3
  np.testing.assert_array_equal(got.astype(np.int64), f[0] | (f[1] << 2))
