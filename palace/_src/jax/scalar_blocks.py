"""Fused runs of scalar integer equations in a compiled jaxpr (palace.jax).

A kernel that traces JAX's own `pltpu.emit_pipeline` evaluates some 1400 0-d int32/uint32/bool
equations per launch (block indices, slot counters, "is this the first/last step" predicates, the
selects and converts of the scans and conds around them). Each one through its rule is a palace
scalar op: an `Array` made from a NumPy scalar and one `scalar_op` charge. `interpret.program`
generates every maximal straight-line run of such equations (`runs`) as one code block (`emit`):

- a guard: the kernel's executor is there and every operand from outside the run is a 0-d palace
  Array of its dtype with data or a NumPy scalar of its dtype (a scan's constant initial carry,
  which palace's ops take as a constant ready at cycle 0), or comes from an earlier run of the same
  program that took its fused form (its flag). Otherwise the equations' own statements run, exactly
  as without fusion (host values in index maps, timing-only values, ...);
- the run's scalar-unit charges at once (the core's `scalar_ops(n)`, which the language's
  `scalar_unit()` hands out: n scalar_op calls);
- every value computed as a Python int (wrapped to its dtype; a bool as True/False or 0/1), the
  ones nothing reads only charged;
- a palace Array only for a value read after the run, ready at max(the clock after its equation's
  charge, the ready cycles of the outside operands it depends on): the cycle each op's scalar_op
  gives it (an op's result is ready at max(clock, its operands' ready), and the clock only grows).
  When none of those operands is ready after the clock (the usual case, one test per run) that is
  the clock alone. An equation whose rule returns its operand (a convert to its own dtype) makes no
  charge and no new Array, as its rule.

Which equations fuse, and how, is their registry entry's `scalar` (registry.py), one of the fused
forms below. Their semantics on Python ints are palace's: lax.div / lax.rem are numpy_elementwise's
`div_ints` / `rem_ints` (the 0-d forms of palace's own int_div / int_rem), and
tests/jax_backend/test_scalar_blocks.py checks every form against the unfused rule on edge values
(results, dtypes, ready cycles, the clock) and against JAX's interpret mode.
"""
from __future__ import annotations

import numpy as np

from palace._src.jax.registry import RULES, literal
from palace._src.lang.numpy_elementwise import div_ints, rem_ints
from palace._src.lang.primitives import scalar_unit

_I32, _U32, _BOOL = np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.bool_)
DTYPES = (_I32, _U32, _BOOL)   # the dtypes of fused values
INTS = (_I32, _U32)
_DTYPE_NAMES = {_I32: "_sb_int32", _U32: "_sb_uint32", _BOOL: "_sb_bool"}
_SCALAR_NAMES = {_I32: "_sb_i32", _U32: "_sb_u32", _BOOL: "_sb_np_bool"}   # NumPy scalar types
_MAKE = {_I32: "_sb_i32({})", _U32: "_sb_u32({})", _BOOL: "_sb_bools[{}]"}   # Python value -> data
MIN_EQUATIONS = 2   # a lone scalar equation keeps its rule (numpy_elementwise.on_scalars & co.)

# names the generated code uses (merged into the program's namespace)
NAMESPACE = {"_sb_scalar_unit": scalar_unit, "_sb_div": div_ints, "_sb_rem": rem_ints,
             "_sb_i32": np.int32, "_sb_u32": np.uint32, "_sb_np_bool": np.bool_,
             "_sb_bools": (np.False_, np.True_),
             **{n: d for d, n in _DTYPE_NAMES.items()}}


def _wrap(expr: str, d: np.dtype) -> str:
  """`expr` (a Python int) wrapped to the integer dtype `d`, as NumPy's and XLA's arithmetic wraps."""
  bits = d.itemsize * 8
  if d.kind == "u":
    return f"(({expr}) & {(1 << bits) - 1})"
  half = 1 << (bits - 1)
  return f"(((({expr}) + {half}) & {(1 << bits) - 1}) - {half})"


class Op:
  """How one equation is fused: `charges` scalar_op calls its rule makes (0: the rule returns its
  operand itself), `source(*operand expressions)` its value's expression (None with 0 charges)."""
  __slots__ = ("charges", "source")

  def __init__(self, charges: int, source):
    self.charges, self.source = charges, source


# ---- the fused forms a registry entry's `scalar` names (registry.py): each is
# fn(eqn, operand dtypes, result dtype) -> Op | None, called only on 0-d int32/uint32/bool equations
def same_dtype(allowed, build, arity: int = 2, result: str = "same"):
  """An op on `arity` operands of one dtype among `allowed` (INTS or DTYPES) whose result has that
  dtype (or bool: result="bool"), fused as the expression `build(dtype)(*operands)`."""
  def fuse(eqn, ins, out):
    d = ins[0]
    if d not in allowed or any(x is not d for x in ins) or len(ins) != arity or \
        out is not (_BOOL if result == "bool" else d):
      return None
    return Op(1, build(d))
  return fuse


