"""Windows of an HBM array that reach into its tile padding (L4a).

On a TPU an array in HBM is laid out in tiles: its minor dim in rows of 128 lanes, its second-minor dim
in groups of 8 rows of 32-bit words (16 of 16-bit, 32 of 8-bit values), so a (551, 922) float32 array
occupies (552, 1024) words. A DMA may name a window that covers the last tile whole, e.g. columns
[896, 1024) of that array: JAX's own `emit_pipeline` does so for the edge blocks of an array its
blocks do not divide (jax/_src/pallas/mosaic/pipeline.py rounds an edge block up to the tiling). Such
a window is in bounds on the chip. palace keeps only the array's elements, so a copy to or from such a
window moves the part inside the array: the rest of a VMEM destination keeps what it held (on a TPU,
the padding's unspecified contents), and what a copy writes beyond the array is dropped (the padding
is never visible). Only the tiled dims of an HBM / ANY buffer, from an unsliced dim of it, get the
padding; every other out-of-bounds window is an OutOfBoundsError as before.
"""
from __future__ import annotations

from palace._src.core import is_hbm

LANES = 128          # minor-dim tile
SUBLANE_WORDS = 8    # second-minor tile, in 32-bit words


def padded_extent(buf, axis: int) -> int:
  """The tile-padded size of `buf`'s dim `axis` in HBM (its own size for an untiled dim or a buffer
  that is not in HBM)."""
  shape = buf.shape
  n = shape[axis]
  if not is_hbm(buf.memory_space):
    return n
  rank = len(shape)
  packing = max(1, 4 // max(1, buf.dtype.itemsize))
  if axis == rank - 1:
    tile = LANES if rank > 1 else LANES * packing
  elif axis == rank - 2:
    tile = SUBLANE_WORDS * packing
  else:
    return n
  return -(-n // tile) * tile


def allows(buf, axis: int, dim, s0: int, size: int, stride: int) -> bool:
  """May a view of `buf` whose dim `axis` is still `dim` (start, size, stride) take [s0, s0 + size)
  of it, reaching into the tile padding?"""
  return (stride == 1 and s0 >= 0 and axis < len(buf.shape) and dim == (0, buf.shape[axis], 1) and
          s0 + size <= padded_extent(buf, axis))


def padding_note(buf, axis: int, dim) -> str:
  """For the out-of-bounds message of a tiled HBM dim: the end of its last tile, up to which a
  unit-stride window may reach."""
  if axis >= len(buf.shape):
    return ""
  end = padded_extent(buf, axis)
  if end == buf.shape[axis] or dim != (0, buf.shape[axis], 1):
    return ""
  return f" (or, unit-stride, <= {end}: the end of the last HBM tile of that dim)"


def beyond(ref) -> bool:
  """Does this view reach past its buffer's elements (into the tile padding)?"""
  shape = ref.buf.shape
  # (a view whose dims are not the buffer's, e.g. a reshaped or bitcast one, never takes the padding:
  # `allows` gives it only to a dim of the buffer itself)
  if ref._full or getattr(ref, "_mapped", False) or len(ref.dims) != len(shape) or \
      not is_hbm(ref.buf.memory_space):
    return False
  for k, d in enumerate(ref.dims):   # (a loop: no generator frame per dim, on every DMA's start)
    if type(d) is tuple and d[0] + d[1] > shape[k]:
      return True
  return False


def clipped(src, dst) -> tuple:
  """(source NumPy index, destination NumPy index, shape) of a copy between two views of one shape,
  one or both reaching into tile padding: only the elements inside both buffers are copied."""
  keep = []   # per dim of the copied shape: how many leading elements both sides hold
  for ref in (src, dst):
    shape, k = ref.buf.shape, 0
    for axis, d in enumerate(ref.dims):
      if type(d) is tuple:
        n = min(d[1], max(0, shape[axis] - d[0])) if d[2] == 1 else d[1]
        keep.append((k, n))
        k += 1
  sizes = list(src.shape)
  for k, n in keep:
    sizes[k] = min(sizes[k], n)

  def index(ref):
    out, k = [], 0
    for d in ref.dims:
      if type(d) is tuple:
        out.append(slice(d[0], d[0] + sizes[k]) if d[2] == 1 else
                   slice(d[0], d[0] + (sizes[k] - 1) * d[2] + 1 if sizes[k] else d[0], d[2]))
        k += 1
      else:
        out.append(d)
    return tuple(out)
  return index(src), index(dst), tuple(sizes)
