"""`interpret=pltpu.InterpretParams(...)` adjusts the launch's virtual TPU (palace always simulates)."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def _racy(x_hbm, o_hbm, buf, sem):
  c = pltpu.make_async_copy(x_hbm, buf, sem)
  c.start()
  buf[...] = buf[...] + 1.0      # BUG: writes the DMA destination before its wait
  c.wait()
  pltpu.sync_copy(buf, o_hbm)


def _kernel(interpret):
  return pl.kernel(_racy, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                   mesh=pltpu.TensorCoreMesh("core", 1),
                   scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA],
                   interpret=interpret)


def test_detect_races_from_interpret_params_and_report_reaches_the_active_context():
  x = np.ones((8, 128), np.float32)
  with pl.virtual_tpu("v6e") as tpu:
    _kernel(False)(x)                                        # not checked: runs
    with pytest.raises(pl.RaceError):
      _kernel(pltpu.InterpretParams(detect_races=True))(x)
    f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                       out_shape=pl.ShapeDtypeStruct((8, 128), np.float32),
                       interpret=pltpu.InterpretParams(dma_execution_mode="on_wait"))
    np.testing.assert_array_equal(f(x), 2 * x)
  assert [r.chip.name for r in tpu.reports] == ["v6e", "v6e"]


def test_zero_initialised_memory_is_not_supported():
  with pytest.raises(pl.UnsupportedError,
                     match=r"uninitialized_memory='zero'.*of kernel '_racy', called at "
                           r"test_interpret_params.py:\d+\) .*drop the option"):
    _kernel(pltpu.InterpretParams(uninitialized_memory="zero"))(np.ones((8, 128), np.float32))
