"""The PalaceError hierarchy (L0).

Every user-facing error subclasses PalaceError and the builtin that fits, so callers can catch either.
Messages follow: `<what> for <origin> [at grid point ... on chip c core k]: <observed>; expected <expected>.
Fix: <what to do>` -- the fix clause starts with the marker `Fix: ` and an imperative ("use ...", "pass
...", "make ... a multiple of ..."). tests/robustness/test_message_fix_clauses.py enforces the marker on
every construction of a PalaceError in palace/_src (with an allow-list for internal errors).
"""
from __future__ import annotations


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
