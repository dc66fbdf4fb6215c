"""Generic Pallas primitives (L4a): grid queries, control flow, scoped allocation, semaphores.

Each validates its arguments, then asks the current executor. Control flow runs eagerly: palace executes
the kernel body once per grid point, so `pl.when` and `lax.fori_loop` are Python conditionals and loops
over concrete values, charged to the scalar core.
"""
from __future__ import annotations

import functools

import numpy as np

from palace._src import dtypes as dt
from palace._src import hw
from palace._src import executor, validate
from palace._src.core import DeviceIdType, SemaphoreRefType, MemoryRef
from palace._src.errors import MemorySpaceError, PalaceError, TracingError, UnsupportedError, UsageError
from palace._src.lang.array import Array, WeakArray, concrete_int, concrete_value
from palace._src.lang.refs import Ref
from palace._src.util import tree_flatten, tree_unflatten, user_frame_summary

_I32 = dt.int32
_current_ex = executor.maybe_current   # (the context variable's getter: no Python frame)


def _scalar(v: int, ready: int = 0) -> Array:
  return Array(np.int32(v), (), _I32, ready)


# ------------------------------------------------------------------ grid queries
def program_id(axis: int) -> Array:
  """Index of the current grid point along `axis` (an int32 scalar known only at run time)."""
  ex = _current_ex()
  if ex is None:
    ex = executor.current("pl.program_id()")
  if not ex.grid_stack:
    raise UsageError("pl.program_id() has no grid here: pl.kernel bodies have no grid; it is valid in "
                     "pallas_call and emit_pipeline bodies. Fix: use lax.axis_index(name) for mesh "
                     "positions.")
  idx, sizes = ex.grid_stack[-1]
  if type(axis) is not int:
    axis = validate.as_int(axis, "pl.program_id(axis)")
  if not idx:
    raise UsageError(f"pl.program_id({axis}) in a pallas_call without a grid (grid=()) {ex.where()} "
                     f"({user_frame_summary()}). Fix: give the call a grid (grid=(n,)), or drop "
                     f"pl.program_id.")
  if not -len(idx) <= axis < len(idx):
    raise UsageError(f"pl.program_id({axis}): the grid has {len(idx)} axes {tuple(sizes)}. Fix: pass an "
                     f"axis in 0..{len(idx) - 1} (or -{len(idx)}..-1).")
  reads = ex.grid_reads
  if reads is not None:   # (a steady-state detector watches which axes the body reads)
    reads.append(axis % len(idx) if len(ex.grid_stack) == 1 else None)
  return Array(np.int32(idx[axis]), (), _I32, ex.now)


def num_programs(axis: int) -> int:
  ex = _current_ex()
  if ex is None:
    ex = executor.current("pl.num_programs()")
  if not ex.grid_stack:
    raise UsageError("pl.num_programs() has no grid here (pl.kernel bodies have no grid). Fix: use "
                     "lax.axis_size(name) for the size of a mesh axis.")
  idx, sizes = ex.grid_stack[-1]
  if type(axis) is not int:   # (the common case skips the validator call, as in program_id)
    axis = validate.as_int(axis, "pl.num_programs(axis)")
  if not -len(sizes) <= axis < len(sizes):
    raise UsageError(f"pl.num_programs({axis}): the grid has {len(sizes)} axes {tuple(sizes)}. Fix: pass "
                     f"an axis in 0..{len(sizes) - 1} (or -{len(sizes)}..-1).")
  return int(sizes[axis])


def at_grid_point(indices, sizes, f, *args):
  """`f(*args)` run at grid point `indices` of a grid of `sizes` (ints or int32 scalars), which
  pl.program_id / pl.num_programs answer inside it: a step of a pipeline whose loop is kernel code
  (JAX's emit_pipeline as a primitive, in palace.jax), not palace's own pipeline. Axes past the given
  ones, and all sizes when `sizes` is None, are the enclosing grid's (Mosaic puts a pipeline's axes
  before the kernel's)."""
  ex = executor.current("pl.program_id()")
  outer_idx, outer_sizes = ex.grid_stack[-1] if ex.grid_stack else ((), ())
  point = tuple(concrete_int(i, "grid index") for i in indices)
  sizes = outer_sizes if sizes is None else tuple(sizes)
  ex.grid_stack.append(((*point, *outer_idx[len(point):]), (*sizes, *outer_sizes[len(sizes):])))
  try:
    return f(*args)
  finally:
    ex.grid_stack.pop()


