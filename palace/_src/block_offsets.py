"""Block offsets of pipelined operands (L5): a BlockSpec's index map evaluated for one grid step
(`block_offsets`) or, vectorised, for every step of a grid at once (`grid_offsets`, kept in a launch
plan's cache). `op` is a pipeline operand (pipeline._Op): its block mapping `m`, the offsets found per
step (`blocks`, `all_blocks`) and whether bounds are checked.

Index maps charge nothing on any grid, whether evaluated once for the whole grid or once per step:
their work is part of the calibrated grid-step overhead (docs/timing-model.md), except the SMEM loads
and scalar ops of a map that reads prefetched scalars, charged on every step (when the map reads only
tables the kernel never writes, its offsets are still found for the whole grid at once, after its first
step, and each step's charges replayed: prefetch_maps.py).
"""
from __future__ import annotations

import itertools

import numpy as np

from palace._src import executor
from palace._src.blocks import BLOCKED, ELEMENT, INDEX_DTYPE
from palace._src.errors import BlockSpecError, OutOfBoundsError, PalaceError
from palace._src.lang.array import concrete_int


def _vectorised_offsets(op, points, min_points: int = 8, index_args=()):
  """Element offsets of every step at once, or None. Index maps are traced functions in Pallas, so
  they work on arrays: one call with the whole grid's index columns replaces one call per step. It
  runs with no executor set (plain NumPy, nothing charged to the core). Maps that need per-step
  evaluation (reading refs, Python control flow on indices) raise here and fall back; so does any
  out-of-bounds block, whose error is then raised by the per-step path with its grid point. Grids
  of fewer than `min_points` points are evaluated per step (cheaper there)."""
  m = op.m
  if len(points) < min_points:
    return None
  dtype = getattr(m.index_map, INDEX_DTYPE, np.int64)
  rank = len(points[0])   # (the points as one flat C-level iteration: no Python frame per point)
  flat = np.fromiter(itertools.chain.from_iterable(points), dtype, len(points) * rank)
  cols = [np.ascontiguousarray(flat[d::rank]) for d in range(rank)]
  token = executor.set_current(None)
  try:
    idx = m.index_map(*cols, *index_args)
  except Exception:  # noqa: BLE001  not vectorisable: evaluate per step
    return None
  finally:
    executor.reset_current(token)
  if type(idx) is not tuple:
    idx = tuple(idx) if isinstance(idx, list) else (idx,)
  if len(idx) != len(m.dims):
    return None
  n = len(points)
  offs = []
  for (kind, size, pad), i, dim in zip(m.dims, idx, m.array_shape):
    if isinstance(i, np.ndarray):
      if i.ndim > 1 or i.dtype.kind not in "iu":
        return None   # (floats and bools: the per-step path's concrete_int rejects them, with the point)
    elif not isinstance(i, (int, np.integer)) or isinstance(i, bool):
      return None
    i = np.broadcast_to(np.asarray(i, np.int64), (n,))
    off = i * size if kind == BLOCKED else (i - pad if kind == ELEMENT else i)
    lo, hi = (-pad, dim + pad) if kind == ELEMENT else (0, dim)
    if op.bounds_checks and ((off < lo).any() or (off >= hi).any()):
      return None
    offs.append(off.tolist())
  return list(zip(*offs)) if offs else [()] * n   # (rank 0: one empty offset per step)


_CACHED_POINTS = 1 << 16   # grids up to this many points keep their block offsets in the plan's cache


def grid_offsets(op, k: int, points, cache, index_args=()):
  """(every step's element offsets or None, whether they are all distinct) of operand `k` (inputs
  then outputs) over `points`: `_vectorised_offsets`, kept in `cache` (a launch plan's, for the same
  block mappings on every launch) under the points and the bounds-check flag it depends on. A map
  that does not vectorise is kept as None (per-step evaluation, as without the cache). With scalar
  prefetch, only pure maps come here: they are called with the `index_args` too, and ignore them."""
  n = len(points)
  # (a pure map, BlockMapping.pure_index_map, is evaluated once for the plan on any grid; others
  # per step on grids < 8 points: `_vectorised_offsets`)
  pure = cache is not None and op.m.pure_index_map
  if not n or (n < 8 and not pure):
    return None, False
  key = None
  if cache is not None and n <= _CACHED_POINTS:
    key = (k, op.bounds_checks, tuple(points))
    hit = cache.get(key)
    if hit is not None:
      return hit
  blocks = _vectorised_offsets(op, points, 1 if pure else 8, index_args)
  hit = (blocks, blocks is not None and len(set(blocks)) == len(blocks))
  if key is not None:
    cache[key] = hit
  return hit


