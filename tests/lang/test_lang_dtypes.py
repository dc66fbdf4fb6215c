"""Dtypes TPUs have, inside kernels, and JAX's type promotion on palace arrays."""
import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from lang_helpers import apply, dtype_in_kernel

ALL_DTYPES = [jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8, jnp.int16,
              jnp.int32, jnp.uint8, jnp.uint32, jnp.bool_]


def _sample(dtype, shape=(16, 128), seed=0):
  rng = np.random.default_rng(seed)
  d = np.dtype(dtype)
  if d == np.bool_:
    return rng.random(shape) < 0.5
  if d.kind in "iu":
    info = np.iinfo(d)
    return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(d)
  return rng.uniform(-4, 4, shape).astype(d)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_copy_through_vmem_keeps_every_bit(dtype):
  x = _sample(dtype)
  out = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                       out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  assert out.dtype == np.dtype(dtype)
  np.testing.assert_array_equal(out.view(np.uint8), x.view(np.uint8))


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != jnp.bool_], ids=str)
def test_elementwise_add_max_in_dtype(dtype):
  x, y = _sample(dtype, seed=1), _sample(dtype, seed=2)
  if np.dtype(dtype).itemsize == 1 and np.dtype(dtype).kind in "iu":
    # Mosaic on a TPU v5e: "Only vector<i16> and vector<i32> are supported, but got 'i8'"
    # (benchmarks/hw/data/v5e-limits-2026-12-05.jsonl)
    with pytest.raises(NotImplementedError, match=r"no 8-bit integer add on vectors"):
      apply(lambda a, b: jnp.maximum(a + b, b), x, y)
    return
  if np.dtype(dtype).itemsize == 2 and np.dtype(dtype).kind in "iu":
    # Mosaic on a TPU v5e: int16 add compiles, int16 max "failed to legalize operation 'arith.maxsi'"
    # (benchmarks/hw/data/v5e-limits-2026-12-05-followup.jsonl, probes int16_add, int16_max_op)
    with pytest.raises(NotImplementedError, match=r"no 16-bit integer maximum on vectors"):
      apply(lambda a, b: jnp.maximum(a + b, b), x, y)
    out, _ = apply(lambda a, b: a + b, x, y)
    np.testing.assert_array_equal(out, (x.astype(np.int64) + y.astype(np.int64)).astype(dtype))
    return
  out, d = apply(lambda a, b: jnp.maximum(a + b, b), x, y)
  assert d == np.dtype(dtype)
  wide = np.float32 if np.dtype(dtype).kind not in "iu" else np.int64
  s = (x.astype(wide) + y.astype(wide)).astype(dtype)  # rounds (floats) or wraps (ints) like the TPU
  np.testing.assert_array_equal(out, np.maximum(s, y))


def test_bool_logic():
  x, y = _sample(np.bool_, seed=3), _sample(np.bool_, seed=4)
  out, d = apply(lambda a, b: (a & ~b) | jnp.logical_xor(a, b), x, y)
  assert d == np.bool_
  np.testing.assert_array_equal(out, (x & ~y) | (x ^ y))


