"""Memory of the virtual TPU (L4b): buffers and every rule about their storage.

This is the one module that touches a buffer's NumPy storage: allocation (with the uninitialised
NaN / int-sentinel fill, possibly pending), loads, stores, DMA data movement, and the rules that let them
skip copies while values never change after they are made:
  * copy-on-write readers: a load returns a read-only view of the storage; the value is registered as a
    reader (weakref) and the next write to the buffer first gives every live reader its own copy
    (`Buffer.detach_readers`);
  * adopted stores: a whole-buffer store of a fresh array keeps that array as the new storage (`write`);
  * borrowed views: a whole-buffer DMA of a large block may view the source instead of copying it
    (`Buffer.borrow`); a later write to either side copies first;
  * pending values: a whole-buffer store may leave a value that is computed only when something needs
    its numbers (`Buffer.pending`, the PendingValue protocol below): a partial load or store, a DMA out
    of the buffer (computed straight into the destination) or reading `storage`. Fresh VMEM buffers
    start with a pending `Fill`; the language's deferred matmul sums (lang/deferred.py) are the other
    implementation. Such a sum DMA'd into a block of an HBM buffer stays pending there with the
    buffer's other pending blocks (`PendingBlocks`), computed as one batch when the buffer is read.
A timing-only machine keeps no storage for vector memories: their buffers are shape and dtype only.
"""
from __future__ import annotations

import copy as copy_module
import dataclasses
import operator
import weakref
from typing import Any, Protocol

import numpy as np

from palace._src import dtypes as dt
from palace._src.core import MemoryRef, MemorySpace, SemaphoreKind
from palace._src.errors import ResourceError, UsageError
from palace._src.util import fmt_bytes, prod

_SMEM = MemorySpace.SMEM
_VMEM = MemorySpace.VMEM
_ANY, _HBM = MemorySpace.ANY, MemorySpace.HBM
_STORAGE = operator.attrgetter("_storage")
is_ = operator.is_


class PendingValue(Protocol):
  """What a pending (lazy) value must offer the machine (structural: lang/deferred.py's `Deferred`
  implements it without importing this module).

  * materialise: `compute_into(out)` writes the value into `out`, an array (or a view, e.g. a DMA
    destination block) of the buffer's shape and dtype. The machine calls it at most once per store,
    when something needs the numbers; it must not keep `out`.
  * slice: a partial load or store of a buffer holding a pending value materialises it first (the
    buffer's `storage`); a whole-buffer load returns the value itself (the language then keeps it).
  * detach: the value never changes after it was made (its inputs copy on write); a whole-buffer
    overwrite of the buffer drops it uncomputed.
  A store hands the machine a pending value only for a whole VMEM buffer of the same shape and dtype
  (the language checks this)."""

  def compute_into(self, out: np.ndarray) -> None: ...


