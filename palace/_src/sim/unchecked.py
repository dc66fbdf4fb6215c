"""Unchecked accesses on the virtual TPU (L4b), `CompilerParams(disable_bounds_checks=True)`; hooked in by
sim/checks.py.

Unchecked accesses (`disable_bounds_checks=True`, as on hardware): the out-of-bounds part of a load reads
garbage (NaN for floats, the int sentinel for ints), the out-of-bounds part of a store is dropped, and a
DMA moves only the elements that are in bounds on both sides (the rest of the destination keeps its old
contents); an indexed (SparseCore) DMA skips the entries whose row is out of bounds.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np

from palace._src.sim import memory


def _clip_dims(shape, index):
  """Per-dimension clipping of an index of one buffer: (None if nothing changes | list of (src entry,
  (i0, i1) of the view dim or None for int dims), or "empty")."""
  if not index:
    return None
  out, changed = [], False
  for d, size in enumerate(shape):
    ix = index[d] if d < len(index) else slice(None)
    if isinstance(ix, np.ndarray):
      return None   # an element map (lang/ref_maps.py): its views are bounds-checked when made
    if type(ix) is slice:
      st = ix.step or 1
      lo = ix.start or 0
      stop = size if ix.stop is None else ix.stop
      cnt = max(0, (stop - lo + st - 1) // st)
      i0 = max(0, -(-(-lo) // st)) if lo < 0 else 0
      i1 = min(cnt, max(0, -(-(size - lo) // st)))
      if i0 >= i1:
        return "empty"
      changed |= i0 != 0 or i1 != cnt
      out.append(("s", lo, st, i0, i1))
    else:
      v = int(ix)
      if not 0 <= v < size:
        return "empty"
      out.append(("i", v))
  return out if changed else None


def clip(shape, index):
  """None when `index` is in bounds; else (in-bounds buffer index or None, index into the view-shaped
  value selecting the elements it covers)."""
  dims = _clip_dims(shape, index)
  if dims is None:
    return None
  if dims == "empty":
    return None, None
  src, dst = [], []
  for e in dims:
    if e[0] == "i":
      src.append(e[1])
    else:
      _, lo, st, i0, i1 = e
      src.append(slice(lo + i0 * st, lo + (i1 - 1) * st + 1, st))
      dst.append(slice(i0, i1))
  return tuple(src), dst


def garbage_buffer(buf, shape, clip):
  """A stand-in buffer holding the loaded window: in-bounds elements copied, the rest garbage."""
  if buf.storage is None:
    return buf
  tmp = np.full(shape, memory.fill_value(buf.dtype), buf.dtype)
  index, dst = clip
  if index is not None:
    tmp[tuple(dst)] = buf.storage[index]
  return dataclasses.replace(buf, storage=tmp)


def clip_dma(req):
  """The request restricted to the elements in bounds on both sides (a copy; the original is kept)."""
  if req.src_indices is not None or req.dst_indices is not None:
    return _clip_indexed(req)
  sd, dd = _clip_dims(req.src_buf.shape, req.src_index), _clip_dims(req.dst_buf.shape, req.dst_index)
  if sd is None and dd is None:
    return req
  req = copy.copy(req)
  req.stream_span = req.hbm_block = None   # (its window changes: sim/dma.stream_overhead finds it again)
  if sd == "empty" or dd == "empty":
    req.src_buf = dataclasses.replace(req.src_buf, storage=None)  # nothing moves
    return req
  sd = sd or _full_dims(req.src_buf.shape, req.src_index)
  dd = dd or _full_dims(req.dst_buf.shape, req.dst_index)
  sv, dv = [e for e in sd if e[0] == "s"], [e for e in dd if e[0] == "s"]
  ranges = [(max(a[3], b[3]), min(a[4], b[4])) for a, b in zip(sv, dv)]
  if any(i0 >= i1 for i0, i1 in ranges):
    req.src_buf = dataclasses.replace(req.src_buf, storage=None)
    return req
  req.src_index = _rebuild(sd, ranges)
  req.dst_index = _rebuild(dd, ranges)
  return req


def _clip_indexed(req):
  """Drop the index entries of an indexed (gather/scatter) DMA whose row is out of bounds."""
  gather = req.src_indices is not None
  fancy = req.src_indices if gather else req.dst_indices
  rows = np.asarray(fancy[0])
  ok = (rows >= 0) & (rows < (req.src_buf if gather else req.dst_buf).shape[0])
  if ok.all():
    return req
  req = copy.copy(req)
  req.stream_span = req.hbm_block = None
  pos = np.nonzero(req.mask)[0] if req.mask is not None else np.arange(rows.shape[0])
  mask = np.zeros(rows.shape[0] if req.mask is None else req.mask.shape[0], bool)
  mask[pos[ok]] = True
  fancy = (rows[ok],) + tuple(fancy[1:])
  if gather:
    req.src_indices = fancy
  else:
    req.dst_indices = fancy
  req.mask = mask
  return req


def _full_dims(shape, index):
  out = []
  for d, size in enumerate(shape):
    ix = index[d] if index and d < len(index) else slice(None)
    if type(ix) is slice:
      st = ix.step or 1
      lo = ix.start or 0
      stop = size if ix.stop is None else ix.stop
      out.append(("s", lo, st, 0, max(0, (stop - lo + st - 1) // st)))
    else:
      out.append(("i", int(ix)))
  return out


def _rebuild(dims, ranges):
  it = iter(ranges)
  out = []
  for e in dims:
    if e[0] == "i":
      out.append(e[1])
    else:
      i0, i1 = next(it)
      out.append(slice(e[1] + i0 * e[2], e[1] + (i1 - 1) * e[2] + 1, e[2]))
  return tuple(out)
