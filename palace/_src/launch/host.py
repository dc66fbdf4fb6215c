"""Host side of a launch (L5): operands to HBM buffers and results back to NumPy or jax.Arrays, output
fill values, the shard_map context of a launch, interpret= options. Shared by the front ends and run.py."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys

import numpy as np

from palace._src import blas
from palace._src import dtypes as dt
from palace._src import hw
from palace._src.core import (CompilerParams, InterpretParams, MemoryRef, MemorySpace,
                              ShapeDtypeStruct)
from palace._src import validate
from palace._src.errors import ResourceError, ShapeError, UnsupportedError, UsageError
from palace._src.lang.array import Array
from palace._src.lang.refs import Ref
from palace._src.sim.machine import VirtualTPU, activate, active_tpu, deactivate, paused_gc
from palace._src.sim.memory import Buffer
from palace._src.sim.replay import ReplayMachine, replayable
from palace._src.util import fmt_bytes, prod, tree_flatten, tree_map, user_frame_summary

def check_params(params, api: str) -> CompilerParams:
  if params is None:
    return CompilerParams()
  if isinstance(params, dict):
    if set(params) == {"mosaic"} or set(params) == {"mosaic_tpu"}:
      return _params_of_dict(params, api)
    raise UsageError(f"{api}: compiler_params={params!r} is not compiler parameters. Fix: pass a "
                     f"pltpu.CompilerParams(...).")
  if not isinstance(params, CompilerParams):
    raise UsageError(f"{api}: compiler_params must be a pltpu.CompilerParams for TPU; got "
                     f"{type(params).__name__}. Fix: pass pltpu.CompilerParams(...) or None.")
  return params


def _params_of_dict(params: dict, api: str) -> CompilerParams:
  """compiler_params={"mosaic": {...}} (the dict form JAX also takes) as pltpu.CompilerParams."""
  (platform, fields), = params.items()
  allowed = [f.name for f in dataclasses.fields(CompilerParams)]
  if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
    raise UsageError(f"{api}: compiler_params={{{platform!r}: ...}} must map to a dict of "
                     f"pltpu.CompilerParams fields; got {validate.describe(fields)}. Fix: pass e.g. "
                     f"{{{platform!r}: {{'dimension_semantics': ('parallel',)}}}}, or "
                     f"pltpu.CompilerParams(...).")
  bad = [k for k in fields if k not in allowed]
  if bad:
    raise UsageError(f"{api}: compiler_params[{platform!r}] has the unknown key(s) {bad}; expected "
                     f"pltpu.CompilerParams fields: {', '.join(allowed)}. Fix: correct the key(s), or pass "
                     f"pltpu.CompilerParams(...).")
  return CompilerParams(**fields)


class SpaceConstrained:
  """A pl.kernel operand placed in VMEM or SMEM (`pltpu.with_memory_space_constraint`): the body gets
  a scoped copy there, made before it runs (a DMA from the operand's HBM buffer, as the TPU's
  prologue copies it)."""
  __slots__ = ("value", "memory_space")

  def __init__(self, value, memory_space):
    self.value, self.memory_space = value, memory_space

  def __repr__(self):
    return f"with_memory_space_constraint({type(self.value).__name__}, {self.memory_space})"


def with_memory_space_constraint(x, memory_space):
  """Place kernel operand `x` in `memory_space` (pltpu.ANY, HBM, VMEM or SMEM), as
  jax.experimental.pallas.tpu.with_memory_space_constraint: applied to an argument of a pl.kernel,
  the body's ref for it lives in that memory. ANY and HBM leave `x` as it is."""
  if memory_space in (MemorySpace.ANY, MemorySpace.HBM):
    return x
  if memory_space not in (MemorySpace.VMEM, MemorySpace.SMEM):
    raise UsageError(f"with_memory_space_constraint(x, {memory_space!r}): expected pltpu.ANY, pltpu.HBM, "
                     f"pltpu.VMEM or pltpu.SMEM. Fix: pass one of those.")
  if isinstance(x, Ref):
    raise UsageError(f"with_memory_space_constraint of a mutable ref ({x.buf.name}): refs made on the "
                     f"host live in HBM. Fix: constrain an array, or copy the ref into scratch in the "
                     f"kernel body.")
  return SpaceConstrained(x, memory_space)


