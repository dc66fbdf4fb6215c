"""Evaluate a kernel's jaxpr with palace's language ops (one Python call per jaxpr equation).

Values are whatever palace's ops produce (palace Arrays inside a kernel, NumPy scalars/arrays in
index maps) and refs are palace Refs, so timing, hardware checks, race detection and palace's fast
paths apply exactly as for a kernel written against palace directly.

How a primitive evaluates is its registry entry's `evaluate` (registry.py; the entries are in
`rules_lax.py` (jax.lax primitives), `rules_state.py` (ref reads/writes and their indexers, Pallas
and Mosaic-TPU primitives) and `rules_control.py` (cond, loops, calls, run_scoped)): `fn(eqn,
*invals) -> value` (or a list of values for multi-result primitives), reading static parameters from
`eqn.params`, or for hot primitives a compiling rule, `make(eqn) -> fn(*invals)`: each jaxpr is
compiled once (`program`) into one generated function of closure calls on local variables, so a
kernel step pays one closure call per equation, not a dict lookup plus parameter parsing. Runs of 0-d int/bool
equations (index arithmetic) are generated as one block on Python ints instead, with the
equations' calls as its fallback (`scalar_blocks.py`). A primitive without a rule, or a parameter
value a rule does not cover, raises UnsupportedError naming the primitive and the kernel line from
the eqn's source info.
"""
from __future__ import annotations

import contextvars
import functools
import os
import re
import weakref

import numpy as np

from palace._src.errors import PalaceError, UnsupportedError
from palace._src.jax import compiler_errors, scalar_blocks
from palace._src.jax.avals import physical
from palace._src.jax.registry import RULES, literal, sub_jaxprs
from palace._src.jax.scalar_cse import scalar_cse
from palace._src.jax.wait_sources import wait_sources_dropped
from palace._src.lang import tpu_primitives
from palace._src.lang.array import Array

_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # jaxpr -> its _Program (a cache)
# the palace grid axes the kernel's program_id / num_programs axes name (None: the same); a vmapped
# pallas_call has extra leading grid axes its kernel does not see
grid_axes: contextvars.ContextVar = contextvars.ContextVar("palace_jax_grid_axes", default=None)
_used_here: contextvars.ContextVar = contextvars.ContextVar("palace_jax_used_vars", default=None)


def used_vars(jaxpr) -> frozenset:
  """The variables `jaxpr` reads (equation operands and outputs)."""
  from jax._src import core as jax_core  # noqa: PLC0415
  return frozenset(v for e in jaxpr.eqns for v in e.invars if not isinstance(v, jax_core.Literal)) | \
      frozenset(v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal))


def result_unused(eqn) -> bool:
  """True when nothing reads `eqn`'s first result (a swap whose old value is dropped: no load).
  Answered while the enclosing jaxpr is compiled, i.e. from a compiling rule's outer function."""
  used = _used_here.get()
  return used is not None and eqn.outvars[0] not in used


def source_line(eqn, outer=()) -> str:
  """`file.py:LINE (function)` of the user code that created `eqn`, or, for an equation inside a
  library's jitted helper (jnp functions trace their body once, without the user's frames), that of
  the innermost enclosing equation in `outer` that has one; else 'unknown line'."""
  from jax._src import source_info_util  # noqa: PLC0415
  for e in (eqn, *reversed(outer)):
    frame = source_info_util.user_frame(e.source_info.traceback)
    if frame is not None:
      return f"{os.path.basename(frame.file_name)}:{frame.start_line} ({frame.function_name})"
  return "unknown line"


def user_site_of(eqn):
  """(file, line) of the user code that created `eqn`, as `util.user_site()` gives inside palace's
  own kernels (for DMA records and messages), or None when the equation has no user frame (JAX's
  library code, e.g. emit_pipeline's DMAs: the machine's site, i.e. the launch's `fixed_site`)."""
  from jax._src import source_info_util  # noqa: PLC0415
  frame = source_info_util.user_frame(eqn.source_info.traceback)
  return None if frame is None else (frame.file_name, frame.start_line)


def kernel_site(jaxpr):
  """(file, line) of the kernel function a launch's jaxpr was traced from (its debug info: 'kernel
  at FILE:LINE'), or None."""
  src = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None) or ""
  m = re.fullmatch(r".* at (.+):(\d+)", src)
  return (m.group(1), int(m.group(2))) if m else None


