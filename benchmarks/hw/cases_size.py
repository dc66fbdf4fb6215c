"""Session 30's measured kernels: does a kernel's step cost grow with its operands' size?

The wheel's flash attention at head_dim 64 (default blocks, non-causal) costs the chip 646 cycles a
grid step at batch 4 / seq 512 (`flash_full_b4h8s512d64`, 220 us) and 689 / 731 / 756 at batch 32 and
seq 512 / 1024 / 2048 (`fa_published`, 1.9-33 ms), all with the same (128, 64) blocks; at head_dim 128
two launches of 4 MiB operands cost 733 and 732 whatever their length. These cases separate the
operands' size (batch, sequence) from the launch's length (`flash_size`), and time again the one
recorded kernel whose own op is implausibly short (`gather_bf16_rows1_8192x2048_n512`: 13 us for 512
steps of one 4 KiB copy each, after a 91 us relayout copy of its table) with four times the steps and
a quarter of the table (`gather_rows1`).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _flash, _gather_rows, _jax, _rand


def flash_size_cases() -> list[Case]:
  F = "flash_size"
  return [Case(f"fsize_b{b}h8s{s}d{d}", F, _flash(b, 8, s, d, False))
          for b, s, d in ((8, 512, 64), (16, 512, 64), (32, 512, 64), (4, 1024, 64), (4, 2048, 64),
                          (1, 512, 64), (8, 1024, 128))]


def gather_rows1_cases() -> list[Case]:
  F = "gather_rows1"
  return [Case("grow1_bf16_8192x2048_n2048", F, _gather_rows(8192, 2048, 2048, 1, "bfloat16")),
          Case("grow1_bf16_2048x2048_n512", F, _gather_rows(2048, 2048, 512, 1, "bfloat16")),
          Case("grow1_f32_8192x2048_n512", F, _gather_rows(8192, 2048, 512, 1, "float32"))]


def _head_step(op: str, d: int, n: int = 512):
  """`fixed_grid`'s frame (fixed blocks, `n` steps) with one part of the wheel's flash step at head_dim
  `d`: 'qk' (s = q k^T of (128, d) bf16 q and k, contraction d, accumulated into a (128, 128) f32
  scratch), 'pv' (acc += p v: a (128, 128) bf16 p by a (128, d) bf16 v) or 'full' (the wheel's step:
  q k^T, row max, exp, row sum, the rescale and p v into a (128, d) accumulator)."""
  def build():
    from benchmarks.hw.cases_fence import fixed_grid  # noqa: PLC0415
    jax, jnp, pl, pltpu = _jax()
    nt = (((1,), (1,)), ((), ()))
    acc_shape = (128, 128) if op == "qk" else (128, d)

    def body(ins, o_ref, scratch):
      q_ref, k_ref, v_ref = ins
      m_ref, l_ref, acc_ref = scratch
      if op == "pv":
        acc_ref[...] += jnp.dot(q_ref[...], v_ref[...], preferred_element_type=jnp.float32)
        return
      s = jax.lax.dot_general(q_ref[...], k_ref[...], nt, preferred_element_type=jnp.float32)
      if op == "qk":
        acc_ref[...] += s
        return
      m_prev, l_prev = m_ref[...], l_ref[...]
      m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
      p = jnp.exp(s - m_next)
      alpha = jnp.exp(m_prev - m_next)
      l_corr = alpha * l_prev
      l_next = jnp.sum(p, axis=1)[:, None] + l_corr
      m_ref[...], l_ref[...] = m_next, l_next
      pv = jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
      inv = jnp.where(l_next == 0.0, 1.0, 1.0 / l_next)
      reps = (1, d // 128) if d >= 128 else None
      l_corr_d = jnp.tile(l_corr * inv, reps) if reps else (l_corr * inv)[:, :d]
      inv_d = jnp.tile(inv, reps) if reps else inv[:, :d]
      acc_ref[...] = acc_ref[...] * l_corr_d + pv * inv_d

    def finish(o_ref, scratch):
      o_ref[...] = scratch[2][...]

    q_block = (128, 128) if op == "pv" else (128, d)
    call = fixed_grid(jax, jnp, pl, n, [q_block, (128, d), (128, d)], acc_shape,
                      [pltpu.VMEM((128, 128), jnp.float32), pltpu.VMEM((128, 128), jnp.float32),
                       pltpu.VMEM(acc_shape, jnp.float32)], body, finish)
    return call, (_rand(q_block, "bfloat16", 30), _rand((128, d), "bfloat16", 31),
                  _rand((128, d), "bfloat16", 32))
  return build


def head_dim_cases() -> list[Case]:
  """`head_dim`: what a flash step's dots and the whole step cost at head_dim 32-256 on fixed blocks
  (the chip's d = 64 flash launches cost ~640 cycles a step against d = 128's ~733; palace charges a
  (128, 64) x (64, 128) dot what it charges a (128, 128) x (128, 128) one)."""
  F = "head_dim"
  return ([Case(f"hdim_qk_d{d}", F, _head_step("qk", d)) for d in (32, 64, 128, 256)]
          + [Case(f"hdim_pv_d{d}", F, _head_step("pv", d)) for d in (64, 128, 256)]
          + [Case(f"hdim_full_d{d}", F, _head_step("full", d)) for d in (64, 128)])


def _row_end(variant: str, rows: int = 64, nkv: int = 8):
  """A causal flash grid taken apart at its q rows' ends: a (rows, nkv) grid of the wheel's flash step
  (`cases_parts.wheel_compute`, fixed-size (128, 128) bf16 q, k, v blocks) on the blocks a causal
  launch runs (kv <= row % nkv), k and v clamped to block 0 on the skipped steps as the wheel's index
  maps do, the (128, 128) bf16 output block of the row written at its last kv step. Variants:
  'causal' (that); 'nostore' (the output block fixed, written once at the end: no change at a row's
  end); 'full' (every step runs: the row ends in a running step); 'late' (the running steps are the
  row's last ones, kv >= nkv - 1 - row % nkv, the skipped ones first: the same work as 'causal' with
  the row ending in a running step); 'noclamp' (the skipped steps keep the row's diagonal k and v
  block instead of block 0: no copy at the first skip, one at the next row's first step); 'fixedq' (q's
  block fixed: no q copy at a row change); 'light' (the running steps' body a light add of k's and v's
  first columns instead of the flash step); 'lightfull' ('light' with every step running)."""
  def build():
    from benchmarks.hw.cases_parts import wheel_compute  # noqa: PLC0415
    jax, jnp, pl, pltpu = _jax()
    lax = jax.lax

    def runs(r, kv):
      if variant in ("full", "lightfull"):
        return kv >= 0
      if variant == "late":
        return kv >= nkv - 1 - r % nkv
      return kv <= r % nkv

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
      r, kv = pl.program_id(0), pl.program_id(1)

      @pl.when(kv == 0)
      def _():
        m_ref[...] = jnp.full_like(m_ref, -1e30)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

      @pl.when(runs(r, kv))
      def _():
        if variant in ("light", "lightfull"):
          acc_ref[:, :1] += k_ref[:, :1].astype(jnp.float32) + v_ref[:, :1].astype(jnp.float32)
        else:
          wheel_compute(jax, jnp, "full", 128, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref)

      last = (kv == nkv - 1) if variant != "nostore" else jnp.logical_and(kv == nkv - 1, r == rows - 1)

      @pl.when(last)
      def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def kv_map(r, kv):
      if variant in ("full", "lightfull"):
        return (kv, 0)
      first = {"late": nkv - 1 - r % nkv, "noclamp": r % nkv}.get(variant, 0)
      return (lax.select(runs(r, kv), kv, first), 0)

    q_map = (lambda r, kv: (0, 0)) if variant == "fixedq" else (lambda r, kv: (r, 0))

    out_map = (lambda r, kv: (0, 0)) if variant == "nostore" else (lambda r, kv: (r, 0))
    n_out = 1 if variant == "nostore" else rows
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((n_out * 128, 128), jnp.bfloat16), grid=(rows, nkv),
        in_specs=[pl.BlockSpec((128, 128), q_map), pl.BlockSpec((128, 128), kv_map),
                  pl.BlockSpec((128, 128), kv_map)],
        out_specs=pl.BlockSpec((128, 128), out_map),
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32) for _ in range(3)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary")))
    return call, (_rand((rows * 128, 128), "bfloat16", 40), _rand((nkv * 128, 128), "bfloat16", 41),
                  _rand((nkv * 128, 128), "bfloat16", 42))
  return build


def row_end_cases() -> list[Case]:
  """`row_end`: where a causal flash launch's q rows end (`_row_end`)."""
  F = "row_end"
  return [Case(f"rend_{v}", F, _row_end(v)) for v in ("causal", "nostore", "full", "late", "noclamp", "fixedq",
                                                       "light", "lightfull")]
