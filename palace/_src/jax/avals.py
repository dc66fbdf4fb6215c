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
  if type(space).__module__ == "jax._src.core" and getattr(space, "name", None) == "Device":
    # JAX's own memory space of device arrays (jax.new_ref / jax.empty_ref outside a kernel): the
    # chip's device memory, HBM, as Pallas' ANY
    return MemorySpace.ANY
  value = str(getattr(space, "value", space)).lower()
  if value == "default":
    return default
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


def alloc_type(aval, what: str):
  """A JAX ref aval (scratch operand, run_scoped allocation) as a palace allocation type."""
  inner = getattr(aval, "inner_aval", aval)
  shape = tuple(int(s) for s in inner.shape)
  sem = semaphore_kind(inner.dtype)
  if sem is not None:
    return sem(shape)
  space = memory_space(getattr(aval, "memory_space", None), MemorySpace.VMEM, what)
  return space(shape, np.dtype(inner.dtype))
