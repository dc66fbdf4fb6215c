"""Host threads for the cores of multi-core launches, reused from launch to launch (L4b).

A multi-core launch runs one thread per core (sync.Scheduler), and a pod launch one per core of every
chip. Starting and joining fresh threads cost each such launch about 100 us per core, and Python 3.12
refuses to start threads at all once the interpreter is shutting down, which is when palace.jax drains
the launches a program dispatched but never read (jax/activation.py). So a core's program runs on an
idle worker thread, made on first demand and parked again when the program returns.

What is kept between launches is idle threads only, each waiting on its own queue: no simulator state
(a program's frames, its machine and its errors are gone when it returns). The pool grows to the
largest number of cores ever running at once (the cores of one launch run at the same time, blocked on
each other's handoffs); at most `MAX_IDLE` idle threads are kept, the others end.
"""
from __future__ import annotations

import queue
import threading

MAX_IDLE = 64

_idle: list = []          # queues of idle workers (process-wide host threads, like a thread pool's)
_lock = threading.Lock()


class Done:
  """Set when a program submitted with `run_soon` has returned; `wait` re-raises what it raised (the
  programs catch their own errors: one escaping is a palace bug, never to be lost on a worker)."""
  __slots__ = ("_sem", "error")

  def __init__(self):
    self._sem = threading.Semaphore(0)
    self.error = None

  def wait(self) -> None:
    self._sem.acquire()
    if self.error is not None:
      raise self.error


def run_soon(fn) -> Done:
  """Run `fn()` on an idle worker thread (a new daemon thread if none is idle)."""
  with _lock:
    q = _idle.pop() if _idle else None
  if q is None:
    q = queue.SimpleQueue()
    threading.Thread(target=_work, args=(q,), daemon=True, name="palace-worker").start()
  done = Done()
  q.put((fn, done))
  return done


def _work(q) -> None:
  while True:
    fn, done = q.get()
    try:
      fn()
    except BaseException as e:  # noqa: BLE001  handed to the waiting thread
      done.error = e
    fn = None   # (nothing of the program outlives it on this thread)
    with _lock:
      keep = len(_idle) < MAX_IDLE
      if keep:
        _idle.append(q)
    done._sem.release()
    if not keep:
      return
