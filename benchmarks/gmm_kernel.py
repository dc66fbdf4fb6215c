"""A grouped matmul with the structure of tokamax's TPU gmm (the kernel openxla/tokamax PR 1221 timed).

`out[r] = lhs[r] @ rhs[g(r)]` where row r belongs to group g(r) (groups are consecutive row ranges of
the sizes given). Written for palace from a reading of tokamax's `gmm_v2` (tokamax/_src/ops/
experimental/gmm_v2/gmm_v2.py at the PR's commit 5bd37bf); the structure it keeps:

* **Grid (n tiles, row-tile visits, k tiles)**, dimension semantics (parallel, arbitrary, arbitrary):
  tokamax's `emit_pipeline(grid=(num_n, num_gm, num_k))`. Its megacore split partitions the parallel n
  axis over the TensorCores (`_partition_grid`); palace's `megacore_split` of a pallas_call does the
  same, so with one n tile (K and N whole, as at 90% of VMEM for every PR shape) a v5p kernel runs on
  one TensorCore in both.
* **Group metadata, one visit per (row tile, group)**: a row tile that straddles a group boundary is
  visited once for each group it holds, consecutively, and each visit computes the whole tile and keeps
  the rows of its group (`group_metadata`, scalar-prefetched). For groups holding a whole number of
  tiles this is exactly tokamax's schedule (one visit per tile). For groups smaller than a tile
  tokamax instead starts a tile at each group's first row and fetches only the group's rows
  (`pl.BoundedSlice`, which palace does not support); both compute `tile_m` rows per group and fetch
  each group's RHS block once per n tile, so MXU work and RHS traffic are the same, and so are the LHS
  and output bytes (here every tile once, there every group's rows once).
* **RHS triple-buffered** (`pl.Buffered(3)` on the weight spec): tokamax's `emit_pipeline` then fetches
  the block two grid steps ahead. A palace pallas_call prefetches beyond the next step only with
  `use_lookahead=True`, whose lookahead palace bounds by the buffer count (steps s+1 and s+2 for three
  buffers), so that is how the same depth is requested here. LHS and output are double-buffered.
* **One product per MXU-wide column chunk** (tokamax's inner loop over `start_n`), concatenated, then
  the rows of other groups masked out at the last k step.
* **Tiles by `calculate_tiling`** (`tokamax_tiles`): K and N whole, then N split (not below twice the
  MXU width; K is split only if the next N split would go below that), until its VMEM estimate (2 LHS, 3 RHS, 2 output blocks, the f32 accumulator)
  fits `vmem_limit_bytes`, by default 90% of the chip's VMEM, which the kernel also requests.

Not kept: tokamax's bucketed row counts (`bucket_base`; `calculate_tiling` also grows tile_m up to four
buckets while VMEM allows). The PR compares fixed tile heights: with the bucket growth both tile heights
would compute 256 rows for the 128-row groups (the bucket index of a full group of 128 rows is 1 at
base 128), leaving no reason for v5p's published 0.56; with tile_m fixed, 256-row tiles do twice the
MXU work of 128-row ones there, which is the measured effect. The in-kernel metadata loop (tokamax
fills it in SMEM; here it is computed on the host and scalar-prefetched), quantisation, bias and fused
activations are not modelled either, nor is the order of JAX's `emit_pipeline`, which starts the next
block's copy before waiting for the current one (palace's pipeline waits first, as for pallas_call).
"""
from __future__ import annotations

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu


