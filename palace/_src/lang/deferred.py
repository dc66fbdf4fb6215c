"""Deferred matmul sums (L4a): `acc + jnp.dot(a, b)` kept as `c + sum_k a_k @ b_k` until it is read.

Why. A K-tiled matmul kernel adds one block product per grid step into a float32 accumulator:
`acc_ref[...] += jnp.dot(x_ref[...], y_ref[...])`. Done eagerly on the host that is one mid-size BLAS
call, one full-block add and one store per step, and many mid-size GEMMs are far slower than one
large one (2048^3 f32 on this kind of machine: 64 block GEMMs of 512^3 take 1.6x one `x @ y`; 16 GEMMs
of 512x2048x512 take 1.17x). So a large enough product is not computed when issued: `jnp.dot` returns a
`Deferred` value, adding it to a float32 array or another `Deferred` extends the sum, and storing it
into a whole VMEM buffer leaves it there (`Buffer.pending`: a `Deferred` implements the machine's
PendingValue protocol, sim/memory.py, by `compute_into(out)`). The sum is computed when anything needs its
numbers: a lang op reading `_data`, a partial load or store, a DMA out of the buffer (which computes it
straight into the destination, e.g. the HBM output block) or the end of the launch. When the K operands
are adjacent views of one array (blocks DMA'd from HBM are borrowed views of it, `memory.copy`) the
panel `[a_0 a_1 ...]` is that array's view and the whole sum is one GEMM with no copy.

Semantics. A `Deferred` is a value like any `Array`: it never changes after it is made. Its operands
are `Array`s, which copy on write (`Buffer.detach_readers`), so later writes to the buffers they were
read from do not reach it. Results equal the eager ones up to float32 summation order (one BLAS call
sums over the whole K, as the MXU accumulates in float32); integer and float64 products are never
deferred. Timing is untouched: every op charges the executor exactly as the eager path does; only the
host arithmetic moves. Off when a checker (race detection, uninitialised-read tracking) runs, since
those follow storage identity (`Executor.deferred_values`).
"""
from __future__ import annotations

import functools
import operator
import weakref

import numpy as np

from palace._src import blas, hostmem
from palace._src import dtypes as dt
from palace._src.executor import OpClass
from palace._src.lang import mxu
from palace._src.lang.array import Array

_F32 = np.dtype(np.float32)
_DATA = operator.attrgetter("_data")
_ZERO = np.float32(0)
_OPERAND_DTYPES = (np.dtype(np.float32), np.dtype(dt.bfloat16))
_ENDS = (np.dtype(np.float32), np.dtype(dt.bfloat16), np.dtype(np.float16))

MIN_FLOPS = 2 * 256 * 256 * 256   # smaller products gain nothing from merging (128-blocks: 16 tiny GEMMs
                                  # cost about what one 128x2048x128 GEMM plus the panel copies does)
ZEROS_MIN_BYTES = 64 * 1024       # zero matrices at least this large start as empty sums
MAX_TERMS = 64                    # then the sum is computed and becomes the next one's addend
MAX_TERM_BYTES = 64 * 2**20       # operand bytes a sum may keep alive (copies, when not borrowed views)