@dataclasses.dataclass(eq=False)
class Buffer:
  """One allocation on the virtual machine: NumPy storage plus where it lives.

  `storage` is None in timing-only mode for vector memories. `name` is the origin path used in errors
  (`args[0]`, `outputs[1]`, `scratch[2]`).

  A whole-buffer store may leave a pending value instead of numbers (`pending`, a PendingValue). Reading
  `storage` computes it first, so code that only uses `storage` never sees it; assigning `storage`
  drops it."""
  storage: Any
  shape: tuple
  dtype: np.dtype
  memory_space: MemorySpace
  name: str
  core: Any = None            # the owning core (sim object) for VMEM/SMEM/semaphores; None for HBM
  chip: int = 0
  ready_cycle: int = 0        # when the last vector store to it finishes (timing model)
  sem_kind: SemaphoreKind | None = None
  key: tuple | None = None    # (name, allocation number) on its core: the "same" buffer on other cores
  home: object = None         # a semaphore tied to a mesh (MPMD): that mesh's executor.MeshHome
  readers: list | None = None  # weakrefs to values (and borrowing buffers) viewing `storage`
  aliased: bool = False       # storage shared with a bitcast/reshape view: loads always copy
  borrowed: object = None     # the buffer whose storage this one views after a whole-buffer DMA
  lenders: list | None = None  # buffers whose reader lists hold this one
  pending: object = dataclasses.field(default=None, init=False)  # a deferred whole-buffer value
  # (storage is computed on first read); not an __init__ field, so dataclasses.replace never copies it
  _ro: object = dataclasses.field(default=None, init=False, repr=False)  # a read-only view of the
  # current storage (loads index it: a view of a read-only view is read-only); reset with `storage`
  _readers_cap: int = dataclasses.field(default=64, init=False, repr=False)  # `readers` length that
  # triggers dropping dead entries (add_reader)
  _owners: object = dataclasses.field(default=None, init=False, repr=False)  # owners()'s last answer
  # with what it was computed from; reset with `storage`
  landing: list | None = dataclasses.field(default=None, init=False, repr=False)  # DMA records of
  # copies from other cores or chips whose data lands here later (sim/dma.py `land_due`); None: none

  def rebind(self, storage) -> None:
    """This buffer as if made anew holding `storage` (None: none): no readers, lenders, borrowed or
    aliased storage, no pending value, ready at cycle 0. A kept launch reuses its buffer objects
    (launch/run.py `_Warm`: HBM operands rebound per launch, released when parked; memory.renew)."""
    self.storage = storage   # (drops a pending value and the read-only view)
    self.borrowed = self.lenders = self.readers = None
    self._readers_cap = 64
    self.aliased = False
    self.ready_cycle = 0
    self.landing = None

  def detach_readers(self) -> None:
    """Before any write to `storage`: values read from it without a copy get their own copy now,
    so a value never changes after it was read (copy on write); buffers that borrowed it by DMA
    take their own copy; and if this buffer borrows another's storage, it copies it first."""
    readers = self.readers
    if readers:
      for r in readers:
        value = r()
        if value is None:
          continue
        if isinstance(value, Buffer):
          # a borrower registered here views this storage: directly (`borrowed is self`) or through a
          # buffer that has since stopped borrowing it (a stale chain; the memory decides)
          if value.borrowed is self or (value.borrowed is not None and value.owners((self,))):
            value.unborrow()
          if value.lenders:
            value.lenders = [known for known in value.lenders if known is not self]
        elif value._data is not None and value._data.base is not None:
          value._data = value._data.copy()
      readers.clear()
    if self.borrowed is not None:
      self.unborrow()

  def unborrow(self) -> None:
    """Stop viewing the lender's storage: take a private, writable copy."""
    self.borrowed = None
    self.detach_readers()
    self.storage = np.array(self.storage, copy=True)

  def borrow(self, lender: "Buffer", view) -> None:
    """A whole-buffer copy from `lender` done by viewing its storage (read-only) instead of copying;
    any later write to either side makes this buffer take its own copy first."""
    ro = view.view()
    ro.setflags(write=False)
    self.storage = ro
    self.borrowed = lender
    if self.lenders is None:
      self.lenders = []
    # Watch the lender and, if it borrows too, the buffers whose memory it views: whichever of them is
    # written later (even after the lender itself has moved on to other storage) detaches this one.
    # `borrowed` links of buffers that moved on are stale and may even form a cycle: bounded walk.
    owner, hops = lender, 0
    while owner is not None and owner is not self and hops < 8:
      # (`in` compares by identity here: buffers (eq=False) and the caller's-array lender have no __eq__)
      if owner not in self.lenders:   # else already on its reader list
        self.lenders.append(owner)
        owner.add_reader(weakref.ref(self))
      owner = owner.borrowed
      hops += 1

  def watch(self, value) -> None:
    """A load returned `value` (an object whose `_data` is a zero-copy view of this storage): register it
    as a copy-on-write reader. If this buffer borrows another's storage, the view is that memory: its
    owners watch the value too, so a write to them still detaches it after this buffer stops borrowing
    (next DMA, store or free)."""
    ref = weakref.ref(value)
    self.add_reader(ref)
    if self.borrowed is not None:
      for owner in self.owners():
        owner.add_reader(ref)

  def stored(self, data, value) -> None:
    """After a store of `data` (from `value`, or None when it is not a language array): if the buffer
    adopted the array (memory.write), the value now reads it through a read-only view and is detached
    (copied) before the next write, like a load (copy on write)."""
    if type(data) is not np.ndarray or (self._storage if self.pending is None else self.storage) is not data:
      return
    ro = data.view()
    ro.setflags(write=False)
    self._ro = ro   # the buffer's read-only view of its new storage, for later loads
    if value is not None:
      value._data = ro
      self.add_reader(weakref.ref(value))

  def alias(self, **changes) -> "Buffer":
    """A buffer sharing this one's storage (bitcast/reshape views, `changes` = the new storage, shape,
    dtype). Both sides then copy on load, since a write through one is invisible to the other's
    copy-on-write bookkeeping."""
    self.detach_readers()
    self.aliased = True
    return dataclasses.replace(self, readers=None, aliased=True, **changes)

  def add_reader(self, ref) -> None:
    """Register a weakref to a value viewing this storage (copy on write); dead entries are dropped
    when the list passes its cap, which is then twice the live entries (at least 64): a buffer read
    every grid step keeps a short list, and one with many live readers (an HBM operand whose blocks
    a deferred sum's cached panels keep alive: ~70 in a 2048^3 matmul with 256 blocks) is scanned
    once per doubling, not on every load."""
    readers = self.readers
    if readers is None:
      self.readers = [ref]
      return
    if len(readers) > self._readers_cap:
      readers = self.readers = [r for r in readers if r() is not None]
      self._readers_cap = max(64, 2 * len(readers))
    readers.append(ref)

  def owners(self, among=None) -> list:
    """The buffers whose memory this buffer's (borrowed) storage views right now: those of its lenders
    (or of `among`) whose storage may share memory with it (the one home of that test; a buffer with
    no storage shares none). For its lenders the answer is kept (`_owners`) while this buffer's
    storage, its lender list and every lender's storage are the same objects (a borrowed block is
    loaded once or more per grid step; the memory test costs a NumPy dispatch per lender)."""
    storage = self._storage
    if among is None:
      among = self.lenders
      if self.borrowed is None or storage is None or not among:
        return []
      memo = self._owners
      if (memo is not None and memo[0] is storage and memo[1] is among and len(memo[2]) == len(among)
          and all(map(is_, map(_STORAGE, among), memo[2]))):
        return memo[3]
      keep = True
    elif storage is None:
      return []
    else:
      keep = False
    found = []   # (a loop, not a comprehension: no Python frame per buffer)
    for b in among:
      lent = b._storage
      if lent is not None and _may_share(lent, storage):
        found.append(b)
    if keep:
      self._owners = (storage, among, tuple(map(_STORAGE, among)), found)
    return found

  @property
  def nbytes(self) -> int:
    return prod(self.shape) * self.dtype.itemsize

  def defer(self, value) -> None:
    """A whole-buffer store of a deferred value: keep it instead of computing it. The old storage is
    not written, so values and buffers viewing it stay valid (like an adopted store)."""
    self.borrowed = None
    self._storage = self._ro = None
    self.pending = value

  def materialize(self) -> None:
    """Compute the pending value into fresh storage (pending blocks: into the storage they belong to)."""
    value = self.pending
    self.pending = None
    if type(value) is PendingBlocks:
      value.compute()
      return
    out = np.empty(self.shape, self.dtype)
    value.compute_into(out)
    self._storage = out
    self._ro = None


