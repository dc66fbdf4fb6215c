"""palace's own VirtualTPU(host_math=True): the diagnostic that evaluates a kernel's transcendentals by
XLA:CPU through JAX (lang/host_math.py; palace.jax's side: tests/jax_backend/test_host_math.py). Without
JAX nothing computes what XLA:CPU computes, so the switch is refused."""
import importlib.util

import numpy as np
import pytest

import palace
import palace.numpy as pnp


def test_without_jax_the_diagnostic_is_refused(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jax" else real(name, *a))
  with pytest.raises(palace.UnsupportedError, match=r"host_math=True\): the diagnostic evaluates a kernel's "
                                                    r"transcendentals by XLA:CPU through JAX, which is not "
                                                    r"installed here. Fix: install jax"):
    palace.virtual_tpu("v5e", host_math=True)


def test_off_by_default_the_chips_rule():
  x = np.linspace(-10, 10, 8 * 128, dtype=np.float32).reshape(8, 128)

  def kernel(x_ref, o_ref):
    o_ref[...] = pnp.exp(x_ref[...])
  call = palace.pallas_call(kernel, out_shape=palace.ShapeDtypeStruct((8, 128), np.float32))
  with palace.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(np.asarray(call(x)), np.exp(x))
  assert not tpu.host_math and not tpu.reports[-1].host_math
  with pytest.raises(palace.UsageError, match="host_math"):
    palace.virtual_tpu("v5e", host_math="yes")