def to_host_array(x, name: str) -> np.ndarray:
  """A kernel operand as a NumPy array with a TPU dtype (64-bit narrowed as JAX does without x64)."""
  if isinstance(x, SpaceConstrained):
    raise UnsupportedError(f"{name} has a memory space constraint ({x.memory_space}); palace honours it "
                           f"on pl.kernel operands only. Fix: give the pallas_call operand a "
                           f"pl.BlockSpec(memory_space=pltpu.{x.memory_space.name}) instead.")
  if isinstance(x, Array):
    raise UsageError(f"{name} is a palace.Array from inside a kernel; kernel values cannot leave it. "
                     f"Fix: store it into an output ref (o_ref[...] = value) and use the kernel's result.")
  if isinstance(x, Ref):
    raise UsageError(f"{name} is a mutable ref, and pallas_call takes arrays. Fix: pass refs to pl.kernel "
                     f"(mutated in place) or close over them, or pass pl.freeze(ref) and use "
                     f"input_output_aliases to update in place.")
  if hasattr(x, "__jax_array__") or type(x).__module__.startswith("jax"):
    try:
      x = np.asarray(x)
    except Exception as e:  # noqa: BLE001  jax's TracerArrayConversionError & co.
      if "Tracer" not in type(e).__name__:
        raise
      raise UsageError(f"{name} is a JAX tracer: palace kernels run eagerly on concrete arrays. Inside "
                       f"jax.jit. Fix: wrap the palace function with pl.jax_callable(f).") from None
  a = np.asarray(x)
  d = dt.canonicalize(a.dtype)
  if d != a.dtype:
    a = a.astype(d)
  dt.check_kernel_dtype(a.dtype, name)
  return a


def like_inputs(out, args):
  """Kernel results as jax.Arrays when an input was a jax.Array (the caller uses JAX), else NumPy."""
  jax = sys.modules.get("jax")
  if jax is None or not hasattr(jax, "Array"):
    return out
  if not any(isinstance(x, jax.Array) for x in tree_flatten(args)[0]):
    return out
  return tree_map(lambda a: jax.numpy.asarray(a) if isinstance(a, np.ndarray) else a, out)


class _CallersArray:
  """The lender of an input buffer's storage: the caller's array (see hbm_input). It answers the
  lender protocol of Buffer.borrow/owners as a buffer that is never written during the launch: no
  storage of its own to watch, no lender of its own, readers need no registration."""
  __slots__ = ()
  borrowed = None
  _storage = None

  def add_reader(self, ref) -> None:
    pass

  def __repr__(self):
    return "<the caller's array>"


CALLERS_ARRAY = _CallersArray()


def hbm_input(a: np.ndarray, name: str, chip: int = 0, into: Buffer | None = None) -> Buffer:
  """An input operand's HBM buffer, without a copy: it views the caller's array read-only and borrows
  it (`Buffer.borrowed`), so the first write to the buffer (a DMA into the input ref, a store, an
  atomic) takes a private copy first (copy on write, Buffer.detach_readers). Inputs behave as JAX
  arrays: never modified, unless aliased (`input_output_aliases` writes a copy that is returned).
  `into`: a kept launch's buffer for this operand (launch/run.py `_Warm`), made the same again."""
  ro = a.view()
  ro.setflags(write=False)
  if into is None:
    buf = Buffer(ro, a.shape, a.dtype, MemorySpace.ANY, name, None, chip)
  else:
    buf = into
    buf.rebind(ro)
  buf.borrowed = CALLERS_ARRAY
  return buf


def eager_output_init(tpu) -> bool:
  """Whether outputs must be filled with the uninitialised value before a launch on `tpu`: on
  timing-only machines (no data moves, outputs stay deterministic) and when never-written reads are
  checked."""
  return tpu.timing_only or getattr(tpu, "uninitialized", "nan") != "nan"


