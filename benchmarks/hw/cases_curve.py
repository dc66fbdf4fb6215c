"""DMA rate against copy size and copies in flight (session 20's chip run): the `dma_curve` family.

Sessions 18-19 left pipelines whose steps move two copies of 16-128 KiB (a copy's read and write, or
two inputs) 15-30% slower on the chip than modelled, while one copy a step, and copies of 256 KiB and
more, are right; bursts of 16-64 KiB page copies run at about 600 GB/s where large streams read at
748. These cases measure the curve the next rule needs, with no vector work: an 8 MiB f32 array read
(HBM->VMEM) or written (VMEM->HBM) in copies of 16-512 KiB, `ahead` = 0 (each copy started and waited
before the next), 1 or 3 copies in flight (a ring: start copy i + ahead, wait copy i); each read split
into 2 or 4 copies started together; and a write followed at once by a read (and the reverse), both
waited, to see whether a read waits for an earlier write. Same conventions as `cases.py` (public
Pallas API of JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import MiB, Case, _jax, _rand

_TOTAL = 8 * MiB
_LANES = 128
_ROW_BYTES = 4 * _LANES


def _hbm_call(kernel, out_rows, in_rows, scratch_rows, sems):
  """A pallas_call of `kernel` on an f32 (in_rows, 128) HBM input and (out_rows, 128) HBM output
  (`pl.ANY`: no pipelining), with one f32 (*rows, 128) VMEM scratch per entry of `scratch_rows` and
  `sems` DMA semaphores; returns (call, args)."""
  jax, jnp, pl, pltpu = _jax()
  scratch = [pltpu.VMEM((*rows, _LANES), jnp.float32) for rows in scratch_rows]
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((out_rows, _LANES), jnp.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        scratch_shapes=scratch + [pltpu.SemaphoreType.DMA((sems,))])
  return call, (_rand((in_rows, _LANES), "float32"),)


def _ring(kib, ahead, write=False, split=1):
  """`_TOTAL` bytes read (or written) in copies of `kib` KiB, `ahead` copies in flight; `split` > 1:
  each copy is `split` copies of `kib / split` KiB on one semaphore, started together and waited
  together (a step's inputs)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows = kib * 1024 // _ROW_BYTES
    n = _TOTAL // (kib * 1024)
    slots = ahead + 1
    part = rows // split

    def kernel(x_hbm, o_hbm, buf, sem):
      if write:
        buf[...] = jnp.zeros_like(buf)

      def copies(i):
        j = i % slots
        out = []
        for p in range(split):
          vm = buf.at[j, pl.ds(p * part, part)]
          hb = (o_hbm if write else x_hbm).at[pl.ds(i * rows + p * part, part)]
          src, dst = (vm, hb) if write else (hb, vm)
          out.append(pltpu.make_async_copy(src, dst, sem.at[j]))
        return out

      for i in range(ahead):
        for cp in copies(i):
          cp.start()

      def body(i, c):
        @pl.when(i + ahead < n)
        def _():
          for cp in copies(i + ahead):
            cp.start()
        for cp in copies(i):
          cp.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      if not write:
        tail = pltpu.make_async_copy(buf.at[0, pl.ds(0, 8)], o_hbm.at[pl.ds(0, 8)], sem.at[0])
        tail.start()
        tail.wait()

    return _hbm_call(kernel, n * rows if write else 8, 8 if write else n * rows, [(slots, rows)], slots)
  return build


def _pair(first_kib, second_kib, write_first, n=64, delay_ns=0):
  """`n` rounds of two copies started back to back and then both waited: a write of `first_kib` then
  a read of `second_kib` (`write_first`), or a read then a write; each round uses new HBM rows."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    w_kib, r_kib = (first_kib, second_kib) if write_first else (second_kib, first_kib)
    wr, rr = w_kib * 1024 // _ROW_BYTES, r_kib * 1024 // _ROW_BYTES

    def kernel(x_hbm, o_hbm, wbuf, rbuf, sem):
      wbuf[...] = jnp.zeros_like(wbuf)

      def body(i, c):
        w = pltpu.make_async_copy(wbuf, o_hbm.at[pl.ds(i * wr, wr)], sem.at[0])
        r = pltpu.make_async_copy(x_hbm.at[pl.ds(i * rr, rr)], rbuf, sem.at[1])
        first, second = (w, r) if write_first else (r, w)
        first.start()
        if delay_ns:
          pl.delay(delay_ns)
        second.start()
        first.wait()
        second.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)

    return _hbm_call(kernel, n * wr, n * rr, [(wr,), (rr,)], 2)
  return build


def _pair_delay(first_kib, second_kib, write_first, delay_ns, n=64):
  """As `_pair` with `pl.delay(delay_ns)` between the two starts: how long a write's (or read's)
  effect on the other copy lasts."""
  return _pair(first_kib, second_kib, write_first, n, delay_ns)


def _overtake(big_kib, big_write, small_kib=16, delay_ns=500, n=32):
  """`n` rounds of: start a big copy (a read, or a write with `big_write`), start a 16 KiB read, wait
  the small read, `pl.delay(delay_ns)`, wait the big copy. If the small read lands before the big copy
  is through (no FIFO between them), the delay hides under the big copy's transfer; if it queues behind
  it, the delay adds to every round."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    br, sr = big_kib * 1024 // _ROW_BYTES, small_kib * 1024 // _ROW_BYTES

    def kernel(x_hbm, o_hbm, bbuf, sbuf, sem):
      bbuf[...] = jnp.zeros_like(bbuf)

      def body(i, c):
        if big_write:
          big = pltpu.make_async_copy(bbuf, o_hbm.at[pl.ds(i * br, br)], sem.at[0])
        else:
          big = pltpu.make_async_copy(x_hbm.at[pl.ds(i * br, br)], bbuf, sem.at[0])
        small = pltpu.make_async_copy(x_hbm.at[pl.ds((n + i) * br, sr)], sbuf, sem.at[1])
        big.start()
        small.start()
        small.wait()
        if delay_ns:
          pl.delay(delay_ns)
        big.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)

    return _hbm_call(kernel, n * br, 2 * n * br, [(br,), (sr,)], 2)
  return build


