"""Dtype predicates under palace.compat (the `jax.numpy` a loaded module sees) answer as JAX does
(facts checked against JAX 0.12 by tests/jax_parity/test_dtype_parity.py): bfloat16 and fp8 are
floating, so a kernel choosing its accumulator with issubdtype accumulates in float32, not int32."""
import textwrap

import numpy as np
import pytest

import palace as pl
import palace.compat
from palace import PalaceError

PROBE = '''
    import jax
    import jax.numpy as jnp
    from jax import dtypes
    from jax.experimental import pallas as pl

    def acc_dtype(x_dtype):
      return jnp.float32 if jnp.issubdtype(x_dtype, jnp.floating) else jnp.int32

    def kernel(x_ref, o_ref):
      acc = x_ref[...].astype(acc_dtype(x_ref.dtype))
      o_ref[...] = (acc * 0.5).astype(o_ref.dtype)

    def run(x):
      return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
  f = tmp_path_factory.mktemp("dt") / "dtype_probe_mod.py"
  f.write_text(textwrap.dedent(PROBE))
  return palace.compat.load_module(f)


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("cat", ["floating", "inexact", "number", "generic"])
def test_float_types_are_floating(mod, name, cat):
  jnp = mod.jnp
  assert jnp.issubdtype(getattr(jnp, name), getattr(jnp, cat))
  assert mod.dtypes.issubdtype(getattr(jnp, name), getattr(jnp, cat))
  assert not jnp.issubdtype(getattr(jnp, name), jnp.integer)


@pytest.mark.parametrize("name,signed", [("int4", True), ("uint4", False), ("int8", True)])
def test_narrow_ints_are_integers(mod, name, signed):
  jnp = mod.jnp
  assert jnp.issubdtype(getattr(jnp, name), jnp.integer)
  assert jnp.issubdtype(getattr(jnp, name), jnp.signedinteger) == signed
  assert not jnp.issubdtype(getattr(jnp, name), jnp.floating)


def test_promotion_as_jax(mod):
  jnp = mod.jnp
  assert jnp.promote_types(jnp.bfloat16, jnp.float16) == np.dtype(np.float32)
  assert jnp.result_type(jnp.bfloat16, 1.0) == np.dtype(jnp.bfloat16)
  assert jnp.result_type(jnp.uint8, jnp.int8) == np.dtype(np.int16)
  with pytest.raises(PalaceError, match="promotion"):
    jnp.result_type(jnp.int4, 1.0)
  with pytest.raises(PalaceError, match="promotion"):
    jnp.promote_types(jnp.int4, jnp.int8)   # 4-bit ints never promote implicitly (as JAX)
  with pytest.raises(PalaceError, match="promotion"):
    jnp.promote_types(jnp.float8_e4m3fn, jnp.bfloat16)
  assert jnp.finfo(jnp.bfloat16).bits == 16 and jnp.iinfo(jnp.int4).max == 7


def test_kernel_accumulator_chosen_by_issubdtype_is_float(mod):
  x = (np.arange(8 * 128).reshape(8, 128) % 7).astype(mod.jnp.bfloat16)
  with pl.virtual_tpu("v5e"):
    out = mod.run(x)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(x, np.float32) * 0.5)