# ------------------------------------------------------------------ control flow
def _truth(cond, branch: bool = False) -> bool:
  """The Python bool of a branch condition, charging the scalar op that tests it and, for a `branch`
  (pl.when, lax.cond) on a runtime condition, the branch itself (Executor.branch: a Python bool is
  decided when the kernel is traced). Its common cases (a bool scalar Array, what
  `pl.program_id(0) == 0` gives; a Python bool) are tested first, without a call: `pl.when` runs it
  once or twice on every grid step."""
  ex = _current_ex()
  t = type(cond)
  if ex is not None:
    if branch and t is not bool:
      ex.branch(1)
    else:
      ex.scalar_op()
  if t is Array:
    data = cond._data
    if type(data) is np.bool_:
      return True if data else False
  elif t is bool:
    return cond
  v = concrete_value(cond, "condition")
  if type(v) is np.bool_:
    return bool(v)
  if np.ndim(v) != 0:
    where = f" {ex.where()}" if ex is not None else ""
    raise UsageError(f"A condition must be a scalar; got shape {np.shape(v)}{where}. pl.when / lax.cond / "
                     f"lax.while_loop branch on one bool. Fix: reduce with jnp.any / jnp.all, or select "
                     f"elementwise with jnp.where. ({user_frame_summary()})")
  return bool(v)


def when(condition):
  """Decorator: run the function only when `condition` holds (a Python bool or a runtime scalar)."""

  def deco(f):
    if _truth(condition, True):
      f()

  return deco


def cond(pred, true_fun, false_fun, *operands):
  return true_fun(*operands) if _truth(pred, True) else false_fun(*operands)


def switch(index, branches, *operands):
  ex = _current_ex()
  if ex is not None:
    ex.branch(0)
  i = concrete_int(index, "lax.switch index")
  i = min(max(i, 0), len(branches) - 1)
  return branches[i](*operands)


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
  lo, hi = concrete_int(lower, "fori_loop lower"), concrete_int(upper, "fori_loop upper")
  validate.check_call(body_fun, 2, (), lambda e: (
      f"lax.fori_loop body {getattr(body_fun, '__name__', body_fun)!r} cannot be called as "
      f"body(i, carry) ({e}). Fix: define it with two parameters and return the new carry."))
  ex = executor.maybe_current()
  block = unrolled(unroll, hi - lo, "lax.fori_loop")
  carry = init_val
  for i in range(lo, hi):
    if ex is not None:
      ex.scalar_op()
      carry = body_fun(_scalar(i, ex.now), carry)
    else:
      carry = body_fun(i, carry)
    if i == lo:
      _check_carry(init_val, carry, "lax.fori_loop", body_fun)
    if ex is not None and (i - lo + 1) % block == 0:
      ex.loop_back_edge()
  return carry


def back_edge() -> None:
  """A rolled loop's iteration ends (for front ends that run a loop body themselves): the executor's
  loop_back_edge, if a kernel is running."""
  ex = executor.maybe_current()
  if ex is not None:
    ex.loop_back_edge()


def unrolled(unroll, trips: int, api: str) -> int:
  """Iterations per basic block of a loop unrolled as `unroll` says (JAX: None / False / 1 rolled,
  True or 0 fully unrolled, k > 1 k iterations a block); the compiled loop's back edge follows each
  block (Executor.loop_back_edge)."""
  if unroll is None or unroll is False:
    return 1
  if unroll is True:
    return max(trips, 1)
  if type(unroll) is not int or unroll < 0:   # (the place is named only when refusing: a frame walk)
    ex = executor.maybe_current()
    where = f" {ex.where()}" if ex is not None else ""
    validate.as_int(unroll, f"{api} unroll{where} at {user_frame_summary()}", min_value=0)
  k = int(unroll)
  return k if k else max(trips, 1)


