"""Specs (L2): memory spaces, allocation types, BlockSpec/GridSpec, CompilerParams, meshes.

User specs are plain frozen dataclasses; `pipeline.py` canonicalises them into mappings once per launch.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Callable, Sequence

import numpy as np

from palace._src import dtypes as dt
from palace._src import validate
from palace._src.errors import BlockSpecError, UsageError
from palace._src.util import prod


class MemorySpace(enum.Enum):
  """Where a buffer lives. Calling a member makes an allocation type: `VMEM((8, 128), f32)`."""
  ANY = "any"
  HBM = "hbm"
  VMEM = "vmem"
  SMEM = "smem"
  VMEM_SHARED = "vmem_shared"
  CMEM = "cmem"
  SEMAPHORE = "semaphore_mem"
  HOST = "host"   # the host's pinned memory: reached by DMA only, across the chip's host link (PCIe)

  def __str__(self):
    return self.value

  def __call__(self, shape, dtype) -> "MemoryRef":
    return MemoryRef(validate.as_dims(shape, f"pltpu.{self.name}(shape)"),
                     dt.canonicalize(dtype, keep_64bit=True), self)

  def like(self, x) -> "MemoryRef":
    return self(x.shape, x.dtype)

  def __matmul__(self, mesh):  # `pltpu.VMEM @ mesh`: the space tied to a mesh; one space per core here
    return self


ANY = MemorySpace.ANY
HOST = MemorySpace.HOST


def is_hbm(space: MemorySpace) -> bool:
  return space in (MemorySpace.ANY, MemorySpace.HBM)


@dataclasses.dataclass(frozen=True)
class ShapeDtypeStruct:
  shape: tuple
  dtype: Any

  def __init__(self, shape, dtype, **_ignored):
    object.__setattr__(self, "shape", validate.as_dims(shape, "pl.ShapeDtypeStruct shape"))
    if dtype is None:
      raise UsageError("pl.ShapeDtypeStruct dtype is None. Fix: pass a dtype, e.g. jnp.float32.")
    object.__setattr__(self, "dtype", dt.canonicalize(dtype))

  @property
  def ndim(self):
    return len(self.shape)

  @property
  def size(self):
    return prod(self.shape)

  def __repr__(self):
    return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype})"


@dataclasses.dataclass(frozen=True)
class MemoryRef:
  """A ShapeDtypeStruct plus a memory space: what `pltpu.VMEM(shape, dtype)` returns."""
  shape: tuple
  dtype: np.dtype
  memory_space: MemorySpace

  @functools.cached_property   # (immutable; read by every allocation of the type)
  def nbytes(self) -> int:
    return prod(self.shape) * self.dtype.itemsize

  def get_array_aval(self):
    return ShapeDtypeStruct(self.shape, self.dtype)


class SemaphoreKind(enum.Enum):
  REGULAR = "regular"
  DMA = "dma"
  BARRIER = "barrier"

  def __str__(self):
    return self.value


@dataclasses.dataclass(frozen=True)
class SemaphoreRefType:
  """An allocation of semaphores: `SemaphoreType.DMA` (scalar) or `SemaphoreType.DMA((n,))`.
  `SemaphoreType.REGULAR(()) @ mesh` ties it to one mesh of an MPMD pl.kernel: it lives on that
  mesh's cores, and the bodies of the other meshes signal those (launch/run.py)."""
  kind: SemaphoreKind
  shape: tuple = ()
  mesh: Any = None

  def __call__(self, shape):
    return SemaphoreRefType(self.kind, validate.as_dims(shape, f"pltpu.SemaphoreType.{self.kind.name}(shape)"),
                            self.mesh)

  def __matmul__(self, mesh):
    return dataclasses.replace(self, mesh=mesh)

  @property
  def dtype(self):
    return dt.int32

  @property
  def memory_space(self):
    return MemorySpace.SEMAPHORE


class SemaphoreType:
  """`pltpu.SemaphoreType.{REGULAR, DMA, BARRIER}`."""
  REGULAR = SemaphoreRefType(SemaphoreKind.REGULAR)
  DMA = SemaphoreRefType(SemaphoreKind.DMA)
  BARRIER = SemaphoreRefType(SemaphoreKind.BARRIER)


# ------------------------------------------------------------------ block dims
@dataclasses.dataclass(frozen=True)
class Blocked:
  block_size: int


@dataclasses.dataclass(frozen=True)
class Squeezed:
  pass


squeezed = Squeezed()


@dataclasses.dataclass(frozen=True)
class Element:
  block_size: int
  padding: tuple = (0, 0)


@dataclasses.dataclass(frozen=True)
class BoundedSlice:
  block_size: int


