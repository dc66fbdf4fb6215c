"""What a DMA wait costs beside vector and MXU work, and what a loop does to a chain of dependent ops
(session 21's chip run): the `dma_fence` and `loop_ilp` families.

Sessions 19-20 left one question open: with no vector work, a ring of copies behaves as if the whole
wait (the DMA-wait sync included) were a latency that overlaps other copies' latencies; in pipelines
with vector or MXU work the chip pays about the sync's cycles a step on top of the work. These cases
time one hand-written loop of `n` iterations that starts a copy, does a fixed amount of vector (or
MXU) work on a VMEM scratch, and waits for a copy, in four arrangements (`mode`):
  * `none`: the work alone, no copy (the reference);
  * `hidden`: start copy i + 1, work, wait copy i (a ring of two: the copy has a whole iteration);
  * `serial`: start copy i, wait it, work;
  * `dep`: as `hidden`, and the work reads the landed copy;
and `loop_ilp` asks whether the chip overlaps the iterations of a `fori_loop` (a chain of dependent ops
rolled, unrolled by 8, and two independent chains in one loop). Same conventions as `cases.py`
(public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand

_LANES = 128


def _work(kind):
  """One iteration's work on the scratch ref `s` (weights `w`; `extra`: a value added first)."""
  def vpu(s, w, extra):
    v = s[...] * 1.0001 + 0.5
    if extra is not None:
      v = v + extra
    s[...] = v

  def mxu(s, w, extra):
    v = s[...]
    if extra is not None:
      v = v + extra
    s[...] = jax_dot(v.astype(w.dtype), w[...])

  return vpu if kind == "vpu" else mxu


def jax_dot(a, b):
  jax, jnp, _, _ = _jax()
  return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _fence(kind, rows, mode, copy_kib=4, n=512):
  """`n` iterations of `kind` work ('vpu': one multiply-add pass over an f32 (rows, 128) scratch; 'mxu':
  a (rows, 128) x (128, 128) bf16 dot into it) beside one HBM->VMEM copy of `copy_kib` KiB per
  iteration arranged as `mode` (module docstring)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    crow = copy_kib * 1024 // (4 * _LANES)
    work = _work(kind)

    def kernel(x_hbm, w_ref, o_ref, s, buf, sem):
      s[...] = jnp.zeros_like(s)

      def cp(i):
        j = i % 2
        return pltpu.make_async_copy(x_hbm.at[pl.ds(i * crow, crow)], buf.at[j], sem.at[j])

      def extra(i):
        if mode != "dep":
          return None
        landed = buf[i % 2]
        return jnp.broadcast_to(landed[0:8], (rows // 8, 8, _LANES)).reshape(rows, _LANES) if rows >= 8 \
            else landed[0:rows]

      if mode == "hidden" or mode == "dep":
        cp(0).start()

      def body(i, c):
        if mode == "none":
          work(s, w_ref, None)
        elif mode == "serial":
          cp(i).start()
          cp(i).wait()
          work(s, w_ref, None)
        else:
          @pl.when(i + 1 < n)
          def _():
            cp(i + 1).start()
          if mode == "dep":
            cp(i).wait()
            work(s, w_ref, extra(i))
          else:
            work(s, w_ref, None)
            cp(i).wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = s[0:8]

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, _LANES), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((rows, _LANES), jnp.float32),
                        pltpu.VMEM((2, crow, _LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))])
    return call, (_rand((n * crow, _LANES), "float32"), _rand((_LANES, _LANES), "bfloat16", 2) * 0.05)
  return build


def _ilp(op, chains, unroll, n):
  """`n` iterations of `chains` independent dependent chains of one small op on (8, 128) f32 values in
  a `fori_loop` unrolled by `unroll` (1: rolled)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def step(x, w):
      if op == "fma":
        return x * 1.0001 + 0.5
      if op == "lane_max":
        return x - jnp.max(x, axis=-1, keepdims=True) * 0.5
      if op == "dot":
        return jnp.dot(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
      raise ValueError(op)

    def kernel(x_ref, w_ref, o_ref):
      w = w_ref[...]
      x0 = x_ref[...]
      init = tuple(x0 + float(k) for k in range(chains))
      out = jax.lax.fori_loop(0, n, lambda i, xs: tuple(step(x, w) for x in xs), init, unroll=unroll)
      acc = out[0]
      for y in out[1:]:
        acc = acc + y
      o_ref[...] = acc

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, _LANES), jnp.float32))
    return call, (_rand((8, _LANES), "float32", 1) * 0.01, _rand((_LANES, _LANES), "bfloat16", 2) * 0.05)
  return build