# NumPy's bounds test of two arrays' memory without its __array_function__ dispatch (a Python frame per
# call, and palace passes plain ndarrays only); NumPy's own function where the attribute is missing
_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)



def _get_storage(buf):
  if buf.pending is not None:
    buf.materialize()
  return buf._storage


def _set_storage(buf, value):
  buf.pending = buf._ro = buf._owners = None
  buf._storage = value


# A property added after the dataclass is built, so `Buffer(storage, ...)` and
# `dataclasses.replace(buf, storage=...)` keep working while reads can compute a pending value.
Buffer.storage = property(_get_storage, _set_storage, doc="The NumPy storage (computing a pending value).")


# ------------------------------------------------------------------ allocation
# (a bool is held in a 32-bit word on a TPU, whose poison, the int32 minimum, is non-zero: it reads as
# True, as JAX's test_poison_buffers expects of never-written bool scratch)
_SENTINEL = {np.dtype(np.int32): np.iinfo(np.int32).min, np.dtype(np.int16): np.iinfo(np.int16).min,
             np.dtype(np.int8): np.iinfo(np.int8).min, np.dtype(np.bool_): True}
LAZY_FILL_BYTES = 64 * 1024  # VMEM buffers this large start with a pending fill instead of one


def fill_value(dtype):
  """The value never-written memory reads as: NaN for floats, the type's minimum for 8-32 bit ints,
  True for bools."""
  value = _FILL.get(dtype, _FILL)
  if value is _FILL:   # (kept per dtype: str(dtype) costs microseconds, and every allocation asks)
    value = _FILL[dtype] = np.nan if dt.is_float(dtype) else _SENTINEL.get(dtype, 0)
  return value


_FILL: dict = {}


def filled(shape, dtype) -> np.ndarray:
  """A new array holding the uninitialised value (= np.full, without its Python-level wrapper: a
  fresh buffer is made for every allocation)."""
  out = np.empty(shape, dtype)
  out.fill(fill_value(dtype))
  return out


class Fill:
  """The uninitialised contents of a fresh VMEM buffer (NaN / int sentinel) as a pending value: written
  only if something reads the buffer before a whole-buffer store or DMA replaces it."""
  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value

  def compute_into(self, out) -> None:
    out.fill(self.value)


