"""No silent truncation of non-integers: a float (even 2.0), a bool or None where an integer belongs
is an error naming the parameter; integral NumPy scalars are integers."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import PalaceError
from palace import lax
from palace import tpu as pltpu

SHAPE = (8, 128)
X = np.arange(2 * 8 * 128, dtype=np.float32).reshape(16, 128)


def _copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def _call(**kw):
  grid = kw.pop("grid", (2,))
  block = kw.pop("block", SHAPE)
  imap = kw.pop("index_map", lambda i: (i, 0))
  mode = kw.pop("pipeline_mode", None)
  f = pl.pallas_call(_copy_kernel, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32), grid=grid,
                     in_specs=[pl.BlockSpec(block, imap, pipeline_mode=mode)],
                     out_specs=pl.BlockSpec(SHAPE, lambda i: (i, 0)))
  with pl.virtual_tpu("v5e"):
    return f(X)


def _raises(fn, what):
  with pytest.raises(PalaceError, match=what) as e:
    fn()
  assert isinstance(e.value, (ValueError, TypeError)), type(e.value).__mro__
  return str(e.value)


def test_index_map_returning_floats():
  msg = _raises(lambda: _call(index_map=lambda i: (i * 1.0, 0)), "index_map result for args\\[0\\]")
  assert "integer" in msg and "1.0" in msg or "0.0" in msg


def test_index_map_returning_floats_on_a_long_grid():
  # (a grid this long evaluates the index map once on every step's indices, block_offsets._vectorised_offsets)
  x = np.zeros((16 * 8, 128), np.float32)
  f = pl.pallas_call(_copy_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(16,),
                     in_specs=[pl.BlockSpec(SHAPE, lambda i: (i * 1.0, 0))],
                     out_specs=pl.BlockSpec(SHAPE, lambda i: (i, 0)))
  with pl.virtual_tpu("v5e"):
    _raises(lambda: f(x), "index_map result for args\\[0\\]")


def test_index_map_half_steps_are_not_truncated():
  _raises(lambda: _call(index_map=lambda i: (i * 0.5, 0)), "must be an integer")


@pytest.mark.parametrize("grid", [(2.5,), (2.0,), 2.5, (True,), (None,)], ids=str)
def test_grid_entries(grid):
  _raises(lambda: _call(grid=grid), "grid of pallas_call")


@pytest.mark.parametrize("block", [(8.0, 128), (8, 128.0), (pl.Blocked(8.0), 128)], ids=str)
def test_block_shape_entries(block):
  _raises(lambda: _call(block=block), "block_shape\\[[01]\\] of args\\[0\\]")


@pytest.mark.parametrize("n", [1.5, 2.0, "2", None], ids=repr)
def test_buffered(n):
  _raises(lambda: pl.Buffered(n), "pl.Buffered\\(buffer_count\\)")


def test_integral_numpy_scalars_are_integers():
  out = _call(grid=(np.int64(2),), block=(np.int32(8), np.int64(128)),
              index_map=lambda i: (np.int32(1) * i, np.int64(0)), pipeline_mode=pl.Buffered(np.int8(2)))
  np.testing.assert_array_equal(out, X)


@pytest.mark.parametrize("kw,what", [({"num_chips": 2.5}, "num_chips"), ({"num_chips": 2.0}, "num_chips"),
                                     ({"seed": 1.5}, "seed"), ({"seed": "7"}, "seed")], ids=str)
def test_virtual_tpu_ints(kw, what):
  _raises(lambda: pl.virtual_tpu("v5e", **kw).__enter__(), f"virtual_tpu\\({what}\\)")


@pytest.mark.parametrize("make,what", [
    (lambda: pl.ShapeDtypeStruct((8.0, 128), np.float32), "ShapeDtypeStruct shape\\[0\\]"),
    (lambda: pltpu.VMEM((8, 128.5), np.float32), "pltpu.VMEM\\(shape\\)\\[1\\]"),
    (lambda: pltpu.SMEM((2.0,), np.int32), "pltpu.SMEM\\(shape\\)\\[0\\]"),
    (lambda: pltpu.SemaphoreType.DMA((2.5,)), "SemaphoreType.DMA\\(shape\\)\\[0\\]"),
    (lambda: pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1.0, grid=(1,)), "num_scalar_prefetch"),
    (lambda: pl.GridSpec(grid=(1,), num_scalar_prefetch=0.5), "GridSpec\\(num_scalar_prefetch\\)"),
    (lambda: pltpu.TensorCoreMesh("core", 1.0), "TensorCoreMesh\\(num_cores\\)"),
    (lambda: pl.ds(0.5, 8), "pl.ds start"),
    (lambda: pl.ds(0, 8.0), "pl.ds size"),
    (lambda: pl.Buffered(2, use_lookahead="yes"), "use_lookahead"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_constructors(make, what):
  _raises(make, what)


def _in_kernel(fn):
  def kernel(x_ref, o_ref, sem):
    fn(x_ref, sem)
    o_ref[...] = x_ref[...]

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32),
                     scratch_shapes=[pltpu.SemaphoreType.REGULAR])
  with pl.virtual_tpu("v5e"):
    return f(X[:8])


@pytest.mark.parametrize("fn,what", [
    (lambda x, s: pl.semaphore_signal(s, 1.5), "semaphore increment"),
    (lambda x, s: (pl.semaphore_signal(s, 1), pl.semaphore_wait(s, 1.0)), "semaphore value"),
    (lambda x, s: pltpu.prng_seed(1.5), "prng_seed seed"),
    (lambda x, s: (pltpu.prng_seed(1), pltpu.prng_random_bits((8.0, 128))), "prng_random_bits shape"),
    (lambda x, s: pl.program_id(0.0), "pl.program_id\\(axis\\)"),
    (lambda x, s: pl.num_programs(0.0), "pl.num_programs\\(axis\\)"),
    (lambda x, s: lax.fori_loop(0, 2.5, lambda i, c: c, 0), "fori_loop upper"),
    (lambda x, s: pl.loop(0, 2, step=1.0)(lambda i: None), "pl.loop step"),
    (lambda x, s: jnp.zeros((8.0, 128)), "shape\\[0\\]"),
    (lambda x, s: jnp.reshape(x[...], (128.0, 8)), "reshape shape\\[0\\]"),
    (lambda x, s: jnp.sum(x[...], axis=0.0), "axis"),
    (lambda x, s: jnp.transpose(x[...], (1.0, 0)), "transpose axes"),
    (lambda x, s: jnp.roll(x[...], 1.5, axis=0), "jnp.roll shift"),
    (lambda x, s: pltpu.roll(x[...], 1.5, 0), "shift"),
    (lambda x, s: lax.broadcasted_iota(jnp.int32, (8.0, 128), 0), "broadcasted_iota shape"),
    (lambda x, s: lax.dynamic_slice(x[...], (0, 0), (8.0, 128)), "slice_sizes"),
    (lambda x, s: lax.dynamic_slice(x[...], (0.5, 0), (8, 128)), "start"),
    (lambda x, s: lax.switch(0.0, [lambda: None]), "switch index"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_side_ints(fn, what):
  _raises(lambda: _in_kernel(fn), what)


def test_make_mesh_axis_sizes():
  with pl.virtual_tpu("v5e", num_chips=2):
    _raises(lambda: pl.make_mesh((2.0,), ("x",)), "make_mesh axis_shapes\\[0\\]")