def unsupported(eqn, what: str = "", fix: str = "", outer=()) -> UnsupportedError:
  """The error for an uncovered primitive or parameter of `eqn` (`outer`: the enclosing equations)."""
  name = eqn.primitive.name
  detail = f" with {what}" if what else ""
  return UnsupportedError(
      f"palace.jax: primitive '{name}'{detail} (kernel line {source_line(eqn, outer)}) is not covered by "
      f"palace's jaxpr interpreter yet. Fix: " + (fix or "rewrite that line with covered operations, or "
                                                   "run this kernel with JAX's interpret mode."))


def check_covered(jaxpr, outer=(), sparsecore: bool = False) -> None:
  """Raise UnsupportedError for the first equation (in any sub-jaxpr) that has no rule, and the
  error of the first one whose entry `rejects` it (registry.py; `sparsecore`: the kernel runs on a
  SparseCore subcore), a refusal of what the TPU compiler rejects as JAX's Mosaic error type too
  (compiler_errors.py)."""
  for eqn in jaxpr.eqns:
    entry = RULES.get(eqn.primitive.name)
    if entry is None:
      raise unsupported(eqn, outer=outer)
    if entry.rejects is not None:
      try:
        entry.rejects(eqn, sparsecore)
      except PalaceError as e:
        _annotate(e, eqn)
        error = compiler_errors.as_jax_error(e)
        if error is e:
          raise
        raise error from None
    for sub in sub_jaxprs(eqn):
      check_covered(sub, (*outer, eqn), sparsecore)


class _Program:
  """A jaxpr compiled for evaluation: `run(consts, args) -> outputs`, one generated Python function
  whose locals are the jaxpr's variables and whose statements are its equations, each a call of its
  rule's closure followed by the check of the result types JAX gave (`_source`)."""
  __slots__ = ("run", "n_in", "__weakref__")


def _expected(var):
  """(shape, dtype) JAX typed `var` with, or None for refs and tokens (not checked)."""
  aval = var.aval
  shape = getattr(aval, "shape", None)
  if shape is None or getattr(aval, "inner_aval", None) is not None:
    return None
  aval = physical(aval)   # (a key array: its key data)
  return tuple(aval.shape), np.dtype(aval.dtype)


def _failing(error):
  def fail(*_):
    raise error
  return fail


# generated programs' file name: inside palace's tree, so util.user_site and user_frame_summary
# look past their frames as they do past palace's own
_PROGRAM_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "<jaxpr program>")


