"""Per-kernel language state (L4a): what a kernel body's primitives remember between calls on one core.

The machine (the executor) knows nothing of it: the launch (launch/run.py) creates one `KernelContext`
per core program and enters it around the body; primitives reach it with `current()`. Today it holds
the barrier semaphore selected by CompilerParams(collective_id=...), the PRNG of pltpu.prng_seed and
the explicit MXU's staging registers and result FIFOs (mxu_fifo.py).
"""
from __future__ import annotations

import contextvars

from palace._src.errors import UsageError


class KernelContext:
  """The language's state for one kernel body on one core (fresh per core and launch)."""
  __slots__ = ("barrier_sem", "prng", "in_barrier", "mxu")

  def __init__(self):
    self.barrier_sem = None   # Ref of the barrier semaphore while the body runs (collective_id set)
    self.prng = None          # tpu_primitives._Prng once pltpu.prng_seed() ran on this core
    self.in_barrier = None    # "pltpu.core_barrier(...) at line" while this core waits in one (kept
    # when the wait never ends: the launch names the core in a deadlock's message)
    self.mxu = None           # mxu_fifo.MxuState once an explicit MXU op ran on this core


_current: contextvars.ContextVar = contextvars.ContextVar("palace_kernel_context", default=None)


def current(api: str = "this operation") -> KernelContext:
  ctx = _current.get()
  if ctx is None:
    raise UsageError(f"{api} was called outside a kernel body. Fix: call it inside the function passed "
                     f"to pl.pallas_call or pl.kernel.")
  return ctx


def enter(ctx: KernelContext):
  """Make `ctx` the current context of this thread (the core's); returns the token for `leave`."""
  return _current.set(ctx)


def leave(token) -> None:
  _current.reset(token)
