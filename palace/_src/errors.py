"""The PalaceError hierarchy (L0).

Every user-facing error subclasses PalaceError and the builtin that fits, so callers can catch either.
Messages follow: `<what> for <origin> [at grid point ... on chip c core k]: <observed>; expected <expected>.
Fix: <what to do>` -- the fix clause starts with the marker `Fix: ` and an imperative ("use ...", "pass
...", "make ... a multiple of ..."). tests/robustness/test_message_fix_clauses.py enforces the marker on
every construction of a PalaceError in palace/_src (with an allow-list for internal errors).
"""
from __future__ import annotations

from palace._src.util import user_frame_summary


class PalaceError(Exception):
  """Base class of every error palace raises for a user mistake or a hardware limit."""


class BlockSpecError(PalaceError, ValueError):
  """A BlockSpec, grid or index map that the TPU compiler would reject."""


class ShapeError(PalaceError, ValueError):
  """A value of the wrong shape or dtype (stores, ops, kernel operands)."""


class OutOfBoundsError(PalaceError, IndexError):
  """A ref access or DMA outside its buffer."""


class ResourceError(PalaceError, MemoryError):
  """VMEM/SMEM/semaphore capacity exceeded."""


class SyncError(PalaceError, RuntimeError):
  """Semaphores, DMAs, deadlocks and revisit-order violations."""


class RaceError(SyncError):
  """Two accesses to the same data, at least one a write, that no semaphore wait, DMA wait or barrier
  orders (`pl.virtual_tpu(..., detect_races=True)`)."""


class UninitializedReadError(PalaceError, ValueError):
  """A read of memory that was never written (`pl.virtual_tpu(..., uninitialized="raise")`)."""


class TracingError(PalaceError, TypeError):
  """A runtime-dependent value used where real Pallas needs a trace-time constant."""


class MemorySpaceError(PalaceError, ValueError):
  """An access that the memory space does not allow (vector access to HBM or SMEM, ...)."""


class UsageError(PalaceError, ValueError):
  """A wrong argument to a palace API."""


class UnsupportedError(PalaceError, NotImplementedError):
  """A Pallas feature that palace does not implement yet."""

  @classmethod
  def feature(cls, api: str, hint: str = "") -> "UnsupportedError":
    return cls(f"`{api}` is not supported in palace yet." + (f" {hint}" if hint else ""))


class CompilerRejectError(UnsupportedError):
  """A kernel the TPU compiler (Mosaic) rejects, refused as the compiler refuses it: the message quotes
  the compiler's own words. palace.jax raises it at lowering as JAX's Mosaic error type too
  (`palace/_src/jax/compiler_errors.py`), as JAX on a TPU raises the compiler's rejections."""


class MissingApiError(UnsupportedError, AttributeError):
  """A name of jax.numpy / jax.lax that palace.numpy / palace.lax does not have (also an
  AttributeError, so hasattr() and getattr(module, name, default) keep working)."""


def missing_api(module: str, alias: str):
  """The module `__getattr__` of a facade (palace.numpy, palace.lax): an unknown public name raises
  MissingApiError with a fix instead of a bare AttributeError."""
  def __getattr__(name: str):
    if name.startswith("__"):
      raise AttributeError(f"module {module!r} has no attribute {name!r}")
    raise MissingApiError(f"{module} has no {alias}.{name} ({user_frame_summary()}): palace does not "
                          f"implement it (or JAX has no such name). Fix: write it with the ops {module} "
                          f"has (dir({module}) lists them).")
  return __getattr__


numpy_getattr = missing_api("palace.numpy", "jnp")
lax_getattr = missing_api("palace.lax", "lax")
