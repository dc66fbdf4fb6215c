"""Shared helpers for the language tests: run a function of loaded values inside a one-block kernel."""
import numpy as np

import palace as pl


def apply(fn, *xs, out_shape=None, out_dtype=None, grid=(1,)):
  """Load every input whole, run `fn` on the values in a kernel, store the result; returns
  (result, dtype_inside_kernel). The output shape/dtype default to the first input's."""
  seen = {}

  def kernel(*refs):
    *ins, o_ref = refs
    v = fn(*[r[...] for r in ins])
    seen["dtype"], seen["shape"] = v.dtype, v.shape
    o_ref[...] = v

  x0 = np.asarray(xs[0]) if xs else None
  shape = out_shape if out_shape is not None else x0.shape
  dtype = out_dtype if out_dtype is not None else x0.dtype
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(shape, dtype))(*xs)
  return out, seen["dtype"]


def dtype_in_kernel(fn, *xs):
  """The dtype and shape of fn(*loaded values) inside a kernel (nothing is stored)."""
  seen = {}

  def kernel(*refs):
    *ins, o_ref = refs
    v = fn(*[r[...] for r in ins])
    seen["dtype"], seen["shape"] = np.dtype(v.dtype), tuple(v.shape)

  pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))(*xs)
  return seen["dtype"], seen["shape"]
