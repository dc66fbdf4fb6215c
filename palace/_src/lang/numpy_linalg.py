"""`palace.numpy` matmuls (L4a): dot, matmul, einsum, dot_general (also `lax.dot_general`), outer, `@`.

Numerics (lang/mxu.py, docs/numerics.md): float operands go through float32 BLAS (products of bf16/fp8
are exact in float32, sums accumulate in float32 like the MXU), float32 operands rounded to bfloat16
first at the default precision, as the chip does; integer operands through float32 or float64 BLAS, whichever keeps
every partial sum exact, then cast to the int32 (or requested) result. Under
VirtualTPU(dot_numerics="mxu") a float dot whose operands the MXU reads as bfloat16 values is summed in
the chip's measured order instead (mxu.chip_product; never deferred). Each call is charged to the MXU
through the executor, the same in every numerics mode.
"""
from __future__ import annotations

import builtins

import numpy as np

from palace._src import blas
from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.errors import ShapeError, UsageError
from palace._src.lang import deferred, mxu
from palace._src.lang.array import Array, dtype_of, ready_of
from palace._src.util import keep, prod
from palace._src.lang.numpy_base import _dtype_arg, _np
from palace._src.lang.numpy_dtypes import _ScalarType
from palace._src.lang.numpy_elementwise import multiply
from palace._src.lang.numpy_shape import reshape, transpose


def _mxu_f32(x, precision: str):
  """A float operand as float32 the way the MXU reads it: rounded to bfloat16 at the default precision
  (float32 only: mxu.rounds_to_bf16), bfloat16 widened by dtypes.bf16_to_f32, others cast."""
  d = x.dtype
  if d == _F32:
    v = x._data   # (an Array: its float32 data as it is)
    return mxu.round_to_bf16_as_f32(v, np.empty(v.shape, np.float32)) if mxu.rounds_to_bf16(d, precision) \
        else v
  if d == dt.bfloat16 and x._data is not None:
    return dt.bf16_to_f32(x._data)
  return _np(x, _F32)


def _mxu_operands(a, b, k: int, precision: str = mxu.HIGHEST):
  """NumPy operands for the matmul on the host BLAS: float32 for floats (bf16/fp8 products are exact
  in f32; float32 rounded to bf16 at the default precision), float32 or float64 for integers so that
  sums of K products stay exact."""
  da, db = a.dtype, b.dtype
  if dt.is_float(da) or dt.is_float(db):
    wide = np.float64 if (da == np.float64 or db == np.float64) else np.float32
    if wide is np.float32:
      return _mxu_f32(a, precision), _mxu_f32(b, precision)
    return _np(a, np.dtype(wide)), _np(b, np.dtype(wide))
  bound = (1 << (dt.bits(da) - 1)) * (1 << (dt.bits(db) - 1)) * builtins.max(k, 1)
  wide = np.dtype(np.float32) if bound < (1 << 24) else np.dtype(np.float64)
  return _np(a, wide), _np(b, wide)


def _product(va: np.ndarray, vb: np.ndarray, chip_order: bool) -> np.ndarray:
  """The host product of `_mxu_operands`: the chip's summation rule (`chip_order`, mxu.follows_chip:
  VirtualTPU(dot_numerics="mxu")), the shared-dots diagnostic's rule for float operands
  (mxu.shared_product; not the chip's order, the one XLA:CPU then follows too), or the host BLAS."""
  if chip_order:
    return mxu.chip_product(va, vb)
  if va.dtype == np.float32 and mxu.shares_dots():
    return mxu.shared_product(va, vb)
  return blas.matmul(va, vb)


def _finish_matmul(a, b, data, out_shape, out_d, m, k, n, batch):
  if data is not None:
    if dt.is_int(out_d) and data.dtype.kind == "f":
      data = np.rint(data).astype(np.int64).astype(out_d)
    else:
      data = data.astype(out_d, copy=False)
  ex = executor.maybe_current()
  if ex is None:
    return data
  ready = ex.matmul(m, k, n, batch, a.dtype, b.dtype, ready_of(a, b), b)
  return Array(None if ex.timing_only else data, tuple(out_shape), out_d, ready)


def _as_array(x):
  if isinstance(x, Array):
    return x
  v = np.asarray(x)
  return Array(v, v.shape, dtype_of(v), 0)


_F32 = np.dtype(np.float32)
_DOT_TYPES: dict = {}   # memo of _dot_types' answers (a pure function of its key)


