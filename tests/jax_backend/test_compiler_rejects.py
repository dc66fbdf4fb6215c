"""Integer ops the TPU compiler (Mosaic) rejects are refused while palace.jax lowers the kernel, as
JAX's Mosaic error type (`MosaicError`) and palace's `CompilerRejectError` (an UnsupportedError) at
once, with Mosaic's own words in the message (lang/int_rejects.py, jax/compiler_errors.py): scalar
integer arithmetic on any width but 32 bits, and 4-bit vector additions. The regular expressions are
the ones JAX's own tpu_pallas_test matches (PallasScalarIOpsTest, PallasCallPoisonTest)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax._src.pallas.mosaic import error_handling
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace import CompilerRejectError, UnsupportedError
from palace._src.jax import compiler_errors

_SCALAR = r"Not implemented: (Only i1 and i32 scalars are supported|Only i32 arith\..* is supported)"
_ADD = r"Not implemented: Only i32 (addition|arith.addi) is supported"
_SMEM = dict(in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
             out_specs=pl.BlockSpec(memory_space=pltpu.SMEM))
_NARROW = [jnp.int4, jnp.int8, jnp.int16, jnp.uint4, jnp.uint8, jnp.uint16]
_OPS = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
        "mul": lambda a, b: a * b, "sub": lambda a, b: b - a, "max": jnp.maximum, "min": jnp.minimum,
        "shl": lambda a, b: a << b, "shr": lambda a, b: a >> b, "div": lambda a, b: a // b,
        "clamp": lambda a, b: jax.lax.clamp(a, b, b), "square": lambda a, b: a ** 2}


def _scalar_call(op, dtype):
  def kernel(x_ref, y_ref):
    y_ref[0] = op(x_ref[1], x_ref[2])
  x = jnp.arange(3, dtype=dtype)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), dtype), **_SMEM)(x)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint16, jnp.int4])
def test_a_narrow_scalar_addition_is_mosaics_error_and_palaces(dtype):
  def kernel(x_ref, y_ref):
    y_ref[0] = x_ref[0] + x_ref[0]
  x = jnp.asarray([3], dtype=dtype)
  bits = jnp.iinfo(dtype).bits
  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError, match=_ADD) as e:
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, dtype), **_SMEM)(x)
  assert isinstance(e.value, CompilerRejectError) and isinstance(e.value, UnsupportedError)
  assert isinstance(e.value, NotImplementedError)
  msg = str(e.value)
  assert f"jnp.add of {np.dtype(dtype)} scalars at kernel line test_compiler_rejects.py:" in msg
  assert f"got i{bits}." in msg and "Fix: cast the operands to int32" in msg


@pytest.mark.parametrize("name", sorted(_OPS))
@pytest.mark.parametrize("dtype", _NARROW)
def test_narrow_scalar_integer_ops_are_rejected_at_lowering(name, dtype):
  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError, match=_SCALAR):
    _scalar_call(_OPS[name], dtype)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32])
def test_32_bit_scalar_integer_ops_compute(dtype):
  x = np.arange(3, dtype=dtype)
  with pj.virtual_tpu("v5e"):
    for name, op in _OPS.items():
      np.testing.assert_array_equal(_scalar_call(op, dtype), np.asarray([op(x[1], x[2])], dtype), name)


def test_a_narrow_scalar_clz_is_rejected_where_the_interpret_mode_computes_it():
  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError, match=r"lax\.clz of int8 scalars .*"
                                                                           r"math\.ctlz on i8.*" + _SCALAR):
    _scalar_call(lambda a, b: jax.lax.clz(a), jnp.int8)


def test_a_rejected_op_in_a_branch_never_taken_is_still_rejected():
  # Mosaic compiles every branch; palace decides from the types, not from the run
  def kernel(x_ref, y_ref):
    y_ref[0] = x_ref[0]

    @pl.when(x_ref[0] > 100)
    def _():
      y_ref[0] = x_ref[0] * x_ref[0]
  x = jnp.asarray([3], jnp.int16)
  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError, match=_SCALAR):
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int16), **_SMEM)(x)


def test_narrow_scalars_cast_to_int32_compute():
  def kernel(x_ref, y_ref):
    y_ref[0] = (x_ref[0].astype(jnp.int32) * 3 + 1).astype(jnp.int8)
  x = jnp.asarray([5], jnp.int8)
  with pj.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int8), **_SMEM)(x)
  np.testing.assert_array_equal(out, np.asarray([16], np.int8))


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4, jnp.int8, jnp.uint8])
def test_narrow_vector_additions_are_rejected_at_lowering(dtype):
  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref[...] + x_ref[...]
  x = jnp.full((128, 16), 7, dtype=dtype)
  vmem = dict(in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
              out_specs=pl.BlockSpec(memory_space=pltpu.VMEM))
  with pj.virtual_tpu("v5e"), pytest.raises(error_handling.MosaicError,
                                            match="Not implemented: Only vector<i16> and vector<i32>") as e:
    pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, dtype), **vmem)(x)
  assert f"jnp.add of {np.dtype(dtype)} vectors of shape (128, 16)" in str(e.value)


@pytest.mark.parametrize("dtype", [jnp.int16, jnp.uint16, jnp.int32])
def test_16_and_32_bit_vector_additions_compute(dtype):
  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref[...] + x_ref[...]
  x = jnp.full((128, 16), 7, dtype=dtype)
  with pj.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, dtype))(x)
  np.testing.assert_array_equal(out, np.full((128, 16), 14, dtype))


def test_an_int8_mask_cast_against_a_literal_zero_still_compiles():
  def kernel(x_ref, y_ref):
    y_ref[...] = jnp.where(x_ref[...] != 0, 1, 0).astype(jnp.int32)
  x = jnp.asarray(np.arange(32 * 128).reshape(32, 128) % 3, jnp.int8)
  with pj.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int32))(x)
  np.testing.assert_array_equal(out, (np.asarray(x) != 0).astype(np.int32))


def test_other_errors_keep_their_type():
  e = UnsupportedError("not a compiler rule. Fix: none.")
  assert compiler_errors.as_jax_error(e) is e
  r = CompilerRejectError("rejected. Fix: cast.")
  r.add_note("a note")
  j = compiler_errors.as_jax_error(r)
  assert isinstance(j, error_handling.MosaicError) and isinstance(j, CompilerRejectError)
  assert j.args == r.args and j.__notes__ == ["a note"] and type(j).__name__ == "CompilerRejectError"
  assert compiler_errors.as_jax_error(j) is j
