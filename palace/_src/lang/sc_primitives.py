"""SparseCore vector-subcore primitives (L4a): `plsc.load_gather`, `store_scatter`, `cumsum`, ...

Semantics follow jax.experimental.pallas.tpu_sc (pallas-api.md section 5.2). Values are 1-D vectors of
the subcore's lane width; masks are boolean vectors of the same length (masked-off lanes read 0 and are
not written).
"""
from __future__ import annotations

import enum

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.executor import OpClass
from palace._src.errors import OutOfBoundsError, ShapeError, UnsupportedError, UsageError
from palace._src.lang.numpy_base import _out
from palace._src.lang.array import Array, concrete_int, concrete_value, ready_of
from palace._src.lang.primitives import loop
from palace._src.lang.refs import Ref
from palace._src.lang.tpu_primitives import bitcast as _tpu_bitcast
from palace._src.util import user_frame_summary


def _vals(x):
  v = concrete_value(x)
  return np.asarray(v)


def _plain(ref, api: str):
  """SparseCore ops address a ref's buffer by its view (dims, NumPy index) directly."""
  if getattr(ref, "_mapped", False):
    raise UnsupportedError(f"{api} of {ref.origin()} is not supported in palace yet: it is a bitcast "
                           f"that changes the element width, or a reshape of a strided view. Fix: use "
                           f"the plain ref, and bitcast or reshape the values instead.")
  return ref


def _idx_tuple(ref: Ref, indices):
  _plain(ref, "A SparseCore gather/scatter")
  if not isinstance(indices, (list, tuple)):
    indices = [indices]
  if len(indices) != ref.ndim:
    raise ShapeError(f"{ref.origin()} has {ref.ndim} dims but {len(indices)} index vectors were given; "
                     f"Fix: pass one 1-D index vector per dimension.")
  out = []
  for d, ix in enumerate(indices):
    v = _vals(ix).astype(np.int64)
    ex = executor.current()
    if ex.bounds_checks and v.size and (v.min() < 0 or v.max() >= ref.shape[d]):
      raise OutOfBoundsError(f"Gather/scatter index out of bounds for dim {d} of {ref.origin()} "
                             f"(size {ref.shape[d]}) {ex.where()}: got {int(v.max())} / {int(v.min())}. Fix: keep "
                          f"indices in 0..{ref.shape[d] - 1} (clip them, or mask the lanes).")
    dim = ref.dims[[i for i, x in enumerate(ref.dims) if type(x) is tuple][d]]
    out.append(dim[0] + v * dim[2])
  full = []
  it = iter(out)
  for x in ref.dims:
    full.append(x if type(x) is int else next(it))
  return tuple(full)


def _charge(ref_or_shape, dtype, ready, op=OpClass.CHEAP):
  ex = executor.current("a SparseCore op")
  shape = ref_or_shape if isinstance(ref_or_shape, tuple) else ref_or_shape.shape
  return ex.vector_op(op, shape, dtype, ready)


def _mask(mask, n):
  if mask is None:
    return None
  m = _vals(mask).astype(bool)
  if m.shape != (n,):
    raise ShapeError(f"mask of shape {m.shape} does not match a vector of {n} lanes. Fix: pass a "
                     f"bool mask of shape ({n},).")
  return m


def load_gather(ref: Ref, indices, *, mask=None):
  """out[i] = ref[indices[0][i], indices[1][i], ...] (0 where masked off)."""
  idx = _idx_tuple(ref, indices)
  n = idx[-1].shape[0] if hasattr(idx[-1], "shape") else 1
  executor.current("plsc.load_gather()").note_access(ref.buf, idx, "r", (n,))
  data = ref.buf.storage[idx] if ref.buf.storage is not None else np.zeros(n, ref.dtype)
  m = _mask(mask, data.shape[0])
  if m is not None:
    data = np.where(m, data, np.zeros((), ref.dtype))
  ready = _charge(data.shape, ref.dtype, max(ready_of(*(indices if isinstance(indices, (list, tuple))
                                                        else [indices])), ref.buf.ready_cycle), OpClass.LOAD)
  return Array(np.asarray(data, ref.dtype).copy(), data.shape, ref.dtype, ready)


def _scatter(ref: Ref, indices, x, mask, add: bool):
  idx = _idx_tuple(ref, indices)
  vals = np.asarray(_vals(x), ref.dtype) if not isinstance(x, Array) or x.dtype == ref.dtype else None
  if vals is None:
    raise ShapeError(f"Cannot scatter {x.dtype} values into {ref.origin()} of dtype {ref.dtype}. Fix: "
                     f"cast the values with .astype({ref.dtype}).")
  m = _mask(mask, vals.shape[0])
  if m is not None:
    idx = tuple(i[m] if isinstance(i, np.ndarray) else i for i in idx)
    vals = vals[m]
  executor.current("a SparseCore scatter").note_access(ref.buf, idx, "w", vals.shape)
  if ref.buf.storage is not None:
    ref.buf.detach_readers()
    if add:
      np.add.at(ref.buf.storage, idx, vals)
    else:
      ref.buf.storage[idx] = vals
  done = _charge(vals.shape, ref.dtype, ready_of(x), OpClass.STORE)
  ref.buf.ready_cycle = max(ref.buf.ready_cycle, done)


