"""Session 24's measured kernels: a matmul grid step's compute and copies apart, flash's softmax-and-p-v
part with its l update and rescale taken apart, the pipeline's per-step cost per operand and grid rank,
and the jax wheel's flash step cut link by link (cycles a step on the chip; docs/validation.md "Session
24").

`mm_parts`: a tiled matmul's step on fixed blocks (no copies after the first): acc += x y into an f32
(int32 for int8) VMEM accumulator, bf16 at 128, 256 and 512 blocks, f32 and int8 at 256: what the step
costs without its DMAs, beside the matmul table's pipelined launches (`matmul`) and the two-input reads
without a dot (`step_read2_*`); and two moving (b, b) bf16 inputs a step (two DMAs) with no dot, with a
dot on fixed blocks that does not read them, and with the dot on them (`mmdma_*`): whether a step's
copies and its dot overlap on the chip.

`pv_more`: session 23's `pv_softmax` (row max, exp, row sum, the l update l * c + sum, the p v dot and the
accumulator's rescale acc * c + pv, c a loaded (rows, 1) column) is 20-28% slower on the chip than
`chain_dot`'s same chain without the l update and the rescale. Each variant drops or changes one of
them: 'nol' (r += sum, rescale kept), 'noresc' (l update kept, acc += pv), 'nolc' (neither), 'rep'
(both, c loaded lane-dense as (rows, 128): no lane broadcast), 'bcast_sum' (no softmax: a loaded p into
the dot with the rescale, beside an independent row sum of s), at 128 rows with K = 128 and 256 rows with
K = 256.

`step_ops`: 4096 grid steps of rank 1, 2 or 4 with 1, 3 or 6 inputs, blocks fixed or moving (`_step_ops`).
`wheel_step`: the jax wheel's flash inner step on fixed blocks, whole and cut (`_wheel_step`).

Same conventions as `cases.py` (public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

import functools

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_fence import _sum_out, fixed_grid

_LANES = 128


def _mm_fixed(dtype, b, n):
  """A (b, b) x (b, b) `dtype` dot accumulated into f32 (int32 for int8) scratch on fixed blocks, `n` steps."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    acc_dt = jnp.int32 if dtype == "int8" else jnp.float32

    def body(ins, o_ref, scratch):
      (x_ref, y_ref), (acc_ref, _) = ins, scratch
      acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_dt)

    def finish(o_ref, scratch):
      o_ref[...] = scratch[0][...].astype(jnp.float32) + scratch[1][...]

    call = fixed_grid(jax, jnp, pl, n, [(b, b), (b, b)], (b, b),
                      [pltpu.VMEM((b, b), acc_dt), pltpu.VMEM((b, 1), jnp.float32)], body, finish)
    return call, (_rand((b, b), dtype, 1), _rand((b, b), dtype, 2))
  return build