class Deferred(Array):
  """`base + sum(a @ b for a, b in terms)` in float32, cast to `dtype` when computed; the operands as
  given (float32 or bfloat16), read the way the MXU reads them at `precision` (mxu.py: float32 rounded
  to bfloat16 at DEFAULT) when the sum is computed, once per operand span (HostCache).

  `_data` is left unset until the value is needed: reading it computes the sum once (`__getattr__`)."""
  __slots__ = ("_terms", "_base", "_term_bytes", "_cache", "_precision")

  def __init__(self, terms, base, shape, dtype, ready, term_bytes, cache, precision):
    self._terms = terms          # tuple of (Array, Array); None once computed
    self._base = base            # float32 Array or None (zero)
    self._term_bytes = term_bytes
    self._cache = cache          # the core's HostCache (widened panels, scratch) or None
    self._precision = precision  # mxu.DEFAULT or mxu.HIGHEST, one for every term
    self.shape = shape
    self.dtype = dtype
    self._ready = ready

  def __getattr__(self, name):
    if name != "_data":
      raise AttributeError(name)
    out = np.empty(self.shape, self.dtype)
    self.compute_into(out)
    self._data = out
    self._terms = self._base = None
    return out

  @property
  def held_bytes(self) -> int:
    """Operand bytes this value keeps alive until computed (an upper bound: views of HBM blocks count
    too); a machine keeping it pending bounds their sum (sim/memory.PendingBlocks)."""
    return 0 if self._terms is None else self._term_bytes

  def compute_into(self, out: np.ndarray) -> None:
    """Write the value into `out` (an array or view of this shape and dtype): the machine calls this
    for a buffer holding the value, with `out` its new storage or a DMA's destination view."""
    gemm = self._gemm(out, True)
    if gemm is not None:
      blas.matmul(*gemm)
      self._finish(gemm[2], out)

  @staticmethod
  def compute_all(pairs) -> None:
    """`value.compute_into(out)` for every (value, out) of `pairs`, destinations that do not overlap
    (the machine's batch of values DMA'd into blocks of one HBM buffer, sim/memory.PendingBlocks): the
    operand panels are made here, then the GEMMs run as one batch (blas.matmuls: whole products spread
    over the launch's threads), then the bases are added. A panel still to convert (rounded to bf16,
    widened) is handed to the batch unconverted (`blas.Lazy`): the first of its threads whose product
    needs it converts it, beside the other threads' GEMMs (before, every panel was converted on this
    thread before the batch started: 2048^3 with 512 blocks, 8 panels of 4 MiB, ~10 ms). Each value's
    numbers are those `compute_into` gives: the same panels, the same GEMM, the same additions. A batch
    holds at most HostCache.MAX_BYTES of distinct panels (then it runs and the next one starts), as the
    cache does."""
    gemms, finish, panels = [], [], {}
    for i, (value, out) in enumerate(pairs):
      gemm = value._gemm(out, len(pairs) == 1, True)
      if gemm is not None:
        gemms.append(gemm)
        finish.append((value, gemm[2], out))
        panels[id(gemm[0])], panels[id(gemm[1])] = gemm[0].nbytes, gemm[1].nbytes
      if gemms and (i == len(pairs) - 1 or sum(panels.values()) > HostCache.MAX_BYTES):
        blas.matmuls(gemms)
        for done in finish:
          done[0]._finish(done[1], done[2])
        gemms, finish, panels = [], [], {}

  def _gemm(self, out: np.ndarray, scratch: bool, lazy: bool = False):
    """(row panel, column panel, float32 result) of the GEMM that computes this sum into `out`, or None
    when there is none (computed already, or an empty sum: then `out` is written here). The result is
    `out` itself when it is float32, else the cache's scratch (`scratch`: no other value's GEMM uses it
    before this one is finished) or a new array. `lazy`: a cached panel not converted yet may be a
    `blas.Lazy` (for a batch, blas.matmuls)."""
    if self._terms is None:
      np.copyto(out, self._data)
      return None
    if not self._terms:
      if self._base is None:
        out.fill(0)
      else:   # 0 + base, added: a -0.0 of the base becomes +0.0, as the eager add gives (a copy kept it)
        np.add(self._base._data, _ZERO, out=out, casting="unsafe")
      return None
    cache = self._cache
    acc = out if out.dtype == _F32 else (cache.scratch(self.shape) if cache is not None and scratch
                                         else np.empty(self.shape, _F32))
    prec = self._precision
    a_panel = _panel([a for a, _ in self._terms], 1, cache, prec, lazy)
    b_panel = _panel([b for _, b in self._terms], 0, cache, prec, lazy)
    return a_panel, b_panel, acc

  def _finish(self, acc: np.ndarray, out: np.ndarray) -> None:
    """After the GEMM into `acc`: add the base, cast into `out`."""
    if self._base is not None:
      np.add(acc, self._base._data, out=acc)
    if acc is not out:
      np.copyto(out, acc, casting="unsafe")

  def _again(self, ready: int):
    """The same value read back from a buffer at `ready`."""
    if self._terms is None:
      view = self._data.view()
      view.flags.writeable = False
      return Array(view, self.shape, self.dtype, ready)
    return Deferred(self._terms, self._base, self.shape, self.dtype, ready, self._term_bytes,
                    self._cache, self._precision)