def arith(op: str):
  """`a op b` wrapped to the dtype."""
  return lambda d: (lambda a, b: _wrap(f"{a} {op} {b}", d))


def plain(op: str):
  """`a op b` (comparisons, bitwise ops: no wrapping needed)."""
  return lambda d: (lambda a, b: f"({a} {op} {b})")


def negate(d):
  return lambda a: _wrap(f"-{a}", d)


def maximum(d):
  return lambda a, b: f"({a} if {a} >= {b} else {b})"


def minimum(d):
  return lambda a, b: f"({a} if {a} <= {b} else {b})"


def invert(d):
  if d is _BOOL:
    return lambda a: f"(not {a})"
  return lambda a: f"(~{a})" if d.kind == "i" else f"({a} ^ {(1 << d.itemsize * 8) - 1})"


def divide(d):
  """lax.div: palace's int_div on 0-d values (numpy_elementwise.div_ints), wrapped."""
  return lambda a, b: _wrap(f"_sb_div({a}, {b})", d)


def remainder(d):
  """lax.rem: palace's int_rem on 0-d values (numpy_elementwise.rem_ints)."""
  def source(a, b):
    if d.kind == "u" and b.isdigit() and int(b):   # an unsigned literal divisor: Python's % is rem_ints
      return f"({a} % {b})"
    return f"_sb_rem({a}, {b})"
  return source


def select(eqn, ins, out):
  """select_n of a bool predicate and two cases of one dtype (its rule: one where)."""
  if len(ins) == 3 and ins[0] is _BOOL and ins[1] is ins[2] is out:
    return Op(1, lambda p, c0, c1: f"({c1} if {p} else {c0})")
  return None


def clamp(eqn, ins, out):
  """clamp of one int dtype (its rule: maximum, then minimum: two charges)."""
  if len(ins) == 3 and ins[0] is ins[1] is ins[2] is out and out in INTS:
    return Op(2, lambda lo, x, hi: f"min(max({x}, {lo}), {hi})")
  return None


def convert(eqn, ins, out):
  """convert_element_type between int32, uint32 and bool."""
  from jax._src import core as jax_core  # noqa: PLC0415
  src = ins[0]
  if np.dtype(eqn.params["new_dtype"]) is not out:
    return None
  if src is out:   # astype to its own dtype returns the Array itself (a literal would be charged)
    return None if type(eqn.invars[0]) is jax_core.Literal else Op(0, None)
  if out is _BOOL:
    return Op(1, lambda a: f"({a} != 0)")
  if src is _BOOL:
    return Op(1, lambda a: a)
  return Op(1, lambda a: _wrap(a, out))


def _scalar_dtype(var):
  a = var.aval
  if getattr(a, "shape", None) != () or getattr(a, "inner_aval", None) is not None:
    return None
  d = a.dtype
  return d if isinstance(d, np.dtype) and d in DTYPES else None   # (not a key array's type)


def op_of(eqn) -> Op | None:
  """How `eqn` is fused (its registry entry's `scalar`), or None when it is not a fusable scalar
  equation."""
  if eqn.primitive.multiple_results or len(eqn.outvars) != 1:
    return None
  ins = [_scalar_dtype(v) for v in eqn.invars]
  out = _scalar_dtype(eqn.outvars[0])
  if out is None or None in ins or not ins:
    return None
  entry = RULES.get(eqn.primitive.name)
  fuse = None if entry is None else entry.scalar
  return None if fuse is None else fuse(eqn, ins, out)


def runs(eqns) -> list:
  """[(start, stop, ops)]: the maximal runs eqns[start:stop] of fusable equations worth fusing."""
  out, start, ops = [], None, []
  for k, eqn in enumerate([*eqns, None]):
    op = None if eqn is None else op_of(eqn)
    if op is not None:
      if start is None:
        start, ops = k, []
      ops.append(op)
      continue
    if start is not None and k - start >= MIN_EQUATIONS and sum(o.charges for o in ops):
      out.append((start, k, ops))
    start = None
  return out


def _literal_source(var) -> str:
  v = literal(var)
  return repr(bool(v)) if np.dtype(v.dtype) is _BOOL else repr(int(v))