# JAX (x64 disabled) promotion results, from jax.numpy.promote_types / weak-type rules.
PROMOTIONS = [
    (jnp.bfloat16, jnp.float32, jnp.float32),
    (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
    (jnp.int8, jnp.uint8, jnp.int16),
    (jnp.int8, jnp.int32, jnp.int32),
    (jnp.uint8, jnp.int32, jnp.int32),
    (jnp.int16, jnp.uint8, jnp.int16),
    (jnp.uint8, jnp.uint32, jnp.uint32),
    (jnp.uint32, jnp.int32, jnp.int32),   # int64 in JAX, canonicalised to int32 without x64
    (jnp.int32, jnp.float32, jnp.float32),
    (jnp.int32, jnp.bfloat16, jnp.bfloat16),
    (jnp.int8, jnp.float8_e4m3fn, jnp.float8_e4m3fn),
    (jnp.bool_, jnp.int8, jnp.int8),
    (jnp.bool_, jnp.bfloat16, jnp.bfloat16),
    (jnp.bool_, jnp.float8_e5m2, jnp.float8_e5m2),
]


@pytest.mark.parametrize("a,b,want", PROMOTIONS, ids=lambda d: str(np.dtype(d)))
def test_binary_promotion_matches_jax(a, b, want):
  x, y = _sample(a, (8, 128), 5), _sample(b, (8, 128), 6)
  # (a select: 8-bit +, *, max and 16-bit max do not compile on a TPU, a select of any width does)
  d, _ = dtype_in_kernel(lambda u, v: jnp.where(True, u, v), x, y)
  assert d == np.dtype(want)
  d2, _ = dtype_in_kernel(lambda u, v: jnp.where(False, v, u), x, y)
  assert d2 == np.dtype(want)


WEAK = [
    (jnp.bfloat16, 2, jnp.bfloat16), (jnp.bfloat16, 2.5, jnp.bfloat16), (jnp.int8, 3, jnp.int8),
    (jnp.int8, 1.5, jnp.float32), (jnp.uint8, 1.0, jnp.float32), (jnp.int32, 0.5, jnp.float32),
    (jnp.bool_, 1, jnp.int32), (jnp.bool_, 1.0, jnp.float32), (jnp.bool_, True, jnp.bool_),
    (jnp.float8_e4m3fn, 2.0, jnp.float8_e4m3fn), (jnp.uint32, 7, jnp.uint32),
]


@pytest.mark.parametrize("a,scalar,want", WEAK, ids=str)
def test_weak_python_scalars(a, scalar, want):
  x = _sample(a, (8, 128), 7)
  # (a select: 8-bit * and max do not compile on a TPU; jnp.where promotes as binary ops do)
  assert dtype_in_kernel(lambda u: jnp.where(True, u, scalar), x)[0] == np.dtype(want)
  assert dtype_in_kernel(lambda u: jnp.where(False, scalar, u), x)[0] == np.dtype(want)


def test_weak_scalar_values_are_exact():
  x = _sample(jnp.int16, seed=8)   # (not int8: 8-bit vector adds do not compile on a TPU)
  out, d = apply(lambda u: u * 2 + 1, x)
  assert d == np.int16
  np.testing.assert_array_equal(out, (x.astype(np.int32) * 2 + 1).astype(np.int16))
  xb = _sample(jnp.bfloat16, seed=9)
  out, d = apply(lambda u: u * 0.5 + 1.0, xb)
  assert d == jnp.bfloat16
  np.testing.assert_array_equal(out, (xb.astype(np.float32) * 0.5 + 1.0).astype(jnp.bfloat16))


def test_int_scalar_and_float_scalar_default_types():
  seen = {}

  def kernel(o_ref):
    i = pl.program_id(0)
    seen["pid"], seen["pid+1"], seen["pid+1.0"] = i.dtype, (i + 1).dtype, (i + 1.0).dtype
    seen["pid/2"] = (i / 2).dtype
    o_ref[...] = jnp.full((8, 128), i + 1.5)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))()
  assert seen == {"pid": jnp.int32, "pid+1": jnp.int32, "pid+1.0": jnp.float32, "pid/2": jnp.float32}
  np.testing.assert_array_equal(out, np.repeat([1.5, 2.5], 8)[:, None] * np.ones((1, 128)))