def deferrable(ex, a, b, out_dtype) -> bool:
  """Whether `jnp.dot(a, b)` (2-D, at least MIN_FLOPS) is computed later on this executor (never under
  the shared-dots diagnostic: each dot is then its own `mxu.shared_product`, summed as issued; the
  caller never defers a dot summed by the chip's rule either, mxu.follows_chip: each is its own
  `mxu.chip_product`, added as the kernel adds it)."""
  return (out_dtype == _F32 and type(a) is Array and type(b) is Array
          and ex is not None and ex.deferred_values and not ex.shared_dots and a.dtype in _OPERAND_DTYPES
          and b.dtype in _OPERAND_DTYPES and a._data is not None and b._data is not None)


# DEFAULT under the running launch's exact-f32-dots diagnostic (mxu.rounds_to_bf16): float32 operands
# unrounded. A product's rounding is fixed when it is made, since its sum may be computed after the
# launch's executor is gone (an HBM buffer's pending blocks, sim/memory.PendingBlocks); a token of its
# own, so sums merge exactly as they did (never with a HIGHEST one).
_EXACT_DEFAULT = "DEFAULT (unrounded: exact-f32 diagnostic)"


def product(ex, a, b, ready: int, precision: str) -> Deferred:
  """`a @ b` (float32) at `precision` (mxu.DEFAULT or HIGHEST) as a Deferred ready at `ready` (the
  MXU charge is the caller's). The operands are kept as they are: float32 ones are rounded to bfloat16
  (at DEFAULT) once per span when the sum is computed, not copied per product."""
  if precision == mxu.DEFAULT and ex.exact_f32_dots:   # (= not mxu.rounds_to_bf16(_F32, precision) on ex)
    precision = _EXACT_DEFAULT
  return Deferred(((a, b),), None, (a.shape[0], b.shape[1]), _F32, ready,
                  a._data.nbytes + b._data.nbytes, HostCache.of(ex), precision)


def zeros(ex, shape):
  """A float32 zero matrix as an empty sum (nothing written until it is read), or None when too small
  to matter or not deferrable here."""
  if (len(shape) != 2 or shape[0] * shape[1] * 4 < ZEROS_MIN_BYTES
      or not ex.deferred_values):
    return None
  ready = ex.vector_op(OpClass.FREE, shape, _F32, 0)   # (a fill: numpy_creation._full)
  return Deferred((), None, shape, _F32, ready, 0, HostCache.of(ex), None)


def add(ex, x, y):
  """x + y as a Deferred when one side is a float32 Deferred sum and the other a float32 array of the
  same shape (or another such sum); None when the eager add should run."""
  d, other = (x, y) if type(x) is Deferred else (y, x)
  if d.dtype != _F32 or d._terms is None or ex is None or not ex.deferred_values:
    return None
  to = type(other)
  precision = d._precision
  if to is Deferred:
    if (other.dtype != _F32 or other.shape != d.shape or other._terms is None
        or (d._base is not None and other._base is not None)):
      return None
    if precision is None or other._precision is None:   # an empty sum takes the other's precision
      precision = other._precision if precision is None else precision
    elif precision != other._precision:
      return None
    terms, base = d._terms + other._terms, d._base if d._base is not None else other._base
    nbytes = d._term_bytes + other._term_bytes
  elif to is Array and other.dtype == _F32 and other.shape == d.shape and d._base is None:
    if other._data is None:
      return None
    terms, base, nbytes = d._terms, other, d._term_bytes
  else:
    return None
  if len(terms) > MAX_TERMS or nbytes > MAX_TERM_BYTES:
    if to is not Deferred or other._base is not None or len(other._terms) > MAX_TERMS // 2:
      return None
    # compute the sum so far and start a new one on it (bounded memory, still one GEMM per piece)
    terms, base, nbytes = other._terms, Array(d._data, d.shape, _F32, d._ready), other._term_bytes
  ready = ex.vector_op(OpClass.CHEAP, d.shape, _F32, d._ready if d._ready > other._ready else other._ready)
  return Deferred(terms, base, d.shape, _F32, ready, nbytes, d._cache, precision)


def astype(ex, x, dtype):
  """A float32 sum cast to bf16/f16 stays deferred (the cast happens once, when it is computed)."""
  if (x._terms is None or x.dtype != _F32 or dtype not in _ENDS or ex is None
      or not ex.deferred_values):
    return None
  ready = ex.vector_op(OpClass.CHEAP, x.shape, dtype, x._ready)
  return Deferred(x._terms, x._base, x.shape, dtype, ready, x._term_bytes, x._cache, x._precision)


# ------------------------------------------------------------------------------- operand panels
def _root(a: np.ndarray) -> np.ndarray:
  while isinstance(a.base, np.ndarray):
    a = a.base
  return a


