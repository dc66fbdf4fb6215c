"""Parity kernels: pallas_call with grids, BlockSpecs, scratch and control flow (JAX Pallas source).

Each `case_*()` returns (fn, args, tol): the harness runs fn(*args) under JAX's TPU interpret mode and
under palace (this file loaded by palace.compat.load_module) and compares; tol None = bit-identical.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _ints(shape, seed, lo=-8, hi=8, dtype=np.float32):
  return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


def _row_spec(bm, n):
  return pl.BlockSpec((bm, n), lambda i: (i, 0))


def case_add():
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]
  x, y = _ints((512, 256), 0), _ints((512, 256), 1)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[_row_spec(128, 256)] * 2, out_specs=_row_spec(128, 256))
  return f, (x, y), None


def case_elementwise_transcendental():
  def kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = jnp.where(x > 0, jnp.exp(-x) * jnp.tanh(x), jnp.sqrt(jnp.abs(x)) + 1.0)
  x = np.random.default_rng(2).standard_normal((256, 256)).astype(np.float32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                     in_specs=[_row_spec(128, 256)], out_specs=_row_spec(128, 256))
  return f, (x,), (1e-6, 1e-6)


def _matmul(x, y, bm, bn, bk, acc_dtype, out_dtype):
  def kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_dtype)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
      o_ref[...] = acc_ref[...].astype(o_ref.dtype)

  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype), grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), acc_dtype)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")))


def case_matmul_f32_exact():
  x, y = _ints((256, 512), 3), _ints((512, 256), 4)      # small integers: every sum is exact
  return _matmul(x, y, 128, 128, 128, jnp.float32, jnp.float32), (x, y), None


def case_matmul_f32_random():
  r = np.random.default_rng(5)
  x, y = r.standard_normal((256, 256)).astype(np.float32), r.standard_normal((256, 256)).astype(np.float32)
  # palace rounds f32 operands to bf16 at the default precision as a TPU does; JAX's interpret mode
  # does not: the chip wins (docs/numerics.md), so the tolerance is bf16 operand rounding's
  return _matmul(x, y, 128, 128, 128, jnp.float32, jnp.float32), (x, y), (5e-2, 5e-1)


def case_matmul_bf16_to_f32():
  r = np.random.default_rng(6)
  x = r.standard_normal((256, 256)).astype(jnp.bfloat16)
  y = r.standard_normal((256, 256)).astype(jnp.bfloat16)
  return _matmul(x, y, 128, 128, 128, jnp.float32, jnp.bfloat16), (x, y), (1e-2, 1e-2)


def case_matmul_int8_to_int32():
  x, y = _ints((256, 256), 7, -128, 127, np.int8), _ints((256, 256), 8, -128, 127, np.int8)
  return _matmul(x, y, 128, 128, 128, jnp.int32, jnp.int32), (x, y), None


def case_row_sum_and_max():
  def kernel(x_ref, s_ref, m_ref):
    x = x_ref[...]
    s_ref[...] = jnp.sum(x, axis=1, keepdims=True)
    m_ref[...] = jnp.broadcast_to(jnp.max(x, axis=0, keepdims=True), (8, 128))
  x = _ints((256, 128), 9)
  f = pl.pallas_call(kernel, grid=(2,), in_specs=[_row_spec(128, 128)],
                     out_specs=[pl.BlockSpec((128, 1), lambda i: (i, 0)),
                                pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_shape=[jax.ShapeDtypeStruct((256, 1), jnp.float32),
                                jax.ShapeDtypeStruct((16, 128), jnp.float32)])
  return f, (x,), None


def case_softmax():
  def kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
  x = np.random.default_rng(10).standard_normal((128, 256)).astype(np.float32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[_row_spec(32, 256)], out_specs=_row_spec(32, 256))
  return f, (x,), (1e-6, 1e-7)


def case_transpose_blocks():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T
  x = _ints((256, 384), 11)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((384, 256), x.dtype), grid=(2, 3),
                     in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))],
                     out_specs=pl.BlockSpec((128, 128), lambda i, j: (j, i)))
  return f, (x,), None


def case_causal_mask_iota():
  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    rows = lax.broadcasted_iota(jnp.int32, (128, 128), 0) + i * 128
    cols = lax.broadcasted_iota(jnp.int32, (128, 128), 1)
    o_ref[...] = jnp.where(cols <= rows, x_ref[...], -1.0)
  x = _ints((256, 128), 12)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                     in_specs=[_row_spec(128, 128)], out_specs=_row_spec(128, 128))
  return f, (x,), None


def case_cast_f32_to_bf16():
  def kernel(x_ref, o_ref):
    o_ref[...] = (x_ref[...] * 1.5).astype(jnp.bfloat16)
  x = np.random.default_rng(13).standard_normal((256, 256)).astype(np.float32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), grid=(2,),
                     in_specs=[_row_spec(128, 256)], out_specs=_row_spec(128, 256))
  return f, (x,), None


def case_program_ids():
  def kernel(o_ref):
    i, j = pl.program_id(0), pl.program_id(1)
    o_ref[...] = jnp.full(o_ref.shape, i * 100 + j * 10 + pl.num_programs(1), jnp.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((32, 256), jnp.int32), grid=(4, 2),
                     out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)))
  return f, (), None


def case_fori_loop_in_kernel():
  def kernel(x_ref, o_ref):
    def body(k, acc):
      return acc + x_ref[pl.ds(k * 8, 8), :]
    o_ref[...] = lax.fori_loop(0, 16, body, jnp.zeros((8, 128), jnp.float32))
  x = _ints((128, 128), 14)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
  return f, (x,), None


def case_squeezed_batch_dim():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0
  x = _ints((4, 64, 128), 15)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[pl.BlockSpec((None, 64, 128), lambda b: (b, 0, 0))],
                     out_specs=pl.BlockSpec((None, 64, 128), lambda b: (b, 0, 0)))
  return f, (x,), None


def case_run_scoped_and_dict_scratch():
  def kernel(x_ref, o_ref, *, tmp):
    tmp[...] = x_ref[...] + 1.0

    def inner(scr):
      scr[...] = tmp[...] * 3.0
      o_ref[...] = scr[...] - x_ref[...]
    pl.run_scoped(inner, pltpu.VMEM((64, 128), jnp.float32))
  x = _ints((128, 128), 16)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                     in_specs=[_row_spec(64, 128)], out_specs=_row_spec(64, 128),
                     scratch_shapes=dict(tmp=pltpu.VMEM((64, 128), jnp.float32)))
  return f, (x,), None


def case_roll_and_integer_ops():
  def kernel(x_ref, o_ref):
    x = x_ref[...]
    r = pltpu.roll(x, shift=3, axis=1)
    o_ref[...] = (r * 7 + (x >> 2)) % 13 - lax.rem(x, 5)
  x = _ints((64, 128), 17, -1000, 1000, np.int32)
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
  return f, (x,), None


def case_jit_static_argnames():
  @functools.partial(jax.jit, static_argnames=["block_rows"])
  def scale(x, *, block_rows):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...] * 0.5
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // block_rows,),
                          in_specs=[_row_spec(block_rows, x.shape[1])],
                          out_specs=_row_spec(block_rows, x.shape[1]))(x)
  return functools.partial(scale, block_rows=64), (_ints((256, 128), 18),), None
