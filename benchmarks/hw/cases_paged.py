"""Session 28's measured kernels: the jax wheel's paged attention swept one parameter at a time
(`paged_sweep`), and the tutorial matmul with 128-row blocks at three sizes (`matmul_k`).

`paged_sweep`: `paged_attention` (decode: one query token per sequence) walks a sequence's pages in a
rolled loop inside one grid step per (batch, kv head): each iteration starts the next block's page
copies (one DMA per page, page numbers read from SMEM), waits the current block's K, computes q k^T,
the masked softmax update, waits V and accumulates p v. The four `paged_attention` launches differ in
several things at once (page size, pages a block, query heads per kv head, iterations a step) and the
model's errors on them move in opposite directions under the same rule, so these vary one at a time
around `paged_b8q8kv8d128_p16x64_c8` (batch 8, 8 query and 8 kv heads, head_dim 128, pages of 16 rows,
64 pages a sequence, 8 pages a compute block: 128 tokens an iteration, 8 iterations a step):
- pages a block (block of 16-row pages): `c2`, `c4`, `c16`, `c32` (32 .. 512 tokens an iteration);
- page size at 128 tokens an iteration: pages of 64 rows x 2, 128 rows x 1 (and 32 x 4: holdout
  `ho_paged_b8q8kv8d128_p32x32_c4`);
- query heads per kv head (the dots' rows): 2, 4, 8 (16, 32, 64 query heads over 8 kv heads);
- iterations a grid step: 2 and 16 (16 and 128 pages a sequence);
- `paged_b16q8kv8d128_p64x32_c4`: `paged_b16q32kv8d128_p64x32_c4` with one query head per kv head.

`matmul_k`: `benchmarks.calibrate`'s tutorial kernel (bf16, f32 accumulator in scratch, output written
at the last K step) with 128 x 128 x 128 blocks at 2048^3 and 4096^3 (16 and 32 K steps an output block;
`mm_bf16_1024x1024x1024_b128x128x128` has 8): the calibration point `cal-128/128/128-4096` (the v5e
tutorial table, wall time) measured with the profiler, so that the chip says whether a 128-block step
costs the same at every K.

`page_loop`: paged attention's walk without the wheel's machinery, to tell its page copies from its
compute: a grid of 32 steps, each a rolled `lax.fori_loop` of 8 iterations over 128-token blocks of c
pages of 128 / c rows (bf16, head_dim 128), page numbers from a prefetched SMEM table (a random
permutation); each iteration starts the next block's 2c copies (one DMA a page into the other slot),
waits the current block's K (one wait for the slot, as the wheel's descriptor does), computes, waits V,
computes. Bodies: `light` (K's and V's first 8 rows added to an accumulator) and `attn` (the wheel's
step for 8 query rows: q k^T in float32, row max, exp, row sum, p v, rescaled accumulate).
`pgloop_{body}_c{c}_r{rows}` for (c, rows) = (1, 128), (2, 64), (4, 32), (8, 16), and (4, 16) / (8, 32)
(64- and 256-token blocks). `page_order`: the same loops with the copies started at another distance:
`_a0` starts each block's copies at its own iteration and waits them at once (no copy in flight across
iterations), `_a2` two blocks ahead (three slots), for c = 1 (128 rows) and 8 (16 rows), both bodies: does
a copy started an iteration earlier (the wheel's order, `_a1` above) overlap the copies before it, and
would a deeper prefetch buy anything? `page_kfirst`: `page_loop`'s walk with the wheel's copy order (all of
a block's K pages, then its V pages; `page_loop` interleaves K and V page by page), c = 4 (32 rows) and
8 (16 rows), both bodies: `pgloop_{body}_c{c}_r{rows}_kfirst`. `page_cross`: `page_loop`'s walk whose
last iteration also starts the next grid step's first block (as the wheel's walk does across its (batch,
head) steps), so that no step starts cold: `pgloop_{body}_c8_r16_cross`. `page_wheelbody`: `page_loop`'s walk
with the wheel's step line for line (its length mask, m / l scratch, alpha / beta rescale) on the same 8
query rows, c = 8 (16 rows) and 1 (128 rows), with and without the cross-step prefetch:
`pgloop_wheel_c{c}_r{rows}[_cross]`; `page_wheelgrid`: that walk (8 pages of 16 rows, cross-step prefetch)
with the wheel's dynamic trip count (`_dyn`: the loop's bound read from SMEM) and also a q block that
moves every grid step as the wheel's does (`_dynq`).

Same conventions as `cases.py` (public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports
palace).
"""
from __future__ import annotations