def _carry_type(x):
  """(shape, dtype) of a strongly typed carry leaf, None for a weak one (Python scalar, WeakArray),
  whose type JAX lets the body's first result decide."""
  if isinstance(x, (bool, int, float)) or type(x) is WeakArray:
    return None
  if isinstance(x, Array):
    return tuple(x.shape), np.dtype(x.dtype)
  if isinstance(x, (np.ndarray, np.generic)):
    return tuple(np.shape(x)), dt.canonicalize(x.dtype)
  return "other"


def _check_carry(init, out, api: str, body) -> None:
  """JAX's loop rule: the body returns a carry of the structure, shapes and dtypes it was given
  (checked on the first iteration; weakly typed leaves take the body's type)."""
  li, ti = tree_flatten(init)
  lo, to = tree_flatten(out)
  name = getattr(body, "__name__", body)
  ex = executor.maybe_current()
  where = f" {ex.where()}" if ex else ""
  if ti != to:
    raise TracingError(f"{api} body {name!r}{where} returned a carry of another structure than it was "
                       f"given ({len(lo)} leaves for {len(li)}). Fix: return the carry in the same pytree "
                       f"structure as the initial value. ({user_frame_summary()})")
  for k, (a, b) in enumerate(zip(li, lo)):
    ta, tb = _carry_type(a), _carry_type(b)
    if ta is None or tb is None or ta == "other" or tb == "other" or ta == tb:
      continue
    raise TracingError(f"{api} body {name!r}{where} changes carry leaf {k} from {ta[1]}{list(ta[0])} to "
                       f"{tb[1]}{list(tb[0])}; JAX requires the carry to keep its dtype and shape "
                       f"(TypeError there). Fix: cast in the body (.astype({ta[1].name})) or start the "
                       f"loop with a value of the body's type. ({user_frame_summary()})")


def while_loop(cond_fun, body_fun, init_val):
  ex = executor.maybe_current()
  carry = init_val
  first = True
  while _truth(cond_fun(carry)):
    carry = body_fun(carry)
    if first:
      _check_carry(init_val, carry, "lax.while_loop", body_fun)
      first = False
    if ex is not None:
      ex.loop_back_edge()
  return carry


def loop(lower, upper, *, step: int = 1, init_carry=None, unroll=None):
  """Decorator form of a fori_loop: `@pl.loop(0, n) def body(i): ...`."""
  lo, hi = concrete_int(lower, "pl.loop lower"), concrete_int(upper, "pl.loop upper")
  step = validate.as_int(step, "pl.loop step", min_value=1)

  def deco(f):
    ex = executor.maybe_current()
    carry = init_carry
    trips = len(range(lo, hi, step))
    block = unrolled(unroll, trips, "pl.loop")
    for k, i in enumerate(range(lo, hi, step)):
      idx = _scalar(i, ex.now) if ex is not None else i
      if ex is not None:
        ex.scalar_op()
      if init_carry is None:
        f(idx)
      else:
        carry = f(idx, carry)
      if ex is not None and (k + 1) % block == 0:
        ex.loop_back_edge()
    return carry

  return deco


def multiple_of(x, values):
  return x


def debug_print(fmt: str, *args) -> None:
  ex = executor.current("pl.debug_print()")
  vals = [concrete_value(a) for a in args]
  try:
    text = fmt.format(*vals) if "{" in fmt else " ".join([fmt] + [str(v) for v in vals])
  except (IndexError, KeyError, ValueError) as e:
    raise UsageError(f"pl.debug_print({fmt!r}, ...) with {len(vals)} value(s): the format does not match "
                     f"({type(e).__name__}: {e}) at {user_frame_summary()}. Fix: use one positional {{}} "
                     f"per value passed.") from None
  ex.debug_print(text)


