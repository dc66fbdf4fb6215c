"""Prepared copies (lang/tpu_primitives.PreparedCopy): the one way a DMA request is built, by user
descriptors and by the pipeline alike; a prepared copy restarts without re-resolving anything."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.lang.tpu_primitives import PreparedCopy


def _run(kernel, x, *, block, grid, params=None):
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                     in_specs=[pl.BlockSpec(block, lambda i, j: (i, j))],
                     out_specs=pl.BlockSpec(block, lambda i, j: (i, j)), compiler_params=params)
  with pl.virtual_tpu("v5e", trace=True) as tpu:
    y = f(x)
  return y, tpu.reports[-1]


def _events(report):
  """The trace with each copy named by its description (source and destination windows)."""
  return [e[:5] + ({k: str(v) for k, v in e[5].items()} if isinstance(e[5], dict) else e[5],)
          for e in report.events]


def _double(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0


@pytest.mark.parametrize("shape", [(64, 256), (60, 250)], ids=["whole", "ragged"])
def test_pipeline_fast_block_copies_equal_the_view_copies(shape):
  """Whole blocks take prepare_window_copy (no views); with bounds checks off the pipeline builds
  views and AsyncCopyDescriptor.prepare(): both must give the same timeline, labels and data."""
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  fast, rf = _run(_double, x, block=(8, 128), grid=(8, 2))
  views, rv = _run(_double, x, block=(8, 128), grid=(8, 2),
                   params=pltpu.CompilerParams(disable_bounds_checks=True))
  np.testing.assert_array_equal(fast, 2 * x)
  np.testing.assert_array_equal(views, 2 * x)
  assert rf.device_cycles == rv.device_cycles
  assert _events(rf) == _events(rv)
  assert rf.dma_count == rv.dma_count == 32


def test_a_prepared_copy_restarts_like_fresh_descriptors():
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  out = pl.ShapeDtypeStruct((8, 128), np.float32)
  scratch = [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA]

  def prepared(x_hbm, o_hbm, buf, sem):
    c = pltpu.make_async_copy(x_hbm, buf, sem).prepare()
    assert isinstance(c, PreparedCopy)
    for _ in range(3):
      c.start()
      c.wait()
    pltpu.sync_copy(buf, o_hbm)

  def fresh(x_hbm, o_hbm, buf, sem):
    for _ in range(3):
      c = pltpu.make_async_copy(x_hbm, buf, sem)
      c.start()
      c.wait()
    pltpu.sync_copy(buf, o_hbm)

  reports = []
  for body in (prepared, fresh):
    f = pl.pallas_call(body, out_shape=out, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                       out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=scratch)
    with pl.virtual_tpu("v5e") as tpu:
      np.testing.assert_array_equal(f(x), x)
    reports.append(tpu.reports[-1])
  assert reports[0].device_cycles == reports[1].device_cycles
  assert reports[0].dma_count == reports[1].dma_count == 4
