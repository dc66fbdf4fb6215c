"""pl.delay: the scalar core sleeps whole cycles; units, DMAs and other work in flight go on."""
import numpy as np
import pytest

import palace as pl
from palace import UsageError
from palace import tpu as pltpu

_X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)


def _cycles(kernel, chip="v5e", **kw):
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype), **kw)(_X)
  np.testing.assert_array_equal(out, _X)
  return tpu.reports[-1].device_cycles


def _copy(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def test_a_delay_adds_its_cycles_rounded_up_to_the_clock():
  def slept(nanos):
    def kernel(x_ref, o_ref):
      pl.delay(nanos)
      o_ref[...] = x_ref[...]
    return kernel
  base = _cycles(_copy)
  assert _cycles(slept(1000)) - base == 1500        # 1 us at v5e's 1.5 GHz
  assert _cycles(slept(1)) - base == 2              # 1.5 cycles, rounded up
  assert _cycles(slept(0)) == base
  assert _cycles(slept(1000), chip="v6e") - _cycles(_copy, chip="v6e") == 1750
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(slept(1), out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype))(_X)
  (sleep,) = [e for e in tpu.reports[-1].events if e[2] == "delay"]
  assert sleep[4] - sleep[3] == 2 and type(sleep[4]) is int   # whole cycles: the clock stays an int


def test_a_delay_overlaps_a_copy_in_flight():
  """A 2 us sleep (3000 cycles) while a DMA flies: the copy's time hides under the sleep, so the kernel
  grows by less than the sleep (but by more than the sleep minus the whole kernel without it)."""
  def run(nanos):
    def kernel(x_ref, o_ref, buf, sem):
      copy = pltpu.make_async_copy(x_ref, buf, sem)
      copy.start()
      if nanos:
        pl.delay(nanos)
      copy.wait()
      o_ref[...] = buf[...]
    return _cycles(kernel, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                   scratch_shapes=[pltpu.VMEM(_X.shape, _X.dtype), pltpu.SemaphoreType.DMA])
  plain, slept = run(0), run(2000)
  assert 3000 - plain < slept - plain < 3000


def test_a_runtime_delay_and_a_negative_one():
  def kernel(n_ref, x_ref, o_ref):
    pl.delay(n_ref[0])
    o_ref[...] = x_ref[...]
  spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                      in_specs=[pl.BlockSpec((8, 128), lambda i, n: (0, 0))],
                                      out_specs=pl.BlockSpec((8, 128), lambda i, n: (0, 0)))
  with pl.virtual_tpu("v5e") as tpu:
    call = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype), grid_spec=spec)
    call(np.array([0], np.int32), _X)
    call(np.array([200], np.int32), _X)
    assert tpu.reports[1].device_cycles - tpu.reports[0].device_cycles == 300
    with pytest.raises(UsageError, match=r"pl.delay\(-5\): a delay is a non-negative number"):
      call(np.array([-5], np.int32), _X)
