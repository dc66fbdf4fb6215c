"""Ref.bitcast and Ref.reshape of whole refs and of views (JAX's ref transforms, as on a TPU): a bitcast
that changes the element width packs along the second-minor axis (jax/_src/state/utils.py `bitcast`),
which `ref_bitcast` below computes in NumPy; loads, stores, DMAs and chains of transforms through such
views, and reshapes of strided views. The cases mirror JAX's PallasCallRefTransformTest."""
import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from bitcast_reference import ref_bitcast

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_the_reference_packs_rows_not_lanes():
  x = np.array([[0x00010002, 0x00030004]], np.int32)               # (1, 2) int32
  np.testing.assert_array_equal(ref_bitcast(x, np.int16), [[2, 4], [1, 3]])   # low halves first
  np.testing.assert_array_equal(ref_bitcast(ref_bitcast(x, np.int16), np.int32), x)


def _call(kernel, out_shape, *args, any_in=False, any_out=False, **kw):
  specs = {}
  if any_in:
    specs["in_specs"] = [pl.BlockSpec(memory_space=pl.ANY)] * len(args)
  if any_out:
    specs["out_specs"] = pl.BlockSpec(memory_space=pl.ANY)
  return np.asarray(pl.pallas_call(kernel, out_shape=out_shape, **specs, **kw)(*args))


@pytest.mark.parametrize("slice_first", [True, False])
@pytest.mark.parametrize("use_primitive", [False, True])
def test_load_through_a_narrowing_bitcast(slice_first, use_primitive):
  x = np.arange(4 * 8 * 128, dtype=np.int32).reshape(16, 256)

  def kernel(x_ref, y_ref):
    ref = x_ref.at[:8, :128].bitcast(jnp.int16) if slice_first else \
        x_ref.bitcast(jnp.int16).at[:16, :128]
    assert ref.shape == (16, 128) and ref.dtype == jnp.int16
    if use_primitive:
      pltpu.store(y_ref, pltpu.load(ref))
    else:
      y_ref[...] = ref[...]

  y = _call(kernel, pl.ShapeDtypeStruct((16, 128), jnp.int16), x)
  expected = ref_bitcast(x[:8, :128], np.int16) if slice_first else ref_bitcast(x, np.int16)[:16, :128]
  np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("slice_first", [True, False])
@pytest.mark.parametrize("use_primitive", [False, True])
def test_store_through_a_widening_view(slice_first, use_primitive):
  x = np.arange(16 * 128).astype(BF16).reshape(16, 128)

  def kernel(x_ref, y_ref):
    y_ref[...] = jnp.full(y_ref.shape, -1, jnp.int32)
    ref = y_ref.at[:8, :128].bitcast(jnp.bfloat16) if slice_first else \
        y_ref.bitcast(jnp.bfloat16).at[:16, :128]
    if use_primitive:
      pltpu.store(ref, pltpu.load(x_ref))
    else:
      ref[...] = x_ref[...]

  y = _call(kernel, pl.ShapeDtypeStruct((16, 256), jnp.int32), x)
  np.testing.assert_array_equal(y[:8, :128], ref_bitcast(x, np.int32))
  np.testing.assert_array_equal(y[8:], -1)        # nothing else was written
  np.testing.assert_array_equal(y[:, 128:], -1)


def test_a_chain_of_transforms():
  x = np.arange(32 * 256, dtype=np.int32).reshape(32, 256)

  def kernel(x_ref, y_ref):
    ref = (x_ref.at[:16, :256].bitcast(jnp.int16).reshape((2, 16, 256)).bitcast(jnp.float16)
           .at[1:, :, :].reshape((16, 256)).at[:, :128].bitcast(jnp.int32))
    assert ref.shape == (8, 128)
    y_ref[...] = ref[...]

  np.testing.assert_array_equal(_call(kernel, pl.ShapeDtypeStruct((8, 128), jnp.int32), x),
                                x[8:16, :128])