def _mm_dma(op, b, n=128, m=8):
  """A grid of `n` steps with two moving (b, b) bf16 inputs cycling over `m` blocks each (two DMAs a step)
  and two fixed ones: 'none' (the moving blocks' first columns summed into a (b, 1) column: the copies
  alone), 'sep' (that, and acc += x y on the fixed blocks: a dot that does not read the copies), 'dot'
  (acc += a b on the moving blocks: the matmul table's step without its output)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(a_ref, b_ref, x_ref, y_ref, o_ref, acc_ref, col_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
        col_ref[...] = jnp.zeros_like(col_ref)

      if op == "dot":
        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)
      else:
        col_ref[...] += (a_ref[:, :1].astype(jnp.float32) + b_ref[:, :1].astype(jnp.float32))
        if op == "sep":
          acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + col_ref[...]

    moving = pl.BlockSpec((b, b), lambda i: (i % m, 0))
    fixed = pl.BlockSpec((b, b), lambda i: (0, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((b, b), jnp.float32), grid=(n,),
        in_specs=[moving, moving, fixed, fixed], out_specs=fixed,
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32), pltpu.VMEM((b, 1), jnp.float32)])
    return call, (_rand((m * b, b), "bfloat16", 1), _rand((m * b, b), "bfloat16", 2),
                  _rand((b, b), "bfloat16", 3), _rand((b, b), "bfloat16", 4))
  return build


def _pv_more(op, blk, k, n=256):
  """`pv_softmax`'s step (cases_stream._pv) with one part dropped or changed (module docstring)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    cw = _LANES if op == "rep" else 1

    def body(ins, o_ref, scratch):
      (p_ref, s_ref, v_ref, c_ref), (acc_ref, l_ref) = ins, scratch
      c = c_ref[...]
      s = s_ref[...]
      if op == "bcast_sum":
        p = p_ref[...]
        l_ref[...] += jnp.sum(s, axis=-1, keepdims=True)
      else:
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        rs = jnp.sum(e, axis=-1, keepdims=True)
        if op in ("noresc", "rep"):
          l_ref[...] = l_ref[...] * c[:, :1] + rs
        else:
          l_ref[...] += rs
        p = e.astype(jnp.bfloat16)
      pv = jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)
      if op in ("nol", "rep", "bcast_sum"):
        acc_ref[...] = acc_ref[...] * c + pv
      else:
        acc_ref[...] += pv

    call = fixed_grid(jax, jnp, pl, n, [(blk, k), (blk, k), (k, _LANES), (blk, cw)], (blk, _LANES),
                      [pltpu.VMEM((blk, _LANES), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32)],
                      body, _sum_out)
    return call, (_rand((blk, k), "bfloat16", 1), _rand((blk, k), "float32", 2),
                  _rand((k, _LANES), "bfloat16", 3), _rand((blk, cw), "float32", 4) * 0.01 + 1.0)
  return build


_RANK_GRIDS = {1: (4096,), 2: (64, 64), 4: (8, 8, 8, 8)}


def _step_ops(rank, nin, moving):
  """4096 grid steps of rank `rank` with `nin` f32 (8, 128) inputs and one output, the body adding the
  inputs into the output block: every input's block fixed (`moving` False: constant index maps) or a
  new 4 KiB block each step (index maps that use every grid index): what the pipeline's per-step
  bookkeeping costs per operand and grid dimension."""
  def build():
    jax, jnp, pl, _ = _jax()
    grid = _RANK_GRIDS[rank]
    half = rank // 2   # the first `half` grid indices pick the block row, the others its column
    rows = 1
    for g in grid[:half]:
      rows *= g
    cols = 4096 // rows

    def in_map(*g):
      if not moving:
        return (0, 0)
      r = c = 0
      for d, gi in enumerate(g):
        if d < half:
          r = r * grid[d] + gi
        else:
          c = c * grid[d] + gi
      return (r, c)

    def kernel(*refs):
      ins, o_ref = refs[:nin], refs[nin]
      first = functools.reduce(jnp.logical_and, [pl.program_id(d) == 0 for d in range(rank)])

      @pl.when(first)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)

      acc = ins[0][...]
      for r in ins[1:]:
        acc = acc + r[...]
      o_ref[...] += acc

    shape = (8 * rows, 128 * cols) if moving else (8, 128)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=grid,
        in_specs=[pl.BlockSpec((8, 128), in_map) for _ in range(nin)],
        out_specs=pl.BlockSpec((8, 128), lambda *g: (0, 0)))
    return call, tuple(_rand(shape, "float32", 10 + k) for k in range(nin))
  return build


def step_op_cases() -> list[Case]:
  F = "step_ops"
  return [Case(f"sops_r{rank}_in{nin}_{'moving' if mv else 'fixed'}", F, _step_ops(rank, nin, mv))
          for mv in (False, True) for rank in (1, 2, 4) for nin in (1, 3, 6)]