def test_bf16_arithmetic_rounds_once_per_op():
  x = _sample(jnp.bfloat16, seed=10)
  y = _sample(jnp.bfloat16, seed=11)
  out, _ = apply(lambda a, b: a * b - a, x, y)
  f = np.float32
  ref = ((x.astype(f) * y.astype(f)).astype(jnp.bfloat16).astype(f) - x.astype(f)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("src,dst", [(jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float32),
                                     (jnp.float32, jnp.int32), (jnp.int32, jnp.float32),
                                     (jnp.float32, jnp.float8_e4m3fn), (jnp.int8, jnp.int32),
                                     (jnp.int32, jnp.int8), (jnp.float32, jnp.bool_),
                                     (jnp.uint8, jnp.float32), (jnp.bfloat16, jnp.int8)], ids=str)
def test_astype(src, dst):
  x = _sample(src, seed=12)
  out, d = apply(lambda a: a.astype(dst), x, out_dtype=dst)
  assert d == np.dtype(dst)
  if np.dtype(dst).kind in "iu" and np.dtype(src).kind not in "iu":
    info = np.iinfo(dst)
    ref = np.clip(np.trunc(x.astype(np.float64)), info.min, info.max).astype(dst)
  else:
    ref = x.astype(dst)
  np.testing.assert_array_equal(out, ref)


def test_float_to_int_saturates_and_nan_is_zero():
  x = np.array([[np.nan, 1e10, -1e10, 2.7, -2.7, 127.9, 200.0, -300.0]] * 8, np.float32)
  x = np.tile(x, (1, 16))
  out, _ = apply(lambda a: a.astype(jnp.int8), x, out_dtype=jnp.int8)
  np.testing.assert_array_equal(out[0, :8], np.array([0, 127, -128, 2, -2, 127, 127, -128], np.int8))


@pytest.mark.parametrize("dst", [jnp.int32, jnp.uint32], ids=str)
def test_float_to_32bit_int_saturates_at_the_exact_limits(dst):
  """XLA's convert (and JAX's interpret mode): 3e9 -> INT32_MAX, not INT32_MIN. In float32 the limit
  2**31 - 1 rounds to 2**31, whose NumPy cast wraps: a clip done in float32 gave INT32_MIN."""
  x = np.array([[np.nan, 3e9, -3e9, np.inf, -np.inf, 2147483520.0, 4294967040.0, -1.5]] * 8,
               np.float32)
  x = np.tile(x, (1, 16))
  out, _ = apply(lambda a: a.astype(dst), x, out_dtype=dst)
  info = np.iinfo(dst)
  expected = {jnp.int32: [0, info.max, info.min, info.max, info.min, 2147483520, info.max, -1],
              jnp.uint32: [0, 3000000000, 0, info.max, 0, 2147483520, 4294967040, 0]}[dst]
  np.testing.assert_array_equal(out[0, :8], np.array(expected, dst))


def test_host_64bit_operands_are_narrowed_like_jax():
  x = np.arange(8 * 128, dtype=np.float64).reshape(8, 128)
  out, d = apply(lambda a: a * 2, x, out_dtype=np.float32)
  assert d == np.float32 and out.dtype == np.float32
  np.testing.assert_array_equal(out, (x * 2).astype(np.float32))
  i = np.arange(8 * 128, dtype=np.int64).reshape(8, 128)
  out, d = apply(lambda a: a + 1, i, out_dtype=np.int32)
  assert d == np.int32
  np.testing.assert_array_equal(out, i + 1)


def test_ml_dtypes_names_are_reexported():
  assert jnp.bfloat16 == np.dtype(ml_dtypes.bfloat16)
  assert jnp.float8_e4m3fn == np.dtype(ml_dtypes.float8_e4m3fn)
  assert jnp.float8_e5m2 == np.dtype(ml_dtypes.float8_e5m2)
  s = pl.ShapeDtypeStruct((2, 3), "bfloat16")
  assert s.shape == (2, 3) and s.dtype == jnp.bfloat16
  assert pltpu.VMEM((8, 128), jnp.int8).dtype == np.int8


PAIR_DTYPES = [jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8, jnp.int16, jnp.int32,
               jnp.uint8, jnp.uint32, jnp.bool_]


def test_promotion_is_symmetric_and_matches_in_kernel_ops():
  for a in PAIR_DTYPES:
    for b in PAIR_DTYPES:
      try:
        ab = jnp.promote_types(a, b)
      except pl.ShapeError:
        with pytest.raises(pl.ShapeError, match="Type promotion error"):
          jnp.promote_types(b, a)
        continue
      assert jnp.promote_types(b, a) == ab, (a, b)
      assert jnp.result_type(np.zeros(2, a), np.zeros(2, b)) == ab
      # a type never demotes: both operands convert to the result exactly or the lattice says so
      assert ab in (np.dtype(a), np.dtype(b), jnp.int16, jnp.int32, jnp.float32), (a, b, ab)
  assert jnp.result_type(np.zeros(2, jnp.bfloat16), 1.0) == jnp.bfloat16
  assert jnp.result_type(np.zeros(2, jnp.int8), 1.0) == jnp.float32
  assert jnp.result_type(1, 2.0) == jnp.float32 and jnp.result_type(1) == jnp.int32


def test_issubdtype_knows_tpu_types():
  for d in (jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn, jnp.float8_e5m2):
    assert jnp.issubdtype(d, jnp.floating) and jnp.issubdtype(d, jnp.inexact)
    assert not jnp.issubdtype(d, jnp.integer)
  for d in (jnp.int8, jnp.int32):
    assert jnp.issubdtype(d, jnp.signedinteger) and not jnp.issubdtype(d, jnp.floating)
  assert jnp.issubdtype(jnp.uint8, jnp.unsignedinteger) and not jnp.issubdtype(jnp.uint8, jnp.signedinteger)
  assert jnp.issubdtype(jnp.bfloat16, jnp.bfloat16) and not jnp.issubdtype(jnp.bfloat16, jnp.float32)
  assert not jnp.issubdtype(jnp.bool_, jnp.integer)


def _b11_values():
  """Every finite float8_e4m3b11fnuz value (0x80 is its only NaN), ascending, as float32."""
  v = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3b11fnuz).astype(np.float32)
  return np.unique(v[np.isfinite(v)])


