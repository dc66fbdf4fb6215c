"""Chains of dependent vector ops inside a grid step and inside a rolled loop (session 22's chip run):
the `step_chain` and `loop_chain` families.

Session 21's `latency_parts` timed one op a grid step; its per-op figures differ from the same op in a
rolled loop (a lane max adds ~91 cycles to a step and ~115 to a loop iteration), so either the grid
step's bookkeeping overlaps the tail of a step's results or the step's bookkeeping is partly
hidden. These cases vary the chain's length `k` inside one grid step (fixed blocks, no copies after the
first) so the slope is the op's latency and the intercept what the step boundary adds; the loop cases
give the same ops' latency where a back edge drains each iteration. Same conventions as `cases.py`
(public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand

_LANES = 128


def _op(jax, jnp, op):
  """One link of a chain on an f32 value (each converges, so long chains stay finite)."""
  if op == "fma":
    return lambda x: x * 1.0001 + 0.5
  if op == "lane_max":
    return lambda x: x - jnp.max(x, axis=-1, keepdims=True) * 0.5
  if op == "exp":
    return lambda x: jnp.exp(x) * 0.25
  if op == "tanh":
    return lambda x: jnp.tanh(x) * 0.9
  if op == "exp2":
    return lambda x: jnp.exp2(x) * 0.25
  if op == "div":
    return lambda x: 1.0 / (x + 2.0)
  if op == "sublane_sum":
    return lambda x: x - jnp.sum(x, axis=0, keepdims=True) * 0.01
  if op == "colbcast":   # a computed (N, 1) column (not a reduction) broadcast across lanes
    return lambda x: x * 0.5 + x[:, 0:1] * 0.25
  if op == "softmax":    # a row softmax (lane max, exp, lane sum, divide), plus a shift to keep it moving
    def softmax(x):
      e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
      return e / jnp.sum(e, axis=-1, keepdims=True) + 0.5
    return softmax
  if op == "layernorm":  # mean and variance over lanes, rsqrt, scale
    def layernorm(x):
      c = x - jnp.mean(x, axis=-1, keepdims=True)
      return c * jax.lax.rsqrt(jnp.mean(c * c, axis=-1, keepdims=True) + 1e-5) * 0.5 + 0.25
    return layernorm
  raise ValueError(op)


def _fixed_rows_call(jax, jnp, pl, pltpu, kernel, rows, n):
  """(pallas_call, args) of `kernel(x_ref, o_ref, acc_ref)` on a grid of `n` steps whose (rows, 128) f32
  input and output blocks never change, with an f32 VMEM scratch of the same shape (the frame of
  `_step_chain` and `_step_raw`)."""
  fixed = lambda i: (0, 0)  # noqa: E731
  call = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((rows, _LANES), jnp.float32), grid=(n,),
      in_specs=[pl.BlockSpec((rows, _LANES), fixed)],
      out_specs=pl.BlockSpec((rows, _LANES), fixed),
      scratch_shapes=[pltpu.VMEM((rows, _LANES), jnp.float32)])
  return call, (_rand((rows, _LANES), "float32", 1) * 0.01,)


def _step_chain(op, k, rows=8, n=512):
  """A pallas_call grid of `n` steps on fixed (rows, 128) blocks: each step applies `k` dependent links
  of `op` to an f32 VMEM accumulator and stores it back."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    link = _op(jax, jnp, op)

    def kernel(x_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        acc_ref[...] = x_ref[...]

      v = acc_ref[...]
      for _ in range(k):
        v = link(v)
      acc_ref[...] = v

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...]

    return _fixed_rows_call(jax, jnp, pl, pltpu, kernel, rows, n)
  return build


