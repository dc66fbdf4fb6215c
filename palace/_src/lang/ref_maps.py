"""Element maps of ref views that a strided window of a buffer cannot express (L4a; used by refs.py).

A bitcast of a ref that changes the element width packs along the second-minor axis, as on a TPU
(JAX 0.12: `jax/_src/state/utils.py` `bitcast`, which `state/discharge.py` applies for a
`BitcastTransform`, and the Mosaic lowering's `tpu.memref_bitcast`, which scales the second-minor
dimension): a (16, 128) int32 ref bitcast to int16 is (32, 128), its row 2i + k holding the k-th
16-bit half (k = 0: the low half) of each element of row i; an int16 (32, 128) ref bitcast to int32 is
(16, 128), element (i, j) packing (2i, j) (low half) and (2i + 1, j). NumPy's row-major storage can view
neither form, so such refs, and reshapes of strided views, find their elements through a map: a chain
of steps from a plain view of a buffer (`Ref.dims`) to the ref's array, pulled back element by element
for the part of it a load, store or DMA touches (never the whole chain's array: a bitcast of a large
HBM ref costs only what its DMAs move).

The grain is the chain's `unit`, its narrowest element width in bytes: after a packing bitcast the
bytes of one wider element are not adjacent in memory, so an element of a wider dtype is `g` units,
each found on its own, and a map of such a ref has a trailing axis of `g` unit positions. Positions are
into the buffer's memory as one flat array of units.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import validate
from palace._src.errors import ShapeError, UnsupportedError
from palace._src.util import prod

AT, BITCAST, RESHAPE = "at", "bitcast", "reshape"   # the steps: (AT, dims), (BITCAST, in bytes,
# out bytes), (RESHAPE, in shape, out shape)

UNIT_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
               8: np.dtype(np.uint64)}


def storage_bits(d) -> int:
  """Bits of one element as a bitcast sees them: 4 for int4/uint4 (ml_dtypes keeps one per byte, in
  its low nibble), the itemsize otherwise."""
  return 4 if d in (dt.int4, dt.uint4) else d.itemsize * 8


def _view_last_axis(a: np.ndarray, src, dst) -> np.ndarray:
  """`a.view(dst)` along the last axis, with 4-bit types packed two to a byte, the first in the low
  nibble (XLA's bitcast_convert_type, element 0 in the lowest bits)."""
  if src in (dt.int4, dt.uint4):
    nib = a.view(np.uint8) & 0xF
    a = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
  if dst not in (dt.int4, dt.uint4):
    return a.view(dst)
  b = a.view(np.uint8)
  nib = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], -1)
  if dst == dt.int4:
    return ((nib.astype(np.int8) ^ 8) - 8).astype(dst)
  return nib.astype(dst)


def bitcast_data(data: np.ndarray, src, dst, axis: int) -> np.ndarray:
  """NumPy `data` of dtype `src` reinterpreted as `dst` along `axis`, whose length scales by the
  width ratio (4-bit types counted as 4 bits, the first element in the lowest bits): the one
  bit-level bitcast of values (pltpu.bitcast) and of 4-bit ref views (refs.PackedRef)."""
  moved = np.ascontiguousarray(np.moveaxis(data, axis, -1))
  return np.moveaxis(_view_last_axis(moved, src, dst), -1, axis)