@dataclasses.dataclass(frozen=True)
class Buffered:
  buffer_count: int = 2
  use_lookahead: bool = False

  def __post_init__(self):
    object.__setattr__(self, "buffer_count", validate.as_int(
        self.buffer_count, "pl.Buffered(buffer_count)", min_value=1,
        hint="pass an integer number of buffers >= 1 (1 = no double buffering)."))
    object.__setattr__(self, "use_lookahead", validate.as_bool(
        self.use_lookahead, "pl.Buffered(use_lookahead)"))


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  block_shape: Sequence | None = None
  index_map: Callable | None = None
  pipeline_mode: Buffered | None = None
  memory_space: MemorySpace | None = None

  def __init__(self, block_shape=None, index_map=None, pipeline_mode=None, *, memory_space=None):
    if block_shape is not None and (isinstance(block_shape, (str, bytes)) or
                                    not hasattr(block_shape, "__iter__")):
      raise BlockSpecError(f"pl.BlockSpec(block_shape) must be a tuple of block dimensions; got "
                           f"{block_shape!r}. Fix: pass e.g. pl.BlockSpec((128, 256), lambda i, j: (i, j)), "
                           f"with None or pl.squeezed for dimensions of size 1 that are dropped.")
    if index_map is not None and not callable(index_map):
      raise BlockSpecError(f"pl.BlockSpec(index_map) must be a function of the grid indices returning "
                           f"block indices; got {index_map!r}. Fix: pass e.g. lambda i, j: (i, j).")
    if pipeline_mode is not None and not isinstance(pipeline_mode, Buffered):
      raise BlockSpecError(f"pl.BlockSpec(pipeline_mode) must be a pl.Buffered(n); got {pipeline_mode!r}. "
                           f"Fix: pass pipeline_mode=pl.Buffered(1) (or 2, 3, ...).")
    if memory_space is not None and not isinstance(memory_space, MemorySpace):
      raise BlockSpecError(f"pl.BlockSpec(memory_space) must be a memory space such as pltpu.VMEM, "
                           f"pltpu.SMEM or pl.ANY; got {memory_space!r}. Fix: pass memory_space=pltpu.SMEM "
                           f"(or VMEM, ANY).")
    object.__setattr__(self, "block_shape", None if block_shape is None else tuple(block_shape))
    object.__setattr__(self, "index_map", index_map)
    object.__setattr__(self, "pipeline_mode", pipeline_mode)
    object.__setattr__(self, "memory_space", memory_space)


class _NoBlockSpec:
  def __repr__(self):
    return "no_block_spec"


no_block_spec = _NoBlockSpec()


@dataclasses.dataclass(frozen=True)
class GridSpec:
  grid: Any = ()
  in_specs: Any = no_block_spec
  out_specs: Any = no_block_spec
  scratch_shapes: Any = ()
  num_scalar_prefetch: int = 0

  def __post_init__(self):
    object.__setattr__(self, "num_scalar_prefetch", validate.as_int(
        self.num_scalar_prefetch, f"{type(self).__name__}(num_scalar_prefetch)", min_value=0))


class PrefetchScalarGridSpec(GridSpec):
  def __init__(self, num_scalar_prefetch, grid=(), in_specs=no_block_spec, out_specs=no_block_spec,
               scratch_shapes=()):
    super().__init__(grid, in_specs, out_specs, scratch_shapes, validate.as_int(
        num_scalar_prefetch, "PrefetchScalarGridSpec(num_scalar_prefetch)", min_value=0))


class GridDimensionSemantics(enum.Enum):
  PARALLEL = "parallel"
  CORE_PARALLEL = "core_parallel"
  SUBCORE_PARALLEL = "subcore_parallel"
  ARBITRARY = "arbitrary"

  def __str__(self):
    return self.value


class DeviceIdType(enum.Enum):
  """`pl.DeviceIdType`: how the device_id of a remote copy or signal names a chip. MESH: mesh
  coordinates (a tuple, one per mesh axis, or a dict of the axes that change); LOGICAL: an int, the
  chip's row-major position in the mesh. Without a device_id_type palace takes both forms (an int is
  a logical id)."""
  MESH = "mesh"
  LOGICAL = "logical"

  def __str__(self):
    return self.value


PARALLEL = GridDimensionSemantics.PARALLEL
CORE_PARALLEL = GridDimensionSemantics.CORE_PARALLEL
SUBCORE_PARALLEL = GridDimensionSemantics.SUBCORE_PARALLEL
ARBITRARY = GridDimensionSemantics.ARBITRARY


def canonical_semantics(x) -> GridDimensionSemantics:
  try:
    return x if isinstance(x, GridDimensionSemantics) else GridDimensionSemantics(str(x))
  except ValueError:
    raise UsageError(f"dimension_semantics entry {x!r}: expected one of "
                     f"{[s.value for s in GridDimensionSemantics]}. Fix: use 'parallel' for independent "
                     f"grid axes and 'arbitrary' for axes carrying state (accumulation).") from None


# the side effect types a kernel may declare (besides a bool), by their values in JAX's SideEffectType
_SIDE_EFFECT_TYPES = ("pure", "dataflow_side_effecting", "side_effecting")


