"""The explicit MXU with a result FIFO in palace's own API (lang/mxu_fifo.py): a staged RHS, LHS pushes
whose products queue in order, pops; the rules JAX's docstrings state (no second push to a staged
register, nothing left at the end of the kernel) and the chips without the FIFO."""
import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

K = 128
BF16 = ml_dtypes.bfloat16


def _call(kernel, chip="v5e", m=32):
  x = (np.arange(m * K).reshape(m, K) % 5 - 2).astype(BF16)
  y = (np.arange(K * K).reshape(K, K) % 3 - 1).astype(BF16)
  with pl.virtual_tpu(chip):
    return x, y, pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((m, K), jnp.float32))(x, y)


def test_results_pop_in_push_order_and_reuse_the_loaded_rhs():
  def kernel(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
    pltpu.matmul_lhs_fifo(x_ref[16:32, :], 0, load_staged_rhs=0)
    pltpu.matmul_lhs_fifo(x_ref[0:16, :], 0)           # the loaded RHS again
    o_ref[16:32, :] = pltpu.matmul_pop_fifo((16, K), jnp.float32, 0)
    o_ref[0:16, :] = pltpu.matmul_pop_fifo((16, K), jnp.float32, 0)
  x, y, got = _call(kernel)
  np.testing.assert_array_equal(got, (x.astype(np.int64) @ y.astype(np.int64)).astype(np.float32))


def test_a_second_push_to_a_staged_register_is_an_error():
  def kernel(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
  with pytest.raises(pl.SyncError, match=r"staging register 0 of MXU 0 still holds the RHS pushed at "
                                         r".*test_mxu_fifo.py:\d+.*never loaded"):
    _call(kernel)


def test_a_kernel_may_not_end_with_a_staged_rhs_or_a_queued_result():
  def staged(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], 1, 0)
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
  with pytest.raises(pl.SyncError, match="ended with staging register 1 of MXU 0 holding an RHS never"):
    _call(staged)

  def queued(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
    pltpu.matmul_lhs_fifo(x_ref[0:16, :], 0, load_staged_rhs=0)
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
  with pytest.raises(pl.SyncError, match=r"ended with 1 result\(s\) in MXU 0's result FIFO never popped"):
    _call(queued)


def test_lhs_rows_and_pop_shapes_are_checked():
  def few_rows(x_ref, y_ref, o_ref):   # bf16 packs 16 rows per vreg pair of sublanes
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
    pltpu.matmul_lhs_fifo(x_ref[0:8, :], 0, load_staged_rhs=0)
  with pytest.raises(pl.ShapeError, match=r"expected M x 128 with M a multiple of 16"):
    _call(few_rows)


@pytest.mark.parametrize("chip", ["v4", "7x"])
def test_chips_without_the_result_fifo_refuse_it(chip):
  def kernel(x_ref, y_ref, o_ref):
    pltpu.matmul_push_rhs(y_ref[...], 0, 0)
  with pytest.raises(pl.UnsupportedError, match=rf"TPU {chip} has no MXU result FIFO"):
    _call(kernel, chip)