def out_struct(o, name: str):
  """(shape, dtype, memory space) of an out_shape / out_type entry."""
  if isinstance(o, MemoryRef):
    dt.check_kernel_dtype(o.dtype, name)
    return o.shape, o.dtype, o.memory_space
  if isinstance(o, ShapeDtypeStruct) or (hasattr(o, "shape") and hasattr(o, "dtype")):
    d = dt.canonicalize(o.dtype)
    if np.dtype(o.dtype) != d:
      raise ShapeError(f"{name} has dtype {np.dtype(o.dtype)}; TPUs have no 64-bit types. Fix: use {d}.")
    dt.check_kernel_dtype(d, name)
    return tuple(o.shape), d, MemorySpace.ANY
  raise UsageError(f"{name} = {o!r}: expected a pl.ShapeDtypeStruct or a memory type like "
                   f"pltpu.VMEM(shape, dtype). Fix: pass e.g. pl.ShapeDtypeStruct((8, 128), jnp.float32).")


class on_tpu:
  """`with on_tpu(tpu):` makes `tpu` the active VirtualTPU of this thread for the block: how a thread
  that did not enter `pl.virtual_tpu` itself runs palace code that asks for the active TPU
  (shard_map's chip threads, launch/spmd.py; XLA's threads under palace.jax). The one home of machine
  activation for every front end; a launch itself takes its TPU from its caller (`run(..., tpu)`).
  (A class, not a generator context manager: entered once per shard_map chip.)"""
  __slots__ = ("tpu", "token")

  def __init__(self, tpu: VirtualTPU):
    self.tpu = tpu

  def __enter__(self) -> VirtualTPU:
    self.token = activate(self.tpu)
    return self.tpu

  def __exit__(self, *exc):
    deactivate(self.token)
    return False


_spmd: contextvars.ContextVar = contextvars.ContextVar("palace_spmd_chip", default=None)


def spmd_context():
  """The (group, chip index) of the shard_map program running in this thread, or None."""
  return _spmd.get()


def set_spmd_context(ctx):
  return _spmd.set(ctx)


def reset_spmd_context(token) -> None:
  _spmd.reset(token)


class launch_machine:
  """`with launch_machine(tpu, kernel_name, num_chips, grid_steps) as machine: machine.run(programs)`:
  one launch on a fresh machine of `tpu` (the one sequence of launch/run.py and of shard_map's pod
  launch, launch/spmd.py). Around the block: the cyclic GC paused from the machine's making to its
  release (sim/machine.paused_gc: the collection after a launch finds only what outlives it, the
  report) and BLAS in kernel mode; after a block that returned, the report is recorded and the machine
  released. (A context manager, not a function taking the programs: the kernel bodies run in the
  caller's frame, a frame shallower, tests/test_launch_plan.py.) `replay`: (plan, key) of a launch
  its front end proved replayable (sim/replay.py): a launch the VirtualTPU's memo knows runs on a
  ReplayMachine; a new one's report goes into the memo if its machine was replayable."""
  __slots__ = ("tpu", "kernel_name", "num_chips", "grid_steps", "machine", "_gc", "_blas", "replay",
               "warm_key", "warm", "may_keep", "keep")

  def __init__(self, tpu, kernel_name: str, num_chips: int, grid_steps: int, replay=None):
    self.tpu, self.kernel_name, self.num_chips, self.grid_steps = tpu, kernel_name, num_chips, grid_steps
    # (the TPU's options that a launch's machine depends on join the key: timing_only is switched by
    # palace.jax.device_time, and a replayable machine needs data)
    self.replay = None if replay is None or tpu.replays is None or tpu.timing_only else (
        replay[0], (replay[1], tpu.trace, tpu.detect_races, tpu.uninitialized, tpu.dma_policy))
    # a replayed launch: `warm` is the launch kept from the last one with this key (if any, taken out
    # of the memo while it runs), `may_keep` says the launch may set `keep` to the state to keep, which
    # `give_back` returns to the memo once the launch's outputs are out (launch/run.py `_Warm`)
    self.warm_key = self.warm = self.keep = None
    self.may_keep = False

  def __enter__(self):
    self._gc, self._blas = paused_gc(), blas.kernel_mode()
    self._gc.__enter__()
    try:
      known = None if self.replay is None else self.tpu.replays.get(*self.replay)
      if known is not None:
        self.warm_key, self.replay = self.replay, None
        self.warm = self.tpu.replays.take_warm(*self.warm_key)
        self.may_keep = True
        self.machine = ReplayMachine(self.tpu, self.kernel_name, known)
      else:
        self.machine = self.tpu.new_machine(self.kernel_name, self.num_chips)
      self._blas.__enter__()
    except BaseException:
      self._gc.__exit__(None, None, None)
      raise
    return self.machine

  def __exit__(self, exc_type, exc, tb):
    try:
      self._blas.__exit__(exc_type, exc, tb)
      if exc_type is None:
        machine = self.machine
        machine.grid_steps = self.grid_steps
        report = machine.finish()
        if self.replay is not None and replayable(machine):
          self.tpu.replays.put(*self.replay, report)
        self.tpu.record(report)
        if self.keep is not None:
          machine.keep_cores()
        release_host_caches(machine)
      else:
        self.keep = None
        # a failed launch lets go of its machine too: copies it left to land (`Machine.release`) must
        # not land in a buffer that outlives it (an aliased operand, a mutable ref) at a later access.
        # The launch's own error is what the caller sees: a failure of this cleanup is not raised over it.
        try:
          release_host_caches(self.machine)
        except Exception:   # noqa: BLE001
          pass
    finally:
      self._gc.__exit__(exc_type, exc, tb)
    return False

  def give_back(self) -> None:
    """The kept state (`keep`, parked) back into the memo, for the next launch with this key."""
    self.tpu.replays.give_warm(*self.warm_key, self.keep)
    self.keep = None


