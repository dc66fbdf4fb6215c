"""Session 35 (`start_form`): what a DMA start costs by its form while the engine streams, and what a
random-page copy costs the engine in a stream.

Session 34's region traces timed starts in bursts whose engine was idle (the round's copies waited
before the next round's starts): ~2 cycles a start with static addresses, ~4 with the page number from
SMEM, ~8 alternating two semaphores, ~17-20 in a page walk (computed slot and semaphores, two sources,
under `pl.when`). The wheel's paged attention (every K page of a block on one semaphore, then every V
page on another, the slot and semaphores from SMEM) costs the chip ~25 cycles a page (two 4 KiB copies)
at 8-32 pages a block, which palace models at ~40. These cases run rounds of `k` copies double-buffered
(round r + 1's starts, then round r's waits, as a page walk does, so the engine always has work) in each
form, one change at a time from the static one:
- `seq` / `page`: source blocks in order, or pages from an SMEM permutation;
- `unroll` / `dyn`: the loop unrolled by two (each round's slot and semaphore static) or the slot and
  semaphore computed from the round (`(r + 1) % 2`);
- `one` / `kv` / `alt`: all of a round's copies on the slot's semaphore, or its first half from array K
  on K's semaphore then its second from V on V's (the wheel), or K and V alternating copy by copy (a walk);
- sizes 4 / 8 / 16 KiB and k = 16 / 32.
Launch time over the rounds gives the per-copy cost of each form in a stream; the `sfr_*` twins (for
`benchmarks.hw.regions` only) put each round's starts and waits in named regions.
Nothing here imports palace (same conventions as cases.py).
"""
from __future__ import annotations

import contextlib

import numpy as np

from benchmarks.hw.cases import Case, _jax, _rand