def store_scatter(ref, indices, x, *, mask=None):
  _scatter(ref, indices, x, mask, add=False)


def addupdate_scatter(ref, indices, x, *, mask=None):
  """Scatter with atomic add: repeated indices accumulate."""
  _scatter(ref, indices, x, mask, add=True)


def addupdate(ref, x):
  ref[...] = ref[...] + x


def load_expanded(ref: Ref, *, mask):
  """The i-th True lane of `mask` gets ref[i]; other lanes are 0."""
  m = _mask(mask, _plain(ref, "plsc.load_expanded").shape[0])
  executor.current("plsc.load_expanded()").note_access(ref.buf, ref._np_index, "r", ref.shape)
  src = ref.buf.storage[ref._np_index] if ref.buf.storage is not None else np.zeros(ref.shape, ref.dtype)
  out = np.zeros(ref.shape, ref.dtype)
  k = int(m.sum())
  out[m] = np.asarray(src).reshape(-1)[:k]
  return Array(out, out.shape, ref.dtype, _charge(out.shape, ref.dtype, ref.buf.ready_cycle, OpClass.LOAD))


def _compressed(ref: Ref, x, mask, add: bool) -> None:
  """Pack the masked lanes of x to the front of ref, storing or (add) accumulating them."""
  _plain(ref, "A SparseCore compressed store")
  vals = _vals(x)
  m = _mask(mask, vals.shape[0])
  packed = vals[m]
  executor.current("a SparseCore compressed store").note_access(ref.buf, ref._np_index, "w", ref.shape)
  if ref.buf.storage is not None:
    ref.buf.detach_readers()
    view = ref.buf.storage[ref._np_index]
    flat = view.reshape(-1).copy()  # the view may be strided: work on a flat copy, write it back
    if add:
      flat[:packed.size] += packed.astype(view.dtype)
    else:
      flat[:packed.size] = packed
    view[...] = flat.reshape(view.shape)
  _charge(vals.shape, ref.dtype, ready_of(x), OpClass.STORE)


def store_compressed(ref: Ref, x, *, mask):
  """The masked lanes of x are packed to the front of ref."""
  _compressed(ref, x, mask, add=False)


def addupdate_compressed(ref: Ref, x, *, mask):
  """The masked lanes of x are packed to the front of ref and added to what is there."""
  _compressed(ref, x, mask, add=True)


def _vector_result(x, data, dtype=None, op=OpClass.CHEAP):
  d = dt.canonicalize(dtype) if dtype is not None else x.dtype
  return _out(np.asarray(data, d), tuple(np.shape(data)), d, ready_of(x), op, True)


def cumsum(x, *, mask=None):
  v = _vals(x)
  m = _mask(mask, v.shape[0])
  if m is not None:
    v = np.where(m, v, 0)
  return _vector_result(x, np.cumsum(v).astype(x.dtype), op=OpClass.REDUCE_LANE)


def _masked_running(x, mask, ufunc, neutral: str):
  """The running `ufunc` (np.maximum / np.minimum) over the lanes; with a mask, of the unmasked lanes
  so far, a lane before the first unmasked one keeping its own value (JAX's masked_cummax test)."""
  v = _vals(x)
  m = _mask(mask, v.shape[0])
  if m is None:
    return _vector_result(x, ufunc.accumulate(v), op=OpClass.REDUCE_LANE)
  info = np.finfo(v.dtype) if v.dtype.kind == "f" else np.iinfo(v.dtype)
  run = ufunc.accumulate(np.where(m, v, getattr(info, neutral)))
  return _vector_result(x, np.where(np.cumsum(m) > 0, run, v).astype(v.dtype), op=OpClass.REDUCE_LANE)


def cummax(x, *, mask=None):
  """Running maximum over the (unmasked) lanes (`_masked_running`)."""
  return _masked_running(x, mask, np.maximum, "min")


def cummin(x, *, mask=None):
  """Running minimum over the (unmasked) lanes (`_masked_running`)."""
  return _masked_running(x, mask, np.minimum, "max")