@pytest.mark.parametrize("slice_first", [True, False])
def test_dma_from_a_bitcast_hbm_ref(slice_first):
  x = np.arange(4 * 8 * 128, dtype=np.int32).reshape(16, 1, 256)

  def kernel(x_hbm, y_hbm):
    def body(sem):
      ref = x_hbm.at[:8, :, :128].bitcast(jnp.int16) if slice_first else \
          x_hbm.bitcast(jnp.int16).at[:8, :, :128]
      pltpu.async_copy(ref, y_hbm.at[...], sem).wait()
    pl.run_scoped(body, pltpu.SemaphoreType.DMA)

  y = _call(kernel, pl.ShapeDtypeStruct((8, 2, 128), jnp.int16), x, any_in=True, any_out=True)
  expected = ref_bitcast(x[:8, :, :128], np.int16) if slice_first else \
      ref_bitcast(x, np.int16)[:8, :, :128]
  np.testing.assert_array_equal(y, expected)


def test_dma_both_ways_through_widening_views(rng):
  """bf16 rows viewed as uint32 (each element two rows): copied out and back in, as units."""
  x = rng.standard_normal((16, 128)).astype(BF16)

  def kernel(x_hbm, o_ref, back_hbm):
    def body(buf, sem):
      pltpu.async_copy(x_hbm.bitcast(jnp.uint32).at[pl.ds(2, 4)], buf, sem).wait()
      o_ref[...] = buf[...]
      pltpu.async_copy(buf, back_hbm.bitcast(jnp.uint32).at[pl.ds(0, 4)], sem).wait()
    pl.run_scoped(body, pltpu.VMEM((4, 128), jnp.uint32), pltpu.SemaphoreType.DMA)

  o, back = pl.pallas_call(
      kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
      out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)),
      out_shape=(pl.ShapeDtypeStruct((4, 128), jnp.uint32), pl.ShapeDtypeStruct((8, 128), jnp.bfloat16)))(x)
  np.testing.assert_array_equal(np.asarray(o), ref_bitcast(x, np.uint32)[2:6])
  np.testing.assert_array_equal(np.asarray(back).view(np.uint16), x[4:12].view(np.uint16))


def test_strided_load_of_packed_kv_rows(rng):
  """Ragged paged attention's `strided_load_kv`: a bf16 view bitcast to uint32 (rows 2i, 2i+1 in one
  word), strided rows of it loaded and split into the low (k) and high (v) halves."""
  kv = rng.standard_normal((64, 128)).astype(BF16)     # rows: k0 v0 k1 v1 ... per head pair

  def kernel(kv_ref, k_ref, v_ref):
    view = kv_ref.at[8:40].reshape(32, 128)            # a view of a view, as the kernel's buffers are
    b = view.bitcast(jnp.uint32)[0::2, :]              # every other packed row: (8, 128)
    k_ref[...] = pltpu.bitcast(b << 16, jnp.float32).astype(jnp.bfloat16)
    v_ref[...] = pltpu.bitcast(b & jnp.uint32(0xFFFF0000), jnp.float32).astype(jnp.bfloat16)

  k, v = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct((8, 128), jnp.bfloat16),) * 2)(kv)
  np.testing.assert_array_equal(np.asarray(k), kv[8:40][0::4])
  np.testing.assert_array_equal(np.asarray(v), kv[8:40][1::4])


def test_reshape_of_a_strided_view(rng):
  x = rng.standard_normal((8, 256)).astype(np.float32)

  def kernel(x_ref, y_ref):
    view = x_ref.at[:, pl.ds(0, 128, stride=2)]        # (8, 128), not contiguous
    y_ref[...] = view.reshape(2, 4, 128)[1]             # JAX reshapes the view's value

  y = _call(kernel, pl.ShapeDtypeStruct((4, 128), jnp.float32), x)
  np.testing.assert_array_equal(y, x[:, 0::2].reshape(2, 4, 128)[1])


