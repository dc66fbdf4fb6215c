"""Refs inside kernels: indexing, pl.ds (static and dynamic), chained .at views, metadata, stores."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


@pytest.fixture
def x(rng):
  return rng.standard_normal((16, 256)).astype(np.float32)


def _whole(kernel, out_shape, *args, **kw):
  return pl.pallas_call(kernel, out_shape=out_shape, **kw)(*args)


def test_full_int_and_slice_indexing(x):
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[0] = x_ref[1]                       # ref[i] drops the dim
    o_ref[1:3] = x_ref[2:4] * 2               # slices
    o_ref[3, 5:133] = x_ref[4, :128]          # mixed
    o_ref[4, :] = x_ref[5, ...]
    o_ref[5:7, 128:] = x_ref[...][8:10, :128]  # static value slicing
    o_ref[7, 7] = x_ref[0, 0]                 # scalar load/store in VMEM
    o_ref[8::2] = x_ref[8::2] + 1.0           # strided slice

  ref = np.zeros_like(x)
  ref[0] = x[1]
  ref[1:3] = x[2:4] * 2
  ref[3, 5:133] = x[4, :128]
  ref[4] = x[5]
  ref[5:7, 128:] = x[8:10, :128]
  ref[7, 7] = x[0, 0]
  ref[8::2] = x[8::2] + 1
  np.testing.assert_array_equal(_whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x), ref)


def test_ds_static_and_dynamic_starts(x):
  starts = np.array([3, 9, 1], np.int32)

  def kernel(s_ref, x_ref, o_ref):
    o_ref[pl.ds(0, 4)] = x_ref[pl.ds(4, 4)]                      # static
    o_ref[pl.ds(4, 2)] = x_ref[pl.ds(s_ref[0], 2)]               # dynamic start read from SMEM
    o_ref[pl.ds(s_ref[1], 3)] = x_ref[pl.ds(s_ref[2], 3)]        # dynamic store and load
    o_ref[12:16, pl.ds(s_ref[0] * 32, 128)] = x_ref[pl.ds(0, 4), pl.ds(128, 128)]
    o_ref[pl.Slice(6, 2)] = x_ref[pl.Slice(0, 2, 2)]            # pl.Slice with a stride
    o_ref[pl.ds(8, 1)] = x_ref[pl.dslice(15, 1)]

  ref = np.full_like(x, np.nan)
  ref[0:4] = x[4:8]
  ref[4:6] = x[3:5]
  ref[9:12] = x[1:4]
  ref[12:16, 96:224] = x[0:4, 128:256]
  ref[6:8] = x[0:4:2]
  ref[8] = x[15]
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                       grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,)))(starts, x)
  np.testing.assert_array_equal(out, ref)


def test_ds_with_program_id_start(x):
  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[pl.ds(i * 8, 8)] = x_ref[pl.ds(pl.multiple_of(i * 8, 8), 8)] * 3

  out = _whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x, grid=(2,),
               out_specs=pl.BlockSpec(x.shape, lambda i: (0, 0)))
  np.testing.assert_array_equal(out, x * 3)


def test_chained_at_views_and_metadata(x):
  seen = {}

  def kernel(x_ref, o_ref, s_ref):
    v = o_ref.at[8:16].at[2:4, pl.ds(128, 128)]
    seen["v"] = (v.shape, v.dtype, v.memory_space)
    seen["x"] = (x_ref.shape, x_ref.dtype, x_ref.memory_space, x_ref.ndim)
    seen["s"] = (s_ref.shape, s_ref.dtype, s_ref.memory_space)
    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
    v[...] = x_ref.at[1:5][0:2, :128]
    row = o_ref.at[0]
    seen["row"] = row.shape
    row[pl.ds(0, 128)] = x_ref.at[3].at[pl.ds(128, 128)][...]
    o_ref.at[4:8].at[1][...] = x_ref[15]

  out = _whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x,
               scratch_shapes=[pltpu.SMEM((4,), jnp.int32)])
  assert seen["v"] == ((2, 128), np.float32, pltpu.VMEM)
  assert seen["x"] == ((16, 256), np.float32, pltpu.VMEM, 2)
  assert seen["s"] == ((4,), np.int32, pltpu.SMEM)
  assert seen["row"] == (256,)
  ref = np.zeros_like(x)
  ref[10:12, 128:] = x[1:3, :128]
  ref[0, :128] = x[3, 128:]
  ref[5] = x[15]
  np.testing.assert_array_equal(out, ref)


def test_augmented_assignment(x):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    o_ref[...] += 1.0
    o_ref[0:8] *= 2.0
    o_ref[3] -= x_ref[3]
    o_ref.at[8:16][pl.ds(0, 2)] += x_ref[0:2]

  ref = x + 1
  ref[0:8] *= 2
  ref[3] -= x[3]
  ref[8:10] += x[0:2]
  np.testing.assert_array_equal(_whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x), ref)


def test_broadcasting_stores(x):
  def kernel(x_ref, o_ref):
    o_ref[...] = 7.0                      # weak scalar takes the ref's dtype
    o_ref[0:4] = x_ref[0]                 # (256,) broadcast over rows
    o_ref[4:8] = x_ref[0:4, 0:1]          # (4, 1) broadcast over lanes
    o_ref[8:16] = jnp.float32(2.5)

  ref = np.full_like(x, 7.0)
  ref[0:4] = x[0]
  ref[4:8] = x[0:4, 0:1]
  ref[8:16] = 2.5
  np.testing.assert_array_equal(_whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x), ref)


def test_int_ref_scalar_store_casts_weak_python_int():
  def kernel(o_ref):
    o_ref[...] = 5
    o_ref[0, 0] = -1

  out = _whole(kernel, pl.ShapeDtypeStruct((8, 128), jnp.int8))
  ref = np.full((8, 128), 5, np.int8)
  ref[0, 0] = -1
  np.testing.assert_array_equal(out, ref)


def test_ref_get_set_swap_addupdate(x):
  def kernel(x_ref, o_ref):
    o_ref.set((), x_ref.get())
    old = o_ref.swap(jnp.zeros((8, 256), jnp.float32), pl.ds(0, 8))
    o_ref.addupdate(old, pl.ds(8, 8))

  ref = x.copy()
  ref[8:] += x[:8]
  ref[:8] = 0
  np.testing.assert_array_equal(_whole(kernel, pl.ShapeDtypeStruct(x.shape, x.dtype), x), ref)


def test_smem_scratch_with_dynamic_ds():
  table = np.array([5, 1, 5, 2, 7, 1, 3, 5], np.int32)

  def kernel(t_ref, o_ref, acc_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
      for j in range(8):
        acc_ref[j] = 0

    win = acc_ref.at[pl.ds(t_ref[i], 1)]   # a dynamic window on SMEM scratch, read by scalars
    win[0] = win[0] + (i + 1) * 10
    o_ref[i] = win[0]

  out = pl.pallas_call(
      kernel, out_shape=pl.ShapeDtypeStruct((8,), jnp.int32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(8,), out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
          scratch_shapes=[pltpu.SMEM((8,), jnp.int32)]))(table)
  acc = np.zeros(8, np.int64)
  ref = []
  for i, t in enumerate(table):
    acc[t] += (i + 1) * 10
    ref.append(acc[t])
  np.testing.assert_array_equal(out, ref)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_ds_windows_match_numpy_slicing(data):
  n = data.draw(st.integers(1, 16))
  src = data.draw(st.integers(0, 16 - n))
  dst = data.draw(st.integers(0, 16 - n))
  col = data.draw(st.sampled_from([0, 128]))
  starts = np.array([src, dst], np.int32)
  x = np.arange(16 * 256, dtype=np.float32).reshape(16, 256)

  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)
    o_ref.at[pl.ds(s_ref[1], n)][:, pl.ds(col, 128)] = x_ref[pl.ds(s_ref[0], n), pl.ds(col, 128)] + 1.0

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                       grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,)))(starts, x)
  ref = np.zeros_like(x)
  ref[dst:dst + n, col:col + 128] = x[src:src + n, col:col + 128] + 1
  np.testing.assert_array_equal(out, ref)