def scan_count(x, mask=None):
  """(counts, last): counts[i] is how many unmasked lanes j <= i hold x[i] (the running occurrence
  count of lane i's value); last[i] is True at the last unmasked occurrence of each value. Masked-off
  lanes count nothing and get count 0 and last False (palace's choice: JAX leaves them unspecified)."""
  v = _vals(x)
  m = np.ones(v.shape, bool) if mask is None else _mask(mask, v.shape[0])
  same = (v[:, None] == v[None, :]) & m[None, :] & m[:, None]   # [i, j]: lane j counts for lane i
  before = np.tril(same)                                          # j <= i
  counts = np.where(m, before.sum(axis=1), 0).astype(np.int32)
  last = m & (np.triu(same, 1).sum(axis=1) == 0)
  return (_vector_result(x, counts, dtype=dt.int32, op=OpClass.REDUCE_LANE),
          _vector_result(x, last, dtype=dt.bool_))


class PackFormat(enum.Enum):
  """How plsc.pack places two vectors in one of half-width elements: COMPRESSED, shape (n, 2), holds a
  then b (row-major: a's lanes fill the first n elements); INTERLEAVED, shape (2n,), alternates them
  (a0, b0, a1, b1, ...)."""
  COMPRESSED = "compressed"
  INTERLEAVED = "interleaved"


_PACKED = {np.dtype(np.float32): dt.bfloat16, np.dtype(np.int32): np.dtype(np.int16)}
_UNPACKED = {dt.bfloat16: np.dtype(np.float32), np.dtype(np.int16): np.dtype(np.int32)}


def _format(format) -> PackFormat:
  value = getattr(format, "value", format)
  try:
    return PackFormat(value)
  except ValueError:
    raise UsageError(f"pack format {format!r} is not one of {[f.value for f in PackFormat]}. Fix: pass "
                     f"plsc.PackFormat.COMPRESSED or plsc.PackFormat.INTERLEAVED.") from None


def _half_type(src: np.dtype, table: dict, preferred, what: str, ratio) -> np.dtype:
  if preferred is not None:
    out = dt.canonicalize(preferred)
    if out.itemsize * 8 != int(src.itemsize * 8 * ratio):
      raise ShapeError(f"plsc.{what}: preferred_element_type={out} must have {int(src.itemsize * 8 * ratio)} "
                       f"bits for {src} operands. Fix: pass a dtype of that width.")
    return out
  if src not in table:
    raise UnsupportedError(f"plsc.{what} of {src} vectors: the SparseCore {what}s "
                           f"{', '.join(str(k) for k in table)} only (Mosaic's pack_subelements). Fix: "
                           f"pass preferred_element_type=, or convert with .astype().")
  return table[src]


def pack(a, b, *, format, preferred_element_type=None):
  """Two vectors of 32-bit elements converted to one of 16-bit elements (float32 -> bfloat16 rounded to
  nearest even, int32 -> int16 truncated) laid out by `format` (PackFormat)."""
  fmt = _format(format)
  va, vb = _vals(a), _vals(b)
  if va.shape != vb.shape or va.ndim != 1 or va.dtype != vb.dtype:
    raise ShapeError(f"plsc.pack of {va.dtype}{list(va.shape)} and {vb.dtype}{list(vb.shape)}: both must be "
                     f"1-D vectors of one shape and dtype. Fix: pack matching vectors.")
  out = _half_type(va.dtype, _PACKED, preferred_element_type, "pack", 0.5)
  both = np.stack([va, vb])                                 # [2, n]
  data = both.reshape(-1, 2) if fmt is PackFormat.COMPRESSED else both.T.reshape(-1)
  return _vector_result(a, data.astype(out), dtype=out)


def unpack(ab, *, format, preferred_element_type=None):
  """The inverse of pack: the two vectors, widened exactly (bfloat16 -> float32, int16 -> int32 sign
  extended)."""
  fmt = _format(format)
  v = _vals(ab)
  ok = v.ndim == 2 and v.shape[1] == 2 if fmt is PackFormat.COMPRESSED else v.ndim == 1 and v.size % 2 == 0
  if not ok:
    raise ShapeError(f"plsc.unpack of a {list(v.shape)} vector with format {fmt.value}: it needs shape (n, 2) "
                     f"(compressed) or (2n,) (interleaved). Fix: unpack what plsc.pack returned.")
  out = _half_type(v.dtype, _UNPACKED, preferred_element_type, "unpack", 2)
  pair = v.reshape(2, -1) if fmt is PackFormat.COMPRESSED else v.reshape(-1, 2).T
  return tuple(_vector_result(ab, half.astype(out), dtype=out) for half in pair)


def sort_key_val(keys, values, *, mask=None, descending=False):
  """Sort `values` by `keys`; with a mask, masked-off entries go last and the sorted mask is returned."""
  k, v = _vals(keys), _vals(values)
  m = _mask(mask, k.shape[0])
  order_keys = -k.astype(np.float64) if descending else k.astype(np.float64)
  if m is not None:   # masked-off entries go last, in their original order (JAX's sort_key_val test)
    order = np.lexsort((np.where(m, order_keys, 0.0), ~m))
  else:
    order = np.argsort(order_keys, kind="stable")
  ks = _vector_result(keys, k[order], op=OpClass.XLU)
  vs = _vector_result(values, v[order], op=OpClass.XLU)
  if m is None:
    return ks, vs
  return ks, vs, _vector_result(keys, m[order], dtype=dt.bool_)