def release_host_caches(machine) -> None:
  """End of a launch: the language side's per-core host caches give their memory back (hostmem), then
  the machine lets go of its state (Machine.release: freed at once, not by the cyclic GC)."""
  for core in machine.cores:
    for cache in core.host_cache.values():
      cache.release()
    core.host_cache.clear()
  machine.release()


def check_interpret(interpret, kname: str) -> None:
  """Reject the InterpretParams options palace cannot honour (called by the launch, before it runs)."""
  if not isinstance(interpret, (bool, InterpretParams)) and interpret is not None:
    raise UsageError(f"interpret= of kernel '{kname}' must be a bool or pltpu.InterpretParams; got "
                     f"{interpret!r}. Fix: pass interpret=True (palace always runs on its virtual TPU) or "
                     f"pltpu.InterpretParams(...).")
  if isinstance(interpret, InterpretParams) and interpret.uninitialized_memory != "nan":
    raise UnsupportedError.feature(
        f"InterpretParams(uninitialized_memory={interpret.uninitialized_memory!r})",
        f"(interpret= of kernel '{kname}', called at {user_frame_summary()}) Never-written memory reads "
        f"as NaN (floats) or the int minimum. Fix: drop the option, or use pl.virtual_tpu(..., "
        f"uninitialized='raise') to catch such reads.")


@contextlib.contextmanager
def interpret_context(interpret):
  """`interpret=pltpu.InterpretParams(...)` on a launch: run it on a VirtualTPU like the active one
  with the matching options (its report is recorded in the active context too)."""
  if not isinstance(interpret, InterpretParams):
    yield
    return
  parent = active_tpu()
  policy = interpret.dma_execution_mode if interpret.dma_execution_mode in ("eager", "on_wait") \
      else parent.dma_policy
  child = VirtualTPU(parent.chip, parent.num_chips, timing_only=parent.timing_only, dma_policy=policy,
                     seed=parent.seed if interpret.random_seed is None else interpret.random_seed,
                     trace=parent.trace, topology=parent.topology,
                     detect_races=interpret.detect_races or parent.detect_races,
                     uninitialized=parent.uninitialized, exact_f32_dots=parent.exact_f32_dots,
                     shared_dots=parent.shared_dots, dot_numerics=parent.dot_numerics,
                     host_math=parent.host_math)
  with child:
    yield


