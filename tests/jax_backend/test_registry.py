"""palace.jax's primitive registry (jax/registry.py): one entry per primitive holds every fact palace
uses about it, so a primitive added with one entry is evaluated, classified by the schedule analysis,
recognised as index arithmetic and fused, with nothing else to edit."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive
from jax._src import core as jax_core

import palace.jax as pj
import palace._src.lang.numpy_ops as pjnp
from palace._src.jax import launch as jax_launch, scalar_blocks as sb
from palace._src.jax.registry import DATA, RULES, Deciding, Never, Operands, rule
from palace._src.jax.rules_state import DMA
from palace._src.jax.schedule import replay_blocker


def test_every_entry_is_well_formed():
  for name, entry in RULES.items():
    assert entry.name == name and callable(entry.evaluate), name
    s = entry.schedule
    assert s is None or s is DATA or type(s) in (Deciding, Never) or callable(s), (name, s)
    assert entry.operands is None or isinstance(entry.operands, Operands), name
    if entry.scalar is not None:   # a fused form restates a pure value computation
      assert s is DATA and entry.pure_index, name


def _kernel_eqns(fn, *args):
  closed = jax.make_jaxpr(fn)(*args)
  (call,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
  return call.params["jaxpr"].eqns


def test_the_dma_operand_decoder_is_the_one_reading_of_a_copy():
  def kernel(x_hbm, o_hbm, sem):
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], o_hbm.at[pl.ds(8, 8)], sem).start()
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], o_hbm.at[pl.ds(8, 8)], sem).wait()
  x = jnp.zeros((16, 128), jnp.float32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     out_specs=pl.BlockSpec(memory_space=pl.ANY),
                     scratch_shapes=[pltpu.SemaphoreType.DMA])
  eqns = _kernel_eqns(f, x)
  start = next(e for e in eqns if e.primitive.name == "dma_start")
  assert RULES["dma_start"].operands is DMA and RULES["dma_wait"].operands is DMA
  groups = DMA.groups(start)
  assert list(groups) == ["src", "dst", "sem", "src_sem", "device_id"]
  assert sum(map(len, groups.values())) == len(start.invars)
  assert groups["src"][0] is start.invars[0] and not groups["src_sem"] and not groups["device_id"]
  decoded = DMA.decode(start)
  assert decoded["device_id"] is None and decoded["src_sem"] is None
  assert decoded["src"].ref is start.invars[0]   # a TransformedRef of the kernel's x_hbm


# ---- a primitive added with one registry entry
twice_p = Primitive("palace_test_twice")
twice_p.def_impl(lambda x: x * 2)
twice_p.def_abstract_eval(lambda x: jax_core.ShapedArray(x.shape, x.dtype))


@pytest.fixture
def twice():
  """`palace_test_twice` (x * 2), registered exactly as a rules file would: one entry."""
  rule("palace_test_twice", schedule=DATA, pure_index=True,
       scalar=sb.same_dtype(sb.INTS, lambda d: (lambda a: sb.arith("*")(d)(a, "2")), arity=1))(
      lambda eqn, x: pjnp.multiply(x, np.asarray(2, x.dtype)))
  yield twice_p.bind
  del RULES["palace_test_twice"]


def test_a_primitive_added_with_one_entry_is_evaluated_replayed_pure_and_fused(twice, monkeypatch):
  x = (np.arange(32 * 128) % 7).reshape(32, 128).astype(np.int32)

  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    j = twice(twice(i))                              # a run of two scalar equations: fused
    o_ref[...] = twice(x_ref[...]) + j
  spec = pl.BlockSpec((8, 128), lambda i: (twice(i) % 4, 0))   # index arithmetic: a pure map
  f = pl.pallas_call(kernel, grid=(4,), in_specs=[spec], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
  eqns = _kernel_eqns(f, x)
  assert [e.primitive.name for start, stop, _ in sb.runs(eqns) for e in eqns[start:stop]] == \
      ["palace_test_twice", "palace_test_twice"]
  closed = jax.make_jaxpr(f)(x)
  (call,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call"]
  assert replay_blocker(call.params["jaxpr"]) is None
  assert all(jax_launch._pure_index_jaxpr(bm.index_map_jaxpr.jaxpr)
             for bm in call.params["grid_mapping"].block_mappings)
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.jit(f)(x))
    jax.block_until_ready(jax.jit(f)(x))
  rows = [x[(2 * i % 4) * 8:(2 * i % 4) * 8 + 8] * 2 + 4 * i for i in range(4)]
  np.testing.assert_array_equal(out, np.concatenate(rows))
  assert tpu.replays.hits == 1


def test_split_is_covered_by_its_one_entry_as_the_slices_it_stands_for():
  # jnp.split in a kernel traces lax.split (JAX 0.12), one entry in rules_lax.py: the same results
  # and modelled time as the kernel written with slices (lax.slice), and still replayed
  x = (np.arange(16 * 384) % 11).reshape(16, 384).astype(np.float32)

  def with_split(x_ref, o_ref):
    a, b = jnp.split(x_ref[...], [128], axis=1)
    top, bottom = jnp.split(b, 2, axis=0)
    o_ref[...] = jnp.concatenate([a[:8] * 2.0, top + bottom[:, :128].sum()], axis=1)

  def with_slices(x_ref, o_ref):
    v = x_ref[...]
    a, b = v[:, :128], v[:, 128:]
    top, bottom = b[:8], b[8:]
    o_ref[...] = jnp.concatenate([a[:8] * 2.0, top + bottom[:, :128].sum()], axis=1)

  outs, cycles = [], []
  for kernel in (with_split, with_slices):
    f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32)))
    with pj.virtual_tpu("v5e") as tpu:
      outs.append(np.asarray(f(x)))
      jax.block_until_ready(f(x))
    cycles.append(tpu.reports[0].device_cycles)
    assert tpu.replays.hits == 1
  ref = np.concatenate([x[:8, :128] * 2.0, x[:8, 128:] + x[8:, 128:256].sum()], axis=1)
  np.testing.assert_array_equal(outs[0], ref)
  np.testing.assert_array_equal(outs[1], ref)
  assert "split" in {e.primitive.name for e in _kernel_eqns(
      pl.pallas_call(with_split, out_shape=jax.ShapeDtypeStruct((8, 384), jnp.float32)), x)}
  assert cycles[0] == cycles[1]


def test_stack_is_covered_by_its_one_entry_as_the_concatenation_it_stands_for():
  # jnp.stack in a kernel is one `stack` primitive in JAX 0.12 (a wall third-party kernels met: "primitive
  # 'stack' is not covered"): the entry gives NumPy's result on vectors and on SMEM scalars
  x = np.arange(2 * 128, dtype=np.float32).reshape(2, 128)
  y = x + 1000

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.stack([x_ref[...], y_ref[...] * 2.0], axis=1)

  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 2, 128), jnp.float32)))
  with pj.virtual_tpu("v5e"):
    out = np.asarray(f(x, y))
  np.testing.assert_array_equal(out, np.stack([x, y * 2.0], axis=1))
  assert "stack" in {e.primitive.name for e in _kernel_eqns(
      pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 2, 128), jnp.float32)), x, y)}

  def scalars(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.stack([a_ref[...], b_ref[...]], axis=0)

  smem = pl.BlockSpec(memory_space=pltpu.SMEM)
  g = jax.jit(pl.pallas_call(scalars, in_specs=[smem, smem], out_shape=jax.ShapeDtypeStruct((2,), jnp.float32)))
  with pj.virtual_tpu("v5e"):
    out = np.asarray(g(np.float32(3.5), np.float32(-1.25)))
  np.testing.assert_array_equal(out, [3.5, -1.25])
