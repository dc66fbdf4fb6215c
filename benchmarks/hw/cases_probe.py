"""The probe families of the measured suite (sessions 17-18's chip runs): sequential and burst DMA round
trips, page gathers, chains of dependent ops (`dma_probe`, `op_chain`), rings of copies telling DMA-wait
rules apart (`dma_sync`), and how much of a chain's latency the chip hides as the value grows
(`op_overlap`). Split from `cases.py` (same conventions; nothing here imports palace)."""
from __future__ import annotations

import numpy as np

from benchmarks.hw.cases import MiB, Case, _jax, _params, _rand


def _seq_dma(rows, n, write=False):
  """`n` copies of `rows` x 128 f32 between HBM and one VMEM buffer, each started and waited before
  the next (a DMA's whole latency and transfer, in series)."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_hbm, o_hbm, buf, sem):
      buf[...] = jnp.zeros_like(buf)

      def body(i, c):
        if write:
          cp = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(i * rows, rows)], sem.at[0])
        else:
          cp = pltpu.make_async_copy(x_hbm.at[pl.ds(i * rows, rows)], buf, sem.at[0])
        cp.start()
        cp.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      if not write:
        pltpu.make_async_copy(buf.at[pl.ds(0, 8)], o_hbm.at[pl.ds(0, 8)], sem.at[0]).start()
        pltpu.make_async_copy(buf.at[pl.ds(0, 8)], o_hbm.at[pl.ds(0, 8)], sem.at[0]).wait()

    out_rows = n * rows if write else 8
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((out_rows, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))])
    return call, (_rand((n * rows if not write else 8, 128), "float32"),)
  return build


def _burst_dma(rows, k, n, paged=False):
  """`n` rounds of `k` HBM->VMEM copies of `rows` x 128 f32 started back to back on one semaphore,
  then waited; `paged`: each copy's source row block comes from an index table in SMEM (a page
  gather)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    total = n * k

    def kernel(idx_ref, x_hbm, o_ref, buf, sem):
      def body(i, c):
        copies = []
        for j in range(k):
          src = idx_ref[i * k + j] if paged else i * k + j
          copies.append(pltpu.make_async_copy(x_hbm.at[pl.ds(src * rows, rows)], buf.at[j], sem.at[0]))
        for cp in copies:
          cp.start()
        for cp in copies:
          cp.wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = buf[0, 0:8]

    rng = np.random.default_rng(1)
    idx = jnp.asarray(rng.permutation(total), jnp.int32)
    gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                      in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                                      out_specs=pl.BlockSpec((8, 128), lambda i, idx_ref: (0, 0)),
                                      scratch_shapes=[pltpu.VMEM((k, rows, 128), jnp.float32),
                                                      pltpu.SemaphoreType.DMA((1,))])
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid_spec=gs)
    return call, (idx, _rand((total * rows, 128), "float32"))
  return build


def _chain(op, rows, n):
  """`n` dependent iterations of one small op on a (rows, 128) value: the op's result latency, not
  its throughput, sets the time."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def step(x, w):
      if op == "dot":
        return jnp.dot(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
      if op == "exp":
        return jnp.exp(x) * 0.5
      if op == "fma":
        return x * 1.0001 + 0.5
      if op == "lane_max":
        return x - jnp.max(x, axis=-1, keepdims=True) * 0.5
      if op == "sublane_sum":
        return x - jnp.sum(x, axis=0, keepdims=True) * 0.01
      if op == "softmax":   # a row softmax: lane max, exp, lane sum, divide
        e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)
      if op == "attn":      # one flash-attention inner step: dot, softmax, dot
        s = jnp.dot(x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        p = e / jnp.sum(e, axis=-1, keepdims=True)
        return jnp.dot(p.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
      raise ValueError(op)

    def kernel(x_ref, w_ref, o_ref):
      w = w_ref[...]
      o_ref[...] = jax.lax.fori_loop(0, n, lambda i, x: step(x, w), x_ref[...])

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32))
    return call, (_rand((rows, 128), "float32", 1) * 0.01, _rand((128, 128), "bfloat16", 2) * 0.05)
  return build


def _empty_steps(n, body_runs):
  """A grid of `n` steps whose blocks never change (one fetch, one write-back): the per-step cost of
  the pipeline itself; the body adds one vreg when `body_runs`, else it is skipped by pl.when."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, o_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)

      @pl.when(pl.program_id(0) >= (0 if body_runs else n))
      def _():
        o_ref[...] += x_ref[...]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(n,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                          compiler_params=_params(pltpu, ("arbitrary",)))
    return call, (_rand((8, 128), "float32"),)
  return build


