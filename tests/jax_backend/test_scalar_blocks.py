"""palace.jax's fused runs of scalar int/bool equations (jax/scalar_blocks.py) against the equations'
own rules, which they replace: the same values, dtypes and ready cycles for every form on edge values
(INT_MIN / -1, x / 0, x % 0, negative remainders, wraparound of add/mul/neg, converts to bool and
uint32, selects) and on random programs of several runs, with operands ready before or after the
core's clock and NumPy operands; the same clock and scalar-unit time; the same results as JAX's
interpret mode; the same modelled launches."""
import itertools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as jpl
from jax.experimental.pallas import tpu as jpltpu

import jax_parity_harness as harness
import palace as pl
import palace.jax as pj
from palace._src import executor
from palace._src.jax import interpret, scalar_blocks
from palace._src.jax.registry import RULES
from palace._src.lang.array import Array

_LO, _HI = -2**31, 2**31 - 1
I32 = [_LO, _LO + 1, -7, -2, -1, 0, 1, 2, 7, _HI - 1, _HI]
U32 = [0, 1, 2, 7, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
BOOLS = [False, True]
KINDS = ["array", "late", "numpy"]   # a palace Array ready at the clock, one ready later, a NumPy scalar
_UNFUSED = 10**9                     # scalar_blocks.MIN_EQUATIONS that fuses nothing


def _int_ops(a, b):
  signed = a.dtype == jnp.int32
  c = np.dtype(a.dtype).type   # (lax ops take operands of one dtype)
  k = c(3 if signed else 5)
  out = [a + b, a - b, a * b, lax.max(a, b), lax.min(a, b), a == b, a != b, a < b, a <= b, a > b, a >= b,
         a & b, a | b, a ^ b, lax.div(a, b), lax.rem(a, b), -a, ~a, a + k, k - a, a * k, lax.rem(a, c(2)),
         lax.div(a, c(2)), lax.rem(k, b), lax.div(k, b), lax.clamp(c(1), a, c(7)),
         lax.select_n(a < b, a, b), lax.convert_element_type(a, jnp.bool_),
         lax.convert_element_type(a, jnp.uint32 if signed else jnp.int32),
         lax.convert_element_type(a < b, a.dtype) + b, (a * b + a) * b - lax.rem(b, a)]
  if signed:
    out += [lax.div(a, c(-1)), lax.rem(a, c(-1)), lax.rem(a, c(-2)), -(a - b)]
  return tuple(out)


def _bool_ops(p, q):
  return (p & q, p | q, p ^ q, ~p, p == q, p != q, p < q, p >= q, lax.select_n(p, q, ~q),
          lax.convert_element_type(p, jnp.int32) + 1, lax.convert_element_type(q, jnp.uint32) * 7,
          (p & True) | (q ^ False))


def _two_runs(a, b):
  # two runs split by a float convert: the second reads values of the first and its leaves. `a` is
  # weak-typed (traced from a Python int), so converting it, or a value computed from it alone, to
  # int32 is a convert_element_type to the same dtype, whose rule returns its operand (no charge)
  s = a + b
  t = s * 3
  p = s < b
  u = a * 2
  x = lax.convert_element_type(t, jnp.float32)
  y = (s - a) * 2
  z = lax.select_n(p, y, t)
  w = lax.convert_element_type(a, jnp.int32) + b
  return (x, y, z, w, s, lax.convert_element_type(u, jnp.int32), lax.convert_element_type(a, jnp.int32),
          lax.convert_element_type(a * 5, jnp.int32))


CASES = {   # name -> (function, operand dtypes, operand values); a Python-int dtype traces weak-typed
    "int32": (_int_ops, [jnp.int32] * 2, [I32, I32]),
    "uint32": (_int_ops, [jnp.uint32] * 2, [U32, U32]),
    "bool": (_bool_ops, [jnp.bool_] * 2, [BOOLS, BOOLS]),
    "two runs": (_two_runs, [int, jnp.int32], [I32, I32]),
}


def _program(closed, fuse: bool, monkeypatch):
  interpret._PROGRAMS.pop(closed.jaxpr, None)
  with monkeypatch.context() as m:
    if not fuse:
      m.setattr(scalar_blocks, "MIN_EQUATIONS", _UNFUSED)
    prog = interpret.program(closed.jaxpr)
  interpret._PROGRAMS.pop(closed.jaxpr, None)
  return prog


def _describe(x, t0):
  if type(x) is not Array:
    return ("not an Array", type(x).__name__)
  data = np.asarray(x._data)
  return (x.shape, x.dtype, data.dtype, data.item(), x._ready - t0)


def _evaluate(prog, consts, dtypes, inputs):
  """Every input combination through `prog` in one palace kernel: per call, the results (dtype,
  value, ready cycle relative to the clock before the call) and the clock's and scalar unit's
  advance."""
  seen = []

  def body(o_ref):
    ex = executor.current()
    for n, values in enumerate(inputs):
      kinds = [KINDS[(n + j) % len(KINDS)] for j in range(len(values))]
      late = [0, 3, 40, 1000][n % 4]
      args = [np.dtype(d).type(v) if kind == "numpy" else
              Array(np.dtype(d).type(v), (), np.dtype(d), ex.now + (late if kind == "late" else 0))
              for d, v, kind in zip(dtypes, values, kinds)]
      t0, busy = ex.now, ex.unit_busy["scalar"]
      outs = interpret.run_program(prog, consts, args)
      seen.append(([_describe(x, t0) for x in outs], ex.now - t0, ex.unit_busy["scalar"] - busy))

  with pl.virtual_tpu("v5e"):
    pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))()
  return seen


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_runs_equal_the_equations_rules_on_edge_values(name, monkeypatch):
  fn, dtypes, values = CASES[name]
  closed = jax.make_jaxpr(fn)(*[0 if d is int else jnp.zeros((), d) for d in dtypes])
  dtypes = [jnp.int32 if d is int else d for d in dtypes]
  fused, unfused = _program(closed, True, monkeypatch), _program(closed, False, monkeypatch)
  assert scalar_blocks.runs(closed.jaxpr.eqns), "nothing fused: the test would compare a path with itself"
  if name == "two runs":   # (aliases of a leaf, of a value of the first run and of one of the second)
    assert sum(e.primitive.name == "convert_element_type" and e.params["new_dtype"] == np.int32
               for e in closed.jaxpr.eqns) >= 4
  inputs = list(itertools.product(*values))
  want = _evaluate(unfused, closed.consts, dtypes, inputs)
  got = _evaluate(fused, closed.consts, dtypes, inputs)
  for n, (g, w) in enumerate(zip(got, want)):
    assert g == w, f"{name} on {inputs[n]}: fused {g} vs the rules {w}"


