"""The executor interface (L3): everything a running kernel may ask of the machine.

Language ops (`palace/_src/lang/*`) and the pipeline call `current()` and use only the members declared
on `Executor` (and, on SparseCore subcores, `SparseCoreExecutor`); the virtual TPU (`palace/_src/sim/`)
implements them. Nothing else connects the two sides: the launch (`palace/_src/launch/run.py`) builds
the machine, whose scheduler sets the context variable for each core it runs.

What the protocol does NOT hold: the language's own per-kernel state (the barrier semaphore, the PRNG)
lives in `lang/context.KernelContext`, which the launch creates for each core program; the machine never
sees it. Two slots are owned by the language but kept on the executor, declared here: `host_cache`
(host memory pools released by the launch) and `unused_dmas` (descriptors made but never used, which
the machine reports at kernel end after its semaphore checks).

Op cost classes (`OpClass`) are the vocabulary of `vector_op`: the language names the kind of work, the
machine maps each class to units and cycles (sim/cost.py `VECTOR_CLASSES`; SparseCores: sim/subcore.py).
"""
from __future__ import annotations

import contextvars
import dataclasses
from typing import Any, Protocol

import numpy as np

from palace._src.errors import UsageError
from palace._src.util import describe_dims


class OpClass:
  """Cost classes of vector ops (the `op_class` of `Executor.vector_op`). Values are the names the
  machine's cost tables and trace labels use."""
  CHEAP = "cheap"                    # + - * max min where compare cast
  BROADCAST = "broadcast"            # broadcast_to (sublanes, or a lane-replicated value across lanes)
  LANE_BROADCAST = "lane_broadcast"  # an (N, 1) column that is not lane-replicated, across lanes
  MEDIUM = "medium"                  # divide, pow, integer div/mod
  TRANSCENDENTAL = "transcendental"  # exp2, log, tanh, sqrt, rsqrt, erf (the EUP)
  EXP = "transcendental_exp"         # exp (the EUP, with a longer latency than the others: measured)
  EXPENSIVE = "expensive"            # sin, cos, tan, arctan (polynomials on the VPU)
  REDUCE_SUBLANE = "reduce_sublane"  # reductions over the second-minor dim
  REDUCE_LANE = "reduce_lane"        # reductions / scans over the last dim
  XLU = "xlu"                        # minor-dim transposes, relayouts, rolls, gathers
  LOAD = "load"                      # vreg loads (packed tiles)
  STORE = "store"                    # vreg stores (packed tiles)
  FREE = "free"                      # leading-dim reshapes and transposes, bitcasts: no work
  ALL = (CHEAP, BROADCAST, LANE_BROADCAST, MEDIUM, TRANSCENDENTAL, EXP, EXPENSIVE, REDUCE_SUBLANE,
         REDUCE_LANE, XLU, LOAD, STORE, FREE)


@dataclasses.dataclass(frozen=True, eq=False)
class MeshHome:
  """The cores of one mesh of a mesh launch (pl.kernel), as a device id addresses them: the mesh's
  axes `[(name, size)]`, core axis first, and the core id at each coordinate tuple (`core_ids`;
  SparseCore subcores are numbered apart from TensorCores, sim/subcore.py). Every core of the mesh
  holds it (`Executor.mesh_home`), and so does a semaphore tied to the mesh (`SemaphoreType.REGULAR
  @ mesh` in an MPMD kernel: the semaphore lives on that mesh's cores, and a core of another mesh that
  signals it addresses them, launch/run.py). Made once per launch and mesh: compared by identity."""
  axes: tuple
  core_ids: dict
  label: str          # the mesh in messages ("ScalarSubcoreMesh(core=2)")


