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