def program(jaxpr) -> _Program:
  """`jaxpr` compiled once (cached per jaxpr): every equation's rule resolved and its static
  parameters parsed up front, then the whole jaxpr generated as one Python function, so an
  evaluation is one closure call per equation on local variables (no per-equation dispatch), and
  a run of scalar int/bool equations one block of Python int arithmetic (`scalar_blocks`)."""
  prog = _PROGRAMS.get(jaxpr)
  if prog is not None:
    return prog
  from jax._src import core as jax_core  # noqa: PLC0415
  key, jaxpr = jaxpr, scalar_cse(wait_sources_dropped(scope_empty_refs(jaxpr)))
  Literal = jax_core.Literal
  names, ns = {}, {"_consts": _consts, "_wrong_type": _wrong_type, "_annotate": _annotate,
                   "Array": Array, "PalaceError": PalaceError, "isinstance": isinstance}

  def name(v):
    if type(v) is Literal:
      k = f"k{len(ns)}"
      ns[k] = literal(v)
      return k
    n = names.get(v)
    if n is None:
      n = names[v] = f"v{len(names)}"
    return n

  consts = [name(v) for v in jaxpr.constvars]
  ins = [name(v) for v in jaxpr.invars]
  body, eqn_at = [], {}   # generated statements; line number -> the equation its call evaluates
  eqns = jaxpr.eqns
  token = _used_here.set(used_vars(jaxpr))
  try:
    def statements(k, eqn, indent=""):
      entry = RULES.get(eqn.primitive.name)
      if entry is None:
        fn = _failing(unsupported(eqn))
      elif entry.compiles:
        try:
          fn = entry.evaluate(eqn)
        except UnsupportedError as e:  # raised if and when the equation is evaluated, as before
          fn = _failing(e)
      else:
        fn = functools.partial(entry.evaluate, eqn)
      ns[f"f{k}"], ns[f"e{k}"] = fn, eqn
      call = f"f{k}({', '.join(name(v) for v in eqn.invars)})"
      outs = [name(v) for v in eqn.outvars]
      if eqn.primitive.multiple_results:
        call = f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}" if outs else call
      else:
        call = f"{outs[0]} = {call}"
      eqn_at[len(body) + 4] = eqn   # (after the function's lines def, unpacking, try)
      body.append(indent + call)
      for j, (v, out) in enumerate(zip(eqn.outvars, outs)):
        c = _expected(v)
        if c is not None:   # (the shape and dtype apart: no indexing of the pair per evaluation)
          ns[f"c{k}_{j}"], ns[f"s{k}_{j}"], ns[f"d{k}_{j}"] = c, c[0], c[1]
          body.append(f"{indent}if isinstance({out}, Array) and ({out}.shape != s{k}_{j} or "
                      f"{out}.dtype != d{k}_{j}): _wrong_type(e{k}, {out}, c{k}_{j})")

    # runs of scalar int/bool equations: one fused block each, the statements above as its fallback
    runs = {start: (stop, ops) for start, stop, ops in scalar_blocks.runs(eqns)}
    last_read = {}   # var -> the last equation that reads it (len(eqns): an output)
    for k, eqn in enumerate(eqns):
      for v in eqn.invars:
        if type(v) is not Literal:
          last_read[v] = k
    last_read.update((v, len(eqns)) for v in jaxpr.outvars if type(v) is not Literal)
    known: dict = {}
    k = 0
    while k < len(eqns):
      if k not in runs:
        statements(k, eqns[k])
        k += 1
        continue
      stop, ops = runs[k]
      guard, fused = scalar_blocks.emit(eqns[k:stop], ops, name,
                                        lambda v, stop=stop: last_read.get(v, -1) >= stop, known, f"_ok{k}")
      body.extend([f"if {guard}:", *(f"  {line}" for line in fused), f"  _ok{k} = True", "else:"])
      for j in range(k, stop):
        statements(j, eqns[j], "  ")
      body.append(f"  _ok{k} = False")
      k = stop
  finally:
    _used_here.reset(token)
  if runs:
    ns.update(scalar_blocks.NAMESPACE)
  outs = [name(v) for v in jaxpr.outvars]
  unpack = [f"{', '.join(ins)}, = args" if ins else "pass"]
  if consts:   # (missing consts are None)
    unpack.append(f"{', '.join(consts)}, = _consts(consts, {len(consts)})")
  if runs:
    unpack.append("_ex = _sb_scalar_unit()")   # (the core's scalar_ops, None outside a kernel)
  src = "\n".join([f"def run(consts, args):\n  {'; '.join(unpack)}\n  try:",
                   *(f"    {line}" for line in body or ["pass"]),
                   "  except PalaceError as e:",
                   "    _annotate(e, _eqn_at.get(e.__traceback__.tb_lineno))",
                   "    raise",
                   f"  return [{', '.join(outs)}]"])
  ns["_eqn_at"] = eqn_at
  exec(_code(src), ns)  # noqa: S102  (generated from the jaxpr above)
  prog = _Program()
  prog.run, prog.n_in = ns["run"], len(ins)
  _PROGRAMS[key] = prog
  return prog


# generated source -> its code object. The source names every value through the namespace (rules,
# literals, expected types), so kernels that differ only in shapes, dtypes or constants generate the
# same text: JAX's tests that launch one kernel at 200 shapes compiled it 200 times (~1 ms a
# program, 30 programs a launch of an emit_pipeline matmul). Bounded: first in, first out.
_CODE: dict = {}
_CODE_LIMIT = 4096


def _code(src: str):
  code = _CODE.get(src)
  if code is None:
    if len(_CODE) >= _CODE_LIMIT:
      _CODE.pop(next(iter(_CODE), None), None)
    code = _CODE[src] = compile(src, _PROGRAM_FILE, "exec")
  return code


