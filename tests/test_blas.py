"""palace._src.blas, the host BLAS thread policy of a launch (issue 35): OpenBLAS set to one thread once
per launch and back at its end; products from SMALL_MATMUL_FLOPS up split over the launch's budget of
threads (the saved BLAS count); smaller ones run inline with no hand-off. Counted, never timed: fake
controllers stand in for threadpoolctl's, so nothing depends on the host BLAS or its load."""
import numpy as np
import pytest

import palace as pl
from benchmarks.kernels import tiled_matmul
from palace._src import blas


class _FakeController:
  def __init__(self, n):
    self.n, self.queries, self.sets = n, 0, []

  @property
  def num_threads(self):
    self.queries += 1
    return self.n

  def set_num_threads(self, n):
    self.sets.append(n)
    self.n = n


@pytest.fixture
def fake(monkeypatch):
  """A BLAS with 4 threads: a budget of 4 cores for the launch."""
  c = _FakeController(4)
  monkeypatch.setattr(blas, "_controllers", [c])
  return c


class _Counted:
  def __init__(self):
    self.split, self.offered, self.sets = blas.Counts.split, blas.Counts.offered, blas.Counts.sets
    self.batches = blas.Counts.batches

  def since(self):
    return (blas.Counts.split - self.split, blas.Counts.offered - self.offered,
            blas.Counts.sets - self.sets)


def _ints(shape, seed=0):
  """Small integers: every product sums exactly in float32, whatever the order or the split."""
  return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(np.float32)


def test_small_products_pay_no_hand_off_and_one_switch_per_launch(fake):
  a = _ints((64, 64))
  counted = _Counted()
  with blas.kernel_mode():
    for _ in range(50):
      np.testing.assert_array_equal(blas.matmul(a, a), a @ a)
    assert fake.n == 1
  assert counted.since() == (0, 0, 2)      # no product split or handed to a thread; 1 -> and back
  assert fake.sets == [1, 4] and fake.n == 4


def test_large_products_are_split_over_every_core_of_the_budget(fake):
  a, b = _ints((512, 1024)), _ints((1024, 512), 1)
  assert 2 * 512 * 1024 * 512 >= blas.SMALL_MATMUL_FLOPS
  counted = _Counted()
  with blas.kernel_mode():
    out = np.full((512, 512), np.nan, np.float32)
    blas.matmul(a, b, out=out)
    np.testing.assert_array_equal(out, a @ b)
    np.testing.assert_array_equal(blas.matmul(a[:, :640], b[:640]), a[:, :640] @ b[:640])
    assert fake.n == 1 and blas.budget() == 4    # each part on one BLAS thread, 4 threads in all
  split, offered, sets = counted.since()
  assert split == 2 and offered == 2 * 3 and sets == 2   # 3 helpers offered work per product
  assert fake.n == 4


def test_wide_products_with_few_rows_are_split_by_columns(fake):
  a, b = _ints((32, 2048)), _ints((2048, 2048), 1)
  counted = _Counted()
  with blas.kernel_mode():
    np.testing.assert_array_equal(blas.matmul(a, b), a @ b)
  assert counted.since()[:2] == (1, 3)


def test_a_product_into_one_of_its_operands_is_not_split(fake):
  x = _ints((512, 512))
  want = x @ x
  counted = _Counted()
  with blas.kernel_mode():
    blas.matmul(x, x, out=x)     # parts would overwrite rows the others still read
  np.testing.assert_array_equal(x, want)
  assert counted.since()[:2] == (0, 0)


def test_one_blas_thread_means_no_helpers(monkeypatch):
  c = _FakeController(1)            # OPENBLAS_NUM_THREADS=1 or threadpool_limits(1): a budget of one
  monkeypatch.setattr(blas, "_controllers", [c])
  a = _ints((512, 1024))
  counted = _Counted()
  with blas.kernel_mode():
    blas.matmul(a, a.T)
  assert counted.since() == (0, 0, 0) and c.sets == []


