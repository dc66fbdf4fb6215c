"""The compiler limits measured on a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05.jsonl), through
palace's own front end: each test is built from a recorded rejection (or acceptance) of the chip."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

F32, I8, I16, I32 = np.float32, np.int8, np.int16, np.int32


def _copy(x, block, **kw):
  grid = tuple(s // b for s, b in zip(x.shape, block))
  spec = pl.BlockSpec(block, lambda *g: g)
  return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                        out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=grid, in_specs=[spec],
                        out_specs=spec, **kw)(x)


def _whole(fn, *args, out_dtype=None):
  def kernel(*refs):
    *ins, o_ref = refs
    o_ref[...] = fn(*(r[...] for r in ins))
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(args[0].shape, out_dtype or args[0].dtype))(
      *args)


def test_int8_blocks_take_32_row_tiles():
  # chip: "Operand of shape (..., 64, 256) has tiling (32, 128), but its block shape (..., 8, 128) is
  # not divisible by tiling evenly nor matches the full shape"; (32, 128) blocks run
  x = (np.arange(64 * 256) % 7).astype(I8).reshape(64, 256)
  np.testing.assert_array_equal(_copy(x, (32, 128)), x)
  with pytest.raises(pl.BlockSpecError, match=r"Block shape for args\[0\] \(= \(16, 128\)\) does not fit the "
                                              r"\(32, 128\) HBM tiling of an 8-bit array of shape \(64, 256\) "
                                              r"\(int8\): dim 0 is 16.*Fix: use a multiple of 32 rows"):
    _copy(x, (16, 128))
  xs = (np.arange(32 * 256) % 7).astype(I16).reshape(32, 256)   # 16-bit: 8-row blocks compile
  np.testing.assert_array_equal(_copy(xs, (8, 128)), xs)


def test_vmem_limit_above_the_chip_is_clamped_not_an_error():
  # chip: vmem_limit_bytes of 130 and 256 MiB compile on v5e (128 MiB of VMEM)
  x = np.ones((16, 256), F32)
  out = _copy(x, (8, 128), compiler_params=pltpu.CompilerParams(vmem_limit_bytes=256 * 2**20))
  np.testing.assert_array_equal(out, x)


def test_dma_semaphores_per_core_on_v5e():
  # chip: 1024 DMA semaphores fail ("Allocation (size=4096) would exceed memory (size=2048) ...
  # space=sflag"): 512 four-byte semaphores
  def kernel(n):
    def body(x_hbm, o_hbm, sems):
      c = pltpu.make_async_copy(x_hbm, o_hbm, sems.at[n - 1])
      c.start()
      c.wait()
    return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((16, 128), F32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])
  x = np.ones((16, 128), F32)
  np.testing.assert_array_equal(kernel(512)(x), x)
  with pytest.raises(pl.ResourceError, match=r"Semaphores over capacity for scratch\[0\] .*1024 requested "
                                             r"dma semaphores > 512 per core on v5e\. Fix: reuse"):
    kernel(1024)(x)


def test_8bit_vector_add_is_rejected_and_the_cast_is_the_fix():
  # chip (timing suite, arith.addi / arith.subi on vector<...xi8>): "Not implemented: Only
  # vector<i16> and vector<i32> are supported, but got 'i8'. Please cast your input."
  a = np.full((32, 128), 3, I8)
  with pytest.raises(pl.UnsupportedError, match=r"jnp\.add of int8 vectors of shape \(32, 128\) at grid "
                                                r"point \(\) on chip 0 core 0 .*no 8-bit integer add on "
                                                r"vectors .*Fix: cast the operands to int32"):
    _whole(lambda u, v: u + v, a, a)
  with pytest.raises(NotImplementedError, match=r"jnp\.subtract of uint8"):
    _whole(lambda u, v: u - v, a.view(np.uint8), a.view(np.uint8))
  out = _whole(lambda u, v: (u.astype(jnp.int32) + v.astype(jnp.int32)).astype(jnp.int8), a, a)
  assert (out == 6).all()


def test_16bit_vector_division_is_rejected():
  # chip: "failed to legalize operation 'arith.divsi' ... vector<8x128x2xi16>"; int16 add compiles
  a = np.full((16, 128), 7, I16)
  assert (_whole(lambda u, v: u + v, a, a) == 14).all()
  with pytest.raises(pl.UnsupportedError, match=r"jnp\.floor_divide of int16 vectors .*no 16-bit integer "
                                                r"floor_divide on vectors .*arith\.divsi"):
    _whole(lambda u, v: u // v, a, a)


def test_take_along_axis_gathers_along_the_minor_dims_only():
  # chip: jnp.take_along_axis on the lane axis compiles (tpu.dynamic_gather)
  x = np.arange(8 * 128, dtype=F32).reshape(8, 128)
  idx = ((np.arange(8 * 128) * 37) % 128).astype(I32).reshape(8, 128)
  out = _whole(lambda a, i: jnp.take_along_axis(a, i, axis=-1), x, idx)
  np.testing.assert_array_equal(out, np.take_along_axis(x, idx, axis=-1))
  x3 = np.zeros((2, 8, 128), F32)
  with pytest.raises(pl.UnsupportedError, match=r"take_along_axis along axis 0 of a rank-3 value .*only "
                                                r"along the two minor dims"):
    _whole(lambda a, i: jnp.take_along_axis(a, i, axis=0), x3, np.zeros((2, 8, 128), I32))
