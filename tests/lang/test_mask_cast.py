"""8-bit integer vectors compared with a scalar zero (`x != 0`, `x == 0`: Mosaic's cast of a vector to a
mask, what jnp.where does with an int8 mask) run, as JAX's own TPU tests run them on v5 and later; other
8-bit comparisons stay refused (measured on a TPU v5e: int_rejects.VECTOR_INT_REJECTS)."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import UnsupportedError


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8])
def test_an_8_bit_mask_selects_like_numpy(dtype):
  rng = np.random.default_rng(0)
  mask = (rng.random((32, 128)) < 0.5).astype(dtype)
  x = rng.standard_normal((32, 128)).astype(np.float32)

  def kernel(m_ref, x_ref, o_ref, e_ref):
    o_ref[...] = jnp.where(m_ref[...] != 0, x_ref[...], 0.0)
    e_ref[...] = jnp.where(m_ref[...] == 0, 1.0, 0.0)
  got, eq = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct(x.shape, jnp.float32),) * 2)(mask, x)
  np.testing.assert_array_equal(got, np.where(mask != 0, x, 0.0))
  np.testing.assert_array_equal(eq, (mask == 0).astype(np.float32))


def test_an_8_bit_comparison_of_two_vectors_is_still_refused():
  a = np.zeros((32, 128), np.int8)

  def kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.where(a_ref[...] != b_ref[...], 1.0, 0.0)
  with pytest.raises(UnsupportedError, match="no 8-bit integer not_equal on vectors"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(a.shape, jnp.float32))(a, a)
