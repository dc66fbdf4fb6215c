"""Session 26's measured kernels: the two parts of real kernels the model misses most after session 25.

`page_gather`: what a grid step of the jax wheel's paged attention costs beside its compute. That kernel
copies each step's K and V pages one DMA per page (`MultiPageAsyncCopyDescriptor`: the page numbers
read from a scalar-prefetch block table in SMEM, every page copy on one semaphore, each waited on its
own), started one step ahead. Its launches with many small pages are modelled 9-32% fast. Grid (n,),
K and V (pages, rows, 128) bf16 arrays in HBM (`pl.ANY`), `c` pages of each copied a step into one of
two VMEM slots; the step waits its own `2 c` copies and adds the first 8 rows of its first K and V pages
into f32 scratch (light body). Cases: `c` in 1, 2, 4, 8, 16 with 8 KiB pages (32 rows); `c` = 4 with
4 KiB and 32 KiB pages; `c` = 8 with the page numbers computed from the grid index instead of read from
SMEM ('lin'), and `c` = 8 with each side's copies waited by one wait of the whole slot's bytes ('one').

`causal_mask`: the wheel's causal flash step computes a (blk, blk) mask from two iotas offset by the
grid indices and adds `where(mask, 0, -inf-ish)` to s before the row max (`flash_attention.py`), on every
step it runs; its causal launches are modelled 20% fast once the DMA wait is a latency. On fixed blocks
(no copies, `cases_parts.wheel_compute`'s frame): 'full' (the wheel step with the mask), 'max' (q k^T,
the mask, the row max stored), 'qk' (q k^T and the mask accumulated), 'only' (the mask added to a loaded
f32 block, accumulated: no MXU), at 128 rows (and 'full' at 256).

`splash_step`: splash attention's step body (`splash_attention_kernel.flash_attention_kernel`, no mask:
m and l lane-dense, v cast to f32 and the p v product an f32 x f32 dot at the default precision,
the accumulator rescaled by alpha) on fixed (128, 128) blocks, 512 steps: its launches cost the chip
~100 cycles a step more than the wheel's flash step, which palace models alike. 'full'; 'bf16pv' (the
p v dot in the wheel's form: p cast to bf16, v bf16); 'nopv' (up to m and l); 'f32dot' / 'bf16dot' (only
an f32 x f32 / bf16 x bf16 p v dot of a loaded f32 p, accumulated); 'full_moving' (k and v a new block
every step).

`out_heavy`: session 25's `out_switch` with the wheel's flash step as the body (fixed q, k, v): does a
kept output block's write-back hide under a heavy step? Grid (512 / K, K), the (128, 128) f32 output
block changing with the first index, written at k == K - 1; K in 1, 2, 8.

`splash_machinery`: what splash's launch adds to its step (its full-mask launch costs the chip ~180
cycles a step more than `splash_step`'s moving-block step): splash's (8, 16, 16) grid with 128-row q, k
and v blocks (q moving with the q block, k and v with the kv block, m, l and the accumulator reset at
kv 0, the output written at the last kv block), the body 'light' (k and v's first rows accumulated) or
'heavy' (`splash_step`'s body), with no tables ('none') or with splash's two scalar-prefetch tables
(`block_mask`, the body under `pl.when(block_mask[h, i, j] > 0)`, and `data_next`, k and v's index maps
reading their kv block from it) as int8 ('i8', as splash builds them) or int32 ('i32'). Same conventions as `cases.py` (public
Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

import numpy as np

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_move import _zero_when
from benchmarks.hw.cases_parts import wheel_compute

_L = 128
_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def _page_gather(c, rows, mode="smem", n=512, heavy=False):
  """`page_gather` (module docstring): `c` pages of `rows` x 128 bf16 from K and V a step; `heavy`: the
  wheel's flash step on fixed (128, 128) q, k, v beside them every step (cases_branch `page_heavy`)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    pages = n * c

    def kernel(idx_ref, k_hbm, v_hbm, *refs):
      if heavy:
        fq, fk, fv, o_ref, kbuf, vbuf, acc_ref, sems, hm, hl, hacc = refs
      else:
        o_ref, kbuf, vbuf, acc_ref, sems = refs
      i = pl.program_id(0)

      def copies(step, slot):
        out = []
        for j in range(c):
          page = idx_ref[step * c + j] if mode != "lin" else step * c + j
          for src, buf, s in ((k_hbm, kbuf, 0), (v_hbm, vbuf, 1)):
            out.append(pltpu.make_async_copy(src.at[page], buf.at[slot, j], sems.at[s, slot]))
        return out

      @pl.when(i == 0)
      def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
        if heavy:
          for ref in (hm, hl, hacc):
            ref[...] = jnp.zeros_like(ref)
        for cp in copies(0, 0):
          cp.start()

      @pl.when(i + 1 < n)
      def _():
        for cp in copies(i + 1, (i + 1) % 2):
          cp.start()

      slot = i % 2
      if mode == "one":   # one wait a side for the whole slot (its bytes: the c pages')
        for buf, s, src in ((kbuf, 0, k_hbm), (vbuf, 1, v_hbm)):
          pltpu.make_async_copy(src.at[pl.ds(0, c)], buf.at[slot], sems.at[s, slot]).wait()
      else:
        for cp in copies(i, slot):
          cp.wait()
      if c:
        acc_ref[...] += (kbuf[slot, 0, :8, :].astype(jnp.float32)
                         + vbuf[slot, 0, :8, :].astype(jnp.float32))
      if heavy:
        wheel_compute(jax, jnp, "full", _L, fq, fk, fv, hm, hl, hacc)

      @pl.when(i == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + (hacc[:8, :] + hm[:8, :] + hl[:8, :] if heavy else 0.0)

    fixed = [pl.BlockSpec((_L, _L), lambda i, idx: (0, 0))] * 3 if heavy else []
    gs = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(n,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)] + fixed,
        out_specs=pl.BlockSpec((8, _L), lambda i, idx: (0, 0)),
        scratch_shapes=[pltpu.VMEM((2, max(c, 1), rows, _L), jnp.bfloat16),
                        pltpu.VMEM((2, max(c, 1), rows, _L), jnp.bfloat16),
                        pltpu.VMEM((8, _L), jnp.float32), pltpu.SemaphoreType.DMA((2, 2))]
        + ([pltpu.VMEM((_L, _L), jnp.float32) for _ in range(3)] if heavy else []))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, _L), jnp.float32), grid_spec=gs)
    table = np.random.default_rng(7).permutation(max(pages, 1)).astype(np.int32)
    args = (table, _rand((max(pages, 1), rows, _L), "bfloat16", 70),
            _rand((max(pages, 1), rows, _L), "bfloat16", 71))
    if heavy:
      args += tuple(_rand((_L, _L), "bfloat16", 72 + j) for j in range(3))
    return call, args
  return build


