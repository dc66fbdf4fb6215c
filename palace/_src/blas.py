"""Host BLAS threading for palace's matmuls (L0): one thread policy per launch.

Why (issue 35). OpenBLAS, NumPy's BLAS, splits every product over its own threads, which meet several
times per product (each shared packed panel of the right operand) and wait for each other by spinning
on flags with sched_yield; between products they spin-wait too before they sleep. On an idle machine
that works. When another process holds a core, a thread waits for a partner that is runnable but not
running until the scheduler's next slice there (ms), at each meeting: a (256x1024)@(1024x256) product,
~1 ms alone, measured 1-30 ms on a 2-core machine with one busy process beside it, and the 16 such
products of a 1024^3 tiled matmul with 256 blocks cost 512 ms where NumPy's one `x @ x` cost 56 ms
(one product: the waits are paid a few times, not per output block). Toggling the thread count was not
the cost (2-30 us per call, threadpoolctl); running mid-size products multi-threaded was.

The policy, decided once per launch at its first product (`kernel_mode`), never toggled per product:
- OpenBLAS runs on one thread, the caller's, for the whole launch: its count is set to 1 once and the
  saved counts come back at the launch's end. No product ever waits on a spinning BLAS thread.
- A product of at least SMALL_MATMUL_FLOPS (the measured crossover, docs/host-speed.md) is split into
  one part per thread of the launch's `budget` (row blocks of the result, or column blocks when it has
  few rows); the calling thread and palace's helper threads each take an unclaimed part, each part one
  single-threaded GEMM. The budget is the saved BLAS thread count (NumPy's default: every core; OPENBLAS_NUM_THREADS or
  threadpool_limits lower it). Threads meet once per product, and the caller waits for a claimed part by
  sleeping, which frees its core for the part's thread; a helper that has not started by the time the
  caller is done claims nothing, so a busy machine costs at most one part's delay, never a slice per
  meeting.
- Smaller products run inline on the calling thread: no hand-off at all.
Without threadpoolctl (or a BLAS it can inspect) palace cannot stop OpenBLAS's threads, so it neither
sets nor splits anything. Outside a launch, products below SMALL_MATMUL_FLOPS run on one BLAS thread
(switched around each) and larger ones as NumPy would.
"""
from __future__ import annotations

import contextlib
import itertools
import queue
import threading

import numpy as np

# The crossover (docs/host-speed.md, `python -m benchmarks.matmul_vs_numpy --crossover`): below it one
# thread is as fast or faster; from it on, a launch splits the product over its budget of threads and
# outside a launch NumPy's own threads run it.
SMALL_MATMUL_FLOPS = 2 * 512 * 512 * 256   # = 2 x 256 x 1024 x 256: 134 MFlop, ~1.5 ms on one thread
_MIN_PART = 64                             # rows (or columns) of the smallest part worth a thread

_controllers = None


def _blas_controllers():
  global _controllers  # a lazily built handle on process-wide libraries, not simulator state
  if _controllers is None:
    try:
      from threadpoolctl import ThreadpoolController
      _controllers = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
    except Exception:  # noqa: BLE001  threadpoolctl missing or unable to inspect: leave BLAS alone
      _controllers = []
  return _controllers


class Counts:
  """What the policy did, process-wide (tests count hand-offs with these instead of timing them)."""
  split = 0      # products split into parts
  offered = 0    # parts offered to helper threads (a product split in p parts offers p - 1)
  batches = 0    # batches of whole products spread over threads (matmuls)
  sets = 0       # BLAS thread-count changes made by palace


class _Launch:
  """The policy of one launch, fixed at its first product: `saved` counts to restore, `budget` threads."""
  __slots__ = ("saved", "budget")

  def __init__(self):
    self.saved = None   # None until the first product
    self.budget = 1


_launches: list = []   # per enclosing launch (process-wide, like the BLAS's own thread count)


class kernel_mode:
  """`with kernel_mode():` around a launch: its products follow the module's policy; the BLAS thread
  counts it changed come back at the end. A launch without a product never asks the BLAS (threadpoolctl's
  queries cost microseconds each). (A class, not a generator context manager: entered once per launch.)"""
  __slots__ = ("state",)

  def __enter__(self):
    self.state = _Launch()
    _launches.append(self.state)

  def __exit__(self, *exc):
    state = self.state
    if _launches[-1] is state:
      _launches.pop()
    else:   # launches of two threads (two engines, or palace's own path beside palace.jax) overlapped
      _launches.remove(state)
      heir = next((s for s in _launches if s.saved is not None), None)
      if state.saved and heir is not None:   # a later launch that took this one's policy restores it
        heir.saved, heir.budget = state.saved, state.budget
        return
    if state.saved:
      _set_counts(_blas_controllers(), state.saved)


