"""Session 35 (`eup_stream`, measured for the next model step): why an exp stream does not overlap an
MXU dot or an XLU lane max on the chip (`unit_overlap`, session 23: dot + exp at 2048 rows costs the
chip 1013 cycles a step against 719 / 371 alone; palace overlaps them, -28%), while the two overlap each
other and a dependent exp -> dot pair streams. Fixed (rows, 128) f32 blocks, one step's work a grid step
(`cases_fence.fixed_grid`), the exp stream taken apart beside nothing, a dot or a lane max:
- `vpu`: c += b * 1e-3 (the same loads and store, no EUP);
- `exp`: c += exp(b * 1e-3) (`unit_overlap`'s stream); `exp_noacc`: c = exp(b * 1e-3) (one load fewer);
- `exp_sum`: a column sum of exp(b * 1e-3) into an (8, 128) accumulator (no big store);
- `exp2`: c += exp(exp(b * 1e-3) * 1e-3) (two EUP ops a vreg); `tanh`: c += tanh(b * 1e-3).
Nothing here imports palace (same conventions as cases.py).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_fence import fixed_grid

_LANES = 128


def _stream(ops, rows, n=256):
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (x_ref, w_ref), (a_ref, b_ref, c_ref, r_ref, s_ref) = ins, scratch
      for op in ops:
        if op == "dot":
          a_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
        elif op == "max":
          r_ref[...] += jnp.max(b_ref[...], axis=-1, keepdims=True)
        elif op == "vpu":
          c_ref[...] += b_ref[...] * 1e-3
        elif op == "exp":
          c_ref[...] += jnp.exp(b_ref[...] * 1e-3)
        elif op == "exp_noacc":
          c_ref[...] = jnp.exp(b_ref[...] * 1e-3)
        elif op == "exp_sum":
          e = jnp.exp(b_ref[...] * 1e-3)
          s_ref[...] += e.reshape(rows // 8, 8, _LANES).sum(axis=0)
        elif op == "exp2":
          c_ref[...] += jnp.exp(jnp.exp(b_ref[...] * 1e-3) * 1e-3)
        elif op == "tanh":
          c_ref[...] += jnp.tanh(b_ref[...] * 1e-3)
        else:
          raise ValueError(op)

    def finish(o_ref, scratch):
      a_ref, _, c_ref, r_ref, s_ref = scratch
      o_ref[...] = a_ref[...] + c_ref[...] + r_ref[...] + jnp.tile(s_ref[...], (rows // 8, 1))

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES), (_LANES, _LANES)], (rows, _LANES),
                      [pltpu.VMEM((rows, _LANES), jnp.float32) for _ in range(3)]
                      + [pltpu.VMEM((rows, 1), jnp.float32), pltpu.VMEM((8, _LANES), jnp.float32)],
                      body, finish)
    return call, (_rand((rows, _LANES), "bfloat16", 1), _rand((_LANES, _LANES), "bfloat16", 2) * 0.1)
  return build


_CASES = [("vpu",), ("exp",), ("exp_noacc",), ("exp_sum",), ("exp2",), ("tanh",),
          ("dot", "vpu"), ("dot", "exp_noacc"), ("dot", "exp_sum"), ("dot", "exp2"),
          ("max", "vpu"), ("max", "exp_sum")]


def eup_stream_cases() -> list[Case]:
  return [Case(f"eups_{'_'.join(ops)}_r2048", "eup_stream", _stream(ops, 2048)) for ops in _CASES]