def sort(keys, *values):
  """lax.sort by one key on a SparseCore vector subcore (Mosaic's one sort lowering: rank 1, stable):
  [sorted keys, each value sorted by the keys]. A TensorCore has none (measured on a TPU v5e:
  'Unimplemented primitive in Pallas TPU lowering for tc: sort')."""
  ex = executor.maybe_current()
  if ex is not None and ex.sparsecore is None:
    raise UnsupportedError(
        f"lax.sort {ex.where()} ({user_frame_summary()}): the TPU compiler has no sort on a TensorCore (Mosaic, measured on a TPU "
        f"v5e: 'Unimplemented primitive in Pallas TPU lowering for tc: sort'). Fix: sort on a "
        f"SparseCore vector subcore (plsc.sort_key_val), or outside the kernel.")
  if len(getattr(keys, "shape", ())) != 1:
    where = "" if ex is None else f" {ex.where()} ({user_frame_summary()})"
    raise UnsupportedError(f"lax.sort{where}: keys of shape {getattr(keys, 'shape', ())} must be rank 1 on "
                           f"a SparseCore (Mosaic's SparseCore sort). Fix: sort rank-1 vectors.")
  if not values:
    return [sort_key_val(keys, keys)[0]]
  out = [None]
  for v in values:
    out[0], sv = sort_key_val(keys, v)
    out.append(sv)
  return out


def _reduce_one(reduce, what: str) -> None:
  if int(reduce) != 1:
    raise UnsupportedError(f"plsc.{what}(reduce={reduce}) is not supported in palace yet (it is for the "
                           f"packed masks of 16-bit vectors, whose layout palace does not model). Fix: "
                           f"pass reduce=1.")


def all_reduce_population_count(x, *, reduce: int = 1):
  """Number of True lanes, in every lane of an int32 vector (an all-reduce across lanes)."""
  _reduce_one(reduce, "all_reduce_population_count")
  v = _vals(x).astype(bool)
  return _vector_result(x, np.full(v.shape, int(v.sum()), np.int32), dtype=dt.int32, op=OpClass.REDUCE_LANE)


def all_reduce_ffs(x, *, reduce: int = 1):
  """Index of the first True lane (the lane count if none), in every lane."""
  _reduce_one(reduce, "all_reduce_ffs")
  v = _vals(x).astype(bool)
  first = int(np.argmax(v)) if v.any() else v.shape[0]
  return _vector_result(x, np.full(v.shape, first, np.int32), dtype=dt.int32, op=OpClass.REDUCE_LANE)


def bitcast(x, dtype):
  return _tpu_bitcast(x, dtype, dim=-1)


def subcore_barrier() -> None:
  """Barrier across the vector subcores of this SparseCore."""
  sc = executor.current("plsc.subcore_barrier()").sparsecore
  if sc is None:
    raise UsageError("plsc.subcore_barrier() is only valid on SparseCore vector subcores "
                     "(a plsc.VectorSubcoreMesh kernel). Fix: on TensorCores use "
                     "pltpu.core_barrier.")
  sc.subcore_barrier()


def parallel_loop(lower, upper, step=1, *, unroll=1, carry=None):
  """Decorator: a loop whose iterations are declared independent (run in order here)."""
  return loop(lower, upper, step=step, init_carry=carry)


def fetch_and_add(x_ref: Ref, value, *, subcore_id):
  """Atomically add `value` to the SMEM scalar `x_ref` of vector subcore `subcore_id` of this
  SparseCore; returns the old value."""
  ex = executor.current("plsc.fetch_and_add()")
  if ex.sparsecore is None:
    raise UsageError(f"plsc.fetch_and_add() {ex.where()}: it adds to an SMEM scalar of a SparseCore "
                     f"vector subcore. Fix: run it in a plsc.VectorSubcoreMesh kernel.")
  target = ex.sparsecore.peer_subcore_buffer(_plain(x_ref, "plsc.fetch_and_add").buf,
                                             concrete_int(subcore_id, "subcore_id"))
  ex.note_access(target, x_ref._np_index, "r", (), atomic=True)
  ex.note_access(target, x_ref._np_index, "w", (), atomic=True)
  old = target.storage[x_ref._np_index].copy()
  target.detach_readers()
  target.storage[x_ref._np_index] = old + np.asarray(concrete_value(value), target.dtype)
  ex.scalar_op()
  return Array(np.asarray(old), (), x_ref.dtype, ex.now)
