"""sim/memory.py's PendingValue protocol, white-box: any object with `compute_into(out)` stored whole
into a buffer is materialised only when its numbers are needed, sliced by materialising first, copied
whole straight into a DMA destination, and dropped uncomputed when the buffer is overwritten whole."""
import types

import numpy as np

from palace._src.core import MemorySpace
from palace._src.sim import memory


class _Pending:
  """A minimal PendingValue (lang/deferred.py's Deferred is the real one): counts materialisations."""

  def __init__(self, value):
    self.value = value
    self.calls = []

  def compute_into(self, out):
    self.calls.append(out.shape)
    out[...] = self.value


def _vmem(shape=(4, 8), name="b"):
  return memory.Buffer(np.zeros(shape, np.float32), shape, np.dtype(np.float32), MemorySpace.VMEM, name)


def test_a_pending_value_read_whole_stays_pending_and_a_partial_read_materialises_it_once():
  buf = _vmem()
  p = _Pending(3.0)
  memory.write(buf, (), p, adopt=True)
  assert buf.pending is p and memory.read(buf, (), timing_only=False) is p and p.calls == []
  part = memory.read(buf, (slice(0, 2),), timing_only=False)
  np.testing.assert_array_equal(part, np.full((2, 8), 3.0, np.float32))
  assert p.calls == [(4, 8)] and buf.pending is None and not part.flags.writeable
  memory.read(buf, (1,), timing_only=False)
  assert p.calls == [(4, 8)]          # computed once


def test_a_whole_overwrite_drops_a_pending_value_uncomputed():
  buf = _vmem()
  p = _Pending(1.0)
  memory.write(buf, (), p, adopt=True)
  memory.write(buf, (), np.full((4, 8), 2.0, np.float32), adopt=True)
  assert p.calls == [] and buf.pending is None
  np.testing.assert_array_equal(buf.storage, 2.0)


def test_a_partial_store_materialises_first_then_writes():
  buf = _vmem()
  p = _Pending(5.0)
  memory.write(buf, (), p, adopt=True)
  memory.write(buf, (0,), np.zeros(8, np.float32), adopt=True)
  assert p.calls == [(4, 8)]
  want = np.full((4, 8), 5.0, np.float32)
  want[0] = 0
  np.testing.assert_array_equal(buf.storage, want)


def test_a_whole_copy_of_a_pending_value_computes_straight_into_the_destination():
  src, dst = _vmem(name="src"), memory.Buffer(np.zeros((2, 4, 8), np.float32), (2, 4, 8),
                                              np.dtype(np.float32), MemorySpace.ANY, "hbm")
  p = _Pending(7.0)
  memory.write(src, (), p, adopt=True)
  req = types.SimpleNamespace(src_buf=src, dst_buf=dst, src_index=(), dst_index=(1,), add=False,
                              src_indices=None, dst_indices=None, mask=None)
  memory.copy(req)
  assert p.calls == [(4, 8)] and src.pending is p   # the source keeps its (still pending) value
  np.testing.assert_array_equal(dst.storage[1], 7.0)
  np.testing.assert_array_equal(dst.storage[0], 0.0)


def test_fresh_large_vmem_starts_with_a_pending_fill_and_timing_only_has_no_storage():
  shape = (256, 128)   # 128 KiB >= LAZY_FILL_BYTES
  buf = memory.new_buffer(shape, np.dtype(np.float32), MemorySpace.VMEM, "s", None, 0, False, True)
  assert isinstance(buf.pending, memory.Fill)
  assert memory.read(buf, (), timing_only=False) is not buf.pending   # a fill is never handed out
  assert np.isnan(buf.storage).all()
  t = memory.new_buffer(shape, np.dtype(np.int32), MemorySpace.VMEM, "t", None, 0, True, True)
  assert t.storage is None and t.pending is None
  s = memory.new_buffer((4,), np.dtype(np.int32), MemorySpace.SMEM, "s", None, 0, True, True)
  np.testing.assert_array_equal(s.storage, np.iinfo(np.int32).min)   # SMEM data moves even then


class _Batched(_Pending):
  """A value the machine keeps as a pending block of an HBM buffer (sim/memory.PendingBlocks)."""
  held_bytes = 0

  @staticmethod
  def compute_all(pairs):
    for value, out in pairs:
      value.compute_into(out)


def test_pending_blocks_start_a_new_batch_exactly_when_a_block_overlaps_a_kept_one():
  # tiles of one block grid are told apart by their start (a set), any other window by a memory test;
  # either way a batch ends exactly where the block DMA'd in shares memory with one kept (checked
  # against np.shares_memory on tiles, revisited tiles, unaligned windows, other shapes, row views)
  rng = np.random.default_rng(0)
  storage = np.zeros((64, 96), np.float32)
  tiles = [(slice(r, r + 16), slice(c, c + 32)) for r in range(0, 64, 16) for c in range(0, 96, 32)]
  other = [(slice(4, 20), slice(8, 40)), (slice(0, 16), slice(16, 48)), (slice(0, 8), slice(0, 96)),
           (slice(48, 64), slice(64, 96)), (5, slice(0, 32)), (slice(16, 32), slice(32, 33))]
  for trial in range(40):
    picks = [tiles[k] for k in rng.integers(0, len(tiles), 10)]
    if trial % 2:
      picks += [other[k] for k in rng.integers(0, len(other), 3)]
      rng.shuffle(picks)
    hbm = memory.Buffer(storage, storage.shape, storage.dtype, MemorySpace.ANY, "out")
    hbm.pending = memory.PendingBlocks()
    kept = []
    for idx in picks:
      out = storage[idx]
      if any(np.shares_memory(out, o) for o in kept):   # the reference: a new batch begins here
        kept = []
      kept.append(out)
      hbm.pending.add(hbm, _Batched(1.0), out)
      assert len(hbm.pending.blocks) == len(kept), (trial, idx)
    assert [tuple(o.__array_interface__["data"]) for _, o in hbm.pending.blocks] == \
        [tuple(o.__array_interface__["data"]) for o in kept]


def test_tile_starts_only_for_windows_on_the_block_grid():
  a = np.zeros((64, 96), np.float32)
  assert memory._tile_start(a, a[16:32, 64:96]) == (16, 64)
  assert memory._tile_start(a, a) == (0, 0)
  assert memory._tile_start(a, a[8:24, 0:32]) is None      # not a multiple of its shape
  assert memory._tile_start(a, a[3]) is None               # another rank
  assert memory._tile_start(a, a[::2, :32]) is None        # other strides
  assert memory._tile_start(a, a[:0, :32]) is None         # empty
  assert memory._tile_start(a.T, a.T[:32, :16]) is None    # not C-contiguous
  assert memory._tile_start(a, np.zeros((16, 96), np.float32)) is None   # another array
