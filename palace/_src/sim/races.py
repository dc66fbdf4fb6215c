"""Kernel-bug checks of the virtual TPU (L4b): data races, reads of never-written memory, unchecked accesses.

All of it is opt-in and off the default path: a machine builds a `KernelChecks` only for
`VirtualTPU(detect_races=True)`, `VirtualTPU(uninitialized="raise")` or a core running with
`CompilerParams(disable_bounds_checks=True)`; every hook in the TensorCore and the machine is guarded by
`if self.checks is not None`.

Race detection (`detect_races=True`) is a happens-before analysis with vector clocks, one component per
core of the launch (all chips' cores for a shard_map launch):
  * a semaphore signal releases the signaller's clock (also to another core or chip); a wait acquires the
    clocks of the arrivals it consumed and of every earlier arrival on that semaphore (a sound
    over-approximation: it can only hide races, never invent them);
  * a DMA start releases the issuer's clock. The DMA reads its source and writes its destination at any
    moment between its start and the wait that consumes its completion: the write "happens at
    completion", ordered before whoever waits on its semaphore and after nothing the issuer did after the
    start. A wait on the send semaphore of a remote copy orders its source read only;
  * SparseCore subcore barriers are signals to and waits on a shared counter; the cores of a launch start
    together (nothing before them) and end together.
Every vector/scalar load and store, and every DMA's source read and destination write, is an access to a
region (per-dimension ranges, or a row set for indexed DMAs) of a buffer. Two accesses conflict when their
regions overlap, at least one writes (DMA add-writes commute with each other) and neither happens before
the other; the first conflict raises RaceError naming both accesses. Not tracked: SparseCore vector
gathers/scatters (`plsc.load_gather`, ...), aliases made by Ref.bitcast / reshape (each view is its own
buffer). A `semaphore_read` acquires the arrivals it can see, like a wait that consumes nothing.

Uninitialised reads (`uninitialized="raise"`): a byte mask per tracked allocation (core scratch, and
`outputs[...]` HBM buffers that still hold the NaN/sentinel fill). Stores and DMA data movement copy
definedness like valgrind; a load of a never-written element raises UninitializedReadError, and so does
the end of a launch that leaves elements of an output unwritten. Exception: a pipeline's input block
(`args[i] block`) may be read with its ragged padding unwritten (as long as part of the window was
copied in): JAX defines that padding as garbage that the kernel masks. SparseCore subcore scratch is not
tracked (its scatter/compress vector ops write memory without telling the machine).

Unchecked accesses (`disable_bounds_checks=True`, as on hardware): the out-of-bounds part of a load reads
garbage (NaN for floats, the int sentinel for ints), the out-of-bounds part of a store is dropped, and a
DMA moves only the elements that are in bounds on both sides (the rest of the destination keeps its old
contents); an indexed (SparseCore) DMA skips the entries whose row is out of bounds.
"""
from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np

from palace._src import executor as executor_mod
from palace._src.core import MemorySpace
from palace._src.errors import RaceError, UninitializedReadError
from palace._src.sim import memory
from palace._src.util import fmt_site, user_site

_NBUCKETS = 64       # buckets along dim 0 per buffer: an access only meets records in its buckets
_COMPACT_AT = 48     # bucket length that triggers dropping records every core has synchronised past


def make_checks(machine):
  """The machine-wide checks of a launch, or None (the default: nothing to do)."""
  tpu = machine.tpu
  races = bool(getattr(tpu, "detect_races", False))
  uninit = getattr(tpu, "uninitialized", "nan") == "raise" and not machine.timing_only  # needs data
  if not (races or uninit):
    return None
  return KernelChecks(RaceDetector(machine) if races else None,
                      InitTracker(machine) if uninit else None, False)


