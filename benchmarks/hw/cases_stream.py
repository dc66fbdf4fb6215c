"""Session 23's chip call: the two questions session 22's data left for the next model step.

`sync_size`: is a pipelined step's DMA wait a latency counted from the copy's landing (a step of
compute c with moving inputs costs about max(c + a little, (round trip + c) / 2), as `sync_sweep`
suggests for two 32 KiB inputs) or a stall paid after the wait is reached (the model's rule since
session 19)? The same pipeline as `sync_sweep` (`cases_fence._pipe`) with 1, 2 or 4 moving f32 input
blocks of 8, 32 or 128 KiB, beside no work or 2048 rows of vector work (and that work with fixed blocks).

`stream_pair`: does a consumer op stream behind its producer when the consumer's unit is slower (the
model lets a consumer's busy cycles start when it issues, before its producer has made anything), or do
the two units' times add? A producer and a consumer on different units, on (rows, 128) values of 128,
512 and 2048 rows, one pair a grid step, no copies: an MXU dot into a lane max (XLU), an MXU dot into
exp (EUP), a lane max broadcast back and subtracted then exp (XLU -> VPU -> EUP), exp into an MXU dot
(EUP -> MXU); and flash attention's inner step with fixed blocks of 256 rows (`cases_fence._flash_part`;
its 128-row form was measured in session 22).

`unit_overlap` (the same call's second half): do independent MXU, XLU and EUP work in one step overlap
(the step costs the longest unit) or add? Each alone and in pairs on 512 and 2048 rows, fixed blocks;
and flash attention's inner step at 256 rows cut into parts (q k^T; + the row max; + exp and the row
sum; + p v) and whole at 512 rows, fixed blocks, where session 23's first call found the step 46% longer
than the model. `pv_parts` (a third call): that step's p v part taken apart (the K = 256 dot from a loaded
LHS, from a cast, from an exp; with the rescale; the whole softmax-and-dot from a loaded s), and the
same at 128 rows, a K = 512 dot and a 512-row one. `xlu_eup` (a fourth call): row reductions fed by
exp and exp fed by a row reduction (sum, exp then sum, exp then max, max then exp then sum) on 8-2048
rows, where `pv_parts` located the missing cycles. `chain_dot` (a fifth call): those chains feeding an
MXU dot (one consumer of the exp stream, or the row sum and the dot both), and a dot beside an
independent row sum.

Same conventions as `cases.py` (public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_fence import _flash_part, _pipe, _sum_out, fixed_grid, flash_step

_LANES = 128


def _pair(op, rows, n=256):
  """A pallas_call grid of `n` steps on fixed (rows, 128) blocks (no copies after the first): one
  producer -> consumer pair (module docstring) a step, accumulated into f32 VMEM scratch."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (x_ref, w_ref), (acc_ref, r_ref) = ins, scratch
      x = x_ref[...]
      if op == "dot_max":
        s = jnp.dot(x, w_ref[...], preferred_element_type=jnp.float32)
        r_ref[...] += jnp.max(s, axis=-1, keepdims=True)
      elif op == "dot_exp":
        s = jnp.dot(x, w_ref[...], preferred_element_type=jnp.float32)
        acc_ref[...] += jnp.exp(s * 1e-2)
      elif op == "max_exp":
        v = acc_ref[...] * 0.5 + x.astype(jnp.float32)
        acc_ref[...] = jnp.exp(v - jnp.max(v, axis=-1, keepdims=True))
      elif op == "exp_dot":
        p = jnp.exp(acc_ref[...] * 1e-3 + x.astype(jnp.float32))
        acc_ref[...] = jnp.dot(p.astype(jnp.bfloat16), w_ref[...], preferred_element_type=jnp.float32) * 1e-3
      else:
        raise ValueError(op)

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES), (_LANES, _LANES)], (rows, _LANES),
                      [pltpu.VMEM((rows, _LANES), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32)],
                      body, _sum_out)
    return call, (_rand((rows, _LANES), "bfloat16", 1), _rand((_LANES, _LANES), "bfloat16", 2) * 0.1)
  return build


def sync_size_cases() -> list[Case]:
  F = "sync_size"
  out = []
  for kib, block_rows in ((8, 16), (32, 64), (128, 256)):
    for inputs in (1, 2, 4):
      for rows in (0, 2048):
        out.append(Case(f"ssize_vpu{rows}_in{inputs}_b{kib}KiB", F,
                        _pipe("vpu", rows, inputs, block_rows=block_rows, n=256)))
  out.append(Case("ssize_vpu2048_in1_b8KiB_fixed", F, _pipe("vpu", 2048, 1, moving=False, block_rows=16,
                                                            n=256)))
  return out