def _index_map(op, point, index_args):
  """One step's index map. Evaluated on the host, uncharged, as `_vectorised_offsets` evaluates whole
  grids (a map computing with palace ops, or a JAX front-end map with equations, costs the same on any
  grid: its work is part of the calibrated grid-step overhead). A map that cannot run there, one that
  reads prefetched scalars in the kernel's SMEM, is evaluated on the core from then on, charging its
  loads (such a map never vectorises, so it is charged on every grid); an error on the host is raised
  again from the core, which names the core and the grid point."""
  m = op.m
  if not op.map_on_core:
    token = executor.set_current(None)
    try:
      return m.index_map(*point, *index_args)
    except Exception:  # noqa: BLE001  (evaluated again below, on the core)
      op.map_on_core = True
    finally:
      executor.reset_current(token)
  if op.prefetch is not None:   # (a map over scalar-prefetch tables: its first step recorded)
    return op.prefetch.evaluate(m, point, index_args)
  return m.index_map(*point, *index_args)


def block_offsets(op, step: int, point, index_args, where) -> tuple:
  if op.all_blocks is not None:
    return op.all_blocks[step]
  hit = op.blocks.get(step)
  if hit is not None:
    return hit
  pre = op.prefetch
  if pre is not None and pre.rows is not None:   # (every step's offsets found: this one charged)
    offsets = op.blocks[step] = pre.charge(step)
    return offsets
  m = op.m
  try:
    idx = _index_map(op, point, index_args)
  except PalaceError:
    raise
  except Exception as e:  # noqa: BLE001  the user's index map failed: say whose and where
    raise BlockSpecError(
        f"index_map of {m.name} ({getattr(m.index_map, '__name__', '?')!r}) raised {e!r} at grid point "
        f"{point}{' ' + where if where else ''} (called as index_map(*grid_indices"
        f"{', *scalar_prefetch_refs' if index_args else ''})). Fix: make the index map return block "
        f"indices for every point of its grid; the original error is chained below.") from e
  if type(idx) is not tuple:
    idx = tuple(idx) if isinstance(idx, list) else (idx,)
  if len(idx) != len(m.dims):
    example = ", ".join(["i"] + ["0"] * (len(m.dims) - 1))
    raise OutOfBoundsError(f"index_map of {m.name} returned {len(idx)} indices {tuple(idx)!r} for an "
                           f"array of rank {len(m.dims)} at grid point {point}; expected one per dim. "
                           f"Fix: return one block index per dimension of {m.name}, e.g. ({example}).")
  for i in idx:
    if type(i) is not int:  # runtime scalars (SMEM reads, program ids): make them concrete
      idx = tuple(concrete_int(i, f"index_map result for {m.name}") for i in idx)
      break
  offsets = m.offsets(idx)
  if op.bounds_checks:
    for d, ((kind, size, pad), off, dim) in enumerate(zip(m.dims, offsets, m.array_shape)):
      limit_lo = -pad if kind == ELEMENT else 0
      if off < limit_lo or off >= dim + (pad if kind == ELEMENT else 0):
        ex = executor.current()
        raise OutOfBoundsError(
            f"Block index out of bounds for {m.name} (shape {m.array_shape}) at grid point {point}"
            f"{' ' + where if where else ''} on chip {ex.chip_index} core {ex.core_id}: index_map "
            f"returned {idx}, i.e. element offset {off} in dim {d} of size {dim}. "
            f"Fix: check the index_map and the grid"
            + (f" (dim {d} has blocks 0..{-(-dim // size) - 1} of {size})." if kind == BLOCKED else "."))
  op.blocks[step] = offsets
  if pre is not None and op.map_on_core and not pre.tried:
    pre.settle(op, step, offsets, index_args, _vectorised_offsets)
  return offsets