import contextlib

import numpy as np

from benchmarks.hw.cases import Case, _jax, _matmul, _paged, _rand

# (batch, q heads, kv heads, head_dim, page rows, pages a sequence, pages a block)
_SWEEP = ((8, 8, 8, 128, 16, 64, 2), (8, 8, 8, 128, 16, 64, 4), (8, 8, 8, 128, 16, 64, 16),
          (8, 8, 8, 128, 16, 64, 32),
          (8, 8, 8, 128, 64, 16, 2), (8, 8, 8, 128, 128, 8, 1),
          (8, 16, 8, 128, 16, 64, 8), (8, 32, 8, 128, 16, 64, 8), (8, 64, 8, 128, 16, 64, 8),
          (8, 8, 8, 128, 16, 16, 8), (8, 8, 8, 128, 16, 128, 8),
          (16, 8, 8, 128, 64, 32, 4))


def paged_sweep_cases() -> list[Case]:
  return [Case(f"paged_b{b}q{qh}kv{kvh}d{d}_p{page}x{pps}_c{c}", "paged_sweep", _paged(b, qh, kvh, d, page, pps, c))
          for b, qh, kvh, d, page, pps, c in _SWEEP]


def matmul_k_cases() -> list[Case]:
  return [Case(f"mm_bf16_{m}x{m}x{m}_b128x128x128", "matmul_k", _matmul(m, m, m, 128, 128, 128))
          for m in (2048, 4096)]