class PendingBlocks:
  """Pending values DMA'd into blocks of an HBM buffer, computed together when anything needs the
  buffer's numbers (a read of its storage: a DMA out of it, the launch's outputs, a load, a partial
  write): a K-tiled matmul writes back one deferred sum per output block, and computed as a batch
  their GEMMs run whole, spread over the launch's threads (lang/deferred.py `Deferred.compute_all`,
  blas.matmuls), instead of one product at a time, each split over the threads.

  Unlike a whole-buffer pending value (`Buffer.defer`), the buffer keeps its storage (`_storage`): the
  blocks are views of it (the caller's array, under palace.jax XLA's result buffer), written in place
  by `compute`; every other element is already current. Only values whose type offers
  `compute_all(pairs)` and `held_bytes` (the host memory the value keeps alive until computed) are
  kept (structural, like PendingValue), only in HBM buffers that no alias views, at most MAX_BLOCKS
  values and MAX_BYTES held at once (then the kept ones are computed first, as when a value's block
  overlaps a kept one: values are computed in the order their copies ran)."""
  __slots__ = ("blocks", "held", "tiles")
  MAX_BLOCKS = 64
  MAX_BYTES = 256 * 2**20

  def __init__(self):
    self.blocks = []   # (value, destination view)
    self.held = 0
    # while every kept block is a whole tile of one grid over the storage (the pipeline's write-backs
    # of blocks that tile the output): (block shape, starts of the kept tiles); else None
    self.tiles = None

  def add(self, buf: Buffer, value, out: np.ndarray) -> None:
    if len(self.blocks) >= self.MAX_BLOCKS or self.held + value.held_bytes > self.MAX_BYTES \
        or self._overlaps(buf._storage, out):
      buf.materialize()
      buf.pending = self = PendingBlocks()
      self._overlaps(buf._storage, out)   # (the new batch's tiles)
    self.blocks.append((value, out))
    self.held += value.held_bytes

  def _overlaps(self, storage, out: np.ndarray) -> bool:
    """Whether `out` shares memory with a kept block. Tiles of one grid over the storage (windows of
    one shape starting at multiples of it) are disjoint unless they start at the same element: a set
    lookup instead of a memory test per kept block (64 blocks: 2016 tests, 1.7 ms)."""
    start = _tile_start(storage, out)
    tiles = self.tiles
    if start is not None and (tiles is not None or not self.blocks):
      if tiles is None:
        tiles = self.tiles = (out.shape, set())
      if out.shape == tiles[0]:
        if start in tiles[1]:
          return True
        tiles[1].add(start)
        return False
    self.tiles = None
    return any(np.may_share_memory(out, o) and np.shares_memory(out, o) for _, o in self.blocks)

  def compute(self) -> None:
    blocks, self.blocks = self.blocks, []
    start = 0
    for i in range(1, len(blocks) + 1):   # (runs of one value type, in order)
      if i == len(blocks) or type(blocks[i][0]) is not type(blocks[start][0]):
        type(blocks[start][0]).compute_all(blocks[start:i])
        start = i


def _tile_start(storage, out: np.ndarray):
  """The index of `out`'s first element in `storage` when `out` is a window of it (storage C-contiguous,
  the same strides, inside it, not empty) whose start is a multiple of its shape (a tile of the grid of
  blocks of that shape), else None. Windows of a C-contiguous array hold distinct elements at distinct
  indices, so two such tiles of one shape share memory only if they start at the same index."""
  if (storage is None or out.strides != storage.strides or out.ndim == 0 or not out.size
      or not storage.flags.c_contiguous):
    return None
  off = out.__array_interface__["data"][0] - storage.__array_interface__["data"][0]
  if off < 0:
    return None
  start = []
  for stride, size, dim in zip(storage.strides, out.shape, storage.shape):
    at, off = divmod(off, stride)
    if at % size or at + size > dim:
      return None
    start.append(at)
  return None if off else tuple(start)


def settle(bufs) -> None:
  """Compute the pending blocks of `bufs` now (a launch's outputs, at its end: on the launch's BLAS
  threads and before its host caches are released)."""
  for buf in bufs:
    if type(buf.pending) is PendingBlocks:
      buf.materialize()


def new_semaphore(mem_type, name: str, core) -> Buffer:
  """A fresh semaphore array of `mem_type` (a SemaphoreRefType) on `core`, all zero."""
  return new_buffer(mem_type.shape, None, MemorySpace.SEMAPHORE, name, core, core.chip_index,
                    core.timing_only, False, sem_kind=mem_type.kind)


def new_buffer(shape, dtype, space, name, core, chip: int, timing_only: bool, lazy_fill: bool,
               sem_kind=None) -> Buffer:
  """A fresh allocation: semaphores start at zero; a timing-only machine keeps no storage for vector
  memories (only SMEM data moves there); otherwise the uninitialised fill, left pending for large VMEM
  buffers when `lazy_fill` (no checker follows storage identity)."""
  if sem_kind is not None:
    return Buffer(np.zeros(shape, np.int32), shape, np.dtype(np.int32), MemorySpace.SEMAPHORE, name, core,
                  chip, sem_kind=sem_kind)
  if space is _VMEM and lazy_fill and not timing_only and prod(shape) * dtype.itemsize >= LAZY_FILL_BYTES:
    buf = Buffer(None, shape, dtype, space, name, core, chip)
    buf.defer(Fill(fill_value(dtype)))
    return buf
  if timing_only and space is not _SMEM:
    return Buffer(None, shape, dtype, space, name, core, chip)
  return Buffer(filled(shape, dtype), shape, dtype, space, name, core, chip)


