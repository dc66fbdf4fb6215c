"""Does a kernel's schedule depend on its data? A taint analysis of the kernel jaxpr (L5).

palace's timing of a launch is a function of what the kernel asks the machine (which ops, on which
shapes, which copies of which windows, which semaphore counts) and never of the values its vector
ops compute. A kernel whose every such decision is made from static values, grid indices, loop
counters and the contents of a few *keyed* operands (scalar prefetch, SMEM inputs) has one schedule
per value of those operands: a repeated launch with the same keyed bytes gets the same report, so
palace may replay it (sim/replay.py: the data computed by the same language ops on an untimed
executor, the report reused). This module proves that property or names what breaks it.

The analysis is conservative: values loaded from any other ref are *tainted*, taint flows through
every equation, and a tainted value reaching a decision (a `cond` index, a `while` predicate, a ref
index or slice start, a DMA window or semaphore, a semaphore count, a roll shift, a delay) makes the
kernel unreplayable; so does every primitive not classified below (new primitives are never assumed
pure), a read of a semaphore's value (it depends on DMA timing), a remote copy or signal, device or
axis ids, a copy into a keyed ref and a store of loaded data into one (stores of clean values keep it
keyed: its contents stay a function of the key).
"""
from __future__ import annotations

from palace._src.jax.rules_control import CALL_PRIMITIVES, call_jaxpr, scan_counts

# primitives whose outputs depend on their operands' values and whose cost on palace depends only on
# shapes and dtypes (rules_lax, the value forms of rules_state): taint flows through, nothing decides
_DATA = frozenset("""
  abs add add_any and argmax argmin atan atan2 bitcast bitcast_convert_type broadcast_in_dim ceil clamp
  clz concatenate convert_element_type copy copy_p cos cosh cumsum div dot_general eq erf exp exp2
  expand_dims expm1 floor ge gt integer_pow iota is_finite le log log1p logistic lt max min mul
  multiple_of ne neg nextafter not optimization_barrier or population_count pow prng_random_bits
  prng_seed reciprocal reduce_and reduce_max reduce_min reduce_or reduce_precision reduce_prod
  reduce_sum rem reshape rev round rsqrt select_n shift_left shift_right_arithmetic
  shift_right_logical sign sin sinh slice sqrt square squeeze sub tan tanh tile transpose xor
  debug_print debug_callback program_id num_programs
""".split())
# (primitive, how many leading operands are data; the rest decide): a dynamic slice's start may
# change its cost (aligned windows select whole vregs) and a roll's shift its lane movement
_DECIDING_TAIL = {"dynamic_slice": 1, "dynamic_update_slice": 2, "roll": 1, "delay": 0}
_NEVER = {"semaphore_read": "reads a semaphore's value (it depends on when copies land)",
          "get_barrier_semaphore": "uses the barrier semaphore (a multi-device launch)",
          "axis_index": "reads a mesh axis index"}


class _Unreplayable(Exception):
  pass


def _literal(v) -> bool:
  """A jaxpr literal (unhashable in JAX 0.12, and never loaded data)."""
  return type(v).__name__ == "Literal"


def _is_ref(v) -> bool:
  return getattr(getattr(v, "aval", None), "inner_aval", None) is not None


def _split(tree, flat) -> list:
  """An equation's flat operands split by the top-level entries of its operand tree (e.g. a DMA's
  source, destination, semaphores and device id): one list of jaxpr variables per entry."""
  parts, at = [], 0
  for child in tree.children():
    parts.append(list(flat[at:at + child.num_leaves]))
    at += child.num_leaves
  return parts


class _Taint:
  """Per jaxpr variable: tainted values, and the refs whose reads are clean (keyed refs)."""

  def __init__(self, tainted, keyed):
    self.tainted, self.keyed = set(tainted), set(keyed)

  def of(self, v) -> bool:
    return not _literal(v) and v in self.tainted

  def is_keyed(self, v) -> bool:
    return not _literal(v) and v in self.keyed

  def any(self, vs) -> bool:
    return any(self.of(v) for v in vs)

  def decide(self, vs, eqn, what: str) -> None:
    if any(self.of(v) and not _is_ref(v) for v in vs):
      raise _Unreplayable(f"'{eqn.primitive.name}' decides its {what} from loaded data")

  def write(self, ref, eqn, values=None) -> None:
    """A write of `values` (None: data from elsewhere, a copy) into `ref`: a keyed ref stays keyed
    while everything written into it is clean (paged attention keeps counters in its prefetch refs)."""
    if self.is_keyed(ref) and (values is None or self.any(values)):
      raise _Unreplayable(f"'{eqn.primitive.name}' writes loaded data into a keyed (scalar prefetch / "
                          f"SMEM) operand")


def _sub(jaxpr, taint: _Taint, operands) -> list:
  """Analyse `jaxpr` with `operands` (outer variables) bound to its invars; its outputs' taint."""
  inner = _Taint((i for i, o in zip(jaxpr.invars, operands) if taint.of(o)),
                 (i for i, o in zip(jaxpr.invars, operands) if taint.is_keyed(o)))
  _walk(jaxpr, inner)
  return [inner.of(v) for v in jaxpr.outvars]


def _stand_ins(taint, state):
  """Fresh stand-ins for loop carries, tainted where `state` says."""
  names = [object() for _ in state]
  taint.tainted |= {n for n, t in zip(names, state) if t}
  return names


