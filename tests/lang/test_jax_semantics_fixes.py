"""JAX semantics that palace once got silently wrong (session 17's bug hunt against JAX 0.12's TPU
interpret mode): the expected values are JAX's, derived by hand below each test."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace._src.errors import ShapeError, UnsupportedError

from lang_helpers import apply, dtype_in_kernel

BF16 = jnp.bfloat16


def scalar(fn, x, dtype=np.float32):
  """fn(loaded x), a 0-d result, read back through a broadcast (8, 128) block."""
  out, _ = apply(lambda v: jnp.full((8, 128), fn(v), dtype), x, out_shape=(8, 128), out_dtype=dtype)
  return out[0, 0]


def test_a_python_float_meeting_bf16_is_rounded_to_bf16_first():
  # JAX converts the weak 3.3 to bf16 (3.296875) before comparing / subtracting: bf16(3.3) == 3.3
  x = np.full((16, 128), 3.3, BF16)
  eq, _ = apply(lambda v: (v == 3.3).astype(jnp.float32), x, out_dtype=np.float32)
  diff, _ = apply(lambda v: v - 3.3, x)
  assert eq.min() == 1.0 and float(np.abs(diff.astype(np.float32)).max()) == 0.0
  # 12.6875 * bf16(1.1) = 12.6875 * 1.1015625 = 13.976... -> bf16 14 (with 1.1 as f32: 13.9375)
  y = np.full((16, 128), 12.6875, BF16)
  prod, _ = apply(lambda v: v * 1.1, y)
  assert float(prod.astype(np.float32)[0, 0]) == 14.0


@pytest.mark.parametrize("fn", ["floor", "ceil", "trunc", "round"])
def test_rounding_functions_return_integers_unchanged(fn):
  x = np.full((8, 128), 16777217, np.int32)   # 2**24 + 1: not a float32
  x[0, :2] = [123456789, -7]
  out, dtype = apply(getattr(jnp, fn), x)
  assert dtype == np.int32 and np.array_equal(out, x)
  b = np.ones((8, 128), np.bool_)
  if fn != "round":   # JAX's round of bool fails (no finfo); floor / ceil / trunc return it
    assert apply(getattr(jnp, fn), b)[1] == np.bool_


def test_round_with_decimals_scales_in_the_dtype():
  # JAX: round(x * 10**d) / 10**d, each step in the operand's dtype
  x = np.array([1.2345, -2.5551, 0.125, 7.77777] * 32 * 8, np.float32).reshape(8, 128)
  out, _ = apply(lambda v: jnp.round(v, 2), x)
  f = np.float32(100)
  assert np.array_equal(out, np.round(x * f) / f)
  with pytest.raises(UnsupportedError, match="decimals=-1"):
    apply(lambda v: jnp.round(v, -1), np.ones((8, 128), np.int32))


def test_dynamic_slice_negative_starts_count_from_the_end():
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  # lax.dynamic_slice(x, (-3, 0), (2, 128)): rows 5 and 6 (then clamped: -20 -> -12 -> row 0)
  out, _ = apply(lambda v: lax.dynamic_slice(v, (jnp.int32(-3), 0), (2, 128)), x, out_shape=(2, 128))
  assert np.array_equal(out, x[5:7])
  out, _ = apply(lambda v: lax.dynamic_slice(v, (jnp.int32(-20), 0), (2, 128)), x, out_shape=(2, 128))
  assert np.array_equal(out, x[0:2])
  out, _ = apply(lambda v: lax.dynamic_slice(v, (jnp.int32(-3), 0), (2, 128), allow_negative_indices=False),
                 x, out_shape=(2, 128))
  assert np.array_equal(out, x[0:2])
  upd, _ = apply(lambda v: lax.dynamic_update_slice(v, jnp.full((2, 128), -1.0, jnp.float32),
                                                    (jnp.int32(-3), 0)), x)
  want = x.copy()
  want[5:7] = -1
  assert np.array_equal(upd, want)


def test_reductions_take_where_initial_and_promote_integers():
  x = np.arange(-64, 64, dtype=np.float32).reshape(8, 16)
  pos = x > 0
  assert scalar(lambda v: jnp.sum(v, where=v > 0), x) == x[pos].sum()
  assert scalar(lambda v: jnp.max(v, where=v < 0, initial=-1000.0), x) == -1.0
  assert scalar(lambda v: jnp.max(v, initial=100.0), x) == 100.0
  assert scalar(lambda v: jnp.sum(v, initial=10.0), x) == x.sum() + 10
  mean, _ = apply(lambda v: jnp.mean(v, axis=1, where=v > 0, keepdims=True), x, out_shape=(8, 1))
  assert np.array_equal(mean[4:, 0], np.array([x[i][x[i] > 0].mean() for i in range(4, 8)], np.float32))
  i8 = np.full((32, 128), 100, np.int8)   # 409,600 wraps to 0 in int8; 409,600 in int32
  assert scalar(lambda v: jnp.sum(v, promote_integers=False), i8, np.int8) == 0
  assert scalar(lambda v: jnp.sum(v), i8, np.int32) == 409600


def test_reductions_reject_what_they_do_not_take():
  x = np.ones((8, 128), np.float32)
  with pytest.raises(ShapeError, match="specify 'initial'"):
    scalar(lambda v: jnp.max(v, where=v > 0), x)
  with pytest.raises(UnsupportedError, match="jnp.sum got keyword.s. out"):
    scalar(lambda v: jnp.sum(v, out=None), x)
  with pytest.raises(UnsupportedError, match="jnp.argmax got keyword.s. where"):
    scalar(lambda v: jnp.argmax(v, where=v > 0), x, np.int32)


def test_a_jnp_or_lax_name_palace_lacks_is_a_palace_error_and_still_an_attribute_error():
  from palace import MissingApiError
  with pytest.raises(MissingApiError, match=r"palace.numpy has no jnp.take "
                                           r"\(test_jax_semantics_fixes.py:\d+\): .*Fix: "):
    jnp.take   # noqa: B018
  with pytest.raises(NotImplementedError, match=r"palace.lax has no lax.integer_pow"):
    lax.integer_pow   # noqa: B018
  assert not hasattr(jnp, "take") and getattr(lax, "clamp_not_a_name", 7) == 7
  with pytest.raises(AttributeError):
    jnp.__wrapped__   # noqa: B018  (dunder probes stay plain AttributeErrors)


def test_arrays_built_from_python_scalars_are_weakly_typed():
  x = np.full((16, 128), 32760, np.int16)
  # JAX: int16 + weak int32 full -> int16, 32760 + 10 wraps to -32766 (int16: 8-bit vector adds do
  # not compile on a TPU, benchmarks/hw/data/v5e-limits-2026-12-05.jsonl)
  out, dtype = apply(lambda v: v + jnp.full((16, 128), 10), x)
  assert dtype == np.int16 and out[0, 0] == -32766
  b = np.full((16, 128), 3.0, BF16)
  # bf16 * weak where(c, 1.1, 0.0): bf16, 1.1 rounded to bf16 (1.1015625) first: 3 * 1.1015625 =
  # 3.3046875 rounds to bf16 3.3125 (3 * 1.1 = 3.3 would round to 3.296875)
  out, dtype = apply(lambda v: v * jnp.where(v > 0, 1.1, 0.0), b)
  assert dtype == BF16 and float(out.astype(np.float32)[0, 0]) == 3.3125
  assert apply(lambda v: v + jnp.asarray(2.0), b)[1] == BF16
  assert dtype_in_kernel(lambda v: v + jnp.full((16, 128), 2.0, jnp.float32), b)[0] == np.float32  # strong


def test_a_weak_array_stored_into_a_ref_takes_the_ref_dtype():
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.full((8, 128), 300)   # JAX casts the weak int32 to int8: 300 wraps to 44
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.int8))(np.zeros((8, 128), np.int8))
  assert (out == 44).all()

  def floats(x_ref, o_ref):
    o_ref[...] = jnp.full((8, 128), 2.5)
  with pytest.raises(ShapeError, match="Cannot store a value of dtype float32 into"):
    pl.pallas_call(floats, out_shape=pl.ShapeDtypeStruct((8, 128), np.int32))(np.zeros((8, 128), np.int32))


def test_loops_reject_a_carry_that_changes_dtype_or_shape():
  # JAX raises TypeError ("carry input and carry output must have equal types"): TracingError is one
  with pytest.raises(TypeError, match=r"lax.fori_loop body '<lambda>' at grid point \(\) on chip 0 core 0 "
                                      r"in kernel 'kernel' changes carry leaf 0 from "
                                      r"int32\[8, 128\] to float32\[8, 128\]"):
    apply(lambda v: lax.fori_loop(0, 3, lambda i, c: c * 1.5, v), np.ones((8, 128), np.int32),
          out_dtype=np.float32)
  with pytest.raises(TypeError, match="lax.while_loop body"):
    apply(lambda v: lax.while_loop(lambda c: c[0, 0] < 4, lambda c: c[:4] + 1, v),
          np.ones((8, 128), np.int32))
  # a weak start (Python 0, jnp.full(s, 0)) takes the body's type, as in JAX
  out, dtype = apply(lambda v: lax.fori_loop(0, 3, lambda i, c: c + v, jnp.full((16, 128), 0)),
                     np.full((16, 128), 12000, np.int16))
  assert dtype == np.int16 and out[0, 0] == np.int16(36000 - 65536)


def test_integers_convert_to_narrow_floats_through_float32():
  # XLA converts int32 -> bf16 as int32 -> f32 -> bf16: 2**24 + 2**16 + 1 is f32 2**24 + 2**16, a tie in
  # bf16 that rounds to even, 2**24 (converted directly it would round up to 2**24 + 2**17)
  x = np.full((8, 128), 2**24 + 2**16 + 1, np.int32)
  out, _ = apply(lambda v: v.astype(BF16), x, out_dtype=BF16)
  assert float(out.astype(np.float32)[0, 0]) == 2.0**24


def test_bool_arithmetic_numpy_refuses_is_a_palace_error():
  # JAX rejects bool - bool and -bool (TypeError); palace names the op and the dtypes instead of
  # passing NumPy's TypeError through
  b = np.ones((8, 128), np.bool_)
  with pytest.raises(ShapeError, match=r"Invalid operands for jnp.subtract .*dtypes bool, bool"):
    apply(lambda v: v - v, b)
  with pytest.raises(ShapeError, match=r"Invalid operands for jnp.negative"):
    apply(lambda v: -v, b)