def _panel(arrays, axis: int, cache, precision, lazy: bool = False):
  """The operands joined along `axis` (1: [a_0 a_1 ...], 0: [b_0; b_1; ...]) as one float32 matrix of
  the values the MXU multiplies (`_mxu_f32`).

  Adjacent views of one array (the usual case: blocks of an HBM operand) are joined by viewing the
  span they tile, without a copy; a span that needs converting (bf16 widened, float32 rounded to bf16
  at DEFAULT) is converted once and cached (HostCache; `lazy`: a `blas.Lazy` when not converted yet).
  Otherwise the blocks are converted into a fresh panel."""
  datas = [x._data for x in arrays]
  joined = datas[0] if len(datas) == 1 else _adjacent_span(datas, axis)
  if joined is not None:
    if joined.dtype == _F32 and not mxu.rounds_to_bf16(_F32, precision):
      return joined
    if cache is not None:
      return cache.converted(joined, _root(datas[0]), arrays, precision, lazy)
    return _mxu_f32(joined, precision)
  other = 1 - axis
  shape = [datas[0].shape[other]] * 2
  shape[axis] = sum(d.shape[axis] for d in datas)
  out = np.empty(shape, _F32)
  at = 0
  for d in datas:
    w = d.shape[axis]
    _mxu_f32(d, precision, out[:, at:at + w] if axis == 1 else out[at:at + w])
    at += w
  return out


def _mxu_f32(d: np.ndarray, precision, out: np.ndarray | None = None) -> np.ndarray:
  """A float32 or bfloat16 operand as the float32 values the MXU multiplies at `precision` (into `out`
  when given): bfloat16 widened exactly, float32 rounded to bfloat16 at DEFAULT (mxu.round_to_bf16's
  values)."""
  if d.dtype == dt.bfloat16:
    return dt.bf16_to_f32(d, out=out)
  if mxu.rounds_to_bf16(d.dtype, precision):
    return mxu.round_to_bf16_as_f32(d, np.empty(d.shape, _F32) if out is None else out)
  if out is None:
    return d
  np.copyto(out, d)
  return out


def _convert(span: np.ndarray, rounds: bool, wide: np.ndarray) -> np.ndarray:
  """A cache entry's conversion (HostCache.converted) into `wide`, made read-only once written:
  `_mxu_f32`'s, with its rounding decided by the caller (`rounds`: mxu.rounds_to_bf16 of the span, asked
  on the launch's thread; this may run on a helper thread of a batch, blas.Lazy). A float32 span
  to round that is not contiguous (a column panel of a row-major operand) is copied into contiguous
  scratch first: the rounding's passes then read that once-strided copy instead of each reading the
  strided span (a 2048 x 512 column panel of a 2048^2 operand: 1.64 -> 1.00 ms; the same bits, the
  rounding is element by element)."""
  if span.dtype == dt.bfloat16:
    dt.bf16_to_f32(span, out=wide)
  elif not rounds:
    np.copyto(wide, span)
  elif not span.flags.c_contiguous:
    staged = [hostmem.take(span.shape, _F32)]
    np.copyto(staged[0], span)
    mxu.round_to_bf16_as_f32(staged[0], wide)
    hostmem.give_back(staged)
  else:
    mxu.round_to_bf16_as_f32(span, wide)
  wide.flags.writeable = False
  return wide


def _adjacent_span(datas, axis: int):
  """A view covering datas[0], datas[1], ... laid end to end along `axis` in one array's memory, or None.

  Each element of the span is an element of one of the views (same strides, same extent across
  `axis`, each view starting where the previous one ends), so the view reads only their memory."""
  first = datas[0]
  root = _root(first)
  strides, dtype = first.strides, first.dtype
  other = 1 - axis
  across = first.shape[other]
  step = strides[axis]
  addr = first.__array_interface__["data"][0]
  total = 0
  for d in datas:
    if (d.strides != strides or d.dtype != dtype or d.shape[other] != across or d.ndim != 2
        or d.__array_interface__["data"][0] != addr + total * step or _root(d) is not root):
      return None
    total += d.shape[axis]
  shape = (across, total) if axis == 1 else (total, across)
  return np.lib.stride_tricks.as_strided(first, shape=shape, strides=strides, writeable=False)


def _addr(d: np.ndarray) -> int:
  return d.__array_interface__["data"][0]


