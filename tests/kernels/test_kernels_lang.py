"""Tutorial-style kernels against NumPy: tiled matmuls (bf16 / int8 / fp8 numerics), softmax, a
row-block reduction and a scalar-prefetch gather."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from matmul_kernel import matmul_kernel as _matmul_kernel

BF16 = jnp.bfloat16


def matmul(x, y, *, bm=128, bk=128, bn=128, acc_dtype=jnp.float32, out_dtype=None):
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      _matmul_kernel,
      out_shape=pl.ShapeDtypeStruct((m, n), out_dtype or acc_dtype),
      grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


@pytest.mark.parametrize("bm,bk,bn", [(128, 128, 128), (64, 256, 128), (256, 128, 256)])
def test_bf16_matmul_accumulates_in_f32(rng, bm, bk, bn):
  x = rng.standard_normal((256, 512)).astype(BF16)
  y = rng.standard_normal((512, 256)).astype(BF16)
  z = matmul(x, y, bm=bm, bk=bk, bn=bn)
  ref = x.astype(np.float64) @ y.astype(np.float64)   # bf16 products are exact; f32 sums
  np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-4)
  # a bf16 accumulator would lose ~3 significant digits: make sure that is not what happened
  acc_bf16 = sum((x[:, k:k + bk].astype(np.float32) @ y[k:k + bk].astype(np.float32)).astype(BF16)
                 .astype(np.float32) for k in range(0, 512, bk))
  assert np.abs(z - ref).max() < 0.05 * np.abs(acc_bf16 - ref).max()


def test_bf16_matmul_bf16_output_rounds_once(rng):
  x = rng.standard_normal((128, 256)).astype(BF16)
  y = rng.standard_normal((256, 128)).astype(BF16)
  z = matmul(x, y, bk=128, out_dtype=BF16)
  assert z.dtype == BF16
  ref = (x.astype(np.float64) @ y.astype(np.float64)).astype(np.float32).astype(BF16)
  # f32 accumulation then one rounding: within one bf16 ulp of the exact result
  np.testing.assert_allclose(z.astype(np.float32), ref.astype(np.float32), rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("k", [256, 2048])
def test_int8_matmul_is_exact_with_int32_accumulation(rng, k):
  x = rng.integers(-128, 128, (64, k)).astype(np.int8)
  y = rng.integers(-128, 128, (k, 128)).astype(np.int8)
  x[0, :] = -128
  y[:, 0] = -128                               # 2048 * 2^14 = 2^25: beyond float32's exact range
  z = matmul(x, y, bm=64, bk=128, bn=128, acc_dtype=jnp.int32)
  assert z.dtype == np.int32
  ref = x.astype(np.int64) @ y.astype(np.int64)
  np.testing.assert_array_equal(z, ref)
  assert z[0, 0] == 128 * 128 * k


def test_int8_dot_single_block_large_k_exact(rng):
  x = rng.integers(-128, 128, (8, 4096)).astype(np.int8)
  y = rng.integers(-128, 128, (4096, 128)).astype(np.int8)
  x[:] = -128
  y[:] = -127

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.int32)

  z = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32))(x, y)
  np.testing.assert_array_equal(z, x.astype(np.int64) @ y.astype(np.int64))


def test_uint8_times_int8_matmul_is_rejected_as_on_the_chip(rng):
  """A TPU v5e's Mosaic rejects unsigned matmul operands (benchmarks/hw/data/v5e-limits-2026-12-05)."""
  x = rng.integers(0, 256, (8, 512)).astype(np.uint8)
  y = rng.integers(-128, 128, (512, 128)).astype(np.int8)

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.int32)

  with pytest.raises(pl.UnsupportedError, match="dtype uint8 .*unsigned integer.*Fix: cast"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32))(x, y)


@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2], ids=str)
def test_fp8_matmul_accumulates_in_f32(rng, dtype):
  x = rng.uniform(-2, 2, (128, 256)).astype(dtype)
  y = rng.uniform(-2, 2, (256, 128)).astype(dtype)
  z = matmul(x, y, bk=128)
  np.testing.assert_allclose(z, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_ragged_matmul_edges(rng):
  x = rng.standard_normal((200, 256)).astype(np.float32)
  y = rng.standard_normal((256, 300)).astype(np.float32)
  z = matmul(x, y, bm=128, bk=256, bn=128)     # 200 and 300 are not multiples of 128
  bf = lambda a: a.astype(BF16).astype(np.float32)   # the MXU's default precision (docs/numerics.md)
  np.testing.assert_allclose(z, bf(x) @ bf(y), rtol=1e-4, atol=1e-4)


def test_row_softmax(rng):
  x = rng.standard_normal((64, 256)).astype(np.float32) * 4

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    e = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
                       in_specs=[pl.BlockSpec((8, 256), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 256), lambda i: (i, 0)))(x)
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_layernorm_bf16_io_f32_math(rng):
  x = rng.standard_normal((32, 512)).astype(BF16)
  g = rng.standard_normal((1, 512)).astype(np.float32)

  def kernel(x_ref, g_ref, o_ref):
    v = x_ref[...].astype(jnp.float32)
    mu = jnp.mean(v, axis=1, keepdims=True)
    var = jnp.mean(jnp.square(v - mu), axis=1, keepdims=True)
    o_ref[...] = ((v - mu) * lax.rsqrt(var + 1e-5) * g_ref[...]).astype(o_ref.dtype)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, BF16), grid=(4,),
                       in_specs=[pl.BlockSpec((8, 512), lambda i: (i, 0)),
                                 pl.BlockSpec((1, 512), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, 512), lambda i: (i, 0)))(x, g)
  v = x.astype(np.float64)
  ref = (v - v.mean(1, keepdims=True)) / np.sqrt(v.var(1, keepdims=True) + 1e-5) * g
  np.testing.assert_allclose(out.astype(np.float32), ref, rtol=2 ** -7, atol=2e-2)


def test_block_sparse_gather_matmul(rng):
  # Scalar prefetch: multiply only the listed row blocks of x (block-sparse LHS).
  x = rng.standard_normal((512, 128)).astype(np.float32)
  w = rng.standard_normal((128, 128)).astype(np.float32)
  rows = np.array([3, 0, 2], np.int32)

  def kernel(rows_ref, x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

  out = pl.pallas_call(
      kernel, out_shape=pl.ShapeDtypeStruct((3 * 128, 128), np.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(3,),
          in_specs=[pl.BlockSpec((128, 128), lambda i, r: (r[i], 0)),
                    pl.BlockSpec((128, 128), lambda i, r: (0, 0))],
          out_specs=pl.BlockSpec((128, 128), lambda i, r: (i, 0))))(rows, x, w)
  bf = lambda a: a.astype(BF16).astype(np.float32)   # the MXU's default precision (docs/numerics.md)
  ref = np.concatenate([bf(x[128 * r:128 * r + 128]) @ bf(w) for r in rows])
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
