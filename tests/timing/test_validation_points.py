"""benchmarks.validate: the point list and the parts that need no jax wheel (issue 16)."""
import pytest

from palace._src import hw

from benchmarks.validate import GENERATIONS, gmm_tiles, points


def test_at_least_20_points_over_at_least_4_generations_each_with_a_source():
  pts = points()
  assert len(pts) >= 20
  assert len({p.chip for p in pts}) >= 4 and {p.chip for p in pts} <= set(GENERATIONS)
  assert all(p.source and p.published > 0 for p in pts)
  assert len({(p.name, p.chip) for p in pts}) == len(pts)


def test_published_peaks_within_half_a_percent():
  for p in points():
    if p.name.startswith("peak-"):
      assert p.run() == pytest.approx(p.published, rel=5e-3), p.chip


def test_gmm_tiles_fit_the_default_scoped_vmem():
  for name in ("v5p", "v6e", "7x"):
    chip = hw.get_chip(name)
    for k, n in ((3072, 2048), (3072, 512), (7168, 1024)):
      tk, tn = gmm_tiles(chip, k, n)
      assert k % tk == 0 and n % tn == 0
      vmem = 2 * 256 * tk * 2 + 2 * tk * tn * 2 + 2 * 256 * tn * 2 + 256 * tn * 4
      assert vmem <= chip.default_scoped_vmem_bytes - chip.internal_scratch_bytes
  assert gmm_tiles(hw.get_chip("v6e"), 3072, 2048) == (3072, 2048)  # whole K and N fit in 32 MiB
  assert gmm_tiles(hw.get_chip("v5p"), 3072, 2048) == (3072, 512)   # 16 MiB: N shrinks first