def test_without_a_blas_handle_nothing_is_set_or_split(monkeypatch):
  monkeypatch.setattr(blas, "_controllers", [])   # threadpoolctl missing: OpenBLAS's threads stay
  a = _ints((512, 1024))
  counted = _Counted()
  with blas.kernel_mode():
    np.testing.assert_array_equal(blas.matmul(a, a.T), a @ a.T)
  assert counted.since() == (0, 0, 0)


def test_a_launch_without_a_product_never_asks_the_blas(fake):
  with blas.kernel_mode():
    pass
  assert fake.queries == 0 and fake.sets == []


def test_nested_launches_restore_their_own_counts_and_share_the_budget(fake):
  a = _ints((8, 8))
  with blas.kernel_mode():
    with blas.kernel_mode():
      blas.matmul(a, a)
      assert fake.n == 1
    assert fake.n == 4             # the inner launch put back what it found
    blas.matmul(a, a)
    assert fake.n == 1 and blas.budget() == 4
    with blas.kernel_mode():       # inside a decided launch: its budget, nothing to set
      blas.matmul(a, a)
      assert blas.budget() == 4 and fake.sets == [1, 4, 1]
    assert fake.n == 1
  assert fake.n == 4


def test_a_launch_with_big_blocks_runs_its_products_on_every_free_core(fake):
  x = _ints((1024, 1024))
  counted = _Counted()
  with pl.virtual_tpu("v5e"):
    z = tiled_matmul(x, x, 512)
  np.testing.assert_array_equal(z, x @ x)
  split, offered, sets = counted.since()
  # the 4 output blocks' K sums, written back pending (sim/memory.PendingBlocks), run at the launch's
  # end as one batch: a whole product per thread, 3 handed to helpers, none split
  assert blas.Counts.batches - counted.batches == 1 and split == 0 and offered == 3
  assert sets == 2 and fake.n == 4           # OpenBLAS on one thread for the launch, then back


def test_a_batch_of_products_spreads_whole_products_over_the_budget(fake):
  a, b = _ints((256, 512)), _ints((512, 256), seed=1)
  outs = [np.empty((256, 256), np.float32) for _ in range(6)]
  counted = _Counted()
  with blas.kernel_mode():
    blas.matmuls([(a, b, o) for o in outs])   # 6 x 67 MFlop: each whole, on 4 threads
  for o in outs:
    np.testing.assert_array_equal(o, a @ b)
  assert blas.Counts.batches - counted.batches == 1 and counted.since() == (0, 3, 2)
  counted = _Counted()
  with blas.kernel_mode():
    blas.matmuls([(a[:64], b[:, :64], o[:64, :64]) for o in outs])   # too little work: inline
  assert blas.Counts.batches == counted.batches and counted.since() == (0, 0, 2)


def test_a_batch_makes_each_lazy_operand_once_on_its_threads(fake):
  # a batch operand made on first use (blas.Lazy: a deferred sum's panel still to round to bf16) is made
  # once, by the first of the batch's threads whose product needs it, the others waiting for it; an
  # error making it reaches the batch's caller
  a, b = _ints((256, 512)), _ints((512, 256), seed=1)
  made = []

  def make():
    made.append(len(made))
    return a
  lazy = blas.Lazy(make, a.shape, a.nbytes)
  assert not lazy.done and lazy.shape == a.shape and lazy.ndim == 2
  outs = [np.empty((256, 256), np.float32) for _ in range(6)]
  counted = _Counted()
  with blas.kernel_mode():
    blas.matmuls([(lazy, b, o) for o in outs])   # 6 x 67 MFlop: each whole, on 4 threads
  assert made == [0] and lazy.done and lazy.get() is a
  for o in outs:
    np.testing.assert_array_equal(o, a @ b)
  assert blas.Counts.batches - counted.batches == 1 and counted.since() == (0, 3, 2)
  again = blas.Lazy(make, a.shape, a.nbytes)
  blas.matmuls([(again, b, o) for o in outs[:2]])   # outside a launch: one product after the other
  assert made == [0, 1]
  np.testing.assert_array_equal(outs[1], a @ b)

  def fail():
    raise MemoryError("no room for the panel")
  with pytest.raises(MemoryError, match="no room for the panel"):
    with blas.kernel_mode():
      blas.matmuls([(blas.Lazy(fail, a.shape, a.nbytes), b, o) for o in outs])