def _dot_types(a_dtype, b_dtype, precision, preferred_element_type, site: str = "jnp.dot") -> tuple:
  """(precision, result dtype) of `jnp.dot(a, b, precision=, preferred_element_type=)` (or of the
  `site` named, lax.dot_general), raising what Mosaic rejects (mxu.precision_of, mxu.check,
  numpy_base._dtype_arg). Memoised: a kernel's dot passes the same types every grid step, and these
  checks are ~10 Python calls. The answer depends only on the key (types included, so that values
  equal across types never share an entry), except for a result dtype some chip lacks
  (dtypes.CHIP_DEPENDENT), which is checked on every call; errors are not kept (so each names its
  own site)."""
  pet = preferred_element_type   # (jnp.float32 & co. keyed by their dtype: their hash is Python code)
  key = (a_dtype, b_dtype, precision, type(precision), pet.dtype if type(pet) is _ScalarType else pet,
         type(pet))
  try:
    hit = _DOT_TYPES.get(key)
  except TypeError:   # an unhashable argument (a precision list): checked every time
    key, hit = None, None
  if hit is not None:
    return hit
  prec = mxu.precision_of(precision, site)
  out_d = dt.result_type(a_dtype, b_dtype) if preferred_element_type is None else \
      _dtype_arg(preferred_element_type, "preferred_element_type")
  mxu.check(a_dtype, b_dtype, out_d, prec, site)
  if key is not None and out_d not in dt.CHIP_DEPENDENT:
    keep(_DOT_TYPES, key, (prec, out_d))
  return prec, out_d


_DIMENSION_NUMBERS: dict = {}   # id(dimension_numbers) -> (them, lhs ndim, rhs ndim, normalised): a memo


def _dimension_numbers(dimension_numbers, nda: int, ndb: int) -> tuple:
  """(lc, rc, lb, rb) as tuples of non-negative ints, each checked to be an integer. Memoised per
  dimension-numbers object when it is tuples all the way down (immutable; the memo holds it, so its
  id stays its own): a kernel's dot_general passes the same object every step (palace.jax's equation
  parameter, or a constant tuple in the kernel's code). By identity, not by value: 1.0 == 1 and
  True == 1, which the check refuses, would otherwise find an int's entry."""
  hit = _DIMENSION_NUMBERS.get(id(dimension_numbers))
  if hit is not None and hit[0] is dimension_numbers and hit[1] == nda and hit[2] == ndb:
    return hit[3]
  (lc, rc), (lb, rb) = dimension_numbers
  dims = tuple(tuple(validate.as_int(x, "dot_general dimension_numbers", error=ShapeError) % nd
                     for x in t) for t, nd in ((lc, nda), (rc, ndb), (lb, nda), (rb, ndb)))
  if type(dimension_numbers) is tuple and all(type(p) is tuple for p in dimension_numbers) and \
      all(type(t) is tuple for p in dimension_numbers for t in p):
    keep(_DIMENSION_NUMBERS, id(dimension_numbers), (dimension_numbers, nda, ndb, dims))
  return dims


_DOT_SHAPES: dict = {}   # memo of _dot_shapes' answers (a pure function of its key)


def _dot_shapes(a_shape, b_shape, dims) -> tuple:
  """(lhs free dims, rhs free dims, batch, m, n, k, output shape, plain) of a dot_general of these
  shapes with normalised dimension numbers `dims` (`_dimension_numbers`), `plain`: the (m,k)@(k,n)
  product. Memoised (a kernel's dot_general has the same shapes every grid step); raises ShapeError
  when the contracting dimensions differ."""
  key = (a_shape, b_shape, dims)
  hit = _DOT_SHAPES.get(key)
  if hit is not None:
    return hit
  lc, rc, lb, rb = dims
  for i, j in zip(lc, rc):
    if a_shape[i] != b_shape[j]:
      raise ShapeError(f"dot_general contracting dimensions differ: lhs {a_shape} dim {i} vs rhs "
                       f"{b_shape} dim {j}. Fix: transpose an operand or choose matching "
                       f"contracting dimensions.")
  lf = tuple([i for i in range(len(a_shape)) if i not in lc and i not in lb])
  rf = tuple([i for i in range(len(b_shape)) if i not in rc and i not in rb])
  out_shape = tuple([a_shape[i] for i in lb] + [a_shape[i] for i in lf] + [b_shape[i] for i in rf])
  plain = len(a_shape) == 2 and len(b_shape) == 2 and not lb and lc == (1,) and rc == (0,)
  hit = (lf, rf, prod([a_shape[i] for i in lb]), prod([a_shape[i] for i in lf]),
         prod([b_shape[i] for i in rf]), prod([a_shape[i] for i in lc]), out_shape, plain)
  return keep(_DOT_SHAPES, key, hit)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """`lax.dot_general`: ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))."""
  a = lhs if type(lhs) is Array else _as_array(lhs)
  b = rhs if type(rhs) is Array else _as_array(rhs)
  prec, out_d = _dot_types(a.dtype, b.dtype, precision, preferred_element_type, "lax.dot_general")
  dims = _dimension_numbers(dimension_numbers, len(a.shape), len(b.shape))
  lf, rf, bsz, m, n, k, out_shape, plain = _dot_shapes(a.shape, b.shape, dims)
  ex = executor.maybe_current()
  if plain and ex is not None:
    return dot(a, b, precision=prec, preferred_element_type=preferred_element_type)  # may defer
  data = None
  if not (ex is not None and ex.timing_only) and a._data is not None and b._data is not None:
    va, vb = _mxu_operands(a, b, k, prec)
    chip_order = mxu.follows_chip(a.dtype, b.dtype, prec)
    if plain:
      data = _product(va, vb, chip_order)  # the plain (m,k)@(k,n) product: no relayout
    else:
      lc, rc, lb, rb = dims
      va = va.transpose(lb + lf + lc).reshape(bsz, m, k)
      vb = vb.transpose(rb + rc + rf).reshape(bsz, k, n)
      data = _product(va, vb, chip_order).reshape(out_shape)
  return _finish_matmul(a, b, data, out_shape, out_d, m, k, n, bsz)


