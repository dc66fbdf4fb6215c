"""Registry entries of control flow and calls: jit/closed calls, custom_jvp/vjp (primal only), cond,
while, scan (fori_loop), run_scoped. Loops and branches go through palace's own control-flow
primitives, so their scalar-unit costs are charged as for a palace kernel; in the schedule analysis
each runs the analysis on its sub-jaxprs (`Taint.sub`, `Taint.loop`)."""
from __future__ import annotations

from palace._src.jax.avals import alloc_type
from palace._src.jax.interpret import program, run_program, unsupported
from palace._src.jax.registry import rule
import palace._src.lang.numpy_ops as pjnp
from palace._src.lang import primitives as prims
from palace._src.lang.array import concrete_int


def call_jaxpr(eqn):
  """The inner jaxpr of a call primitive's equation (it takes the last len(invars) operands), or None."""
  p = eqn.params
  return next((p[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if p.get(k) is not None), None)


def scan_counts(params) -> tuple:
  """(consts, carries) of a scan equation's operands (then its scanned inputs)."""
  if "ft_in" in params:  # JAX 0.12: the operand groups (consts, carry, xs) as a flat-tree tuple
    nc, ncarry = (len(list(g.vals)) for g in params["ft_in"].unpack()[:2])
    return nc, ncarry
  return int(params["num_consts"]), int(params["num_carry"])


def _call_schedule(eqn, taint):
  j = call_jaxpr(eqn)
  return taint.sub(j, eqn.invars[len(eqn.invars) - len(j.invars):])


def _call(eqn):
  """A primitive that calls an inner jaxpr on (the tail of) its operands."""
  j = call_jaxpr(eqn)
  if j is None:
    raise unsupported(eqn, "no inner jaxpr")
  prog, consts, n = program(j), j.consts, len(j.invars)

  def call(*args):
    return run_program(prog, consts, args[len(args) - n:])
  return call


# (jit, pjit and closed_call are pure index arithmetic when their inner jaxprs are: jax/launch.py)
rule("pjit", "jit", "closed_call", compiles=True, schedule=_call_schedule, pure_index=True)(_call)
rule("core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
     "custom_lin", compiles=True, schedule=_call_schedule)(_call)


def _custom_fusion_parts(eqn):
  """(jaxpr, first operand, count) a `custom_fusion` equation runs in a kernel: its Pallas
  implementation when it has one (on its consts and the arguments), else its jaxpr (on the
  jaxpr's consts and the arguments), as Mosaic's lowering picks (jax/_src/pallas/mosaic/lowering.py)."""
  p = eqn.params
  nc, npc = int(p["num_consts"]), int(p["pallas_num_consts"])
  if p.get("pallas_jaxpr") is not None:
    return p["pallas_jaxpr"], nc, npc
  return p["jaxpr"], 0, nc


def _custom_fusion_schedule(eqn, taint):
  j, first, n = _custom_fusion_parts(eqn)
  nargs = len(eqn.invars) - int(eqn.params["num_consts"]) - int(eqn.params["pallas_num_consts"])
  return taint.sub(j, [*eqn.invars[first:first + n], *eqn.invars[len(eqn.invars) - nargs:]])


@rule("custom_fusion", compiles=True, schedule=_custom_fusion_schedule)
def _custom_fusion(eqn):
  """A `fuser.custom_fusion` inside a kernel: its (Pallas) jaxpr called on its consts and arguments."""
  j, first, n = _custom_fusion_parts(eqn)
  p = eqn.params
  skip = int(p["num_consts"]) + int(p["pallas_num_consts"])
  prog, nv = program(j), len(j.constvars)   # (consts attached to constvars, or leading invars)
  return lambda *ops: run_program(prog, ops[first:first + nv], [*ops[first + nv:first + n], *ops[skip:]])


def _closed(j):
  """fn(*args) -> outputs of the closed jaxpr `j`, compiled once."""
  prog, consts = program(j), j.consts
  return lambda *args: run_program(prog, consts, args)


def _cond_schedule(eqn, taint):
  taint.decide(eqn.invars[:1], eqn, "branch")
  outs = [taint.sub(b, eqn.invars[1:]) for b in eqn.params["branches"]]
  return [any(col) for col in zip(*outs)]


@rule("cond", compiles=True, schedule=_cond_schedule)
def _cond(eqn):
  fns = [_closed(b) for b in eqn.params["branches"]]
  return lambda index, *ops: prims.switch(index, fns, *ops)


def _while_schedule(eqn, taint):
  """Operands: the predicate's consts, the body's consts, the carries."""
  p, ins = eqn.params, eqn.invars
  cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
  out = taint.loop(p["body_jaxpr"], ins[cn:cn + bn], ins[cn + bn:])
  if taint.predicate_tainted(p["cond_jaxpr"], ins[:cn], out):
    taint.refuse("a while loop's predicate depends on loaded data")
  return out


@rule("while", compiles=True, schedule=_while_schedule)
def _while(eqn):
  p = eqn.params
  cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
  cond, body = _closed(p["cond_jaxpr"]), _closed(p["body_jaxpr"])

  def while_(*args):
    cconsts, bconsts, init = args[:cn], args[cn:cn + bn], args[cn + bn:]
    return list(prims.while_loop(lambda c: cond(*cconsts, *c)[0],
                                 lambda c: tuple(body(*bconsts, *c)), tuple(init)))
  return while_


def _is_fori(body, nc: int) -> bool:
  """Is `body` a fori_loop's scan body: its first carry out is `first carry in + 1`?"""
  from jax._src import core as jax_core  # noqa: PLC0415
  if len(body.invars) <= nc or not body.outvars:
    return False
  i, out = body.invars[nc], body.outvars[0]
  for eqn in body.eqns:
    if eqn.outvars and eqn.outvars[0] is out:
      a, b = (eqn.invars + [None, None])[:2]
      return (eqn.primitive.name == "add" and a is i and isinstance(b, jax_core.Literal)
              and b.val == 1)
  return False


def _scan_schedule(eqn, taint):
  nc, ncarry = scan_counts(eqn.params)
  ins = eqn.invars
  return taint.loop(eqn.params["jaxpr"], ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:])