def _begin(state: _Launch) -> None:
  """The launch's first product: decide its policy (an enclosing launch's, when one has decided)."""
  for outer in reversed(_launches):
    if outer is not state and outer.saved is not None:
      state.saved, state.budget = [], outer.budget   # the BLAS is already on one thread
      return
  ctrls = _blas_controllers()
  if not ctrls:
    state.saved, state.budget = [], 1
    return
  state.saved = [c.num_threads for c in ctrls]
  state.budget = max(1, max(state.saved))
  _set_counts(ctrls, [1] * len(ctrls))


def budget() -> int:
  """Host threads the current launch's large products use (1 outside a launch or before its first)."""
  if not _launches or _launches[-1].saved is None:
    return 1
  return _launches[-1].budget


@contextlib.contextmanager
def _threads(counts):
  ctrls = _blas_controllers()
  now = [c.num_threads for c in ctrls]
  _set_counts(ctrls, counts)
  try:
    yield
  finally:
    _set_counts(ctrls, now)


def _set_counts(ctrls, counts) -> None:
  """Give each BLAS controller its count, setting only those that differ. Through the library's own
  setter: threadpoolctl (3.6 on) lets only the first thread that sets an OpenBLAS (pthreads) count set
  it while that thread lives, and ignores the call, silently, from any other thread. Launches come from
  several threads (XLA runs palace.jax's callbacks on its own, long-lived ones), so a launch from a
  second thread left OpenBLAS on all its threads: a 128^3 product took 2.4-4 ms of CPU instead of 0.07
  (tpu_gmm_test). palace's policy is one per launch, never concurrent within an engine."""
  for c, n in zip(ctrls, counts):
    if c.num_threads != n:
      getattr(c, "_real_set_num_threads", c.set_num_threads)(n)
      Counts.sets += 1


def single_threaded():
  return _threads([1] * len(_blas_controllers()))


def matmul(a, b, out=None):
  """np.matmul by the policy above (inside a launch) or NumPy's threads (outside, large products)."""
  m, k = a.shape[-2], a.shape[-1]
  n = b.shape[-1]
  batch = a.size // (m * k) if m * k else 1
  flops = 2 * batch * m * k * n
  if _launches:
    state = _launches[-1]
    if state.saved is None:
      _begin(state)
    if state.budget > 1 and flops >= SMALL_MATMUL_FLOPS:
      split = _split(a, b, out, state.budget)
      if split is not None:
        return split
    return np.matmul(a, b, out=out)
  if flops < SMALL_MATMUL_FLOPS and _blas_controllers():
    with single_threaded():
      return np.matmul(a, b, out=out)
  return np.matmul(a, b, out=out)


def matmuls(products) -> None:
  """`np.matmul(a, b, out=out)` for each (a, b, out) of `products`, independent products whose outputs
  do not overlap their operands or each other (a deferred sum's batch, lang/deferred.py). Inside a
  launch with a budget of several threads and enough work, whole products are spread over the launch's
  threads (the caller and palace's helpers each take the next unclaimed product, single-threaded): one
  meeting for the batch, and no operand packed twice, where splitting each product meets once per
  product and each part packs the whole other operand. Otherwise each product runs by `matmul`.
  An operand may be a `Lazy` (made by the first thread that needs it, below)."""
  if len(products) > 1 and _launches:
    state = _launches[-1]
    if state.saved is None:
      _begin(state)
    flops = sum(2 * a.shape[-2] * a.shape[-1] * b.shape[-1] for a, b, _ in products)
    if state.budget > 1 and flops >= SMALL_MATMUL_FLOPS and all(a.ndim == 2 for a, _, _ in products):
      Counts.batches += 1
      _run(_Job(list(products)), state.budget)
      return
  for a, b, out in products:
    if type(a) is Lazy or type(b) is Lazy:
      a, b = _made(a, b)
    matmul(a, b, out=out)


class Lazy:
  """An operand of a batch (`matmuls`) made on first use: `make()` returns the array (`shape`,
  `nbytes` known up front), run once by the first of the batch's threads that needs it while any
  other that needs it waits. A batch whose operands need preparing (a deferred sum's panels rounded
  to bfloat16 or widened, lang/deferred.py) thus prepares each on the launch's threads beside the
  other products' GEMMs, instead of all of them on the caller's thread before the batch. A product
  first makes whichever of its operands no thread has claimed, then waits for the rest. An error in
  `make` is raised to every thread that needs the operand."""
  __slots__ = ("_make", "shape", "ndim", "nbytes", "_lock", "_value", "_error")

  def __init__(self, make, shape, nbytes: int):
    self._make = make
    self.shape, self.ndim, self.nbytes = tuple(shape), len(shape), nbytes
    self._lock = threading.Lock()
    self._value = self._error = None

  @property
  def done(self) -> bool:
    return self._value is not None or self._error is not None

  def claim(self) -> None:
    """Make it now, unless another thread is making it or has (then return at once)."""
    if self._value is None and self._error is None and self._lock.acquire(blocking=False):
      try:
        self._run()
      finally:
        self._lock.release()

  def get(self):
    """The array, made here or waited for."""
    if self._value is None:
      with self._lock:
        self._run()
      if self._error is not None:
        raise self._error
    return self._value

  def _run(self) -> None:
    if self._value is None and self._error is None:
      try:
        self._value = self._make()
      except BaseException as e:  # noqa: BLE001  raised to every thread that needs it (get)
        self._error = e
      self._make = None