def renew(bufs) -> None:
  """Buffers kept from one replayed launch for the next (launch/run.py `_Warm`, one core, no checkers):
  each as `new_buffer` makes it, never written. A buffer's own storage that nothing else views (no
  live reader, not borrowed or aliased) is filled in place; otherwise it gets new storage (or the
  pending fill), so values and buffers still viewing the old storage stay valid without a copy.
  Semaphores are left as they are: a replayed launch never changes one (sim/replay.py)."""
  for b in bufs:
    if b is None or b.sem_kind is not None:   # (a scope's list may hold None for no allocation)
      continue
    storage = b._storage
    own = (b.borrowed is None and b.pending is None and not b.aliased and storage is not None
           and storage.flags.writeable and (not b.readers or not any(r() is not None for r in b.readers)))
    if b.memory_space is _VMEM and b.nbytes >= LAZY_FILL_BYTES:
      b.rebind(None)
      b.defer(Fill(fill_value(b.dtype)))
    elif own:
      b.rebind(storage)
      storage.fill(fill_value(b.dtype))
    else:
      b.rebind(filled(b.shape, b.dtype))


def hbm_output(shape, dtype, name: str, timing_only: bool, lazy: bool = False, into=None,
               storage=None) -> Buffer:
  """An output operand in HBM, holding the uninitialised fill. `lazy`: np.empty storage (the launch fills
  the blocks no write-back reached afterwards). On a timing-only machine no data reaches HBM, so the
  output is shape and dtype only: its storage is a read-only broadcast of the fill value, which takes
  no host memory whatever the shape. `into`: a kept launch's buffer for this output (launch/run.py
  `_Warm`), made the same again with new storage. `storage`: the caller's array of this shape and
  dtype to hold the output (palace.jax: XLA's result buffer), used instead of a new one (filled
  unless `lazy`; ignored on a timing-only machine)."""
  dtype = np.dtype(dtype)
  if timing_only:
    storage = np.broadcast_to(np.asarray(fill_value(dtype), dtype), shape)
  elif storage is not None:
    if not lazy:
      storage.fill(fill_value(dtype))
  elif lazy:
    storage = np.empty(shape, dtype)
  else:
    storage = filled(shape, dtype)
  if into is None:
    return Buffer(storage, tuple(shape), dtype, MemorySpace.ANY, name)
  into.rebind(storage)
  return into


def alias_input(out: Buffer, src: np.ndarray, timing_only: bool, own: bool = False) -> None:
  """`input_output_aliases`: the output starts as the input's values (a private copy; on a timing-only
  machine a read-only view, since nothing writes HBM there). `own`: the output's storage is already
  its own array (the caller's, `hbm_output(storage=...)`): the values are copied into it."""
  if timing_only:
    view = src.view()
    view.setflags(write=False)
    out.storage = view
  elif own:
    np.copyto(out.storage, src)
  else:
    out.storage = src.copy()


# ------------------------------------------------------------------ capacity
def scoped_vmem_limit(chip, vmem_limit_bytes) -> int:
  """VMEM a pallas_call's pipelined blocks may use: CompilerParams(vmem_limit_bytes) or the chip's
  default scoped limit. A limit above the chip's VMEM is clamped to it, as the TPU compiler does
  (measured on a v5e, 2026-12-05: vmem_limit_bytes of 130 and 256 MiB compile; 130 MiB of scratch under
  a 128 MiB limit fails with 'Allocation (size=136314880) would exceed memory (size=134217728)').
  Mosaic's internal scratch is not taken from it: the chip's refusal of 20 MiB of blocks under the
  16 MiB default reads 'Scoped allocation with size 20.00M and limit 16.00M' (the blocks alone against
  the whole limit), and JAX's test_input_output_aliasing_with_scalar_prefetch runs exactly 16 MiB of
  blocks under that default; the internal scratch counts against the whole VMEM (`of_core`)."""
  limit = vmem_limit_bytes or chip.default_scoped_vmem_bytes
  return min(limit, chip.vmem_bytes)


