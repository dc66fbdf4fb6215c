"""pltpu.pack_elementwise / unpack_elementwise / stochastic_round under palace.jax (registry entries in
rules_tpu.py, the ops in lang/packing.py), against NumPy references written from the primitives'
definitions (jax/_src/pallas/mosaic/primitives.py): source k fills bits [k*b, (k+1)*b) of each element,
integers truncated, f32 rounded to bf16; an unpack sign-extends; a stochastic round gives one of the two
neighbours."""
import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import UnsupportedError

CONFIGS = [(np.float32, ml_dtypes.bfloat16), (np.int32, np.int16), (np.int32, np.int8),
           (np.int32, ml_dtypes.int4), (np.int16, np.int8), (np.int8, ml_dtypes.int4)]


def _bits(d) -> int:
  four = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))
  return 4 if np.dtype(d) in four else np.dtype(d).itemsize * 8


def _sources(wide, narrow, shape=(8, 128)):
  rng = np.random.default_rng(0)
  n = _bits(wide) // _bits(narrow)
  if np.dtype(wide) == np.float32:
    return rng.standard_normal((n, *shape)).astype(np.float32)
  info = np.iinfo(np.int8 if _bits(wide) == 4 else wide)
  lo, hi = (-8, 8) if _bits(wide) == 4 else (info.min, info.max)
  return rng.integers(lo, hi, (n, *shape)).astype(wide)


def _field(x, narrow) -> np.ndarray:
  """x narrowed to `narrow`, as its raw bits (uint64)."""
  b = _bits(narrow)
  if np.dtype(x.dtype) == np.float32:
    return x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint64)
  return x.astype(np.int64).astype(np.uint64) & np.uint64((1 << b) - 1)


def _packed(xs, narrow):
  b = _bits(narrow)
  out = np.zeros(xs.shape[1:], np.uint64)
  for k, x in enumerate(xs):
    out |= _field(x, narrow) << np.uint64(k * b)
  return out


@pytest.mark.parametrize("wide,narrow", CONFIGS)
def test_pack_elementwise_interleaves_the_sources_lowest_first(wide, narrow):
  xs = _sources(wide, narrow)
  n, out_dtype = len(xs), {32: jnp.uint32, 16: jnp.uint16, 8: jnp.uint8}[_bits(wide)]

  def kernel(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[i] for i in range(n)], packed_dtype=narrow)
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(xs.shape[1:], out_dtype))(xs)
  np.testing.assert_array_equal(np.asarray(got).astype(np.uint64), _packed(xs, narrow))


@pytest.mark.parametrize("wide,narrow", CONFIGS)
def test_unpack_elementwise_takes_each_field_back_sign_extended(wide, narrow):
  xs = _sources(wide, narrow)
  packed = _packed(xs, narrow).astype({32: np.uint32, 16: np.uint16, 8: np.uint8}[_bits(wide)])
  for index in range(len(xs)):
    def kernel(x_ref, o_ref):
      o_ref[...] = pltpu.unpack_elementwise(x_ref[...], index=index, packed_dtype=narrow,
                                            unpacked_dtype=wide)
    with pj.virtual_tpu("v5e"):
      got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(packed.shape, wide))(packed)
    np.testing.assert_array_equal(np.asarray(got), xs[index].astype(narrow).astype(wide))


def test_int4_sources_pack_into_int2_fields_and_unpack_sign_extended():
  """Two int4 values per uint4 element, the first in bits 0-1 (truncated to 2 bits); the unpack of
  field k sign-extends its 2 bits. Shapes of whole vregs (128 x 128), as Mosaic needs for int2."""
  rng = np.random.default_rng(4)
  xs = rng.integers(-8, 8, (2, 128, 128)).astype(ml_dtypes.int4)
  fields = xs.astype(np.int64) & 3
  want = (fields[0] | (fields[1] << 2)).astype(np.uint8)

  def pack(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[0], x_ref[1]], packed_dtype=jnp.int2)
  with pj.virtual_tpu("v5e"):
    got = pl.pallas_call(pack, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.uint4))(xs)
  np.testing.assert_array_equal(np.asarray(got).astype(np.uint8), want)
  for index in range(2):
    def unpack(x_ref, o_ref):
      o_ref[...] = pltpu.unpack_elementwise(x_ref[...], index=index, packed_dtype=jnp.int2,
                                            unpacked_dtype=jnp.int4)
    with pj.virtual_tpu("v5e"):
      back = pl.pallas_call(unpack, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.int4))(
          want.astype(ml_dtypes.uint4))
    f = fields[index]
    np.testing.assert_array_equal(np.asarray(back).astype(np.int64), np.where(f >= 2, f - 4, f))


def test_int2_packs_of_partial_vregs_and_on_v4_are_refused():
  def kernel(x_ref, o_ref):
    o_ref[...] = pltpu.pack_elementwise([x_ref[0], x_ref[1]], packed_dtype=jnp.int2)
  small = np.zeros((2, 8, 128), ml_dtypes.int4)
  with pj.virtual_tpu("v5e"), pytest.raises(UnsupportedError,
                                            match=r"pack_elementwise with int2 fields on a \[8, 128\] "
                                                  r"array .*multiples of 128 and 128"):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.uint4))(small)
  big = np.zeros((2, 128, 128), ml_dtypes.int4)
  with pj.virtual_tpu("v4"), pytest.raises(Exception, match=r"ShapeError: pltpu.pack_elementwise .*"
                                                          r"has dtype int2, which TPU v4 kernels"):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.uint4))(big)