def _delay_loop(delay_ns, n=64):
  """`n` iterations of `pl.delay(delay_ns)` alone (what a delay costs on the chip)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      def body(i, c):
        pl.delay(delay_ns)
        return c
      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = x_ref[...]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, _LANES), jnp.float32))
    return call, (_rand((8, _LANES), "float32"),)
  return build


def order_cases() -> list[Case]:
  """Session 20's second run (`dma_order`): when a copy's latency and its transfer happen, and what
  lasts of a write's effect on a read."""
  F = "dma_order"
  out = [Case(f"order_delay_{d}ns_x64", F, _delay_loop(d)) for d in (100, 500)]
  for d in (50, 100, 200, 400, 800):
    out.append(Case(f"order_pair_w64_delay{d}ns_r64", F, _pair_delay(64, 64, True, d)))
    out.append(Case(f"order_pair_r64_delay{d}ns_w64", F, _pair_delay(64, 64, False, d)))
  for r in (16, 32, 64, 128, 256):
    for w in (32, 256):
      out.append(Case(f"order_pair_w{w}_then_r{r}", F, _pair(w, r, True)))
  for r in (32, 256):
    out.append(Case(f"order_pair_w64_then_r{r}", F, _pair(64, r, True)))
  for big in (128, 512):
    for d in (0, 500):
      out.append(Case(f"order_overtake_read{big}_delay{d}ns", F, _overtake(big, False, delay_ns=d)))
      out.append(Case(f"order_overtake_write{big}_delay{d}ns", F, _overtake(big, True, delay_ns=d)))
  return out


def curve_cases() -> list[Case]:
  F = "dma_curve"
  out = []
  for kib in (16, 32, 64, 128, 256, 512):
    for ahead in (0, 1, 3):
      out.append(Case(f"curve_read_{kib}KiB_ahead{ahead}", F, _ring(kib, ahead)))
    for ahead in (0, 1):
      out.append(Case(f"curve_write_{kib}KiB_ahead{ahead}", F, _ring(kib, ahead, write=True)))
  for kib in (64, 128, 256):
    for split in (2, 4):
      out.append(Case(f"curve_read_{kib}KiB_split{split}_ahead1", F, _ring(kib, 1, split=split)))
  for w, r in ((16, 64), (64, 16), (64, 64), (128, 128), (16, 16)):
    out.append(Case(f"curve_pair_w{w}_then_r{r}", F, _pair(w, r, True)))
    out.append(Case(f"curve_pair_r{r}_then_w{w}", F, _pair(r, w, False)))
  return out
