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


def test_grouped_matmul_tile_m_ordering_with_the_measured_kernels_buffering():
  # tokamax PR 1221 (65536, 128, 3072, 512): 1.59 on 7x, 1.29 on v6e, 1.05 on v5p. With the measured
  # kernel's structure (RHS triple-buffered with lookahead, tiles at 90% of VMEM), 256-row tiles pay off
  # on the 256-wide MXUs and hardly matter on v5p's 128-wide ones.
  from benchmarks.validate import tokamax_like_gmm_ratio
  shape = (65536, 128, 3072, 512)
  r7x, rv6e, rv5p = (tokamax_like_gmm_ratio(c, *shape) for c in ("7x", "v6e", "v5p"))
  assert r7x > rv6e > 1.15
  assert abs(rv5p - 1.05) < 0.1 and rv5p < 1.1


def test_the_measured_kernels_tiles_keep_k_and_n_whole_at_90_percent_of_vmem():
  v5p = hw.get_chip("v5p")
  assert gmm_tiles(v5p, 3072, 2048, vmem_limit_bytes=int(0.9 * v5p.vmem_bytes), rhs_buffers=3) == (3072, 2048)