def fence_cases() -> list[Case]:
  F = "dma_fence"
  out = []
  for kind, rows in (("vpu", 256), ("vpu", 1024), ("vpu", 4096), ("mxu", 128), ("mxu", 2048)):
    for mode in ("none", "hidden", "serial", "dep"):
      out.append(Case(f"fence_{kind}{rows}_{mode}", F, _fence(kind, rows, mode)))
  for mode in ("none", "hidden", "serial"):
    out.append(Case(f"fence_vpu256_{mode}_copy64KiB", F, _fence("vpu", 256, mode, copy_kib=64, n=128)))
  out.append(Case("fence_vpu8_hidden", F, _fence("vpu", 8, "hidden")))
  return out


def ilp_cases() -> list[Case]:
  F = "loop_ilp"
  out = []
  for op, n in (("fma", 1024), ("lane_max", 512), ("dot", 256)):
    for chains, unroll in ((1, 1), (1, 8), (2, 1), (4, 1)):
      out.append(Case(f"ilp_{op}_chains{chains}_unroll{unroll}_x{n}", F, _ilp(op, chains, unroll, n)))
  return out


def chunk_cases() -> list[Case]:
  """`dma_chunk`: where between 32 and 64 KiB a read starts paying for a write started beside it
  (session 20: reads of 16-32 KiB pay almost nothing, reads of 64 KiB and more the write's whole
  transfer and a turnaround)."""
  from benchmarks.hw.cases_curve import _pair  # noqa: PLC0415  (imports cases, as this module does)
  F = "dma_chunk"
  out = []
  for r in (40, 48, 56, 96):
    out.append(Case(f"chunk_pair_w64_then_r{r}", F, _pair(64, r, True)))
    out.append(Case(f"chunk_pair_r{r}_then_w64", F, _pair(r, 64, False)))
  for w in (8, 128):
    out.append(Case(f"chunk_pair_r64_then_w{w}", F, _pair(64, w, False)))
  return out


def _pipe(kind, rows, inputs, moving=True, block_rows=8, n=512):
  """A pallas_call grid of `n` steps, `inputs` f32 (block_rows, 128) input blocks a step (a new block
  each step when `moving`, else the same block every step: no copy), an (8, 128) output resident
  across the grid, and `kind` work ('vpu' / 'mxu', as `_fence`; rows 0: none) on a VMEM scratch: what
  the pallas_call pipeline costs a step beside the work that `_fence`'s hand-written loop does not."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    work = _work(kind)

    def kernel(*refs):
      xs, w_ref, o_ref = refs[:inputs], refs[inputs], refs[inputs + 1]

      @pl.when(pl.program_id(0) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
        if rows:
          refs[-1][...] = jnp.zeros_like(refs[-1])

      if rows:
        work(refs[-1], w_ref, None)
      acc = xs[0][0:8]
      for x in xs[1:]:
        acc = acc + x[0:8]
      o_ref[...] += acc

    idx = (lambda i: (i, 0)) if moving else (lambda i: (0, 0))
    in_specs = [pl.BlockSpec((block_rows, _LANES), idx) for _ in range(inputs)]
    in_specs.append(pl.BlockSpec((_LANES, _LANES), lambda i: (0, 0)))
    scratch = [pltpu.VMEM((max(rows, 8), _LANES), jnp.float32)] if rows else []
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, _LANES), jnp.float32), grid=(n,),
                          in_specs=in_specs, out_specs=pl.BlockSpec((8, _LANES), lambda i: (0, 0)),
                          scratch_shapes=scratch)
    args = tuple(_rand((n * block_rows, _LANES), "float32", k) for k in range(inputs))
    return call, args + (_rand((_LANES, _LANES), "bfloat16", 9) * 0.05,)
  return build


def pipe_cases() -> list[Case]:
  """`pipe_fence`: `_fence`'s work inside a pallas_call pipeline with 1-3 moving 4 KiB input blocks."""
  F = "pipe_fence"
  out = []
  for kind, rows in (("vpu", 0), ("vpu", 4096), ("mxu", 2048)):
    for inputs in (1, 2, 3):
      if kind == "mxu" and inputs == 2:
        continue
      out.append(Case(f"pipe_{kind}{rows}_in{inputs}", F, _pipe(kind, rows, inputs)))
  out.append(Case("pipe_vpu4096_in1_fixed", F, _pipe("vpu", 4096, 1, moving=False)))
  out.append(Case("pipe_mxu2048_in1_fixed", F, _pipe("mxu", 2048, 1, moving=False)))
  for inputs in (1, 2):
    out.append(Case(f"pipe_vpu4096_in{inputs}_b64KiB", F, _pipe("vpu", 4096, inputs, block_rows=128, n=128)))
  return out