def _page_loop(c, rows, body, steps=32, iters=8, ahead=1, kfirst=False, cross=False, dyn=False, moveq=False,
               perpage=False, f32=False, scoped=False):
  """`page_loop` and `page_order` (module docstring): copies started `ahead` blocks before their wait.
  `perpage`: each page copy waited on its own (JAX 0.10.2's wheel) instead of one wait for the slot;
  `f32`: the loaded pages cast to float32 before the dots (0.10.2's wheel); `scoped` (session 34, for
  benchmarks.hw.regions): each iteration's starts, K wait and V wait inside `jax.named_scope` regions
  ("starts", "waitk", "waitv")."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def region(name):
      return jax.named_scope(name) if scoped else contextlib.nullcontext()
    per_step = iters * c
    pages = steps * per_step
    bk = c * rows
    nslot = max(ahead + 1, 1)

    def kernel(idx_ref, k_hbm, v_hbm, q_ref, o_ref, kbuf, vbuf, sems, acc, *ml):
      s = pl.program_id(0)

      def copies(it, slot, step=None):
        """Block `it`'s copies into `slot` (`step`: the first block of that grid step instead, `cross`);
        each page number read from SMEM where the copy is built, as measured."""
        def page(j):
          return idx_ref[(step * per_step if step is not None else s * per_step + it * c) + j]

        def cp(pg, j, side):
          src, buf, k = side
          return pltpu.make_async_copy(src.at[pg], buf.at[slot, j], sems.at[k, slot])
        sides = ((k_hbm, kbuf, 0), (v_hbm, vbuf, 1))
        if kfirst and step is None:   # the wheel's order: every K page, then every V page
          return [cp(page(j), j, side) for side in sides for j in range(c)]
        out = []
        for j in range(c):
          pg = page(j)
          out += [cp(pg, j, side) for side in sides]
        return out

      def wait(buf, side, slot):
        with region("waitv" if side else "waitk"):
          if perpage:
            for j in range(c):
              pltpu.make_async_copy(buf.at[slot, j], buf.at[slot, j], sems.at[side, slot]).wait()
          else:
            pltpu.make_async_copy(buf.at[slot], buf.at[slot], sems.at[side, slot]).wait()
        out = buf[slot]
        return (out.astype(jnp.float32) if f32 else out).reshape(bk, 128)

      if cross:   # the first block of step 0 only; later steps' first blocks come from the step before
        @pl.when(s == 0)
        def _():
          for cp in copies(0, 0):
            cp.start()
      else:
        for first in range(ahead):
          for cp in copies(first, first):
            cp.start()
      acc[...] = jnp.zeros_like(acc)
      if body == "wheel":
        m_ref, l_ref = ml
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        length = jnp.maximum(idx_ref[0], 0) + iters * bk   # (from SMEM, as the wheel's length; never masks)

      def step(it, carry):
        slot = it % nslot
        if ahead == 0:
          with region("starts"):
            for cp in copies(it, 0):
              cp.start()
        elif ahead == 1:   # (as measured first: the other slot of two)
          @pl.when(it + 1 < iters)
          def _():
            with region("starts"):
              for cp in copies(it + 1, 1 - slot):
                cp.start()
          if cross:
            @pl.when(jnp.logical_and(it + 1 == iters, s + 1 < steps))
            def _():
              for cp in copies(0, 1 - slot, s + 1):
                cp.start()
        else:
          @pl.when(it + ahead < iters)
          def _():
            for cp in copies(it + ahead, (it + ahead) % nslot):
              cp.start()
        k = wait(kbuf, 0, slot)
        if body == "light":
          part = k[:8].astype(jnp.float32)
          v = wait(vbuf, 1, slot)
          acc[...] += part + v[:8].astype(jnp.float32)
        elif body == "wheel":   # the wheel's paged step, line for line (its mask, m / l scratch, rescale)
          qk = jnp.einsum("gd,td->gt", q_ref[...], k, preferred_element_type=jnp.float32)
          mask = it * bk + jax.lax.broadcasted_iota(jnp.int32, qk.shape, 1) < length
          qk = qk + jnp.where(mask, 0.0, -0.7 * float(np.finfo(np.float32).max))
          m_curr = qk.max(axis=-1)
          s_curr = jnp.exp(qk - m_curr[..., None])
          m_prev, l_prev = m_ref[...], l_ref[...]
          l_curr = jax.lax.broadcast_in_dim(s_curr.sum(axis=-1), l_prev.shape, (0,))
          m_curr = jax.lax.broadcast_in_dim(m_curr, m_prev.shape, (0,))
          m_next = jnp.maximum(m_prev, m_curr)
          alpha = jnp.exp(m_prev - m_next)
          beta = jnp.exp(m_curr - m_next)
          l_next = alpha * l_prev + beta * l_curr
          m_ref[...], l_ref[...] = m_next, l_next
          v = wait(vbuf, 1, slot)
          o_curr = jnp.einsum("gt,td->gd", s_curr, v)
          acc[...] = (l_prev * alpha * acc[...] + beta * o_curr) / l_next
        else:
          qk = jnp.einsum("gd,td->gt", q_ref[...], k, preferred_element_type=jnp.float32)
          m = qk.max(axis=-1)
          p = jnp.exp(qk - m[:, None])
          l = p.sum(axis=-1)
          v = wait(vbuf, 1, slot)
          o = jnp.einsum("gt,td->gd", p, v, preferred_element_type=jnp.float32)
          acc[...] = acc[...] * 0.5 + o / l[:, None]
        return carry

      if dyn:   # a trip count read from SMEM, as the wheel's (always `iters`: page numbers are >= 0)
        jax.lax.fori_loop(0, iters - jnp.minimum(idx_ref[0], 0), step, 0)
      else:
        jax.lax.fori_loop(0, iters, step, 0)
      o_ref[...] = acc[...]

    gs = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(steps,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec((8, 128), (lambda i, idx: (i % 4, 0)) if moveq else (lambda i, idx: (0, 0)))],
        out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0)),
        scratch_shapes=[pltpu.VMEM((nslot, c, rows, 128), jnp.bfloat16),
                        pltpu.VMEM((nslot, c, rows, 128), jnp.bfloat16),
                        pltpu.SemaphoreType.DMA((2, nslot)), pltpu.VMEM((8, 128), jnp.float32)]
        + ([pltpu.VMEM((8, 128), jnp.float32)] * 2 if body == "wheel" else []))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8 * steps, 128), jnp.float32), grid_spec=gs)
    table = np.random.default_rng(11).permutation(pages).astype(np.int32)
    return call, (table, _rand((pages, rows, 128), "bfloat16", 80), _rand((pages, rows, 128), "bfloat16", 81),
                  _rand((32 if moveq else 8, 128), "float32", 82))
  return build


def page_region_cases() -> list[Case]:
  """Session 34: page walks with their starts and waits in named regions (benchmarks.hw.regions only):
  `page_loop`'s light walk at 8 pages of 16 rows (16 starts an iteration) and 1 page of 128 rows, its
  `_a0` form (the starts' slot and semaphores static), and the wheel-body walk as `page_wheelgrid`;
  session 35: the light and wheel-body walks with every K page started before every V page."""
  return [Case("pgr_light_c8_r16", "page_regions", _page_loop(8, 16, "light", scoped=True)),
          Case("pgr_light_c1_r128", "page_regions", _page_loop(1, 128, "light", scoped=True)),
          Case("pgr_light_c8_r16_a0", "page_regions", _page_loop(8, 16, "light", ahead=0, scoped=True)),
          Case("pgr_wheel_c8_r16_cross_dyn", "page_regions",
               _page_loop(8, 16, "wheel", cross=True, dyn=True, scoped=True)),
          # session 35: the walks whose starts go K first, then V (one semaphore switch a block)
          Case("pgr_light_c8_r16_kfirst", "page_regions", _page_loop(8, 16, "light", kfirst=True, scoped=True)),
          Case("pgr_wheel_c8_r16_dyn_kfirst", "page_regions",
               _page_loop(8, 16, "wheel", cross=True, dyn=True, kfirst=True, scoped=True))]


def page_loop_cases() -> list[Case]:
  return [Case(f"pgloop_{body}_c{c}_r{rows}", "page_loop", _page_loop(c, rows, body))
          for body in ("light", "attn") for c, rows in ((1, 128), (2, 64), (4, 32), (8, 16), (4, 16), (8, 32))]


def page_order_cases() -> list[Case]:
  return [Case(f"pgloop_{body}_c{c}_r{rows}_a{a}", "page_order", _page_loop(c, rows, body, ahead=a))
          for body in ("light", "attn") for c, rows in ((1, 128), (8, 16)) for a in (0, 2)]


def page_kfirst_cases() -> list[Case]:
  return [Case(f"pgloop_{body}_c{c}_r{rows}_kfirst", "page_kfirst", _page_loop(c, rows, body, kfirst=True))
          for body in ("light", "attn") for c, rows in ((4, 32), (8, 16))]


def page_cross_cases() -> list[Case]:
  return [Case(f"pgloop_{body}_c8_r16_cross", "page_cross", _page_loop(8, 16, body, cross=True))
          for body in ("light", "attn")]


def page_wheelbody_cases() -> list[Case]:
  return [Case(f"pgloop_wheel_c{c}_r{rows}{'_cross' if cross else ''}", "page_wheelbody",
               _page_loop(c, rows, "wheel", cross=cross))
          for c, rows in ((8, 16), (1, 128)) for cross in (False, True)]


def page_wheelcopy_cases() -> list[Case]:
  """Session 32: `page_wheelgrid`'s `_dyn` walk with the 0.10.2 wheel's copy handling added one piece at
  a time: every K page before every V page (`_kfirst`), each page waited on its own (`_pp`), the pages
  cast to f32 before the dots (`_f32`): does that make the chip's iteration the wheel's ~759 cycles
  instead of the reproduction's ~840?"""
  base = dict(cross=True, dyn=True, kfirst=True)
  return [Case("pgloop_wheel_c8_r16_dyn_kfirst", "page_wheelcopy", _page_loop(8, 16, "wheel", **base)),
          Case("pgloop_wheel_c8_r16_dyn_kfirst_pp", "page_wheelcopy",
               _page_loop(8, 16, "wheel", perpage=True, **base)),
          Case("pgloop_wheel_c8_r16_dyn_kfirst_pp_f32", "page_wheelcopy",
               _page_loop(8, 16, "wheel", perpage=True, f32=True, **base))]


def page_wheelgrid_cases() -> list[Case]:
  return [Case("pgloop_wheel_c8_r16_cross_dyn", "page_wheelgrid", _page_loop(8, 16, "wheel", cross=True, dyn=True)),
          Case("pgloop_wheel_c8_r16_cross_dynq", "page_wheelgrid",
               _page_loop(8, 16, "wheel", cross=True, dyn=True, moveq=True))]