@dataclasses.dataclass(frozen=True)
class CompilerParams:
  dimension_semantics: Sequence | None = None
  allow_input_fusion: Sequence | None = None
  vmem_limit_bytes: int | None = None
  collective_id: int | None = None
  has_side_effects: Any = False
  flags: dict | None = None
  internal_scratch_in_bytes: int | None = None
  serialization_format: int = 1
  disable_bounds_checks: bool = False
  disable_semaphore_checks: bool = False
  skip_device_barrier: bool = False
  allow_collective_id_without_custom_barrier: bool = False
  shape_invariant_numerics: bool = True
  use_tc_tiling_on_sc: bool | None = None
  needs_layout_passes: bool = True
  fuse_transposed_lhs_in_matmul: bool = False
  opt_level: int | None = None

  def __post_init__(self):
    what = "pltpu.CompilerParams"
    if self.vmem_limit_bytes is not None:
      object.__setattr__(self, "vmem_limit_bytes", validate.as_int(
          self.vmem_limit_bytes, f"{what}(vmem_limit_bytes)", min_value=1,
          hint="pass a byte count, e.g. vmem_limit_bytes=64 * 2**20, or None for the chip's default."))
    for field in ("collective_id", "internal_scratch_in_bytes", "opt_level"):
      v = getattr(self, field)
      if v is not None:
        object.__setattr__(self, field, validate.as_int(v, f"{what}({field})", min_value=0))
    if self.dimension_semantics is not None:
      ds = self.dimension_semantics
      if isinstance(ds, (str, GridDimensionSemantics)) or not hasattr(ds, "__iter__"):
        raise UsageError(f"{what}(dimension_semantics) must be a sequence with one entry per grid axis; "
                         f"got {ds!r}. Fix: pass e.g. dimension_semantics=('parallel', 'arbitrary').")
      object.__setattr__(self, "dimension_semantics", tuple(canonical_semantics(x) for x in ds))
    for field in ("disable_bounds_checks", "disable_semaphore_checks", "skip_device_barrier",
                  "allow_collective_id_without_custom_barrier", "shape_invariant_numerics",
                  "needs_layout_passes", "fuse_transposed_lhs_in_matmul"):
      validate.as_bool(getattr(self, field), f"{what}({field})")
    effect = self.has_side_effects
    if not isinstance(effect, bool) and \
        str(getattr(effect, "value", effect)).lower() not in _SIDE_EFFECT_TYPES:
      raise UsageError(f"{what}(has_side_effects): Invalid side effect type: {effect!r}; expected a "
                       f"bool or a side effect type {list(_SIDE_EFFECT_TYPES)} (JAX's TPU lowering "
                       f"raises ValueError for it too). Fix: pass True, False or "
                       f"pltpu.SideEffectType.SIDE_EFFECTING.")
    if self.flags is not None and not isinstance(self.flags, dict):
      raise UsageError(f"{what}(flags) must be a dict of Mosaic flags; got {self.flags!r}. Fix: pass "
                       f"e.g. flags={{'xla_tpu_...': True}} or leave it None.")

  def replace(self, **kw) -> "CompilerParams":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class InterpretParams:
  """`pltpu.InterpretParams`: JAX's TPU-interpreter options. palace always runs kernels on its virtual
  TPU; passed as `interpret=` it adjusts that launch: `detect_races`, `dma_execution_mode` ('eager' /
  'on_wait' DMA policies), `random_seed` (the machine's seed), `uninitialized_memory` ('nan' only: palace
  never zero-fills) and `out_of_bounds_reads` ('raise', palace's default). Other fields are accepted and
  ignored (they tune JAX's interpreter itself)."""
  detect_races: bool = False
  on_race: str = "raise"
  out_of_bounds_reads: str = "raise"
  skip_floating_point_ops: bool = False
  uninitialized_memory: str = "nan"
  num_cores_or_threads: int = 1
  vector_clock_size: int | None = None
  logging_mode: object = None
  dma_execution_mode: str = "on_wait"
  random_seed: int | None = None
  grid_point_recorder: object = None
  allow_hbm_allocation_in_run_scoped: bool = False
  buffer_bounds: str = "logical"


@dataclasses.dataclass(frozen=True)
class CostEstimate:
  flops: int
  transcendentals: int
  bytes_accessed: int
  remote_bytes_transferred: int = 0


@dataclasses.dataclass(frozen=True)
class TensorCoreMesh:
  """`pltpu.TensorCoreMesh(axis_name="core", num_cores=n)`; num_cores defaults to the chip's cores."""
  axis_name: str = "core"
  num_cores: int | None = None

  def __init__(self, axis_name: str = "core", num_cores: int | None = None, *, devices=None):
    object.__setattr__(self, "axis_name", validate.as_name(axis_name, "pltpu.TensorCoreMesh(axis_name)",
                                                           hint='pass a mesh axis name, e.g. "core".'))
    object.__setattr__(self, "num_cores", None if num_cores is None else validate.as_int(
        num_cores, "pltpu.TensorCoreMesh(num_cores)", min_value=1))

  @property
  def shape(self):
    return {self.axis_name: self.num_cores}
