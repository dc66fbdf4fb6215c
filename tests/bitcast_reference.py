"""JAX's ref bitcast computed in NumPy (a reference for tests/lang/test_ref_bitcast.py and
tests/jax_backend/test_ref_transforms.py)."""
import numpy as np


def ref_bitcast(x: np.ndarray, dtype) -> np.ndarray:
  """JAX's ref bitcast in NumPy: a wider type packs `r` consecutive rows of the second-minor axis into
  one (row r*i + k is bits [k*w, (k+1)*w) of row i), a narrower type unpacks each row into `r`."""
  dtype = np.dtype(dtype)
  w_in, w_out = x.dtype.itemsize, dtype.itemsize
  if w_in == w_out:
    return x.view(dtype)
  if w_in < w_out:
    r = w_out // w_in
    packed = x.reshape(*x.shape[:-2], x.shape[-2] // r, r, x.shape[-1]).swapaxes(-1, -2)
    return np.ascontiguousarray(packed).view(dtype)[..., 0]
  parts = np.ascontiguousarray(x)[..., None].view(dtype)          # (..., R, C, r)
  return np.ascontiguousarray(parts.swapaxes(-1, -2)).reshape(*x.shape[:-2], -1, x.shape[-1])