class KernelChecks:
  """What a core calls on its loads, stores, DMAs and frees; `unchecked` clips out-of-bounds accesses."""

  def __init__(self, races, init, unchecked: bool):
    self.races, self.init, self.unchecked = races, init, unchecked

  def with_unchecked(self) -> "KernelChecks":
    return KernelChecks(self.races, self.init, True)

  # ---- core accesses
  def load(self, core, buf, index, shape):
    """None, or a (buffer, index) to load from instead (clipped out-of-bounds loads)."""
    alt = None
    if self.unchecked:
      clip = _clip(buf.shape, index)
      if clip is not None:
        alt = (_garbage_buffer(buf, shape, clip), ())
        index = clip[0]
        if index is None:
          return alt
    if self.races is not None:
      self.races.access(core, buf, index, "r", shape)
    if self.init is not None:
      self.init.check_read(core, buf, index)
    return alt

  def store(self, core, buf, index, shape, data):
    """None, or an (index, data) to store instead (clipped out-of-bounds stores; data None: nothing)."""
    alt = None
    if self.unchecked:
      clip = _clip(buf.shape, index)
      if clip is not None:
        index, dst = clip
        if index is None:
          return (), None
        if data is not None:
          data = np.broadcast_to(data, shape)[tuple(dst)]
        alt = (index, data)
    if self.races is not None:
      self.races.access(core, buf, index, "w", shape)
    if self.init is not None:
      self.init.mark(buf, index)
    return alt

  def dma_start(self, core, rec):
    """Clip (unchecked), then record the DMA's accesses; returns the request that moves the data."""
    if self.unchecked:
      rec.req = _clip_dma(rec.req)
    if self.races is not None:
      self.races.dma_start(core, rec)
    if self.init is not None:
      self.init._view(rec.req.dst_buf)  # start tracking the destination before any data lands in it
    return rec.req

  def moved(self, req) -> None:
    if self.init is not None:
      self.init.moved(req)

  def free(self, core, buf) -> None:
    if core.machine.shared_buffers.get((core.share_group, buf.key)) is buf:
      return  # shared scratch lives until every core that uses it is done
    if self.races is not None:
      self.races.shadows.pop(id(buf), None)
    if self.init is not None:
      self.init.free(buf)

  # ---- machine hooks
  def arrival(self, seq, rec, src) -> None:
    if self.races is not None:
      self.races.arrival(seq, rec, src)

  def acquire(self, slot, applied) -> None:
    if self.races is not None:
      self.races.acquire(slot, applied)

  def peek(self, slot, now) -> None:
    if self.races is not None:
      self.races.acquire(slot, [a for a in slot.pending if a.cycle <= now], consume=False)

  def finish(self) -> None:
    if self.init is not None:
      self.init.finish()


# ====================================================================== regions
def _region(shape, index):
  """Per dimension (lo, hi, step) with hi one past the last element, or a sorted row array for an
  indexed dimension; None for an empty access."""
  if not index:
    if not all(shape):
      return None
    return tuple((0, s, 1) for s in shape)
  out = []
  for d, size in enumerate(shape):
    ix = index[d] if d < len(index) else slice(None)
    if type(ix) is slice:
      st = ix.step or 1
      lo = ix.start or 0
      stop = size if ix.stop is None else ix.stop
      if stop <= lo:
        return None
      cnt = (stop - lo + st - 1) // st
      out.append((lo, lo + (cnt - 1) * st + 1, st))
    elif isinstance(ix, (np.ndarray, list)):
      rows = np.unique(np.asarray(ix).reshape(-1))
      if rows.size == 0:
        return None
      out.append(rows)
    else:
      v = int(ix)
      out.append((v, v + 1, 1))
  return tuple(out)