@rule("scan", compiles=True, schedule=_scan_schedule)
def _scan(eqn):
  """lax.scan / fori_loop: palace's fori_loop over the carry (charged as a palace loop); scanned
  inputs are read with x[i] and stacked outputs gathered with jnp.stack, as a kernel would."""
  p = eqn.params
  nc, ncarry = scan_counts(p)
  body_jaxpr, length, reverse = p["jaxpr"], int(p["length"]), bool(p.get("reverse"))
  body = _closed(body_jaxpr)
  n_ys = len(body_jaxpr.outvars) - ncarry
  n_xs = len(body_jaxpr.invars) - nc - ncarry
  unroll = prims.unrolled(p.get("unroll", 1), length, "lax.scan")   # iterations per basic block
  if not n_xs and not n_ys:
    if _is_fori(body_jaxpr, nc):
      # fori_loop's scan increments its counter itself (`i + 1` in the body): that add is the
      # loop's scalar cost, which palace's fori_loop would charge a second time
      def fori(*args):
        consts, carry = args[:nc], args[nc:]
        for it in range(length):
          carry = body(*consts, *carry)
          if (it + 1) % unroll == 0:
            prims.back_edge()   # (as palace's fori_loop: the compiled loop's basic block ends)
        return list(carry)
      return fori

    def loop(*args):
      consts = args[:nc]
      return list(prims.fori_loop(0, length, lambda i, c: tuple(body(*consts, *c)),
                                  tuple(args[nc:]), unroll=unroll))
    return loop

  def scan(*args):
    consts, init, xs = args[:nc], args[nc:nc + ncarry], args[nc + ncarry:]
    ys = [[None] * length for _ in range(n_ys)]

    def step(i, carry):
      k = length - 1 - concrete_int(i) if reverse else concrete_int(i)
      out = body(*consts, *carry, *(x[k] for x in xs))
      for y, v in zip(ys, out[ncarry:]):
        y[k] = v
      return tuple(out[:ncarry])

    carry = prims.fori_loop(0, length, step, tuple(init), unroll=unroll)
    if length == 0:   # nothing to stack: empty arrays of the outputs' shapes (leading dim 0)
      return [*carry, *(pjnp.zeros(tuple(v.aval.shape), v.aval.dtype) for v in eqn.outvars[ncarry:])]
    return [*carry, *(pjnp.stack(y) for y in ys)]
  return scan


def _run_scoped_schedule(eqn, taint):
  """The operands are the body's constvars (closed-over values and refs); its invars fresh allocations."""
  j = eqn.params["jaxpr"]
  return taint.sub(j, eqn.invars, bound=j.constvars)


@rule("run_scoped", compiles=True, schedule=_run_scoped_schedule)
def _run_scoped(eqn):
  """The eqn's operands are the body's constvars (closed-over values and refs); its invars are the
  scoped allocations. The body is compiled with the enclosing jaxpr, not at every evaluation."""
  p = eqn.params
  if any(t for t in (p.get("ref_transforms") or ())):
    raise unsupported(eqn, "ref_transforms (transformed scoped allocation types)")
  jaxpr = p["jaxpr"]
  types = [alloc_type(v.aval, f"run_scoped[{i}]") for i, v in enumerate(jaxpr.invars)]
  prog, axes = program(jaxpr), tuple(p.get("collective_axes") or ())
  return lambda *consts: prims.run_scoped(lambda *refs: run_program(prog, consts, refs), *types,
                                          collective_axes=axes)


@rule("empty_ref", schedule=lambda eqn, taint: [False])   # (a fresh allocation: nothing loaded)
def _empty_ref(eqn):
  """`jax.empty_ref(type, memory_space)` in a kernel: a scratch ref for the rest of its region.
  `interpret.program` rewrites it, with the equations after it, into a run_scoped equation (Mosaic
  allocates it so), so this evaluation is reached only if that rewrite was bypassed."""
  raise unsupported(eqn, "outside a compiled region", "report this: the interpreter should have "
                    "scoped it (interpret.scope_empty_refs).")


@rule("check", schedule=lambda eqn, taint: [])
def _check(eqn, *err_args):
  """`checkify.check` in a kernel (JAX's fuser emits one for a dynamic slice's start), as Mosaic
  lowers it: a debug check is nothing unless `pl.enable_debug_checks` is on; a non-debug check is
  refused, as Mosaic refuses it."""
  from jax._src.pallas import core as pallas_core  # noqa: PLC0415
  if not eqn.params.get("debug"):
    raise unsupported(eqn, "debug=False", "Mosaic refuses non-debug checks too ('Non-debug checks are "
                      "not supported by the Mosaic backend'): functionalize them with "
                      "jax.experimental.checkify, or use pl.debug_check.")
  if pallas_core.debug_checks_enabled():
    raise unsupported(eqn, "pl.enable_debug_checks() on", "run without debug checks enabled.")
  return []
