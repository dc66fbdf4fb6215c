"""Index maps over scalar-prefetch tables (L5): the block offsets of every grid step at once for a map
that reads scalar-prefetch refs the kernel never writes (BlockMapping.prefetch_index_map, a front
end's proof), with each step still charged exactly what its own evaluation on the core charges.

Such a map cannot run on the host before the launch (its tables are the kernel's SMEM), so the
pipeline evaluates it on the core, per step, charging its loads and scalar ops (block_offsets.py). A
`PrefetchMap` keeps that for the first step the pipeline asks for, with the core behind a recorder
(`_Recording`) that notes, in order, every element load and scalar op the evaluation makes. The map is
then run once more, on the host, over the whole grid's index columns, its refs replaced by tables of
their contents (`_Table`: an element read at index columns is a gather), which notes each read's
element per step. From then on a step's offsets are looked up and its charges replayed on the core:
the same `load` of the same element (checkers see it as before) and the same scalar ops, in the
recorded order (`charge`).

Why that is exact: the tables are never written, so every step reads what the host pass read; the
evaluation is straight-line code over the same equations on every step (an equation's charges depend
on its operands' kinds, which are the same on every step, not their values), so every step makes the
first step's calls with its own elements. The pass checks this where it can: its reads of the first
step must be the recorded loads, element for element, and its offsets that step's; the recorder must
have seen nothing but element loads and scalar ops. Anything else (a map the tables cannot answer,
control flow on the index columns, an out-of-bounds block, another call on the core) leaves the map
evaluated per step on the core, as without this module.
"""
from __future__ import annotations

import numpy as np

from palace._src import executor
from palace._src.lang.refs import Ref


class _NotTabular(Exception):
  """The map asked a table for something other than an element read (evaluated per step instead)."""


class _Table(Ref):
  """A scalar-prefetch ref (or a static view of it) as the host pass reads it: `view[...]` of one
  element, or `load_element` at index columns (a gather). Each read is appended to `reads` as
  (buffer, the element's NumPy index, None) when static, or (buffer, None, per-dimension lists of
  every step's index) at columns. A Ref to the rules that take refs, but with none of a Ref's state:
  whatever else they ask of it fails, and the map is evaluated per step."""
  __slots__ = ("ref", "reads", "n")

  def __init__(self, ref, reads: list, n: int):   # (Ref.__init__ not called: no buffer of its own)
    self.ref, self.reads, self.n = ref, reads, n

  @property
  def at(self):
    return _At(self)

  def __getitem__(self, idx):
    ref = self.ref
    if idx is not Ellipsis or type(ref) is not Ref or ref.shape or ref.buf.storage is None:
      raise _NotTabular
    self.reads.append((ref.buf, ref._np_index, None))
    return np.asarray(ref.buf.storage[ref._np_index])

  def load_element(self, idx: tuple):
    ref = self.ref
    storage = ref.buf.storage
    if type(ref) is not Ref or not ref._full or storage is None or len(idx) != len(ref.shape):
      raise _NotTabular
    cols = []
    for i, size in zip(idx, ref.shape):
      i = np.asarray(i)
      if i.dtype.kind not in "iu" or i.ndim > 1 or (i.size and (i.min() < 0 or i.max() >= size)):
        raise _NotTabular   # (the per-step path reads it, with its own checks and messages)
      cols.append(np.broadcast_to(i.astype(np.int64), (self.n,)))
    self.reads.append((ref.buf, None, [c.tolist() for c in cols]))
    return storage[tuple(cols)]

  def __getattr__(self, name):
    raise _NotTabular


class _At:
  __slots__ = ("table",)

  def __init__(self, table: _Table):
    self.table = table

  def __getitem__(self, idx):
    idx = idx if isinstance(idx, tuple) else (idx,)
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in idx):
      raise _NotTabular
    t = self.table
    return _Table(t.ref.at[idx], t.reads, t.n)