class HostCache:
  """Per-core host memory for deferred sums during one launch: the float32 values of operand spans as
  the MXU reads them (bf16 widened, float32 rounded to bf16 at DEFAULT) and a scratch array per shape
  (fresh pages cost more than the arithmetic: widening a 512x2048 span into new memory takes ~0.85 ms,
  into warm memory ~0.2 ms). A K-tiled matmul reads each row panel of x once per output column block
  and each column panel of y once per row block: converted once here, not once per product.

  A widened span is reused while the values it was made from still view the same memory: they are
  copy-on-write readers of every buffer they were read through (Ref.__getitem__), so any write to that
  memory detaches them (their `_data` becomes another array) and the entry stops matching (the guards
  compare the values' `_data` by identity: one C pass, where comparing addresses cost a NumPy array
  interface, ~2 us, per operand block). Entries are kept in use order up to MAX_BYTES."""
  MAX_BYTES = 64 * 2**20

  def __init__(self):
    self._spans = {}   # (id of root, address, shape, strides, dtype, rounds) -> (float32 array,
                       # guards: (values, their _data arrays), nbytes, blas.Lazy or None)
    self._bytes = 0
    self._scratch = {}
    self._owned = []   # scratch arrays from hostmem, handed back with the spans when this cache goes
    self._finalizer = weakref.finalize(self, _release, self._spans, self._scratch, self._owned)

  def release(self) -> None:
    """End of the launch (launch.release_host_caches): give the arrays back to hostmem."""
    self._finalizer()

  @staticmethod
  def of(ex):
    store = ex.host_cache
    if store is None:
      return None
    cache = store.get("deferred")
    if cache is None:
      cache = store["deferred"] = HostCache()
    return cache

  def scratch(self, shape) -> np.ndarray:
    buf = self._scratch.get(shape)
    if buf is None:
      buf = self._scratch[shape] = hostmem.take(shape, _F32)
      self._owned.append(buf)
    return buf

  def converted(self, span: np.ndarray, root: np.ndarray, arrays, precision, lazy: bool = False):
    """`_mxu_f32(span, precision)`, from the cache while `arrays` (the values the span joins) still
    view the memory it was made from. `lazy` (a batch's panels, Deferred.compute_all): a span not
    converted yet is returned as a `blas.Lazy` that converts it when first needed, on whichever thread
    of the batch needs it first; the entry is cached at once (a later product of the batch that reads
    the same span gets the same Lazy; outside a batch a pending one is converted before it is returned)."""
    rounds = mxu.rounds_to_bf16(span.dtype, precision)
    key = (id(root), _addr(span), span.shape, span.strides, span.dtype, rounds)
    hit = self._spans.pop(key, None)
    if hit is not None:
      values, datas = hit[1]
      if all(map(operator.is_, map(_DATA, values), datas)):
        pending = hit[3]
        if pending is not None and not (lazy and not pending.done):
          try:
            pending.get()
          except BaseException:   # the conversion failed: the entry goes
            self._bytes -= hit[2]
            raise
          hit = hit[:3] + (None,)
        self._spans[key] = hit   # most recently used last
        return hit[0] if hit[3] is None else hit[3]
      self._bytes -= hit[2]
    wide = hostmem.take(span.shape, _F32)
    pending = blas.Lazy(functools.partial(_convert, span, rounds, wide), span.shape, wide.nbytes) \
        if lazy else None
    if pending is None:
      _convert(span, rounds, wide)
    guards = (tuple(arrays), tuple(map(_DATA, arrays)))
    self._spans[key] = (wide, guards, wide.nbytes, pending)
    self._bytes += wide.nbytes
    while self._bytes > self.MAX_BYTES and len(self._spans) > 1:
      # an evicted span goes back at once (hostmem takes it only once nothing reads it), not at
      # the end of the launch: kept to the end, a 8192^3 matmul with 512x1024 blocks, re-widening
      # its 32 MiB panels of y per output block, held 5.6 GB
      evicted = [self._spans.pop(next(iter(self._spans)))]
      self._bytes -= evicted[0][2]
      evicted[0] = evicted[0][0]
      hostmem.give_back(evicted)   # (a Lazy still to run holds its array: hostmem leaves it)
    return wide if pending is None else pending


def _release(spans: dict, scratch: dict, owned: list) -> None:
  owned.extend(entry[0] for entry in spans.values())
  spans.clear()
  scratch.clear()
  hostmem.give_back(owned)
