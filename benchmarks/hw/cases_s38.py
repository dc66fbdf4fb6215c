"""Session 38 (`dma_beside`): what vector work beside a DMA stream costs, by the work's kind and the
stream's copy shape.

`start_body` (session 37) found 64 / 256 vregs of multiply-add between a stream's starts and its waits
costing the chip ~45 / ~210 cycles a round where palace hides them under the copies, and `page_heavy`
(session 27) steps of page copies beside the wheel's flash step costing about the flash step plus the
copies' engine time; yet one 4 KiB copy beside 512 vregs of the same work (`dma_fence`) and a pipeline's
128 KiB block beside 2048 rows (`sync_size`) cost little more than the work. These cases tell apart what
could make the difference: the rounds (128 of them, double-buffered: round r + 1's starts, the work,
round r's waits) move 64 KiB of consecutive f32 rows each as 16 copies of 4 KiB, 4 of 16 KiB or one of
64 KiB (`c16x4k`, `c4x16k`, `c1x64k`; `w...`: the same as VMEM->HBM writes), beside one kind of work
a round, each about 256 vregs:
- `ldst`: a multiply-add over an f32 (2048, 128) scratch (loads, VPU, stores: `start_body`'s);
- `st`: the scratch overwritten with a value of the round (stores only);
- `ld`: the scratch summed into 8 vregs (loads and VPU adds, one store of 8 vregs);
- `reg`: 32 multiply-adds on 8 vregs kept in registers (VPU only, 16 loads and stores in all);
- `eup`: exp over the scratch (loads, EUP, stores);
- `mxu`: a (1024, 128) x (128, 128) bf16 dot accumulated into f32 scratch (MXU, result pops, stores);
and `none` (the stream alone) and `c0` (the work alone, no copies). Also: `ldst` before the starts, and
1024 vregs of `ldst` (`ldst4`) beside each shape.
Same conventions as cases.py (the public Pallas API JAX 0.10.2 and 0.12 share; nothing imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand

_LANES = 128
_ROUND_ROWS = 128            # 64 KiB of f32 rows a round
_WORK_ROWS = 2048            # 256 vregs of f32
_WORKS = ("none", "ldst", "st", "ld", "reg", "eup", "mxu")


def _beside(k, work, n=128, write=False, place="after", scale=1):
  """`n` double-buffered rounds of `k` copies (0: none) moving 64 KiB of f32 rows, HBM->VMEM (or
  VMEM->HBM when `write`), beside `work` (module docstring; `scale` times the rows) a round."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows = _ROUND_ROWS // k if k else 0
    wrows = _WORK_ROWS * scale

    def do_work(r, w_ref, s8_ref, xa_ref, wb_ref, acc_ref):
      if work == "ldst":
        w_ref[...] = w_ref[...] * 1.0001 + 0.5
      elif work == "st":
        w_ref[...] = jnp.full(w_ref.shape, r.astype(jnp.float32), jnp.float32)
      elif work == "ld":
        s8_ref[...] += w_ref[...].reshape(wrows // 64, 64, _LANES).sum(axis=0)
      elif work == "reg":
        v = w_ref[0:64, :]
        for _ in range(32):
          v = v * 1.0001 + 0.5
        w_ref[0:64, :] = v
      elif work == "eup":
        w_ref[...] = jnp.exp(w_ref[...] * -1e-3)
      elif work == "mxu":
        acc_ref[...] += jnp.dot(xa_ref[...], wb_ref[...], preferred_element_type=jnp.float32)
      elif work != "none":
        raise ValueError(work)

    def kernel(x_hbm, o_ref, y_hbm, buf, sem, w_ref, s8_ref, xa_ref, wb_ref, acc_ref):
      for ref in (buf, w_ref, s8_ref, xa_ref, wb_ref, acc_ref):
        ref[...] = jnp.zeros_like(ref)

      def copies(r, s):
        out = []
        for j in range(k):
          hbm = y_hbm if write else x_hbm
          window = hbm.at[pl.ds(r * _ROUND_ROWS + j * rows, rows)]
          local = buf.at[s, pl.ds(j * rows, rows)]
          out.append(pltpu.make_async_copy(local, window, sem.at[s]) if write
                     else pltpu.make_async_copy(window, local, sem.at[s]))
        return out

      for cp in copies(0, 0):
        cp.start()

      def body(r, c):
        s_next, s_cur = (r + 1) % 2, r % 2
        if place == "before":
          do_work(r, w_ref, s8_ref, xa_ref, wb_ref, acc_ref)

        @pl.when(r + 1 < n)
        def _():
          for cp in copies(r + 1, s_next):
            cp.start()
        if place == "after":
          do_work(r, w_ref, s8_ref, xa_ref, wb_ref, acc_ref)
        for cp in copies(r, s_cur):
          cp.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = (buf[0, 0:8, :] + w_ref[0:8, :] + s8_ref[0:8, :] + acc_ref[0:8, :])

    gs = dict(
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=[pl.BlockSpec((8, _LANES), lambda i: (0, 0)), pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((2, _ROUND_ROWS, _LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                        pltpu.VMEM((wrows, _LANES), jnp.float32), pltpu.VMEM((64, _LANES), jnp.float32),
                        pltpu.VMEM((1024, _LANES), jnp.bfloat16), pltpu.VMEM((_LANES, _LANES), jnp.bfloat16),
                        pltpu.VMEM((1024, _LANES), jnp.float32)])
    total = (n + 1) * _ROUND_ROWS
    call = pl.pallas_call(
        kernel, grid=(1,),
        out_shape=[jax.ShapeDtypeStruct((8, _LANES), jnp.float32),
                   jax.ShapeDtypeStruct((total if write else 8, _LANES), jnp.float32)], **gs)
    return call, (_rand((total, _LANES), "float32", 7),)
  return build


def s38_cases() -> list[Case]:
  F = "dma_beside"
  # The chip's compiler runs the `st` work's stores once: a scratch the loop stores every round and never
  # reads in it is stored after the loop (b38_c0_st: 15 cycles a round for 256 vregs), so those four
  # cases measure that compiler step, which palace does not take (it runs every store): family
  # `dead_store`, a known gap (docs/validation.md "Session 38"), apart from what the family measures.
  out = []
  for k, tag in ((16, "c16x4k"), (4, "c4x16k"), (1, "c1x64k"), (0, "c0")):
    out += [Case(f"b38_{tag}_{w}", "dead_store" if w == "st" else F, _beside(k, w))
            for w in _WORKS if k or w != "none"]
  out.append(Case("b38_c16x4k_ldst_before", F, _beside(16, "ldst", place="before")))
  out.append(Case("b38_c16x4k_ldst4", F, _beside(16, "ldst", scale=4)))
  out.append(Case("b38_c4x16k_ldst4", F, _beside(4, "ldst", scale=4)))
  out.append(Case("b38_c1x64k_ldst4", F, _beside(1, "ldst", scale=4)))
  out.append(Case("b38_c0_ldst4", F, _beside(0, "ldst", scale=4)))
  for k, tag in ((16, "w16x4k"), (1, "w1x64k")):
    out += [Case(f"b38_{tag}_{w}", F, _beside(k, w, write=True)) for w in ("none", "ldst")]
  return out