def _strided_meet(a, b, lo, hi) -> bool:
  s1, s2 = a[2], b[2]
  g = math.gcd(s1, s2)
  if (b[0] - a[0]) % g:
    return False
  x = a[0] + -(-(lo - a[0]) // s1) * s1
  for _ in range(s2 // g):
    if x >= hi:
      return False
    if (x - b[0]) % s2 == 0:
      return True
    x += s1
  return False


def _dim_overlap(a, b) -> bool:
  if type(a) is tuple and type(b) is tuple:
    lo = a[0] if a[0] > b[0] else b[0]
    hi = a[1] if a[1] < b[1] else b[1]
    if lo >= hi:
      return False
    return (a[2] == 1 and b[2] == 1) or _strided_meet(a, b, lo, hi)
  if type(a) is tuple:
    a, b = b, a
  if type(b) is tuple:
    r = a[(a >= b[0]) & (a < b[1])]
    if b[2] != 1:
      r = r[(r - b[0]) % b[2] == 0]
    return r.size > 0
  return np.intersect1d(a, b, assume_unique=True).size > 0


def _overlap(ra, rb) -> bool:
  for a, b in zip(ra, rb):
    if not _dim_overlap(a, b):
      return False
  return True


def _covers(rn, ro) -> bool:
  """Does region rn contain region ro (conservative: False when unsure)."""
  for a, b in zip(rn, ro):
    if type(a) is not tuple:
      return False
    if type(b) is tuple:
      if b[0] < a[0] or b[1] > a[1]:
        return False
      if a[2] != 1 and ((b[0] - a[0]) % a[2] or (b[1] - b[0] > 1 and b[2] % a[2])):
        return False
    elif a[2] != 1 or b[0] < a[0] or b[-1] >= a[1]:
      return False
  return True


def _fmt_region(name, region) -> str:
  parts = []
  for d in region:
    if type(d) is not tuple:
      parts.append(f"rows {d[:4].tolist()}{'...' if d.size > 4 else ''}")
    elif d[1] - d[0] == 1:
      parts.append(str(d[0]))
    else:
      parts.append(f"{d[0]}:{d[1]}" + (f":{d[2]}" if d[2] != 1 else ""))
  return f"{name}[{', '.join(parts)}]"


# ====================================================================== happens-before
class _Acc:
  """One recorded access. Core accesses carry their epoch (tid, clock); DMA accesses the shared list of
  (tid, clock) epochs at which their completion was observed (`obs`)."""
  __slots__ = ("kind", "region", "tid", "clock", "obs", "dma", "site", "what", "grid", "dead", "stamp")

  def __init__(self, kind, region, tid, clock, obs, dma, site, what, grid):
    self.kind, self.region, self.tid, self.clock, self.obs = kind, region, tid, clock, obs
    self.dma, self.site, self.what, self.grid = dma, site, what, grid
    self.dead = False
    self.stamp = 0


def _before(o: _Acc, vc: dict) -> bool:
  """Does access `o` happen before everything a thread with clock `vc` does next?"""
  obs = o.obs
  if obs is None:
    return vc.get(o.tid, 0) >= o.clock
  for c, k in obs:
    if vc.get(c, 0) >= k:
      return True
  return False


def _join(into: dict, other: dict) -> None:
  for t, k in other.items():
    if into.get(t, 0) < k:
      into[t] = k


class _Dma:
  __slots__ = ("start_vc", "read_obs", "write_obs")

  def __init__(self, start_vc):
    self.start_vc, self.read_obs, self.write_obs = start_vc, [], []


class _Shadow:
  """Access records of one buffer, bucketed along dim 0 (reads apart from writes)."""
  __slots__ = ("buf", "bsize", "nb", "reads", "writes")

  def __init__(self, buf):
    self.buf = buf
    d0 = buf.shape[0] if buf.shape else 1
    self.nb = max(1, min(_NBUCKETS, d0))
    self.bsize = max(1, -(-d0 // self.nb))
    self.reads = [[] for _ in range(self.nb)]
    self.writes = [[] for _ in range(self.nb)]

  def keys(self, region):
    if not region:
      return (0,)
    d0, bs, top = region[0], self.bsize, self.nb - 1
    if type(d0) is tuple:
      lo, hi = d0[0] // bs, (d0[1] - 1) // bs
      return range(max(0, min(lo, top)), max(0, min(hi, top)) + 1)
    return np.unique(np.clip(d0 // bs, 0, top)).tolist()


class RaceDetector:
  def __init__(self, machine):
    self.m = machine
    self.vcs = {}         # tid -> vector clock {tid: clock}
    self.shadows = {}     # id(buf) -> _Shadow
    self.dmas = {}        # DMA record seq -> _Dma
    self.arrivals = {}    # semaphore arrival seq -> (released clock, _Dma or None, source side?)
    self.slot_vcs = {}    # id(sync.Semaphore) -> join of the clocks of its applied arrivals
    self.stamp = 0
    self.gen = 0
    self._min = (-1, None)

  def _vc(self, core) -> dict:
    vc = self.vcs.get(core.tid)
    if vc is None:
      vc = self.vcs[core.tid] = {core.tid: 1}
    return vc

  def _release(self, core) -> dict:
    vc = self._vc(core)
    snap = dict(vc)
    vc[core.tid] += 1
    self.gen += 1
    return snap

  def _min_vc(self) -> dict:
    """Pointwise minimum of every core's clock: what all cores have synchronised past."""
    if self._min[0] == self.gen:
      return self._min[1]
    tids = [c.tid for c in self.m.cores]
    vcs = [self.vcs.get(t) or {t: 1} for t in tids]
    out = {}
    for t in tids:
      out[t] = min(vc.get(t, 0) for vc in vcs)
    self._min = (self.gen, out)
    return out

  # ---- accesses
  def access(self, core, buf, index, kind, shape) -> None:
    region = _region(buf.shape, index)
    if region is None:
      return
    vc = self._vc(core)
    scalar = not shape or buf.memory_space == MemorySpace.SMEM
    what = f"{'scalar' if scalar else 'vector'} {'load' if kind == 'r' else 'store'}"
    keep = len(self.m.cores) > 1   # one core: its own accesses are ordered, only DMAs can race them
    acc = _Acc(kind, region, core.tid, vc[core.tid], None, None, user_site() if keep else None, what,
               _grid(core))
    self._check_add(buf, acc, vc, keep)

  def dma_start(self, core, rec) -> None:
    req = rec.req
    start_vc = self._release(core)
    st = self.dmas[rec.seq] = _Dma(start_vc)
    grid, what = _grid(core), req   # described only in an error message
    clock = start_vc[core.tid]
    src = _region(req.src_buf.shape, req.src_indices if req.src_indices is not None else req.src_index)
    dst = _region(req.dst_buf.shape, req.dst_indices if req.dst_indices is not None else req.dst_index)
    if src is not None:
      acc = _Acc("r", src, core.tid, clock, st.read_obs, st, req.site, what, grid)
      self._check_add(req.src_buf, acc, start_vc, True)
    if dst is not None:
      acc = _Acc("a" if req.add else "w", dst, core.tid, clock, st.write_obs, st, req.site, what, grid)
      self._check_add(req.dst_buf, acc, start_vc, True)

  def _check_add(self, buf, acc: _Acc, vc: dict, keep: bool) -> None:
    sh = self.shadows.get(id(buf))
    if sh is None:
      sh = self.shadows[id(buf)] = _Shadow(buf)
    keys = sh.keys(acc.region)
    self.stamp += 1
    stamp = self.stamp
    kind = acc.kind
    for key in keys:
      for lst in (sh.writes[key], sh.reads[key]):
        dirty = False
        for o in lst:
          if o.dead:
            dirty = True
            continue
          if o.stamp == stamp or (o.dma is not None and o.dma is acc.dma):
            continue
          o.stamp = stamp
          if _before(o, vc):
            if ((kind == "w" or o.kind == kind) and _covers(acc.region, o.region)) or \
                _before(o, self._min_vc()):   # covered by this access, or every core is past it
              o.dead = dirty = True
            continue
          if (kind == "r" and o.kind == "r") or (kind == "a" and o.kind == "a"):
            continue
          if _overlap(o.region, acc.region):
            if acc.site is None:
              acc.site = user_site()   # still in the accessing call: the user's line
            raise _race_error(self.m, buf, o, acc)
        if dirty or len(lst) > _COMPACT_AT:
          mvc = self._min_vc() if len(lst) > _COMPACT_AT else None
          lst[:] = [o for o in lst if not o.dead and (mvc is None or not _before(o, mvc))]
    if keep:
      target = sh.reads if kind == "r" else sh.writes
      for key in keys:
        target[key].append(acc)

  # ---- synchronisation
  def arrival(self, seq, rec, src) -> None:
    if rec is not None:
      st = self.dmas.get(rec.seq)
      if st is not None:
        self.arrivals[seq] = (st.start_vc, st, src)
      return
    core = executor_mod.maybe_current()
    if core is not None:
      self.arrivals[seq] = (self._release(core), None, False)

  def acquire(self, slot, applied, consume: bool = True) -> None:
    """A wait (or, consume=False, a semaphore_read) that saw the `applied` arrivals of `slot`."""
    core = executor_mod.maybe_current()
    if core is None:
      return
    svc = self.slot_vcs.get(id(slot))
    if svc is None:
      svc = self.slot_vcs[id(slot)] = {}
    vc0 = self._vc(core)
    dmas = []
    for a in applied:
      ent = self.arrivals.pop(a.seq, None) if consume else self.arrivals.get(a.seq)
      if ent is None:
        continue
      _join(svc if consume else vc0, ent[0])
      if ent[1] is not None:
        dmas.append((ent[1], ent[2]))
    vc = self._vc(core)
    _join(vc, svc)
    tid = core.tid
    k = vc[tid] + 1
    vc[tid] = k
    for st, src in dmas:
      st.read_obs.append((tid, k))
      if not src:
        st.write_obs.append((tid, k))
    if svc.get(tid, 0) < k:
      svc[tid] = k
    self.gen += 1


def _grid(core):
  return core.grid_stack[-1][0] if core.grid_stack else None


def _who(m, tid, grid) -> str:
  where = f"chip {tid[0]} core {tid[1]}" if m.num_chips > 1 or tid[0] else f"core {tid[1]}"
  return where + (f" at grid point {grid}" if grid is not None else "")


def _describe(m, buf, a: _Acc) -> str:
  rw = {"r": "read", "w": "write", "a": "add-write"}[a.kind]
  text = f"{rw} of {_fmt_region(buf.name, a.region)} by "
  if a.dma is None:
    return text + f"a {a.what} at {fmt_site(a.site)} on {_who(m, a.tid, a.grid)}"
  side = "source" if a.kind == "r" else "destination"
  what = f"DMA {a.what.describe}"
  state = "its completion was not yet awaited" if not a.obs else "awaited later"
  return (text + f"{what} (the copy's {side}), started at {fmt_site(a.site)} on {_who(m, a.tid, a.grid)}; "
          f"{state}")


def _race_error(m, buf, o: _Acc, n: _Acc) -> RaceError:
  if o.dma is not None and o.kind == "r":
    hint = ("The copy may still be reading its source: wait for it (.wait(), or .wait_send() for a remote "
            "copy) before overwriting the source.")
  elif o.dma is not None and not (n.dma is not None and n.kind != "r"):
    hint = ("The copy's data lands at its completion: " +
            ("it is a copy from another core/chip, so wait for it with .wait_recv() (its receive "
             "semaphore) before touching the destination." if o.tid != n.tid else
             "wait for it (.wait()) before touching its destination."))
  elif o.dma is not None:
    hint = ("Two DMAs write the same data concurrently: wait for the first (.wait()) before starting the "
            "second, or give them disjoint destinations.")
  elif n.dma is not None:
    hint = ("The DMA was started on another core without waiting for that access: signal a semaphore "
            "after the access and wait on it before starting the copy (or use a barrier).")
  else:
    hint = ("Two cores access the same data with no synchronisation between them: order them with a "
            "semaphore signal/wait or a barrier, or give each core its own block.")
  where = str(buf.memory_space) if buf.core is None else \
      f"{buf.memory_space} of chip {buf.chip} core {buf.core.core_id}"
  return RaceError(
      f"Data race in kernel '{m.kernel_name}' on {buf.name} ({where}):\n"
      f"  first:  {_describe(m, buf, o)}\n  second: {_describe(m, buf, n)}\n"
      f"Neither access is ordered before the other by a semaphore wait, DMA wait or barrier. {hint}")


# ====================================================================== uninitialised reads
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
    region = _region(buf.shape, index)
    window = _fmt_region(buf.name, region) if region else buf.name
    raise UninitializedReadError(
        f"Read of never-written data in {window} ({buf.memory_space}) {core.where()} at "
        f"{fmt_site(user_site())}: element {first} of the loaded window (and {int(bad.shape[0]) - 1} "
        f"more) was never stored to or copied into; expected every element read to be written first. "
        f"Fresh VMEM/SMEM scratch and unwritten output blocks hold garbage on a TPU (NaN or "
        f"{_sentinel_text(buf.dtype)} in palace); initialise the buffer or copy the data in first.")

  def moved(self, req) -> None:
    dm = self._view(req.dst_buf)
    if dm is None:
      return
    sm = self._view(req.src_buf)
    if sm is None:
      data = np.uint8(1)
    else:
      data = sm[req.src_indices] if req.src_indices is not None else sm[req.src_index]
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
            f"every output element to be written (they would hold garbage on a TPU). Check the grid "
            f"and the output index_map, or write every element of each output block.")


def _all_fill(a) -> bool:
  if a.dtype.kind == "f" or str(a.dtype) in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
    return bool(np.isnan(a.astype(np.float32)).all())
  if a.dtype.kind in "iu":
    return bool((a == _fill_value(a.dtype)).all())
  return False


_fill_value = memory.fill_value


def _sentinel_text(dtype) -> str:
  v = _fill_value(np.dtype(dtype))
  return "NaN" if isinstance(v, float) else str(v)


# ====================================================================== unchecked accesses
def _clip_dims(shape, index):
  """Per-dimension clipping of an index of one buffer: (None if nothing changes | list of (src entry,
  (i0, i1) of the view dim or None for int dims), or "empty")."""
  if not index:
    return None
  out, changed = [], False
  for d, size in enumerate(shape):
    ix = index[d] if d < len(index) else slice(None)
    if type(ix) is slice:
      st = ix.step or 1
      lo = ix.start or 0
      stop = size if ix.stop is None else ix.stop
      cnt = max(0, (stop - lo + st - 1) // st)
      i0 = max(0, -(-(-lo) // st)) if lo < 0 else 0
      i1 = min(cnt, max(0, -(-(size - lo) // st)))
      if i0 >= i1:
        return "empty"
      changed |= i0 != 0 or i1 != cnt
      out.append(("s", lo, st, i0, i1))
    else:
      v = int(ix)
      if not 0 <= v < size:
        return "empty"
      out.append(("i", v))
  return out if changed else None


def _clip(shape, index):
  """None when `index` is in bounds; else (in-bounds buffer index or None, index into the view-shaped
  value selecting the elements it covers)."""
  dims = _clip_dims(shape, index)
  if dims is None:
    return None
  if dims == "empty":
    return None, None
  src, dst = [], []
  for e in dims:
    if e[0] == "i":
      src.append(e[1])
    else:
      _, lo, st, i0, i1 = e
      src.append(slice(lo + i0 * st, lo + (i1 - 1) * st + 1, st))
      dst.append(slice(i0, i1))
  return tuple(src), dst


def _garbage_buffer(buf, shape, clip):
  """A stand-in buffer holding the loaded window: in-bounds elements copied, the rest garbage."""
  if buf.storage is None:
    return buf
  tmp = np.full(shape, _fill_value(buf.dtype), buf.dtype)
  index, dst = clip
  if index is not None:
    tmp[tuple(dst)] = buf.storage[index]
  return dataclasses.replace(buf, storage=tmp)


def _clip_dma(req):
  """The request restricted to the elements in bounds on both sides (a copy; the original is kept)."""
  if req.src_indices is not None or req.dst_indices is not None:
    return _clip_indexed(req)
  sd, dd = _clip_dims(req.src_buf.shape, req.src_index), _clip_dims(req.dst_buf.shape, req.dst_index)
  if sd is None and dd is None:
    return req
  req = copy.copy(req)
  if sd == "empty" or dd == "empty":
    req.src_buf = dataclasses.replace(req.src_buf, storage=None)  # nothing moves
    return req
  sd = sd or _full_dims(req.src_buf.shape, req.src_index)
  dd = dd or _full_dims(req.dst_buf.shape, req.dst_index)
  sv, dv = [e for e in sd if e[0] == "s"], [e for e in dd if e[0] == "s"]
  ranges = [(max(a[3], b[3]), min(a[4], b[4])) for a, b in zip(sv, dv)]
  if any(i0 >= i1 for i0, i1 in ranges):
    req.src_buf = dataclasses.replace(req.src_buf, storage=None)
    return req
  req.src_index = _rebuild(sd, ranges)
  req.dst_index = _rebuild(dd, ranges)
  return req


def _clip_indexed(req):
  """Drop the index entries of an indexed (gather/scatter) DMA whose row is out of bounds."""
  gather = req.src_indices is not None
  fancy = req.src_indices if gather else req.dst_indices
  rows = np.asarray(fancy[0])
  ok = (rows >= 0) & (rows < (req.src_buf if gather else req.dst_buf).shape[0])
  if ok.all():
    return req
  req = copy.copy(req)
  pos = np.nonzero(req.mask)[0] if req.mask is not None else np.arange(rows.shape[0])
  mask = np.zeros(rows.shape[0] if req.mask is None else req.mask.shape[0], bool)
  mask[pos[ok]] = True
  fancy = (rows[ok],) + tuple(fancy[1:])
  if gather:
    req.src_indices = fancy
  else:
    req.dst_indices = fancy
  req.mask = mask
  return req


def _full_dims(shape, index):
  out = []
  for d, size in enumerate(shape):
    ix = index[d] if index and d < len(index) else slice(None)
    if type(ix) is slice:
      st = ix.step or 1
      lo = ix.start or 0
      stop = size if ix.stop is None else ix.stop
      out.append(("s", lo, st, 0, max(0, (stop - lo + st - 1) // st)))
    else:
      out.append(("i", int(ix)))
  return out


def _rebuild(dims, ranges):
  it = iter(ranges)
  out = []
  for e in dims:
    if e[0] == "i":
      out.append(e[1])
    else:
      i0, i1 = next(it)
      out.append(slice(e[1] + i0 * e[2], e[1] + (i1 - 1) * e[2] + 1, e[2]))
  return tuple(out)