def test_writes_through_a_reshaped_strided_view_reach_the_buffer(rng):
  x = rng.standard_normal((8, 256)).astype(np.float32)

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref[...]
    y_ref.at[:, pl.ds(1, 128, stride=2)].reshape(1024)[pl.ds(128, 128)] = jnp.full((128,), 7.0)

  expected = x.copy()
  expected[1, 1::2] = 7.0   # elements 128..255 of the flattened odd columns: their second row
  np.testing.assert_array_equal(_call(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x), expected)


def test_same_width_bitcast_of_a_view_and_reshape_with_minus_one(rng):
  x = rng.standard_normal((16, 128)).astype(np.float32)

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref.at[4:12].bitcast(jnp.int32).reshape(-1, 256)[...]

  np.testing.assert_array_equal(_call(kernel, pl.ShapeDtypeStruct((4, 256), jnp.int32), x),
                                x[4:12].view(np.int32).reshape(4, 256))


def test_bitcast_views_time_without_data():
  x = np.zeros((16, 256), np.int32)

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref.at[:8, :128].bitcast(jnp.int16)[...]

  with pl.virtual_tpu("v5e", timing_only=True) as tpu:
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), jnp.int16))(x)
  assert tpu.reports[-1].device_cycles > 0


def test_bitcast_views_under_disabled_bounds_checks():
  x = np.arange(16 * 256, dtype=np.int32).reshape(16, 256)

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref.bitcast(jnp.int16).at[:16, :128][...]

  y = _call(kernel, pl.ShapeDtypeStruct((16, 128), jnp.int16), x,
            compiler_params=pltpu.CompilerParams(disable_bounds_checks=True))
  np.testing.assert_array_equal(y, ref_bitcast(x, np.int16)[:16, :128])


def test_bitcast_errors_name_the_view():
  def run(body, shape=(16, 128), dtype=np.int32):
    def kernel(x_ref, y_ref):
      body(x_ref)
      y_ref[...] = x_ref[...]
    _call(kernel, pl.ShapeDtypeStruct(shape, dtype), np.zeros(shape, dtype))

  with pytest.raises(pl.UnsupportedError, match=r"1-D ref .*shape \(128,\).*Fix: reshape"):
    run(lambda r: r.at[0].bitcast(jnp.int16))
  with pytest.raises(pl.ShapeError, match=r"args\[0\].*\[0:3, 0:128\] to int32.*second-minor .*3 rows "
                                          r"of int16.*multiple of 2"):
    run(lambda r: r.at[:3].bitcast(jnp.int32), dtype=np.int16)
  with pytest.raises(pl.OutOfBoundsError, match=r"args\[0\] block\.bitcast\(int16\)\[32:40\] \(axis 0 of "
                                               r"args\[0\] block\.bitcast\(int16\), shape \(32, 128\)"):
    run(lambda r: r.bitcast(jnp.int16)[32:40])
  with pytest.raises(pl.ShapeError, match=r"cannot reshape shape \(8, 128\).*to \(3, 128\)"):
    run(lambda r: r.at[:, pl.ds(0, 128)].at[:8].reshape(3, 128))


def test_value_bitcast_dims_follow_jax(rng):
  """pltpu.bitcast of values: dim -2 (default) packs rows, dim -1 lanes; other dims and a 1-D array
  along dim -2 are refused, as JAX 0.12 refuses them (pallas/mosaic/primitives.py `bitcast`)."""
  x = rng.integers(-2**15, 2**15, (4, 8, 128)).astype(np.int16)

  def kernel(x_ref, rows_ref, lanes_ref):
    rows_ref[...] = pltpu.bitcast(x_ref[...], jnp.int32)
    lanes_ref[...] = pltpu.bitcast(x_ref[...], jnp.int32, dim=-1)

  rows, lanes = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct((4, 4, 128), jnp.int32),
                                                  pl.ShapeDtypeStruct((4, 8, 64), jnp.int32)))(x)
  np.testing.assert_array_equal(rows, ref_bitcast(x, np.int32))
  np.testing.assert_array_equal(lanes, x.view(np.int32))

  def bad(body, shape):
    def kernel(x_ref, o_ref):
      body(x_ref[...])
      o_ref[...] = x_ref[...]
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(shape, jnp.int16))(np.zeros(shape, np.int16))

  with pytest.raises(pl.ShapeError, match=r"shape \(4, 8, 128\) along dim 0.*Fix: pass dim=-1 or dim=-2"):
    bad(lambda v: pltpu.bitcast(v, jnp.int32, dim=0), (4, 8, 128))
  with pytest.raises(pl.ShapeError, match=r"shape \(128,\) along dim -2.*a 1-D array lacks"):
    bad(lambda v: pltpu.bitcast(v, jnp.int32), (128,))