@pytest.mark.parametrize("chip", ["v5e", "v5p", "v6e"])
def test_float8_e4m3b11fnuz_is_a_kernel_dtype_where_the_chip_has_it(chip):
  """[tpu_info] is_matmul_supported takes float8_e4m3b11fnuz on v5e / v5p / v6e: operands of it load,
  convert (as ml_dtypes rounds) and store bit-exactly."""
  b11 = jnp.float8_e4m3b11fnuz
  vals = _b11_values()
  x = np.resize(vals, (8, 128)).astype(b11)
  y = np.linspace(-40, 40, 8 * 128, dtype=np.float32).reshape(8, 128)

  def kernel(x_ref, y_ref, o_ref, c_ref):
    o_ref[...] = x_ref[...].astype(jnp.float32) * 2
    c_ref[...] = y_ref[...].astype(b11)
  with pl.virtual_tpu(chip):
    out, conv = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct(x.shape, jnp.float32),
                                                  pl.ShapeDtypeStruct(y.shape, b11)))(x, y)
  np.testing.assert_array_equal(out, np.resize(vals, (8, 128)) * 2)
  assert conv.dtype == np.dtype(b11)
  np.testing.assert_array_equal(conv.view(np.uint8), y.astype(b11).view(np.uint8))   # overflow: NaN


@pytest.mark.parametrize("chip", ["v4", "7x"])
def test_float8_e4m3b11fnuz_is_refused_on_chips_without_it(chip):
  x = np.zeros((8, 128), ml_dtypes.float8_e4m3b11fnuz)
  with pl.virtual_tpu(chip), pytest.raises(
      pl.ShapeError, match=rf"args\[0\] has dtype float8_e4m3b11fnuz, which TPU {chip} kernels do not "
                           rf"support .*v5e, v5p, v6e have it"):
    pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...].astype(jnp.float32)),
                   out_shape=pl.ShapeDtypeStruct(x.shape, jnp.float32))(x)

  def cast(x_ref, o_ref):   # a cast inside the kernel too
    o_ref[...] = x_ref[...].astype(jnp.float8_e4m3b11fnuz).astype(jnp.float32)
  with pl.virtual_tpu(chip), pytest.raises(pl.ShapeError, match=rf"astype .*which TPU {chip} kernels"):
    pl.pallas_call(cast, out_shape=pl.ShapeDtypeStruct(x.shape, jnp.float32))(x.astype(np.float32))