def stream_pair_cases() -> list[Case]:
  F = "stream_pair"
  out = [Case(f"spair_{op}_r{rows}", F, _pair(op, rows))
         for op in ("dot_max", "dot_exp", "max_exp", "exp_dot") for rows in (128, 512, 2048)]
  out.append(Case("spair_flash_full_fixed_blk256", F, _flash_part("full", moving=False, n=256, blk=256)))
  return out


def _units(ops, rows, n=256):
  """A pallas_call grid of `n` steps on fixed blocks: in each step the independent pieces of work named
  in `ops` ('dot': an (rows, 128) x (128, 128) bf16 dot accumulated into f32 scratch; 'max': a lane max
  of an (rows, 128) f32 scratch accumulated into a column; 'exp': exp of an (rows, 128) f32 scratch
  accumulated into another), each on its own data."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (x_ref, w_ref), (a_ref, b_ref, c_ref, r_ref) = ins, scratch
      if "dot" in ops:
        a_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
      if "max" in ops:
        r_ref[...] += jnp.max(b_ref[...], axis=-1, keepdims=True)
      if "exp" in ops:
        c_ref[...] += jnp.exp(b_ref[...] * 1e-3)

    def finish(o_ref, scratch):
      a_ref, _, c_ref, r_ref = scratch
      o_ref[...] = a_ref[...] + c_ref[...] + r_ref[...]

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES), (_LANES, _LANES)], (rows, _LANES),
                      [pltpu.VMEM((rows, _LANES), jnp.float32) for _ in range(3)]
                      + [pltpu.VMEM((rows, 1), jnp.float32)], body, finish)
    return call, (_rand((rows, _LANES), "bfloat16", 1), _rand((_LANES, _LANES), "bfloat16", 2) * 0.1)
  return build


def _flash_cut(part, blk, n=256):
  """Flash attention's inner step on fixed (blk, 128) bf16 q, k, v blocks, cut at `part` ('qk': s = q k^T
  accumulated into a (blk, blk) f32 scratch; 'max': + the running row max; 'softmax': + exp(s - m), the
  row sum and the l update, p accumulated; 'full': + p v and the rescaled (blk, 128) accumulator)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, s_ref):
      flash_step(jax, jnp, pl, part, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, s_ref)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + s_ref[:, 0:_LANES] + l_ref[...]

    fixed = lambda i: (0, 0)  # noqa: E731
    spec = pl.BlockSpec((blk, _LANES), fixed)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((blk, _LANES), jnp.float32), grid=(n,),
        in_specs=[spec, spec, spec], out_specs=spec,
        scratch_shapes=[pltpu.VMEM((blk, 1), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32),
                        pltpu.VMEM((blk, _LANES), jnp.float32), pltpu.VMEM((blk, blk), jnp.float32)])
    return call, tuple(_rand((blk, _LANES), "bfloat16", k) for k in (1, 2, 3))
  return build


def unit_overlap_cases() -> list[Case]:
  F = "unit_overlap"
  out = []
  for rows in (512, 2048):
    for ops in (("dot",), ("max",), ("exp",), ("dot", "max"), ("dot", "exp"), ("max", "exp")):
      out.append(Case(f"uover_{'_'.join(ops)}_r{rows}", F, _units(ops, rows)))
  for part in ("qk", "max", "softmax", "full"):
    out.append(Case(f"uover_flash_{part}_blk256", F, _flash_cut(part, 256)))
  out.append(Case("uover_flash_full_blk512", F, _flash_cut("full", 512, n=128)))
  return out


