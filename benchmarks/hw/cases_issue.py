"""Session 33 (`dma_issue`): what a copy started in a burst costs the chip, and what a wait on a rebuilt
descriptor costs.

With v5e's measured rules adopted, bursts of small copies came out slow (`probe_burst_4KiB_k64_x32`
+57%, the wheel's paged attention at 4 KiB pages +16..+43%): the model charges each copy 16 issue
cycles and 4 KiB + 128 B of channel time in series, where the chip's launch totals say ~10 cycles a
copy beyond a fixed ~500 a round. These cases sweep the burst (rounds of `k` HBM->VMEM copies started
back to back on one semaphore, then waited) over `k` and the copy size, so that the per-copy cost
separates from the round's fixed cost, and:
- `_paged`: each copy's source row block read from an SMEM table (a page gather);
- `_rebuilt`: those copies waited on descriptors built again, each page number loaded from SMEM
  again (the jax wheel's paged attention does this): does the chip pay the wait's source address?
  (palace.jax since session 33 does not: `palace/_src/jax/wait_sources.py`);
- `isr_*`: the same kernels with the starts and the waits inside `jax.named_scope` regions, for
  `benchmarks.hw.regions` (the chip's own time for the k starts of a round). Not in the timing suite.
Nothing here imports palace (same conventions as cases.py).
"""
from __future__ import annotations

import numpy as np

from benchmarks.hw.cases import Case, _jax, _rand


