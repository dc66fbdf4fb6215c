"""Per-step cost of pipelines against block size (session 19's chip run): the `step_sweep` family.

Session 18 left pipelines with 64-256 KiB blocks 10-42% slower on the chip than modelled (copies of
(8, 2048) f32 blocks, transposes of 128- and 256-blocks, matmuls with 256-blocks, row gathers of 8-16
rows), while 1-2 MiB blocks were within 1%. These cases separate what a step pays from what it
moves: the same 8 MiB f32 array streamed with blocks of 4 KiB to 1 MiB, as a copy (one read and one
write a step), a read (the output block stays resident) and a write (the input block stays resident),
with short (128-lane) and long (2048-lane) rows; then two-input reads of 128 KiB bf16 blocks, and the
1024^3 bf16 matmul with 256-blocks with one operand's block held fixed. Same conventions as
`cases.py` (public Pallas API of JAX 0.10.2 and 0.12; nothing here imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import MiB, Case, _jax, _params, _rand

_TOTAL = 8 * MiB
_BLOCKS = [(8, 128), (32, 128), (128, 128), (512, 128), (8, 2048), (32, 2048), (128, 2048)]


def _stream(kind, rows, width):
  """`kind`: "copy" (o = x, both blocked), "read" (o += x, o resident) or "write" (o = x * 1 with x
  resident and o blocked), over an f32 array of _TOTAL bytes with (rows, width) blocks."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    n = _TOTAL // (4 * width)
    grid = (n // rows,)
    blocked = pl.BlockSpec((rows, width), lambda i: (i, 0))
    fixed = pl.BlockSpec((8, width), lambda i: (0, 0))
    if kind == "copy":
      def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]
      specs, out_shape, x_shape, sem = (blocked, blocked), (n, width), (n, width), ("parallel",)
    elif kind == "read":
      def kernel(x_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
          o_ref[...] = jnp.zeros_like(o_ref)
        o_ref[...] += x_ref[0:8, :]
      specs, out_shape, x_shape, sem = (blocked, fixed), (8, width), (n, width), ("arbitrary",)
    else:
      def kernel(x_ref, o_ref):
        o_ref[...] = jnp.broadcast_to(x_ref[0:1, :], o_ref.shape)
      specs, out_shape, x_shape, sem = (fixed, blocked), (n, width), (8, width), ("parallel",)
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32), grid=grid,
                          in_specs=[specs[0]], out_specs=specs[1],
                          compiler_params=_params(pltpu, sem))
    return call, (_rand(x_shape, "float32"),)
  return build


def _read2(rows, cols, b):
  """Two bf16 (rows, cols) arrays read in (b, b) blocks into a resident (8, b) f32 output: the DMA
  side of a matmul step with b-blocks, without the MXU."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, y_ref, o_ref):
      @pl.when((pl.program_id(0) == 0) & (pl.program_id(1) == 0))
      def _():
        o_ref[...] = jnp.zeros_like(o_ref)
      o_ref[...] += (x_ref[0:8, :] + y_ref[0:8, :]).astype(jnp.float32)

    spec = pl.BlockSpec((b, b), lambda i, j: (i, j))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, b), jnp.float32),
                          grid=(rows // b, cols // b), in_specs=[spec, spec],
                          out_specs=pl.BlockSpec((8, b), lambda i, j: (0, 0)),
                          compiler_params=_params(pltpu, ("arbitrary", "arbitrary")))
    return call, (_rand((rows, cols), "bfloat16", 1), _rand((rows, cols), "bfloat16", 2))
  return build


def _matmul_fixed(size, b, fixed):
  """The 1024^3 bf16 matmul with b-blocks and an f32 accumulator, one operand's block fixed at (0, 0)
  (`fixed` = "x" or "y"): the step cost with one input copied a step instead of two."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    nk = size // b

    def kernel(x_ref, y_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(2) == 0)
      def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
      acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

      @pl.when(pl.program_id(2) == nk - 1)
      def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    x_map = (lambda i, j, s: (0, 0)) if fixed == "x" else (lambda i, j, s: (i, s))
    y_map = (lambda i, j, s: (0, 0)) if fixed == "y" else (lambda i, j, s: (s, j))
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((size, size), jnp.bfloat16), grid=(size // b, size // b, nk),
        in_specs=[pl.BlockSpec((b, b), x_map), pl.BlockSpec((b, b), y_map)],
        out_specs=pl.BlockSpec((b, b), lambda i, j, s: (i, j)),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
        compiler_params=_params(pltpu, ("parallel", "parallel", "arbitrary")))
    return call, (_rand((size, size), "bfloat16", 1), _rand((size, size), "bfloat16", 2))
  return build


def step_cases() -> list[Case]:
  F = "step_sweep"
  out = []
  for kind in ("copy", "read", "write"):
    for rows, width in _BLOCKS:
      kib = rows * width * 4 // 1024
      out.append(Case(f"step_{kind}_f32_b{rows}x{width}_{kib}KiB", F, _stream(kind, rows, width)))
  out.append(Case("step_read2_bf16_4096x1024_b256", F, _read2(4096, 1024, 256)))
  out.append(Case("step_read2_bf16_4096x1024_b128", F, _read2(4096, 1024, 128)))
  out.append(Case("step_read2_bf16_4096x2048_b512", F, _read2(4096, 2048, 512)))
  out.append(Case("step_mm_bf16_1024_b256_xfixed", F, _matmul_fixed(1024, 256, "x")))
  out.append(Case("step_mm_bf16_1024_b256_yfixed", F, _matmul_fixed(1024, 256, "y")))
  return out