def check_aliases(aliases, kname: str) -> dict:
  """`input_output_aliases` as {input index: output index} of ints; an output aliased by two inputs is
  an error (the output could only hold one of them). Range and shape checks follow in the launch."""
  if aliases is None:
    return {}
  what = f"input_output_aliases of pallas_call '{kname}'"
  if not isinstance(aliases, dict):
    raise UsageError(f"{what} must be a dict {{input index: output index}}; got {type(aliases).__name__}"
                     f" {aliases!r}. Fix: pass e.g. input_output_aliases={{0: 0}}.")
  out = {}
  seen = {}
  for k, v in aliases.items():
    i = validate.as_int(k, f"{what}: key {k!r}", min_value=0,
                        hint="keys are input operand indices (ints, counting scalar-prefetch operands).")
    o = validate.as_int(v, f"{what}: value for input {i}", min_value=0,
                        hint="values are output indices (ints) into the flattened out_shape.")
    if o in seen:
      raise UsageError(f"{what}: inputs {seen[o]} and {i} are both aliased to output {o}; an output can "
                       f"alias one input only. Fix: alias each output to at most one input.")
    seen[o] = i
    out[i] = o
  return out


def check_hbm(kname: str, arrays, outs, scratch, chip=None) -> None:
  """HBM capacity of `chip` (default: the active one's) for one launch: `arrays` {name: host array}
  (inputs), `outs` {name: (shape, dtype, space)}, `scratch` the scratch types (HBM / ANY ones count).
  Called before any output is allocated, so a launch that cannot fit fails with the numbers instead of
  allocating host memory (timing_only too). Every operand's dtype is checked against the chip first
  (hw.check_dtype: float8_e4m3b11fnuz is not on every chip)."""
  spec = active_tpu().chip if chip is None else chip
  for name, a in arrays.items():
    hw.check_dtype(spec, a.dtype, name)
  for name, (_, dtype, _) in outs.items():
    hw.check_dtype(spec, dtype, name)
  leaves = tree_flatten(scratch, is_leaf=lambda x: isinstance(x, MemoryRef))[0]
  for i, t in enumerate(leaves):
    if isinstance(t, MemoryRef):
      hw.check_dtype(spec, t.dtype, f"scratch[{i}]")
  sizes = [(name, a.nbytes) for name, a in arrays.items()]
  sizes += [(name, prod(shape) * np.dtype(dtype).itemsize) for name, (shape, dtype, space) in outs.items()
            if space in (MemorySpace.ANY, MemorySpace.HBM)]
  sizes += [(f"scratch[{i}]", t.nbytes) for i, t in enumerate(leaves)
            if isinstance(t, MemoryRef) and t.memory_space in (MemorySpace.ANY, MemorySpace.HBM)]
  check_hbm_sizes(f"kernel '{kname}'", sizes, "the launch's", spec)


def check_hbm_sizes(owner: str, sizes, whose: str | None, chip=None) -> None:
  """The one HBM capacity check: `sizes` [(name, bytes)] must fit one device of `chip` (default: the
  active one's). `owner` names the launch or host call ("kernel 'k'", "pl.empty_ref"), `whose` the
  operands ("the launch's"; None for a single buffer)."""
  chip = active_tpu().chip if chip is None else chip
  total = sum(n for _, n in sizes)
  cap = chip.hbm_bytes_per_device
  if total <= cap:
    return
  name, big = max(sizes, key=lambda r: r[1])
  amount = (f"{name} is {fmt_bytes(big)}" if whose is None else
            f"{name} alone is {fmt_bytes(big)} and {whose} {len(sizes)} HBM operands total {fmt_bytes(total)}")
  raise ResourceError(
      f"HBM over capacity for {owner} on {chip.name}: {amount}, but one {chip.name} device has "
      f"{fmt_bytes(cap)} of HBM ({cap:,} bytes). Fix: shrink {name} (or tile the problem over several "
      f"launches), shard it over chips with shard_map, or use a chip with more HBM (v5p, 7x).")