def _loop(taint, body, consts, carry, rest=()) -> list:
  """The taint of `body`'s outputs at the fixpoint of its carries (its operands: `consts`, the
  carries, then the scanned inputs `rest`): a carry is tainted once any iteration may taint it."""
  state = [taint.of(v) for v in carry]
  while True:
    probe = _Taint((v for v in (*consts, *rest) if taint.of(v)), (v for v in consts if taint.is_keyed(v)))
    out = _sub(body, probe, [*consts, *_stand_ins(probe, state), *rest])
    new = [a or b for a, b in zip(state, out)]
    if new == state:   # (a loop may run zero times: its carries keep their initial taint)
      return state + out[len(state):]
    state = new


def _predicate_tainted(taint, cond, consts, state) -> bool:
  probe = _Taint((v for v in consts if taint.of(v)), (v for v in consts if taint.is_keyed(v)))
  return any(_sub(cond, probe, [*consts, *_stand_ins(probe, state)]))


def _eqn(eqn, taint: _Taint) -> list:
  """The taint of `eqn`'s outputs; raises _Unreplayable where it decides from loaded data."""
  name, ins, p = eqn.primitive.name, eqn.invars, eqn.params
  if name in _NEVER:
    raise _Unreplayable(f"the kernel {_NEVER[name]}")
  if name in _DATA:
    return [taint.any(ins)] * len(eqn.outvars)
  if name in _DECIDING_TAIL:
    n = _DECIDING_TAIL[name]
    taint.decide(ins[n:], eqn, "slice start / shift / delay")
    return [taint.any(ins[:n])] * len(eqn.outvars)
  if name in ("get", "swap", "addupdate", "masked_load", "masked_swap"):
    ref = ins[0]
    if name in ("masked_load", "masked_swap"):   # (ref, transforms, mask, other) / (ref, transforms, value, mask)
      parts = _split(p["args_tree"], ins)
      ref = parts[0][0]
      deciding = parts[1] + parts[3 if name == "masked_swap" else 2]
      value = parts[2] if name == "masked_swap" else parts[3]
    else:
      deciding, value = (ins[1:], []) if name == "get" else (ins[2:], [ins[1]])
    taint.decide(deciding, eqn, "ref index (or mask)")
    if name in ("swap", "addupdate", "masked_swap"):
      taint.write(ref, eqn, value)
    loaded = not taint.is_keyed(ref)
    if name == "masked_load":
      loaded = loaded or taint.any(value)
    return [loaded] * len(eqn.outvars)
  if name in ("dma_start", "dma_wait"):   # (source, destination, its semaphore, source semaphore, device)
    parts = _split(p["tree"], ins)
    if parts[4]:
      raise _Unreplayable(f"'{name}' is a remote copy (device_id)")
    if name == "dma_start":
      for v in (v for part in parts[1:4] for v in part):
        taint.write(v, eqn)
    taint.decide(ins, eqn, "copy window or semaphore")
    return [False] * len(eqn.outvars)
  if name in ("semaphore_signal", "semaphore_wait"):   # signal: (ref, transforms, inc, device, core)
    parts = _split(p["args_tree"], ins)
    if name == "semaphore_signal" and (parts[3] or parts[4]):
      raise _Unreplayable("'semaphore_signal' signals another device or core")
    taint.decide(ins, eqn, "semaphore or count")
    return [False] * len(eqn.outvars)
  if name == "cond":
    taint.decide(ins[:1], eqn, "branch")
    outs = [_sub(b, taint, ins[1:]) for b in p["branches"]]
    return [any(col) for col in zip(*outs)]
  if name == "while":   # operands: the predicate's consts, the body's consts, the carries
    cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
    out = _loop(taint, p["body_jaxpr"], ins[cn:cn + bn], ins[cn + bn:])
    if _predicate_tainted(taint, p["cond_jaxpr"], ins[:cn], out):
      raise _Unreplayable("a while loop's predicate depends on loaded data")
    return out
  if name == "scan":
    nc, ncarry = scan_counts(p)
    return _loop(taint, p["jaxpr"], ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:])
  if name in CALL_PRIMITIVES:
    j = call_jaxpr(eqn)
    return _sub(j, taint, ins[len(ins) - len(j.invars):])
  if name == "run_scoped":
    # the operands are the body's constvars (closed-over values and refs); its invars fresh allocations
    j = p["jaxpr"]
    inner = _Taint((c for c, o in zip(j.constvars, ins) if taint.of(o)),
                   (c for c, o in zip(j.constvars, ins) if taint.is_keyed(o)))
    _walk(j, inner)
    return [inner.of(v) for v in j.outvars]
  raise _Unreplayable(f"'{name}' is not known to be data-independent")


def _walk(jaxpr, taint: _Taint) -> None:
  for eqn in jaxpr.eqns:
    for v, t in zip(eqn.outvars, _eqn(eqn, taint)):
      if t:
        taint.tainted.add(v)


def replay_blocker(jaxpr, keyed=()) -> str | None:
  """None when the schedule of a kernel `jaxpr` is a function of its static parameters, grid indices
  and the contents of the refs at the invar positions `keyed` (which the kernel never writes);
  otherwise why not (the first decision made from other loaded data, or the first unclassified
  primitive). An equation whose parameters the analysis cannot read (a JAX version with another
  operand layout) makes the kernel unreplayable with the reason, never unlaunchable: replay is an
  optimisation, the full machine is always right."""
  try:
    _walk(jaxpr, _Taint((), (jaxpr.invars[k] for k in keyed)))
  except _Unreplayable as e:
    return str(e)
  except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
    return f"the analysis could not read an equation ({type(e).__name__}: {e})"
  return None