def test_a_run_with_an_operand_of_another_kind_takes_the_rules():
  # a host value (no kernel running): the fused block's guard fails, the rules run (NumPy results)
  closed = jax.make_jaxpr(_int_ops)(jnp.int32(0), jnp.int32(0))
  prog = interpret.program(closed.jaxpr)
  outs = interpret.run_program(prog, closed.consts, [np.int32(_LO), np.int32(-1)])
  assert type(outs[0]) is not Array and int(outs[14]) == _LO and int(outs[15]) == 0   # div, rem


def test_every_fused_form_is_compared_with_its_rule_above():
  # a primitive added to scalar_blocks must appear in CASES, so its Python-int form is compared with
  # palace's rule on the edge values (the fused forms restate the rules' semantics)
  fusable = {name for name, entry in RULES.items() if entry.scalar is not None}
  fused = set()
  for fn, dtypes, _ in CASES.values():
    eqns = jax.make_jaxpr(fn)(*[0 if d is int else jnp.zeros((), d) for d in dtypes]).jaxpr.eqns
    fused |= {e.primitive.name for start, stop, _ in scalar_blocks.runs(eqns) for e in eqns[start:stop]}
  assert fusable <= fused, f"not compared with their rules: {sorted(fusable - fused)}"


# random straight-line programs: runs split by float ops, values read later or not, aliases (converts
# of weak-typed values to int32), literals on either side, operands ready early, late or NumPy
_EDGES = {np.dtype(np.int32): I32, np.dtype(np.uint32): U32, np.dtype(np.bool_): BOOLS}