def sync_sweep_cases() -> list[Case]:
  """`sync_sweep` (session 22's last call, for the next model step): two moving 32 KiB input blocks a
  step beside 0-4096 rows of vector work or a 128-2048-row MXU dot, and the same work with fixed
  blocks: where between the matmul table's short steps (the DMA-wait sync paid in full) and flash
  attention's long ones (about 20-30 cycles an input) a pipelined step's wait stops costing the sync."""
  F = "sync_sweep"
  out = []
  for rows in (0, 256, 512, 1024, 2048, 3072, 4096):
    out.append(Case(f"ssweep_vpu{rows}_in2_b32KiB", F, _pipe("vpu", rows, 2, block_rows=64, n=256)))
  for rows in (128, 512, 2048):
    out.append(Case(f"ssweep_mxu{rows}_in2_b32KiB", F, _pipe("mxu", rows, 2, block_rows=64, n=256)))
  for kind, rows in (("vpu", 1024), ("vpu", 4096), ("mxu", 512)):
    out.append(Case(f"ssweep_{kind}{rows}_in2_b32KiB_fixed", F,
                    _pipe(kind, rows, 2, moving=False, block_rows=64, n=256)))
  return out


def flash_step(jax, jnp, pl, part, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, part_ref):
  """The body of one flash-attention kv step cut at `part` (`_flash_part`): on the first grid step the
  running max, sum and accumulators are initialised; then s = q k^T, and 'qk' accumulates s into
  `part_ref`, 'max' adds the running row max, 'softmax' exp(s - m), the row sum and the l update (p into
  `part_ref`), 'full' the p v dot and the rescaled `acc_ref`."""
  @pl.when(pl.program_id(0) == 0)
  def _():
    m_ref[...] = jnp.full_like(m_ref, -1e30)
    l_ref[...] = jnp.zeros_like(l_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)
    if part_ref is not acc_ref:
      part_ref[...] = jnp.zeros_like(part_ref)

  s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32)
  if part == "qk":
    part_ref[...] += s
    return
  m_prev = m_ref[...]
  m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
  m_ref[...] = m_new
  if part == "max":
    part_ref[...] += s
    return
  p = jnp.exp(s - m_new)
  alpha = jnp.exp(m_prev - m_new)
  l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
  if part == "softmax":
    part_ref[...] += p
    return
  pv = jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
  acc_ref[...] = acc_ref[...] * alpha + pv


def _flash_part(part, moving=True, n=512, blk=128):
  """One flash-attention inner step cut at `part`, as a pallas_call grid of `n` kv steps on (blk, 128)
  bf16 blocks (q fixed, k and v moving unless not `moving`), state in f32 VMEM scratch: 'qk' (s = q k^T,
  accumulated), 'max' (+ the row max), 'softmax' (+ exp, row sum, the m / l update), 'full' (+ p v and
  the rescaled accumulator): what each part of a flash step costs on the chip."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
      flash_step(jax, jnp, pl, part, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, acc_ref)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] / l_ref[...] if part in ("softmax", "full") else acc_ref[...]

    idx = (lambda i: (i, 0)) if moving else (lambda i: (0, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((blk, _LANES), jnp.float32), grid=(n,),
        in_specs=[pl.BlockSpec((blk, _LANES), lambda i: (0, 0)), pl.BlockSpec((blk, _LANES), idx),
                  pl.BlockSpec((blk, _LANES), idx)],
        out_specs=pl.BlockSpec((blk, _LANES), lambda i: (0, 0)),
        scratch_shapes=[pltpu.VMEM((blk, 1), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32),
                        pltpu.VMEM((blk, _LANES), jnp.float32)])
    q = _rand((blk, _LANES), "bfloat16", 1)
    kv = _rand((n * blk, _LANES), "bfloat16", 2)
    return call, (q, kv, _rand((n * blk, _LANES), "bfloat16", 3))
  return build


def flash_part_cases() -> list[Case]:
  """`flash_parts`: a flash step's parts, each a grid of 512 kv steps."""
  F = "flash_parts"
  out = [Case(f"fpart_{p}", F, _flash_part(p)) for p in ("qk", "max", "softmax", "full")]
  out.append(Case("fpart_full_fixed", F, _flash_part("full", moving=False)))
  out.append(Case("fpart_softmax_fixed", F, _flash_part("softmax", moving=False)))
  out.append(Case("fpart_full_blk256", F, _flash_part("full", n=256, blk=256)))
  return out