def _made(a, b) -> tuple:
  """The arrays of a product's operands, Lazy ones made (unclaimed ones first, then the others waited)."""
  for x in (a, b):
    if type(x) is Lazy:
      x.claim()
  return (a.get() if type(a) is Lazy else a), (b.get() if type(b) is Lazy else b)


# ------------------------------------------------------------------------------ split products
def _bounds(extent: int, parts: int) -> list:
  """`parts` + 1 cut points of range(extent), inner ones on multiples of 16 (whole GEMM micro-tiles)."""
  cuts = [0]
  for p in range(1, parts):
    cuts.append(min(extent, (extent * p // parts + 8) // 16 * 16))
  cuts.append(extent)
  return cuts


def _split(a, b, out, budget: int):
  """a @ b computed in one part per thread on up to `budget` threads, or None when it has too few rows
  and columns to split (then the caller runs it whole). (Two parts per thread, so that a late helper
  leaves less behind, measured slower on an idle 2-core VM: 256x1024x256 panels 16.1 vs 15.0 ms, 512x
  2048x512 103 vs 99 ms for 16; each part repacks the whole other operand.)"""
  m, n = a.shape[-2], b.shape[-1]
  axis = -2 if m >= n else -1
  parts = min(budget, (m if axis == -2 else n) // _MIN_PART)
  if parts < 2 or a.shape[:-2] != b.shape[:-2]:   # (no broadcast batch dimensions)
    return None
  if out is None:
    out = np.empty(a.shape[:-1] + (n,), np.result_type(a, b))
  elif np.may_share_memory(out, a) or np.may_share_memory(out, b):
    return None   # (a part's result would overwrite another part's operand: NumPy copies first)
  cuts = _bounds(m if axis == -2 else n, parts)
  if axis == -2:
    work = [(a[..., i:j, :], b, out[..., i:j, :]) for i, j in zip(cuts, cuts[1:])]
  else:
    work = [(a, b[..., i:j], out[..., i:j]) for i, j in zip(cuts, cuts[1:])]
  Counts.split += 1
  _run(_Job(work), parts)
  return out


def _run(job: "_Job", threads: int) -> None:
  """Run `job`'s parts on this thread and up to `threads` - 1 helpers; return when all are done."""
  _helpers.offer(job, min(threads, job.parts) - 1)   # (none at interpreter shutdown: all run here)
  mine = job.work()
  for _ in range(job.parts - mine):
    job.done.acquire()
  if job.error is not None:
    raise job.error


class _Job:
  """The parts of one product; any thread takes the next unclaimed one (`claims` is a C iterator:
  next() is atomic under the GIL). `done` is released once per part a helper finished."""
  __slots__ = ("work_items", "parts", "claims", "done", "error")

  def __init__(self, work_items):
    self.work_items = work_items
    self.parts = len(work_items)
    self.claims = itertools.count()
    self.done = threading.Semaphore(0)
    self.error = None

  def work(self) -> int:
    """Run parts until none is left unclaimed; how many this thread ran."""
    ran = 0
    items = self.work_items
    for i in self.claims:
      if i >= self.parts:
        return ran
      x, y, z = items[i]
      try:
        if type(x) is Lazy or type(y) is Lazy:
          x, y = _made(x, y)
        np.matmul(x, y, out=z)
      except BaseException as e:  # noqa: BLE001  re-raised by the product's caller
        self.error = e
      ran += 1
    return ran


class _Helpers:
  """Idle daemon threads waiting (asleep) on one queue of jobs; made on first demand, up to the largest
  budget asked for. Process-wide host threads like the BLAS's own: they hold no simulator state, and a
  job leaves them when its last part is claimed."""

  def __init__(self):
    self.jobs = queue.SimpleQueue()
    self.threads = 0
    self.lock = threading.Lock()

  def offer(self, job: _Job, count: int) -> None:
    if self.threads < count:
      with self.lock:
        try:
          while self.threads < count:
            threading.Thread(target=self._run, daemon=True, name="palace-blas").start()
            self.threads += 1
        except RuntimeError:   # no new threads at interpreter shutdown: fewer (or no) helpers
          pass
    count = min(count, self.threads)
    for _ in range(count):
      self.jobs.put(job)
    Counts.offered += count

  def _run(self) -> None:
    while True:
      job = self.jobs.get()
      for _ in range(job.work()):
        job.done.release()
      job = None


_helpers = _Helpers()