def _rounds(rows, k, n, src="page", slot="dyn", sems="one", scoped=False, work=None):
  """`n` rounds of `k` HBM->VMEM copies of (rows, 128) f32, double-buffered (module docstring).
  `work` = (vregs, place): each round also does a multiply-add over a (8 * vregs, 128) f32 scratch,
  before its starts ('before'), between its starts and its waits ('after'), or after its waits over the
  round's landed copies ('dep', as a page walk's body reads its pages)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    total = n * k
    half = k // 2

    def region(name):
      return jax.named_scope(name) if scoped else contextlib.nullcontext()

    def do_work(w_ref, s, landed):
      with region("work"):
        if landed:
          w_ref[...] = w_ref[...] * 1.0001 + buf_ref[0][s].reshape(w_ref.shape)
        else:
          w_ref[...] = w_ref[...] * 1.0001 + 0.5

    buf_ref = []

    def kernel(idx_ref, k_hbm, v_hbm, o_ref, buf, sem, *scratch):
      buf_ref[:] = [buf]
      def copies(r, s):
        """Round r's copies into slot s (a Python int when unrolled, else a traced value)."""
        out = []
        for j in range(k):
          if sems == "one":
            arr, side = k_hbm, 0
          elif sems == "kv":
            arr, side = (k_hbm, 0) if j < half else (v_hbm, 1)
          else:
            arr, side = (k_hbm, 0) if j % 2 == 0 else (v_hbm, 1)
          row = idx_ref[r * k + j] if src == "page" else r * k + j
          out.append(pltpu.make_async_copy(arr.at[pl.ds(row * rows, rows)], buf.at[s, j], sem.at[side, s]))
        return out

      def round_(r, s_next, s_cur):
        if work is not None and work[1] == "before":
          do_work(scratch[0], s_cur, False)

        @pl.when(r + 1 < n)
        def _():
          with region("starts"):
            for cp in copies(r + 1, s_next):
              cp.start()
        if work is not None and work[1] == "after":
          do_work(scratch[0], s_cur, False)
        with region("waits"):
          for cp in copies(r, s_cur):
            cp.wait()
        if work is not None and work[1] == "dep":
          do_work(scratch[0], s_cur, True)

      for cp in copies(0, 0):
        cp.start()
      if slot == "unroll":
        def body(i, c):
          round_(2 * i, 1, 0)
          round_(2 * i + 1, 0, 1)
          return c
        jax.lax.fori_loop(0, n // 2, body, 0)
      else:
        def body(r, c):
          round_(r, (r + 1) % 2, r % 2)
          return c
        jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = buf[0, 0, 0:8] + (scratch[0][0:8] if scratch else 0.0)

    idx = jnp.asarray(np.random.default_rng(2).permutation(total), jnp.int32)
    gs = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec((8, 128), lambda i, idx_ref: (0, 0)),
        scratch_shapes=[pltpu.VMEM((2, k, rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((2, 2))]
        + ([pltpu.VMEM((k * rows, 128), jnp.float32) if work[1] == "dep" else
            pltpu.VMEM((8 * work[0], 128), jnp.float32)] if work is not None else []))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid_spec=gs)
    return call, (idx, _rand((total * rows, 128), "float32", 5), _rand((total * rows, 128), "float32", 6))
  return build


# (tag, rows, k, rounds, form): every case moves 16 MiB from each of two arrays' halves at most
_FORMS = [("seq_unroll_one", 8, 16, 256, dict(src="seq", slot="unroll")),
          ("seq_dyn_one", 8, 16, 256, dict(src="seq")),
          ("page_unroll_one", 8, 16, 256, dict(slot="unroll")),
          ("page_dyn_one", 8, 16, 256, dict()),
          ("page_unroll_kv", 8, 16, 256, dict(slot="unroll", sems="kv")),
          ("page_dyn_kv", 8, 16, 256, dict(sems="kv")),
          ("page_dyn_alt", 8, 16, 256, dict(sems="alt")),
          ("page_unroll_alt", 8, 16, 256, dict(slot="unroll", sems="alt")),
          ("page_dyn_one_k32", 8, 32, 128, dict()),
          ("page_dyn_one_8KiB", 16, 16, 128, dict()),
          ("page_dyn_one_16KiB", 32, 16, 64, dict()),
          ("seq_dyn_one_16KiB", 32, 16, 64, dict(src="seq"))]


def start_form_cases() -> list[Case]:
  return [Case(f"sf_{tag}", "start_form", _rounds(rows, k, n, **kw)) for tag, rows, k, n, kw in _FORMS]


def start_form_region_cases() -> list[Case]:
  """The region-traced twins (benchmarks.hw.regions only; not part of the timing suite)."""
  keep = ("seq_unroll_one", "page_unroll_one", "page_dyn_one", "page_dyn_kv", "page_dyn_alt",
          "page_unroll_kv")
  return [Case(f"sfr_{tag}", "start_form_regions", _rounds(rows, k, n, scoped=True, **kw))
          for tag, rows, k, n, kw in _FORMS if tag in keep]


# Session 37 (`start_body`, measured for the next DMA step): what a round of starts costs beside vector
# work. A bare stream's 16 starts cost the chip ~38 cycles, a page walk's ~195-340 beside its body
# (docs/validation.md "Session 35"): is it the body around them? Rounds of 16 4 KiB copies of
# consecutive rows (the `seq_dyn_one` form) with a multiply-add over 16 or 64 vregs of an independent
# scratch before the starts or between starts and waits, or over the landed copies after the waits.
_BODIES = [("none", None), ("v16_after", (16, "after")), ("v64_after", (64, "after")),
           ("v16_before", (16, "before")), ("v64_before", (64, "before")), ("v256_after", (256, "after")),
           ("dep", (16, "dep"))]


def start_body_cases() -> list[Case]:
  out = [Case(f"sb_{tag}", "start_body", _rounds(8, 16, 256, src="seq", work=w)) for tag, w in _BODIES]
  out.append(Case("sb_page_v64_after", "start_body", _rounds(8, 16, 256, work=(64, "after"))))
  return out


def start_body_region_cases() -> list[Case]:
  """The region-traced twins of three `start_body` cases (benchmarks.hw.regions only)."""
  return [Case(f"sbr_{tag}", "start_body_regions", _rounds(8, 16, 256, src="seq", scoped=True, work=w))
          for tag, w in _BODIES if tag in ("none", "v64_after", "v64_before", "dep")]