def emit(eqns, ops, name, read_later, known: dict, flag: str) -> tuple:
  """One run's fused form: (guard expression, statements). `name(var)` is the program's local of a
  variable, `read_later(var)` whether anything after the run reads it. `known` maps each variable
  whose Python value (`<local>_i`) an earlier run's fused form holds to (that run's flag, the
  leaves its value depends on); it is updated with this run's (whose fused form sets `flag`).

  Leaves are operands from outside all fused runs, held with their ready cycle (`<local>_r`; 0 for
  a NumPy scalar, which palace's ops take as a constant). A value's ready cycle is max(the clock
  after its equation, its leaves' ready cycles): an earlier run's result was ready at a clock this
  run's exceeds, or at one of its own leaves' ready cycles."""
  from jax._src import core as jax_core  # noqa: PLC0415
  produced = {}   # var -> (position: charges up to its equation, or 0; leaves; source; the Array it is)
  new_leaves, array_only, lines, pos = [], set(), [], 0
  flags, checks = set(), []
  for eqn, op in zip(eqns, ops):
    srcs, cone = [], set()
    for v in eqn.invars:
      if type(v) is jax_core.Literal:
        srcs.append(_literal_source(v))
        continue
      if v in produced:
        cone |= produced[v][1]
      elif v in known:
        flags.add(known[v][0])
        cone |= known[v][1]
        if op.charges == 0 and known[v][1] == {v} and f"type({name(v)}) is Array" not in checks:
          checks.append(f"type({name(v)}) is Array")   # (an earlier run's leaf may be NumPy)
      else:
        if v not in new_leaves:
          new_leaves.append(v)
        cone.add(v)
      if op.charges == 0:
        array_only.add(v)   # (the rule returns an Array operand itself, a NumPy one charged)
      srcs.append(f"{name(v)}_i")
    pos += op.charges
    out = eqn.outvars[0]
    if op.charges == 0:   # the operand itself: its position and leaves too
      v = eqn.invars[0]
      if v in produced:
        p, c, _, same = produced[v]
        produced[out] = (p, c, srcs[0], same)
      else:
        produced[out] = (0, frozenset(cone), srcs[0], v)
    else:
      produced[out] = (pos, frozenset(cone), op.source(*srcs), None)
  later = [v for v in produced if read_later(v)]
  # values: those read later and what they are computed from (dead ones are only charged)
  live, stack = set(), list(later)
  operands = {eqn.outvars[0]: [v for v in eqn.invars if type(v) is not jax_core.Literal]
              for eqn in eqns}
  while stack:
    v = stack.pop()
    if v in produced and v not in live:
      live.add(v)
      stack.extend(operands[v])
  guard = (sorted(flags) or ["_ex is not None"]) + checks
  for v in new_leaves:
    n, d = name(v), _scalar_dtype(v)
    dn = _DTYPE_NAMES[d]
    array = (f"type({n}) is Array and {n}.dtype is {dn} and not {n}.shape and "
             f"({n}_d := {n}._data) is not None and {n}_d.dtype is {dn} and ({n}_r := {n}._ready) >= 0")
    guard.append(array if v in array_only else
                 f"({array} or type({n}) is {_SCALAR_NAMES[d]} and ({n}_d := {n}) is not None and "
                 f"not ({n}_r := 0))")
    lines.append(f"{n}_i = int({n}_d)")
  lines.append(f"_t, _c = _ex({pos})")
  for eqn in eqns:
    v = eqn.outvars[0]
    if v in live:
      lines.append(f"{name(v)}_i = {produced[v][2]}")
  made = {}   # var -> (the general form's statements, the form's when no leaf is ready after _t)
  for v in later:
    p, cone, _, same = produced[v]
    n, d = name(v), _scalar_dtype(v)
    if same is not None:   # an Array from before the run itself
      made[v] = ([f"{n} = {name(same)}"], [f"{n} = {name(same)}"])
    else:
      array = f"{n} = Array({_MAKE[d].format(f'{n}_i')}, (), {_DTYPE_NAMES[d]}, {{}})"
      clock = f"_t + {p} * _c" if p != 1 else "_t + _c"
      late = [f"{n}_r = {clock}",
              *(f"if {name(e)}_r > {n}_r: {n}_r = {name(e)}_r" for e in sorted(cone, key=name)),
              array.format(f"{n}_r")]
      made[v] = (late, [array.format(clock)])
    known[v] = (flag, cone)
  for v in new_leaves:
    known[v] = (flag, frozenset((v,)))
  leaves = sorted({e for v in later if produced[v][3] is None for e in produced[v][1]}, key=name)
  if leaves:
    lines.append(f"if {' or '.join(f'{name(e)}_r > _t' for e in leaves)}:")
    lines.extend(f"  {line}" for v in later for line in made[v][0])
    lines.append("else:")
  lines.extend(f"  {line}" if leaves else line for v in later for line in made[v][1])
  return " and ".join(guard), lines
