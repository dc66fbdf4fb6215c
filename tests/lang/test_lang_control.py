"""lax control flow and ops, and the pl grid/control primitives, inside kernels."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from lang_helpers import apply


def test_program_id_num_programs_when():
  def kernel(o_ref):
    i, j = pl.program_id(0), pl.program_id(1)
    assert pl.num_programs(0) == 3 and pl.num_programs(1) == 2
    o_ref[...] = jnp.full(o_ref.shape, 10.0) * i + j.astype(jnp.float32)

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
      o_ref[0, 0] = -1.0

    @pl.when(jnp.logical_and(i == 0, j == 0))
    def _():
      o_ref[1, 1] = -2.0

    @pl.when(True)
    def _():
      o_ref[2, 2] = -3.0

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((24, 256), jnp.float32), grid=(3, 2),
                       out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)))()
  ref = np.zeros((24, 256), np.float32)
  for i in range(3):
    for j in range(2):
      blk = ref[8 * i:8 * i + 8, 128 * j:128 * j + 128]
      blk[...] = 10.0 * i + j
      if j == 1:
        blk[0, 0] = -1
      if i == 0 and j == 0:
        blk[1, 1] = -2
      blk[2, 2] = -3
  np.testing.assert_array_equal(out, ref)


def test_fori_loop_carry_and_ref_updates(rng):
  x = rng.standard_normal((16, 128)).astype(np.float32)

  def kernel(x_ref, o_ref):
    def body(i, acc):
      o_ref[pl.ds(i, 1)] = x_ref[pl.ds(i, 1)] * i.astype(jnp.float32)
      return acc + x_ref[pl.ds(i, 1)]

    total = lax.fori_loop(0, 16, body, jnp.zeros((1, 128), jnp.float32))
    o_ref[0:1] = total
    n = lax.fori_loop(2, 5, lambda i, c: c + i, 0)
    o_ref[1, 0] = n.astype(jnp.float32)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  ref = x * np.arange(16, dtype=np.float32)[:, None]
  ref[0] = x.sum(0)
  ref[1, 0] = 2 + 3 + 4
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_fori_loop_with_dynamic_bounds_from_smem():
  def kernel(n_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    s = lax.fori_loop(0, n_ref[0], lambda i, c: c + (i + 1), jnp.int32(0))
    o_ref[0, 0] = s

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32),
                       grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,)))(
                           np.array([10], np.int32))
  assert out[0, 0] == 55 and out[0, 1] == 0


def test_pl_loop_decorator_with_and_without_carry():
  def kernel(o_ref):
    @pl.loop(0, 8)
    def _(i):
      o_ref[pl.ds(i, 1)] = jnp.full((1, 128), i, jnp.int32)

    @pl.loop(0, 8, step=2, init_carry=jnp.int32(0))
    def total(i, c):
      return c + i

    o_ref[0, 0] = total

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32))()
  ref = np.repeat(np.arange(8, dtype=np.int32)[:, None], 128, 1)
  ref[0, 0] = 0 + 2 + 4 + 6
  np.testing.assert_array_equal(out, ref)


def test_while_loop_and_cond():
  def kernel(o_ref):
    def cond_fun(c):
      i, v = c
      return v < 1000

    i, v = lax.while_loop(cond_fun, lambda c: (c[0] + 1, c[1] * 3), (jnp.int32(0), jnp.int32(1)))
    r = lax.cond(i > 5, lambda a: a * 2, lambda a: a - 1, v)
    s = lax.cond(i < 5, lambda: jnp.int32(100), lambda: jnp.int32(200))
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.int32)
    o_ref[0, 0] = i
    o_ref[0, 1] = v
    o_ref[0, 2] = r
    o_ref[0, 3] = s

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32))()
  # 3^7 = 2187 is the first power >= 1000; i = 7 > 5 -> 2 * 2187
  np.testing.assert_array_equal(out[0, :4], [7, 2187, 4374, 200])


def test_integer_division_edge_cases_follow_xla():
  """x / 0, x % 0 and INT_MIN / -1 as XLA defines them; the expected rows are what JAX 0.12 gives
  (lax.div, lax.rem, jnp's // and %). palace used a divisor of 1 for 0 (7 / 0 was 7) and a float
  quotient whose cast of 2**31 depends on the machine."""
  lo = np.iinfo(np.int32).min
  a = np.tile(np.array([7, -7, 0, lo, lo, 5, -5, 7, -7], np.int32), (8, 15))[:, :128]
  b = np.tile(np.array([0, 0, 0, -1, 0, -1, 3, -2, 2], np.int32), (8, 15))[:, :128]
  expected = {
      "div": [-1, -1, -1, lo, -1, -5, -1, -3, -3],
      "rem": [7, -7, 0, 0, lo, 0, -2, 1, -1],
      "floordiv": [-2, -2, -1, lo, -2, -5, -2, -4, -4],
      "mod": [0, 0, 0, 0, 0, 0, 1, -1, 1],
  }
  ops = {"div": lax.div, "rem": lax.rem, "floordiv": lambda u, v: u // v, "mod": lambda u, v: u % v}
  for name, op in ops.items():
    out, _ = apply(op, a, b)
    np.testing.assert_array_equal(out[0, :9], np.array(expected[name], np.int32), err_msg=name)
  u = np.tile(np.array([7, 0, 5], np.uint32), (8, 43))[:, :128]
  v = np.tile(np.array([0, 0, 2], np.uint32), (8, 43))[:, :128]
  out, _ = apply(lax.div, u, v)
  np.testing.assert_array_equal(out[0, :3], np.array([2**32 - 1, 2**32 - 1, 2], np.uint32))
  out, _ = apply(lax.rem, u, v)
  np.testing.assert_array_equal(out[0, :3], np.array([7, 0, 1], np.uint32))


def test_sign_keeps_the_sign_of_zero():
  x = np.tile(np.array([-0.0, 0.0, -2.5, 3.0], np.float32), (8, 32))
  out, _ = apply(jnp.sign, x)
  np.testing.assert_array_equal(np.signbit(out[0, :4]), [True, False, True, False])
  np.testing.assert_array_equal(out[0, :4], [0.0, 0.0, -1.0, 1.0])


def test_lax_elementwise_ops():
  a = (np.arange(16 * 128, dtype=np.int32).reshape(16, 128) - 1000)
  b = np.where(np.arange(128) % 7 == 0, -3, 5).astype(np.int32) * np.ones((16, 1), np.int32)

  def fn(u, v):
    return lax.rem(u, v) * 10000 + lax.div(u, v)

  out, _ = apply(fn, a, b)
  ref = np.fmod(a, b) * 10000 + np.trunc(a / b).astype(np.int32)   # C semantics, like lax
  np.testing.assert_array_equal(out, ref)
  x = np.linspace(-5, 5, 16 * 128, dtype=np.float32).reshape(16, 128)
  out, _ = apply(lambda u: lax.rem(u, 1.5) + lax.div(u, 2.0), x)
  np.testing.assert_allclose(out, np.fmod(x, np.float32(1.5)) + x / 2, rtol=1e-6, atol=1e-6)
  out, _ = apply(lambda u: lax.select(u > 0, u, jnp.zeros_like(u)) + lax.max(u, 1.0), x)
  np.testing.assert_array_equal(out, np.where(x > 0, x, 0) + np.maximum(x, 1))


def test_multiple_of_cdiv_and_ds_helpers():
  assert pl.cdiv(10, 4) == 3 and pl.cdiv(8, 4) == 2
  assert pl.multiple_of(16, 8) == 16
  s = pl.ds(3, 5)
  assert (s.start, s.size, s.stride) == (3, 5, 1)
  assert pl.Slice(1, 2, 2) == pl.ds(1, 2, 2)


def test_debug_print_reaches_the_virtual_tpu(capsys):
  def kernel(x_ref, o_ref):
    pl.debug_print("step {} x00={}", pl.program_id(0), x_ref[0, 0])
    o_ref[...] = x_ref[...]

  x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                   in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  assert tpu.debug_output == ["step 0 x00=0.0", "step 1 x00=1024.0"]
  assert "step 1 x00=1024.0" in capsys.readouterr().out


def test_switch_and_axis_helpers_outside_mesh_raise():
  def kernel(o_ref):
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.int32)
    o_ref[0, 0] = lax.switch(pl.program_id(0), [lambda: jnp.int32(7), lambda: jnp.int32(9)])

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), jnp.int32), grid=(2,),
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))()
  assert out[0, 0] == 7 and out[8, 0] == 9
  with pytest.raises(pl.UsageError, match=r"lax.axis_index\('x'\): unknown axis 'x'"):
    pl.pallas_call(lambda o: lax.axis_index("x"), out_shape=pl.ShapeDtypeStruct((8, 128), jnp.int32))()


def test_dynamic_slice_and_update_slice_on_values(rng):
  x = rng.standard_normal((16, 256)).astype(np.float32)
  starts = np.array([3, 128, 14], np.int32)

  def kernel(s_ref, x_ref, o_ref):
    v = x_ref[...]
    piece = lax.dynamic_slice(v, (s_ref[0], s_ref[1]), (4, 128))
    clamped = lax.dynamic_slice(v, (s_ref[2], 0), (4, 128))        # start 14 clamps to 12, like XLA
    o_ref[...] = lax.dynamic_update_slice(jnp.zeros_like(v), piece + clamped, (s_ref[0], 0))

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                       grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,)))(starts, x)
  ref = np.zeros_like(x)
  ref[3:7, :128] = x[3:7, 128:] + x[12:16, :128]
  np.testing.assert_array_equal(out, ref)
