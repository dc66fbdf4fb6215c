"""A kernel's repeated scalar arithmetic is computed once, as Mosaic compiles it (palace.jax, session 34).

JAX traces a kernel's Python as written: a loop that builds 16 copy descriptors with
`buf.at[(i % 2) * k + j]` puts 16 copies of `i % 2` (a remainder and its sign fix-up) in the jaxpr,
and palace evaluates a jaxpr equation by equation, charging each scalar equation a scalar cycle. Mosaic
canonicalises the kernel with MLIR's common-subexpression elimination first, so the chip computes
`i % 2` once: measured, a burst of 16 copies into `buf.at[(i % 2) * k + j]` costs the chip what the
same burst into `buf.at[j]` does (`issue_form`: isf_4KiB_k16_x128_dslot 59.6 us against 59.4 for
_2sem; palace charged +48% before this pass).

`scalar_cse(jaxpr)` replaces every pure scalar equation that repeats an earlier one of the same jaxpr
(the same primitive, parameters and operands) by the earlier one's result: arithmetic, comparisons,
selects and conversions on 0-d operands, `program_id` / `num_programs`, and a nested `jit` of such
arithmetic with no effects (jnp's `%` is one: jit[name=remainder]). Loads (a scalar read from
SMEM may see a store in between), random bits, anything with effects and any other equation with a
sub-jaxpr (a cond, a loop) stay. One jaxpr at a time: a branch or loop body is its own scope (as palace compiles it). Tests:
tests/jax_backend/test_scalar_cse.py.
"""
from __future__ import annotations

# Pure primitives whose 0-d equations Mosaic's CSE merges (names as JAX 0.12 binds them)
_PURE = frozenset((
    "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign", "and", "or", "not", "xor",
    "eq", "ne", "lt", "le", "gt", "ge", "select_n", "convert_element_type", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "integer_pow", "clamp", "program_id",
    "num_programs", "floor_divide",
    "jit"))   # (a nested jit of scalar arithmetic: `i % 2` traces as jit[name=remainder])


def _scalar(v) -> bool:
  shape = getattr(getattr(v, "aval", None), "shape", None)
  return shape == ()


def _key(eqn, literal):
  """A hashable key of a pure scalar equation (its primitive, parameters and operands), or None."""
  if eqn.primitive.name not in _PURE or eqn.effects or len(eqn.outvars) != 1:
    return None
  if eqn.primitive.name == "jit" and eqn.params["jaxpr"].effects:
    return None
  if not _scalar(eqn.outvars[0]) or not all(_scalar(v) for v in eqn.invars):
    return None
  ops = []
  for v in eqn.invars:
    if type(v) is literal:
      ops.append(("lit", repr(v.val), str(v.aval)))
    else:
      ops.append(v)
  try:
    params = tuple(sorted((k, v) for k, v in eqn.params.items()))
    hash(params)
  except TypeError:
    return None
  return eqn.primitive, params, tuple(ops)


def scalar_cse(jaxpr):
  """`jaxpr` with its repeated pure scalar equations merged (module docstring), or `jaxpr` itself."""
  from jax._src import core as jax_core  # noqa: PLC0415
  literal = jax_core.Literal
  seen, subst, eqns = {}, {}, []
  for e in jaxpr.eqns:
    if subst and any(type(v) is not literal and v in subst for v in e.invars):
      e = e.replace(invars=[subst.get(v, v) if type(v) is not literal else v for v in e.invars])
    key = _key(e, literal)
    if key is not None and type(e.outvars[0]) is not jax_core.DropVar:
      first = seen.get(key)
      if first is not None and first.aval == e.outvars[0].aval:
        subst[e.outvars[0]] = first
        continue
      seen[key] = e.outvars[0]
    eqns.append(e)
  if not subst:
    return jaxpr
  outvars = [subst.get(v, v) if type(v) is not literal else v for v in jaxpr.outvars]
  return jax_core.Jaxpr(jaxpr.constvars, jaxpr.invars, outvars, eqns, debug_info=jaxpr.debug_info,
                        consts=jaxpr.consts or None)