def _random_program(seed: int):
  rng = np.random.default_rng(seed)
  steps = int(rng.integers(10, 40))

  def fn(a, b, c, p):
    pool = [a, b, c, p]

    def pick(dtype, literal_ok=True):
      same = [x for x in pool if x.dtype == dtype]
      if literal_ok and rng.random() < 0.25 or not same:
        return np.dtype(dtype).type(rng.choice(_EDGES[np.dtype(dtype)]))
      return same[int(rng.integers(len(same)))]

    for _ in range(steps):
      kind = rng.choice(["int"] * 4 + ["compare", "bool", "unary", "select", "clamp", "convert", "break"])
      d = np.dtype(rng.choice([np.int32, np.uint32]))
      if kind == "int":
        x, y = pick(d), pick(d, literal_ok=False)
        if rng.random() < 0.5:
          x, y = y, x
        op = rng.choice(["+", "-", "*", "&", "|", "^", "max", "min", "div", "rem"])
        out = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y, "&": lambda: x & y,
               "|": lambda: x | y, "^": lambda: x ^ y, "max": lambda: lax.max(x, y),
               "min": lambda: lax.min(x, y), "div": lambda: lax.div(x, y), "rem": lambda: lax.rem(x, y)}[op]()
      elif kind in ("compare", "bool"):
        x, y = pick(np.bool_ if kind == "bool" else d), pick(np.bool_ if kind == "bool" else d, False)
        ops = [lambda: x == y, lambda: x != y, lambda: x < y, lambda: x <= y, lambda: x > y,
               lambda: x >= y] + [lambda: x & y, lambda: x | y, lambda: x ^ y] * (kind == "bool")
        out = ops[int(rng.integers(len(ops)))]()
      elif kind == "unary":
        x = pick(rng.choice([d, np.dtype(np.bool_)]), literal_ok=False)
        out = ~x if x.dtype == jnp.bool_ or rng.random() < 0.5 else -x
      elif kind == "select":
        e = rng.choice([d, np.dtype(np.bool_)])
        out = lax.select_n(pick(np.bool_, False), pick(e), pick(e))
      elif kind == "clamp":
        lo, hi = sorted(np.dtype(d).type(v) for v in rng.choice(_EDGES[d], 2))
        out = lax.clamp(lo, pick(d, False), hi)
      elif kind == "convert":
        x = pick(rng.choice([d, np.dtype(np.bool_)]), literal_ok=False)
        out = lax.convert_element_type(x, rng.choice([np.int32, np.uint32, np.bool_, x.dtype]))
      else:   # float ops between two runs (x / 4 is in int32 range for either dtype)
        x = lax.convert_element_type(pick(d, False), jnp.float32)
        out = lax.convert_element_type(x * 0.25, jnp.int32)
      pool.append(out)
    keep = rng.random(len(pool)) < 0.3
    keep[-1] = True
    return tuple(x for x, k in zip(pool, keep) if k)

  values = [[int(v) for v in rng.choice(_EDGES[np.dtype(d)], 12)] for d in (np.int32, np.int32, np.uint32)]
  values.append([bool(v) for v in rng.integers(0, 2, 12)])
  return fn, list(zip(*values))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", range(40))
def test_fused_runs_equal_the_rules_on_random_programs(seed, monkeypatch):
  fn, inputs = _random_program(seed)
  closed = jax.make_jaxpr(fn)(0, jnp.int32(0), jnp.uint32(0), jnp.bool_(False))   # (a weak-typed)
  assert scalar_blocks.runs(closed.jaxpr.eqns), "nothing fused: the test would compare a path with itself"
  fused, unfused = _program(closed, True, monkeypatch), _program(closed, False, monkeypatch)
  dtypes = [jnp.int32, jnp.int32, jnp.uint32, jnp.bool_]
  want = _evaluate(unfused, closed.consts, dtypes, inputs)
  got = _evaluate(fused, closed.consts, dtypes, inputs)
  for n, (g, w) in enumerate(zip(got, want)):
    assert g == w, f"seed {seed} on {inputs[n]}: fused {g} vs the rules {w}\n{closed}"


# ------------------------------------------------------------------ whole kernels through palace.jax
def _chain_kernel(fn, n):
  def kernel(a_ref, b_ref, o_ref):
    for k in range(n):
      o_ref[k] = fn(a_ref[k], b_ref[k]).astype(jnp.int32)
  smem = jpl.BlockSpec(memory_space=jpltpu.SMEM)
  return jpl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.int32),
                         in_specs=[smem, smem], out_specs=smem)