class Allocator:
  """One core's memories: capacity checks and accounting of VMEM, shared VMEM and SMEM, and the live
  allocations (for the breakdown in over-capacity errors).

  On a TensorCore (`vmem_total_limit` set) every VMEM allocation, scratch operands, `run_scoped`
  buffers and emit_pipeline's block buffers alike, counts against the chip's whole VMEM less Mosaic's
  internal scratch, not against the scoped limit: that limit bounds a pallas_call's own pipelined
  block buffers only, which `launch/run._check_vmem` checks for the whole launch before it runs.
  Measured on a v5e (benchmarks/hw/data/v5e-limits-2026-12-05*.jsonl), under the 16 MiB default
  limit: 20, 100 and 127 MiB of scratch and 20 and 100 MiB of `run_scoped` VMEM compile, 20 MiB of
  blocks does not ('Scoped allocation with size 20.00M and limit 16.00M exceeded'); emit_pipeline's
  buffers are JAX's `run_scoped` allocations (inferred, not measured). Without `vmem_total_limit`
  (a SparseCore subcore's TileSpmem) `vmem_limit` is the capacity."""

  @classmethod
  def of_core(cls, core, vmem_limit_bytes) -> "Allocator":
    """A core's memories: its chip's VMEM and SMEM, scoped VMEM as CompilerParams(vmem_limit_bytes)
    asks (`scoped_vmem_limit`); SMEM less what the compiler reserves (`ChipSpec.smem_reserved_bytes`)."""
    chip = core.chip
    alloc = cls(core, scoped_vmem_limit(chip, vmem_limit_bytes), chip.vmem_bytes,
                chip.smem_bytes - chip.smem_reserved_bytes)
    alloc.vmem_total_limit = chip.vmem_bytes - chip.internal_scratch_bytes
    return alloc

  def __init__(self, core, vmem_limit: int, vmem_shared_limit: int, smem_limit: int):
    self.core = core
    self.vmem_limit = vmem_limit
    self.vmem_shared_limit = vmem_shared_limit
    self.smem_limit = smem_limit
    self.vmem_total_limit = None   # a TensorCore's whole VMEM for every allocation (None: vmem_limit)
    self.vmem_used = self.vmem_peak = self.smem_used = 0
    self.live = {}            # id(buf) -> (name, bytes, space)

  def allocate(self, mem_type, name: str) -> Buffer:
    core = self.core
    if not isinstance(mem_type, MemoryRef):
      raise UsageError(f"Cannot allocate {name}: {mem_type!r} is not a memory type. Fix: use "
                       f"pltpu.VMEM(shape, dtype), pltpu.SMEM(...) or pltpu.SemaphoreType.")
    space = mem_type.memory_space
    nbytes = mem_type.nbytes
    tag = space
    if space == MemorySpace.VMEM_SHARED:
      if nbytes > self.vmem_shared_limit:
        raise ResourceError(
            f"VMEM_SHARED over capacity for {name} {core.where()}: {fmt_bytes(nbytes)} requested but "
            f"the shared VMEM holds {fmt_bytes(self.vmem_shared_limit)}. Fix: use smaller buffers.")
    elif space in (MemorySpace.VMEM, MemorySpace.ANY):
      space = tag = MemorySpace.VMEM
      total = self.vmem_total_limit
      if self.vmem_used + nbytes > (self.vmem_limit if total is None else total):
        raise ResourceError(self._vmem_message(name, nbytes, whole=total is not None))
      self.vmem_used += nbytes
      if self.vmem_used > self.vmem_peak:
        self.vmem_peak = self.vmem_used
    elif space == MemorySpace.SMEM:
      if self.smem_used + nbytes > self.smem_limit:
        reserved = core.chip.smem_reserved_bytes
        raise ResourceError(
            f"SMEM over capacity for {name} on chip {core.chip_index} core {core.core_id} in kernel "
            f"'{core.kernel_name}': {fmt_bytes(self.smem_used)} in use + {fmt_bytes(nbytes)} requested "
            f"> {fmt_bytes(self.smem_limit)} usable on {core.chip.name} ({fmt_bytes(core.chip.smem_bytes)} "
            f"SMEM{f' less {reserved} B the compiler reserves' if reserved else ''}"
            f"{_SMEM_EVIDENCE if reserved else ''}). Fix: keep SMEM for scalars and small index tables; "
            f"move arrays to VMEM.")
      self.smem_used += nbytes
    # (large VMEM buffers: the uninitialised fill is written only if read before being overwritten)
    buf = new_buffer(mem_type.shape, mem_type.dtype, space, name, core, core.chip_index, core.timing_only,
                     core.deferred_values)
    self.live[id(buf)] = (name, nbytes, tag)
    return buf

  def release(self, buf: Buffer) -> bool:
    """Give `buf`'s capacity back; False if it was not allocated here (semaphores, shared buffers)."""
    info = self.live.pop(id(buf), None)
    if info is None:
      return False
    _, nbytes, space = info
    if space == MemorySpace.VMEM:   # (VMEM_SHARED is checked per allocation, never added up)
      self.vmem_used -= nbytes
    elif space == MemorySpace.SMEM:
      self.smem_used -= nbytes
    return True

  def _vmem_message(self, name, nbytes, whole: bool = False) -> str:
    core = self.core
    rows = "; ".join(f"{n} {fmt_bytes(b)}" for n, b, s in self.live.values()
                     if s in (MemorySpace.VMEM, MemorySpace.VMEM_SHARED))
    if whole:
      chip = core.chip
      return (f"VMEM over capacity on chip {core.chip_index} core {core.core_id} in kernel "
              f"'{core.kernel_name}': {name} needs {fmt_bytes(nbytes)} but {fmt_bytes(self.vmem_used)} of "
              f"the {fmt_bytes(self.vmem_total_limit)} of VMEM on {chip.name} ({fmt_bytes(chip.vmem_bytes)} "
              f"less {fmt_bytes(chip.internal_scratch_bytes)} Mosaic internal scratch) is in use "
              f"({rows or 'nothing else'}); scratch and run_scoped buffers count against the whole VMEM, "
              f"not the scoped limit. Fix: reduce scratch, run_scoped or block sizes; no vmem_limit_bytes "
              f"raises the chip's VMEM.")
    return (f"VMEM over capacity on chip {core.chip_index} core {core.core_id} in kernel "
            f"'{core.kernel_name}': {name} needs {fmt_bytes(nbytes)} but {fmt_bytes(self.vmem_used)} of "
            f"the {fmt_bytes(self.vmem_limit)} of this subcore's VMEM (TileSpmem) is in use "
            f"({rows or 'nothing else'}). Fix: reduce buffer sizes or counts.")