class Executor(Protocol):
  """One core of the virtual machine as a kernel body sees it."""
  # identity and configuration (read only for the language)
  chip: Any                 # hw.ChipSpec of the machine
  chip_index: int
  core_id: int
  kernel_name: str
  timing_only: bool         # no data moves: values carry shapes and ready cycles only
  exact_f32_dots: bool      # diagnostic, not the chip: DEFAULT-precision f32 dots unrounded (lang/mxu.py)
  shared_dots: bool         # diagnostic, not the chip: float dots summed by mxu.shared_product's rule
  host_math: bool           # diagnostic, not the chip: transcendentals as XLA:CPU's (lang/host_math.py)
  dot_numerics: str         # "blas" (host BLAS order) or "mxu" (the chip's measured sums, mxu.chip_product)
  bounds_checks: bool       # CompilerParams(disable_bounds_checks=False)
  deferred_values: bool     # whole-buffer stores may keep deferred values (load then returns them)
  axis_env: dict            # mesh axis name -> (index, size)
  dma_granule_bytes: int    # indexed DMAs move whole granules of this many bytes (0: byte-exact)
  sparsecore: Any           # this executor as a SparseCoreExecutor on SparseCore subcores, else None
  # set by the launch before the core runs (launch/run.py; the pallas_call VMEM check reads vmem_limit)
  vmem_limit: int           # bytes of scoped VMEM for the kernel's pipelined blocks (the limit)
  mesh_home: Any            # the MeshHome of the core-level mesh (pl.kernel): its axes and core ids,
  # for device_id and collective axes (None: no mesh; a grid launch)
  # state the language manages on the core
  grid_stack: list          # [(indices tuple, sizes tuple), ...] innermost last (pipelines)
  grid_reads: Any           # None, or a list the language appends each pl.program_id axis to (and
                            # the machine None for a read the grid does not determine): set by a
                            # pipeline's steady-state detector around a body (pipeline_steady.py)
  now: int                  # the core's issue clock (cycles)
  host_cache: dict          # per-launch host caches owned by the language side (lang/deferred.py)
  unused_dmas: dict         # id(descriptor) -> (site, describer, descriptor), reported at kernel end
                            # (str(describer) names the copy; made only when reported)

  # values and compute
  def load(self, buf, index, shape, site=None): ...          # -> (np data | None, ready_cycle)
  def store(self, buf, index, shape, data, ready: int) -> None: ...
  def note_access(self, buf, index, kind: str, shape, atomic: bool = False) -> None: ...  # by lang
  def vector_op(self, op_class: str, shape, dtype, ready: int, links: int = 0) -> int: ...
  # op_class: an OpClass; links: the op is that many dependent steps (a reduction's accumulation chain)
  def matmul(self, m: int, k: int, n: int, batch: int, lhs_dtype, rhs_dtype, ready: int,
             weights=None) -> int: ...   # weights: the right operand (its identity: kept latched?)
  def scalar_op(self, ready: int = 0) -> int: ...
  def scalar_ops(self, n: int) -> tuple: ...   # n scalar_ops at once -> (clock before, cycles of one)
  def delay(self, cycles: int) -> None: ...     # the scalar core sleeps (pl.delay); units keep running
  # memory
  def alloc(self, mem_type, name: str, shared: bool = False): ...  # -> Buffer
  def free(self, buf) -> None: ...
  # DMA and semaphores
  def dma_start(self, desc) -> None: ...                     # desc: a DmaRequest
  def dma_wait(self, desc, which: str) -> None: ...          # which: "recv" | "send"
  def sem_signal(self, buf, index, inc: int, device_id=None, core_index=None) -> None: ...
  def sem_wait(self, buf, index, value: int, decrement: bool = True) -> None: ...
  def sem_read(self, buf, index) -> int: ...
  def carry_semaphores(self, buf, name: str, handles=None): ...   # a launch's semaphore operand/result
  def resolve_device_id(self, device_id, home=None) -> tuple: ...  # -> (chip, core) on mesh `home`
  # bookkeeping
  def grid_step(self) -> None: ...
  def loop_back_edge(self) -> None: ...   # a rolled loop's iteration ends (a basic block's end)
  def branch(self, tested: int) -> None: ...   # a conditional branch (pl.when, lax.cond / switch),
                                               # with `tested` scalar ops of its condition's test
  def steady_state(self): ...   # -> the machine side of steady-state extrapolation, or None
  def where(self) -> str: ...
  def site(self) -> tuple: ...   # (file, line) of the user's code issuing the current op (records, messages)
  def debug_print(self, text: str) -> None: ...
  def trace_value(self, label: str, value) -> None: ...   # pltpu.trace_value: a value on the timeline