def _dma_loop_order(cols, br, order):
  """A hand-written double-buffered copy of an 8 MiB f32 (rows, cols) array in (br, cols) blocks, the
  DMA order chosen: "A" starts block i+1's read before waiting block i (as `cases._dma_loop`), and
  waits the write of block i-2; "B" starts block i+1's read only after block i's write is started;
  "C" as A but waits the write of block i-1 (one write in flight). Which order the chip's own
  pallas_call pipeline behaves like, and whether the DMA engine model holds for 16-256 KiB copies."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    rows = _TOTAL // (4 * cols)
    n = rows // br
    lag = 1 if order == "C" else 2

    def kernel(x_hbm, o_hbm, xbuf, obuf, isem, osem):
      def rd(i, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(i * br, br)], xbuf.at[slot], isem.at[slot])

      def wr(i, slot):
        return pltpu.make_async_copy(obuf.at[slot], o_hbm.at[pl.ds(i * br, br)], osem.at[slot])

      rd(0, 0).start()

      def step(i, carry):
        slot = i % 2

        def prefetch():
          @pl.when(i + 1 < n)
          def _():
            rd(i + 1, 1 - slot).start()
        if order != "B":
          prefetch()
        rd(i, slot).wait()

        @pl.when(i >= lag)
        def _():
          wr(i - lag, (i - lag) % 2).wait()
        obuf[slot] = xbuf[slot]
        wr(i, slot).start()
        if order == "B":
          prefetch()
        return carry

      jax.lax.fori_loop(0, n, step, 0)
      for j in range(max(0, n - lag), n):
        wr(j, j % 2).wait()

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((2, br, cols), jnp.float32),
                                          pltpu.VMEM((2, br, cols), jnp.float32),
                                          pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))])
    return call, (_rand((rows, cols), "float32"),)
  return build


def loop_cases() -> list[Case]:
  F = "step_loop"
  out = []
  for cols, br in ((512, 8), (2048, 8), (2048, 32), (2048, 128)):
    kib = br * cols * 4 // 1024
    for order in ("A", "B", "C"):
      out.append(Case(f"loop{order}_copy_f32_b{br}x{cols}_{kib}KiB", F, _dma_loop_order(cols, br, order)))
  return out


def _dma_loop_mix(rblock, wblock, write_to="hbm", ahead=1, n=128):
  """`n` steps of a hand-written loop in JAX's order (start the read `ahead` blocks on, wait this
  step's read, wait the write of two steps back, start this step's write): reads of `rblock` =
  (rows, cols) f32 from HBM, writes of `wblock` from VMEM to HBM or, with `write_to="vmem"`, to
  another VMEM buffer (the same DMA engine, no HBM write traffic). No vector work: the write's source
  is filled once before the loop. Which of the write's HBM traffic, its size or the read's latency
  sets the step of a 64 KiB copy (session 19's last chip run)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    nb = ahead + 1
    (rr, rc), (wr_, wc) = rblock, wblock

    def kernel(x_hbm, o_hbm, xbuf, obuf, vdst, isem, osem):
      def rd(i, slot):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(i * rr, rr)], xbuf.at[slot], isem.at[slot])

      def wr(i, slot):
        dst = o_hbm.at[pl.ds(i * wr_, wr_)] if write_to == "hbm" else vdst.at[slot]
        return pltpu.make_async_copy(obuf.at[slot], dst, osem.at[slot])

      obuf[...] = jnp.zeros(obuf.shape, jnp.float32)
      for j in range(ahead):
        rd(j, j).start()

      def step(i, carry):
        @pl.when(i + ahead < n)
        def _():
          rd(i + ahead, (i + ahead) % nb).start()
        rd(i, i % nb).wait()

        @pl.when(i >= 2)
        def _():
          wr(i - 2, i % 2).wait()
        wr(i, i % 2).start()
        return carry

      jax.lax.fori_loop(0, n, step, 0)
      for j in range(n - 2, n):
        wr(j, j % 2).wait()

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n * wr_, wc), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.VMEM((nb, rr, rc), jnp.float32),
                                          pltpu.VMEM((2, wr_, wc), jnp.float32),
                                          pltpu.VMEM((2, wr_, wc), jnp.float32),
                                          pltpu.SemaphoreType.DMA((nb,)), pltpu.SemaphoreType.DMA((2,))])
    return call, (_rand((n * rr, rc), "float32"),)
  return build


def mix_cases() -> list[Case]:
  F = "step_mix"
  k16, k64, k128, k256 = (8, 512), (8, 2048), (16, 2048), (32, 2048)
  spec = [("r64_w64_hbm", k64, k64, "hbm", 1), ("r64_w64_vmem", k64, k64, "vmem", 1),
          ("r64_w64_hbm_ahead2", k64, k64, "hbm", 2), ("r64_w64_hbm_ahead3", k64, k64, "hbm", 3),
          ("r64_w16_hbm", k64, k16, "hbm", 1), ("r16_w64_hbm", k16, k64, "hbm", 1),
          ("r64_none", k64, k16, "vmem", 1), ("r16_w16_hbm", k16, k16, "hbm", 1),
          ("r128_w128_hbm", k128, k128, "hbm", 1), ("r256_w256_hbm", k256, k256, "hbm", 1),
          ("r256_w256_hbm_ahead2", k256, k256, "hbm", 2), ("r256_w256_vmem", k256, k256, "vmem", 1)]
  return [Case(f"mix_{name}", F, _dma_loop_mix(r, w, to, ahead)) for name, r, w, to, ahead in spec]