# the evidence for ChipSpec.smem_reserved_bytes, quoted in SMEM over-capacity errors (hw.py has the rest)
_SMEM_EVIDENCE = ("; the compiler's own use, measured on a TPU v5e: up to about 1950 B, e.g. SMEM scratch "
                  "of 1 MiB - 512 B: 'Ran out of memory in memory space smem. Used 1.00M of 1.00M smem. "
                  "Exceeded smem capacity by 1.4K'")


# ------------------------------------------------------------------ loads and stores
def read_scalar(buf: Buffer, index):
  """The data of a scalar (or SMEM) load: a copy, or None without storage."""
  storage = buf.storage
  if storage is None:
    return None
  data = storage[index]
  if not isinstance(data, np.ndarray):
    return np.asarray(data)
  return data if data.shape == () else data.copy()


def read(buf: Buffer, index, timing_only: bool):
  """The data of a vector load of `buf[index]`: a read-only view of the storage (the caller registers
  the value as a copy-on-write reader), a copy for aliased buffers, the pending value itself when read
  whole, or None (timing only / no storage)."""
  pending = buf.pending
  if pending is not None:
    if index == () and type(pending) is not Fill and type(pending) is not PendingBlocks:
      return pending   # a pending value read whole stays pending
    storage = buf.storage
  else:
    storage = buf._storage
  if timing_only or storage is None:
    return None
  if buf.aliased:
    return np.array(storage[index], copy=True)
  ro = buf._ro   # zero-copy: writers detach the view first (Buffer.detach_readers)
  if ro is None:
    ro = buf._ro = storage.view()
    ro.setflags(write=False)
  view = ro[index]   # read-only, as a view of a read-only view
  if view.base is None:   # (an index that copies)
    view.flags.writeable = False
  return view


def write(buf: Buffer, index, data, adopt: bool) -> None:
  """A store of `data` (array, PendingValue or None) into `buf[index]`. `adopt`: a whole-buffer store
  of a fresh, writable, contiguous array of the buffer's dtype may keep that array as the new storage
  (no checker follows storage identity)."""
  if index == () and data is not None and type(data) is not np.ndarray and hasattr(data, "compute_into"):
    buf.defer(data)  # a PendingValue; the language side checked: whole VMEM buffer, same shape and dtype
    return
  if buf.pending is not None:
    if index == ():
      buf.storage = np.empty(buf.shape, buf.dtype)  # overwritten whole: never compute the old value
    storage = buf.storage
  else:
    storage = buf._storage
  if storage is None or data is None:
    return
  if (adopt and index == () and data.base is None and not buf.aliased and type(data) is np.ndarray
      and data.dtype == storage.dtype and data.shape == storage.shape
      and (flags := data.flags).writeable and flags.c_contiguous):
    # adopt the array instead of copying it. The old memory is not written, so views of it (loads, a
    # lender's storage) stay valid; the stored value is made a copy-on-write reader by Ref.__setitem__.
    buf.borrowed = None
    buf.storage = data
    return
  if buf.readers or buf.borrowed is not None:
    buf.detach_readers()
    storage = buf.storage
  storage[index] = data


# ------------------------------------------------------------------ DMA data movement
class _Held:
  """The source data of a copy that lands later (`snapshot`): a copy-on-write reader of the source."""
  __slots__ = ("_data", "__weakref__")


def snapshot(req):
  """The data of `req`'s source window as it is now, for a copy whose data lands later (sim/dma.py: a
  copy into another core's or chip's memory lands at its completion); its `_data` is None when the
  source has no storage (nothing moves). A read-only view registered as a copy-on-write reader of the
  source: nothing is copied unless the source is written before `copy_held` moves it."""
  src_buf = req.src_buf
  if src_buf.pending is not None:
    src_buf.materialize()
  held = _Held()
  held._data = data = read(src_buf, req.src_selection, False)
  if data is not None and data.base is not None:
    src_buf.watch(held)
  return held


