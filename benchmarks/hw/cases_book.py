"""Session 32's measured kernels (`step_book`): what a grid step's own bookkeeping costs, by the grid's
rank, the number of pipelined inputs and outputs, and the form of their index maps.

Session 31's region traces show the jax wheel's causal flash attention paying ~170 cycles for a step
whose body is skipped and whose blocks do not change (its kv blocks clamped), where a 1-D grid with one
input and one output pays 37 (`probe_steps_skipped_x4096`, 2026-12-05), and the tutorial's 128-block
matmul paying ~26 cycles a step more than palace outside its waits and its dot. Each case here is a grid
of 4096 steps whose blocks never change (each operand is fetched once and written back once), with the
body skipped by a `pl.when` that never holds (every output zeroed at step 0), so the launch is the steps'
bookkeeping:

- `book_r{1,2,3,4}_i1_o1`: the grid's rank 1-4 ((4096,), (64, 64), (16, 16, 16), (8, 8, 8, 8)), one
  (8, 128) f32 input and one output, constant index maps;
- `book_r1_i{2,4,8}_o1`, `book_r1_i1_o{2,4}`: more inputs, more outputs, on the 1-D grid;
- `book_r3_i2_o1`: the tutorial matmul's operand count on its 3-D grid;
- `book_r4_i3_o1`, `book_r4_i3_o3`: the wheel flash's counts (q, k, v; o, and o, l, m) on its 4-D grid;
- `book_r1_i1_o1_min`: index maps computing `min(i, 0)` (not foldable by the compiler);
- `book_r4_i3_o1_a4`: 4-D arrays with (1, 1, 8, 128) blocks, each map `(min(b, 0), min(h, 0), min(q, 0),
  0)` (the flash maps' shape);
- `book_r4_i3_o1_sel`: as `a4`, k and v's maps the wheel's causal clamp (`select(below_or_on_diag(q, kv),
  kv, 0)` on a grid where it always gives 0) and their kv index `min(kv, 0)`;
- `book_r4_i3_o1_when3`: as `a4` with the wheel's three per-step conditions (kv == 0, the diagonal
  test, kv == last), each guarding a one-vreg store that never runs.

Same conventions as `cases.py` (public Pallas API shared by JAX 0.10.2 and 0.12; nothing here imports
palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _params, _rand

_STEPS = 4096
_GRIDS = {1: (4096,), 2: (64, 64), 3: (16, 16, 16), 4: (8, 8, 8, 8)}


def _book(rank, n_in, n_out, maps="const", heavy=False):
  """One `step_book` case (module docstring). `maps`: 'const', 'min', 'plain', 'a4', 'sel' or 'when3'."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    grid = _GRIDS[rank]
    four = maps in ("a4", "sel", "when3")
    block = (1, 1, 8, 128) if four else ((256, 128) if heavy else (8, 128))

    def kernel(*refs):
      ins, outs = refs[:n_in], refs[n_in:]
      ids = [pl.program_id(d) for d in range(rank)]
      first = ids[0] == 0
      for d in range(1, rank):
        first = jnp.logical_and(first, ids[d] == 0)

      @pl.when(first)
      def _():
        for o in outs:
          o[...] = jnp.zeros_like(o)

      if maps == "when3":
        kv, q = ids[3], ids[2]

        @pl.when(kv == _STEPS)
        def _():
          outs[0][...] += ins[0][...]

        @pl.when((q + 1) * 128 - 1 > kv * 128 + _STEPS * 128)
        def _():
          outs[0][...] += ins[1][...]

        @pl.when(kv == _STEPS + 1)
        def _():
          outs[0][...] += ins[2][...]
      elif heavy:
        x = ins[0][...]
        for k in range(4):
          x = x * (1.0 + k / 64) + 0.5
        outs[0][...] = x
      else:
        @pl.when(ids[0] >= _STEPS)
        def _():
          outs[0][...] += ins[0][...]

    if maps == "const":
      in_maps = [lambda *g: (0, 0)] * n_in
      out_map = lambda *g: (0, 0)  # noqa: E731
    elif maps == "min":
      in_maps = [lambda *g: (jnp.minimum(g[0], 0), 0)] * n_in
      out_map = lambda *g: (jnp.minimum(g[0], 0), 0)  # noqa: E731
    elif maps == "plain":   # the input's block moves with the outer grid index (a copy every 64 steps)
      in_maps = [lambda *g: (g[0], 0)] * n_in
      out_map = lambda *g: (0, 0)  # noqa: E731
    else:
      plain = lambda b, h, q, kv: (jnp.minimum(b, 0), jnp.minimum(h, 0), jnp.minimum(q, 0), 0)  # noqa: E731
      if maps == "sel":
        def kv_map(b, h, q, kv):
          below = (q + 1) * 8 - 1 > (kv + 64) * 8   # never on these grids: always block 0
          return (jnp.minimum(b, 0), jnp.minimum(h, 0), jax.lax.select(below, jnp.minimum(kv, 0), 0), 0)
        in_maps = [plain, kv_map, kv_map]
      else:
        in_maps = [plain] * n_in
      out_map = plain
    shape = block
    in_shape = (grid[0] * block[0], block[1]) if maps == "plain" else block
    call = pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32) for _ in range(n_out)], grid=grid,
        in_specs=[pl.BlockSpec(block, m) for m in in_maps],
        out_specs=[pl.BlockSpec(block, out_map) for _ in range(n_out)],
        compiler_params=_params(pltpu, ("arbitrary",) * rank))
    return call, tuple(_rand(in_shape, "float32", 140 + k) for k in range(n_in))
  return build


