"""pltpu.trace_value: a scalar on the core's timeline (an instant event on the scalar lane, what xprof
shows on a TPU), for one scalar op; palace.jax's `trace_value` entry is the same op."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import ShapeError
from palace import tpu as pltpu

_X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def test_trace_value_records_the_value_at_its_point():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2
    pltpu.trace_value("sum", jnp.sum(x_ref[...]))
    pltpu.trace_value("count", jnp.int32(7))
  with pl.virtual_tpu("v5e") as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype))(_X)
  np.testing.assert_array_equal(out, _X * 2)
  events = [e for e in tpu.reports[-1].events if e[2].startswith("trace_value")]
  assert [(e[2], e[5]["value"]) for e in events] == [("trace_value sum", float(_X.sum())),
                                                     ("trace_value count", 7)]
  assert events[0][3] == events[0][4] and events[0][1] == "scalar"


def test_trace_value_takes_a_32_bit_scalar_only():
  def kernel(x_ref, o_ref):
    pltpu.trace_value("row", x_ref[0])
    o_ref[...] = x_ref[...]
  with pytest.raises(ShapeError, match=r"trace_value\('row', \.\.\.\) of float32\[128\]"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype))(_X)
