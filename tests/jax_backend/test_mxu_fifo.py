"""The explicit MXU with a result FIFO under palace.jax (`pltpu.matmul_push_rhs`, `matmul_lhs_fifo`,
`matmul_pop_fifo`; rules_tpu.py, lang/mxu_fifo.py), against NumPy products of small integers (exact in
float32 whatever the summation order) and the FIFO errors JAX's ExplicitMXUTest expects."""
import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import UnsupportedError

K = 128   # v5e's MXU column size


def _fifo_matmul(x, y, out_dtype, transpose=False, rows=None):
  """x (M, K) @ y through one staged RHS, `rows` LHS rows per push, each result popped at once."""
  m = x.shape[0]
  rows = rows or m

  def kernel(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], staging_register=0, mxu_index=0, transpose=transpose)
    for i in range(m // rows):
      pltpu.matmul_lhs_fifo(x_ref[i * rows:(i + 1) * rows, :], mxu_index=0,
                            load_staged_rhs=0 if i == 0 else None)
      o_ref[i * rows:(i + 1) * rows, :] = pltpu.matmul_pop_fifo((rows, K), out_dtype, mxu_index=0)
  with pj.virtual_tpu("v5e"):
    return np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, K), out_dtype))(x, y))


@pytest.mark.parametrize("dtype,rows", [(ml_dtypes.bfloat16, 16), (np.int8, 32),
                                        (ml_dtypes.float8_e5m2, 32)])
@pytest.mark.parametrize("transpose", [False, True])
def test_fifo_matmul_of_narrow_types_is_the_exact_product(dtype, rows, transpose):
  rng = np.random.default_rng(0)
  x = rng.integers(-4, 5, (64, K)).astype(dtype)
  y = rng.integers(-4, 5, (K, K)).astype(dtype)
  out = jnp.int32 if np.dtype(dtype) == np.int8 else jnp.float32
  got = _fifo_matmul(x, y, out, transpose, rows)
  want = x.astype(np.int64) @ (y.T if transpose else y).astype(np.int64)
  np.testing.assert_array_equal(got, want.astype(out))


def test_fifo_matmul_of_float32_multiplies_in_float32():
  """Integers 250..300 are not bf16 values (8 significant bits); their float32 products and sums of
  128 stay below 2**24, exact: a bf16 rounding of the operands would change them."""
  rng = np.random.default_rng(1)
  x = rng.integers(250, 301, (16, K)).astype(np.float32)
  y = rng.integers(250, 301, (K, K)).astype(np.float32)
  got = _fifo_matmul(x, y, jnp.float32, rows=8)
  np.testing.assert_array_equal(got, (x.astype(np.int64) @ y.astype(np.int64)).astype(np.float32))


def _run_pushes(pushes_before_pops: int, pops_per_push: int = 1):
  x = np.ones((16 * pushes_before_pops, K), ml_dtypes.bfloat16)
  y = np.ones((K, K), ml_dtypes.bfloat16)

  def kernel(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], staging_register=0, mxu_index=0)
    for i in range(pushes_before_pops):
      pltpu.matmul_lhs_fifo(x_ref[i * 16:(i + 1) * 16, :], mxu_index=0,
                            load_staged_rhs=0 if i == 0 else None)
    for i in range(pushes_before_pops * pops_per_push):
      j = i % pushes_before_pops
      o_ref[j * 16:(j + 1) * 16, :] = pltpu.matmul_pop_fifo((16, K), jnp.float32, mxu_index=0)
  with pj.virtual_tpu("v5e"):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x, y)


def test_popping_an_empty_fifo_is_the_schedulers_error():
  with pytest.raises(Exception, match="Cannot schedule FIFO pop instruction when the FIFO is empty"):
    _run_pushes(1, pops_per_push=2)


def test_32_queued_results_overflow_the_fifo():
  with pytest.raises(Exception, match="Cannot schedule FIFO push instruction when the FIFO is full"):
    _run_pushes(32)


def test_a_queue_between_the_known_bounds_is_refused():
  """3 queued (16, 128) float32 results are 6 vregs: more than the 4 known to fit, fewer than the 64
  known to overflow."""
  with pytest.raises(UnsupportedError, match=r"pltpu.matmul_lhs_fifo .*a result FIFO held 6 vregs; "
                                             r"TPU v5e's capacity is not published"):
    _run_pushes(3)
  np.testing.assert_array_equal(np.asarray(_run_pushes(2)), np.full((32, K), K, np.float32))
