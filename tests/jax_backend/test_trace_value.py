"""pltpu.trace_value under palace.jax (the `trace_value` entry of rules_state.py): the value lands on the
core's timeline, as palace's own pltpu.trace_value puts it; the kernel's outputs are unchanged."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj


def test_trace_value_records_scalars_on_the_timeline():
  x = np.ones((8, 128), np.float32)
  s = np.array([5], np.int32)

  def kernel(x_ref, s_ref, o_ref):
    pltpu.trace_value("constant", jnp.float32(42.5))
    pltpu.trace_value("scale", s_ref[0])
    o_ref[...] = x_ref[...] + s_ref[0].astype(jnp.float32)
  with pj.virtual_tpu("v5e") as tpu:
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
                         in_specs=[pl.BlockSpec(), pl.BlockSpec(memory_space=pltpu.SMEM)])(x, s)
    np.testing.assert_array_equal(np.asarray(out), x + 5)
  events = [(e[2], e[5]["value"]) for e in tpu.reports[-1].events if e[2].startswith("trace_value")]
  assert events == [("trace_value constant", 42.5), ("trace_value scale", 5)]