def fixed_grid(jax, jnp, pl, n, in_blocks, out_block, scratch, body, finish):
  """A pallas_call grid of `n` steps whose blocks never change (no copies after the first): every
  scratch ref zeroed on the first step, `body(ins, out, scratch)` on every step, `finish(out, scratch)`
  on the last; f32 output. The frame of the `compute_parts` and session 23's fixed-block cases."""
  k = len(in_blocks)

  def kernel(*refs):
    ins, out, scr = refs[:k], refs[k], refs[k + 1:]

    @pl.when(pl.program_id(0) == 0)
    def _():
      for ref in scr:
        ref[...] = jnp.zeros_like(ref)

    body(ins, out, scr)

    @pl.when(pl.program_id(0) == n - 1)
    def _():
      finish(out, scr)

  fixed = lambda i: (0, 0)  # noqa: E731
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(out_block, jnp.float32), grid=(n,),
      in_specs=[pl.BlockSpec(b, fixed) for b in in_blocks], out_specs=pl.BlockSpec(out_block, fixed),
      scratch_shapes=scratch)


def _sum_out(o_ref, scratch):
  """`fixed_grid`'s last step for an (N, 128) accumulator and an (N, 1) column: their sum."""
  o_ref[...] = scratch[0][...] + scratch[1][...]


def _compute_part(op, n=512, blk=128):
  """A pallas_call grid of `n` steps whose blocks never change (no copies after the first): one
  flash-step operation on (blk, 128) values a step, accumulated into f32 VMEM scratch. 'nn': q @ k,
  'nt': q @ k^T (the flash form), 'nt2': two independent q @ k^T, 'acc': the accumulation alone,
  'exp': exp of the f32 block, 'lane_max' / 'lane_sum': the row max / sum (keepdims), 'scale': the
  accumulator rescaled by a per-row factor."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      (q_ref, k_ref), (acc_ref, r_ref) = ins, scratch
      q, k = q_ref[...], k_ref[...]
      x = q.astype(jnp.float32)
      if op == "nn":
        acc_ref[...] += jnp.dot(q, k, preferred_element_type=jnp.float32)
      elif op in ("nt", "nt2"):
        nt = (((1,), (1,)), ((), ()))
        s = jax.lax.dot_general(q, k, nt, preferred_element_type=jnp.float32)
        if op == "nt2":
          s = s + jax.lax.dot_general(k, q, nt, preferred_element_type=jnp.float32)
        acc_ref[...] += s
      elif op == "acc":
        acc_ref[...] += x
      elif op == "exp":
        acc_ref[...] += jnp.exp(acc_ref[...] * 1e-3 + x)
      elif op == "lane_max":
        r_ref[...] += jnp.max(acc_ref[...] + x, axis=-1, keepdims=True)
      elif op == "lane_sum":
        r_ref[...] += jnp.sum(acc_ref[...] + x, axis=-1, keepdims=True)
      elif op == "scale":
        acc_ref[...] = acc_ref[...] * (r_ref[...] * 1e-3 + 1.0) + x
      elif op == "sub_max":     # a reduction's (keepdims) result broadcast back: x - max(x)
        v = acc_ref[...] * 0.5 + x
        acc_ref[...] = v - jnp.max(v, axis=-1, keepdims=True)
      elif op == "bcast":       # a loaded (N, 1) column broadcast across lanes, nothing else
        acc_ref[...] = jnp.broadcast_to(r_ref[...], acc_ref.shape) + x
      elif op == "sublane_sum":
        acc_ref[0:8, :] += jnp.sum(acc_ref[...] + x, axis=0, keepdims=True)
      elif op == "tanh":
        acc_ref[...] = jnp.tanh(acc_ref[...] * 1e-3 + x)
      elif op == "div":
        acc_ref[...] = x / (acc_ref[...] * 1e-3 + 2.0)
      else:
        raise ValueError(op)

    call = fixed_grid(jax, jnp, pl, n, [(blk, _LANES), (blk, _LANES)], (blk, _LANES),
                      [pltpu.VMEM((blk, _LANES), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32)],
                      body, _sum_out)
    return call, (_rand((blk, _LANES), "bfloat16", 1), _rand((blk, _LANES), "bfloat16", 2))
  return build


def compute_part_cases() -> list[Case]:
  """`compute_parts`: one flash-step operation a grid step, no copies: the chip's cost of each;
  `latency_parts` (session 21's last call): the broadcasts, reductions and divisions that the
  per-class latencies need told apart, and 8-row blocks where a latency is not hidden by 16 vregs."""
  F = "compute_parts"
  out = [Case(f"cpart_{op}", F, _compute_part(op))
         for op in ("nn", "nt", "nt2", "acc", "exp", "lane_max", "lane_sum", "scale")]
  for op in ("sub_max", "bcast", "sublane_sum", "tanh", "div"):
    out.append(Case(f"lpart_{op}", "latency_parts", _compute_part(op)))
    out.append(Case(f"lpart_{op}_8rows", "latency_parts", _compute_part(op, blk=8)))
  for op in ("lane_max", "scale", "exp", "acc"):
    out.append(Case(f"lpart_{op}_8rows", "latency_parts", _compute_part(op, blk=8)))
  return out
