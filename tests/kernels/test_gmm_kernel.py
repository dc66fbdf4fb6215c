"""benchmarks/gmm_kernel.py (the tokamax-structured grouped matmul of issue 16's counted points)
against NumPy: integer-valued bf16 data, so every product and f32 sum is exact."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace._src import hw

from benchmarks.gmm_kernel import gmm, group_metadata, tokamax_tiles


def _reference(x, w, sizes):
  out = np.zeros((x.shape[0], w.shape[2]), np.float32)
  off = np.concatenate([[0], np.cumsum(sizes)])
  for g in range(len(sizes)):
    out[off[g]:off[g + 1]] = x[off[g]:off[g + 1]].astype(np.float32) @ w[g].astype(np.float32)
  return out


@pytest.mark.parametrize("sizes,tile_m,tile_k", [
    ([128, 128, 256], 128, 256),         # whole tiles: one visit per tile
    ([100, 0, 156, 200, 56], 128, 128),  # tiles straddling groups, an empty group, two k steps
    ([64, 64, 64, 64, 256], 256, 256),   # four 64-row groups in one 256-row tile
    ([512], 256, 128),
])
def test_gmm_matches_numpy_exactly(sizes, tile_m, tile_k):
  rng = np.random.default_rng(len(sizes))
  m, k, n = sum(sizes), 256, 512
  x = rng.integers(-4, 5, (m, k)).astype(jnp.bfloat16)
  w = rng.integers(-4, 5, (len(sizes), k, n)).astype(jnp.bfloat16)
  with pl.virtual_tpu("v5p"):
    # tile_n = 2 x the MXU width: two column-chunk products per step, concatenated
    out = gmm(x, w, sizes, tile_m=tile_m, tile_k=tile_k, tile_n=256, vmem_limit_bytes=32 << 20,
              mxu_size=128, out_dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(out), _reference(x, w, sizes))


def test_gmm_bf16_output_is_the_rounded_reference():
  rng = np.random.default_rng(7)
  sizes = [192, 64]
  x = rng.integers(-4, 5, (256, 256)).astype(jnp.bfloat16)
  w = rng.integers(-4, 5, (2, 256, 256)).astype(jnp.bfloat16)
  with pl.virtual_tpu("v6e"):
    out = gmm(x, w, sizes, tile_m=128, tile_k=256, tile_n=256, vmem_limit_bytes=32 << 20,
              mxu_size=256)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out), _reference(x, w, sizes).astype(jnp.bfloat16))


def test_group_metadata_visits_a_straddling_tile_once_per_group():
  offsets, groups, tiles = group_metadata([100, 0, 156, 200, 56], 512, 128)
  assert offsets.tolist() == [0, 100, 100, 256, 456, 512]
  assert list(zip(groups.tolist(), tiles.tolist())) == [(0, 0), (2, 0), (2, 1), (3, 2), (3, 3),
                                                        (4, 3)]
  # 128-row groups in 256-row tiles: every tile is visited twice, once per group (twice the MXU work)
  _, groups, tiles = group_metadata([128] * 4, 512, 256)
  assert tiles.tolist() == [0, 0, 1, 1] and groups.tolist() == [0, 1, 2, 3]


def test_gmm_rejects_group_sizes_that_do_not_cover_lhs():
  with pytest.raises(ValueError, match="sum to the 256 rows"):
    group_metadata([100, 100], 256, 128)


def test_tokamax_tiles_keep_k_and_n_whole_at_90_percent_of_vmem_and_split_n_first():
  for name in ("v5p", "v6e", "7x"):
    chip = hw.get_chip(name)
    for k, n in ((3072, 2048), (3072, 512), (7168, 1024)):
      assert tokamax_tiles(chip, k, n, 256) == (k, n), (name, k, n)
  v5p = hw.get_chip("v5p")
  # at the 16 MiB default scoped VMEM the rule splits N (not below 2 x 128) before K
  tk, tn = tokamax_tiles(v5p, 3072, 2048, 256, vmem_limit_bytes=16 << 20)
  assert tk == 3072 and 256 <= tn < 2048
  # K shrinks only when the next N split would go below the limit (v6e: 2 x 256; 640 -> 384)
  tk, tn = tokamax_tiles(hw.get_chip("v6e"), 3072, 640, 256, vmem_limit_bytes=8 << 20)
  assert tn == 640 and tk < 3072 and 3072 % tk == 0