def dot(a, b, *, precision=None, preferred_element_type=None):
  if not isinstance(a, Array):   # (a kernel's operands are Arrays: no call for them)
    a = _as_array(a)
  if not isinstance(b, Array):
    b = _as_array(b)
  ex = executor.maybe_current()
  if ex is not None and len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]:
    # the plain (m,k)@(k,n) product (the common kernel case) without dot_general's normalisation;
    # timing only: no data, just its shape and its MXU cost
    m, k = a.shape
    n = b.shape[1]
    prec, out_d = _dot_types(a.dtype, b.dtype, precision, preferred_element_type)
    data = None
    if not ex.timing_only and a._data is not None and b._data is not None:
      chip_order = mxu.follows_chip(a.dtype, b.dtype, prec)
      if 2 * m * k * n >= deferred.MIN_FLOPS and not chip_order and deferred.deferrable(ex, a, b, out_d):
        ready = ex.matmul(m, k, n, 1, a.dtype, b.dtype, ready_of(a, b), b)   # charged as issued
        return deferred.product(ex, a, b, ready, prec)   # rounded per span when computed
      va, vb = _mxu_operands(a, b, k, prec)
      data = _product(va, vb, chip_order)
    return _finish_matmul(a, b, data, (m, n), out_d, m, k, n, 1)
  if a.ndim == 0 or b.ndim == 0:
    return multiply(a, b)
  if b.ndim == 1:
    return dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())), precision, preferred_element_type)
  return dot_general(a, b, (((a.ndim - 1,), (b.ndim - 2,)), ((), ())), precision,
                     preferred_element_type)


def matmul(a, b, *, precision=None, preferred_element_type=None):
  a, b = _as_array(a), _as_array(b)
  if a.ndim <= 2 and b.ndim <= 2:
    return dot(a, b, precision=precision, preferred_element_type=preferred_element_type)
  if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
    raise ShapeError(f"matmul of {a.shape} and {b.shape}: batch dims must match in kernels. Fix: "
                     f"broadcast the operands to the same batch shape first (jnp.broadcast_to).")
  nb = a.ndim - 2
  return dot_general(a, b, (((a.ndim - 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))), precision,
                     preferred_element_type)


# subscripts -> (dimension numbers, the result's transpose or None), one tuple object per subscripts:
# dot_general's memo of dimension numbers is keyed by identity, and a fresh tuple per call missed it
# every time (and kept each one alive, up to its 1024 entries)
_EINSUMS: dict = {}


def einsum(spec, *operands, precision=None, preferred_element_type=None, optimize=None):
  spec = spec.replace(" ", "")
  if "..." in spec or len(operands) != 2 or "->" not in spec:
    raise UsageError(f"jnp.einsum in kernels supports two operands with an explicit output ('ij,jk->ik');"
                     f" got {spec!r}. Fix: write the subscripts with '->', or use jnp.dot / lax.dot_general.")
  hit = _EINSUMS.get(spec)
  if hit is None:
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    dims = ((tuple([sa.index(c) for c in contract]), tuple([sb.index(c) for c in contract])),
            (tuple([sa.index(c) for c in batch]), tuple([sb.index(c) for c in batch])))
    produced = batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
    hit = keep(_EINSUMS, spec, (dims, None if produced == list(out) else [produced.index(c) for c in out]),
               256)
  a, b = _as_array(operands[0]), _as_array(operands[1])
  res = dot_general(a, b, hit[0], precision, preferred_element_type)
  if hit[1] is not None:
    res = transpose(res, hit[1])
  return res


def outer(a, b):
  return multiply(reshape(a, (-1, 1)), reshape(b, (1, -1)))


def _rev_matmul(self, other):
  return matmul(other, self)


Array.__matmul__ = matmul
Array.__rmatmul__ = _rev_matmul
