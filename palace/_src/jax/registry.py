"""The primitive registry of palace.jax (L5): one entry per JAX primitive, everything palace knows of it.

An entry (`Rule`, registered with `rule(...)` by `rules_lax.py`, `rules_state.py` and `rules_control.py`)
holds a primitive's facts in one place, as JAX's `mlir.register_lowering` and its cost-estimate rule
table keep one entry per primitive:

- `evaluate`: how the interpreter (interpret.py) evaluates an equation of it: `fn(eqn, *values)` or,
  with `compiles=True`, `make(eqn) -> fn(*values)`, `make` run once when the jaxpr is compiled;
- `schedule`: its role in the schedule analysis (schedule.py, which proves a kernel's schedule
  data-independent so that its repeated launches may be replayed): `DATA` (its results depend on
  its operands' values, its cost on their shapes only), `Deciding(n)` (the operands after the first
  `n` decide its cost), `Never(why)`, or a function `(eqn, taint) -> [bool per result]` for one that
  reads or writes refs, moves data or runs sub-jaxprs; None (the default): not known to be
  data-independent, so a kernel that uses it is never replayed;
- `pure_index`: it is pure scalar index arithmetic (a BlockSpec index map made of such equations only
  runs once per plan on whole index columns, jax/launch.py);
- `scalar`: how it fuses into a run of 0-d int/bool equations generated as Python int arithmetic
  (scalar_blocks.py): `fn(eqn, operand dtypes, result dtype) -> scalar_blocks.Op | None`; None: never;
- `rejects`: `fn(eqn, sparsecore)` raising palace's error for what Mosaic rejects from the equation's
  types alone (an unsigned matmul operand, an 8-bit scalar addition; `sparsecore`: the kernel runs on
  a SparseCore subcore, whose lowering differs): run while palace lowers the kernel
  (interpret.check_covered), so the caller gets that error at the call itself, as JAX on a TPU raises
  Mosaic's errors there, and not wrapped in XLA's runtime error around palace's host callback (a
  `CompilerRejectError`, what the TPU compiler itself rejects, as JAX's MosaicError too:
  compiler_errors.py);
- `operands`: the decoder of its operand tree (`Operands`) when its operands are a flattened pytree
  (refs with their transforms, DMAs, semaphores): the one reading of that layout, for the evaluation,
  the schedule analysis and the lowering's device-id checks (callback.py).

Adding a primitive is adding one entry to a rules file.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

# what an entry's `schedule` may be, besides None and a function
DATA = "data"


@dataclasses.dataclass(frozen=True)
class Deciding:
  """The operands after the first `n` decide the primitive's cost (a slice start, a shift, a delay);
  the first `n` are data."""
  n: int


@dataclasses.dataclass(frozen=True)
class Never:
  """A kernel using the primitive is never replayed: `why` (e.g. 'reads a semaphore's value')."""
  why: str


@dataclasses.dataclass(frozen=True)
class Operands:
  """How a primitive's flat operands are laid out: `lead` named operands first, then the pytree of the
  equation parameter `tree`, whose top-level entries are `fields` (one field: the whole tree)."""
  tree: str
  fields: tuple
  lead: tuple = ()

  @property
  def names(self) -> tuple:
    return (*self.lead, *self.fields)

  def decode(self, eqn, leaf: Callable | None = None) -> dict:
    """{name: operand} of `eqn`, each tree field unflattened from the flat operands; `leaf(k, var)`
    stands for flat operand k (default: the jaxpr variable itself)."""
    from jax._src import tree_util  # noqa: PLC0415
    leaves = [v if leaf is None else leaf(k, v) for k, v in enumerate(eqn.invars)]
    n = len(self.lead)
    out = dict(zip(self.lead, leaves[:n]))
    tree = tree_util.tree_unflatten(eqn.params[self.tree], leaves[n:])
    if len(self.fields) == 1:
      out[self.fields[0]] = tree
    else:
      out.update(zip(self.fields, tree))
    return out

  def groups(self, eqn) -> dict:
    """{name: [the jaxpr variables of its flat operands]} of `eqn`."""
    n = len(self.lead)
    out = {name: [v] for name, v in zip(self.lead, eqn.invars)}
    flat = eqn.invars[n:]
    if len(self.fields) == 1:
      out[self.fields[0]] = list(flat)
      return out
    at = 0
    for name, child in zip(self.fields, eqn.params[self.tree].children()):
      out[name] = list(flat[at:at + child.num_leaves])
      at += child.num_leaves
    return out


@dataclasses.dataclass(frozen=True)
class Rule:
  """One primitive's entry (module docstring)."""
  name: str
  evaluate: Callable
  compiles: bool = False
  schedule: Any = None
  pure_index: bool = False
  scalar: Callable | None = None
  operands: Operands | None = None
  rejects: Callable | None = None


RULES: dict = {}   # primitive name -> its Rule


def rule(*names, compiles: bool = False, schedule=None, pure_index: bool = False, scalar=None,
         operands: Operands | None = None, rejects: Callable | None = None):
  """Register the decorated function as the evaluation of the primitives `names`, with their facts."""
  def register(evaluate):
    for name in names:
      RULES[name] = Rule(name, evaluate, compiles, schedule, pure_index, scalar, operands, rejects)
    return evaluate
  return register


def literal(v):
  """A jaxpr literal as a NumPy value of its aval's dtype (weak Python scalars keep JAX's type)."""
  aval = v.aval
  return np.asarray(v.val, dtype=aval.dtype) if aval.shape else np.dtype(aval.dtype).type(v.val)


def sub_jaxprs(eqn):
  """The jaxprs among `eqn`'s parameters (branches, loop bodies, called functions)."""
  from jax._src import core as jax_core  # noqa: PLC0415
  for v in eqn.params.values():
    for x in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(x, jax_core.Jaxpr):  # JAX 0.12: one Jaxpr type, consts attached to constvars
        yield x