class SparseCoreExecutor(Executor, Protocol):
  """A SparseCore vector or scalar subcore (`Executor.sparsecore` is the executor itself)."""
  scalar: bool              # a scalar subcore (no TileSpmem, no vector unit)

  def subcore_barrier(self) -> None: ...                    # all vector subcores of this SparseCore
  def peer_subcore_buffer(self, buf, subcore: int): ...      # the same allocation on another subcore


_current: contextvars.ContextVar = contextvars.ContextVar("palace_executor", default=None)


def current(api: str = "this operation"):
  ex = _current.get()
  if ex is None:
    raise UsageError(f"{api} was called outside a kernel body. Fix: call it inside the function passed "
                     f"to pl.pallas_call or pl.kernel.")
  return ex


# the current executor or None: the context variable's own getter (a C call, no Python frame; the
# language's hot paths ask it on every op)
maybe_current = _current.get


def set_current(ex):
  return _current.set(ex)


def reset_current(token) -> None:
  _current.reset(token)


class running_on:
  """`with running_on(core): program()`: `core` is the current executor (the one program of a
  single-core launch), NumPy's floating-point warnings off: TPU arithmetic never warns, inf and nan
  flow through silently. (A class, not a function taking the program: the kernel body runs a frame
  shallower, tests/test_launch_plan.py.)"""
  __slots__ = ("ex", "token", "errstate")

  def __init__(self, ex):
    self.ex = ex

  def __enter__(self):
    self.errstate = np.errstate(all="ignore")
    self.errstate.__enter__()
    self.token = _current.set(self.ex)

  def __exit__(self, *exc):
    _current.reset(self.token)
    self.errstate.__exit__(*exc)


_WINDOW, _VIEW = "window", "view"   # (the forms of a side of a flat label)


def flat_label(copy) -> tuple:
  """A copy's label: what its description says, unformatted and holding no buffer (a launch's report
  keeps one per DMA event, sim/trace.Trace.events), for a DmaRequest or a pipeline copy's labels
  (anything with `label_parts()`: (name, dims, shape) of each side, pipeline._BlockLabels, which also
  names the copies of steps a steady-state detector advanced over). One tuple of names, numbers and
  Nones with nothing nested: the source side, then the destination side, each its name, then None for
  a whole view; or "window", the rank n, n offsets and n sizes for a unit-stride window; or "view",
  the rank n and one (start, size, stride) per dimension of a view's dims (Ref.dims; (index, None,
  None) for a dimension indexed away). `label_text` formats it. The cyclic GC stops tracking a tuple
  of such values at the first collection that examines it, whatever the order it examines objects
  in; a nested one needs one collection per level (CPython examines a young tuple after the one
  holding it), so an event holding nested labels reached the oldest generation."""
  labels = copy.labels if isinstance(copy, DmaRequest) else copy
  if labels is None:
    return (copy.src_buf.name, None, copy.dst_buf.name, None)
  parts = getattr(labels, "label_parts", None)   # (pipeline copies: no view is built)
  if parts is not None:
    label = parts()
  else:
    src, dst = [v.label_part() if hasattr(v, "label_part") else (v.origin(), None, None) for v in labels]
    label = src + dst
  out = []
  for name, dims, shape in (label[:3], label[3:6]):
    if dims is None:
      out += (name, None)
    elif shape is not None:
      out += (name, _WINDOW, len(dims), *dims, *shape)
    else:
      out += (name, _VIEW, len(dims))
      for d in dims:
        out += d if type(d) is tuple else (d, None, None)
  return tuple(out)


