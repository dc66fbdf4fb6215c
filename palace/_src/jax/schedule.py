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

Each primitive's role is its registry entry's `schedule` (registry.py): the generic roles (`DATA`,
`Deciding`, `Never`) are applied here; a primitive that reads or writes refs, moves data or runs
sub-jaxprs has its own function next to its evaluation in a rules file, written with `Taint`'s
methods (`decide`, `write`, `sub`, `loop`, `refuse`, ...).
"""
from __future__ import annotations

from palace._src.jax.registry import DATA, RULES, Deciding, Never


class _Unreplayable(Exception):
  pass


def _literal(v) -> bool:
  """A jaxpr literal (unhashable in JAX 0.12, and never loaded data)."""
  return type(v).__name__ == "Literal"


def _is_ref(v) -> bool:
  return getattr(getattr(v, "aval", None), "inner_aval", None) is not None


class Taint:
  """Per jaxpr variable: tainted values, and the refs whose reads are clean (keyed refs). What a
  primitive's schedule function (registry.Rule.schedule) asks and tells the analysis."""

  def __init__(self, tainted, keyed):
    self.tainted, self.keyed = set(tainted), set(keyed)

  def of(self, v) -> bool:
    return not _literal(v) and v in self.tainted

  def is_keyed(self, v) -> bool:
    return not _literal(v) and v in self.keyed

  def any(self, vs) -> bool:
    return any(self.of(v) for v in vs)

  def refuse(self, why: str) -> None:
    """The kernel is not replayable: `why`."""
    raise _Unreplayable(why)

  def decide(self, vs, eqn, what: str) -> None:
    if any(self.of(v) and not _is_ref(v) for v in vs):
      raise _Unreplayable(f"'{eqn.primitive.name}' decides its {what} from loaded data")

  def write(self, ref, eqn, values=None) -> None:
    """A write of `values` (None: data from elsewhere, a copy) into `ref`: a keyed ref stays keyed
    while everything written into it is clean (paged attention keeps counters in its prefetch refs)."""
    if self.is_keyed(ref) and (values is None or self.any(values)):
      raise _Unreplayable(f"'{eqn.primitive.name}' writes loaded data into a keyed (scalar prefetch / "
                          f"SMEM) operand")

  def sub(self, jaxpr, operands, bound=None) -> list:
    """Analyse `jaxpr` with `operands` (outer variables) bound to its invars (or to `bound`, e.g. a
    run_scoped body's constvars); its outputs' taint."""
    names = jaxpr.invars if bound is None else bound
    inner = Taint((i for i, o in zip(names, operands) if self.of(o)),
                  (i for i, o in zip(names, operands) if self.is_keyed(o)))
    _walk(jaxpr, inner)
    return [inner.of(v) for v in jaxpr.outvars]

  def _stand_ins(self, state):
    """Fresh stand-ins for loop carries, tainted where `state` says."""
    names = [object() for _ in state]
    self.tainted |= {n for n, t in zip(names, state) if t}
    return names

  def loop(self, body, consts, carry, rest=()) -> list:
    """The taint of `body`'s outputs at the fixpoint of its carries (its operands: `consts`, the
    carries, then the scanned inputs `rest`): a carry is tainted once any iteration may taint it."""
    state = [self.of(v) for v in carry]
    while True:
      probe = Taint((v for v in (*consts, *rest) if self.of(v)), (v for v in consts if self.is_keyed(v)))
      out = probe.sub(body, [*consts, *probe._stand_ins(state), *rest])
      new = [a or b for a, b in zip(state, out)]
      if new == state:   # (a loop may run zero times: its carries keep their initial taint)
        return state + out[len(state):]
      state = new

  def predicate_tainted(self, cond, consts, state) -> bool:
    """Whether a while loop's predicate `cond` may depend on loaded data, its carries tainted as
    `state` (the body's fixpoint)."""
    probe = Taint((v for v in consts if self.of(v)), (v for v in consts if self.is_keyed(v)))
    return any(probe.sub(cond, [*consts, *probe._stand_ins(state)]))


def _eqn(eqn, taint: Taint) -> list:
  """The taint of `eqn`'s outputs (its entry's schedule role); raises _Unreplayable where it decides
  from loaded data."""
  name, ins = eqn.primitive.name, eqn.invars
  entry = RULES.get(name)
  role = None if entry is None else entry.schedule
  if role is DATA:
    return [taint.any(ins)] * len(eqn.outvars)
  if role is None:
    raise _Unreplayable(f"'{name}' is not known to be data-independent")
  if type(role) is Never:
    raise _Unreplayable(f"the kernel {role.why}")
  if type(role) is Deciding:
    taint.decide(ins[role.n:], eqn, "slice start / shift / delay")
    return [taint.any(ins[:role.n])] * len(eqn.outvars)
  return role(eqn, taint)


def _walk(jaxpr, taint: Taint) -> None:
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
    _walk(jaxpr, Taint((), (jaxpr.invars[k] for k in keyed)))
  except _Unreplayable as e:
    return str(e)
  except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
    return f"the analysis could not read an equation ({type(e).__name__}: {e})"
  return None