def test_value_bitcast_to_and_from_int4_packs_nibbles(rng):
  """int32 -> int4 along rows: row 8i + k is nibble k (k = 0: the lowest bits) of row i, sign-extended;
  and back. (Before session 37 palace counted int4 as a byte: 4 rows, not 8, silently.)"""
  x = rng.integers(-2**31, 2**31 - 1, (2, 128), dtype=np.int64).astype(np.int32)
  nibbles = (x.view(np.uint32)[:, None, :] >> (4 * np.arange(8, dtype=np.uint32))[None, :, None]) & 0xF
  expected = ((nibbles.astype(np.int8) ^ 8) - 8).reshape(16, 128)

  def kernel(x_ref, o_ref, back_ref):
    v = pltpu.bitcast(x_ref[...], jnp.int4)
    o_ref[...] = v.astype(jnp.int8)
    back_ref[...] = pltpu.bitcast(v, jnp.int32)

  o, back = pl.pallas_call(kernel, out_shape=(pl.ShapeDtypeStruct((16, 128), jnp.int8),
                                              pl.ShapeDtypeStruct((2, 128), jnp.int32)))(x)
  np.testing.assert_array_equal(o, expected)
  np.testing.assert_array_equal(back, x)


def _nibbles_by_rows(x: np.ndarray) -> np.ndarray:
  """int32 (r, c) as int4 (8r, c): row 8i + k holds nibble k (the lowest first) of row i, sign-extended."""
  u = x.view(np.uint32)
  rows = [((u >> np.uint32(4 * k)) & np.uint32(0xF)).astype(np.int8) for k in range(8)]
  out = np.stack(rows, axis=1).reshape(8 * x.shape[0], x.shape[1])
  return ((out ^ 8) - 8).astype(np.int8)


def test_a_4_bit_ref_bitcast_view_loads_and_stores_whole():
  rng = np.random.default_rng(0)
  x = rng.integers(-2 ** 31, 2 ** 31, (2, 256), dtype=np.int64).astype(np.int32)

  def load(x_ref, o_ref):
    o_ref[...] = x_ref.bitcast(jnp.int4)[...].astype(jnp.int8)
  got = _call(load, pl.ShapeDtypeStruct((16, 256), jnp.int8), x)
  np.testing.assert_array_equal(got, _nibbles_by_rows(x))

  def store(n_ref, o_ref):
    o_ref.bitcast(jnp.int4)[...] = n_ref[...].astype(jnp.int4)
  back = _call(store, pl.ShapeDtypeStruct(x.shape, jnp.int32), _nibbles_by_rows(x))
  np.testing.assert_array_equal(back, x)


def test_a_window_of_a_4_bit_ref_bitcast_view_is_refused():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref.bitcast(jnp.int4)[0:8].astype(jnp.int32)
  with pytest.raises(pl.UnsupportedError, match=r"A windowed load of .*bitcast\(int4\).*whole 4-bit"):
    _call(kernel, pl.ShapeDtypeStruct((8, 128), jnp.int32), np.zeros((2, 128), np.int32))

  def dma(x_ref, o_ref):
    pltpu.sync_copy(x_ref.bitcast(jnp.int4), o_ref)
  with pytest.raises(pl.UnsupportedError, match=r"A DMA \(pltpu.sync_copy src_ref\) of .*bitcast\(int4\)"):
    _call(dma, pl.ShapeDtypeStruct((16, 128), jnp.int4), np.zeros((2, 128), np.int32))
