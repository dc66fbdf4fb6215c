"""Session 29's measured kernels: the 128-block tutorial matmul's grid step taken apart (`mm_step`).

With the candidate rules of docs/timing-model.md 1.6 (the DMA wait as a latency, ...) the recorded
suite fits far better except one pattern: pipelined steps whose 128-row blocks move every step come
out 8-17% fast, the calibration kernel first (`mm_bf16_*_b128x128x128`: 518-525 cycles a step on the
chip at every K, ~455 modelled), while session 24's `mmdma_dot_b128` (two moving (128, 128) bf16
blocks, a dot accumulated into scratch, a 1-D grid, no output until the end) costs the chip 494. These
cases are the tutorial kernel (`benchmarks.calibrate`'s, `cases._matmul`: 1024^3 bf16, a (8, 8, 8)
grid, x (i, s), y (s, j), the f32 accumulator zeroed at s = 0, the bf16 output block (i, j) written
at s = 7) with one thing changed at a time:
- `mmst_tut`: the tutorial itself (the control, measured again beside the others);
- `mmst_flat`: a 1-D grid of 512 steps, the three indices computed from the step (t // 64, t // 8 % 8,
  t % 8): the grid's rank and its maps;
- `mmst_outfixed`: the output block (0, 0) at every step, written at the last step only: no output
  block changes (no write-back every 8 steps);
- `mmst_outevery`: the output block written (cast from the accumulator) at every step; its write-back
  still only when the block changes;
- `mmst_f32out`: no scratch: the f32 output block accumulates the dots (zeroed at s = 0);
- `mmst_nowhen`: no zeroing branch (the accumulator is never reset: the values are wrong, the work
  and copies the tutorial's);
- `mmst_light`: the dot replaced by acc += x + y in f32 (the same copies, a light VPU body);
- `mmst_yfixed`: y's block (0, 0) at every step: one moving input (x), the dot unchanged;
- `mmst_none`: the copies alone: acc[:, :1] += x[:, :1] + y[:, :1] (both blocks move, nothing computed).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand

_N, _B = 1024, 128
_G = _N // _B   # 8 blocks a dim: a (8, 8, 8) grid, 512 steps


def _mm_step(variant: str):
  def build():
    jax, jnp, pl, pltpu = _jax()
    f32_out = variant == "f32out"
    out_dt = jnp.float32 if f32_out else jnp.bfloat16

    def ids():
      if variant == "flat":
        t = pl.program_id(0)
        return t // (_G * _G), (t // _G) % _G, t % _G
      return pl.program_id(0), pl.program_id(1), pl.program_id(2)

    def kernel(x_ref, y_ref, o_ref, *scratch):
      _, _, s = ids()
      acc_ref = o_ref if f32_out else scratch[0]
      if variant != "nowhen":
        @pl.when(s == 0)
        def _():
          acc_ref[...] = jnp.zeros_like(acc_ref)
      if variant == "light":
        acc_ref[...] += x_ref[...].astype(jnp.float32) + y_ref[...].astype(jnp.float32)
      elif variant in ("none", "none_outfixed"):
        acc_ref[:, :1] += x_ref[:, :1].astype(jnp.float32) + y_ref[:, :1].astype(jnp.float32)
      else:
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
      if f32_out:
        return
      if variant == "outevery":
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)
        return
      cond = s == _G - 1
      if variant in ("outfixed", "none_outfixed"):   # (the only write: the last step)
        cond = (pl.program_id(0) == _G - 1) & (pl.program_id(1) == _G - 1) & cond

      @pl.when(cond)
      def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    if variant == "flat":
      grid = (_G ** 3,)
      xs = pl.BlockSpec((_B, _B), lambda t: (t // (_G * _G), t % _G))
      ys = pl.BlockSpec((_B, _B), lambda t: (t % _G, (t // _G) % _G))
      os_ = pl.BlockSpec((_B, _B), lambda t: (t // (_G * _G), (t // _G) % _G))
      sem = ("arbitrary",)
    else:
      grid = (_G, _G, _G)
      xs = pl.BlockSpec((_B, _B), lambda i, j, s: (i, s))
      ys = pl.BlockSpec((_B, _B), (lambda i, j, s: (0, 0)) if variant == "yfixed" else (lambda i, j, s: (s, j)))
      fixed = variant in ("outfixed", "none_outfixed")
      os_ = pl.BlockSpec((_B, _B), (lambda i, j, s: (0, 0)) if fixed else (lambda i, j, s: (i, j)))
      sem = ("arbitrary",) * 3 if fixed else ("parallel", "parallel", "arbitrary")
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((_N, _N), out_dt), grid=grid, in_specs=[xs, ys],
        out_specs=os_, scratch_shapes=[] if f32_out else [pltpu.VMEM((_B, _B), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=sem))
    return call, (_rand((_N, _N), jnp.bfloat16, 1), _rand((_N, _N), jnp.bfloat16, 2))
  return build


def mm_step_cases() -> list[Case]:
  return [Case(f"mmst_{v}", "mm_step", _mm_step(v))
          for v in ("tut", "flat", "outfixed", "outevery", "f32out", "nowhen", "light", "yfixed", "none")]


def _copy_shape(dtype: str, rows: int, cycle: int = 8, out: str = "fixed", n: int = 512, window: bool = False,
                grid3: bool = False):
  """A 1-D grid of `n` steps with two moving (rows, 128) `dtype` inputs (block i % `cycle`, or i when
  `cycle` is 0) and a light body (their first columns added into an f32 (rows, 1) scratch): the copies'
  step alone. `out`: 'fixed' (one (rows, 128) f32 output block, written at the last step), 'every8'
  (a new output block every 8 steps, written at its 8th) or 'every' (a new block written every step).
  `window`: the inputs are (8 rows, 8 * 128) arrays of blocks and step i reads block (i % 8, i // 8 % 8):
  2-D windows, not whole rows. `grid3`: an (8, 8, 8) grid, block s (the last index) of whole rows."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    n_out = {"fixed": 1, "every8": n // 8, "every": n}[out]

    def kernel(a_ref, b_ref, o_ref, col_ref):
      i = pl.program_id(0) * 64 + pl.program_id(1) * 8 + pl.program_id(2) if grid3 else pl.program_id(0)

      @pl.when(i == 0)
      def _():
        col_ref[...] = jnp.zeros_like(col_ref)
      col_ref[...] += a_ref[:, :1].astype(jnp.float32) + b_ref[:, :1].astype(jnp.float32)
      last = {"fixed": i == n - 1, "every8": i % 8 == 7, "every": i >= 0}[out]

      @pl.when(last)
      def _():
        o_ref[...] = jnp.broadcast_to(col_ref[...], o_ref.shape)

    blocks = cycle or n
    in_shape = (blocks * rows, 128)
    if window:
      in_map, in_shape = (lambda i: (i % 8, i // 8 % 8)), (8 * rows, 8 * 128)
    elif grid3:
      in_map = lambda i, j, s: (s, 0)  # noqa: E731
    else:
      in_map = (lambda i: (i % cycle, 0)) if cycle else (lambda i: (i, 0))
    out_map = {"fixed": lambda *i: (0, 0), "every8": lambda i: (i // 8, 0), "every": lambda i: (i, 0)}[out]
    grid = (8, 8, n // 64) if grid3 else (n,)
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((n_out * rows, 128), jnp.float32), grid=grid,
        in_specs=[pl.BlockSpec((rows, 128), in_map)] * 2, out_specs=pl.BlockSpec((rows, 128), out_map),
        scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",) * len(grid)))
    return call, (_rand(in_shape, dtype, 1), _rand(in_shape, dtype, 2))
  return build


def copy_shape_cases() -> list[Case]:
  """Session 29's second call (`copy_shape`): does a 32 KiB block's dtype and shape change the copies'
  step (bf16 (128, 128) against f32 (64, 128) and int8 (256, 128)); 64 KiB blocks (f32 (128, 128), bf16
  (256, 128)); blocks read once (i) against the same 8 blocks cycled (i % 8); output blocks changing
  every 8 steps or every step (their write-backs)."""
  F = "copy_shape"
  return [Case("cshape_bf16_r128", F, _copy_shape("bfloat16", 128)),
          Case("cshape_f32_r64", F, _copy_shape("float32", 64)),
          Case("cshape_int8_r256", F, _copy_shape("int8", 256)),
          Case("cshape_f32_r128", F, _copy_shape("float32", 128)),
          Case("cshape_bf16_r256", F, _copy_shape("bfloat16", 256)),
          Case("cshape_bf16_r128_once", F, _copy_shape("bfloat16", 128, cycle=0)),
          Case("cshape_bf16_r128_out8", F, _copy_shape("bfloat16", 128, out="every8")),
          Case("cshape_bf16_r128_out1", F, _copy_shape("bfloat16", 128, out="every")),
          Case("cshape_f32_r64_out8", F, _copy_shape("float32", 64, out="every8"))]


def copy_window_cases() -> list[Case]:
  """Session 29's third call (`copy_window`): `copy_shape`'s step with 2-D windows of a wider array
  (the tutorial matmul's blocks) instead of whole rows, with the (8, 8, 8) grid, and the tutorial's
  copies-only step without its output block changes."""
  F = "copy_window"
  return [Case("cwin_bf16_r128", F, _copy_shape("bfloat16", 128, window=True)),
          Case("cwin_f32_r64", F, _copy_shape("float32", 64, window=True)),
          Case("cwin_bf16_r128_grid3", F, _copy_shape("bfloat16", 128, grid3=True)),
          Case("mmst_none_outfixed", F, _mm_step("none_outfixed"))]