def page_gather_cases() -> list[Case]:
  F = "page_gather"
  out = [Case(f"pgather_c{c}_r32", F, _page_gather(c, 32)) for c in (1, 2, 4, 8, 16)]
  out += [Case(f"pgather_c4_r{r}", F, _page_gather(4, r)) for r in (16, 128)]
  out += [Case(f"pgather_c8_r32_{mode}", F, _page_gather(8, 32, mode)) for mode in ("lin", "one")]
  return out


def _masked(jax, jnp, pl, op, blk, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, s_ref):
  """One causal-mask case's step body (module docstring)."""
  i = pl.program_id(0)
  row = jax.lax.broadcasted_iota(jnp.int32, (blk, blk), 0) + (i % 4) * blk + 4 * blk
  col = jax.lax.broadcasted_iota(jnp.int32, (blk, blk), 1) + (i % 4) * blk
  mask = col <= row
  if op == "only":
    acc_ref[...] += s_ref[...] + jnp.where(mask, 0.0, _MASK_VALUE)
    return
  nt = (((1,), (1,)), ((), ()))
  s = jax.lax.dot_general(q_ref[...], k_ref[...], nt, preferred_element_type=jnp.float32)
  s = s + jnp.where(mask, 0.0, _MASK_VALUE)
  if op == "qk":
    acc_ref[...] += s
    return
  if op == "max":
    m_ref[...] = jnp.maximum(m_ref[...], jnp.max(s, axis=1)[:, None])
    return
  m_prev, l_prev = m_ref[...], l_ref[...]
  m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
  p = jnp.exp(s - (m_next if blk == _L else jnp.tile(m_next, (1, blk // _L))))
  l_corr = jnp.exp(m_prev - m_next) * l_prev
  l_next = jnp.sum(p, axis=1)[:, None] + l_corr
  m_ref[...] = m_next
  l_ref[...] = l_next
  pv = jnp.dot(p.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
  inv = jnp.where(l_next == 0.0, 1.0, 1.0 / l_next)
  acc_ref[...] *= l_corr * inv
  acc_ref[...] += pv * inv


def _causal_mask(op, blk=_L, n=512):
  """`causal_mask` (module docstring): grid (n,), fixed (blk, 128) bf16 q, k, v and an f32 (blk, blk) s."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(q_ref, k_ref, v_ref, s_ref, o_ref, m_ref, l_ref, acc_ref):
      _zero_when(pl, jnp, pl.program_id(0) == 0, (m_ref, l_ref, acc_ref))

      _masked(jax, jnp, pl, op, blk, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, s_ref)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...][:, :_L] + m_ref[...] + l_ref[...]

    fixed = lambda i: (0, 0)  # noqa: E731
    acc_cols = blk if op in ("qk", "only") else _L
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((blk, _L), jnp.float32), grid=(n,),
        in_specs=[pl.BlockSpec((blk, _L), fixed)] * 3 + [pl.BlockSpec((blk, blk), fixed)],
        out_specs=pl.BlockSpec((blk, _L), fixed),
        scratch_shapes=[pltpu.VMEM((blk, _L), jnp.float32), pltpu.VMEM((blk, _L), jnp.float32),
                        pltpu.VMEM((blk, acc_cols), jnp.float32)])
    return call, (_rand((blk, _L), "bfloat16", 80), _rand((blk, _L), "bfloat16", 81),
                  _rand((blk, _L), "bfloat16", 82), _rand((blk, blk), "float32", 83))
  return build


def causal_mask_cases() -> list[Case]:
  F = "causal_mask"
  out = [Case(f"cmask_{op}_blk128", F, _causal_mask(op)) for op in ("full", "max", "qk", "only")]
  out.append(Case("cmask_full_blk256", F, _causal_mask("full", blk=256, n=256)))
  return out



def _splash_body(jax, jnp, op, q_ref, k_ref, v_ref, s_ref, m_ref, l_ref, acc_ref):
  """One `splash_step` case's step body (`_splash_step`)."""
  if op in ("f32dot", "bf16dot"):   # the p v dot alone, p loaded as f32
    s = s_ref[...]
    if op == "f32dot":
      acc_ref[...] += jax.lax.dot_general(s, v_ref[...].astype(jnp.float32), (((1,), (0,)), ((), ())))
    else:
      acc_ref[...] += jnp.dot(s.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
    return
  nt = (((1,), (1,)), ((), ()))
  m_prev, l_prev = m_ref[...], l_ref[...]
  qk = jax.lax.dot_general(q_ref[...], k_ref[...], nt, preferred_element_type=jnp.float32)
  m_next = jnp.maximum(m_prev, qk.max(axis=-1)[:, None])
  s_curr = jnp.exp(qk - m_next)
  l_curr = jax.lax.broadcast_in_dim(s_curr.sum(axis=-1), l_prev.shape, (0,))
  alpha = jnp.exp(m_prev - m_next)
  m_ref[...] = m_next
  l_ref[...] = l_curr + alpha * l_prev
  if op == "nopv":
    return
  if op == "bf16pv":   # the wheel's form of the p v dot
    o_curr = jnp.dot(s_curr.astype(jnp.bfloat16), v_ref[...], preferred_element_type=jnp.float32)
  else:                # splash's: v cast to f32, an f32 x f32 dot at the default precision
    o_curr = jax.lax.dot_general(s_curr, v_ref[...].astype(jnp.float32), (((1,), (0,)), ((), ())))
  acc_ref[...] = alpha * acc_ref[...] + o_curr


def _splash_step(op, n=512, moving=False, m=8):
  """`splash_step` (module docstring): grid (n,), (128, 128) bf16 q, k, v (k and v cycling over `m`
  blocks when `moving`) and an f32 (128, 128) block, splash attention's step body."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(q_ref, k_ref, v_ref, s_ref, o_ref, m_ref, l_ref, acc_ref):
      _zero_when(pl, jnp, pl.program_id(0) == 0, (m_ref, l_ref, acc_ref))

      _splash_body(jax, jnp, op, q_ref, k_ref, v_ref, s_ref, m_ref, l_ref, acc_ref)

      @pl.when(pl.program_id(0) == n - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    fixed = pl.BlockSpec((_L, _L), lambda i: (0, 0))
    kv = pl.BlockSpec((_L, _L), lambda i: (i % m, 0)) if moving else fixed
    rows = m * _L if moving else _L
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((_L, _L), jnp.float32), grid=(n,),
        in_specs=[fixed, kv, kv, fixed], out_specs=fixed,
        scratch_shapes=[pltpu.VMEM((_L, _L), jnp.float32) for _ in range(3)])
    return call, (_rand((_L, _L), "bfloat16", 90), _rand((rows, _L), "bfloat16", 91),
                  _rand((rows, _L), "bfloat16", 92), _rand((_L, _L), "float32", 93))
  return build


def splash_step_cases() -> list[Case]:
  F = "splash_step"
  out = [Case(f"sstep_{op}_blk128", F, _splash_step(op)) for op in ("full", "bf16pv", "nopv", "f32dot", "bf16dot")]
  out.append(Case("sstep_full_moving_blk128", F, _splash_step("full", moving=True)))
  return out


def _out_heavy(k, n=512):
  """`out_heavy` (module docstring): grid (n / k, k), the wheel's flash step on fixed blocks every step,
  the (128, 128) f32 output block kept over `k` steps, written at the last of them."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
      _zero_when(pl, jnp, (pl.program_id(0) == 0) & (pl.program_id(1) == 0), (m_ref, l_ref, acc_ref))

      wheel_compute(jax, jnp, "full", _L, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref)

      @pl.when(pl.program_id(1) == k - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    fixed = pl.BlockSpec((_L, _L), lambda i, j: (0, 0))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((n // k * _L, _L), jnp.float32), grid=(n // k, k),
        in_specs=[fixed] * 3, out_specs=pl.BlockSpec((_L, _L), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((_L, _L), jnp.float32) for _ in range(3)])
    return call, tuple(_rand((_L, _L), "bfloat16", 94 + j) for j in range(3))
  return build


def out_heavy_cases() -> list[Case]:
  return [Case(f"oheavy_k{k}", "out_heavy", _out_heavy(k)) for k in (1, 2, 8)]


def _splash_machinery(body, tables, heads=8, nq=16, nk=16):
  """`splash_machinery` (module docstring): splash's (heads, q blocks, kv blocks) grid, 128-row q, k, v
  blocks, with (`tables` 'i8' / 'i32') or without ('none') its block-mask and next-data tables."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    seq = nk * _L

    def kernel(*refs):
      if tables != "none":
        dn_ref, bm_ref, refs = refs[0], refs[1], refs[2:]
      q_ref, k_ref, v_ref, s_ref, o_ref, m_ref, l_ref, acc_ref = refs
      h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
      _zero_when(pl, jnp, j == 0, (m_ref, l_ref, acc_ref))
      run = True if tables == "none" else bm_ref[h, i, j].astype(jnp.int32) > 0

      @pl.when(run)
      def _():
        if body == "light":
          acc_ref[:8, :] += k_ref[:8, :].astype(jnp.float32) + v_ref[:8, :].astype(jnp.float32)
        else:
          _splash_body(jax, jnp, "full", q_ref, k_ref, v_ref, s_ref, m_ref, l_ref, acc_ref)

      @pl.when(j == nk - 1)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    if tables == "none":
      def kv_map(h, i, j):
        return (h, j, 0)
      maps = (lambda h, i, j: (h, i, 0), kv_map, lambda h, i, j: (0, 0))
    else:
      def kv_map(h, i, j, dn, bm):
        return (h, dn[h, i, j].astype(jnp.int32), 0)
      maps = (lambda h, i, j, dn, bm: (h, i, 0), kv_map, lambda h, i, j, dn, bm: (0, 0))
    blk = pl.BlockSpec((None, _L, _L), maps[0])
    kvs = pl.BlockSpec((None, _L, _L), maps[1])
    specs = dict(grid=(heads, nq, nk), in_specs=[blk, kvs, kvs, pl.BlockSpec((_L, _L), maps[2])],
                 out_specs=blk, scratch_shapes=[pltpu.VMEM((_L, _L), jnp.float32) for _ in range(3)])
    out = jax.ShapeDtypeStruct((heads, nq * _L, _L), jnp.float32)
    arrays = (_rand((heads, nq * _L, _L), "bfloat16", 100), _rand((heads, seq, _L), "bfloat16", 101),
              _rand((heads, seq, _L), "bfloat16", 102), _rand((_L, _L), "float32", 103))
    return splash_tables_call(pl, pltpu, kernel, out, specs, arrays, None if tables == "none" else tables,
                              (heads, nq, nk))
  return build


def splash_tables_call(pl, pltpu, kernel, out_shape, specs, arrays, tables, grid):
  """(pallas_call, arguments) of a splash-like kernel: plain, or (`tables` 'i8' / 'i32') with splash's
  next-data table (every kv block in order) and block-mask table (every block runs) prefetched first."""
  if tables is None:
    return pl.pallas_call(kernel, out_shape=out_shape, **specs), arrays
  dt = np.int8 if tables == "i8" else np.int32
  dn = np.broadcast_to(np.arange(grid[2], dtype=dt), grid).copy()
  bm = np.full(grid, 2, dt)
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, **specs)
  return pl.pallas_call(kernel, out_shape=out_shape, grid_spec=gs), (dn, bm, *arrays)


def splash_machinery_cases() -> list[Case]:
  F = "splash_machinery"
  return [Case(f"smach_{body}_{t}", F, _splash_machinery(body, t))
          for body in ("light", "heavy") for t in ("none", "i8", "i32")]
