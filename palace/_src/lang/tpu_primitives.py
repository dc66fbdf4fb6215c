"""TPU primitives (L4a): DMA descriptors, sync/async copies, masked loads/stores, roll, bitcast, PRNG."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.core import SemaphoreType
from palace._src.errors import ShapeError, SyncError, UnsupportedError, UsageError
from palace._src.executor import DmaRequest, OpClass
from palace._src.lang import numpy_ops as jnp
from palace._src.lang.numpy_base import _out
from palace._src.lang import context, hbm_tiles, ref_maps
from palace._src.lang.array import concrete_int, concrete_value, ready_of
from palace._src.lang.primitives import (axis_index, axis_size, resolve_device_id, run_scoped,
                                         sem_target, semaphore_signal, semaphore_wait,
                                         typed_device_id)
from palace._src.lang.indexed import IndexedRef, check_indexed_copy
from palace._src.lang.packed_refs import PackedRef
from palace._src.lang.refs import MappedRef, Ref
from palace._src.lang.numpy_indexing import _where
from palace._src.util import prod, tree_flatten, user_frame_summary


def _check_ref(x, api, arg):
  if isinstance(x, PackedRef):
    raise x._refuse(f"A DMA ({api} {arg})")
  if not isinstance(x, (Ref, IndexedRef)):
    raise UsageError(f"{api} {arg} must be a ref or a ref view `.at[...]` ({user_frame_summary()}); got "
                     f"{validate.describe(x)}. Fix: pass a kernel ref (an argument of the kernel body, a "
                     f"scratch or pl.run_scoped buffer, or a `.at[...]` view of one); arrays reach a "
                     f"kernel as refs through its operands (pl.ANY specs keep them in HBM).")


_current_ex = executor.maybe_current   # (the context variable's getter: no Python frame)


class PreparedCopy(DmaRequest):
  """A DMA validated and resolved once (views, semaphore slots, device id, byte count): the executor's
  request itself, with the language's start/wait. They only hand this request to the current core, so
  they are cheap and one prepared copy can be issued again and again (the pipeline re-issues the copy
  of a revisited block). Made by `AsyncCopyDescriptor.prepare()` and `prepare_window_copy`. It keeps
  no reference to the core (traces keep requests; they must not keep machines alive). A loop that
  issues many copies on one core (the pipeline's step loop) may bind that core's `dma_start` /
  `dma_wait` once and hand the request to them itself: exactly what `start()` / `wait()` do."""
  __slots__ = ()

  def start(self) -> None:
    (_current_ex() or executor.current("a DMA start")).dma_start(self)

  def wait(self) -> None:
    """Until the destination semaphore got this copy's bytes (the data landed)."""
    (_current_ex() or executor.current("a DMA wait")).dma_wait(self, "recv")

  def wait_send(self) -> None:
    """Until the source semaphore got this copy's bytes (the data left; remote copies)."""
    (_current_ex() or executor.current("a DMA wait")).dma_wait(self, "send")


def prepare_window_copy(src_buf, src_index, dst_buf, dst_index, shape, sem, *, nbytes: int, site,
                        labels, like=None) -> PreparedCopy:
  """A local copy between two windows given in resolved form: (buffer, NumPy index) each, with the
  destination semaphore as a (buffer, index) slot from `sem_target`. For callers that already proved
  what `make_async_copy` checks (equal shapes and dtypes, in-bounds windows), such as the pipeline,
  whose block slots are allocated with the block's shape and dtype. `labels` is a (source, destination)
  pair of ref-like objects with `origin()`, read only when a message names the copy. `like`: an earlier
  copy between the same memory spaces with the same semaphore (the pipeline's previous copy into the
  same slot), whose executor cache the new copy shares (DmaRequest.fast)."""
  req = PreparedCopy(src_buf, src_index, dst_buf, dst_index, shape, sem[0], sem[1], None, (), False, None,
                     None, site, labels, nbytes)
  if like is not None:
    req.fast = like.fast
  return req


class AsyncCopyDescriptor:
  """A DMA between two ref views. `.start()` issues it; `.wait()` blocks until its bytes arrived."""

  def __init__(self, src_ref, dst_ref, sem, src_sem=None, device_id=None, core_index=None,
               is_remote=False, site=None, api="pltpu.make_async_copy"):
    _check_ref(src_ref, api, "src_ref")
    _check_ref(dst_ref, api, "dst_ref")
    if src_ref.shape != dst_ref.shape:
      raise ShapeError(f"DMA shapes differ: {src_ref.origin()} has shape {src_ref.shape} but "
                       f"{dst_ref.origin()} has shape {dst_ref.shape}; a copy needs identical shapes. Fix: "
                       f"slice both with .at[...] to the same window shape.")
    if src_ref.dtype != dst_ref.dtype:
      raise ShapeError(f"DMA dtypes differ: {src_ref.origin()} is {src_ref.dtype} but "
                       f"{dst_ref.origin()} is {dst_ref.dtype}. Fix: copy between refs of one dtype "
                       f"(cast after the copy, or bitcast a ref of the same width).")
    self.src_ref, self.dst_ref = src_ref, dst_ref
    self.sem = sem
    self.src_sem = src_sem
    self.device_id = device_id
    self.core_index = core_index
    self.is_remote = is_remote
    self._prepared = None  # the PreparedCopy of the last .start()
    self._site = site  # None: the user's line is captured at .start()
    self._unused = None  # the executor that tracks this descriptor until it is started or waited

  def _track_unused(self):
    """make_async_copy descriptors must be started or waited (checked at kernel end, with this site)."""
    ex = executor.maybe_current()
    if ex is not None:
      ex.unused_dmas[id(self)] = (ex.site(), self, self)   # (str(self) names it, only if reported)
      self._unused = ex
    return self

  def __str__(self):
    return f"{self.src_ref.origin()} -> {self.dst_ref.origin()}"

  def _used(self):
    if self._unused is not None:
      self._unused.unused_dmas.pop(id(self), None)
      self._unused = None

  def prepare(self, ex=None, *, add: bool = False) -> PreparedCopy:
    """Resolve this copy once for the current core: semaphore slots, the remote device, indexed rows
    (SparseCore gathers/scatters) and the byte count. The result starts and waits without re-checking."""
    ex = ex or executor.current("AsyncCopyDescriptor.prepare()")
    self._used()
    sem_buf = sem_idx = None
    if self.sem is not None:
      sem_buf, sem_idx = sem_target(self.sem, "DMA semaphore")
    ssb = ssi = None
    if self.src_sem is not None:
      ssb, ssi = sem_target(self.src_sem, "DMA source semaphore")
    dev = resolve_device_id(ex, self.device_id) if self.device_id is not None else None
    src, dst = self.src_ref, self.dst_ref
    if getattr(src, "_mapped", False) or getattr(dst, "_mapped", False):
      sides = _mapped_sides(src, dst, dev is not None or self.core_index is not None)
    else:
      sides = (src.buf, None if isinstance(src, IndexedRef) else src._np_index, dst.buf,
               None if isinstance(dst, IndexedRef) else dst._np_index)
    shape = src.shape
    if isinstance(src, Ref) and isinstance(dst, Ref) and (hbm_tiles.beyond(src) or hbm_tiles.beyond(dst)):
      # a window into an HBM array's tile padding: only the elements inside the array move (the DMA
      # still moves, and is timed for, the whole window)
      src_index, dst_index, shape = hbm_tiles.clipped(src, dst)
      sides = (src.buf, src_index, dst.buf, dst_index)
    req = PreparedCopy(*sides, shape, sem_buf, sem_idx, ssb, ssi, add, dev, self.core_index,
                       self._site or ex.site(), (src, dst), src.nbytes)
    if isinstance(src, IndexedRef) or isinstance(dst, IndexedRef):
      _indexed_request(ex, req, src, dst)
    return req

  def start(self, priority: int = 0, *, add: bool = False):
    """Issue the copy. `priority` is JAX's DMA queue priority: 0 (the default) or, on a local copy, 1
    (`_check_priority`); the copy moves the same data and is timed alike on either queue (docs/jax.md,
    "DMA priority"), the queue kept on the request (`DmaRequest.priority`)."""
    ex = executor.current("AsyncCopyDescriptor.start()")
    if priority != 0 or type(priority) is not int:
      priority = _check_priority(priority, self.is_remote)
    if self.sem is None:
      raise UsageError(f"This DMA has no semaphore ({user_frame_summary()}). Fix: pass one to "
                       f"make_async_copy, or use pltpu.sync_copy.")
    self._prepared = self.prepare(ex, add=add)   # (which marks the descriptor used)
    if priority:
      self._prepared.priority = priority
    self._prepared.start()
    return self

  def _for_wait(self, ex) -> PreparedCopy:
    self._used()
    return self._prepared if self._prepared is not None else self.prepare(ex)

  def wait(self):
    ex = executor.current("AsyncCopyDescriptor.wait()")
    p = self._prepared if self._unused is None and self._prepared is not None else self._for_wait(ex)
    if self.src_sem is not None and self.is_remote:
      p.wait_send()
    p.wait()

  def wait_recv(self):
    self._for_wait(executor.current("AsyncCopyDescriptor.wait_recv()")).wait()

  wait_write = wait_recv

  def wait_send(self):
    ex = executor.current("AsyncCopyDescriptor.wait_send()")
    if self.src_sem is None:
      raise UsageError(f"wait_send() needs a send semaphore ({user_frame_summary()}). Fix: make the copy "
                       f"with make_async_remote_copy, or pass src_sem=... to make_async_copy.")
    self._for_wait(ex).wait_send()

  wait_read = wait_send


def _mapped_sides(src, dst, remote: bool) -> tuple:
  """(src buffer, index, dst buffer, index) of a DMA with a MappedRef side (a width-changing bitcast
  or a reshape of a strided view): when one side's elements are wider than its grain, both sides are
  moved as units of the narrower grain, so the copy is the same bytes in the same order."""
  for side, other in ((src, dst), (dst, src)):
    if isinstance(other, IndexedRef):
      raise UnsupportedError(f"A gather/scatter DMA between {src.origin()} and {dst.origin()} is not "
                             f"supported in palace yet: {side.origin()} is a bitcast or reshape view. Fix: "
                             f"copy through a plain VMEM buffer.")
  if remote and getattr(dst, "_mapped", False):
    raise UnsupportedError(f"A remote DMA into {dst.origin()} is not supported in palace yet: it is a "
                           f"bitcast or reshape view. Fix: copy into a plain ref on the other device and "
                           f"bitcast there.")
  src_m, dst_m = MappedRef.of(src), MappedRef.of(dst)
  if src_m.units() == 1 and dst_m.units() == 1:
    return src.buf, src._np_index, dst.buf, dst._np_index
  unit = min(src_m._unit, dst_m._unit)
  return (src_m.unit_buffer(unit), src_m.unit_index(unit), dst_m.unit_buffer(unit),
          dst_m.unit_index(unit))


def _indexed_request(ex, req, src, dst) -> None:
  """Resolve the rows of an indexed (gather/scatter) DMA when it is issued (SparseCore)."""
  check_indexed_copy(src.buf.memory_space, dst.buf.memory_space, isinstance(src, IndexedRef),
                     isinstance(dst, IndexedRef), src.origin(), dst.origin(), user_frame_summary())
  side = src if isinstance(src, IndexedRef) else dst
  rows, mask = side.rows(ex)
  fancy = side.fancy_index(rows, mask)
  if side is src:
    req.src_indices = fancy
    req.src_index = ()
  else:
    req.dst_indices = fancy
    req.dst_index = ()
  req.mask = mask
  used = int(mask.sum()) if mask is not None else side.n
  row_bytes = side.nbytes // max(side.n, 1)
  granule = ex.dma_granule_bytes or 1
  req.nbytes = used * (-(-row_bytes // granule) * granule)


def _check_priority(priority, remote: bool) -> int:
  """A DMA priority as Mosaic compiles it: JAX requires it non-negative, Mosaic takes 0 or 1 on a
  local copy and 0 on a remote one (jaxlib/mosaic tpu_ops.cc: 'only support priority 0 or 1',
  'non-zero priority is not supported for remote DMA'). Returns it (0 or 1)."""
  p = validate.as_int(priority, "DMA start priority", min_value=0,
                      hint="pass priority=0 (the default) or 1 (a local copy's second queue).")
  if p == 0 or (p == 1 and not remote):
    return p
  raise UnsupportedError(
      f"DMA start priority={p} on a {'remote' if remote else 'local'} copy ({user_frame_summary()}): a "
      f"TPU compiles priority 0 or 1 on a local copy and only 0 on a remote one (Mosaic: "
      f"{'non-zero priority is not supported for remote DMA' if remote else 'only support priority 0 or 1'}"
      f"). Fix: drop priority= (or pass 0{'' if remote else ' or 1'}).")


def make_async_copy(src_ref, dst_ref, sem=None, *, src_sem=None) -> AsyncCopyDescriptor:
  return AsyncCopyDescriptor(src_ref, dst_ref, sem, src_sem)._track_unused()


def async_copy(src_ref, dst_ref, sem=None, *, src_sem=None, priority: int = 0,
               add: bool = False) -> AsyncCopyDescriptor:
  return AsyncCopyDescriptor(src_ref, dst_ref, sem, src_sem, api="pltpu.async_copy").start(
      priority, add=add)


def make_async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id, device_id_type=None):
  if device_id is None:
    raise UsageError(f"pltpu.make_async_remote_copy needs device_id ({user_frame_summary()}). Fix: pass "
                     f"device_id, a tuple of mesh coordinates or a dict of the axes that change.")
  device_id = typed_device_id(device_id, device_id_type, "pltpu.make_async_remote_copy")
  return AsyncCopyDescriptor(src_ref, dst_ref, recv_sem, send_sem, device_id=device_id,
                             is_remote=True, api="pltpu.make_async_remote_copy")._track_unused()


def async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id, device_id_type=None):
  return make_async_remote_copy(src_ref, dst_ref, send_sem, recv_sem, device_id,
                                device_id_type).start()


def sync_copy(src_ref, dst_ref, *, add: bool = False) -> None:
  """Copy and wait; pytrees of refs are copied leaf by leaf with one scoped DMA semaphore."""
  srcs, td = tree_flatten(src_ref, is_leaf=lambda x: isinstance(x, Ref))
  dsts, td2 = tree_flatten(dst_ref, is_leaf=lambda x: isinstance(x, Ref))
  if td != td2:
    raise ShapeError(f"pltpu.sync_copy: source and destination trees differ ({td} vs {td2}) "
                     f"({user_frame_summary()}). Fix: pass pytrees of refs of the same structure.")

  def body(sem):
    for s, d in zip(srcs, dsts):
      c = AsyncCopyDescriptor(s, d, sem, api="pltpu.sync_copy")
      c.start(add=add)
      c.wait()

  run_scoped(body, SemaphoreType.DMA)


def get_barrier_semaphore(tag=None) -> Ref:
  """The barrier semaphore of this kernel, selected by CompilerParams(collective_id=...)."""
  sem = context.current("pltpu.get_barrier_semaphore()").barrier_sem
  if sem is None:
    raise UsageError("pltpu.get_barrier_semaphore() needs CompilerParams(collective_id=...) on the "
                     "kernel. Fix: pass compiler_params=pltpu.CompilerParams(collective_id=0) to "
                     "pallas_call / pl.kernel.")
  return sem


# ------------------------------------------------------------------ cores
def core_barrier(sem, *, core_axis_name: str) -> None:
  """All-to-all barrier across the cores of `core_axis_name`: signal every other core, then wait."""
  n = axis_size(core_axis_name)
  me = concrete_value(axis_index(core_axis_name))
  kctx = context.current("pltpu.core_barrier()")
  try:
    for j in range(n):
      if j != me:
        semaphore_signal(sem, 1, device_id={core_axis_name: j})
    kctx.in_barrier = f"pltpu.core_barrier(core_axis_name={core_axis_name!r}) at {user_frame_summary()}"
    semaphore_wait(sem, n - 1)
    kctx.in_barrier = None   # (not on an abort: the launch reads it for the deadlock's message)
  except SyncError as e:
    # a peer that skipped the barrier shows up as its semaphore gone (it finished) or a deadlock:
    # report the core stuck in the barrier, which is what the user wrote
    raise SyncError(
        f"Core {me} of axis {core_axis_name!r} is stuck in pltpu.core_barrier(core_axis_name="
        f"{core_axis_name!r}) at {user_frame_summary()}: not every core of the axis reached the barrier "
        f"({e}). Fix: every core of {core_axis_name!r} must call core_barrier the same number of times; "
        f"do not put it under pl.when or a core-dependent loop.") from None


def run_on_first_core(core_axis_name: str):
  """Decorator that runs the function at once, on core 0 of `core_axis_name` only (like pl.when)."""
  def deco(f):
    if concrete_value(axis_index(core_axis_name)) == 0:
      f()
    return None
  return deco


# ------------------------------------------------------------------ vector helpers
def load(ref, *, mask=None):
  v = ref[...]
  if mask is None:
    return v
  return jnp.where(mask, v, jnp.zeros_like(v))


def store(ref, val, *, mask=None):
  if mask is None:
    ref[...] = val
    return
  ref[...] = jnp.where(mask, val, ref[...])


def roll(x, shift, axis: int, *, stride=None, stride_axis=None):
  """jnp.roll for shift >= 0; with stride, slice i along stride_axis rolls by shift + i * stride."""
  if stride is None:
    return jnp.roll(x, shift, axis=axis)
  s0 = concrete_int(shift, "pltpu.roll shift")
  stride = validate.as_int(stride, "pltpu.roll stride")
  parts = [jnp.roll(_slice_axis(x, stride_axis, i), s0 + i * stride, axis)
           for i in range(x.shape[stride_axis])]
  return jnp.concatenate(parts, axis=stride_axis)


def _slice_axis(x, axis, i):
  return x[tuple(slice(i, i + 1) if a == axis % x.ndim else slice(None) for a in range(x.ndim))]


def bitcast(x, ty, dim: int = -2):
  """Rank-preserving bitcast that rescales dimension `dim`: -1 matches ndarray.view; the default -2
  reinterprets along the second-minor dimension (consecutive rows pack together)."""
  d = dt.canonicalize(ty)
  if isinstance(x, Ref):
    return x.bitcast(d)
  src_bits, dst_bits = ref_maps.storage_bits(x.dtype), ref_maps.storage_bits(d)
  if src_bits == dst_bits:   # same width: the shape stays, whatever the rank (0-d too)
    data = None if x._data is None else np.asarray(x._data).view(d)
    return _out(data, tuple(x.shape), d, ready_of(x), OpClass.FREE, True)
  if not x.ndim:
    raise ShapeError(f"bitcast {x.dtype}->{d} of a scalar{_where()}: a bitcast that changes the element "
                     f"width rescales a dimension, and a scalar has none. Fix: bitcast to a dtype of the "
                     f"same width ({f'{src_bits // 8} bytes' if src_bits % 8 == 0 else f'{src_bits} bits'}"
                     f"), or bitcast an array of at least one "
                     f"dimension. ({user_frame_summary()})")
  if not -x.ndim <= dim < x.ndim or dim % x.ndim < x.ndim - 2 or (dim == -2 and x.ndim < 2):
    raise ShapeError(f"bitcast {x.dtype}->{d} of shape {tuple(x.shape)} along dim {dim}{_where()}: a "
                     f"bitcast that changes the element width scales the second-minor (dim=-2, the "
                     f"default, which a 1-D array lacks) or the minormost dimension (dim=-1), as in JAX. "
                     f"Fix: pass dim=-1 or dim=-2 (reshape a 1-D array to 2-D for dim=-2). "
                     f"({user_frame_summary()})")
  ax = dim % x.ndim
  new = list(x.shape)
  if (new[ax] * src_bits) % dst_bits:
    raise ShapeError(f"bitcast {x.dtype}->{d}: dimension {dim} of size {x.shape[ax]}{_where()} does not "
                     f"convert to a whole number of {d} elements. Fix: make that dimension a multiple of "
                     f"{max(1, dst_bits // src_bits)}, or bitcast along another one. "
                     f"({user_frame_summary()})")
  new[ax] = new[ax] * src_bits // dst_bits
  data = None
  if x._data is not None:
    data = ref_maps.bitcast_data(x._data, x.dtype, d, ax)
  return _out(data, tuple(new), d, ready_of(x), OpClass.FREE, True)


# ------------------------------------------------------------------ PRNG (per-core, deterministic)
class _Prng:
  """Counter-based generator: SplitMix64 over (seed, draw counter). Deterministic per seed."""

  def __init__(self, seed, step=None):
    self.key = np.uint64(seed) & np.uint64(0xFFFFFFFFFFFFFFFF)
    self.counter = 0
    self.step = step   # the executor's grid_reads when seeded (the grid step a detector watched)

  def bits(self, shape):
    n = prod(shape)
    with np.errstate(over="ignore"):
      z = (np.arange(self.counter, self.counter + n, dtype=np.uint64) + np.uint64(1)) * \
          np.uint64(0x9E3779B97F4A7C15) + self.key * np.uint64(0xBF58476D1CE4E5B9)
      z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
      z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
      z = z ^ (z >> np.uint64(31))
    self.counter += n
    return (z >> np.uint64(32)).astype(np.uint32).view(np.int32).reshape(shape)


def prng_seed(*seeds) -> None:
  ex = executor.current("pltpu.prng_seed()")
  s = 0
  for v in seeds:
    s = (s * 1_000_003 + concrete_int(v, "pltpu.prng_seed seed")) & 0xFFFFFFFFFFFFFFFF
  context.current("pltpu.prng_seed()").prng = _Prng(s, ex.grid_reads)
  ex.scalar_op()


def prng_random_bits(shape):
  gen = context.current("pltpu.prng_random_bits()").prng
  if gen is None:
    raise UsageError("pltpu.prng_random_bits() before pltpu.prng_seed(). Fix: seed the generator first "
                     "with pltpu.prng_seed(seed).")
  shape = validate.as_dims(shape, "pltpu.prng_random_bits shape")
  ex = executor.current("pltpu.prng_random_bits()")
  if ex.grid_reads is not None and gen.step is not ex.grid_reads:
    # (draws continuing a generator seeded in an earlier step: the step is not a function of the
    # grid indices a steady-state detector sees)
    ex.grid_reads.append(None)
  data = gen.bits(shape)
  return _out(data, shape, dt.int32, 0, OpClass.CHEAP, True)


def trace_value(label: str, value) -> None:
  """`pltpu.trace_value(label, value)`: a scalar int32 or float32 value recorded on the core's
  timeline at this point (an instant event on the scalar lane of the launch's trace: what xprof shows
  for it on a TPU), for one scalar op."""
  ex = executor.current("pltpu.trace_value()")
  d = np.dtype(getattr(value, "dtype", None) or np.asarray(value).dtype)
  shape = tuple(getattr(value, "shape", np.shape(value)))
  if shape or d not in (dt.int32, dt.float32):
    raise ShapeError(f"pltpu.trace_value({label!r}, ...) of {d}{list(shape)} ({user_frame_summary()}): "
                     f"it records a scalar int32 or float32 value (JAX: 'trace_value requires a scalar "
                     f"value'). Fix: pass a 0-d int32 or float32 value, e.g. jnp.sum(x).astype(jnp.int32).")
  v = concrete_value(value)
  ex.trace_value(str(label), v.item() if hasattr(v, "item") else v)
