"""The executor interface (L3): everything a running kernel may ask of the machine.

Language ops (`palace/_src/lang/*`) call `current()`; the virtual TPU (`palace/_src/sim/`) implements the
protocol. Nothing else connects the two sides: `pallas_call`/`kernel` set the context variable.
"""
from __future__ import annotations

import contextvars
from typing import Any, Protocol

from palace._src.errors import UsageError


class Executor(Protocol):
  chip: Any                 # hw.ChipSpec
  timing_only: bool
  bounds_checks: bool
  grid_stack: list          # language-managed: [(indices tuple, sizes tuple), ...] innermost last
  now: int                  # the core's issue clock (cycles)
  chip_index: int
  core_id: int
  axis_env: dict            # mesh axis name -> (index, size)
  deferred_values: bool     # whole-buffer stores may keep deferred values (load then returns them)
  host_cache: dict          # per-launch host caches owned by the language side (lang/deferred.py)

  # values and compute
  def load(self, buf, index, shape, site=None): ...          # -> (np data | None, ready_cycle)
  def store(self, buf, index, shape, data, ready: int) -> None: ...
  def note_access(self, buf, index, kind: str, shape, atomic: bool = False) -> None: ...  # by lang
  def vector_op(self, op_class: str, shape, dtype, ready: int) -> int: ...
  def matmul(self, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype, ready: int) -> int: ...
  def scalar_op(self, ready: int = 0) -> int: ...
  # memory
  def alloc(self, mem_type, name: str, shared: bool = False): ...  # -> core.Buffer
  def free(self, buf) -> None: ...
  # DMA and semaphores
  def dma_start(self, desc) -> None: ...
  def dma_wait(self, desc, which: str) -> None: ...
  def sem_signal(self, buf, index, inc: int, device_id=None, core_index=None) -> None: ...
  def sem_wait(self, buf, index, value: int, decrement: bool = True) -> None: ...
  def sem_read(self, buf, index) -> int: ...
  # bookkeeping
  def grid_step(self) -> None: ...
  def where(self) -> str: ...
  def debug_print(self, text: str) -> None: ...


_current: contextvars.ContextVar = contextvars.ContextVar("palace_executor", default=None)


def current(api: str = "this operation"):
  ex = _current.get()
  if ex is None:
    raise UsageError(f"{api} was called outside a kernel body; call it inside the function passed to "
                     f"pl.pallas_call or pl.kernel.")
  return ex


def maybe_current():
  return _current.get()


def set_current(ex):
  return _current.set(ex)


def reset_current(token) -> None:
  _current.reset(token)


class DmaRequest:
  """A copy between two buffer views, as the language hands it to the machine.

  Views are (Buffer, NumPy index tuple, shape). `sem` is the destination semaphore slot, signalled by
  the byte count when the write lands; `src_sem` (optional) when the read completes. `device_id` is a
  resolved chip index for remote copies (None = local), `core_index` a target core on the same chip.
  `describe` names both sides for messages; `site` is the user's (file, line) of `.start()`.
  """
  __slots__ = ("src_buf", "src_index", "dst_buf", "dst_index", "shape", "sem_buf", "sem_index",
               "src_sem_buf", "src_sem_index", "add", "device_id", "core_index", "site", "labels",
               "nbytes", "src_indices", "dst_indices", "mask", "fast")

  def __init__(self, src_buf, src_index, dst_buf, dst_index, shape, sem_buf=None, sem_index=(),
               src_sem_buf=None, src_sem_index=(), add=False, device_id=None, core_index=None,
               site=None, labels=None, nbytes=0, src_indices=None, dst_indices=None):
    self.src_buf, self.src_index, self.dst_buf, self.dst_index = src_buf, src_index, dst_buf, dst_index
    self.shape, self.sem_buf, self.sem_index = shape, sem_buf, sem_index
    self.src_sem_buf, self.src_sem_index, self.add = src_sem_buf, src_sem_index, add
    self.device_id, self.core_index, self.site, self.labels = device_id, core_index, site, labels
    self.nbytes, self.src_indices, self.dst_indices = nbytes, src_indices, dst_indices
    self.mask = None  # indexed DMAs: which index entries are used (None: all)
    self.fast = None  # the executor's per-request cache (sim/tensorcore.py dma_start)

  @property
  def describe(self) -> str:
    """'src -> dst' with operand names and windows (built only when a message needs it)."""
    if self.labels is None:
      return f"{self.src_buf.name} -> {self.dst_buf.name}"
    a, b = self.labels
    return f"{a.origin()} -> {b.origin()}"

  def __str__(self):
    return self.describe