# the core's configuration (executor.Executor's read-only members): the same on every step, so an
# evaluation that reads it (a view composed with the core's bounds-check setting) still replays
_CONFIG = frozenset({"chip", "chip_index", "core_id", "kernel_name", "timing_only", "exact_f32_dots",
                     "shared_dots", "host_math", "dot_numerics", "bounds_checks", "deferred_values", "axis_env",
                     "dma_granule_bytes", "sparsecore"})


class _Recording:
  """The core while a map's first step is evaluated on it: every call passes through; element loads
  and scalar ops are also noted in order (`tape`: (buffer, index) per load, a count per run of scalar
  ops); any other member asked for, but the core's configuration, marks the evaluation as not
  replayable (`other`)."""
  __slots__ = ("ex", "tape", "other")

  def __init__(self, ex):
    self.ex, self.tape, self.other = ex, [], False

  def load(self, buf, index, shape, site=None):
    if shape != ():
      self.other = True
    else:
      self.tape.append((buf, index))
    return self.ex.load(buf, index, shape) if site is None else self.ex.load(buf, index, shape, site)

  def scalar_op(self, ready: int = 0) -> int:
    self._ops(1)
    return self.ex.scalar_op(ready)

  def scalar_ops(self, n: int) -> tuple:
    self._ops(n)
    return self.ex.scalar_ops(n)

  def _ops(self, n: int) -> None:
    tape = self.tape
    if tape and type(tape[-1]) is int:
      tape[-1] += n
    else:
      tape.append(n)

  def __getattr__(self, name):
    if name not in _CONFIG:
      self.other = True
    return getattr(self.ex, name)


class PrefetchMap:
  """One pipeline operand's map over scalar-prefetch tables (module docstring): `evaluate` runs a step
  on the core, recorded, while nothing is settled; `settle` then finds every step's offsets;
  `charge(step)` is a later step's evaluation (its charges, its offsets)."""
  __slots__ = ("points", "tape", "rows", "template", "load", "scalar_ops", "tried")

  def __init__(self, points):
    self.points = points
    self.reset()

  def reset(self) -> None:
    """Before a run (a parked pipeline's tables are refilled by its next launch): nothing settled."""
    self.tape = self.rows = self.template = None
    self.tried = False

  def evaluate(self, m, point, index_args):
    """The map at `point` on the current core (charged as always), recorded once."""
    if self.tried:
      return m.index_map(*point, *index_args)
    ex = executor.current()
    rec = _Recording(ex)
    token = executor.set_current(rec)
    try:
      idx = m.index_map(*point, *index_args)
    finally:
      executor.reset_current(token)
    self.tape = None if rec.other else rec.tape
    return idx

  def settle(self, op, step: int, offsets, index_args, vectorised) -> None:
    """After the recorded step's `offsets`: every step's offsets by `vectorised(op, points, 1, tables)`
    (block_offsets._vectorised_offsets) and the charges of each, when they reproduce that step."""
    self.tried = True
    tape, self.tape = self.tape, None
    if tape is None or not all(isinstance(a, Ref) for a in index_args):
      return
    reads: list = []
    n = len(self.points)
    try:
      rows = vectorised(op, self.points, 1, tuple(_Table(a, reads, n) for a in index_args))
    except _NotTabular:
      return
    if rows is None or rows[step] != offsets:
      return
    template, k = [], 0
    for entry in tape:
      if type(entry) is int:
        template.append(entry)
        continue
      if k >= len(reads):
        return
      buf, index, cols = reads[k]
      k += 1
      if buf is not entry[0] or (index if cols is None else tuple([c[step] for c in cols])) != entry[1]:
        return
      template.append((buf, index, cols))
    if k != len(reads):
      return
    ex = executor.current()
    self.load, self.scalar_ops = ex.load, ex.scalar_ops
    self.rows, self.template = rows, tuple(template)

  def charge(self, step: int):
    """Step `step`'s offsets, its evaluation's charges made on the core in their order."""
    load, scalar_ops = self.load, self.scalar_ops
    for e in self.template:
      if type(e) is int:
        scalar_ops(e)
        continue
      buf, index, cols = e
      load(buf, index if cols is None else tuple([c[step] for c in cols]), ())
    return self.rows[step]
