"""Evaluate a kernel's jaxpr with palace's language ops (one Python call per jaxpr equation).

Values are whatever palace's ops produce (palace Arrays inside a kernel, NumPy scalars/arrays in
index maps) and refs are palace Refs, so timing, hardware checks, race detection and palace's fast
paths apply exactly as for a kernel written against palace directly.

Rules live in `rules_lax.py` (jax.lax primitives), `rules_state.py` (ref reads/writes and their
indexers, Pallas and Mosaic-TPU primitives) and `rules_control.py` (cond, loops, calls, run_scoped).
A rule is `fn(eqn, *invals) -> value` (or a list of values for multi-result primitives); it reads
static parameters from `eqn.params`. A primitive without a rule, or a parameter value a rule does not
cover, raises UnsupportedError naming the primitive and the kernel line from the eqn's source info.
"""
from __future__ import annotations

import contextvars
import os
import weakref

import numpy as np

from palace._src.errors import PalaceError, UnsupportedError
from palace._src.lang.array import Array

RULES: dict = {}
_USED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # jaxpr -> vars it reads (a cache)
# the palace grid axes the kernel's program_id / num_programs axes name (None: the same); a vmapped
# pallas_call has extra leading grid axes its kernel does not see
grid_axes: contextvars.ContextVar = contextvars.ContextVar("palace_jax_grid_axes", default=None)
_used_here: contextvars.ContextVar = contextvars.ContextVar("palace_jax_used_vars", default=None)


def used_vars(jaxpr) -> frozenset:
  """The variables `jaxpr` reads (equation operands and outputs); cached per jaxpr."""
  hit = _USED.get(jaxpr)
  if hit is None:
    from jax._src import core as jax_core  # noqa: PLC0415
    hit = frozenset(v for e in jaxpr.eqns for v in e.invars if not isinstance(v, jax_core.Literal)) | \
        frozenset(v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal))
    _USED[jaxpr] = hit
  return hit


def result_unused(eqn) -> bool:
  """True when nothing reads `eqn`'s first result (a swap whose old value is dropped: no load)."""
  used = _used_here.get()
  return used is not None and eqn.outvars[0] not in used


def rule(*names):
  """Register `fn` as the rule of the primitives `names`."""
  def register(fn):
    for n in names:
      RULES[n] = fn
    return fn
  return register


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


def unsupported(eqn, what: str = "", fix: str = "", outer=()) -> UnsupportedError:
  """The error for an uncovered primitive or parameter of `eqn` (`outer`: the enclosing equations)."""
  name = eqn.primitive.name
  detail = f" with {what}" if what else ""
  return UnsupportedError(
      f"palace.jax: primitive '{name}'{detail} (kernel line {source_line(eqn, outer)}) is not covered by "
      f"palace's jaxpr interpreter yet." + (f" {fix}" if fix else
      " Rewrite that line with covered operations, or run this kernel with JAX's interpret mode."))


def sub_jaxprs(eqn):
  from jax._src import core as jax_core  # noqa: PLC0415
  for v in eqn.params.values():
    for x in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(x, jax_core.Jaxpr):  # JAX 0.12: one Jaxpr type, consts attached to constvars
        yield x


def check_covered(jaxpr, outer=()) -> None:
  """Raise UnsupportedError for the first equation (in any sub-jaxpr) that has no rule."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name not in RULES:
      raise unsupported(eqn, outer=outer)
    for sub in sub_jaxprs(eqn):
      check_covered(sub, (*outer, eqn))


def literal(v):
  """A jaxpr literal as a NumPy value of its aval's dtype (weak Python scalars keep JAX's type)."""
  aval = v.aval
  return np.asarray(v.val, dtype=aval.dtype) if aval.shape else np.dtype(aval.dtype).type(v.val)


def eval_jaxpr(jaxpr, consts, *args) -> list:
  """Run `jaxpr` (a core.Jaxpr) on palace values; returns the list of its outputs."""
  from jax._src import core as jax_core  # noqa: PLC0415
  Literal = jax_core.Literal
  env = {}
  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x if isinstance(x, (int, float, bool, np.ndarray, np.generic)) or hasattr(x, "_ready") \
        or not hasattr(x, "__array__") else np.asarray(x)  # captured jax.Arrays become NumPy
  if len(args) != len(jaxpr.invars):
    raise UnsupportedError(f"palace.jax: a jaxpr with {len(jaxpr.invars)} inputs got {len(args)} values.")
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  token = _used_here.set(used_vars(jaxpr))
  try:
    _run(jaxpr, env, Literal)
  finally:
    _used_here.reset(token)
  return [literal(v) if type(v) is Literal else env[v] for v in jaxpr.outvars]


def _run(jaxpr, env, Literal) -> None:
  for eqn in jaxpr.eqns:
    fn = RULES.get(eqn.primitive.name)
    if fn is None:
      raise unsupported(eqn)
    invals = [literal(v) if type(v) is Literal else env[v] for v in eqn.invars]
    try:
      out = fn(eqn, *invals)
    except PalaceError as e:
      if not getattr(e, "_palace_jax_line", False):
        # the innermost equation names the primitive; the line is the innermost one known (an
        # equation JAX's own library code traced, e.g. emit_pipeline's DMAs, has no user frame: the
        # enclosing equation's line, where the user called that library, is named instead)
        primitive = getattr(e, "_palace_jax_primitive", None) or eqn.primitive.name
        e._palace_jax_primitive = primitive
        line = source_line(eqn)
        if line != "unknown line":
          e._palace_jax_line = True
          e.add_note(f"(in the JAX kernel at {line}, primitive '{primitive}')")
      raise
    if eqn.primitive.multiple_results:
      for v, x in zip(eqn.outvars, out):
        _check_type(eqn, v, x)
        env[v] = x
    else:
      _check_type(eqn, eqn.outvars[0], out)
      env[eqn.outvars[0]] = out


def _check_type(eqn, var, x) -> None:
  """A value must have the shape and dtype JAX typed it with: a palace op that promotes or shapes
  differently from JAX would otherwise compute something else silently."""
  if not isinstance(x, Array):
    # NumPy values: index maps run vectorised over the whole grid (one column per grid axis, int64)
    # outside the kernel, where palace's pipeline falls back to per-step calls on any error
    return
  aval = var.aval
  shape = getattr(aval, "shape", None)
  if shape is None or getattr(aval, "inner_aval", None) is not None:
    return   # refs, tokens
  xd, xs = x.dtype, tuple(x.shape)
  if xs != tuple(shape) or np.dtype(xd) != np.dtype(aval.dtype):
    raise UnsupportedError(
        f"palace.jax: primitive '{eqn.primitive.name}' (kernel line {source_line(eqn)}) gave a "
        f"{np.dtype(xd)}{list(xs)} value where JAX expects {np.dtype(aval.dtype)}{list(shape)}; this "
        f"is a gap in palace's interpreter rule for it (please report), not an error in the kernel.")


def eval_closed(jaxpr, *args) -> list:
  """Run a jaxpr with its attached consts (JAX 0.12's closed jaxprs)."""
  return eval_jaxpr(jaxpr, jaxpr.consts, *args)


def shape_of(x) -> tuple:
  return tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)