def copy_held(req, held) -> None:
  """Move `req`'s data as `snapshot` held it into its destination (the rules of `copy`)."""
  data = held._data
  if data is None:
    return
  later = copy_module.copy(req)
  later.src_buf = Buffer(data, data.shape, data.dtype, req.src_buf.memory_space, req.src_buf.name)
  later.src_index, later.src_indices = (), None
  copy(later)


def _add(cur, data):
  if cur.dtype.kind == "f" and cur.dtype.itemsize >= 4 or cur.dtype.kind in "iu":
    return cur + data.astype(cur.dtype, copy=False)
  return (cur.astype(np.float32) + data.astype(np.float32)).astype(cur.dtype)  # bf16 / fp8


BORROW_MIN_BYTES = 64 * 1024   # below this a plain copy is cheaper than the borrowing bookkeeping


def copy(req, borrow: bool = False) -> None:
  """Perform the copy on the NumPy storages (called once per DMA, at the policy's chosen moment).

  Indexed copies (SparseCore): `src_indices` gathers rows, `dst_indices` scatters them (np.add.at for
  add=True, so repeated indices accumulate); `mask` drops ignored index entries on the dense side.
  `borrow`: a plain copy of a whole VMEM buffer may view the source instead (Buffer.borrow). A pending
  value copied whole goes straight to its destination (PendingValue.compute_into)."""
  dst_buf = req.dst_buf
  src_buf = req.src_buf
  plain = not req.add and req.src_indices is None and req.dst_indices is None and req.mask is None
  blocks = dst_buf.pending if type(dst_buf.pending) is PendingBlocks else None
  if dst_buf.pending is not None and plain and req.dst_index == ():
    if blocks is not None:   # overwritten whole: drop the blocks, keep the storage they were part of
      dst_buf.pending = blocks = None
    else:
      dst_buf.storage = np.empty(dst_buf.shape, dst_buf.dtype)  # overwritten whole: drop the old value
  pending = src_buf.pending
  if (pending is not None and plain and req.src_index == () and dst_buf is not src_buf
      and type(pending) is not PendingBlocks):
    dst = dst_buf.storage if blocks is None else dst_buf._storage
    if dst is None:
      return
    if dst_buf.readers or dst_buf.borrowed is not None:
      dst_buf.detach_readers()
      dst = dst_buf._storage
    out = dst[req.dst_index]
    if out.shape == src_buf.shape and out.dtype == src_buf.dtype:
      if ((dst_buf.memory_space is _ANY or dst_buf.memory_space is _HBM) and not dst_buf.aliased
          and getattr(pending, "compute_all", None) is not None
          and pending.held_bytes <= PendingBlocks.MAX_BYTES):   # into HBM: kept for a batch
        if blocks is None:
          blocks = dst_buf.pending = PendingBlocks()
        blocks.add(dst_buf, pending, out)
        return
      if blocks is not None:
        dst_buf.materialize()
      pending.compute_into(out)
      return
  # raw storages when nothing is pending (the common case; `storage` would compute a pending value)
  src = src_buf._storage if src_buf.pending is None else src_buf.storage
  dst = dst_buf._storage if dst_buf.pending is None else dst_buf.storage
  if src is None or dst is None:
    return
  if (plain and borrow and req.dst_index == () and dst.nbytes >= BORROW_MIN_BYTES and
      not dst_buf.aliased and dst_buf.memory_space is MemorySpace.VMEM and not src_buf.aliased):
    view = src[req.src_index]
    if view.shape == dst.shape and view.dtype == dst.dtype:
      dst_buf.borrowed = None  # the old storage is not written: its readers keep valid views
      dst_buf.borrow(src_buf, view)
      return
  readers = dst_buf.readers
  if dst_buf.borrowed is not None or (readers and (len(readers) > 1 or readers[0]() is not None)):
    dst_buf.detach_readers()
    dst = dst_buf._storage  # unborrowing replaced it with a private copy
  elif readers:   # = detach_readers() when the one value that read the buffer is gone
    readers.clear()
  if plain:
    dst[req.dst_index] = src[req.src_index]
    return
  data = src[req.src_selection]
  if req.dst_indices is not None:
    if req.mask is not None:
      data = data[req.mask]
    if req.add:
      np.add.at(dst, req.dst_indices, data.astype(dst.dtype, copy=False))
    else:
      dst[req.dst_indices] = data
    return
  if req.mask is not None:
    view = dst[req.dst_index]
    view[req.mask] = _add(view[req.mask], data) if req.add else data
    return
  dst[req.dst_index] = _add(dst[req.dst_index], data) if req.add else data
