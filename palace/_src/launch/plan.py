"""The launch plan (L5): everything one kernel launch needs, as flat data, built by a front end.

`pl.pallas_call` (launch/pallas_call.py) and `pl.kernel` (launch/kernel.py) validate the user's call and
build a `LaunchPlan`; `launch/run.py`'s `run(plan, operands)` runs every plan the same way. A new front
end (the JAX one, issue 17, from a jaxpr) only has to fill in these fields.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from palace._src.core import CompilerParams, MemoryRef, MemorySpace

OPERAND, OUTPUT = "operand", "output"
LEAVES, TREE, ENTRIES = "leaves", "tree", "entries"


@dataclasses.dataclass(frozen=True)
class Operand:
  """One input leaf. `name` names its HBM buffer in messages (`args[2]`, `scalar_prefetch[0]`)."""
  name: str
  shape: tuple
  dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class Output:
  """One output leaf: an HBM array of `shape`/`dtype`, named `name` (`outputs[0]`). `memory_space`
  is where the body sees it (ANY: the HBM ref itself; VMEM/SMEM: a staged copy, see `Stage`)."""
  name: str
  shape: tuple
  dtype: np.dtype
  memory_space: MemorySpace = MemorySpace.ANY


@dataclasses.dataclass(frozen=True)
class Stage:
  """A scoped VMEM/SMEM copy of an operand or output around the body on every core: operands are
  copied in before the body (scalar prefetch, SMEM BlockSpecs) and the body gets the copy; outputs are
  copied back to HBM after it (pl.kernel outputs typed pltpu.VMEM/SMEM, SMEM out BlockSpecs). An
  operand stage with `write_back` is also the ref of the output the operand is aliased to, copied back
  after the body: operand and output are one buffer in that memory space (palace.jax: an output XLA
  places in VMEM, aliased to an input, in a grid-free pallas_call; a JAX mutable ref in VMEM/SMEM
  handed to a pl.kernel, which is its own output)."""
  kind: str                 # OPERAND | OUTPUT
  index: int                # into LaunchPlan.operands / .outputs
  type: MemoryRef           # the scoped allocation
  name: str                 # the allocation's name in messages
  write_back: bool = False


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
  """One kernel launch, ready to run. Fields:

  kernel_name   the name in reports, traces and messages.
  site          (file, line) of the user's call that built the plan (`util.user_site()`).
  params        the `pltpu.CompilerParams` (dimension_semantics, vmem_limit_bytes, collective_id, ...).
  operands      input leaves in order; `run` receives one HBM value per entry (a NumPy array, or a
                mutable `Ref` that the launch updates in place).
  operand_tree  how the body receives the operands. Mesh launches: the body's leading positional
                arguments are `tree_unflatten(operand_tree, refs)` (a tuple, splatted). Grid launches:
                the treedef of the scalar-prefetch arguments only: they are the first
                `operand_tree.num_leaves` operands, passed first and to every index map; each remaining
                operand is a leaf with a block mapping in `in_maps`.
  outputs       output leaves in order; `run` returns one NumPy array per entry.
  output_tree   the treedef the front end rebuilds its result with (and the body's output arguments).
  outputs_as    how the body receives the output refs: LEAVES (one positional argument each),
                ENTRIES (the `output_tree` sequence splatted) or TREE (the whole tree as one argument).
  aliases       {operand index: output index} (input_output_aliases): the operand's ref and the
                output are one HBM buffer, which starts as a copy of the operand (so unwritten
                parts keep the input, and writes through either ref are the other's).
  staged        `Stage`s: scoped memory-space copies of operands/outputs made around the body.
  scratch       scratch allocation types: a tuple (positional refs after the outputs) or a dict
                (keyword refs).
  bodies        the kernel functions. Grid launches: one, run by the pipeline once per grid point.
                Mesh launches: one per mesh (MPMD), each run once per core of its mesh; must return None.
  meshes        None for a grid launch (its TensorCores come from the megacore split of `grid` under
                `params.dimension_semantics`); else one TensorCoreMesh / VectorSubcoreMesh /
                ScalarSubcoreMesh per body.
  grid          grid launches: the grid sizes (a tuple of ints).
  in_maps       grid launches: one `blocks.BlockMapping` per non-prefetch operand (BlockSpec ->
                block shape, index map, memory space, buffer count); the pipeline turns them into DMAs.
  out_maps      grid launches: one BlockMapping per output.
  fixed_site    (file, line) that the launch's records and messages name wherever they would take the
                user's line from the stack (`Machine.site`): set for kernels with no user Python frame
                on the stack while they run (palace.jax's jaxprs: the kernel function's definition).
  semaphores    `(OPERAND | OUTPUT, index, SemaphoreRefType)` per operand or output that is a semaphore
                (JAX's async copies: a DMA started in one launch and waited in a later one). Its HBM
                value is int32 handles, one per element; the body gets a semaphore ref instead, with
                the state kept under those handles (an output: new handles) by the VirtualTPU
                between launches (sim/carried.py). An output aliased to a semaphore operand is that
                operand's semaphore.
  xla_vmem      grid launches of palace.jax: (operand indices, output indices) whose buffers XLA hands
                the kernel in VMEM (jax/xla_placement.py): the pipeline reads and writes their blocks
                in place (views, no DMA).
  replay_operands  None, or the indices of the operands whose contents, with the plan, determine the
                launch's whole schedule, as its front end proved (palace.jax: jax/schedule.py): a later
                launch with the same bytes there may be replayed (sim/replay.py).
  """
  kernel_name: str
  site: tuple
  params: CompilerParams
  operands: tuple
  operand_tree: Any
  outputs: tuple
  output_tree: Any
  outputs_as: str = LEAVES
  aliases: dict = dataclasses.field(default_factory=dict)
  staged: tuple = ()
  scratch: Any = ()
  bodies: tuple = ()
  meshes: tuple | None = None
  grid: tuple | None = None
  in_maps: tuple = ()
  out_maps: tuple = ()
  fixed_site: tuple | None = None
  replay_operands: tuple | None = None
  semaphores: tuple = ()
  xla_vmem: tuple = (frozenset(), frozenset())

  def cache(self) -> dict:
    """What every launch of this plan derives from it alone, kept for the next launch (run.py: the
    megacore split per TensorCore count, the outputs filled lazily, the VMEM total, the pipeline's block
    offsets per core): an attribute, not a field (a plan is immutable; `dataclasses.replace` makes
    a new plan with a new cache), keyed by whatever else an entry depends on."""
    return self.__dict__.get("_cache") or self.__dict__.setdefault("_cache", {})

  @property
  def is_grid(self) -> bool:
    return self.meshes is None

  @property
  def num_prefetch(self) -> int:
    """Grid launches: how many leading operands are scalar-prefetch leaves."""
    return self.operand_tree.num_leaves if self.is_grid else 0

  @property
  def num_points(self) -> int:
    n = 1
    for g in self.grid or ():
      n *= g
    return n if self.is_grid else 0


def grid_stages(prefetch, in_maps, out_maps) -> tuple:
  """A grid launch's `Stage`s: its scalar-prefetch operands (`prefetch`: their arrays), then the
  operands and outputs of its SMEM block mappings whose block is the whole array, staged in SMEM around
  the pipeline (other SMEM blocks are windowed by the pipeline, as Mosaic windows them)."""
  smem = MemorySpace.SMEM
  staged = [Stage(OPERAND, i, MemoryRef(a.shape, a.dtype, smem), f"scalar_prefetch[{i}]")
            for i, a in enumerate(prefetch)]
  staged += [Stage(OPERAND, len(prefetch) + k, MemoryRef(m.array_shape, m.dtype, smem), m.name)
             for k, m in enumerate(in_maps) if m.space == smem and m.whole_array]
  staged += [Stage(OUTPUT, k, MemoryRef(m.array_shape, m.dtype, smem), m.name)
             for k, m in enumerate(out_maps) if m.space == smem and m.whole_array]
  return tuple(staged)