def wheel_compute(jax, jnp, op, blk, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref):
  """One jax-wheel flash step on (blk, 128) q, k, v refs and lane-dense m, l, acc scratch: 'full',
  or one of the cuts `_wheel_step` names (also the body of cases_move's moving-block steps)."""
  nt = (((1,), (1,)), ((), ()))

  def lanes(x):   # a (blk, blk) value folded to (blk, 128) for the accumulator
    return x[:, :128] if blk == 128 else x[:, :128] + x[:, 128:]

  m_prev, l_prev = m_ref[...], l_ref[...]
  s = jax.lax.dot_general(q_ref[...], k_ref[...], nt, preferred_element_type=jnp.float32)
  if op == "qk":   # the chain cut after each link (session 24's third call)
    acc_ref[...] += lanes(s)
    return
  if op == "nomax":   # q k^T, exp, p v: the dot -> exp -> dot chain without the row reductions
    p = jnp.exp(s * 0.01)
    acc_ref[...] += jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
    return
  m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
  if op == "max":
    m_ref[...] = m_next
    return
  p = jnp.exp(s - (m_next if blk == 128 else jnp.tile(m_next, (1, blk // 128))))
  if op == "exp":
    m_ref[...] = m_next
    acc_ref[...] += lanes(p)
    return
  alpha = 1.0 if op == "noalpha" else jnp.exp(m_prev - m_next)
  l_corr = alpha * l_prev
  l_next = jnp.sum(p, axis=1)[:, None] + l_corr
  m_ref[...] = m_next
  l_ref[...] = l_next
  if op == "nopv":
    return
  pv = jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
  if op == "noacc":
    acc_ref[...] += pv
  elif op == "nodiv":
    acc_ref[...] = acc_ref[...] * l_corr + pv
  else:
    inv = jnp.where(l_next == 0.0, 1.0, 1.0 / l_next)
    acc_ref[...] *= l_corr * inv
    acc_ref[...] += pv * inv


def _wheel_step(op, blk=128, n=512):
  """The jax wheel's flash-attention inner step (ops/tpu/flash_attention.py: m and l kept lane-dense as
  (blk, 128), the row max and sum broadcast back, the accumulator rescaled by l_corr / l_next and the p v
  product scaled by 1 / l_next) on fixed (blk, 128) bf16 q, k, v blocks, `n` steps: 'full'; 'nodiv' (no
  1 / l_next: the rescale by l_corr, p v added); 'noalpha' (no exp(m_prev - m_next): alpha = 1);
  'nopv' (everything up to l and m, no p v dot and no accumulator); 'noacc' (the p v dot accumulated,
  no rescale, no division); the chain cut after q k^T ('qk': s accumulated), the row max ('max': m
  stored) and the exp ('exp': m stored, p accumulated); 'nomax': q k^T, exp and the p v dot without
  the row reductions (`wheel_compute`)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      wheel_compute(jax, jnp, op, blk, *ins, *scratch)

    def finish(o_ref, scratch):
      o_ref[...] = scratch[2][...] + scratch[0][...] + scratch[1][...]

    call = fixed_grid(jax, jnp, pl, n, [(blk, 128)] * 3, (blk, 128),
                      [pltpu.VMEM((blk, 128), jnp.float32) for _ in range(3)], body, finish)
    return call, tuple(_rand((blk, 128), "bfloat16", 20 + j) for j in range(3))
  return build


def wheel_step_cases() -> list[Case]:
  F = "wheel_step"
  out = [Case(f"wstep_{op}_blk128", F, _wheel_step(op)) for op in ("full", "nodiv", "noalpha", "nopv", "noacc")]
  out += [Case(f"wstep_{op}_blk256", F, _wheel_step(op, blk=256, n=256)) for op in ("full", "nopv")]
  out += [Case(f"wstep_{op}_blk{b}", F, _wheel_step(op, blk=b, n=512 if b == 128 else 256))
          for b in (128, 256) for op in ("qk", "max", "exp", "nomax")]
  return out


def mm_part_cases() -> list[Case]:
  F = "mm_parts"
  out = [Case(f"mmfix_bf16_b{b}", F, _mm_fixed("bfloat16", b, 64 if b == 512 else 128)) for b in (128, 256, 512)]
  out += [Case(f"mmfix_{dt}_b256", F, _mm_fixed(dt, 256, 128)) for dt in ("float32", "int8")]
  out += [Case(f"mmdma_{op}_b{b}", F, _mm_dma(op, b)) for b in (128, 256) for op in ("none", "sep", "dot")]
  return out


def pv_more_cases() -> list[Case]:
  F = "pv_more"
  return [Case(f"pvm_{op}_blk{blk}_k{blk}", F, _pv_more(op, blk, blk))
          for blk in (128, 256) for op in ("nol", "noresc", "nolc", "rep", "bcast_sum")]
