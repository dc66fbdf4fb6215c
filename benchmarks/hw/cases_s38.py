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

`write_queue` (the same session's second call): does a write started while a read waits behind an
earlier write go ahead of that read? `mm_skinny_4096x128x4096_b512x128x512` (+36%) is modelled with
each step's 128 KiB input read held behind two 512 KiB output writes (the one it queued behind and the
next step's, which the engine's write-first order lets ahead), where the chip's step (1727 cycles) is
one write, one read and two turnarounds. Rounds of: start a write W1, start a read R, `pl.delay(d1)`,
start a write W2, wait R, `pl.delay(d2)`, wait W1 and W2 (`wq_*`): if R lands before W2 transfers, d2
hides under W2; if W2 goes first, d2 adds to the round. Controls: without W2, and without the read.
And the skinny matmul's step swept (`skinny_k128_*`: K = 128 in one step, so every step writes its
output block and reads a new weight block): output blocks of 256 KiB-1 MiB.

`vpu_chain` (a third call, recorded for the next VPU step): `dma_beside`'s `reg` work (32 dependent
multiply-adds on 8 vregs) costs the chip ~3 cycles an op where a one-vreg chain costs ~2.1 (session 36)
and palace 2. `vchain_w{W}_d{D}_{op}`: 128 rounds of a value of W vregs loaded, D dependent multiply-adds
(`fma`) or adds (`add`) on it, stored: how a dependent op's cost grows with its value's vregs.
Same conventions as cases.py (the public Pallas API JAX 0.10.2 and 0.12 share; nothing imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _matmul, _rand
from benchmarks.hw.cases_curve import _hbm_call

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


def _write_queue(w_kib, r_kib, d1_ns, d2_ns=500, second_write=True, read=True, n=32):
  """`n` rounds of W1, R, delay d1, W2; wait R, delay d2, wait W1 and W2 (module docstring), each round
  on new HBM rows; `second_write` / `read` False leave W2 / R (and its wait) out."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    wr, rr = w_kib * 1024 // (4 * _LANES), r_kib * 1024 // (4 * _LANES)

    def kernel(x_hbm, o_hbm, wbuf, rbuf, sem):
      wbuf[...] = jnp.zeros_like(wbuf)

      def body(i, c):
        w1 = pltpu.make_async_copy(wbuf.at[0], o_hbm.at[pl.ds(2 * i * wr, wr)], sem.at[0])
        w2 = pltpu.make_async_copy(wbuf.at[1], o_hbm.at[pl.ds((2 * i + 1) * wr, wr)], sem.at[1]) \
            if second_write else None
        r = pltpu.make_async_copy(x_hbm.at[pl.ds(i * rr, rr)], rbuf, sem.at[2]) if read else None
        w1.start()
        if read:
          r.start()
        if d1_ns:
          pl.delay(d1_ns)
        if second_write:
          w2.start()
        if read:
          r.wait()
        pl.delay(d2_ns)
        w1.wait()
        if second_write:
          w2.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)

    return _hbm_call(kernel, 2 * n * wr, n * rr, [(2, wr), (rr,)], 3)
  return build


def write_queue_cases() -> list[Case]:
  F = "write_queue"
  out = [Case(f"wq_w512_r{r}_d{d}", F, _write_queue(512, r, d)) for r in (128, 32) for d in (0, 200, 600)]
  out += [Case("wq_w512_r128_now2", F, _write_queue(512, 128, 0, second_write=False)),
          Case("wq_w512_noread", F, _write_queue(512, 128, 0, read=False)),
          Case("wq_w128_r128_d0", F, _write_queue(128, 128, 0)),
          Case("wq_w512_r128_d0_nod2", F, _write_queue(512, 128, 0, d2_ns=0))]
  for bm, bn in ((512, 256), (512, 1024), (256, 512), (1024, 512), (512, 512)):
    out.append(Case(f"skinny_k128_b{bm}x{bn}", F, _matmul(4096, 128, 4096, bm, 128, bn)))
  return out


def _vchain(width, depth, op="fma", n=128):
  """`n` rounds of: an f32 value of `width` vregs loaded from scratch, `depth` dependent multiply-adds
  (`fma`: v * 1.0001 + 0.5) or adds (`add`: v + 0.5) on it, stored back."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows = 8 * width

    def kernel(x_ref, o_ref, w_ref):
      w_ref[...] = x_ref[...]

      def body(r, c):
        v = w_ref[...]
        for _ in range(depth):
          v = v * 1.0001 + 0.5 if op == "fma" else v + 0.5
        w_ref[...] = v
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = w_ref[0:8, :]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, _LANES), jnp.float32),
                          scratch_shapes=[pltpu.VMEM((rows, _LANES), jnp.float32)])
    return call, (_rand((rows, _LANES), "float32", 3),)
  return build


def vpu_chain_cases() -> list[Case]:
  F = "vpu_chain"
  out = [Case(f"vchain_w{w}_d32_fma", F, _vchain(w, 32)) for w in (1, 2, 4, 8, 16, 32)]
  out += [Case(f"vchain_w8_d{d}_fma", F, _vchain(8, d)) for d in (8, 64)]
  out += [Case(f"vchain_w{w}_d64_add", F, _vchain(w, 64, "add")) for w in (1, 8)]
  return out
