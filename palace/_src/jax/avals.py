"""JAX abstract values and memory spaces -> palace allocation types and memory spaces."""
from __future__ import annotations

import numpy as np

from palace._src.core import MemorySpace, SemaphoreType
from palace._src.errors import UnsupportedError

_SPACES = {"any": MemorySpace.ANY, "hbm": MemorySpace.HBM, "vmem": MemorySpace.VMEM,
           "smem": MemorySpace.SMEM, "vmem_shared": MemorySpace.VMEM_SHARED, "cmem": MemorySpace.CMEM,
           "semaphore_mem": MemorySpace.SEMAPHORE}


def memory_space(space, default=MemorySpace.VMEM, what: str = "a ref"):
  """A JAX memory space (pallas or mosaic MemorySpace, or None) as palace's MemorySpace."""
  if space is None:
    return default
  if hasattr(space, "mesh") and hasattr(space, "memory_space"):
    # a memory space tied to a mesh (`pltpu.VMEM(...) @ mesh`, pallas CoreMemorySpace): the memory
    # space itself, on the cores of the kernel's mesh
    space = space.memory_space
  if type(space).__module__ == "jax._src.core" and getattr(space, "name", None) == "Device":
    # JAX's own memory space of device arrays (jax.new_ref / jax.empty_ref outside a kernel): the
    # chip's device memory, HBM, as Pallas' ANY
    return MemorySpace.ANY
  value = str(getattr(space, "value", space)).lower()
  if value == "default":
    return default
  if value == "host" or str(getattr(space, "name", "")).lower() == "host":   # (pl.HOST's enum: core's)
    return MemorySpace.HOST   # (the host's pinned memory: pallas_call operands and outputs only)
  if value not in _SPACES:
    raise UnsupportedError(f"palace.jax: memory space {space!r} of {what} is not covered "
                           f"(covered: {sorted(_SPACES)}). Fix: use one of the covered memory spaces.")
  return _SPACES[value]


def semaphore_kind(dtype):
  """The palace semaphore allocation for a JAX semaphore dtype, or None for a plain dtype."""
  from jax._src.pallas import core as pc  # noqa: PLC0415
  from jax._src.pallas.mosaic import core as tc  # noqa: PLC0415
  t = getattr(dtype, "type", None)
  if t is None or not isinstance(t, type) or not issubclass(t, pc.semaphore_dtype):
    return None
  if issubclass(t, tc.dma_semaphore):
    return SemaphoreType.DMA
  if issubclass(t, pc.barrier_semaphore):
    return SemaphoreType.BARRIER
  return SemaphoreType.REGULAR


def physical(aval):
  """`aval` as palace holds its values: a PRNG key array (an extended dtype) as its key data, as
  JAX's TPU lowering keeps it (uint32, with the key's trailing dimensions: `jax.random.key_data`'s
  shape); any other aval unchanged (a semaphore too: its int32 handles are `host_dtype`'s)."""
  from jax._src import dtypes as jax_dtypes  # noqa: PLC0415
  dtype = getattr(aval, "dtype", None)
  if dtype is None or not jax_dtypes.issubdtype(dtype, jax_dtypes.prng_key):
    return aval
  from jax._src import core as jax_core  # noqa: PLC0415
  return jax_core.physical_aval(aval)


def alloc_type(aval, what: str):
  """A JAX ref aval (scratch operand, run_scoped allocation) as a palace allocation type."""
  inner = physical(getattr(aval, "inner_aval", aval))
  shape = tuple(int(s) for s in inner.shape)
  sem = semaphore_kind(inner.dtype)
  if sem is not None:
    return sem(shape)
  space = memory_space(getattr(aval, "memory_space", None), MemorySpace.VMEM, what)
  if space is MemorySpace.HOST:
    raise UnsupportedError(
        f"palace.jax: {what} in host memory (pl.HOST) is not supported: palace places pallas_call "
        f"operands and outputs in the host's pinned memory, not scratch or scoped allocations. Fix: "
        f"allocate it in VMEM or HBM (pl.ANY), or pass a pl.HOST operand.")
  return space(shape, np.dtype(inner.dtype))


def host_dtype(dtype) -> np.dtype:
  """The NumPy dtype of a launch operand or result of JAX dtype `dtype` in XLA's buffers: int32 for a
  semaphore (JAX's physical type of one: its handle, sim/carried.py), else the dtype itself."""
  return np.dtype(np.int32) if semaphore_kind(dtype) is not None else np.dtype(dtype)