def _pv(op, blk=256, k=256, n=256):
  """The p v part of a flash step on fixed blocks, taken apart: a (blk, k) x (k, 128) bf16 dot into an
  f32 (blk, 128) accumulator with its LHS 'ref' (loaded bf16), 'cast' (loaded f32, cast to bf16), 'exp'
  (exp of loaded f32, cast), 'rescale' (loaded bf16, and the accumulator rescaled by a loaded (blk, 1)
  column), or 'softmax' (flash's whole step from a loaded s: row max, exp, row sum, cast, dot, rescale)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (p_ref, s_ref, v_ref, c_ref), (acc_ref, l_ref) = ins, scratch
      if op == "ref" or op == "rescale":
        p = p_ref[...]
      elif op == "cast":
        p = s_ref[...].astype(jnp.bfloat16)
      elif op == "exp":
        p = jnp.exp(s_ref[...] - 1.0).astype(jnp.bfloat16)
      else:
        s = s_ref[...]
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        l_ref[...] = l_ref[...] * c_ref[...] + jnp.sum(e, axis=-1, keepdims=True)
        p = e.astype(jnp.bfloat16)
      pv = jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)
      if op in ("rescale", "softmax"):
        acc_ref[...] = acc_ref[...] * c_ref[...] + pv
      else:
        acc_ref[...] += pv

    call = fixed_grid(jax, jnp, pl, n, [(blk, k), (blk, k), (k, _LANES), (blk, 1)], (blk, _LANES),
                      [pltpu.VMEM((blk, _LANES), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32)],
                      body, _sum_out)
    return call, (_rand((blk, k), "bfloat16", 1), _rand((blk, k), "float32", 2),
                  _rand((k, _LANES), "bfloat16", 3), _rand((blk, 1), "float32", 4) * 0.01 + 1.0)
  return build


def pv_part_cases() -> list[Case]:
  F = "pv_parts"
  out = [Case(f"pv_{op}_blk256_k256", F, _pv(op)) for op in ("ref", "cast", "exp", "rescale", "softmax")]
  out += [Case(f"pv_{op}_blk128_k128", F, _pv(op, blk=128, k=128)) for op in ("ref", "softmax")]
  out.append(Case("pv_ref_blk256_k512", F, _pv("ref", k=512)))
  out.append(Case("pv_ref_blk512_k128", F, _pv("ref", blk=512, k=128)))
  return out


def _red(op, rows, n=256):
  """One chain of lane reductions and exps a step on a fixed f32 (rows, 128) block v (no copies):
  'sum': the row sum of v; 'exp_sum': the row sum of exp(v); 'exp_max': the row max of exp(v);
  'max_exp_sum': m = the row max, then the row sum of exp(v - m); each accumulated into an (rows, 1)
  f32 column."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (v_ref,), (r_ref,) = ins, scratch
      v = v_ref[...]
      if op == "sum":
        r = jnp.sum(v, axis=-1, keepdims=True)
      elif op == "exp_sum":
        r = jnp.sum(jnp.exp(v), axis=-1, keepdims=True)
      elif op == "exp_max":
        r = jnp.max(jnp.exp(v), axis=-1, keepdims=True)
      elif op == "max_exp_sum":
        r = jnp.sum(jnp.exp(v - jnp.max(v, axis=-1, keepdims=True)), axis=-1, keepdims=True)
      else:
        raise ValueError(op)
      r_ref[...] += r

    def finish(o_ref, scratch):
      o_ref[...] = scratch[0][...]

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES)], (rows, 1), [pltpu.VMEM((rows, 1), jnp.float32)],
                      body, finish)
    return call, (_rand((rows, _LANES), "float32", 1),)
  return build


def xlu_eup_cases() -> list[Case]:
  F = "xlu_eup"
  return [Case(f"xe_{op}_r{rows}", F, _red(op, rows))
          for op in ("sum", "exp_sum", "exp_max", "max_exp_sum") for rows in (8, 128, 512, 2048)]


def _chain_dot(op, rows, n=256):
  """A chain of row reductions, exp and an MXU dot on a fixed f32 (rows, 128) block s (no copies):
  'exp_dot': acc += exp(s) v; 'exp_sum_dot': p = exp(s), the row sum of p and acc += p v (two consumers of
  one exp stream); 'max_dot': acc += exp(s - max(s)) v; 'max_sum_dot': flash's chain without its
  rescale (row max, exp, row sum, dot); 'dot_and_sum': an independent dot of a bf16 block and row sum of s."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (s_ref, x_ref, v_ref), (acc_ref, r_ref) = ins, scratch
      s = s_ref[...]
      if op == "dot_and_sum":
        acc_ref[...] += jnp.dot(x_ref[...], v_ref[...], preferred_element_type=jnp.float32)
        r_ref[...] += jnp.sum(s, axis=-1, keepdims=True)
      else:
        if op in ("max_dot", "max_sum_dot"):
          s = s - jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s)
        if op in ("exp_sum_dot", "max_sum_dot"):
          r_ref[...] += jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] += jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES), (rows, _LANES), (_LANES, _LANES)],
                      (rows, _LANES),
                      [pltpu.VMEM((rows, _LANES), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32)],
                      body, _sum_out)
    return call, (_rand((rows, _LANES), "float32", 1), _rand((rows, _LANES), "bfloat16", 2),
                  _rand((_LANES, _LANES), "bfloat16", 3) * 0.1)
  return build


def chain_dot_cases() -> list[Case]:
  F = "chain_dot"
  out = [Case(f"cdot_{op}_r{rows}", F, _chain_dot(op, rows))
         for op in ("exp_dot", "exp_sum_dot", "max_dot", "max_sum_dot", "dot_and_sum") for rows in (128, 512)]
  out += [Case(f"cdot_{op}_r2048", F, _chain_dot(op, 2048))
          for op in ("exp_dot", "exp_sum_dot", "max_sum_dot")]
  return out
