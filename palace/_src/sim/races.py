"""Data-race detection of the virtual TPU (L4b), `VirtualTPU(detect_races=True)`; hooked in by sim/checks.py.

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
"""
from __future__ import annotations

import math

import numpy as np

from palace._src import executor as executor_mod
from palace._src.core import MemorySpace
from palace._src.errors import RaceError
from palace._src.util import fmt_site

_NBUCKETS = 64       # buckets along dim 0 per buffer: an access only meets records in its buckets
_COMPACT_AT = 48     # bucket length that triggers dropping records every core has synchronised past


# ====================================================================== regions
def access_region(shape, index):
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


def fmt_region(name, region) -> str:
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
    region = access_region(buf.shape, index)
    if region is None:
      return
    vc = self._vc(core)
    scalar = not shape or buf.memory_space == MemorySpace.SMEM
    what = f"{'scalar' if scalar else 'vector'} {'load' if kind == 'r' else 'store'}"
    keep = len(self.m.cores) > 1   # one core: its own accesses are ordered, only DMAs can race them
    acc = _Acc(kind, region, core.tid, vc[core.tid], None, None, self.m.site() if keep else None, what,
               _grid(core))
    self._check_add(buf, acc, vc, keep)

  def dma_start(self, core, rec) -> None:
    req = rec.req
    start_vc = self._release(core)
    st = self.dmas[rec.seq] = _Dma(start_vc)
    grid, what = _grid(core), req   # described only in an error message
    clock = start_vc[core.tid]
    src = access_region(req.src_buf.shape, req.src_selection)
    dst = access_region(req.dst_buf.shape, req.dst_indices if req.dst_indices is not None else req.dst_index)
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
              acc.site = self.m.site()   # still in the accessing call: the user's line
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
  text = f"{rw} of {fmt_region(buf.name, a.region)} by "
  if a.dma is None:
    return text + f"a {a.what} at {fmt_site(a.site)} on {_who(m, a.tid, a.grid)}"
  side = "source" if a.kind == "r" else "destination"
  what = f"DMA {a.what.describe}"
  state = "its completion was not yet awaited" if not a.obs else "awaited later"
  return (text + f"{what} (the copy's {side}), started at {fmt_site(a.site)} on {_who(m, a.tid, a.grid)}; "
          f"{state}")


def _race_error(m, buf, o: _Acc, n: _Acc) -> RaceError:
  if o.dma is not None and o.kind == "r":
    hint = ("The copy may still be reading its source. Fix: wait for it (.wait(), or .wait_send() for a "
            "remote copy) before overwriting the source.")
  elif o.dma is not None and not (n.dma is not None and n.kind != "r"):
    hint = ("The copy's data lands at its completion. " +
            ("It is a copy from another core/chip. Fix: wait for it with .wait_recv() (its receive "
             "semaphore) before touching the destination." if o.tid != n.tid else
             "Fix: wait for it (.wait()) before touching its destination."))
  elif o.dma is not None:
    hint = ("Two DMAs write the same data concurrently. Fix: wait for the first (.wait()) before starting "
            "the second, or give them disjoint destinations.")
  elif n.dma is not None:
    hint = ("The DMA was started on another core without waiting for that access. Fix: signal a "
            "semaphore after the access and wait on it before starting the copy (or use a barrier).")
  else:
    hint = ("Two cores access the same data with no synchronisation between them. Fix: order them with "
            "a semaphore signal/wait or a barrier, or give each core its own block.")
  where = str(buf.memory_space) if buf.core is None else \
      f"{buf.memory_space} of chip {buf.chip} core {buf.core.core_id}"
  return RaceError(
      f"Data race in kernel '{m.kernel_name}' on {buf.name} ({where}):\n"
      f"  first:  {_describe(m, buf, o)}\n  second: {_describe(m, buf, n)}\n"
      f"Neither access is ordered before the other by a semaphore wait, DMA wait or barrier. {hint}")