def label_text(label) -> str:
  """A copy's flat label (`flat_label`) as text: 'args[0][0:8, 0:128] -> args[0] block'."""
  sides = []
  i = 0
  for _ in range(2):
    name, form = label[i], label[i + 1]
    if form is None:
      sides.append(name)
      i += 2
      continue
    n = label[i + 2]
    i += 3
    if form == _WINDOW:
      dims = [(o, z, 1) for o, z in zip(label[i:i + n], label[i + n:i + 2 * n])]
      i += 2 * n
    else:
      dims = [label[j] if label[j + 1] is None else label[j:j + 3] for j in range(i, i + 3 * n, 3)]
      i += 3 * n
    sides.append(name + describe_dims(dims))
  return " -> ".join(sides)


class DmaRequest:
  """A copy between two buffer views, as the language hands it to the machine.

  Views are (Buffer, NumPy index tuple, shape). `sem` is the destination semaphore slot, signalled by
  the byte count when the write lands; `src_sem` (optional) when the read completes. `device_id` is a
  resolved chip index for remote copies (None = local), `core_index` a target core on the same chip.
  `describe` names both sides for messages; `site` is the user's (file, line) of `.start()`.
  """
  __slots__ = ("src_buf", "src_index", "dst_buf", "dst_index", "shape", "sem_buf", "sem_index",
               "src_sem_buf", "src_sem_index", "add", "device_id", "core_index", "site", "labels",
               "nbytes", "src_indices", "dst_indices", "mask", "fast", "priority", "hbm_runs", "owner",
               "stream_span", "hbm_block")

  def __init__(self, src_buf, src_index, dst_buf, dst_index, shape, sem_buf=None, sem_index=(),
               src_sem_buf=None, src_sem_index=(), add=False, device_id=None, core_index=None,
               site=None, labels=None, nbytes=0, src_indices=None, dst_indices=None):
    self.src_buf, self.src_index, self.dst_buf, self.dst_index = src_buf, src_index, dst_buf, dst_index
    self.shape, self.sem_buf, self.sem_index = shape, sem_buf, sem_index
    self.src_sem_buf, self.src_sem_index, self.add = src_sem_buf, src_sem_index, add
    self.device_id, self.core_index, self.site, self.labels = device_id, core_index, site, labels
    self.nbytes, self.src_indices, self.dst_indices = nbytes, src_indices, dst_indices
    self.mask = None  # indexed DMAs: which index entries are used (None: all)
    self.priority = 0  # the DMA queue of a TensorCore copy (0 or 1: `.start(priority=)`); timed alike
    self.hbm_runs = None  # contiguous runs of its HBM side, counted at its first start when a chip
                          # charges per run (sim/dma.py, the v5e rule dma_run_overhead_bytes)
    self.stream_span = None  # (stream key, tiles it spans or None), found at its first start when a
                             # chip times streams (sim/dma.stream_overhead)
    self.hbm_block = None  # the element offsets of its HBM side's window when that window is a whole
                           # block of `shape` inside its array (a pipeline's copy, pipeline.py): the
                           # machine takes its span and runs from the block's plan (sim/dma.block_plan)
    self.owner = None  # who issues it, an opaque token (a pipeline's operand: pipeline.py); the
                       # machine tells streams of copies from several owners apart (sim/dma.py)
    self.fast = None  # the executor's cache (sim/dma.DmaEngine.start); it depends only on the memory
                      # spaces and the destination semaphore, so a request with the same ones may
                      # start with another's (lang/tpu_primitives.prepare_window_copy(like=...))

  @property
  def src_selection(self):
    """The source window as an index of the source's storage: its index arrays (an indexed copy's
    gathered rows), else its plain index."""
    return self.src_indices if self.src_indices is not None else self.src_index

  @property
  def describe(self) -> str:
    """'src -> dst' with operand names and windows (built only when a message needs it)."""
    return label_text(flat_label(self))

  def __str__(self):
    return self.describe