def bitcast_shape(shape: tuple, src, dst, what: str) -> tuple:
  """The shape of a ref of `shape` and dtype `src` bitcast to `dst`: the second-minor dimension scales
  by the width ratio, 4-bit types counted as 4 bits (errors as JAX's: 1-D refs cannot change width)."""
  w_in, w_out = storage_bits(src), storage_bits(dst)
  if w_in == w_out:
    return tuple(shape)
  if len(shape) < 2:
    raise UnsupportedError(f"{what}: a bitcast that changes the element width of a 1-D ref (shape "
                           f"{tuple(shape)}) is not supported, as in JAX ('Bitcast 1D ref with bitwidth "
                           f"change is not supported'): the width change scales the second-minor "
                           f"dimension. Fix: reshape the ref to 2-D first, or bitcast the loaded value "
                           f"with pltpu.bitcast.")
  rows = shape[-2] * w_in
  if rows % w_out:
    raise ShapeError(f"{what}: the second-minor dimension ({shape[-2]} rows of {src}) of shape "
                     f"{tuple(shape)} does not pack into whole rows of {dst}; expected a multiple of "
                     f"{w_out // w_in}. Fix: bitcast a view whose second-minor dimension is a multiple "
                     f"of {w_out // w_in}.")
  return (*shape[:-2], rows // w_out, shape[-1])


def reshape_shape(shape: tuple, new, what: str) -> tuple:
  """`new` with a -1 resolved, checked against the element count of `shape` (JAX's
  ReshapeTransform: at most one -1)."""
  new = tuple(validate.as_int(s, f"{what} dimension", min_value=-1) for s in new)
  n = prod(shape)
  if new.count(-1) > 1:
    raise ShapeError(f"{what}: at most one dimension can be -1; got {new}. Fix: spell out all but one.")
  if -1 in new:
    known = prod([s for s in new if s != -1])
    if known == 0 or n % known:
      raise ShapeError(f"{what}: cannot infer the -1 of {new} for {n} elements (shape {tuple(shape)}). "
                       f"Fix: pass a shape whose known dimensions divide {n}.")
    new = tuple(n // known if s == -1 else s for s in new)
  if prod(new) != n:
    raise ShapeError(f"{what}: cannot reshape shape {tuple(shape)} ({n} elements) to {new} "
                     f"({prod(new)} elements). Fix: pass a shape with the same number of elements.")
  return new


def unit_of(base_itemsize: int, steps) -> int:
  """The narrowest element width (bytes) of a chain: the grain its maps count in."""
  u = base_itemsize
  for s in steps:
    if s[0] == BITCAST:
      u = min(u, s[2])
  return u


def _pull_at(coords: list, dims) -> list:
  """Coordinates of a view's elements in the array it views (dims: ints / (start, size, stride))."""
  out, it = [], iter(coords)
  for d in dims:
    if type(d) is int:
      out.append(d)
    else:
      c = next(it)
      out.append(d[0] + d[2] * c if d[2] != 1 else d[0] + c)
  return out


def _pull_reshape(coords: list, in_shape, out_shape) -> list:
  flat = 0
  for c, n in zip(coords, out_shape):
    flat = flat * n + c
  out = []
  for n in reversed(in_shape):
    out.append(flat % n)
    flat = flat // n
  return out[::-1]


def _pull_bitcast(coords: list, unit, w_in: int, w_out: int, u: int):
  if w_in == w_out:
    return coords, unit
  row = coords[-2]
  if w_in > w_out:   # narrowing: row i is part i % r of row i // r
    r = w_in // w_out
    return [*coords[:-2], row // r, coords[-1]], (row % r) * (w_out // u) + unit
  r, q = w_out // w_in, w_in // u   # widening: part p of an element is row i * r + p
  part = unit // q
  return [*coords[:-2], row * r + part, coords[-1]], unit % q


def positions(buf_shape: tuple, base_itemsize: int, base_dims, steps, view_dims, unit: int,
              out_itemsize: int) -> np.ndarray:
  """Flat unit positions in the buffer of every element of the view `view_dims` of the chain's final
  array: shape view shape + (g,), g = out_itemsize // unit, or the view's shape when g is 1."""
  key = (buf_shape, base_itemsize, base_dims, steps, view_dims, unit, out_itemsize)
  hit = _CACHE.get(key)
  if hit is not None:
    return hit
  kept = [d for d in view_dims if type(d) is not int]
  nd = len(kept) + 1   # the view's axes, then the units of an element
  coords, j = [], 0
  for d in view_dims:
    if type(d) is int:
      coords.append(d)
      continue
    shape = [1] * nd
    shape[j] = d[1]
    coords.append((d[0] + d[2] * np.arange(d[1], dtype=np.intp)).reshape(shape))
    j += 1
  g = out_itemsize // unit
  unit_off = np.arange(g, dtype=np.intp).reshape([1] * (nd - 1) + [g])
  for step in reversed(steps):
    kind = step[0]
    if kind == AT:
      coords = _pull_at(coords, step[1])
    elif kind == RESHAPE:
      coords = _pull_reshape(coords, step[1], step[2])
    else:
      coords, unit_off = _pull_bitcast(coords, unit_off, step[1], step[2], unit)
  coords = _pull_at(coords, base_dims)
  flat = 0
  for c, n in zip(coords, buf_shape):
    flat = flat * n + c
  pos = flat * (base_itemsize // unit) + unit_off
  shape = tuple(d[1] for d in kept)
  out = np.ascontiguousarray(np.broadcast_to(pos, shape + (g,)), dtype=np.intp)
  if g == 1:
    out = out.reshape(shape)
  out.flags.writeable = False
  _remember(key, out)
  return out


_CACHE: dict = {}    # chain and view -> positions (pure functions of shapes: shared by every buffer)
_CACHE_BYTES = [0]
_CACHE_LIMIT = 64 * 2**20


def _remember(key, arr) -> None:
  if _CACHE_BYTES[0] + arr.nbytes > _CACHE_LIMIT:
    _CACHE.clear()
    _CACHE_BYTES[0] = 0
  if arr.nbytes <= _CACHE_LIMIT // 4:
    _CACHE[key] = arr
    _CACHE_BYTES[0] += arr.nbytes


def flat_units(storage, dtype) -> np.ndarray | None:
  """The buffer's memory as one flat array of `dtype` (a view: writes reach the buffer)."""
  if storage is None:
    return None
  return storage.reshape(-1).view(dtype)


def from_units(data: np.ndarray, dtype) -> np.ndarray:
  """Elements of `dtype` from their units (a trailing axis of g narrower unsigned ints)."""
  a = np.ascontiguousarray(data)
  return a.view(dtype).reshape(a.shape[:-1])


def to_units(data, shape: tuple, dtype, unit_dtype) -> np.ndarray:
  """The units (trailing axis) of a value of `shape` and `dtype` (broadcast to it first)."""
  a = np.ascontiguousarray(np.broadcast_to(np.asarray(data, dtype), shape))
  return a.reshape(shape + (1,)).view(unit_dtype)