def probe_cases():
  out = [Case("probe_steps_skipped_x4096", "op_chain", _empty_steps(4096, False)),
         Case("probe_steps_add_x4096", "op_chain", _empty_steps(4096, True)),
         Case("probe_steps_skipped_x512", "op_chain", _empty_steps(512, False))]
  for rows in (8, 32, 128, 512, 2048, 8192):
    n = min(2048, max(32, (16 * MiB) // (rows * 512)))
    kib = rows * 512 // 1024
    out.append(Case(f"probe_read_seq_{kib}KiB_x{n}", "dma_probe", _seq_dma(rows, n)))
    out.append(Case(f"probe_write_seq_{kib}KiB_x{n}", "dma_probe", _seq_dma(rows, n, write=True)))
  for rows, k, n in [(8, 4, 256), (8, 16, 128), (8, 64, 32), (32, 16, 64), (128, 4, 128)]:
    out.append(Case(f"probe_burst_{rows * 512 // 1024}KiB_k{k}_x{n}", "dma_probe", _burst_dma(rows, k, n)))
  out.append(Case("probe_paged_4KiB_k16_x128", "dma_probe", _burst_dma(8, 16, 128, paged=True)))
  out.append(Case("probe_paged_16KiB_k8_x128", "dma_probe", _burst_dma(32, 8, 128, paged=True)))
  for op, rows, n in [("dot", 8, 256), ("dot", 128, 256), ("exp", 8, 1024), ("fma", 8, 1024),
                      ("lane_max", 8, 512), ("sublane_sum", 8, 512)]:
    out.append(Case(f"probe_chain_{op}_{rows}x128_x{n}", "op_chain", _chain(op, rows, n)))
  return out


def _ring(streams, ahead, n, grouped):
  """`streams` HBM->VMEM streams of 4 KiB copies, each started `ahead` iterations before it is waited
  (a ring of ahead + 1 buffers and semaphores per stream); per iteration either every stream's next
  copy is started and then every current one waited (`grouped`), or stream by stream (start, wait;
  JAX's emit_pipeline order). What a DMA wait costs when its copy landed long ago, and which waits pay
  the DMA-wait sync."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    slots = ahead + 1

    def kernel(x_hbm, o_ref, buf, sem):
      def cp(st, i):
        j = i % slots
        return pltpu.make_async_copy(x_hbm.at[st, pl.ds(i * 8, 8)], buf.at[st, j], sem.at[st, j])

      for st in range(streams):
        for i in range(ahead):
          cp(st, i).start()

      def body(i, c):
        def start(st):
          @pl.when(i + ahead < n)
          def _():
            cp(st, i + ahead).start()
        if grouped:
          for st in range(streams):
            start(st)
          for st in range(streams):
            cp(st, i).wait()
        else:
          for st in range(streams):
            start(st)
            cp(st, i).wait()
        return c

      jax.lax.fori_loop(0, n, body, 0)
      o_ref[...] = buf[0, 0]

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          scratch_shapes=[pltpu.VMEM((streams, slots, 8, 128), jnp.float32),
                                          pltpu.SemaphoreType.DMA((streams, slots))])
    return call, (_rand((streams, n * 8, 128), "float32"),)
  return build


def overlap_cases():
  """How much of a dependent chain's latency the chip hides as the value grows from 1 to 16 vregs
  (session 18's fifth chip run): paged attention's chains are 1-vreg, flash attention's 16."""
  out = []
  for op, n in (("softmax", 256), ("attn", 128), ("lane_max", 256), ("dot", 256)):
    for rows in (8, 32, 128):
      out.append(Case(f"overlap_{op}_{rows}x128_x{n}", "op_overlap", _chain(op, rows, n)))
  return out


def sync_cases():
  """Which DMA waits pay the sync (session 18's fourth chip run)."""
  S = "dma_sync"
  return [Case("sync_ring1_s1_x512", S, _ring(1, 1, 512, True)),
          Case("sync_ring3_s1_x512", S, _ring(1, 3, 512, True)),
          Case("sync_ring1_s2_grouped_x512", S, _ring(2, 1, 512, True)),
          Case("sync_ring1_s2_alternate_x512", S, _ring(2, 1, 512, False)),
          Case("sync_ring3_s3_grouped_x512", S, _ring(3, 3, 512, True)),
          Case("sync_ring3_s3_alternate_x512", S, _ring(3, 3, 512, False)),
          Case("sync_ring0_s1_x512", S, _ring(1, 0, 512, True))]