CHAINS = {
    "div rem": (lambda a, b: lax.div(a, b) * 3 - lax.rem(a, b) + lax.rem(-a, b), I32),
    "wraparound": (lambda a, b: (a + a) * 7 - b * b + (-a), I32),
    "compare select": (lambda a, b: lax.select_n((a < b) & (a != 0) | ~(b >= 0), a - b, b - a), I32),
    "converts": (lambda a, b: lax.rem((lax.convert_element_type(a > b, jnp.int32) + a)
                                      .astype(jnp.uint32), jnp.uint32(7)).astype(jnp.int32)
                 + (a != 0).astype(jnp.int32), I32),
    "clamp max min": (lambda a, b: lax.clamp(jnp.int32(-5), a, jnp.int32(5)) + lax.max(a, b)
                      - lax.min(a, 0), I32),
    "unsigned": (lambda a, b: lax.div(a, b) * 3 + lax.rem(a, b) - a * a, U32),
}


def _run_chain(name, engine):
  fn, values = CHAINS[name]
  dtype = np.int32 if values is I32 else np.uint32
  a, b = (np.array(v, dtype) for v in zip(*itertools.product(values, values)))
  if engine == "interpret":
    with jpltpu.force_tpu_interpret_mode():   # (read when the pallas_call is made)
      return np.asarray(_chain_kernel(fn, a.size)(a, b)), None
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(_chain_kernel(fn, a.size)(a, b))
  r = tpu.reports[-1]
  return out, (r.device_cycles, dict(r.unit_busy_cycles))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_fused_scalar_chains_match_jax_interpret_mode_and_the_unfused_rules(name, monkeypatch):
  ref, _ = _run_chain(name, "interpret")
  fused, fused_time = _run_chain(name, "palace")
  monkeypatch.setattr(scalar_blocks, "MIN_EQUATIONS", _UNFUSED)
  unfused, unfused_time = _run_chain(name, "palace")
  np.testing.assert_array_equal(fused, ref)
  np.testing.assert_array_equal(unfused, ref)
  assert fused_time == unfused_time


EMIT_PIPELINE = [c for c in harness.case_names("k_kernel_pipeline.py") if "emit_pipeline" in c]
# modelled cycles of emit_pipeline_add through palace.jax before runs were fused (and after); 3952 since
# session 21's issue rules (a rolled loop's back edge: 24 scalar cycles more; ops on a busy unit
# interleave; writes ahead of reads: docs/timing-model.md 1.1-1.2), 3969 since the v5e measurements
# (HBM rates, latencies, the DMA-wait sync), 4479 before; 4156 since session 33 (v5e's measured rules:
# 16-cycle DMA issue, latency-form DMA waits), its waits' source windows not computed (32 scalar cycles
# fewer, off the critical path: palace/_src/jax/wait_sources.py); 4124 with HBM's write buffer; 4069
# since session 34 (JAX's pipeline loop's repeated index arithmetic computed once, as Mosaic's CSE does:
# scalar 1691 -> 1492; its conditional branches 4 cycles each, v5e's grid step 24: jax/scalar_cse.py);
# 4066 since session 36 (its loop's 8 back edges cost no scalar cycles beside the 9-cycle iteration
# floor: scalar 1492 -> 1468, docs/timing-model.md 1.1)
EMIT_PIPELINE_ADD = {"device_cycles": 4066, "scalar": 1468, "vpu": 32, "vld": 48, "vst": 64}


def _run_parity(case):
  mod = harness.jax_module("k_kernel_pipeline.py")
  with pj.virtual_tpu("v5e") as tpu:
    fn, args, _ = getattr(mod, case)()
    out = jax.block_until_ready(fn(*args))
  return ([np.asarray(x) for x in jax.tree_util.tree_leaves(out)],
          [(r.device_cycles, dict(r.unit_busy_cycles), r.dma_count_by_direction) for r in tpu.reports])


@pytest.mark.parametrize("case", EMIT_PIPELINE)
def test_emit_pipeline_kernels_model_the_same_launches_fused_and_unfused(case, monkeypatch):
  out, reports = _run_parity(case)
  monkeypatch.setattr(scalar_blocks, "MIN_EQUATIONS", _UNFUSED)
  out_u, reports_u = _run_parity(case)
  assert reports == reports_u
  for x, y in zip(out, out_u):
    np.testing.assert_array_equal(x, y)
  if case == "case_emit_pipeline_add":
    (cycles, busy, _), = reports
    assert {"device_cycles": cycles, **{k: busy[k] for k in ("scalar", "vpu", "vld", "vst")}} == \
        EMIT_PIPELINE_ADD
