"""The cyclic GC is paused while a launch runs (sim/machine.paused_gc) and that is safe: a launch's
own objects form no reference cycles, so the cyclic garbage it leaves does not grow with its steps."""
import gc

import numpy as np
import pytest

import palace as pl
from benchmarks.kernels import window_copies
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
  gc.collect(0)   # (a DMA's args, names and numbers only, at the first; its event at the next)
  gc.collect(1)
  assert [e for e in log if gc.is_tracked(e)] == []
  dmas = [e[5] for e in tpu.reports[-1].events if e[1] == "dma"]
  assert all(sorted(a) == ["bytes", "copy"] and a["bytes"] == 8 * 128 * 4 and "->" in a["copy"]
             for a in dmas)


@pytest.mark.parametrize("make", [lambda: _copy_call(4), window_copies], ids=["pipeline", "views"])
def test_a_launch_leaves_only_its_report_tracked_after_two_young_collections(make):
  """Counted with gc.get_objects / gc.is_tracked: what a launch leaves for the collector after one
  collection of each young generation is its report, its event list and their dict and list, not its
  events. A DMA event's args hold only names, numbers and Nones (executor.flat_label). Until session
  26 they held the views' dims, nested tuples, and CPython examines a young tuple after the one that
  holds it, so each level of nesting took one more collection: paged attention's ~50 DMA events a
  launch reached the oldest generation tracked (~100 objects a launch) and made its full collections
  come sooner."""
  f, x = make()
  with pl.virtual_tpu("v5e") as tpu:
    f(x)
    gc.collect()
    before = len(gc.get_objects())
    f(x)
    gc.collect(0)
    gc.collect(1)
    left = len(gc.get_objects()) - before
    log = tpu.reports[-1].trace_log
  assert sum(e[1] == "dma" for e in log) >= 8
  assert [e for e in log if gc.is_tracked(e)] == []
  assert left <= 5, left   # (4: the Report, its EventLog, stats dict and list of DMA positions; 12 and 20
  #                            objects before session 26)


def test_a_later_launchs_step_events_leave_the_collectors_lists_at_its_first_young_collection():
  """A core's `(chip, core)` name is one tuple for the process (tensorcore.core_tid), untracked since an
  earlier collection, so the non-DMA events of a later launch (grid steps, vector ops) are untracked by
  the first young collection that sees them. Made anew per launch, the tuple was still tracked when
  that collection examined the events, which reached the next generation tracked (until session 27)."""
  f, x = _copy_call(4)
  with pl.virtual_tpu("v5e") as tpu:
    f(x)
    gc.collect()
    f(x)
    gc.collect(0)
    log = tpu.reports[-1].trace_log
  steps = [e for e in log if e[1] != "dma"]
  assert len(steps) >= 4
  assert steps[0][0] is tpu.reports[0].trace_log[0][0]
  assert [e for e in steps if gc.is_tracked(e)] == []


def test_a_dma_label_is_one_flat_tuple_and_reads_back_as_its_text():
  """executor.flat_label: both sides of a label (a whole view, a view with indexed-away and strided
  dims, a window) as one tuple of atoms, which label_text formats as before."""
  from palace._src.executor import flat_label, label_text

  class Labels(tuple):   # (what a pipeline copy's labels give: both sides' (name, dims, shape))
    def label_parts(self):
      return tuple(self)
  flat = flat_label(Labels(("args[0]", (3, (8, 16, 2), (0, 128, 1)), None, "scratch[1]", (16, 0), (8, 128))))
  assert not [v for v in flat if isinstance(v, (tuple, list, dict))]
  assert label_text(flat) == "args[0][3, 8:40:2, 0:128] -> scratch[1][16:24, 0:128]"
  assert label_text(flat_label(Labels(("a", None, None, "b", (), None)))) == "a -> b[]"


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
