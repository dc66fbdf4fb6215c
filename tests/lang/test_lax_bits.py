"""palace.lax bit counts, nextafter and reduce_precision inside kernels (palace's own path), against
NumPy references; the JAX path is compared with JAX itself in tests/jax_backend/test_vs_interpret.py."""
import numpy as np
import pytest

import palace as pl
from palace import lax
from palace import tpu as pltpu
from palace import ShapeError, UnsupportedError, UsageError


def _run(fn, *args, out_dtype=None):
  def kernel(*refs):
    refs[-1][...] = fn(*[r[...] for r in refs[:-1]])
  dtype = out_dtype or args[0].dtype
  with pl.virtual_tpu("v5e"):
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(args[0].shape, dtype))(*args)


def _ref_bit_length(v):
  bits = 8 * v.dtype.itemsize
  u = v.view({8: np.uint8, 16: np.uint16, 32: np.uint32}[bits]).ravel()
  return np.array([int(x).bit_length() for x in u]).reshape(v.shape), bits


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int8, np.int16])
def test_clz_and_population_count_on_every_bit_pattern_kind(dtype):
  info = np.iinfo(dtype)
  rng = np.random.default_rng(5)
  edge = np.array([0, 1, info.max, info.min, 2, 3, -1 if info.min else 255, 64], dtype=np.int64)
  v = np.concatenate([edge, rng.integers(info.min, info.max, 1016, endpoint=True)]).astype(dtype)
  v = v.reshape(8, 128)
  length, bits = _ref_bit_length(v)
  np.testing.assert_array_equal(_run(lax.clz, v), (bits - length).astype(dtype))
  counts = np.array([bin(int(x)).count("1") for x in v.view(np.dtype(f"u{v.dtype.itemsize}")).ravel()])
  np.testing.assert_array_equal(_run(lax.population_count, v), counts.reshape(v.shape).astype(dtype))


def test_bit_counts_reject_floats_and_scalar_population_count():
  with pytest.raises(ShapeError, match="lax.clz takes integers; got float32"):
    _run(lax.clz, np.ones((8, 128), np.float32))

  def kernel(x_ref, o_ref):
    o_ref[0] = lax.population_count(x_ref[0])
  smem = pl.BlockSpec(memory_space=pltpu.SMEM)
  with pl.virtual_tpu("v5e"), pytest.raises(UnsupportedError, match="population_count of a scalar"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((2,), np.int32), in_specs=[smem],
                   out_specs=smem)(np.array([3, 4], np.int32))


def test_nextafter_steps_one_ulp_and_canonicalises_nan():
  x = np.tile(np.array([0.0, -0.0, 1.0, -1.0, 1e-45, np.inf, np.nan, 3.0], np.float32), (8, 16))
  y = np.tile(np.array([1.0, -1.0, 2.0, 0.0, 0.0, 0.0, 1.0, np.nan], np.float32), (8, 16))
  got = _run(lax.nextafter, x, y)
  want = np.nextafter(x, y)
  want[np.isnan(x) | np.isnan(y)] = np.float32(np.nan)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  assert got.view(np.uint32)[0, 6] == 0x7FC00000


def test_nextafter_takes_float32_only():
  import ml_dtypes
  x = np.ones((8, 128), ml_dtypes.bfloat16)
  with pytest.raises(UnsupportedError, match="lax.nextafter of bfloat16"):
    _run(lax.nextafter, x, x)


def test_reduce_precision_rounds_to_nearest_even_and_clamps_the_exponent():
  x = np.zeros((8, 128), np.float32)
  x[0, :6] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, 70000.0, 1e-6, -1e-9, np.inf]
  x[1, :2] = [np.float32(1.0) + np.float32(2**-10), -65504.0]
  got = _run(lambda v: lax.reduce_precision(v, 5, 2), x)   # e5m2 (float8_e5m2's range and precision)
  # ties to even: 1 + 2^-8 -> 1; 1 + 3*2^-8 -> 1 + 2^-7... at 2 mantissa bits the step is 0.25: both -> 1
  assert list(got[0, :6]) == [1.0, 1.0, np.inf, 0.0, -0.0, np.inf]
  assert np.signbit(got[0, 4])
  assert list(got[1, :2]) == [1.0, -np.inf]   # 65504 rounds to 65536 at 2 mantissa bits: past e5's max


def test_reduce_precision_checks_its_arguments():
  x = np.ones((8, 128), np.float32)
  with pytest.raises(UsageError, match="exponent_bits"):
    _run(lambda v: lax.reduce_precision(v, 0, 3), x)
  import ml_dtypes
  with pytest.raises(UnsupportedError, match="reduce_precision of bfloat16"):
    _run(lambda v: lax.reduce_precision(v, 5, 2), x.astype(ml_dtypes.bfloat16))
