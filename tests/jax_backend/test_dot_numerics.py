"""palace.jax with VirtualTPU(dot_numerics="mxu") (PALACE_JAX_DOT_NUMERICS=mxu): a JAX kernel's float
dots summed in the v5e MXU's measured order (lang/mxu.chip_product, docs/numerics.md), against the
chip's recorded outputs: the dot_bits record (normal operands, bit-identical but for its 3 known 1-ulp
outliers) and a numerics probe whose operands span 2^+-30 within rows and columns (where the rule's
exact four-sums are not what the chip computes). palace's own side: tests/lang/test_dot_numerics.py."""
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

import palace
import palace.jax
from benchmarks.hw import dot_bits
from benchmarks.hw import numerics_compare as nc
from palace._src.jax.activation import activate_from_env

PROBES = os.path.join(os.path.dirname(dot_bits.__file__), "data", "v5e-numerics-2026-12-05.jsonl")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_jax_kernel_dot_reproduces_the_chip_bits(dtype):
  x, y, chip = dot_bits.recorded(dtype)

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32))
  with palace.jax.virtual_tpu("v5e", dot_numerics="mxu"):
    ulps = dot_bits.ulps(np.asarray(call(x, y)), chip)
  assert (ulps != 0).sum() == 3 and ulps.max() == 1


def test_operands_spanning_2_to_the_60_differ_from_the_chip_only_in_their_rows_and_columns():
  # dot_f32_default_8x128x128: rows 4-5 of a and columns 64-95 of b are normals times 2^[-30, 30] per
  # element. Every output outside them is the chip's; 18 of the 448 inside differ (the chip's four-sums
  # of such products are not exact: unmeasured). The BLAS order differs on about 400 of all 1024.
  name = "dot_f32_default_8x128x128"
  rec = next(r for r in nc.load(PROBES) if r["name"] == name)
  a, b = (nc.decode(rec["inputs"][k], (rec.get("dtypes") or {}).get(k)) for k in ("a", "b"))
  chip = nc.decode(rec["output"], (rec.get("dtypes") or {}).get("output")).astype(np.float32)

  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...], precision=jax.lax.Precision.DEFAULT,
                         preferred_element_type=jnp.float32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
  with palace.jax.virtual_tpu("v5e", dot_numerics="mxu"):
    differ = dot_bits.ulps(np.asarray(call(a, b)), chip) != 0
  wide = np.zeros((8, 128), bool)
  wide[4:6] = True
  wide[:, 64:96] = True
  assert differ.sum() == 18 and not (differ & ~wide).any()


def test_a_bad_environment_value_is_a_usage_error():
  with pytest.raises(palace.UsageError, match="PALACE_JAX_DOT_NUMERICS='chip': expected mxu .* or blas"):
    activate_from_env({"PALACE_JAX": "v5e", "PALACE_JAX_DOT_NUMERICS": "chip"})


def test_pytest_header_names_the_mode(monkeypatch):
  from palace._src.jax import pytest_plugin
  monkeypatch.setattr(pytest_plugin, "_tpu", lambda: palace.virtual_tpu("v5e", dot_numerics="mxu"))
  assert "PALACE_JAX_DOT_NUMERICS=mxu" in pytest_plugin.pytest_report_header(None)
  monkeypatch.setattr(pytest_plugin, "_tpu", lambda: palace.virtual_tpu("v5e"))
  assert "DOT_NUMERICS" not in pytest_plugin.pytest_report_header(None)
