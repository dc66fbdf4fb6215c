"""The exact-f32-dots diagnostic (VirtualTPU(exact_f32_dots=True), PALACE_JAX_EXACT_F32_DOTS=1): a
DEFAULT-precision float32 dot multiplies its operands unrounded (as XLA:CPU does) instead of rounded to
bfloat16 (as the chip does, lang/mxu.py), and every report made under it says it is not the chip."""
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace
import palace.jax
from palace._src.jax.activation import activate_from_env

# 1 + 2^-12 is not a bfloat16 (it rounds to 1): products and sums of these are exact in float32, so
# the only rounding a dot of them shows is its operands'
A = np.full((8, 512), 1 + 2.0 ** -12, np.float32)
B = np.ones((512, 256), np.float32)
CHIP = np.full((8, 256), 512.0, np.float32)
EXACT = np.full((8, 256), 512 * (1 + 2.0 ** -12), np.float32)


def _dot(x, y):
  """One DEFAULT-precision dot of whole VMEM blocks."""
  spec = pl.BlockSpec(memory_space=pltpu.VMEM)

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
                        in_specs=[spec, spec], out_specs=spec)(x, y)


def _k_tiled(x, y):
  """A K-tiled accumulating matmul (palace keeps its sums deferred: lang/deferred.py's panels)."""
  def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.dot(x_ref[...], y_ref[...])
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((x.shape[0], y.shape[1]), jnp.float32),
                        grid=(2, x.shape[1] // 128),
                        in_specs=[pl.BlockSpec((8, 128), lambda j, k: (0, k)),
                                  pl.BlockSpec((128, 128), lambda j, k: (k, j))],
                        out_specs=pl.BlockSpec((8, 128), lambda j, k: (0, j)))(x, y)


@pytest.mark.parametrize("fn", [_dot, _k_tiled], ids=["one_dot", "k_tiled"])
def test_default_f32_dot_is_exact_under_the_diagnostic_and_chip_rounded_without(fn):
  with palace.jax.virtual_tpu("v5e") as tpu:
    chip = np.asarray(jax.jit(fn)(A, B))
  np.testing.assert_array_equal(chip, CHIP)
  assert not tpu.reports[-1].exact_f32_dots and "DIAGNOSTIC" not in str(tpu.reports[-1])
  with palace.jax.virtual_tpu("v5e", exact_f32_dots=True) as tpu:
    exact = np.asarray(jax.jit(fn)(A, B))
  np.testing.assert_array_equal(exact, EXACT)
  report = tpu.reports[-1]
  assert report.exact_f32_dots and report.as_dict()["exact_f32_dots"]
  assert "DIAGNOSTIC exact_f32_dots: not the chip's numerics" in str(report).splitlines()[0]
  assert "the chip rounds their operands to bfloat16" in str(report)
  assert "not the chip's numerics" in repr(tpu)


def test_the_diagnostic_changes_only_float32_operands_at_default_precision():
  bf = A.astype(jnp.bfloat16)   # already bfloat16: the chip multiplies it as it is, so does the diagnostic
  with palace.jax.virtual_tpu("v5e", exact_f32_dots=True):
    out = np.asarray(jax.jit(_dot)(bf, B.astype(jnp.bfloat16)))
    highest = np.asarray(jax.jit(lambda x, y: pl.pallas_call(
        lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., jnp.dot(
            x_ref[...], y_ref[...], precision=jax.lax.Precision.HIGHEST)),
        out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))(x, y))(A, B))
  np.testing.assert_array_equal(out, CHIP)   # bf16(1 + 2^-12) == 1
  np.testing.assert_array_equal(highest, EXACT)
  with palace.jax.virtual_tpu("v5e", exact_f32_dots=True), pytest.raises(
      NotImplementedError, match="precision=HIGH"):   # what Mosaic rejects is still rejected
    jax.jit(lambda x, y: pl.pallas_call(
        lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., jnp.dot(
            x_ref[...], y_ref[...], precision=jax.lax.Precision.HIGH)),
        out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))(x, y))(A, B)


def test_a_bad_environment_value_is_a_usage_error():
  with pytest.raises(palace.UsageError, match="PALACE_JAX_EXACT_F32_DOTS='yes': expected 1"):
    activate_from_env({"PALACE_JAX": "v5e", "PALACE_JAX_EXACT_F32_DOTS": "yes"})


@pytest.mark.parametrize("variable, flag, body", [
    ("PALACE_JAX_EXACT_F32_DOTS", "exact_f32_dots",
     "from test_exact_f32_dots import _dot, A, B, EXACT\n"
     "np.testing.assert_array_equal(np.asarray(jax.jit(_dot)(A, B)), EXACT)\n"),
    ("PALACE_JAX_SHARED_DOTS", "shared_dots",   # tests/jax_backend/test_shared_dots.py
     "from test_shared_dots import _k_tiled, _xla_dot, X, Y, RULE\n"
     "np.testing.assert_array_equal(np.asarray(jax.jit(_k_tiled)(X, Y)), RULE)\n"
     "np.testing.assert_array_equal(np.asarray(_xla_dot(X, Y)), RULE)\n"),
    ("PALACE_JAX_HOST_MATH", "host_math",   # tests/jax_backend/test_host_math.py
     "import jax.numpy as jnp\n"
     "from test_host_math import _unary, X\n"
     "np.testing.assert_array_equal(np.asarray(jax.jit(_unary(jnp.exp))(X)), np.asarray(jax.jit(jnp.exp)(X)))\n")],
    ids=["exact", "shared", "host_math"])
def test_the_environment_switch_says_so_in_every_report(tmp_path, variable, flag, body):
  prog = tmp_path / "prog.py"
  prog.write_text(
      "import sys, numpy as np, jax\n"
      f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n" + body +
      "import palace.jax\n"
      "print(palace.jax.process_tpu.reports[-1])\n")
  env = dict(os.environ, PALACE_JAX="v5e", JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(sys.path),
             **{variable: "1"})
  for other in ("PALACE_JAX_EXACT_F32_DOTS", "PALACE_JAX_SHARED_DOTS", "PALACE_JAX_HOST_MATH"):
    if other != variable:
      env.pop(other, None)
  r = subprocess.run([sys.executable, "-m", "palace._src.jax.run", str(prog)], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert f"DIAGNOSTIC {variable}=1" in r.stderr                          # at activation
  assert f"[DIAGNOSTIC {flag}: not the chip's numerics]" in r.stderr     # each launch's line
  assert f"DIAGNOSTIC {flag}" in r.stdout                                # the report itself