def step_book_cases() -> list[Case]:
  spec = [(1, 1, 1, "const"), (2, 1, 1, "const"), (3, 1, 1, "const"), (4, 1, 1, "const"),
          (1, 2, 1, "const"), (1, 4, 1, "const"), (1, 8, 1, "const"), (1, 1, 2, "const"),
          (1, 1, 4, "const"), (3, 2, 1, "const"), (4, 3, 1, "const"), (4, 3, 3, "const"),
          (1, 1, 1, "min"), (4, 3, 1, "a4"), (4, 3, 1, "sel"), (4, 3, 1, "when3"),
          (1, 4, 1, "min"), (2, 1, 1, "min"), (2, 1, 1, "plain")]
  out = []
  for rank, n_in, n_out, maps in spec:
    tail = "" if maps == "const" else f"_{maps}"
    out.append(Case(f"book_r{rank}_i{n_in}_o{n_out}{tail}", "step_book", _book(rank, n_in, n_out, maps)))
  for rank, maps in ((1, "const"), (1, "min"), (4, "const")):
    tail = "" if maps == "const" else f"_{maps}"
    out.append(Case(f"book_r{rank}_i1_o1{tail}_heavy", "step_book", _book(rank, 1, 1, maps, heavy=True)))
  return out


def _body(whens, add, first=True):
  """A 4096-step 1-D grid, one (8, 128) f32 input and output with constant maps (`book_r1_i1_o1`'s), the
  body: the output zeroed under `pl.when(i == 0)` (`first`), `whens` more `pl.when`s that never hold
  (each guarding a one-vreg add), and, when `add`, the input added into the output unconditionally."""
  def build():
    jax, jnp, pl, _ = _jax()

    def kernel(x_ref, o_ref):
      i = pl.program_id(0)
      if first:
        @pl.when(i == 0)
        def _():
          o_ref[...] = jnp.zeros_like(o_ref)
      for w in range(whens):
        @pl.when(i >= _STEPS + w)
        def _():
          o_ref[...] += x_ref[...]
      if add:
        o_ref[...] += x_ref[...]
      elif not first and not whens:
        o_ref[...] = x_ref[...]

    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(_STEPS,),
                          in_specs=[spec], out_specs=spec)
    return call, (_rand((8, 128), "float32", 150),)
  return build


def step_body_cases() -> list[Case]:
  """Session 34 (`step_body`): `step_ops`' fixed-block steps cost the chip ~4 cycles less than
  `step_book`'s (sops_r1_in1_fixed 33.2 a step, book_r1_i1_o1 37.1) though they do more: what does a
  `pl.when` that never holds cost, and does the body's vector work hide in the step's bookkeeping?
  `body_w{whens}_{add|noadd}[_nofirst]`."""
  return [Case(f"body_w{w}_{'add' if add else 'noadd'}{'' if first else '_nofirst'}", "step_body",
               _body(w, add, first))
          for w, add, first in ((0, True, True), (0, False, True), (1, False, True), (2, False, True),
                                (1, True, True), (0, True, False), (0, False, False), (3, False, True))]