def test_a_launch_of_small_blocks_hands_nothing_off(fake):
  x = _ints((512, 512))
  counted = _Counted()
  with pl.virtual_tpu("v5e"):
    z = tiled_matmul(x, x, 128)              # 64 steps of 128^3 products
  np.testing.assert_array_equal(z, x @ x)
  assert counted.since() == (0, 0, 2) and fake.sets == [1, 4]


class _GuardedController(_FakeController):
  """threadpoolctl's OpenBLAS (pthreads) controller since 3.6: `set_num_threads` from any thread but the
  first one that set a count (while it lives) is silently ignored; `_real_set_num_threads` always sets."""

  def __init__(self, n, owner):
    super().__init__(n)
    self.owner = owner

  def set_num_threads(self, n):
    import threading  # noqa: PLC0415
    if threading.current_thread() is self.owner:
      super().set_num_threads(n)

  def _real_set_num_threads(self, n):
    super().set_num_threads(n)


def test_a_launch_from_a_thread_that_does_not_control_threadpoolctl_still_runs_blas_on_one_thread(
    monkeypatch):
  import threading  # noqa: PLC0415
  c = _GuardedController(4, owner=object())   # another (live) thread controls OpenBLAS
  monkeypatch.setattr(blas, "_controllers", [c])
  a = _ints((64, 64))
  seen = []

  def launch():   # e.g. XLA's second callback thread
    with blas.kernel_mode():
      blas.matmul(a, a)
      seen.append(c.n)

  t = threading.Thread(target=launch)
  t.start()
  t.join()
  assert seen == [1] and c.n == 4 and c.sets == [1, 4]


def test_overlapping_launches_of_two_threads_leave_the_blas_as_they_found_it(fake):
  a = _ints((8, 8))
  first, second = blas.kernel_mode(), blas.kernel_mode()
  first.__enter__()
  blas.matmul(a, a)                # the first launch decides: BLAS on one thread
  second.__enter__()               # (another thread's launch, entered while the first runs)
  blas.matmul(a, a)
  first.__exit__(None, None, None)   # the first ends before the second: the second keeps one thread
  assert fake.n == 1 and blas.budget() == 4
  blas.matmul(a, a)
  second.__exit__(None, None, None)
  assert fake.n == 4 and fake.sets == [1, 4] and blas._launches == []


def test_the_real_threadpoolctl_guard_does_not_stop_a_launch_from_another_thread():
  """The same with the installed threadpoolctl and OpenBLAS: a live thread that set a count controls it."""
  import threading  # noqa: PLC0415
  ctrls = blas._blas_controllers()
  if not ctrls or any(getattr(c, "threading_layer", "") == "openmp" for c in ctrls):
    pytest.skip("needs threadpoolctl and an OpenBLAS on pthreads")
  before = [c.num_threads for c in ctrls]
  if max(before) < 2:
    pytest.skip("the BLAS runs on one thread already")
  took, stop = threading.Event(), threading.Event()

  def owner():   # takes threadpoolctl's control (a no-op count change) and stays alive
    for c, n in zip(ctrls, before):
      c.set_num_threads(n)
    took.set()
    stop.wait()

  t = threading.Thread(target=owner)
  t.start()
  took.wait()
  try:
    with blas.kernel_mode():
      blas.matmul(_ints((8, 8)), _ints((8, 8)))
      inside = [c.num_threads for c in ctrls]
    assert inside == [1] * len(ctrls) and [c.num_threads for c in ctrls] == before
  finally:
    stop.set()
    t.join()