def _align(x: int, a: int) -> int:
  return -(-x // a) * a


def tokamax_tiles(chip, k: int, n: int, tile_m: int, *, vmem_limit_bytes: int | None = None,
                  lanes: int = 128) -> tuple[int, int]:
  """(tile_k, tile_n) by tokamax's `calculate_tiling` for bf16 operands, bf16 out, f32 accumulator
  (no quantisation, no fused activation). `vmem_limit_bytes` defaults to 90% of the chip's VMEM."""
  limit = int(chip.vmem_bytes * 0.9) if vmem_limit_bytes is None else vmem_limit_bytes

  def vmem(tn, tk):
    return 2 * tile_m * tk * 2 + 3 * tk * tn * 2 + tile_m * tn * 4 + 2 * tile_m * tn * 2

  n_limit = min(2 * chip.mxu_size, n)
  tk, tn = _align(k, lanes), _align(n, lanes)
  num_n = num_k = 1
  while vmem(tn, tk) > limit and tn > n_limit:
    num_n += 1
    tn = _align(n, num_n * lanes) // num_n
  if tn < n_limit:
    num_n -= 1
    tn = _align(n, num_n * lanes) // num_n
    while vmem(tn, tk) > limit and tk > lanes:
      num_k += 1
      tk = _align(k, num_k * lanes) // num_k
  return tk, tn


def group_metadata(group_sizes, m: int, tile_m: int):
  """(group offsets [G+1], visit -> group, visit -> row tile) for the groups of `group_sizes` over
  `m` rows: for every non-empty group in order, one visit per row tile that holds any of its rows."""
  sizes = np.asarray(group_sizes, np.int64)
  if sizes.ndim != 1 or (sizes < 0).any() or sizes.sum() != m:
    raise ValueError(f"group_sizes must be non-negative and sum to the {m} rows of lhs; got "
                     f"{sizes.tolist() if sizes.size <= 16 else sizes.sum()} ({sizes.sum()} rows)")
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  groups, tiles = [], []
  for g, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
    if end > start:
      for t in range(start // tile_m, -(-end // tile_m)):
        groups.append(g)
        tiles.append(t)
  return (offsets.astype(np.int32), np.asarray(groups, np.int32), np.asarray(tiles, np.int32))


def _body(num_k: int, tile_m: int, tile_n: int, mxu: int):
  def body(offsets_ref, group_ref, tile_ref, x_ref, w_ref, o_ref, *scratch):
    v, kk = pl.program_id(1), pl.program_id(2)
    x = x_ref[...]
    # one product per MXU-wide column chunk, concatenated (tokamax's inner loop over start_n)
    part = jnp.concatenate([jnp.dot(x, w_ref[:, c:c + mxu], preferred_element_type=jnp.float32)
                            for c in range(0, tile_n, mxu)], axis=1)

    def store(acc):
      g, t = group_ref[v], tile_ref[v]
      rows = t * tile_m + lax.broadcasted_iota(jnp.int32, acc.shape, 0)
      mine = (rows >= offsets_ref[g]) & (rows < offsets_ref[g + 1])
      first = (v == 0) | (tile_ref[jnp.maximum(v - 1, 0)] != t)   # first visit of this row tile

      @pl.when(first)
      def _():
        o_ref[...] = jnp.where(mine, acc, 0.0).astype(o_ref.dtype)

      @pl.when(jnp.logical_not(first))
      def _():
        o_ref[...] = jnp.where(mine, acc.astype(o_ref.dtype), o_ref[...])

    if num_k == 1:     # K whole: no accumulator round trip (tokamax's first-and-last k step)
      store(part)
      return
    acc_ref, = scratch

    @pl.when(kk == 0)
    def _():
      acc_ref[...] = part

    @pl.when((kk > 0) & (kk < num_k - 1))
    def _():
      acc_ref[...] += part

    @pl.when(kk == num_k - 1)
    def _():
      store(acc_ref[...] + part)
  return body


def gmm(lhs, rhs, group_sizes, *, tile_m: int, tile_k: int, tile_n: int, vmem_limit_bytes: int,
        mxu_size: int, out_dtype=None):
  """Grouped matmul of lhs (m, k) with rhs (groups, k, n); rows of lhs belong to consecutive groups of
  `group_sizes` (host integers). Tokamax's tiles and limit for a chip: `tokamax_tiles(chip, k, n,
  tile_m)` and `int(0.9 * chip.vmem_bytes)`. Runs inside `pl.virtual_tpu`."""
  m, k = lhs.shape
  groups, k2, n = rhs.shape
  if k2 != k or len(group_sizes) != groups:
    raise ValueError(f"gmm: lhs {lhs.shape}, rhs {rhs.shape} and {len(group_sizes)} group sizes do not "
                     f"agree (expected rhs (groups={len(group_sizes)}, k={k}, n))")
  limit = vmem_limit_bytes
  for what, size, tile in (("m", m, tile_m), ("k", k, tile_k), ("n", n, tile_n)):
    if size % tile:
      raise ValueError(f"gmm: tile_{what}={tile} does not divide {what}={size}; this kernel needs "
                       f"dividing tiles (pick tile_{what} from the divisors of {size})")
  offsets, visit_group, visit_tile = group_metadata(group_sizes, m, tile_m)
  num_k = k // tile_k
  out_dtype = lhs.dtype if out_dtype is None else out_dtype
  return pl.pallas_call(
      _body(num_k, tile_m, tile_n, mxu_size),
      out_shape=pl.ShapeDtypeStruct((m, n), out_dtype),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(n // tile_n, len(visit_group), num_k),
          in_specs=[pl.BlockSpec((tile_m, tile_k), lambda j, v, kk, offs, gid, tid: (tid[v], kk)),
                    pl.BlockSpec((None, tile_k, tile_n),
                                 lambda j, v, kk, offs, gid, tid: (gid[v], kk, j),
                                 pipeline_mode=pl.Buffered(3, use_lookahead=True))],
          out_specs=pl.BlockSpec((tile_m, tile_n), lambda j, v, kk, offs, gid, tid: (tid[v], j)),
          scratch_shapes=[pltpu.VMEM((tile_m, tile_n), jnp.float32)] if num_k > 1 else []),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary", "arbitrary"), vmem_limit_bytes=limit),
  )(offsets, visit_group, visit_tile, lhs, rhs)
