"""Integer ops the TPU compiler (Mosaic) rejects, refused by palace's own language (`import palace as
pl`) as `CompilerRejectError` (an UnsupportedError) with Mosaic's words (lang/int_rejects.py): scalar
(0-d, SMEM) integer arithmetic on any width but 32 bits, 4-bit vector additions; the 32-bit forms and a
SparseCore subcore's scalars compute."""
import functools

import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace import tpu_sc as plsc
from palace._src.lang import int_rejects

_SCALAR = r"Not implemented: (Only i1 and i32 scalars are supported|Only i32 arith\..* is supported)"
_SMEM = dict(in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
             out_specs=pl.BlockSpec(memory_space=pltpu.SMEM))
_I4, _U4 = np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)
_OPS = {"add": lambda a, b: a + b, "bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b,
        "bitwise_xor": lambda a, b: a ^ b, "multiply": lambda a, b: a * b, "subtract": lambda a, b: b - a,
        "maximum": jnp.maximum, "minimum": jnp.minimum, "left_shift": lambda a, b: a << b,
        "right_shift": lambda a, b: a >> b, "floor_divide": lambda a, b: a // b,
        "remainder": lambda a, b: a % b, "negative": lambda a, b: -a, "invert": lambda a, b: ~a}


def _scalar_call(op, dtype):
  def kernel(x_ref, y_ref):
    y_ref[0] = op(x_ref[1], x_ref[2])
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((1,), dtype), **_SMEM)(np.arange(3, dtype=dtype))


@pytest.mark.parametrize("name", sorted(_OPS))
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, _I4, _U4])
def test_narrow_scalar_integer_ops_are_refused(name, dtype):
  bits = 4 if dtype in (_I4, _U4) else np.dtype(dtype).itemsize * 8
  quote = r"Not implemented: Only i32 addition is supported, but got i%d\." % bits if name == "add" else _SCALAR
  with pytest.raises(pl.CompilerRejectError, match=rf"jnp\.{name} of {np.dtype(dtype)} scalars at grid point "
                                                  rf"\(\) on chip 0 core 0 .*test_int_rejects\.py:\d+\): the TPU "
                                                  rf"compiler has no {bits}-bit integer {name} on scalars; "
                                                  rf"expected int32 .*'{quote}.*Fix: cast the operands to int32"):
    _scalar_call(_OPS[name], dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_32_bit_scalar_integer_ops_compute(dtype):
  x = np.arange(3, dtype=dtype)
  for name, op in _OPS.items():
    with np.errstate(over="ignore"):   # (-1 of a uint32 wraps, as on the chip)
      want = np.asarray([op(x[1], x[2])], dtype)
    np.testing.assert_array_equal(_scalar_call(op, dtype), want, name)


def test_the_refusal_is_an_unsupported_error_and_a_not_implemented_error():
  with pytest.raises(pl.UnsupportedError) as e:
    _scalar_call(lambda a, b: a * b, np.int16)
  assert isinstance(e.value, NotImplementedError) and isinstance(e.value, pl.PalaceError)


def test_casting_narrow_scalars_to_int32_is_the_fix():
  def kernel(x_ref, y_ref):
    y_ref[0] = (x_ref[1].astype(jnp.int32) + x_ref[2].astype(jnp.int32)).astype(jnp.int8)
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((1,), np.int8), **_SMEM)(np.arange(3, dtype=np.int8))
  np.testing.assert_array_equal(out, np.asarray([3], np.int8))


@pytest.mark.parametrize("dtype", [_I4, _U4])
def test_4_bit_vector_additions_are_refused(dtype):
  x = np.full((128, 16), 3, dtype)

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref[...] + x_ref[...]
  with pytest.raises(pl.CompilerRejectError, match=rf"jnp\.add of {np.dtype(dtype)} vectors of shape "
                                                  r"\(128, 16\) .*no 4-bit integer add on vectors .*inferred, "
                                                  r"not measured.*Not implemented: Only vector<i16> and "
                                                  r"vector<i32>"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, dtype))(x)


def test_sparsecore_scalars_are_not_tensorcore_rules():
  # a SparseCore subcore has its own lowering: the TensorCore compiler's scalar rule is not applied
  with pl.virtual_tpu("v5p"):
    mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((1,), np.int32), mesh=mesh,
                       scratch_types=[pltpu.SMEM((2,), jnp.int16)])
    def k(o_hbm, s):
      s[0] = jnp.int16(5)
      s[1] = s[0] + s[0]
      s[0] = s[1] * jnp.int16(3)
    k()


def test_the_tables_name_only_narrow_integers():
  for name in int_rejects.SCALAR_INT_OPS:
    for d in (np.int32, np.uint32, np.float32, np.bool_, ml_dtypes.bfloat16):
      assert int_rejects.scalar_mlir_op(name, np.dtype(d)) is None, (name, d)
  assert int_rejects.scalar_mlir_op("maximum", np.dtype(np.uint8)) == "arith.maxui"
  assert int_rejects.scalar_mlir_op("abs", np.dtype(np.uint8)) is None   # |x| of an unsigned x is x
  assert int_rejects.refusal("add", np.int16, (8, 128), "here") is None   # 16-bit vector add compiles
