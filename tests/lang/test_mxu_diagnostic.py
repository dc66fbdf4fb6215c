"""palace's own VirtualTPU(exact_f32_dots=True): the diagnostic that multiplies DEFAULT-precision float32
dot operands unrounded (not what the chip computes; lang/mxu.rounds_to_bf16), its reports saying so.
palace.jax's side: tests/jax_backend/test_exact_f32_dots.py."""
import numpy as np
import pytest

import palace
import palace.numpy as pnp

# 1 + 2^-12 is not a bfloat16 (it rounds to 1); products and sums of these are exact in float32
A = np.full((8, 512), 1 + 2.0 ** -12, np.float32)
B = np.ones((512, 256), np.float32)
CHIP = np.full((8, 256), 512.0, np.float32)
EXACT = np.full((8, 256), 512 * (1 + 2.0 ** -12), np.float32)


def test_palace_own_virtual_tpu_takes_the_diagnostic():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = pnp.dot(x_ref[...], y_ref[...])
  call = palace.pallas_call(kernel, out_shape=palace.ShapeDtypeStruct((8, 256), np.float32))
  with palace.virtual_tpu("v5e"):
    np.testing.assert_array_equal(np.asarray(call(A, B)), CHIP)
  with palace.virtual_tpu("v5e", exact_f32_dots=True) as tpu:
    np.testing.assert_array_equal(np.asarray(call(A, B)), EXACT)
  assert tpu.reports[-1].exact_f32_dots
  with pytest.raises(palace.UsageError, match="exact_f32_dots"):
    palace.virtual_tpu("v5e", exact_f32_dots="yes")


def test_palace_own_virtual_tpu_takes_the_shared_dots_diagnostic():
  # three K chunks of 128 summing to 2^24, 1 and 1 (bf16 values, each chunk exact): added in float32 in
  # order that is 2^24 (each + 1 ties to even); the K-tiled kernel and one dot over K both give it
  x = np.ones((8, 384), np.float32)
  y = np.zeros((384, 128), np.float32)
  y[:128] = 2.0 ** 17
  y[128] = y[256] = 1.0

  def tiled(x_ref, y_ref, o_ref):
    @palace.when(palace.program_id(0) == 0)
    def _():
      o_ref[...] = pnp.zeros_like(o_ref)
    o_ref[...] += pnp.dot(x_ref[...], y_ref[...])

  def whole(x_ref, y_ref, o_ref):
    o_ref[...] = pnp.dot(x_ref[...], y_ref[...])
  out = palace.ShapeDtypeStruct((8, 128), np.float32)
  tiled_call = palace.pallas_call(tiled, out_shape=out, grid=(3,),
                                  in_specs=[palace.BlockSpec((8, 128), lambda k: (0, k)),
                                            palace.BlockSpec((128, 128), lambda k: (k, 0))],
                                  out_specs=palace.BlockSpec((8, 128), lambda k: (0, 0)))
  with palace.virtual_tpu("v5e", shared_dots=True) as tpu:
    np.testing.assert_array_equal(np.asarray(tiled_call(x, y)), np.full((8, 128), 2.0 ** 24, np.float32))
    np.testing.assert_array_equal(np.asarray(palace.pallas_call(whole, out_shape=out)(x, y)),
                                  np.full((8, 128), 2.0 ** 24, np.float32))
    # the chip's rounding stays: DEFAULT float32 operands are rounded to bfloat16
    np.testing.assert_array_equal(np.asarray(palace.pallas_call(
        lambda a_ref, b_ref, o_ref: o_ref.__setitem__(..., pnp.dot(a_ref[...], b_ref[...])),
        out_shape=palace.ShapeDtypeStruct((8, 256), np.float32))(A, B)), CHIP)
  assert tpu.reports[-1].shared_dots and "DIAGNOSTIC shared_dots" in str(tpu.reports[-1])
  with pytest.raises(palace.UsageError, match=r"exact_f32_dots=True, shared_dots=True.*observed both"):
    palace.virtual_tpu("v5e", exact_f32_dots=True, shared_dots=True)


def test_the_diagnostic_holds_for_sums_computed_after_the_kernel_body():
  # 256 blocks: each output block's K sum is deferred, written back pending and computed at the end of
  # the launch (sim/memory.PendingBlocks), when no executor is current: its rounding was fixed when the
  # product was made
  from benchmarks.kernels import tiled_matmul
  x = np.full((512, 512), 1 + 2.0 ** -12, np.float32)
  y = np.ones((512, 512), np.float32)
  with palace.virtual_tpu("v5e"):
    np.testing.assert_array_equal(tiled_matmul(x, y, 256), np.full((512, 512), 512.0, np.float32))
  with palace.virtual_tpu("v5e", exact_f32_dots=True):
    np.testing.assert_array_equal(tiled_matmul(x, y, 256),
                                  np.full((512, 512), 512 * (1 + 2.0 ** -12), np.float32))
