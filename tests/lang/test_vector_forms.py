"""numpy_elementwise.on_vectors (palace.jax's compiled elementwise equations on blocks): the same data,
dtype, shape and modelled cycles as the op it specialises, for every operand kind it takes, and the op
itself for everything else. Each case runs two identical kernels, one through the op and one through
its vector form, and compares outputs bit for bit and the launch reports."""
import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace._src.lang.array import Array
from palace._src.lang.numpy_elementwise import on_vectors

BF16 = np.dtype(ml_dtypes.bfloat16)
_SHAPE = (16, 128)


def _data(dtype, seed):
  rng = np.random.default_rng(seed)
  if np.dtype(dtype).kind in "iu":
    return rng.integers(-50, 50, _SHAPE).astype(dtype)
  v = rng.standard_normal(_SHAPE).astype(np.float32)
  v[0, :4] = [np.nan, np.inf, -0.0, 0.0]
  return v.astype(dtype)


def _run(make, x, y, out_dtype, timing_only=False):
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = make(x_ref[...], y_ref[...])
  with pl.virtual_tpu("v5e", timing_only=timing_only) as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(_SHAPE, out_dtype))(x, y)
  r = tpu.reports[-1]
  return out, (r.device_cycles, dict(r.unit_busy_cycles))


CASES = [  # (op, dtype, arity, operand form)
    (jnp.multiply, np.float32, 2, "vv"), (jnp.subtract, BF16, 2, "vv"), (jnp.multiply, np.int32, 2, "vs"),
    (jnp.subtract, np.float32, 2, "sv"), (jnp.maximum, BF16, 2, "vs"), (jnp.less, np.float32, 2, "vv"),
    (jnp.true_divide, np.float32, 2, "vv"), (jnp.bitwise_and, np.int32, 2, "vs"),
    (jnp.right_shift, np.int32, 2, "vv"), (jnp.exp, np.float32, 1, "v"), (jnp.exp, BF16, 1, "v"),
    (jnp.negative, np.int32, 1, "v"), (jnp.isfinite, np.float32, 1, "v"), (jnp.tanh, BF16, 1, "v"),
]


@pytest.mark.parametrize("timing_only", [False, True], ids=["data", "timing_only"])
@pytest.mark.parametrize("op, dtype, arity, form", CASES,
                         ids=[f"{c[0].__name__}-{np.dtype(c[1]).name}-{c[3]}" for c in CASES])
def test_a_vector_form_matches_its_op(op, dtype, arity, form, timing_only):
  fast = on_vectors(op, dtype, _SHAPE, arity)
  assert fast is not None
  x, y = _data(dtype, 1), _data(dtype, 2)
  if dtype == np.int32 and op is jnp.right_shift:
    y = np.abs(y) % 31

  def apply(f):
    def make(a, b):
      if arity == 1:
        r = f(a)
      elif form == "vs":
        r = f(a, Array(np.asarray(y[0, 0], dtype), (), np.dtype(dtype), 0))
      elif form == "sv":
        r = f(Array(np.asarray(x[0, 0], dtype), (), np.dtype(dtype), 0), b)
      else:
        r = f(a, b)
      # the value's data has its declared dtype (a bf16 result rounded now, not at the store)
      assert r._data is None or r._data.dtype == r.dtype, (r._data.dtype, r.dtype)
      return r
    return make

  want_dtype = np.asarray(op(x, y) if arity == 2 else op(x)).dtype
  want, want_report = _run(apply(op), x, y, want_dtype, timing_only)
  got, got_report = _run(apply(fast), x, y, want_dtype, timing_only)
  assert got_report == want_report
  if not timing_only:
    assert got.dtype == want.dtype
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    np.testing.assert_array_equal(got.view(u), want.view(u))


def test_other_operands_take_the_op_and_int_only_ops_have_no_float_form():
  assert on_vectors(jnp.bitwise_and, np.float32, _SHAPE, 2) is None
  assert on_vectors(jnp.multiply, np.float32, (), 2) is None
  fast = on_vectors(jnp.subtract, np.float32, _SHAPE, 2)
  x = np.ones(_SHAPE, np.float32)
  # outside a kernel, other shapes and other dtypes: the op's own result (NumPy data on the host)
  np.testing.assert_array_equal(fast(x, 3 * x), -2 * x)

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = fast(v[:8], -v[8:]) + fast(v.astype(jnp.int32), -1)[:8].astype(jnp.float32)
  with pl.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))(x)
  np.testing.assert_array_equal(out, np.full((8, 128), 4.0, np.float32))


def test_the_add_form_leaves_deferred_matmul_sums_to_add():
  """jnp.add grows deferred matmul sums (lang/deferred.py): its form computes Arrays itself and hands
  anything else, a deferred sum included, to jnp.add, so `acc + dot` stays one deferred product."""
  fast = on_vectors(jnp.add, np.float32, (128, 128), 2)
  x = np.random.default_rng(3).standard_normal((128, 128)).astype(np.float32)

  def run(f):
    def kernel(x_ref, o_ref):
      v = x_ref[...]
      o_ref[...] = f(f(jnp.zeros((128, 128), jnp.float32), jnp.dot(v, v)), v)
    with pl.virtual_tpu("v5e") as tpu:
      out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return out, tpu.reports[-1].device_cycles, dict(tpu.reports[-1].unit_busy_cycles)

  (want, *want_report), (got, *got_report) = run(jnp.add), run(fast)
  assert got_report == want_report
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