def delay(nanos) -> None:
  """`pl.delay(nanos)`: the core sleeps for `nanos` nanoseconds (a runtime int32 scalar or an int),
  rounded up to whole cycles of the chip's clock. It orders nothing: it only moves time."""
  ex = executor.current("pl.delay()")
  n = concrete_int(nanos, "pl.delay(nanos)")
  if n < 0:
    raise UsageError(f"pl.delay({n}): a delay is a non-negative number of nanoseconds "
                     f"({user_frame_summary()}). Fix: pass nanos >= 0.")
  ex.delay(-(-n * round(ex.chip.clock_hz) // 1_000_000_000))   # (whole cycles, rounded up, as an int)


# ------------------------------------------------------------------ scoped allocation
_ALLOCATION_TYPES = (MemoryRef, SemaphoreRefType)


# ------------------------------------------------------------------ for code generated from kernels
def scalar_unit():
  """The current core's `scalar_ops(n)` (n scalar-unit ops charged at once -> (the clock before them,
  the cycles of one)), or None outside a kernel: what code generated for a run of scalar ops calls
  (palace.jax's fused scalar blocks) instead of charging one `scalar_op` per op."""
  ex = _current_ex()
  return None if ex is None else ex.scalar_ops


def launch_cache(key, make=None):
  """The current core's per-launch host cache entry `key` (released with the launch, by its
  `release()`), made by `make()` at its first use (None: only an existing one is returned); None
  outside a kernel or on a core that keeps no host caches."""
  ex = _current_ex()
  store = None if ex is None else ex.host_cache
  if store is None:
    return None
  entry = store.get(key)
  if entry is None and make is not None:
    entry = store[key] = make()
  return entry


def _alloc_tree(ex, types, prefix: str, shared: bool = False, names=None):
  leaves, td = tree_flatten(types, is_leaf=lambda t: isinstance(t, _ALLOCATION_TYPES))
  if names is None:
    if isinstance(types, dict) and len(leaves) == len(types):
      names = [f"{prefix}[{k!r}]" for k in sorted(types)]  # tree_flatten orders dict keys the same way
    else:
      names = [f"{prefix}[{i}]" for i in range(len(leaves))]
  return _alloc_leaves(ex, leaves, names, shared), td


def _alloc_leaves(ex, leaves, names, shared: bool):
  bufs = []
  for name, t in zip(names, leaves):
    if not isinstance(t, _ALLOCATION_TYPES):
      raise UsageError(f"{name} = {t!r} is not an allocation type. Fix: use pltpu.VMEM(shape, dtype), "
                       f"pltpu.SMEM(...) or pltpu.SemaphoreType.DMA / .REGULAR.")
    if isinstance(t, MemoryRef):
      dt.check_kernel_dtype(t.dtype, name)
      hw.check_dtype(ex.chip, t.dtype, name)
    bufs.append(ex.alloc(t, name, shared=shared))
  return bufs


def run_scoped(f, *types, collective_axes=(), **kw_types):
  """Allocate `types` (VMEM/SMEM/semaphores) for the duration of `f(*refs, **kw_refs)`.

  With `collective_axes`, the cores that differ only along those axes share one allocation."""
  validate.as_callable(f, "pl.run_scoped(f)", hint="pass the body as the first argument: "
                       "pl.run_scoped(lambda buf: ..., pltpu.VMEM((8, 128), jnp.float32)).")
  validate.check_call(f, len(types), kw_types, lambda e: (
      f"pl.run_scoped body {getattr(f, '__name__', f)!r} cannot take the {len(types)} positional ref(s)"
      f"{f' and keyword refs {sorted(kw_types)}' if kw_types else ''} it allocates ({e}). Fix: give the "
      f"body one parameter per allocation type, in order."))
  axes = (collective_axes,) if isinstance(collective_axes, str) else tuple(collective_axes)
  if axes:
    ex = executor.current("pl.run_scoped()")
    known = [n for n, _ in (ex.mesh_home.axes if ex.mesh_home is not None else ())] + list(ex.axis_env)
    for a in axes:
      if a not in known:
        raise UsageError(f"pl.run_scoped(collective_axes={collective_axes!r}): {a!r} is not an axis of "
                         f"the kernel's mesh (axes here: {known or 'none'}). Fix: name an axis of the "
                         f"pl.kernel mesh, e.g. collective_axes={known[0]!r}." if known else
                         f"pl.run_scoped(collective_axes={collective_axes!r}): {a!r} is not an axis of the "
                         f"kernel's mesh (this kernel runs on no named mesh). Fix: drop collective_axes.")
  return scoped(f, types, kw_types, "run_scoped", bool(axes))


def scoped(f, types, kw_types, prefix: str, shared: bool = False, names=None):
  """run_scoped with a name prefix (`scratch`, `run_scoped`, ...) or explicit names for the buffers."""
  ex = executor.current("pl.run_scoped()")
  pos, kws, bufs = open_scope(ex, types, kw_types, prefix, shared, names)
  try:
    result = f(*pos, **kws)
  except BaseException:
    close_scope(ex, bufs, quiet=True)
    raise
  close_scope(ex, bufs)
  return result


def open_scope(ex, types, kw_types, prefix: str, shared: bool = False, names=None):
  """The allocation half of `scoped`, for code that cannot pass a callback (the launch runner):
  (positional refs, keyword refs, buffers to hand to `close_scope`)."""
  types = tuple(types)
  if not types and not kw_types:   # (a launch without staged copies or scratch opens such scopes)
    return (), {}, []
  if not kw_types and all(isinstance(t, _ALLOCATION_TYPES) for t in types):
    # a flat tuple of allocation types (every scope a launch opens itself): no pytree to rebuild
    bufs = _alloc_leaves(ex, types, names or [f"{prefix}[{i}]" for i in range(len(types))], shared)
    return tuple([None if b is None else Ref(b) for b in bufs]), {}, bufs
  pos_bufs, pos_td = _alloc_tree(ex, types, prefix, shared, names)
  kw_bufs, kw_td = _alloc_tree(ex, dict(kw_types), prefix, shared)
  bufs = pos_bufs + kw_bufs
  try:
    pos = tree_unflatten(pos_td, [None if b is None else Ref(b) for b in pos_bufs])
    kws = tree_unflatten(kw_td, [None if b is None else Ref(b) for b in kw_bufs])
  except BaseException:
    close_scope(ex, bufs, quiet=True)
    raise
  return pos, kws, bufs


def close_scope(ex, bufs, quiet: bool = False) -> None:
  """Free a scope's buffers, last allocated first. `quiet`: unwinding after an error, so the
  end-of-scope checks (semaphores left nonzero by the interrupted kernel, DMAs in flight) do not hide
  the error that caused them."""
  for b in reversed(bufs):
    if b is None:
      continue
    if not quiet:
      ex.free(b)
      continue
    try:
      ex.free(b)
    except PalaceError:
      pass


def with_scoped(*types, collective_axes=(), **kw_types):
  def deco(f):
    @functools.wraps(f)
    def wrapped():
      return run_scoped(f, *types, collective_axes=collective_axes, **kw_types)
    return wrapped
  return deco


# ------------------------------------------------------------------ semaphores
def sem_target(sem, api: str, elsewhere: bool = False):
  """(buffer, index) of one semaphore. `elsewhere`: the op may address a semaphore tied to another
  mesh of an MPMD kernel (a signal); any other op on one is refused."""
  if not isinstance(sem, Ref) or sem.buf.sem_kind is None:
    raise MemorySpaceError(f"{api} needs a semaphore ref (pltpu.SemaphoreType.*); got "
                           f"{validate.describe(sem)}. Fix: pass a semaphore from scratch_shapes or "
                           f"pl.run_scoped(..., pltpu.SemaphoreType.REGULAR). ({user_frame_summary()})")
  if sem.shape != ():
    raise UsageError(f"{api} on {sem.origin()} of shape {sem.shape}. Fix: select one semaphore with "
                     f".at[i]. ({user_frame_summary()})")
  home = sem.buf.home
  if home is not None and not elsewhere and home is not (ex := executor.current(api)).mesh_home:
    raise UnsupportedError(
        f"{api} on {sem.origin()}, a semaphore tied to {home.label}, from a core of another mesh "
        f"({ex.where()}; {user_frame_summary()}): a core waits on, reads and DMAs with its own mesh's "
        f"semaphores; only pl.semaphore_signal reaches another mesh's, and anything else on one is not "
        f"supported in palace yet. Fix: signal it, and wait on it in the body of {home.label}.")
  return sem.buf, sem._np_index


SEM_MAX = 2**31 - 1   # a TPU semaphore holds a 32-bit count (JAX passes signal and wait amounts as int32)


def _sem_amount(value, what: str, api: str, sem) -> int:
  n = concrete_int(value, what)
  if not 0 <= n <= SEM_MAX:
    raise UsageError(f"{api} of {sem.origin()} with {what} {n}: out of range for a TPU semaphore, which "
                     f"holds a 32-bit count; expected 0 <= {what} <= {SEM_MAX} (2**31 - 1). Fix: pass an "
                     f"amount in that range (a larger one split over several signals and waits). "
                     f"({user_frame_summary()})")
  return n


def semaphore_signal(sem, inc=1, *, device_id=None, device_id_type=None, core_index=None):
  ex = executor.current("pl.semaphore_signal()")
  buf, idx = sem_target(sem, "pl.semaphore_signal", elsewhere=True)
  device_id = typed_device_id(device_id, device_id_type, "pl.semaphore_signal")
  home = buf.home if buf.home is not ex.mesh_home else None   # (another mesh's semaphore: its cores)
  ex.sem_signal(buf, idx, _sem_amount(inc, "semaphore increment", "pl.semaphore_signal", sem),
                device_id=resolve_device_id(ex, device_id, home),
                core_index=None if core_index is None else concrete_int(core_index, "core_index"))


def semaphore_wait(sem, value=1, *, decrement: bool = True):
  ex = executor.current("pl.semaphore_wait()")
  buf, idx = sem_target(sem, "pl.semaphore_wait")
  ex.sem_wait(buf, idx, _sem_amount(value, "semaphore value", "pl.semaphore_wait", sem), decrement)


def semaphore_read(sem) -> Array:
  ex = executor.current("pl.semaphore_read()")
  buf, idx = sem_target(sem, "pl.semaphore_read")
  return _scalar(ex.sem_read(buf, idx), ex.now)


def typed_device_id(device_id, device_id_type, api: str):
  """A device id given with JAX's `device_id_type` in palace's form, where an int is a logical id:
  MESH makes a scalar the one coordinate of a 1-D mesh (so a mesh of more axes refuses it, as JAX's
  TPU lowering does); LOGICAL takes only a scalar. Works on operand trees too (palace.jax)."""
  if device_id is None or device_id_type is None:
    return device_id
  kind = str(getattr(device_id_type, "value", device_id_type)).lower()
  container = isinstance(device_id, (dict, tuple, list))
  if kind == DeviceIdType.MESH.value:
    return device_id if container else (device_id,)
  if kind != DeviceIdType.LOGICAL.value:
    raise UnsupportedError(f"{api}: device_id_type={device_id_type!r} is not supported in palace yet "
                           f"({user_frame_summary()}). Fix: use pl.DeviceIdType.MESH or LOGICAL.")
  if container:
    raise UsageError(f"{api}: a DeviceIdType.LOGICAL device_id is an int, the chip's row-major "
                     f"position in the mesh; got a {type(device_id).__name__} "
                     f"({user_frame_summary()}). Fix: pass an int, or mesh coordinates with "
                     f"DeviceIdType.MESH.")
  return device_id


def resolve_device_id(ex, device_id, home=None):
  """device_id (tuple of mesh coords, dict of changed axes, or int) -> (chip, core). `home`: the
  MeshHome of another mesh whose cores the id addresses (there None: mine on that mesh)."""
  if device_id is None and home is None:
    return None
  if isinstance(device_id, dict):
    device_id = {k: concrete_int(v, "device_id") for k, v in device_id.items()}
  elif isinstance(device_id, (tuple, list)):
    device_id = tuple(concrete_int(v, "device_id") for v in device_id)
  elif device_id is not None:
    device_id = concrete_int(device_id, "device_id")
  return ex.resolve_device_id(device_id, home)


# ------------------------------------------------------------------ mesh axes
def _axes(axis_name, api: str) -> tuple:
  """The current core, and (index, size) of each named mesh axis (one name or a tuple of names)."""
  ex = executor.current(f"{api}()")
  names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
  for n in names:
    if n not in ex.axis_env:
      raise UsageError(f"{api}({axis_name!r}): unknown axis {n!r}; axes here: "
                       f"{sorted(ex.axis_env) or 'none (not inside a mesh or shard_map)'}. Fix: name an axis "
                       f"of the enclosing pl.kernel mesh or shard_map.")
  return ex, [ex.axis_env[n] for n in names]


def axis_index(axis_name) -> Array:
  ex, axes = _axes(axis_name, "lax.axis_index")
  lin = 0
  for i, s in axes:
    lin = lin * s + i
  return _scalar(lin, ex.now)


def axis_size(axis_name) -> int:
  total = 1
  for _, s in _axes(axis_name, "lax.axis_size")[1]:
    total *= s
  return total