def _loop_chain(op, unroll, n=512, rows=8, links=1):
  """`n` iterations of `links` dependent links of `op` on one (rows, 128) f32 value (one vreg at 8 rows)
  in a `fori_loop` unrolled by `unroll`."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    link = _op(jax, jnp, op)

    def body(i, x):
      for _ in range(links):
        x = link(x)
      return x

    def kernel(x_ref, o_ref):
      o_ref[...] = jax.lax.fori_loop(0, n, body, x_ref[...], unroll=unroll)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, _LANES), jnp.float32))
    return call, (_rand((rows, _LANES), "float32", 1) * 0.01,)
  return build


def chain_cases() -> list[Case]:
  out = []
  for op in ("fma", "lane_max", "exp", "div", "sublane_sum", "colbcast"):
    for k in (1, 2, 4, 8):
      out.append(Case(f"schain_{op}_k{k}", "step_chain", _step_chain(op, k)))
  for op in ("lane_max", "exp"):
    for k in (1, 4):
      out.append(Case(f"schain_{op}_k{k}_128rows", "step_chain", _step_chain(op, k, rows=128)))
  for op in ("div", "tanh", "sublane_sum", "colbcast", "exp", "lane_max"):
    for unroll in (1, 8):
      out.append(Case(f"lchain_{op}_u{unroll}", "loop_chain", _loop_chain(op, unroll)))
  return out


def holdout_chain_cases() -> list[Case]:
  """Session 22's second chip run: compositions of the fitted ops, modelled before they were measured
  (the predictions are kept beside the data: v5e-holdout-predictions-2026-12-06.json)."""
  out = []
  for op in ("softmax", "layernorm"):
    for rows in (8, 128):
      for k in (1, 2):
        out.append(Case(f"hchain_{op}_k{k}_{rows}rows", "holdout_chain", _step_chain(op, k, rows=rows)))
    out.append(Case(f"hchain_{op}_loop_u1", "holdout_chain", _loop_chain(op, 1, n=256)))
  return out


def eup_curve_cases() -> list[Case]:
  """Session 36 (`eup_curve`, measured for the next model step): what an EUP op costs by its size and
  what a rolled loop's iteration costs at least. The chains of sessions 21-22 disagree with one EUP
  latency and one back-edge cost: a one-vreg tanh link costs the chip ~9 cycles, an exp link ~11 (exp
  may be a VPU prescale and an EUP exp2), a 16-vreg exp link in a grid step ~21; a rolled loop adds ~5
  cycles an iteration to a 4-cycle multiply-add chain but ~1 to a 10-20-cycle chain (a floor on the
  iteration, not a cost after it?). Cases: chains of tanh / exp links unrolled by 8 on (rows, 128) f32
  values of 1-16 vregs (`ecurve_*`), exp2 links (no prescale?), grid-step chains of tanh on 16-256
  vregs (`ecurve_step_*`), and rolled loops of 2-4 dependent multiply-adds on one vreg (`lfloor_*`)."""
  F = "eup_curve"
  out = []
  for op in ("tanh", "exp"):
    for rows in (8, 16, 32, 64, 128):
      out.append(Case(f"ecurve_{op}_r{rows}_u8", F, _loop_chain(op, 8, n=256, rows=rows)))
  out.append(Case("ecurve_exp2_r8_u8", F, _loop_chain("exp2", 8, n=256)))
  for rows in (128, 512, 2048):
    for k in (1, 4):
      out.append(Case(f"ecurve_step_tanh_k{k}_r{rows}", F, _step_chain("tanh", k, rows=rows)))
  for links in (2, 3, 4):
    out.append(Case(f"lfloor_fma_k{links}_u1", F, _loop_chain("fma", 1, n=1024, links=links)))
  return out


def _step_raw(op, rows, raw, n=512):
  """A pallas_call grid of `n` steps on fixed (rows, 128) blocks, one `op` link a step ('add': + 1.0 on
  the VPU, 'tanh': tanh(x) * 0.9 on the EUP). `raw`: the link reads the f32 VMEM scratch the previous
  step stored (s = link(s)); else it reads the fixed input block and stores the scratch (s = link(x)),
  so no step loads what the step before it stored."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    link = (lambda v: v + 1.0) if op == "add" else (lambda v: jnp.tanh(v) * 0.9)

    def kernel(x_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        acc_ref[...] = x_ref[...]

      acc_ref[...] = link(acc_ref[...] if raw else x_ref[...])

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...]

    return _fixed_rows_call(jax, jnp, pl, pltpu, kernel, rows, n)
  return build


def step_raw_cases() -> list[Case]:
  """Session 36 (`step_raw`, measured for the next model step): grid steps holding one op on 16 or more
  vregs cost the chip ~10 cycles more than the model (`ecurve_step_tanh_k1_r128` -19%, `cpart_acc`
  -10%, `lpart_div` -12%), one-vreg steps do not. Is it the step's load of what the step before it
  stored (a store-to-load wait through VMEM the model does not charge)? The same link a step on 1, 16
  and 64 vregs, reading the scratch the previous step stored (`_raw`) or the fixed input (`_fresh`)."""
  F = "step_raw"
  out = []
  for op in ("add", "tanh"):
    for rows in (8, 128, 512):
      for raw in (True, False):
        out.append(Case(f"sraw_{op}_r{rows}_{'raw' if raw else 'fresh'}", F, _step_raw(op, rows, raw)))
  return out
