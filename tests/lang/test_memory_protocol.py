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
