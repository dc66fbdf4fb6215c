"""`palace.numpy` inside kernels against NumPy references."""
import builtins
import math

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from lang_helpers import apply, dtype_in_kernel


@pytest.fixture
def x(rng):
  return rng.uniform(0.1, 3.0, (16, 128)).astype(np.float32)


@pytest.fixture
def y(rng):
  return rng.uniform(-3.0, 3.0, (16, 128)).astype(np.float32)


def test_creation_functions():
  def fn(v):
    z = jnp.zeros((16, 128), jnp.float32) + jnp.ones_like(v) * 2 + jnp.full((16, 128), 3.0)
    z = z + jnp.zeros_like(v) + jnp.full_like(v, 0.5) + jnp.ones((16, 128))
    assert jnp.zeros((2, 3)).dtype == jnp.float32 and jnp.full((2,), 1).dtype == jnp.int32
    assert jnp.zeros((2,), jnp.bfloat16).dtype == jnp.bfloat16
    assert jnp.full_like(v, 1, dtype=jnp.int8).dtype == jnp.int8
    return z

  v = np.zeros((16, 128), np.float32)
  out, _ = apply(fn, v)
  np.testing.assert_array_equal(out, np.full((16, 128), 6.5, np.float32))


def test_arange_and_iota_helpers():
  def fn(v):
    a = jnp.arange(128)
    assert a.dtype == jnp.int32 and jnp.arange(0.0, 4.0).dtype == jnp.float32
    rows = lax.broadcasted_iota(jnp.int32, (16, 128), 0)
    cols = lax.broadcasted_iota(jnp.int32, (16, 128), 1)
    b = jnp.arange(2, 18, 1, dtype=jnp.float32).reshape(16, 1)
    i = lax.iota(jnp.int32, 128)
    return (rows * 1000 + cols + a + i).astype(jnp.float32) + b

  out, _ = apply(fn, np.zeros((16, 128), np.float32))
  r, c = np.mgrid[0:16, 0:128]
  np.testing.assert_array_equal(out, (r * 1000 + 3 * c).astype(np.float32) + np.arange(2, 18)[:, None])


UNARY = [
    ("exp", jnp.exp, np.exp), ("log", jnp.log, np.log), ("tanh", jnp.tanh, np.tanh),
    ("sqrt", jnp.sqrt, np.sqrt), ("rsqrt", jnp.rsqrt, lambda v: 1 / np.sqrt(v)),
    ("abs", jnp.abs, np.abs), ("sin", jnp.sin, np.sin), ("cos", jnp.cos, np.cos),
    ("neg", lambda v: -v, np.negative), ("square", jnp.square, np.square),
    ("log1p", jnp.log1p, np.log1p), ("floor", jnp.floor, np.floor),
    ("logistic", lax.logistic, lambda v: 1 / (1 + np.exp(-v))),
    ("erf", jnp.erf if hasattr(jnp, "erf") else lax.erf, np.vectorize(math.erf)),
    ("reciprocal", jnp.reciprocal, np.reciprocal),
]


@pytest.mark.parametrize("name,fn,ref", UNARY, ids=[u[0] for u in UNARY])
def test_unary_math_f32(name, fn, ref, x):
  out, d = apply(fn, x)
  assert d == np.float32
  np.testing.assert_allclose(out, ref(x.astype(np.float64)).astype(np.float32), rtol=2e-6, atol=1e-6)


def test_unary_math_bf16_rounds_f32_result(x):
  xb = x.astype(jnp.bfloat16)
  out, d = apply(jnp.exp, xb)
  assert d == jnp.bfloat16
  np.testing.assert_array_equal(out, np.exp(xb.astype(np.float32)).astype(jnp.bfloat16))


def test_int_math_gives_float32():
  i = np.arange(1, 16 * 128 + 1, dtype=np.int32).reshape(16, 128)
  out, d = apply(jnp.sqrt, i, out_dtype=np.float32)
  assert d == np.float32
  np.testing.assert_allclose(out, np.sqrt(i).astype(np.float32), rtol=1e-7)


