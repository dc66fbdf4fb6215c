"""Real JAX, TPU kernels on palace: the jax wheel's flash attention and matmul, unmodified, inside
jax.jit and jax.grad, with modelled TPU v5e times. Needs JAX 0.12 (.venv-jax):

  PYTHONPATH=$PWD .venv-jax/bin/python examples/jax/wheel_kernels.py
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import flash_attention, matmul

import palace.jax


def main():
  r = np.random.default_rng(0)
  q, k, v = (r.standard_normal((1, 2, 512, 128)).astype(np.float32) for _ in range(3))
  x, y = (r.integers(-8, 8, (512, 512)).astype(np.float32) for _ in range(2))

  attention = jax.jit(lambda a, b, c: flash_attention.flash_attention(a, b, c, causal=True))
  loss_grad = jax.jit(jax.grad(lambda a, b, c: flash_attention.flash_attention(a, b, c).sum()))
  # HIGHEST: float32 products, to compare with a float32 reference (a TPU's default precision, and
  # palace's, rounds f32 matmul operands to bf16: docs/numerics.md)
  with palace.jax.virtual_tpu("v5e") as tpu, jax.default_matmul_precision("highest"):
    out = attention(q, k, v)
    dq = loss_grad(q, k, v)
    z = jax.jit(lambda a, b: matmul.matmul(a, b, block_shape=(256, 256), block_k=256))(x, y)
  np.testing.assert_allclose(np.asarray(out), np.asarray(flash_attention.mha_reference(
      q, k, v, None, causal=True)), rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(z), x @ y)
  print(f"dq: {dq.shape} {dq.dtype}, finite: {bool(jnp.isfinite(dq).all())}")
  for rep in tpu.reports:
    print(f"{rep.kernel_name:32s} device time {rep.device_time_s * 1e6:8.2f} us  "
          f"({rep.device_cycles} cycles, {rep.grid_steps} grid steps)")
  t = palace.jax.device_time(attention, q, k, v)
  print(f"device_time(attention): {t.device_time_s * 1e6:.2f} us over {t.launches} launch(es)")


if __name__ == "__main__":
  main()