def scope_empty_refs(jaxpr):
  """`jaxpr` with its first `jax.empty_ref` equation and every equation after it made one
  `run_scoped` equation allocating that ref for them: Mosaic allocates an empty ref for the rest of
  the region (block) it is made in, and run_scoped is palace's one scoped allocation. Later
  empty_refs are rewritten when the nested body is compiled."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from jax._src import linear_util as lu  # noqa: PLC0415
  from jax._src.pallas import primitives as pallas_primitives  # noqa: PLC0415
  at = next((k for k, e in enumerate(jaxpr.eqns) if e.primitive is jax_core.empty_ref_p), None)
  if at is None:
    return jaxpr
  alloc, rest = jaxpr.eqns[at], jaxpr.eqns[at + 1:]
  ref = alloc.outvars[0]
  defined = {ref, *(v for e in rest for v in e.outvars)}
  free = []   # the outer variables the rest reads: the scoped body's constvars, in first-use order
  for v in [*(v for e in rest for v in e.invars), *jaxpr.outvars]:
    if type(v) is not jax_core.Literal and v not in defined and v not in free:
      free.append(v)
  # (as JAX's run_scoped bodies: the closed-over values are constvars with values attached, here
  # placeholders; the equation's operands are what the interpreter binds to them)
  info = lu.DebugInfo("palace.jax empty_ref scope", "<empty_ref scope>", ("",), None)
  body = jax_core.Jaxpr(free, [ref], list(jaxpr.outvars), list(rest), debug_info=info,
                        consts=[None] * len(free))
  outs = [jax_core.Var(v.aval) for v in jaxpr.outvars]
  scoped = jax_core.new_jaxpr_eqn(free, outs, pallas_primitives.run_scoped_p,
                                  {"jaxpr": body, "collective_axes": ()}, jax_core.no_effects,
                                  alloc.source_info)
  return jax_core.Jaxpr(jaxpr.constvars, jaxpr.invars, outs, [*jaxpr.eqns[:at], scoped],
                        debug_info=jaxpr.debug_info, consts=jaxpr.consts or None)


def _const(x):
  # captured jax.Arrays become NumPy; palace values and NumPy values stay as they are
  return x if isinstance(x, (int, float, bool, np.ndarray, np.generic)) or hasattr(x, "_ready") \
      or not hasattr(x, "__array__") else np.asarray(x)


def _consts(consts, n: int) -> list:
  out = [_const(x) for x in consts[:n]]
  return out + [None] * (n - len(out))


def _annotate(e, eqn) -> None:
  """Name the kernel line and primitive of the equation `eqn` whose evaluation raised `e` (None:
  the error came from a result check, which names them itself)."""
  if eqn is None or getattr(e, "_palace_jax_line", False):
    return
  # the innermost equation names the primitive; the line is the innermost one known (an equation
  # JAX's own library code traced, e.g. emit_pipeline's DMAs, has no user frame: the enclosing
  # equation's line, where the user called that library, is named instead)
  primitive = getattr(e, "_palace_jax_primitive", None) or eqn.primitive.name
  e._palace_jax_primitive = primitive
  line = source_line(eqn)
  if line != "unknown line":
    e._palace_jax_line = True
    e.add_note(f"(in the JAX kernel at {line}, primitive '{primitive}')")


def run_program(prog: _Program, consts, args) -> list:
  """Evaluate a compiled jaxpr on palace values; returns the list of its outputs."""
  if len(args) != prog.n_in:
    raise UnsupportedError(f"palace.jax: a jaxpr with {prog.n_in} inputs got {len(args)} "
                           f"values.")
  return prog.run(consts, args)


def traced(fn_of):
  """A compiling registry entry for a primitive Mosaic lowers through `lower_fun` (the JAX function
  its TPU lowering traces in its place): `fn_of(eqn)` gives that function, traced once per equation
  on the equation's operand types; its jaxpr then runs on palace's interpreter, so the primitive
  computes exactly what that function computes, with every op in it charged as in a kernel."""
  def make(eqn):
    import jax  # noqa: PLC0415
    structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    closed = jax.make_jaxpr(fn_of(eqn))(*structs)
    prog, consts = program(closed.jaxpr), closed.consts
    # (Mosaic's integers are signless: a result of the other signedness, e.g. the pallas_tpu key's
    # int32 random bits for a uint32 random_bits, is the same bits, as a same-width bitcast)
    casts = [None if np.dtype(physical(got).dtype) == np.dtype(physical(v.aval).dtype) else
             np.dtype(physical(v.aval).dtype) for got, v in zip(closed.out_avals, eqn.outvars)]

    def run(*args):
      outs = run_program(prog, consts, args)
      return [o if c is None else tpu_primitives.bitcast(o, c) if isinstance(o, Array) else
              np.asarray(o).view(c) for o, c in zip(outs, casts)]
    if eqn.primitive.multiple_results:
      return run
    return lambda *args: run(*args)[0]
  return make


def _wrong_type(eqn, x, expected) -> None:
  """A value must have the shape and dtype JAX typed it with: a palace op that promotes or shapes
  differently from JAX would otherwise compute something else silently. (NumPy values are not
  checked: index maps run vectorised over the whole grid, one int64 column per grid axis, outside
  the kernel, where palace's pipeline falls back to per-step calls on any error.)"""
  shape, dtype = expected
  xs, xd = tuple(x.shape), np.dtype(x.dtype)
  if xs == shape and xd == dtype:
    return
  raise UnsupportedError(
      f"palace.jax: primitive '{eqn.primitive.name}' (kernel line {source_line(eqn)}) gave a "
      f"{xd}{list(xs)} value where JAX expects {dtype}{list(shape)}; this "
      f"is a gap in palace's interpreter rule for it (please report), not an error in the kernel.")


def shape_of(x) -> tuple:
  return tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)

