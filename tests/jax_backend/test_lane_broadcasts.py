"""palace.jax charges lane broadcasts as palace does (docs/timing-model.md 1.4): JAX 0.12 keeps a
(N, 1) column's broadcast inside the elementwise equation (`mul a:f32[8,128] b:f32[8,1]`), which
palace.jax runs through its compiled equation forms; a loaded column costs an XLU lane broadcast there
too, a lane reduction's result none."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

import palace.jax as pj


def _xlu_ops(kernel, *args):
  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32)))
  with pj.virtual_tpu("v5e", trace=True) as tpu:
    out = f(*args)
  return np.asarray(out), [e[2] for e in tpu.reports[-1].events if e[1] == "xlu"]


def test_a_loaded_column_in_an_elementwise_op_is_a_lane_broadcast():
  x = (np.arange(8 * 128, dtype=np.float32).reshape(8, 128) % 11) * 0.5
  c = np.arange(8, dtype=np.float32).reshape(8, 1)

  def scale(x_ref, c_ref, o_ref):
    o_ref[...] = x_ref[...] * (c_ref[...] * 2.0 + 1.0)

  out, ops = _xlu_ops(scale, x, c)
  np.testing.assert_array_equal(out, x * (c * 2 + 1))
  assert ops == ["lane_broadcast"]


def test_a_lane_reduction_broadcasts_back_without_the_xlu():
  x = (np.arange(8 * 128, dtype=np.float32).reshape(8, 128) % 11) * 0.5

  def sub_max(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = v - jnp.max(v, axis=-1, keepdims=True) * 0.5

  out, ops = _xlu_ops(sub_max, x)
  np.testing.assert_array_equal(out, x - x.max(-1, keepdims=True) * 0.5)
  assert ops == ["reduce_lane"]
