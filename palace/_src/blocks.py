"""BlockSpec -> BlockMapping (L2): canonicalise and validate a user's block spec once per launch.

Tiling rule (Mosaic lowering, tpu-hardware.md section 4): the last two block dims must be divisible by
8 and 128 respectively or equal the array dims; rank-1 blocks must equal the array length, be a multiple
of 1024, or be a power of two >= 128 * 32 / bitwidth. Squeezed and Element dims are exempt. An 8-bit
array whose row count is a multiple of 32 is tiled (32, 128) in HBM: its blocks take a multiple of 32
rows (or all).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from palace._src import dtypes as dt
from palace._src import validate
from palace._src.core import (BlockSpec, Blocked, BoundedSlice, Buffered, Element, MemoryRef, MemorySpace,
                              SemaphoreType, Squeezed, is_hbm, no_block_spec)
from palace._src.errors import BlockSpecError, UnsupportedError
from palace._src.util import prod

BLOCKED, SQUEEZED, ELEMENT = "blocked", "squeezed", "element"
# the attribute (set to True) that marks an index map as a pure function of its grid indices which
# charges no work and works on index arrays too (a front end's own maps: palace.jax's equation-free ones)
PURE_INDEX_MAP = "palace_pure_index_map"
# the attribute naming the integer dtype an index map computes in when evaluated on whole index
# columns (block_offsets._vectorised_offsets): int64 (Python ints' range) unless set (palace.jax's
# maps: int32, JAX's index type, so they wrap as JAX's do)
INDEX_DTYPE = "palace_index_dtype"
# the attribute (set to True) that marks an index map as computing its block indices (arithmetic on the
# grid indices, not only picking them or constants: palace.jax's maps with equations), which the chip's
# compiler evaluates every grid step whatever values it gives (a measured rule's cost class,
# hw.ChipSpec.index_map_cycles; a map without it is classed by the offsets it gives)
COMPUTED_INDEX_MAP = "palace_computed_index_map"


@dataclasses.dataclass(frozen=True)
class BlockMapping:
  name: str
  array_shape: tuple
  dtype: object
  dims: tuple                 # per array dim: (kind, size, pad_lo)
  index_map: Callable | None
  space: MemorySpace          # VMEM (pipelined), SMEM (whole array staged, else windowed), ANY (raw HBM)
  buffer_count: int
  use_lookahead: bool
  # the index map is a pure function of the grid indices that charges no work (palace's own, of a
  # BlockSpec without one, or one marked PURE_INDEX_MAP): a launch plan may keep its offsets for
  # every step of any grid (block_offsets.grid_offsets) instead of calling it per step
  pure_index_map: bool = False
  # an output block may be revisited at any later step, not only the next one (JAX's
  # pl.Buffered(1, revisit=pl.RevisitMode.ANY)): the pipeline reads a block written back earlier back
  # into its slot before the body sees it again (pipeline._Steps.outputs)
  revisit_any: bool = False
  # the index map reads scalar-prefetch refs (in SMEM) that the kernel never writes, and nothing else
  # of the kernel's memory (a front end's proof: palace.jax's, from the kernel's effects): a pipeline
  # may find its offsets for every step in one pass over the grid once those refs hold their data,
  # each step still charged the loads and scalar ops its own evaluation makes (prefetch_maps.py)
  prefetch_index_map: bool = False

  # (derived once per mapping: a mapping is immutable and read by every launch of its plan)
  @functools.cached_property
  def block_shape(self) -> tuple:
    """Shape of the ref the kernel sees (squeezed dims removed)."""
    return tuple(s for k, s, _ in self.dims if k != SQUEEZED)

  @functools.cached_property
  def block_bytes(self) -> int:
    return prod(self.block_shape) * self.dtype.itemsize

  def __post_init__(self):
    # what every pipeline over this mapping reads (pipeline._Op), derived once (not fields):
    # `squeezed_dims` the squeezed dims (absent from the block ref); `tiles_evenly` every dim Blocked
    # by a size that divides it (every block whole); `full_slices` per dim slice(0, dim) where the
    # block spans the whole dim (every block indexes it so), else None
    dims, shape = self.dims, self.array_shape
    derived = self.__dict__
    derived["squeezed_dims"] = frozenset([d for d, (k, _, _) in enumerate(dims) if k == SQUEEZED])
    derived["tiles_evenly"] = all([kind == BLOCKED and size > 0 and dim % size == 0
                                   for (kind, size, _), dim in zip(dims, shape)])
    derived["full_slices"] = tuple([slice(0, dim) if size == dim else None
                                    for (_, size, _), dim in zip(dims, shape)])
    # the block is the whole array, every dim kept: an SMEM one is staged whole around the pipeline
    # (launch/plan.grid_stages), any other SMEM block is windowed through SMEM buffers (pipeline._mode)
    derived["whole_array"] = all([kind == BLOCKED and size == dim for (kind, size, _), dim in zip(dims, shape)])

  def buffer_types(self, n: int, space: MemorySpace) -> tuple:
    """((n block buffer types in `space`), their DMA semaphore array type): immutable, so made once
    per mapping and count and reused by every launch of the plan."""
    cache = self.__dict__.setdefault("_buffer_types", {})   # (a frozen dataclass: not a field)
    hit = cache.get((n, space))
    if hit is None:
      hit = cache[(n, space)] = (tuple([MemoryRef(self.block_shape, self.dtype, space) for _ in range(n)]),
                                 SemaphoreType.DMA((n,)))
    return hit

  @property
  def pipelined(self) -> bool:
    return self.space == MemorySpace.VMEM

  def offsets(self, idx) -> tuple:
    """Element offset per array dim for index-map result `idx`."""
    out = []
    for (kind, size, pad), i in zip(self.dims, idx):
      out.append(i * size if kind == BLOCKED else (i - pad if kind == ELEMENT else i))
    return tuple(out)


def _dim(entry, array_dim: int, what: str):
  if entry is None or isinstance(entry, Squeezed):
    return (SQUEEZED, 1, 0)
  if isinstance(entry, Blocked):
    return (BLOCKED, validate.as_int(entry.block_size, f"{what} pl.Blocked size", min_value=0), 0)
  if isinstance(entry, Element):
    return (ELEMENT, validate.as_int(entry.block_size, f"{what} pl.Element size", min_value=0),
            validate.as_int(entry.padding[0], f"{what} pl.Element padding", min_value=0))
  if isinstance(entry, BoundedSlice):
    raise UnsupportedError(
        f"{what}: `pl.BoundedSlice` block dims are not supported by palace's pallas_call and "
        f"emit_pipeline (JAX's TPU compiler rejects them in a pallas_call too, Mosaic's lowering: "
        f"'Unsupported block dimension type'; only JAX's own emit_pipeline takes them, and palace.jax "
        f"runs that one). Fix: use a full pl.Blocked dimension and mask the rows past the bound in "
        f"the kernel.")
  return (BLOCKED, validate.as_int(entry, what, min_value=0), 0)


def canonicalize(spec, shape, dtype, name: str, num_index_args: int,
                 default_space=MemorySpace.VMEM) -> BlockMapping:
  shape = tuple(shape)
  if spec is no_block_spec or spec is None:
    spec = BlockSpec(memory_space=None)
  if not isinstance(spec, BlockSpec):
    raise BlockSpecError(f"The spec for {name} is {spec!r}; expected a pl.BlockSpec. Fix: pass "
                         f"pl.BlockSpec(block_shape, index_map) (or None for the whole array in VMEM).")
  space = spec.memory_space
  if space is None:
    space = default_space
  if space == MemorySpace.HBM:
    space = MemorySpace.ANY
  mode = spec.pipeline_mode or Buffered(2)
  if is_hbm(space):
    if spec.block_shape is not None and tuple(spec.block_shape) != shape:
      raise BlockSpecError(
          f"Block shape for {name} (= {tuple(spec.block_shape)}) must equal the array shape {shape} "
          f"for a pl.ANY / pltpu.HBM operand: those get the whole HBM ref with no windowing. Fix: drop "
          f"block_shape (pl.BlockSpec(memory_space=pl.ANY)), or use VMEM to get blocks.")
    return whole_hbm(name, shape, dtype)
  if space == MemorySpace.HOST:
    if spec.block_shape is not None and tuple(spec.block_shape) != shape:
      raise BlockSpecError(
          f"Block shape for {name} (= {tuple(spec.block_shape)}) must equal the array shape {shape} "
          f"for a pl.HOST operand: it stays in host memory, reached by DMA only. Fix: drop "
          f"block_shape (pl.BlockSpec(memory_space=pl.HOST)) and copy windows of the host ref.")
    return whole_hbm(name, shape, dtype, MemorySpace.HOST)
  if space not in (MemorySpace.VMEM, MemorySpace.SMEM):
    raise UnsupportedError.feature(f"BlockSpec memory_space={space}", "Fix: use pltpu.VMEM (the default), "
                                  "pltpu.SMEM, pl.ANY or pltpu.HBM.")
  block_shape = spec.block_shape if spec.block_shape is not None else shape
  if len(block_shape) != len(shape):
    raise BlockSpecError(f"Block shape for {name} (= {tuple(block_shape)}) must have the same number "
                         f"of dimensions as the array shape {shape}. Fix: give one block dimension per array "
                         f"dimension ({len(shape)}), using None or pl.squeezed for size-1 ones.")
  dims = tuple(_dim(e, s, f"block_shape[{d}] of {name}")
               for d, (e, s) in enumerate(zip(block_shape, shape)))
  check_block(name, shape, dtype, dims, space, tuple(block_shape))
  index_map = spec.index_map
  if index_map is None:
    rank = len(shape)
    index_map = lambda *args: (0,) * rank  # noqa: E731
  n = buffer_count(dims, shape, space, None if spec.pipeline_mode is None else mode.buffer_count)
  pure = spec.index_map is None or getattr(spec.index_map, PURE_INDEX_MAP, False) is True
  return BlockMapping(name, shape, dtype, dims, index_map, space, n, bool(mode.use_lookahead), pure)


# ---- the parts of a mapping, for every front end (palace.jax builds its mappings from JAX's with them)
def whole_hbm(name: str, shape: tuple, dtype, space: MemorySpace = MemorySpace.ANY) -> BlockMapping:
  """The mapping of an operand that stays in HBM (pl.ANY / pltpu.HBM), or in `space` = HOST (pl.HOST,
  the host's pinned memory): the kernel gets the whole ref."""
  return BlockMapping(name, shape, dtype, tuple((BLOCKED, s, 0) for s in shape), None, space, 1, False)


def check_block(name: str, shape: tuple, dtype, dims: tuple, space: MemorySpace, shown=None) -> None:
  """The checks of a VMEM / SMEM block given as canonical `dims` ((kind, size, low padding) per array
  dim): every size >= 1; a VMEM block has rank >= 1 and follows the TPU's tiling rule. `shown`: the
  block shape as the user wrote it, for messages (default: the sizes, None for squeezed dims)."""
  if shown is None:
    shown = tuple(size if kind != SQUEEZED else None for kind, size, _ in dims)
  for (kind, size, _), s in zip(dims, shape):
    if size <= 0:
      raise BlockSpecError(f"Block shape for {name} (= {tuple(shown)}) has a non-positive size. "
                           f"Fix: every block dimension must be >= 1 (None for a squeezed size-1 dimension).")
  if space == MemorySpace.VMEM:
    if not shape:
      raise BlockSpecError(
          f"Block shape for {name} (= ()) is rank 0; expected rank >= 1, TPU VMEM blocks are vectors. "
          f"Fix: pass the scalar as shape (1,) or keep it in SMEM with "
          f"pl.BlockSpec(memory_space=pltpu.SMEM).")
    _check_tiling(dims, shape, dtype, name)


def buffer_count(dims: tuple, shape: tuple, space: MemorySpace, requested: int | None = None) -> int:
  """How many buffers a block gets: `requested` (pl.Buffered(n); None: double buffering), except one
  for an SMEM block and for a block that covers the whole array without an explicit pipeline mode
  (fetched once: [xla-cost] VMEM rule)."""
  whole = all(k == BLOCKED and sz == dim for (k, sz, _), dim in zip(dims, shape))
  if space == MemorySpace.SMEM or (whole and requested is None):
    return 1
  return 2 if requested is None else requested


# rows of the HBM tile XLA gives an 8-bit array whose row count (second-minor dim) is a multiple of
# it: (32, 128). Measured on a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05*.jsonl), every 8-bit
# probe fits that rule: int8 (64, 256) fails in (8, 128) and (16, 128) blocks and runs in (32, 128);
# uint8 and float8_e4m3fn (64, 256) fail in (16, 128) blocks; int8 (32, 256) fails in (8, 128) blocks;
# int8 (96, 256) runs in (32, 128) blocks; int8 (48, 256) runs in (16, 128) blocks and (16, 256) in
# (8, 128) blocks (not multiples of 32: no such tiling). 16-bit arrays take 8-row blocks. What tiling
# XLA gives 48 rows (whether 8-row blocks fit it) is not measured: palace applies the general rule.
_TILE_ROWS_8BIT = 32


def _check_tiling(dims, shape, dtype, name):
  kinds = [k for k, _, _ in dims]
  sizes = [s for _, s, _ in dims]
  rank = len(shape)
  if rank == 1:
    if kinds[0] != BLOCKED:
      return
    b, a = sizes[0], shape[0]
    min_pow2 = 128 * (32 // dt.bits(dtype)) if dt.bits(dtype) <= 32 else 128
    if not (b == a or b % 1024 == 0 or (b >= min_pow2 and b & (b - 1) == 0)):
      raise BlockSpecError(
          f"Block shape for {name} (= ({b},)) is not a valid rank-1 TPU block for an array of shape "
          f"{shape} and dtype {dtype}: expected the full length {a}, a multiple of 1024, or a power of "
          f"2 >= {min_pow2}. Fix: use one of those block lengths.")
    return
  bad = []
  for pos, unit in ((-1, 128), (-2, 8)):
    if kinds[pos] != BLOCKED:
      continue
    if not (sizes[pos] == shape[pos] or sizes[pos] % unit == 0):
      bad.append((pos, sizes[pos], unit, shape[pos]))
  block = tuple(s if k != SQUEEZED else None for k, s in zip(kinds, sizes))
  if not bad and dt.bits(dtype) == 8 and kinds[-2] == BLOCKED and shape[-2] % _TILE_ROWS_8BIT == 0 and \
      sizes[-2] != shape[-2] and sizes[-2] % _TILE_ROWS_8BIT:
    raise BlockSpecError(
        f"Block shape for {name} (= {block}) does not fit the (32, 128) HBM tiling of an 8-bit array of "
        f"shape {shape} ({dtype}): dim {rank - 2} is {sizes[-2]}, not a multiple of 32 nor the array "
        f"dim {shape[-2]}; XLA tiles an 8-bit array whose row count is a multiple of 32 so (Mosaic on a "
        f"TPU v5e: 'Operand of shape (..., 64, 256) has tiling (32, 128), but its block shape (..., 8, "
        f"128) is not divisible by tiling evenly nor matches the full shape'). Fix: use a multiple of 32 "
        f"rows for {dtype} blocks, e.g. {block[:-2] + (32, block[-1])}.")
  if bad:
    what = "; ".join(f"dim {rank + p} is {b}, not a multiple of {u} nor the array dim {a}"
                     for p, b, u, a in bad)
    raise BlockSpecError(
        f"Block shape for {name} (= {block}) breaks the TPU tiling rule for an array of shape "
        f"{shape}: {what}. The last two block dims must be divisible by 8 and 128 (or equal the "
        f"array dims). Fix: pad the array or pick block sizes like (8k, 128m).")
