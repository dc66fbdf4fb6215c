"""The Pallas TPU matmul tutorial kernel, shared by the tests (one definition; examples, docs and
benchmarks keep their own copies so that each stands alone)."""
import palace as pl
import palace.numpy as jnp


def matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  """z = x @ y over the grid (i, j, k), K innermost, accumulating in `acc_ref` (its dtype)."""
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_ref.dtype)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)