def test_binary_and_where(x, y):
  def fn(a, b):
    m = jnp.maximum(a, b) - jnp.minimum(a, b)
    w = jnp.where(b > 0, a, -a) + jnp.where(a > 1.5, 1.0, b)
    return m * 2 + w / a - a ** 2 + (a // 0.7) + lax.select(b < a, a, b)

  out, _ = apply(fn, x, y)
  ref = ((np.maximum(x, y) - np.minimum(x, y)) * 2 + (np.where(y > 0, x, -x) + np.where(x > 1.5, 1.0, y)) / x
         - x ** 2 + np.floor_divide(x, np.float32(0.7)) + np.where(y < x, x, y))
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_comparisons_and_logical(x, y):
  def fn(a, b):
    c = ((a > b) & (a <= 2.0)) | ~(b != b) & (a == a)
    return jnp.logical_and(c, jnp.logical_not(a < 0.5)).astype(jnp.int32)

  out, _ = apply(fn, x, y, out_dtype=np.int32)
  ref = np.logical_and(((x > y) & (x <= 2)) | (~(y != y) & (x == x)), ~(x < 0.5)).astype(np.int32)
  np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("red", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(red, axis, keepdims, y):
  ref = getattr(np, red)(y.astype(np.float64), axis=axis, keepdims=keepdims).astype(np.float32)
  shape = np.shape(ref)

  def fn(v):
    r = getattr(jnp, red)(v, axis=axis, keepdims=keepdims)
    m = getattr(v, red)(axis=axis, keepdims=keepdims)   # method form
    assert r.shape == shape == m.shape and r.dtype == jnp.float32
    return jnp.broadcast_to(r, (16, 128)) if shape == () else r

  out, _ = apply(fn, y, out_shape=shape if shape else (16, 128))
  np.testing.assert_allclose(out if shape else out[0, 0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin(axis, keepdims, y):
  ref = np.argmax(y, axis=axis, keepdims=keepdims).astype(np.int32)
  out, d = apply(lambda v: jnp.argmax(v, axis=axis, keepdims=keepdims), y, out_shape=ref.shape,
                 out_dtype=np.int32)
  assert d == jnp.int32
  np.testing.assert_array_equal(out, ref)
  ref = np.argmin(y, axis=axis, keepdims=keepdims).astype(np.int32)
  out, _ = apply(lambda v: v.argmin(axis=axis, keepdims=keepdims), y, out_shape=ref.shape,
                 out_dtype=np.int32)
  np.testing.assert_array_equal(out, ref)


def test_int_reductions_and_mean_dtype():
  i = np.arange(16 * 128, dtype=np.int32).reshape(16, 128) % 7
  assert dtype_in_kernel(lambda v: jnp.sum(v, axis=0), i) == (np.int32, (128,))
  assert dtype_in_kernel(lambda v: jnp.mean(v, axis=1), i) == (np.float32, (16,))
  assert dtype_in_kernel(lambda v: jnp.sum(v > 3, axis=1), i) == (np.int32, (16,))
  out, _ = apply(lambda v: jnp.sum(v, axis=0, keepdims=True), i, out_shape=(1, 128))
  np.testing.assert_array_equal(out, i.sum(0, keepdims=True))


def test_bf16_sum_accumulates_in_f32():
  v = np.full((16, 128), 1.0 + 2 ** -7, dtype=np.float32).astype(np.dtype("bfloat16"))
  out, d = apply(lambda a: jnp.sum(a, axis=1, keepdims=True), v, out_shape=(16, 1))
  assert d == jnp.bfloat16
  np.testing.assert_array_equal(out, v.astype(np.float32).sum(1, keepdims=True).astype(v.dtype))


def test_shape_ops(y):
  def fn(v):
    a = v.reshape(8, 256)
    b = jnp.reshape(a, (16, 128))
    c = jnp.transpose(v[0:8, 0:8]) + v[0:8, 0:8].T + v[0:8, 0:8].transpose(1, 0)
    d = jnp.concatenate([v[:, :64], v[:, 64:]], axis=1) + jnp.concatenate([v[8:], v[:8]], axis=0)
    e = jnp.broadcast_to(v[0:1], (16, 128)) + pl.broadcast_to(v[:, 0:1], (16, 128))
    f = jnp.broadcast_to(v[3], (16, 128))
    out = b + d + e + f
    return out.at[0:8, 0:8].set(c) if hasattr(out, "at") else jnp.concatenate(
        [jnp.concatenate([c, out[0:8, 8:]], axis=1), out[8:]], axis=0)

  out, _ = apply(fn, y)
  ref = y + (y + np.concatenate([y[8:], y[:8]])) + (y[0:1] + y[:, 0:1]) + y[3]
  ref[0:8, 0:8] = 3 * y[0:8, 0:8].T
  np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_3d_transpose_and_reshape(rng):
  v = rng.standard_normal((4, 8, 128)).astype(np.float32)
  out, _ = apply(lambda a: jnp.transpose(a, (1, 0, 2)).reshape(8, 512), v, out_shape=(8, 512))
  np.testing.assert_array_equal(out, v.transpose(1, 0, 2).reshape(8, 512))
  out, _ = apply(lambda a: jnp.expand_dims(a.sum(0), 0).squeeze(0), v, out_shape=(8, 128))
  np.testing.assert_allclose(out, v.sum(0), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dot_matmul_einsum_operator(dtype, rng):
  # values exact in bf16: the MXU rounds float32 operands to bf16 at the default precision
  a = rng.standard_normal((16, 128)).astype(jnp.bfloat16).astype(dtype)
  b = rng.standard_normal((128, 128)).astype(jnp.bfloat16).astype(dtype)
  f32 = jnp.float32
  ref = a.astype(np.float32) @ b.astype(jnp.bfloat16).astype(np.float32)

  def fn(u, v):
    r1 = jnp.dot(u, v, preferred_element_type=f32)
    r2 = jnp.matmul(u, v, preferred_element_type=f32)
    r3 = jnp.einsum("mk,kn->mn", u, v, preferred_element_type=f32)
    r4 = lax.dot_general(u, v, (((1,), (0,)), ((), ())), preferred_element_type=f32)
    r5 = (u @ v).astype(f32) if dtype == jnp.float32 else r1   # bf16 @ bf16 -> bf16: rejected below
    assert r1.dtype == f32
    r6 = jnp.einsum("kn,mk->nm", v, u, preferred_element_type=f32).T   # transposed output
    return r1 + r2 + r3 + r4 + r6 - 4 * r5 + 4 * r5

  out, _ = apply(fn, a, b, out_dtype=np.float32)
  np.testing.assert_allclose(out, 5 * ref, rtol=1e-4, atol=1e-3)


def test_dot_general_transposed_rhs_and_batched(rng):
  a = rng.standard_normal((2, 8, 128)).astype(jnp.bfloat16).astype(np.float32)
  b = rng.standard_normal((2, 16, 128)).astype(jnp.bfloat16).astype(np.float32)
  out, _ = apply(lambda u, v: lax.dot_general(u, v, (((2,), (2,)), ((0,), (0,)))), a, b,
                 out_shape=(2, 8, 16))
  np.testing.assert_allclose(out, np.einsum("bmk,bnk->bmn", a, b), rtol=1e-5, atol=1e-5)
  out, _ = apply(lambda u, v: jnp.einsum("bmk,bnk->bmn", u, v), a, b, out_shape=(2, 8, 16))
  np.testing.assert_allclose(out, np.einsum("bmk,bnk->bmn", a, b), rtol=1e-5, atol=1e-5)


def test_dot_general_dimension_numbers_are_checked_on_every_call(rng):
  """dot_general memoises its normalised dimension numbers per (immutable) object; equal values of
  another type (1.0 == 1, True == 1) must still be refused, and one object must serve operands of
  another rank."""
  a = rng.standard_normal((8, 128)).astype(jnp.bfloat16).astype(np.float32)
  b = rng.standard_normal((128, 16)).astype(jnp.bfloat16).astype(np.float32)
  dims = (((1,), (0,)), ((), ()))
  for _ in range(2):
    out, _ = apply(lambda u, v: lax.dot_general(u, v, dims), a, b, out_shape=(8, 16))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
  for bad in ((((1.0,), (0,)), ((), ())), (((True,), (0,)), ((), ()))):
    with pytest.raises(pl.ShapeError, match="dot_general dimension_numbers"):
      apply(lambda u, v: lax.dot_general(u, v, bad), a, b, out_shape=(8, 16))
  neg = (((-1,), (-2,)), ((), ()))   # (normalised per operand rank: the last dim of each)
  a3, b3 = a.reshape(1, 8, 128), b.reshape(1, 128, 16)
  out, _ = apply(lambda u, v: lax.dot_general(u, v, neg), a, b, out_shape=(8, 16))
  np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
  out, _ = apply(lambda u, v: lax.dot_general(u, v, neg), a3, b3, out_shape=(1, 8, 1, 16))
  np.testing.assert_allclose(out, np.einsum("xmk,ykn->xmyn", a3, b3), rtol=1e-5, atol=1e-4)


def test_bf16_matmul_with_a_bf16_result_is_rejected_as_mosaic_does():
  a = np.ones((8, 128), jnp.bfloat16)
  with pytest.raises(pl.UnsupportedError, match="acc to be 32-bit.*Fix: pass preferred_element_type"):
    apply(lambda u, v: u @ v, a, a.T.copy(), out_shape=(8, 8), out_dtype=jnp.bfloat16)
  with pytest.raises(pl.UnsupportedError, match="precision=HIGH"):
    apply(lambda u, v: jnp.dot(u, v, precision="high"), a, a.T.copy(), out_shape=(8, 8))


def test_host_side_functions_return_numpy_with_jax_defaults():
  z = jnp.zeros((2, 3))
  assert isinstance(z, np.ndarray) and z.dtype == np.float32
  assert jnp.arange(5).dtype == np.int32
  assert jnp.asarray(np.arange(3, dtype=np.int64)).dtype == np.int32
  assert jnp.float32(3).dtype == np.float32 and jnp.bfloat16(1.5).dtype == jnp.bfloat16
  assert np.dtype(jnp.bfloat16).name == "bfloat16" and jnp.finfo(jnp.bfloat16).bits == 16
  assert jnp.iinfo(jnp.int8).max == 127


@pytest.mark.parametrize("src,want", [(jnp.int8, jnp.int32), (jnp.int16, jnp.int32), (jnp.uint8, jnp.uint32),
                                      (jnp.bool_, jnp.int32), (jnp.int32, jnp.int32)], ids=str)
def test_integer_sums_promote_like_jax(src, want):
  i = (np.arange(16 * 128).reshape(16, 128) % 100).astype(src)
  d, shape = dtype_in_kernel(lambda v: jnp.sum(v, axis=1), i)
  assert (d, shape) == (np.dtype(want), (16,))
  out, _ = apply(lambda v: jnp.sum(v, axis=1, keepdims=True), i, out_shape=(16, 1), out_dtype=want)
  np.testing.assert_array_equal(out, i.astype(np.int64).sum(1, keepdims=True))   # no int8 wrap-around


def test_cumsum_is_rejected_on_a_tensorcore_as_mosaic_does(rng):
  # a TPU v5e: "Unimplemented primitive in Pallas TPU lowering for tc: cumsum"
  # (benchmarks/hw/data/v5e-limits-2026-12-05.jsonl, probe cumsum_last_axis)
  f = rng.standard_normal((8, 128)).astype(np.float32)
  with pytest.raises(NotImplementedError, match=r"jnp.cumsum at grid point \(\) on chip 0 core 0 .*"
                                                r"no cumulative sum on a TensorCore .*Fix: "):
    apply(lambda a: jnp.cumsum(a, axis=1), f)


def test_narrow_float_to_int_saturates_and_maps_nan_to_zero():
  x = np.array([np.nan, 1e4, -1e4, 2.5, -2.5, np.inf, -np.inf, 100.0] * 16, np.float32).reshape(1, 128)
  x = np.repeat(x, 8, 0).astype(jnp.bfloat16)
  out, _ = apply(lambda a: a.astype(jnp.int8), x, out_dtype=jnp.int8)
  np.testing.assert_array_equal(out[0, :8], [0, 127, -128, 2, -2, 127, -128, 100])
  out, _ = apply(lambda a: a.astype(jnp.uint8), x, out_dtype=jnp.uint8)
  np.testing.assert_array_equal(out[0, :8], [0, 255, 0, 2, 0, 255, 0, 100])


def test_value_at_updates(y):
  def fn(v):
    w = v.at[0].set(1.0).at[1:3, :64].add(10.0).at[3].multiply(v[4])
    w = w.at[5].min(0.0).at[6].max(jnp.zeros((128,), jnp.float32))
    assert w.at[7].get().shape == (128,)
    return w

  out, _ = apply(fn, y)
  ref = y.copy()
  ref[0] = 1
  ref[1:3, :64] += 10
  ref[3] *= y[4]
  ref[5] = np.minimum(ref[5], 0)
  ref[6] = np.maximum(ref[6], 0)
  np.testing.assert_array_equal(out, ref)


def _busy(kernel, *xs, out_shape=(8, 128)):
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(out_shape, np.float32))(*xs)
  return tpu.reports[-1].unit_busy_cycles


def test_every_op_is_charged_to_its_unit(y):
  def base(x_ref, o_ref):
    o_ref[...] = x_ref[:8]

  def with_ops(x_ref, o_ref):
    v = x_ref[...]
    e = jnp.exp(v)                                   # EUP
    s = jnp.sum(e, axis=-1, keepdims=True)           # cross-lane (XLU)
    t = (e + v) * 2.0                                # VPU
    m = jnp.dot(v[:8], jnp.ones((128, 128), jnp.float32), preferred_element_type=jnp.float32)   # MXU
    o_ref[...] = t[:8] + s[:8] + m

  b, w = _busy(base, y), _busy(with_ops, y)
  assert w["eup"] > b["eup"] and w["xlu"] > b["xlu"] and w["vpu"] >= b["vpu"] + 2 and w["mxu"] > b["mxu"] == 0


def _scalar_path_vs_array_rule(fn, dtype):
  """(a, b, fn on the arrays a, b): every pair of a dtype's edge values, after checking that `fn` on
  each 0-d pair (its Python-int path) gives exactly what it gives on the arrays (the array rule)."""
  info = np.iinfo(dtype)
  vals = sorted(v for v in {info.min, info.min + 1, -7, -3, -2, -1, 0, 1, 2, 3, 7, info.max - 1, info.max}
                if info.min <= v <= info.max)
  a = np.repeat(np.array(vals, dtype), len(vals))
  b = np.tile(np.array(vals, dtype), len(vals))
  want = fn(a, b)   # the array rule
  got = [fn(np.array(x, dtype), np.array(y, dtype)) for x, y in zip(a, b)]
  assert all(g.dtype == np.dtype(dtype) and g.shape == () for g in got)
  np.testing.assert_array_equal(np.array(got, dtype), want)
  return a, b, want


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32])
def test_integer_div_of_two_scalars_equals_the_vector_rule_on_edge_values(dtype):
  # lax.div on 0-d operands of up to 32 bits takes the Python-int path (div_ints, which palace.jax's
  # fused scalar code shares); it must give what the array path gives: x / 0 = -1 (all ones),
  # INT_MIN / -1 = INT_MIN, quotients rounded toward zero
  from palace._src.lang.numpy_elementwise import int_div
  _scalar_path_vs_array_rule(int_div, dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_rem_of_two_scalars_equals_the_vector_rule_on_edge_values(dtype):
  # lax.rem on 0-d operands (scalar index arithmetic) takes a Python-int path; it must give exactly
  # what the array path gives: the dividend's sign, x % 0 = x, INT_MIN % -1 = 0, no overflow
  from palace._src.lang.numpy_elementwise import int_rem
  a, b, want = _scalar_path_vs_array_rule(int_rem, dtype)
  # and the array rule against the definition on Python ints (C's truncating remainder)
  ref = [x if y == 0 else (1 if x >= 0 else -1) * (builtins.abs(x) % builtins.abs(y))
         for x, y in zip(a.tolist(), b.tolist())]
  np.testing.assert_array_equal(want, np.array(ref).astype(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64])
def test_integer_division_by_one_divisor_equals_the_element_wise_rule(dtype):
  """lax.div / lax.rem / jnp's // and % of a block by one divisor (a 0-d value or a broadcast literal,
  `lax.rem(x, 5)`) take a whole-block path (numpy_elementwise._one_divisor); it must give exactly what
  the element-wise rule gives for that divisor repeated (x / 0 = -1, x % 0 = x, INT_MIN / -1 =
  INT_MIN, quotients toward zero, jnp's x // 0 and x % 0), for every edge divisor and dividend."""
  from palace._src.lang import numpy_elementwise as ne
  info = np.iinfo(dtype)
  edges = {info.min, info.min + 1, -7, -3, -2, -1, 0, 1, 2, 3, 5, 7, 13, 255, info.max - 1, info.max}
  edges = sorted(v for v in edges if info.min <= v <= info.max)
  rng = np.random.default_rng(7)
  a = np.concatenate([np.array(edges, dtype), rng.integers(info.min, info.max, 256 - len(edges),
                                                           dtype=dtype, endpoint=True)]).reshape(8, 32)
  for fn in (ne.int_div, ne.int_rem, ne._floor_div, ne._mod):
    for v in edges:
      want = fn(a, np.full(a.shape, v, dtype))   # the element-wise rule (a divisor per element)
      for b in (np.array(v, dtype), np.broadcast_to(np.array(v, dtype), a.shape)):
        assert ne._one_divisor(a, b) == v
        got = fn(a, b)
        assert got.dtype == np.dtype(dtype) and got.shape == a.shape, (fn.__name__, v)
        np.testing.assert_array_equal(got, want, err_msg=f"{fn.__name__} by {v}")


def test_full_with_a_scalar_or_a_row_fill_value_in_a_kernel():
  """jnp.full's value is a read-only zero-stride view: of a scalar (bf16 too), or NumPy broadcasting
  of an array fill value (a row repeated down the rows, not its first element everywhere)."""
  import ml_dtypes

  def kernel(x_ref, o_ref, b_ref):
    o_ref[...] = jnp.full((8, 128), x_ref[0, :]) + jnp.zeros((8, 128)) + jnp.full((8, 128), 2.0)
    b_ref[...] = jnp.full((8, 128), 1.5, jnp.bfloat16)

  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  with pl.virtual_tpu("v5e"):
    o, b = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct((8, 128), np.float32),
                                             pl.ShapeDtypeStruct((8, 128), ml_dtypes.bfloat16)))(x)
  np.testing.assert_array_equal(o, np.broadcast_to(x[0] + 2, (8, 128)))
  np.testing.assert_array_equal(b.astype(np.float32), np.full((8, 128), 1.5, np.float32))
