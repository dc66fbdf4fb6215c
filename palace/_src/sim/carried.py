"""Semaphores carried between launches (L4b): a launch's semaphore operands and results.

JAX's async pattern splits a copy over two `pallas_call`s: the first starts a DMA and returns its
semaphore (an output of type `pltpu.SemaphoreType.DMA`), a later one takes that semaphore as an operand
and waits on it. On a TPU the semaphore is a word of the chip's semaphore memory that outlives both
launches. Here each semaphore element a launch returns gets a *handle*, an int32 that is the output's
value in XLA's buffers (JAX's physical type of a semaphore is int32), and the VirtualTPU keeps what the
semaphore holds under that handle (`CarriedSemaphores`, one per VirtualTPU, no module state):

* **Export** (`Machine.finish`, once every core of the launch is done, so a peer chip's late remote
  copy into it counts): for every semaphore element of the launch's semaphore operands and results, its
  applied value and its pending arrivals. A pending DMA arrival completes that side of its copy at once
  as far as data goes (its data moves now, if the DMA policy had not moved it at its start: the copy's
  destination is an output XLA reads when the callback returns), and the arrival is kept as an amount
  landing `cycle - launch end` cycles after the launch ends (0 if it landed already).
* **Import** (`Machine.carry_semaphores`, when the kernel's refs are made): a semaphore operand's
  element gets its handle's value, and its arrivals land at their remaining cycles from the start of
  this launch. The launches in between are not credited with time (palace's launches on a chip start at
  cycle 0 each, and a one-chip launch inside a shard_map does not know its device): the modelled wait is
  an upper bound of the remaining transfer time, never shorter than the chip's.
* An issued handle the store does not hold is a semaphore at 0 (a result nothing signalled, or one
  that was waited to 0: entries at 0 are dropped, so a loop of launches keeps none). A handle never
  issued (0: a semaphore ref JAX made with `pl.empty_ref_like`, whose value is zeros) is a new
  semaphore, given a new handle that the launch writes back into the ref.
* `check_settled` (at the exit of palace.jax's `virtual_tpu`): a semaphore result left non-zero, e.g. a
  DMA started in one launch and never waited in another, raises SyncError naming the launch and copy.

Not modelled: a carried copy's bandwidth use during later launches (their calendars start empty), and
races between a carried copy and XLA code reading its destination before the wait (the data is there
from the exporting launch's end on).
"""
from __future__ import annotations

import threading

import numpy as np

from palace._src.errors import SyncError
from palace._src.util import fmt_site


class CarriedSemaphores:
  """The VirtualTPU's semaphore memory between launches: handle -> (value, [(remaining cycles,
  amount)], what left it non-zero, for messages)."""

  def __init__(self):
    self._lock = threading.Lock()   # pod launches and per-device one-chip launches run on XLA's threads
    self._issued = 1   # handles 1.. were issued so far (0 is never one: a fresh semaphore ref holds 0)
    self.states = {}

  def new_handles(self, n: int) -> np.ndarray:
    with self._lock:
      first, self._issued = self._issued, self._issued + n
    return np.arange(first, first + n, dtype=np.int64)

  def take(self, handle: int):
    """The state kept under `handle` (taken out: the launch holds it now), or None for a semaphore at
    0; raises KeyError for a handle this store never issued (see `import_state`)."""
    h = int(handle)
    with self._lock:
      if not 0 < h < self._issued:
        raise KeyError(h)
      return self.states.pop(h, None)

  def put(self, handle: int, value: int, arrivals: list, origin: str) -> None:
    with self._lock:
      if value or arrivals:
        self.states[int(handle)] = (value, arrivals, origin)
      else:
        self.states.pop(int(handle), None)

  def check_settled(self) -> None:
    """Raise SyncError if a carried semaphore is still non-zero (its signal or DMA never waited)."""
    with self._lock:
      if not self.states:
        return
      handle = min(self.states)
      value, arrivals, origin = self.states[handle]
      n = len(self.states)
    total = value + sum(a for _, a in arrivals)
    raise SyncError(
        f"{n} semaphore(s) carried between launches ended non-zero: {origin} holds {total} that no later "
        f"launch waited for. Every DMA started in one pallas_call and waited in another (a semaphore "
        f"result) must be waited, and every signal consumed. Fix: pass the semaphore to a later "
        f"pallas_call that waits on it (pltpu.make_async_copy(src, dst, sem).wait()).")


def import_state(machine, buf, handles) -> tuple:
  """Give the semaphore elements of `buf` (a launch's semaphore operand) the state kept under
  `handles` (one per element, row-major); returns (the handles the launch keeps them under, {element
  index: what left it non-zero}). The handles are the same, except that a handle this VirtualTPU never
  issued (a semaphore ref JAX made with `pl.empty_ref_like`, whose value is 0) is a new semaphore at 0
  with a new handle."""
  sems, store = machine.sems, machine.tpu.carried
  handles = np.array(handles, np.int64).reshape(-1)
  origins = {}
  for k, (idx, h) in enumerate(zip(np.ndindex(*buf.shape), handles)):
    try:
      state = store.take(h)
    except KeyError:
      handles[k], state = store.new_handles(1)[0], None
    if state is None:
      continue
    value, arrivals, origins[idx] = state
    sem = sems.slot(buf, idx)
    sem.value += value
    for remaining, amount in arrivals:
      sems.arrive(sem, remaining, amount)
  return handles.reshape(buf.shape), origins


def export_states(machine, carried) -> list:
  """The state of every semaphore element of the launch's carried buffers (`carried`: [(core, buf,
  handles, name, {element index: origin it came in with})]), taken out of the launch: the data of their
  pending DMAs moved, their slots cleared. Returns [(handle, value, [(cycle, amount)], origin)] with
  cycles of this launch (`rebase` makes them remaining cycles once the launch's end is known); the
  origin names the launch's own copy, else the one the semaphore came in with, else the launch."""
  out = []
  for core, buf, handles, name, came_with in carried:
    for idx, h in zip(np.ndindex(*buf.shape), np.asarray(handles).reshape(-1)):
      sem = machine.sems.find(buf, idx)
      if sem is None or (not sem.value and not sem.pending):
        out.append((h, 0, [], ""))
        continue
      dma = next((a.dma for a in sem.pending if a.dma is not None), None)
      for a in sem.pending:
        if a.dma is not None:
          machine.dma_arrived(a.dma, a.src)
      where = f"{name}{list(idx) if idx else ''} of kernel '{machine.kernel_name}' on chip {core.chip_index}"
      origin = came_with.get(idx, where) if dma is None else (
          f"{where} (DMA {dma.req.describe} started at {fmt_site(dma.req.site)})")
      out.append((h, sem.value, [(a.cycle, a.amount) for a in sem.pending], origin))
      sem.value, sem.pending = 0, []
  return out


def rebase(tpu, states, end) -> None:
  """Store exported `states` under their handles, arrival cycles made relative to the launch `end`."""
  for h, value, arrivals, origin in states:
    tpu.carried.put(h, value, [(max(0, c - end), a) for c, a in arrivals], origin)
