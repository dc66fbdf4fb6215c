"""Uninitialised-read tracking of the virtual TPU (L4b), `VirtualTPU(uninitialized="raise")`; hooked in by
sim/checks.py.

Uninitialised reads (`uninitialized="raise"`): a byte mask per tracked allocation (core scratch, and
`outputs[...]` HBM buffers that still hold the NaN/sentinel fill). Stores and DMA data movement copy
definedness like valgrind; a load of a never-written element raises UninitializedReadError, and so does
the end of a launch that leaves elements of an output unwritten. Exception: a pipeline's input block
(`args[i] block`) may be read with its ragged padding unwritten (as long as part of the window was
copied in): JAX defines that padding as garbage that the kernel masks. SparseCore subcore scratch is not
tracked (its scatter/compress vector ops write memory without telling the machine).
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.core import MemorySpace
from palace._src.errors import UninitializedReadError
from palace._src.sim import memory
from palace._src.sim.races import fmt_region, access_region
from palace._src.util import fmt_site


class InitTracker:
  """Definedness bytes per allocation root; untracked buffers count as fully written."""

  def __init__(self, machine):
    self.m = machine
    self.roots = {}       # id(root ndarray) -> [root, byte mask or None, buffer name, is HBM output]

  def _view(self, buf):
    s = buf.storage
    if s is None or not isinstance(s, np.ndarray):
      return None
    root = s
    while isinstance(root.base, np.ndarray):
      root = root.base
    ent = self.roots.get(id(root))
    if ent is None:
      ent = self.roots[id(root)] = [root, *self._fresh(buf, root)]
    mask = ent[1]
    if mask is None:
      return None
    off = s.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return np.ndarray(s.shape + (s.itemsize,), np.uint8, mask, off, s.strides + (1,))

  @staticmethod
  def _fresh(buf, root):
    if buf.memory_space == MemorySpace.SEMAPHORE:
      return None, buf.name, False
    if buf.core is not None:
      return np.zeros(root.nbytes, np.uint8), buf.name, False
    if buf.name.startswith("outputs[") and _all_fill(root):
      return np.zeros(root.nbytes, np.uint8), buf.name, True
    return None, buf.name, False

  def mark(self, buf, index) -> None:
    mv = self._view(buf)
    if mv is not None:
      mv[index] = 1

  def check_read(self, core, buf, index) -> None:
    mv = self._view(buf)
    if mv is None:
      return
    m = mv[index] if index else mv
    if m.all():
      return
    if buf.name.endswith(" block") and not buf.name.startswith("outputs[") and m.any():
      return  # the padding of a ragged input block: garbage by definition, masked by the kernel
    bad = np.argwhere(m.min(axis=-1) == 0)
    first = tuple(int(i) for i in bad[0]) if bad.size else ()
    region = access_region(buf.shape, index)
    window = fmt_region(buf.name, region) if region else buf.name
    raise UninitializedReadError(
        f"Read of never-written data in {window} ({buf.memory_space}) {core.where()} at "
        f"{fmt_site(core.machine.site())}: element {first} of the loaded window (and {int(bad.shape[0]) - 1} "
        f"more) was never stored to or copied into; expected every element read to be written first. "
        f"Fresh VMEM/SMEM scratch and unwritten output blocks hold garbage on a TPU (NaN or "
        f"{_sentinel_text(buf.dtype)} in palace). Fix: initialise the buffer or copy the data in first.")

  def source(self, req):
    """Which bytes of `req`'s source window are defined now (1 where all are, or untracked)."""
    sm = self._view(req.src_buf)
    if sm is None:
      return np.uint8(1)
    return np.array(sm[req.src_selection])

  def moved(self, req, held=None) -> None:
    """`req`'s data was moved: its destination window is as defined as its source (`held`: as
    `source` found it at the copy's start, for a copy that lands later)."""
    dm = self._view(req.dst_buf)
    if dm is None:
      return
    data = self.source(req) if held is None else held
    if req.dst_indices is not None:
      if req.mask is not None and np.ndim(data):
        data = data[req.mask]
      if req.add:
        np.minimum.at(dm, req.dst_indices, np.broadcast_to(data, dm[req.dst_indices].shape))
      else:
        dm[req.dst_indices] = data
      return
    view = dm[req.dst_index] if req.dst_index else dm
    if req.mask is not None:
      view[req.mask] = np.minimum(view[req.mask], data) if req.add else data
    else:
      view[...] = np.minimum(view, data) if req.add else data

  def free(self, buf) -> None:
    s = buf.storage
    if isinstance(s, np.ndarray) and s.base is None:
      self.roots.pop(id(s), None)

  def finish(self) -> None:
    for root, mask, name, is_out in self.roots.values():
      if is_out and mask is not None and not mask.all():
        el = mask.reshape(root.shape + (root.itemsize,)).min(axis=-1) == 0
        bad = np.argwhere(el)
        raise UninitializedReadError(
            f"Kernel '{self.m.kernel_name}' left {int(bad.shape[0])} element(s) of {name} (shape "
            f"{root.shape}) never written, first at index {tuple(int(i) for i in bad[0])}; expected "
            f"every output element to be written (they would hold garbage on a TPU). Fix: check the grid "
            f"and the output index_map, or write every element of each output block.")


def _all_fill(a) -> bool:
  if dt.is_float(a.dtype):
    return bool(np.isnan(a.astype(np.float32)).all())
  if a.dtype.kind in "iu":
    return bool((a == memory.fill_value(a.dtype)).all())
  return False


def _sentinel_text(dtype) -> str:
  v = memory.fill_value(np.dtype(dtype))
  return "NaN" if isinstance(v, float) else str(v)
