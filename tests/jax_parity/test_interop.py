"""palace kernels with real JAX arrays: jax.Array in and out, pl.jax_callable inside jax.jit."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as pjnp

jax = pytest.importorskip("jax", reason="JAX 0.12 (Python >= 3.12) is not installed")
jnp = jax.numpy


def _add(x, y):
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


def test_jax_arrays_in_jax_arrays_out():
  x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
  with pl.virtual_tpu("v5e") as tpu:
    out = _add(x, x)
  assert isinstance(out, jax.Array) and len(tpu.reports) == 1
  np.testing.assert_array_equal(np.asarray(out), 2 * np.asarray(x))
  with pl.virtual_tpu("v5e"):
    out_np = _add(np.asarray(x), np.asarray(x))
  assert isinstance(out_np, np.ndarray) and not isinstance(out_np, jax.Array)


def test_bf16_jax_arrays_and_pl_kernel():
  x = jnp.ones((8, 128), jnp.bfloat16)
  with pl.virtual_tpu("v5e"):
    out = _add(x, x)
    mesh = pl.tpu.TensorCoreMesh(axis_name="core", num_cores=1)

    @pl.kernel(out_type=pl.ShapeDtypeStruct((8, 128), np.float32), mesh=mesh,
               scratch_types=[pl.tpu.VMEM((8, 128), np.float32)])
    def copy(x_hbm, o_hbm, buf):
      pl.tpu.sync_copy(x_hbm, buf)
      pl.tpu.sync_copy(buf, o_hbm)
    k_out = copy(jnp.full((8, 128), 3.0, jnp.float32))
  assert out.dtype == jnp.bfloat16 and isinstance(out, jax.Array)
  assert isinstance(k_out, jax.Array) and float(k_out.sum()) == 3.0 * 8 * 128


def test_tracer_operand_is_a_clear_error():
  with pytest.raises(Exception, match="pl.jax_callable"):
    jax.jit(lambda a: _add(a, a))(jnp.ones((8, 128), jnp.float32))


def test_jax_callable_inside_jit():
  add = pl.jax_callable(_add)
  x = jnp.arange(16 * 128, dtype=jnp.float32).reshape(16, 128)
  with pl.virtual_tpu("v5e") as tpu:
    out = jax.jit(lambda a, b: add(a, b) * 2 + 1)(x, x)
  np.testing.assert_array_equal(np.asarray(out), 4 * np.asarray(x) + 1)
  assert any(r.kernel_name == "kernel" for r in tpu.reports)


def test_jax_callable_declared_out_shape_and_pytree():
  def two(x):
    return _add(x, x), _add(x, pjnp.ones(x.shape, x.dtype))
  f = pl.jax_callable(two, out_shape=lambda x: (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2)
  x = jnp.zeros((8, 128), jnp.float32)
  a, b = jax.jit(f)(x)
  assert float(a.sum()) == 0.0 and float(b.sum()) == 8 * 128


def test_load_module_leaves_real_jax_untouched():
  import palace.compat as pc
  from pathlib import Path
  m = pc.load_module(Path(__file__).parent / "fixtures" / "jax_style_module.py")
  import jax as real
  assert m.jax is not real and real.numpy is jnp and hasattr(real, "grad")
  assert real.jit is not m.jax.jit
  assert type(m.jax).__module__.startswith("palace")
