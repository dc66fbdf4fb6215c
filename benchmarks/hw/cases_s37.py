"""Session 37's holdout (predicted before they were measured): kernels that test the three rules that
session adopted on shapes they were not fitted on.
- `reduce_chain`: a reduction accumulates its operand's vregs one after another into each output tile
  (fitted on a column sum of 256 exp vregs and a row sum of 16 vregs): row sums of 64 / 256 / 1024 rows,
  leading-axis sums, lane reductions of wide rows (few and many row tiles), two independent row sums.
- `store_stream`: a block's store streams behind its value (fitted on tanh steps of 16 / 64 vregs): exp,
  tanh and division streams stored on 32-256 vregs.
- `dot_ilp`: small dots share the MXUs and keep their weights latched within a basic block (fitted on
  chains of (8, 128) x (128, 128) dots on one weight matrix): chains on two weight matrices, four chains
  unrolled, (32, 128) left operands (two vmatmuls).
Same conventions as cases.py (the public Pallas API JAX 0.10.2 and 0.12 share; nothing imports palace).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _jax, _rand
from benchmarks.hw.cases_fence import fixed_grid

_LANES = 128


def _reduce(form, rows, width=_LANES, n=256):
  """A grid of `n` fixed-block steps, one reduction of an f32 (rows, width) block a step accumulated into
  scratch: 'rows' a sum over the rows (keepdims) into (8, 128), 'lead' a sum over the leading axis of
  its (rows / 8, 8, 128) view, 'lanes' a lane max (keepdims) into (rows, 1), 'lanesum' a lane sum, 'two'
  two independent row sums of two blocks."""
  def build():
    jax, jnp, pl, pltpu = _jax()
    k = 2 if form == "two" else 1

    def body(ins, o_ref, scratch):
      s_ref, r_ref = scratch
      x = ins[0][...]
      if form == "rows":
        s_ref[0:1, :] += jnp.sum(x, axis=0, keepdims=True)
      elif form == "two":
        s_ref[0:1, :] += jnp.sum(x, axis=0, keepdims=True) + jnp.sum(ins[1][...], axis=0, keepdims=True)
      elif form == "lead":
        s_ref[...] += x.reshape(rows // 8, 8, width).sum(axis=0)
      elif form == "lanes":
        r_ref[...] += jnp.max(x, axis=-1, keepdims=True)
      elif form == "lanesum":
        r_ref[...] += jnp.sum(x, axis=-1, keepdims=True)
      else:
        raise ValueError(form)

    def finish(o_ref, scratch):
      s_ref, r_ref = scratch
      o_ref[...] = s_ref[...] + r_ref[0:8, :]

    call = fixed_grid(jax, jnp, pl, n, [(rows, width)] * k, (8, _LANES),
                      [pltpu.VMEM((8, _LANES), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32)],
                      body, finish)
    return call, tuple(_rand((rows, width), "float32", 1 + i) for i in range(k))
  return build


def _stream(op, rows, n=256):
  """A grid of `n` fixed-block steps, one op over an f32 (rows, 128) block a step stored to scratch."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def body(ins, o_ref, scratch):
      x = ins[0][...]
      if op == "exp":
        v = jnp.exp(x * 1e-3)
      elif op == "tanh_add":
        v = jnp.tanh(x) + x
      elif op == "div":
        v = x / (x * x + 2.0)
      else:
        raise ValueError(op)
      scratch[0][...] = v

    def finish(o_ref, scratch):
      o_ref[...] = scratch[0][...]

    call = fixed_grid(jax, jnp, pl, n, [(rows, _LANES)], (rows, _LANES),
                      [pltpu.VMEM((rows, _LANES), jnp.float32)], body, finish)
    return call, (_rand((rows, _LANES), "float32", 1),)
  return build


def _dots(chains, weights, unroll, rows=8, n=256):
  """`n` iterations of `chains` independent chains of (rows, 128) x (128, 128) bf16 dots in a
  `fori_loop` unrolled by `unroll`; chain c multiplies by weight matrix c % `weights`."""
  def build():
    jax, jnp, pl, pltpu = _jax()

    def kernel(x_ref, w_ref, o_ref):
      ws = [w_ref[i] for i in range(weights)]
      x0 = x_ref[...]
      init = tuple(x0 + float(c) for c in range(chains))

      def step(i, xs):
        return tuple(jnp.dot(x.astype(jnp.bfloat16), ws[c % weights], preferred_element_type=jnp.float32)
                     for c, x in enumerate(xs))

      out = jax.lax.fori_loop(0, n, step, init, unroll=unroll)
      acc = out[0]
      for y in out[1:]:
        acc = acc + y
      o_ref[...] = acc

    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, _LANES), jnp.float32))
    return call, (_rand((rows, _LANES), "float32", 1) * 0.01,
                  _rand((weights, _LANES, _LANES), "bfloat16", 2) * 0.05)
  return build


def s37_cases() -> list[Case]:
  out = []
  for rows in (64, 256, 1024):
    out.append(Case(f"s37_rchain_rows_r{rows}", "reduce_chain", _reduce("rows", rows)))
  for rows in (256, 1024):
    out.append(Case(f"s37_rchain_lead_r{rows}", "reduce_chain", _reduce("lead", rows)))
  for width in (512, 2048):
    out.append(Case(f"s37_rchain_lanes_w{width}_r8", "reduce_chain", _reduce("lanes", 8, width)))
  out.append(Case("s37_rchain_lanesum_w1024_r64", "reduce_chain", _reduce("lanesum", 64, 1024)))
  out.append(Case("s37_rchain_two_r256", "reduce_chain", _reduce("two", 256)))
  for op, rows in (("exp", 256), ("exp", 1024), ("tanh_add", 512), ("div", 512)):
    out.append(Case(f"s37_sstream_{op}_r{rows}", "store_stream", _stream(op, rows)))
  for chains, weights, unroll in ((2, 1, 8), (2, 2, 8), (2, 2, 1), (4, 1, 8)):
    out.append(Case(f"s37_dilp_c{chains}_w{weights}_u{unroll}", "dot_ilp", _dots(chains, weights, unroll)))
  for chains, unroll in ((1, 8), (2, 1)):
    out.append(Case(f"s37_dilp_m32_c{chains}_u{unroll}", "dot_ilp", _dots(chains, 1, unroll, rows=32)))
  return out
