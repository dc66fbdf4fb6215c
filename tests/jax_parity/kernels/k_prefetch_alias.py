"""Parity kernels: scalar prefetch (data-dependent index maps, SMEM reads) and input_output_aliases."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _ints(shape, seed, dtype=np.float32):
  return np.random.default_rng(seed).integers(-8, 8, shape).astype(dtype)


def case_prefetch_gather_blocks():
  def kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + idx_ref[pl.program_id(0)].astype(jnp.float32)
  x = _ints((8 * 16, 128), 20)
  idx = np.array([3, 0, 7, 7, 1, 5], np.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((6 * 16, 128), jnp.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(6,),
                         in_specs=[pl.BlockSpec((16, 128), lambda i, idx: (idx[i], 0))],
                         out_specs=pl.BlockSpec((16, 128), lambda i, idx: (i, 0))))
  return f, (idx, x), None


def case_prefetch_two_tables_skip_blocks():
  def kernel(rows_ref, scale_ref, x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[...] * scale_ref[i]
  x = _ints((4 * 8, 256), 21)
  rows = np.array([2, 2, 0, 3], np.int32)
  scale = np.array([1, -2, 3, 4], np.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4 * 8, 256), jnp.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=2, grid=(4,),
                         in_specs=[pl.BlockSpec((8, 256), lambda i, r, s: (r[i], 0))],
                         out_specs=pl.BlockSpec((8, 256), lambda i, r, s: (i, 0))))
  return f, (rows, scale, x), None


def case_prefetch_grouped_accumulate():
  # consecutive grid steps that map to the same output block accumulate into it (megablox-style)
  def kernel(gid_ref, x_ref, o_ref):
    i = pl.program_id(0)
    first = jnp.logical_or(i == 0, gid_ref[jnp.maximum(i - 1, 0)] != gid_ref[i])

    @pl.when(first)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]
  x = _ints((6 * 8, 128), 22)
  gid = np.array([0, 0, 1, 2, 2, 2], np.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((3 * 8, 128), jnp.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(6,),
                         in_specs=[pl.BlockSpec((8, 128), lambda i, g: (i, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i, g: (g[i], 0))),
                     compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))
  return f, (gid, x), None


def case_smem_block_spec():
  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[0] + s_ref[1]
  s = np.array([3.0, -1.0], np.float32)
  x = _ints((64, 128), 23)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                               pl.BlockSpec((64, 128), lambda: (0, 0))],
                     out_specs=pl.BlockSpec((64, 128), lambda: (0, 0)))
  return f, (s, x), None


def case_alias_in_place_add():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]
  x, y = _ints((256, 128), 24), _ints((256, 128), 25)
  spec = pl.BlockSpec((64, 128), lambda i: (i, 0))
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[spec, spec], out_specs=spec, input_output_aliases={0: 0})
  return f, (x, y), None


def case_alias_partial_update():
  # only blocks 1 and 3 are written; the rest of the aliased output keeps the input's values
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 10.0
  x = _ints((256, 128), 26)
  spec = pl.BlockSpec((64, 128), lambda i: (2 * i + 1, 0))
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                     in_specs=[spec], out_specs=spec, input_output_aliases={0: 0})
  return f, (x,), None


def case_alias_with_prefetch_any_space():
  # aliased HBM output updated by a manual DMA of one row block chosen by a prefetched scalar
  def kernel(row_ref, new_ref, buf_in, buf_out, sem):
    del buf_in
    pltpu.make_async_copy(new_ref, buf_out.at[pl.ds(row_ref[0] * 8, 8)], sem).start()
    pltpu.make_async_copy(new_ref, buf_out.at[pl.ds(row_ref[0] * 8, 8)], sem).wait()
  buf = _ints((64, 128), 27)
  new = _ints((8, 128), 28)
  row = np.array([5], np.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(1,),
                         in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
                         out_specs=pl.BlockSpec(memory_space=pl.ANY),
                         scratch_shapes=[pltpu.SemaphoreType.DMA]),
                     input_output_aliases={2: 0})
  return f, (row, new, buf), None
