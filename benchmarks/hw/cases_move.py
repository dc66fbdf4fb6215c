"""Session 25's measured kernels (`wheel_move`): the jax wheel's flash step (`cases_parts.wheel_compute`)
and a light step, with k and v moving every step, reached the ways real kernels reach them.

Session 24's `wheel_step` timed the flash step on fixed blocks (no copies). The real kernels (the
wheel's flash attention, splash attention, paged attention, megablox gmm) cost their steps more than
that on the chip, and each adds something else to the step: k and v copied each step, block indices
read from scalar-prefetch tables in SMEM, the body under a `pl.when` on a table entry, a rank-3 grid whose
scratch is reset and whose output is written at the ends of its innermost axis. Each case adds one:

- `mod`: grid (n,), q fixed, k and v (128, 128) bf16 blocks cycling over `m` blocks (index map i % m);
- `smem`: the same blocks picked by a prefetched table (`PrefetchScalarGridSpec`, idx[i]);
- `smemwhen`: that, and the body under `pl.when(flags[i] != 0)` (every flag 1: the body always runs);
- `flash3`: a (4, 4, 32) grid as the wheel's flash kernel has (heads, q blocks, kv blocks): q moves
  with the q block, k and v with the kv block, m, l and acc reset at kv == 0, the output written at
  the last kv block; 'flash3sq' the same on an (8, 8, 8) grid, and 'flash3c' that grid causal as the
  wheel's kernel skips blocks (the body under `pl.when(kv <= q block)`, k and v clamped to block 0 above
  the diagonal: no copy there; no mask in the body);

with the body 'full' (the whole flash step) or 'acc' (acc += k + v as f32: the step's copies and
bookkeeping beside little compute).

`mxu_chain`: dots fed from another dot's result on fixed blocks (no copies), whether the chip streams
an MXU result into the next dot (`wstep_nomax` says it does not, beside an exp): 'dd' (s = q k^T, then
acc += s v with s cast to bf16) at 128 and 256 rows, 'dd_n128' (256 rows, s of one 128-lane tile), 'ddd'
(three dots in a chain, 128 rows).

`skip_step`: what a step costs whose body a `pl.when` skips (the wheel's causal flash skips the blocks
above the diagonal: its causal launches are modelled ~20% fast with the latency form): grid (512,), the
body run on 4 steps of every 8, k and v clamped to block 0 where it is skipped (`_skip`).

`copy_cost`: what two moving (r, 128) f32 inputs (4-128 KiB each, a new block every step) cost a step
beside a light body (the first 8 rows of each added into scratch) and beside the wheel's flash step on
fixed blocks (601 cycles a step alone, `wheel_step`), for the per-copy cost of pipelined copies by size.

`out_switch`: what an output block change costs a grid step. The matmul table's kernels (an output block
kept over the K axis, written back when it changes) are modelled 8-15% fast with the latency form of the
DMA wait, by about 650-900 cycles per output change. Grid (512 / K, K), acc += x into f32 scratch, the
(128, 128) output block (f32, or bf16) written at k == K - 1 and changing with the first index: x fixed
('fixed') or a new (128, 128) f32 block every step ('moving'), K in 1, 2, 8, 512 (512: one output block);
'fixed3d': a (8, 8, 8) grid as the matmul table's, output (i, j). Same conventions as `cases.py` (public Pallas API shared by JAX
0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

import numpy as np

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_parts import wheel_compute

_B = 128


def _zero_when(pl, jnp, cond, refs) -> None:
  """Zero each of `refs` when `cond` holds (the kernels' scratch reset at the first step of a run)."""
  @pl.when(cond)
  def _():
    for ref in refs:
      ref[...] = jnp.zeros_like(ref)


def _light(jnp, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref):
  acc_ref[...] += k_ref[...].astype(jnp.float32) + v_ref[...].astype(jnp.float32)


def _wheel_moving(body_op, mode, n=512, m=8):
  """A `body_op` step ('full' or 'acc') with k and v moving every step, `mode` as the module says."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def compute(refs):
      if body_op == "acc":
        _light(jnp, *refs)
      else:
        wheel_compute(jax, jnp, body_op, _B, *refs)

    scratch = [pltpu.VMEM((_B, _B), jnp.float32) for _ in range(3)]
    blk = (_B, _B)
    if mode.startswith("flash3"):
      heads, nq, nkv = (4, 4, n // 16) if mode == "flash3" else (8, 8, 8)
      causal = mode == "flash3c"

      def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
        kv = pl.program_id(2)

        _zero_when(pl, jnp, kv == 0, (m_ref, l_ref, acc_ref))

        if causal:
          @pl.when(kv <= pl.program_id(1))
          def _():
            compute((q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref))
        else:
          compute((q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref))

        @pl.when(kv == nkv - 1)
        def _():
          o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

      qspec = pl.BlockSpec(blk, lambda h, i, j: (h * nq + i, 0))
      kvspec = pl.BlockSpec(blk, (lambda h, i, j: (h * nkv + jax.lax.select(j <= i, j, 0), 0)) if causal else
                            (lambda h, i, j: (h * nkv + j, 0)))
      call = pl.pallas_call(
          kernel, out_shape=jax.ShapeDtypeStruct((heads * nq * _B, _B), jnp.float32),
          grid=(heads, nq, nkv), in_specs=[qspec, kvspec, kvspec], out_specs=qspec,
          scratch_shapes=scratch)
      return call, (_rand((heads * nq * _B, _B), "bfloat16", 30), _rand((heads * nkv * _B, _B), "bfloat16", 31),
                    _rand((heads * nkv * _B, _B), "bfloat16", 32))

    def run(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
      _zero_when(pl, jnp, pl.program_id(0) == 0, (m_ref, l_ref, acc_ref))

      compute((q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref))

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    args = (_rand(blk, "bfloat16", 30), _rand((m * _B, _B), "bfloat16", 31), _rand((m * _B, _B), "bfloat16", 32))
    out_shape = jax.ShapeDtypeStruct(blk, jnp.float32)
    if mode == "mod":
      fixed = pl.BlockSpec(blk, lambda i: (0, 0))
      moving = pl.BlockSpec(blk, lambda i: (i % m, 0))
      call = pl.pallas_call(run, out_shape=out_shape, grid=(n,), in_specs=[fixed, moving, moving],
                            out_specs=fixed, scratch_shapes=scratch)
      return call, args
    idx = jnp.asarray(np.random.default_rng(5).integers(0, m, n), jnp.int32)
    flags = jnp.ones((n,), jnp.int32)
    fixed = pl.BlockSpec(blk, lambda i, idx_ref, f_ref: (0, 0))
    moving = pl.BlockSpec(blk, lambda i, idx_ref, f_ref: (idx_ref[i], 0))

    def kernel(idx_ref, f_ref, *refs):
      if mode == "smemwhen":
        flag = f_ref[pl.program_id(0)]

        _zero_when(pl, jnp, pl.program_id(0) == 0, refs[4:])

        @pl.when(flag != 0)
        def _():
          compute((refs[0], refs[1], refs[2], *refs[4:]))

        @pl.when(pl.program_id(0) == n - 1)
        def _():
          refs[3][...] = refs[6][...] + refs[4][...] + refs[5][...]
      else:
        run(*refs)

    gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=(n,), in_specs=[fixed, moving, moving],
                                      out_specs=fixed, scratch_shapes=scratch)
    call = pl.pallas_call(kernel, out_shape=out_shape, grid_spec=gs)
    return call, (idx, flags) + args
  return build


def _mxu_chain(op, rows, n=512):
  """Chained dots on fixed blocks (module docstring): q (rows, 128), k (kn, 128) with kn = rows (128 for
  'dd_n128'), v (kn, 128), f32 accumulator (rows, 128)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    kn = _B if op == "dd_n128" else rows
    nt = (((1,), (1,)), ((), ()))

    def kernel(q_ref, k_ref, v_ref, o_ref, acc_ref):
      _zero_when(pl, jnp, pl.program_id(0) == 0, (acc_ref,))

      s = jax.lax.dot_general(q_ref[...], k_ref[...], nt, preferred_element_type=jnp.float32)
      t = jnp.dot(s.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
      if op == "ddd":
        t = jnp.dot(t.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
      acc_ref[...] += t

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...]

    def spec(shape):
      return pl.BlockSpec(shape, lambda i: (0, 0))

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((rows, _B), jnp.float32), grid=(n,),
        in_specs=[spec((rows, _B)), spec((kn, _B)), spec((kn, _B))], out_specs=spec((rows, _B)),
        scratch_shapes=[pltpu.VMEM((rows, _B), jnp.float32)])
    return call, (_rand((rows, _B), "bfloat16", 40), _rand((kn, _B), "bfloat16", 41) * 0.05,
                  _rand((kn, _B), "bfloat16", 42) * 0.05)
  return build


def mxu_chain_cases() -> list[Case]:
  F = "mxu_chain"
  return [Case("mxc_dd_r128", F, _mxu_chain("dd", 128)), Case("mxc_dd_r256", F, _mxu_chain("dd", 256)),
          Case("mxc_dd_n128_r256", F, _mxu_chain("dd_n128", 256)), Case("mxc_ddd_r128", F, _mxu_chain("ddd", 128))]


def _out_switch(mode, k, out_dtype="float32", n=512, m=8):
  """`out_switch` (module docstring): `n` steps, the output block changing every `k` steps."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    nout = n // k

    def kernel(x_ref, o_ref, acc_ref):
      kk = pl.program_id(len(grid) - 1)

      _zero_when(pl, jnp, kk == 0, (acc_ref,))

      acc_ref[...] += x_ref[...]

      @pl.when(kk == k - 1)
      def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    if mode == "fixed3d":
      grid = (8, 8, k)
      xspec = pl.BlockSpec((_B, _B), lambda i, j, s: (0, 0))
      ospec = pl.BlockSpec((_B, _B), lambda i, j, s: (i, j))
      oshape = (8 * _B, 8 * _B)
    else:
      grid = (nout, k)
      xspec = pl.BlockSpec((_B, _B), (lambda i, s: ((i * k + s) % m, 0)) if mode == "moving" else
                           (lambda i, s: (0, 0)))
      ospec = pl.BlockSpec((_B, _B), lambda i, s: (i, 0))
      oshape = (nout * _B, _B)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(oshape, jnp.dtype(out_dtype)), grid=grid,
        in_specs=[xspec], out_specs=ospec, scratch_shapes=[pltpu.VMEM((_B, _B), jnp.float32)])
    return call, (_rand((m * _B, _B), "float32", 50),)
  return build


def out_switch_cases() -> list[Case]:
  F = "out_switch"
  out = [Case(f"osw_fixed_k{k}", F, _out_switch("fixed", k)) for k in (1, 2, 8, 512)]
  out += [Case(f"osw_moving_k{k}", F, _out_switch("moving", k)) for k in (1, 8)]
  out += [Case("osw_fixed3d_k8", F, _out_switch("fixed3d", 8)),
          Case("osw_fixed_k8_bf16", F, _out_switch("fixed", 8, "bfloat16"))]
  return out


def _skip(mode, n=512, m=8):
  """`skip_step` (module docstring): grid (n,), k and v (128, 128) bf16 blocks, the flash step's body run
  on 4 steps of every 8 ('when': under pl.when, k and v clamped to block 0 on the others, as the wheel's
  causal kernel does; 'clamp': the same maps, the body always run; 'whenfixed': the pl.when, fixed
  blocks; 'acc_when': 'when' with the light body)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    scratch = [pltpu.VMEM((_B, _B), jnp.float32) for _ in range(3)]

    def run_mask(i):
      return i % 8 < 4

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
      i = pl.program_id(0)

      _zero_when(pl, jnp, i == 0, (m_ref, l_ref, acc_ref))

      refs = (q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref)
      if mode == "clamp":
        wheel_compute(jax, jnp, "full", _B, *refs)
      else:
        @pl.when(run_mask(i))
        def _():
          if mode == "acc_when":
            _light(jnp, *refs)
          else:
            wheel_compute(jax, jnp, "full", _B, *refs)

      @pl.when(i == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    blk = (_B, _B)
    fixed = pl.BlockSpec(blk, lambda i: (0, 0))
    if mode == "whenfixed":
      moving = fixed
    else:
      moving = pl.BlockSpec(blk, lambda i: (jax.lax.select(run_mask(i), i % m, 0), 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(blk, jnp.float32), grid=(n,),
                          in_specs=[fixed, moving, moving], out_specs=fixed, scratch_shapes=scratch)
    return call, (_rand(blk, "bfloat16", 30), _rand((m * _B, _B), "bfloat16", 31), _rand((m * _B, _B), "bfloat16", 32))
  return build


def skip_step_cases() -> list[Case]:
  F = "skip_step"
  return [Case(f"skip_{mode}", F, _skip(mode)) for mode in ("when", "clamp", "whenfixed", "acc_when")]


def _copy_cost(body, rows, n=512, m=8):
  """`copy_cost` (module docstring): grid (n,), two moving (rows, 128) f32 inputs cycling over `m` blocks."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    blk = (_B, _B)

    def kernel(x_ref, y_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, r_ref):
      _zero_when(pl, jnp, pl.program_id(0) == 0, (m_ref, l_ref, acc_ref, r_ref))

      r_ref[...] += x_ref[:8, :] + y_ref[:8, :]
      if body == "heavy":
        wheel_compute(jax, jnp, "full", _B, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]
        o_ref[:8, :] += r_ref[...]

    moving = pl.BlockSpec((rows, _B), lambda i: (i % m, 0))
    fixed = pl.BlockSpec(blk, lambda i: (0, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(blk, jnp.float32), grid=(n,),
        in_specs=[moving, moving, fixed, fixed, fixed], out_specs=fixed,
        scratch_shapes=[pltpu.VMEM(blk, jnp.float32) for _ in range(3)] + [pltpu.VMEM((8, _B), jnp.float32)])
    return call, (_rand((m * rows, _B), "float32", 60), _rand((m * rows, _B), "float32", 61),
                  _rand(blk, "bfloat16", 30), _rand(blk, "bfloat16", 31), _rand(blk, "bfloat16", 32))
  return build


def copy_cost_cases() -> list[Case]:
  F = "copy_cost"
  return [Case(f"ccost_{body}_r{rows}", F, _copy_cost(body, rows))
          for body in ("light", "heavy") for rows in (8, 32, 64, 128, 256)]


def wheel_move_cases() -> list[Case]:
  F = "wheel_move"
  return [Case(f"wmove_{op}_{mode}", F, _wheel_moving(op, mode))
          for op in ("full", "acc") for mode in ("mod", "smem", "smemwhen", "flash3")] + [
      Case(f"wmove_full_{mode}", F, _wheel_moving("full", mode)) for mode in ("flash3sq", "flash3c")]