def _burst(rows, k, n, dtype="float32", paged=False, rebuilt=False, scoped=False, dslot=False, nsem=1,
           nsrc=1, when=False):
  """Rounds of `k` copies started back to back, then waited (module docstring). Session 34's forms of a
  page walk's starts, one at a time: `dslot` (each round's copies into the other half of a 2k-slot
  buffer: a destination index computed at run time), `nsem` (copy j signals semaphore j % nsem), `nsrc`
  (copy j reads source array j % nsrc, each as large as the one), `when` (the starts inside a
  `pl.when` that always holds, as a walk's next-block starts are)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    total = n * k

    def kernel(idx_ref, *refs):
      srcs, (o_ref, buf, sem) = refs[:nsrc], refs[nsrc:]

      def src(i, j):
        return srcs[j % nsrc].at[pl.ds((idx_ref[i * k + j] if paged else i * k + j) * rows, rows)]

      def dst(i, j):
        return buf.at[(i % 2) * k + j] if dslot else buf.at[j]

      def body(i, c):
        copies = [pltpu.make_async_copy(src(i, j), dst(i, j), sem.at[j % nsem]) for j in range(k)]

        def starts():
          if when:
            @pl.when(i < n)
            def _():
              for cp in copies:
                cp.start()
            return
          for cp in copies:
            cp.start()

        def waits():
          for j, cp in enumerate(copies):
            if rebuilt:
              pltpu.make_async_copy(src(i, j), dst(i, j), sem.at[j % nsem]).wait()
            else:
              cp.wait()
        if scoped:
          with jax.named_scope("starts"):
            starts()
          with jax.named_scope("waits"):
            waits()
        else:
          starts()
          waits()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = buf[0, 0:8].astype(jnp.float32)

    idx = jnp.asarray(np.random.default_rng(1).permutation(total), jnp.int32)
    gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                      in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * nsrc,
                                      out_specs=pl.BlockSpec((8, 128), lambda i, idx_ref: (0, 0)),
                                      scratch_shapes=[pltpu.VMEM(((2 if dslot else 1) * k, rows, 128),
                                                                 getattr(jnp, dtype)),
                                                      pltpu.SemaphoreType.DMA((nsem,))])
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid_spec=gs)
    return call, (idx, *(_rand((total * rows, 128), dtype, s) for s in range(nsrc)))
  return build


# (rows of f32, k, rounds): 4 KiB at k = 1..64 (k 4 / 16 / 64 are dma_probe's probe_burst_*), 16 KiB
# and 64 KiB at a few k; every case moves 4-16 MiB
_SWEEP = [(8, 1, 1024), (8, 2, 1024), (8, 8, 512), (8, 32, 128), (8, 128, 32),
          (32, 4, 256), (32, 64, 16), (128, 16, 16), (128, 2, 128)]


def dma_issue_cases() -> list[Case]:
  out = [Case(f"iss_{rows * 512 // 1024}KiB_k{k}_x{n}", "dma_issue", _burst(rows, k, n))
         for rows, k, n in _SWEEP]
  out += [Case("iss_4KiB_k16_x128_paged", "dma_issue", _burst(8, 16, 128, paged=True)),
          Case("iss_4KiB_k16_x128_rebuilt", "dma_issue", _burst(8, 16, 128, paged=True, rebuilt=True)),
          Case("iss_4KiB_k64_x32_paged", "dma_issue", _burst(8, 64, 32, paged=True)),
          Case("iss_4KiB_k64_x32_rebuilt", "dma_issue", _burst(8, 64, 32, paged=True, rebuilt=True))]
  return out


def issue_region_cases() -> list[Case]:
  """The region-traced twins (benchmarks.hw.regions only; not part of the timing suite)."""
  out = [Case(f"isr_4KiB_k{k}_x{n}{'_paged' if paged else ''}", "issue_regions",
              _burst(8, k, n, paged=paged, scoped=True))
         for k, n, paged in ((4, 64, False), (16, 32, False), (64, 8, False), (16, 32, True),
                             (24, 32, False), (32, 16, False), (48, 8, False))]
  out += [Case(f"isr_4KiB_k16_x32_{tag}", "issue_regions", _burst(8, 16, 32, scoped=True, **kw))
          for tag, kw in _FORMS]
  return out


# Session 34 (`issue_form`): the forms a page walk's starts take, one at a time, on the paged burst of 16
# (`iss_4KiB_k16_x128_paged`: 4.2 cycles a start on the chip, where a page walk's copies cost ~16)
_FORMS = (("paged_dslot", dict(paged=True, dslot=True)), ("paged_2sem", dict(paged=True, nsem=2)),
          ("paged_2src", dict(paged=True, nsrc=2)), ("paged_when", dict(paged=True, when=True)),
          ("paged_walk", dict(paged=True, dslot=True, nsem=2, nsrc=2, when=True)),
          ("dslot", dict(dslot=True)), ("2sem", dict(nsem=2)))


def issue_form_cases() -> list[Case]:
  """Session 34 (`issue_form`): `_burst`'s 16-copy rounds in each of a page walk's forms (_FORMS)."""
  return [Case(f"isf_4KiB_k16_x128_{tag}", "issue_form", _burst(8, 16, 128, **kw)) for tag, kw in _FORMS]


def _write_burst(rows, k, n):
  """`n` rounds of `k` VMEM->HBM copies of `rows` x 128 f32 (one VMEM buffer written to k places)
  started back to back on one semaphore, then waited."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_hbm, o_hbm, buf, sem):
      buf[...] = jnp.ones_like(buf)

      def body(i, c):
        copies = [pltpu.make_async_copy(buf, o_hbm.at[pl.ds((i * k + j) * rows, rows)], sem.at[0])
                  for j in range(k)]
        for cp in copies:
          cp.start()
        for cp in copies:
          cp.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n * k * rows, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32),
                                          pltpu.SemaphoreType.DMA((1,))])
    return call, (_rand((8, 128), "float32"),)
  return build


def write_burst_cases() -> list[Case]:
  """Session 33 (`write_burst`): do DMA writes stream faster in a burst than a sustained write stream
  (the 651 GB/s of a 64 MiB fill)? A serial loop of 1 MiB writes takes 1.65 us a copy: at 651 GB/s
  that leaves 60 cycles of round trip where a 4 KiB write's is ~340. Bursts of k writes of one size:
  the slope over k is the burst's write rate, apart from the round trip."""
  return [Case(f"wburst_{rows * 512 // 1024}KiB_k{k}_x{n}", "write_burst", _write_burst(rows, k, n))
          for rows, k, n in ((8, 1, 512), (8, 16, 64), (512, 1, 64), (512, 4, 32), (512, 16, 8),
                             (2048, 1, 32), (2048, 2, 16), (2048, 4, 8), (2048, 8, 4), (8192, 1, 8),
                             (8192, 2, 4))]
