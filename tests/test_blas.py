"""palace._src.blas: block-sized products on one BLAS thread inside a launch, the saved thread counts
back at the launch's end, and no BLAS query at all for a launch without a product (fake controllers
stand in for threadpoolctl's, so the test does not depend on the host BLAS)."""
import numpy as np
import pytest

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
  c = _FakeController(4)
  monkeypatch.setattr(blas, "_controllers", [c])
  return c


def test_small_product_runs_on_one_thread_and_the_count_comes_back(fake):
  a = np.ones((64, 64), np.float32)
  with blas.kernel_mode():
    np.testing.assert_array_equal(blas.matmul(a, a), np.full((64, 64), 64, np.float32))
    assert fake.n == 1
    blas.matmul(a, a)            # the same size class: no second switch
    assert fake.sets == [1]
  assert fake.n == 4 and fake.sets == [1, 4]


def test_large_product_keeps_the_saved_count(fake):
  big = np.ones((512, 1024), np.float32)
  with blas.kernel_mode():
    blas.matmul(big, big.T)      # 2 * 512 * 1024 * 512 flops: above SMALL_MATMUL_FLOPS
  assert fake.sets == [] and fake.n == 4


def test_a_launch_without_a_product_never_asks_the_blas(fake):
  with blas.kernel_mode():
    pass
  assert fake.queries == 0 and fake.sets == []


def test_nested_launches_restore_their_own_counts(fake):
  a = np.ones((8, 8), np.float32)
  with blas.kernel_mode():
    with blas.kernel_mode():
      blas.matmul(a, a)
      assert fake.n == 1
    assert fake.n == 4             # the inner launch put back what it found
    blas.matmul(a, a)
    assert fake.n == 1
  assert fake.n == 4