@pytest.mark.parametrize("target", [jnp.bfloat16, jnp.float8_e5m2, jnp.float8_e4m3fn])
def test_stochastic_round_gives_a_neighbour_and_rounds_up_by_the_bits(target):
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 128)).astype(np.float32)
  x[0, :4] = [0.0, 1.0, -2.0, np.nan]   # exact values and NaN convert as astype
  bits = rng.integers(0, 2 ** 32, (8, 128), dtype=np.uint64).astype(np.uint32)

  def kernel(x_ref, b_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=target)
  with pj.virtual_tpu("v5e"):
    got = np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, target))(x, bits))
  t = np.dtype(target)
  g = got.astype(np.float32)
  np.testing.assert_array_equal(g[0, :3], x[0, :3])
  assert np.isnan(g[0, 3])
  # the neighbours toward and away from zero, and the rule: away when bits < frac * 2**32
  ub = {1: np.uint8, 2: np.uint16}[t.itemsize]
  near = x.astype(t)
  mag_bits = near.view(ub).astype(np.int64) & ((1 << (8 * t.itemsize - 1)) - 1)
  sign = near.view(ub).astype(np.int64) - mag_bits
  lo_bits = np.where(np.abs(near.astype(np.float32)) > np.abs(x), mag_bits - 1, mag_bits)
  lo = (sign + lo_bits).astype(ub).view(t).astype(np.float32)
  hi = (sign + lo_bits + 1).astype(ub).view(t).astype(np.float32)
  frac = (np.abs(x) - np.abs(lo)) / (np.abs(hi) - np.abs(lo))
  want = np.where(bits.astype(np.float64) < frac * 2.0 ** 32, hi, lo)
  inexact = np.isfinite(x) & (lo != x)
  np.testing.assert_array_equal(g[inexact], want[inexact])
  assert 0.2 < np.mean(g[inexact] == hi[inexact]) < 0.8   # both neighbours occur


def test_stochastic_round_to_an_unmodelled_type_is_refused():
  x = np.zeros((8, 128), np.float32)

  def kernel(x_ref, b_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...],
                                        target_dtype=jnp.float4_e2m1fn).astype(jnp.float32)
  with pj.virtual_tpu("v5e"), pytest.raises(UnsupportedError, match="float4_e2m1fn"):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x, x.view(np.uint32))


def test_stochastic_round_to_float8_e4m3b11fnuz_gives_a_neighbour_of_the_same_sign():
  """float8_e4m3b11fnuz has no -0 (0x80 is its NaN): a small negative value rounds to 0 or to the
  negative neighbour, never to NaN nor a positive value. The neighbours come from the table of all
  its finite values; away from zero when bits < frac * 2**32 (lang/packing.py)."""
  b11 = np.dtype(ml_dtypes.float8_e4m3b11fnuz)
  rng = np.random.default_rng(2)
  x = rng.standard_normal((8, 128)).astype(np.float32)
  x[0, :6] = [0.0, 1.0, -2.0, -1e-6, 1e-6, -3e-4]   # exact values; below the smallest subnormal
  bits = rng.integers(0, 2 ** 32, (8, 128), dtype=np.uint64).astype(np.uint32)
  bits[0, 3:6] = 0                                 # 0 < frac * 2**32: rounds away from zero

  def kernel(x_ref, b_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...], target_dtype=jnp.float8_e4m3b11fnuz)
  with pj.virtual_tpu("v5e"):
    got = np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, b11))(x, bits))
  g = got.astype(np.float32)
  table = np.arange(256, dtype=np.uint8).view(b11).astype(np.float32)
  table = np.unique(table[np.isfinite(table)])
  up_i = np.searchsorted(table, x, side="left")        # table[up_i] >= x > table[up_i - 1]
  above, below = table[np.minimum(up_i, len(table) - 1)], table[np.maximum(up_i - 1, 0)]
  exact = above == x
  toward = np.where(x > 0, below, above)
  away = np.where(x > 0, above, below)
  frac = (np.abs(x) - np.abs(toward)) / (np.abs(away) - np.abs(toward))
  want = np.where(exact, x, np.where(bits.astype(np.float64) < frac * 2.0 ** 32, away, toward))
  np.testing.assert_array_equal(g, want)
  assert not np.isnan(g).any()
  assert g[0, 3] < 0 and g[0, 4] > 0 and g[0, 5] < 0


def test_mixed_precision_dot_of_bf16_and_float8_e4m3b11fnuz_into_float32():
  """bf16 x float8_e4m3b11fnuz with preferred float32 ([tpu_info] is_matmul_supported on v5e):
  small integers, so every product and sum is exact; a NaN weight (0x80) spreads to its column."""
  b11 = np.dtype(ml_dtypes.float8_e4m3b11fnuz)
  rng = np.random.default_rng(3)
  x = rng.integers(-4, 5, (64, 128)).astype(ml_dtypes.bfloat16)
  w = rng.integers(-3, 4, (128, 128)).astype(b11)
  w[5, 7] = np.float32(np.nan)

  def kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)
  with pj.virtual_tpu("v5e"):
    got = np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32))(x, w))
  want = x.astype(np.float64) @ w.astype(np.float64)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got[:, :7], want[:, :7])


@pytest.mark.parametrize("chip", ["v4", "7x"])
def test_float8_e4m3b11fnuz_is_refused_on_v4_and_7x(chip):
  x = np.zeros((8, 128), np.float32)

  def kernel(x_ref, b_ref, o_ref):
    o_ref[...] = pltpu.stochastic_round(x_ref[...], b_ref[...],
                                        target_dtype=jnp.float8_e4m3b11fnuz).astype(jnp.float32)
  # (found while the kernel runs: XLA wraps it in its runtime error around palace's host callback)
  with pj.virtual_tpu(chip), pytest.raises(Exception, match=rf"ShapeError: pltpu.stochastic_round .*"
                                                           rf"which TPU {chip} kernels do not support"):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x, x.view(np.uint32))
