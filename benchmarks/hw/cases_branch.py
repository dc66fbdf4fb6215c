"""Session 27's measured kernels (`step_branch`): what a runtime branch around a heavy step body costs.

Session 26's `splash_machinery` found that splash attention's two int8 scalar-prefetch tables with the
body under `pl.when(block_mask[h, i, j] > 0)` cost the chip ~107 cycles a step beside splash's step body
(int32 tables ~75) but ~10 beside a light body, while session 25's `wheel_move` put the wheel's flash
step under an SMEM `pl.when` on a 1-D grid for ~11. These cases take the machinery apart, each on
splash's step body (`cases_gather._splash_body`, 'full') unless named 'light':

- grid (8, 16, 16) with 128-row q, k and v blocks, q moving with the q block, k and v with the kv block
  (as `splash_machinery`), and
  - `pid`: the body under a runtime condition of the grid indices that always holds (no tables);
  - `mapcalc`: no branch, k and v's index map doing scalar arithmetic on the grid indices (the same
    blocks as `splash_machinery`'s 'none');
  - `map_i8` / `map_i32`: no branch, k and v's index map reading splash's next-data table (no block-mask
    read in the body);
  - `when_i8` / `when_i32`: the body under `pl.when(block_mask[h, i, j] > 0)`, k and v's maps plain;
  - `light_pid`: the light body (k and v's first rows accumulated) under the `pid` condition;
- `fixed_none` / `fixed_pid`: the (8, 16, 16) grid with q, k and v fixed (no copy in any step), without
  and with the `pid` branch;
- `g1_none` / `g1_pid`: a 1-D grid of 2048 steps, k and v cycling over 16 blocks (i % 16), without and
  with the `pid` branch.

`fa_published`: the published flash-attention points of `benchmarks.validate` (`fa-*`, jax-ml/jax issue
24633: the jax wheel's `flash_attention` on v5e, batch 32, 8 heads, head_dim 64, default block sizes, no
causal mask, no scaling, bf16; that issue timed wall clock) measured here with the profiler, so that the
chip says what those figures' kernels cost: `fapub_s512`, `fapub_s1024`, `fapub_s2048`.

`page_heavy`: session 26's `page_gather` step (c page copies of 8 KiB from K and V a step, page numbers
from an SMEM table, started one step ahead, each waited on its own) beside the wheel's flash step on fixed
(128, 128) blocks instead of a light body: what a page copy costs beside compute (paged attention's launches
are modelled +17..+24% slow when a page copy costs the 16 cycles `page_gather` measured beside a light
body): `pgheavy_c{0,1,4,8,16}` (c = 0: the same frame without copies).

Same conventions as `cases.py` (public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports
palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_gather import _page_gather, _splash_body, splash_tables_call
from benchmarks.hw.cases_move import _zero_when

_L = 128


def _always(jnp, ids):
  """A runtime condition of the grid indices that holds on every step of these grids (the compiler
  cannot fold it: (31 h + 7 i + j) % 1024 is at most 337 here)."""
  total = 0
  for w, x in zip((31, 7, 1), ids):
    total = total + w * x
  return total % 1024 != 1000


def _branch(mode, heads=8, nq=16, nk=16):
  """One `step_branch` case (module docstring)."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    g1 = mode.startswith("g1_")
    fixed = mode.startswith("fixed_")
    tables = mode.split("_")[-1] if mode.startswith(("map_", "when_")) else None
    light = mode == "light_pid"
    branch = mode.endswith("pid") or mode.startswith("when_")
    steps = heads * nq * nk

    def kernel(*refs):
      if tables is not None:
        dn_ref, bm_ref, refs = refs[0], refs[1], refs[2:]
      q_ref, k_ref, v_ref, s_ref, o_ref, m_ref, l_ref, acc_ref = refs
      if g1:
        ids = (pl.program_id(0),)
        first, last = ids[0] == 0, ids[0] == steps - 1
      else:
        ids = (pl.program_id(0), pl.program_id(1), pl.program_id(2))
        first, last = ids[2] == 0, ids[2] == nk - 1
      _zero_when(pl, jnp, first, (m_ref, l_ref, acc_ref))

      def body():
        if light:
          acc_ref[:8, :] += k_ref[:8, :].astype(jnp.float32) + v_ref[:8, :].astype(jnp.float32)
        else:
          _splash_body(jax, jnp, "full", q_ref, k_ref, v_ref, s_ref, m_ref, l_ref, acc_ref)

      if mode.startswith("when_"):
        pl.when(bm_ref[ids[0], ids[1], ids[2]].astype(jnp.int32) > 0)(body)
      elif branch:
        pl.when(_always(jnp, ids))(body)
      else:
        body()

      @pl.when(last)
      def _():
        o_ref[...] = acc_ref[...] + m_ref[...] + l_ref[...]

    if g1:
      grid = (steps,)
      q_map = lambda i, *t: (0, 0)  # noqa: E731
      kv_map = lambda i, *t: (i % nk, 0)  # noqa: E731
      blk, kv_block = (_L, _L), (_L, _L)
      out_map, o_block = (lambda i, *t: (0, 0)), (_L, _L)
      out_shape = jax.ShapeDtypeStruct((_L, _L), jnp.float32)
      arrays = (_rand((_L, _L), "bfloat16", 110), _rand((nk * _L, _L), "bfloat16", 111),
                _rand((nk * _L, _L), "bfloat16", 112), _rand((_L, _L), "float32", 113))
    else:
      grid = (heads, nq, nk)
      if fixed:
        q_map = kv_map = lambda h, i, j, *t: (0, 0, 0)  # noqa: E731
      else:
        q_map = lambda h, i, j, *t: (h, i, 0)  # noqa: E731
        if mode == "mapcalc":
          kv_map = lambda h, i, j, *t: (h, (j * 5 + h * 3 + i * 3) % nk, 0)  # noqa: E731
        elif mode.startswith("map_"):
          kv_map = lambda h, i, j, dn, bm: (h, dn[h, i, j].astype(jnp.int32), 0)  # noqa: E731
        else:
          kv_map = lambda h, i, j, *t: (h, j, 0)  # noqa: E731
      blk = kv_block = (None, _L, _L)
      out_map, o_block = q_map, (None, _L, _L)
      out_shape = jax.ShapeDtypeStruct((heads, nq * _L, _L), jnp.float32)
      arrays = (_rand((heads, nq * _L, _L), "bfloat16", 110), _rand((heads, nk * _L, _L), "bfloat16", 111),
                _rand((heads, nk * _L, _L), "bfloat16", 112), _rand((_L, _L), "float32", 113))
    s_map = (lambda *a: (0, 0))
    specs = dict(grid=grid, in_specs=[pl.BlockSpec(blk, q_map), pl.BlockSpec(kv_block, kv_map),
                                      pl.BlockSpec(kv_block, kv_map), pl.BlockSpec((_L, _L), s_map)],
                 out_specs=pl.BlockSpec(o_block, out_map),
                 scratch_shapes=[pltpu.VMEM((_L, _L), jnp.float32) for _ in range(3)])
    return splash_tables_call(pl, pltpu, kernel, out_shape, specs, arrays, tables, (heads, nq, nk))
  return build


_MODES = ("pid", "mapcalc", "map_i8", "map_i32", "when_i8", "when_i32", "light_pid",
          "fixed_none", "fixed_pid", "g1_none", "g1_pid")


def step_branch_cases() -> list[Case]:
  return [Case(f"sbr_{m}", "step_branch", _branch(m)) for m in _MODES]


def _fa_published(seq):
  """`fa_published` (module docstring): the wheel's flash_attention as benchmarks.validate's fa points."""
  def build():
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: PLC0415
    shape = (32, 8, seq, 64)
    return fa.flash_attention, tuple(_rand(shape, jnp.bfloat16, 120 + s) for s in range(3))
  return build


def fa_published_cases() -> list[Case]:
  return [Case(f"fapub_s{s}", "fa_published", _fa_published(s)) for s in (512, 1024, 2048)]


def page_heavy_cases() -> list[Case]:
  return [Case(f"pgheavy_c{c}", "page_heavy", _page_gather(c, 32, heavy=True)) for c in (0, 1, 4, 8, 16)]
