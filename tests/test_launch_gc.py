"""The cyclic GC is paused while a launch runs (sim/machine.paused_gc) and that is safe: a launch's
own objects form no reference cycles, so the cyclic garbage it leaves does not grow with its steps."""
import gc

import numpy as np
import pytest

import palace as pl
from palace import tpu as pltpu


def _copy_call(n, seen=None):
  def kernel(x_ref, o_ref):
    if seen is not None:
      seen.append(gc.isenabled())
    o_ref[...] = x_ref[...] * 2.0
  x = np.arange(8 * n * 128, dtype=np.float32).reshape(8 * n, 128)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  return f, x


def _pipeline_call(n):
  def inner(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  def kernel(x_hbm, o_hbm):
    pltpu.emit_pipeline(inner, grid=(n,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                        out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(x_hbm, o_hbm)
  x = np.arange(8 * n * 128, dtype=np.float32).reshape(8 * n, 128)
  f = pl.kernel(kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  return f, x


def test_gc_is_paused_inside_a_launch_and_restored_after():
  seen = []
  f, x = _copy_call(2, seen)
  assert gc.isenabled()
  with pl.virtual_tpu("v5e"):
    np.testing.assert_array_equal(f(x), x * 2)
  assert seen == [False, False] and gc.isenabled()


def test_a_collector_switched_off_by_the_user_stays_off():
  f, x = _copy_call(2)
  gc.disable()
  try:
    with pl.virtual_tpu("v5e"):
      f(x)
    assert not gc.isenabled()
  finally:
    gc.enable()


def test_gc_comes_back_after_a_failing_launch():
  def kernel(x_ref, o_ref):
    raise ValueError("boom")
  x = np.ones((8, 128), np.float32)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))
  with pl.virtual_tpu("v5e"), pytest.raises(ValueError, match="boom"):
    f(x)
  assert gc.isenabled()


@pytest.mark.parametrize("make", [_copy_call, _pipeline_call], ids=["pallas_call", "emit_pipeline"])
@pytest.mark.parametrize("trace", [True, False])
def test_cyclic_garbage_of_a_launch_does_not_grow_with_its_steps(make, trace):
  def garbage(n):
    f, x = make(n)
    with pl.virtual_tpu("v5e", trace=trace) as tpu:
      out = f(x)
      gc.collect()
      gc.disable()
      try:
        f(x)
        found = gc.collect()   # what the paused collector would have had to free
      finally:
        gc.enable()
    np.testing.assert_array_equal(out, x * 2 if make is _copy_call else x + 1)
    del tpu
    return found
  # a few hundred objects per launch (its machine, cores, scopes), whatever its length; a per-step
  # cycle would add at least one object per step
  small, big = garbage(128), garbage(1024)
  assert big - small < (1024 - 128) // 4, (small, big)


@pytest.mark.parametrize("make", [_copy_call, _pipeline_call], ids=["pallas_call", "emit_pipeline"])
def test_a_kept_report_does_not_keep_the_launchs_memory_alive(make):
  """Every launch's report stays in `tpu.reports`; its trace names each DMA (a description string),
  so it must not hold the launch's buffers: an output the caller dropped is freed at once, and a loop
  of launches in one virtual_tpu runs in bounded memory (it grew by about an output per launch)."""
  import weakref
  f, x = make(4)
  with pl.virtual_tpu("v5e") as tpu:
    out = f(x)
    np.testing.assert_array_equal(out, x * 2 if make is _copy_call else x + 1)
    dropped = weakref.ref(out.base if out.base is not None else out)
    del out
    gc.collect()
    assert dropped() is None
    dmas = [e for e in tpu.reports[-1].events if e[1] == "dma"]
    assert dmas and all(isinstance(e[5]["copy"], str) and "->" in e[5]["copy"] for e in dmas)


def test_a_reports_dma_descriptions_name_each_block_window():
  """The report's text for each pipeline copy: operand and window, in issue order (whole arrays by
  name only)."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  x = np.ones((16, 256), np.float32)
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  with pl.virtual_tpu("v5e") as tpu:
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(2, 2),
                   in_specs=[spec], out_specs=spec)(x)
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  tiled, whole = ([e[5]["copy"] for e in r.events if e[1] == "dma"] for r in tpu.reports)
  assert tiled == ["args[0][0:8, 0:128] -> args[0] block", "args[0][0:8, 128:256] -> args[0] block",
                   "outputs[0] block -> outputs[0][0:8, 0:128]", "args[0][8:16, 0:128] -> args[0] block",
                   "outputs[0] block -> outputs[0][0:8, 128:256]",
                   "args[0][8:16, 128:256] -> args[0] block", "outputs[0] block -> outputs[0][8:16, 0:128]",
                   "outputs[0] block -> outputs[0][8:16, 128:256]"]
  assert whole == ["args[0] -> args[0] block", "outputs[0] block -> outputs[0]"]


@pytest.mark.parametrize("make", [_copy_call, _pipeline_call], ids=["pallas_call", "emit_pipeline"])
def test_a_kept_reports_events_leave_the_collectors_lists(make):
  """A process keeps every launch's report, so what a report keeps must not be rescanned by each
  cyclic collection: its events, DMA labels included, are plain tuples of names and numbers, which
  the collector stops tracking after the young collections the report survives (an args dict and a
  label object per DMA stayed tracked forever and made full collections ever more frequent). Reading
  the events still gives each DMA its args dict."""
  f, x = make(4)
  with pl.virtual_tpu("v5e") as tpu:
    f(x)
  log = tpu.reports[-1].trace_log
  assert sum(e[1] == "dma" for e in log) == 8
  for _ in range(3):   # (each collection untracks one more level of nested tuples)
    gc.collect()
  assert [e for e in log if gc.is_tracked(e)] == []
  dmas = [e[5] for e in tpu.reports[-1].events if e[1] == "dma"]
  assert all(sorted(a) == ["bytes", "copy"] and a["bytes"] == 8 * 128 * 4 and "->" in a["copy"]
             for a in dmas)


def test_the_collector_stays_paused_until_the_launchs_machine_is_released():
  """The pause covers the machine's making, its report and its release (launch/run.py), so the young
  collection that follows a launch never finds its machine, only the report."""
  from palace._src.launch import host
  f, x = _copy_call(2)
  seen = []
  real = host.release_host_caches

  def release(machine):
    seen.append(gc.isenabled())
    real(machine)
  host.release_host_caches = release
  try:
    with pl.virtual_tpu("v5e"):
      f(x)
  finally:
    host.release_host_caches = real
  assert seen == [False] and gc.isenabled()
