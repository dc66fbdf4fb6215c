"""pltpu.load/store with masks, roll, bitcast, jnp.tile and the PRNG, against NumPy."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

MESH = pltpu.TensorCoreMesh("core", num_cores=1)


def vmem_kernel(body, x, out_shape, out_dtype=None):
  """Run `body(x_vmem, o_vmem)` in a pl.kernel, with x and the output staged through VMEM."""
  out_dtype = out_dtype or x.dtype

  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.VMEM(out_shape, out_dtype),
                     scratch_types=[pltpu.VMEM(x.shape, x.dtype)])
  def k(x_hbm, o_ref, xv):
    pltpu.sync_copy(x_hbm, xv)
    body(xv, o_ref)

  return k(x)


def test_masked_load_and_store(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  def body(x_ref, o_ref):
    rows = lax.broadcasted_iota(jnp.int32, (8, 128), 0)
    cols = lax.broadcasted_iota(jnp.int32, (8, 128), 1)
    o_ref[...] = jnp.full((8, 128), -1.0, jnp.float32)
    v = pltpu.load(x_ref, mask=rows < 4)                  # masked-off lanes read 0
    pltpu.store(o_ref, v + 1, mask=cols >= 64)            # masked-off lanes keep -1
    pltpu.store(o_ref.at[7], pltpu.load(x_ref.at[7]))     # unmasked forms on views

  out = vmem_kernel(body, x, (8, 128))
  ref = np.full((8, 128), -1.0, np.float32)
  v = np.where(np.arange(8)[:, None] < 4, x, 0) + 1
  ref[:, 64:] = v[:, 64:]
  ref[7] = x[7]
  np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shift,axis", [(0, 0), (3, 0), (1, 1), (127, 1), (200, 1)])
def test_roll_matches_numpy(rng, shift, axis):
  x = rng.standard_normal((8, 128)).astype(np.float32)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., pltpu.roll(x_ref[...], shift, axis)),
                    x, (8, 128))
  np.testing.assert_array_equal(out, np.roll(x, shift, axis))


def test_roll_dynamic_shift_from_smem(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)

  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.VMEM((8, 128), jnp.float32),
                     scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SMEM((1,), jnp.int32)])
  def k(s_hbm, x_hbm, o_ref, xv, s):
    pltpu.sync_copy(s_hbm, s)
    pltpu.sync_copy(x_hbm, xv)
    o_ref[...] = pltpu.roll(xv[...], s[0], 1)

  np.testing.assert_array_equal(k(np.array([37], np.int32), x), np.roll(x, 37, 1))


def test_roll_with_stride(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(
      ..., pltpu.roll(x_ref[...], 2, 1, stride=3, stride_axis=0)), x, (8, 128))
  ref = np.stack([np.roll(x[i], 2 + 3 * i) for i in range(8)])
  np.testing.assert_array_equal(out, ref)


def test_bitcast_last_dim_matches_view(rng):
  x = rng.standard_normal((8, 128)).astype(np.float32)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., pltpu.bitcast(x_ref[...], jnp.int32, dim=-1)),
                    x, (8, 128), np.int32)
  np.testing.assert_array_equal(out, x.view(np.int32))
  x16 = rng.standard_normal((8, 256)).astype(jnp.bfloat16)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., pltpu.bitcast(x_ref[...], jnp.int32, dim=-1)),
                    x16, (8, 128), np.int32)
  np.testing.assert_array_equal(out, x16.view(np.int32))


def test_bitcast_default_packs_rows(rng):
  """dim=-2: a (16, 128) bf16 array becomes (8, 128) int32; row pairs (2i, 2i+1) share a word."""
  x = rng.standard_normal((16, 128)).astype(jnp.bfloat16)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., pltpu.bitcast(x_ref[...], jnp.int32)),
                    x, (8, 128), np.int32)
  ref = np.ascontiguousarray(np.moveaxis(x, 0, -1)).view(np.int32)   # (128, 8)
  np.testing.assert_array_equal(out, ref.T)
  back = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., pltpu.bitcast(x_ref[...], jnp.bfloat16)),
                     out, (16, 128), jnp.bfloat16)
  np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))


def test_bitcast_bad_size_is_an_error(rng):
  x = np.zeros((3, 128), jnp.bfloat16)
  with pytest.raises(pl.ShapeError, match=r"bitcast bfloat16->int32: dimension -2 of size 3"):
    vmem_kernel(lambda x_ref, o_ref: pltpu.bitcast(x_ref[...], jnp.int32), x, (8, 128), np.int32)


def _smem_scalar_bitcast(x, dtype):
  @functools.partial(pl.pallas_call, out_shape=pl.ShapeDtypeStruct((1,), np.dtype(dtype)),
                     in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
                     out_specs=pl.BlockSpec(memory_space=pltpu.SMEM))
  def k(x_ref, o_ref):
    o_ref[0] = pltpu.bitcast(x_ref[0], dtype)
  with pl.virtual_tpu("v5e"):
    return k(x)


def test_bitcast_of_a_scalar_keeps_its_bits():
  """A 0-d value (an SMEM scalar) bitcast to a dtype of its width: the same bits (this divided by a
  zero rank before)."""
  x = np.array([-2.5], np.float32)
  np.testing.assert_array_equal(_smem_scalar_bitcast(x, jnp.int32), x.view(np.int32))


def test_bitcast_of_a_scalar_to_another_width_is_an_error():
  with pytest.raises(pl.ShapeError, match=r"bitcast float32->bfloat16 of a scalar.*Fix: bitcast to a "
                                          r"dtype of the same width \(4 bytes\)"):
    _smem_scalar_bitcast(np.array([1.0], np.float32), jnp.bfloat16)


@pytest.mark.parametrize("reps", [(2, 1), (1, 2), (2, 2), 2])
def test_tile(rng, reps):
  x = rng.standard_normal((8, 128)).astype(np.float32)
  want = np.tile(x, reps)
  out = vmem_kernel(lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.tile(x_ref[...], reps)), x, want.shape)
  np.testing.assert_array_equal(out, want)


def _prng_bits(seeds, shape=(8, 128), draws=1):
  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.VMEM((draws,) + shape, jnp.int32))
  def k(o_ref):
    pltpu.prng_seed(*seeds)
    for i in range(draws):
      o_ref[i] = pltpu.prng_random_bits(shape)
  return k()


def test_prng_is_deterministic_nonzero_and_seed_dependent():
  a = _prng_bits((0,), draws=2)
  b = _prng_bits((0,), draws=2)
  c = _prng_bits((1,), draws=2)
  d = _prng_bits((0, 1), draws=1)
  assert a.dtype == np.int32 and a.tobytes() == b.tobytes()
  assert np.count_nonzero(a) > 0.99 * a.size
  assert not np.array_equal(a, c) and not np.array_equal(a[0], d[0])
  assert not np.array_equal(a[0], a[1])                 # successive draws differ
  assert len(np.unique(a)) > 0.99 * a.size              # no repeats to speak of
  bits = np.unpackbits(a.view(np.uint8))
  assert abs(bits.mean() - 0.5) < 0.01                  # balanced bits


def test_prng_seed_from_program_id():
  @functools.partial(pl.pallas_call, out_shape=pl.ShapeDtypeStruct((16, 128), jnp.int32), grid=(2,),
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  def k(o_ref):
    pltpu.prng_seed(1234, pl.program_id(0))
    o_ref[...] = pltpu.prng_random_bits((8, 128))

  out = k()
  np.testing.assert_array_equal(out[:8], _prng_bits((1234, 0))[0])
  assert not np.array_equal(out[:8], out[8:])


def test_prng_without_seed_is_an_error():
  @functools.partial(pl.kernel, mesh=MESH, out_type=pltpu.VMEM((8, 128), jnp.int32))
  def k(o_ref):
    o_ref[...] = pltpu.prng_random_bits((8, 128))

  with pytest.raises(pl.UsageError, match=r"prng_random_bits\(\) before pltpu.prng_seed\(\)"):
    k()
