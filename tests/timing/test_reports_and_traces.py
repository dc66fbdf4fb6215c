"""Report contract, Perfetto export, determinism, timing-only mode and plots."""
import json

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.sim.report_plots import plot_roofline

from timing_helpers import run_add, run_matmul


def _png_size(path):
  with open(path, "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n"
  return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_report_contract_and_summary():
  r = run_matmul("v5e", 512, 128, 128, 128, timing_only=False)
  assert r.device_time_s > 0 and r.launch_overhead_s > 0
  text = str(r)
  for needle in ("device time", "TFLOP/s", "% of bf16 peak", "HBM traffic", "% of HBM bandwidth",
                 "bound", "VMEM peak", "launch overhead", "DMA traffic", "hbm->vmem", "unit busy"):
    assert needle in text, needle
  assert r.vmem_peak_bytes == 2 * (2 * 128 * 128 * 2) + 2 * 128 * 128 * 2 + 128 * 128 * 4
  d = r.as_dict()
  assert d["device_cycles"] == r.device_cycles and d["bound"] == r.bound


def test_perfetto_trace_is_valid_chrome_json(tmp_path):
  r = run_matmul("v5e", 256, 128, 128, 128, timing_only=False)
  path = r.to_perfetto(tmp_path / "trace.json")
  data = json.loads(open(path).read())
  events = data["traceEvents"]
  assert data["otherData"]["kernel"] == "matmul_kernel" and data["otherData"]["chip"] == "v5e"
  procs = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
  assert [p["pid"] for p in procs] == [0]                     # one process per chip
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
  names = set(threads.values())
  assert {"core 0 scalar core", "core 0 DMA engines", "core 0 MXU", "core 0 vector load"} <= names
  assert len(names) == len(threads)                           # one thread per unit per core
  spans = [e for e in events if e["ph"] == "X"]
  assert spans and all(e["dur"] >= 0 and e["name"] and (e["pid"], e["tid"]) in threads for e in spans)
  assert {e["cat"] for e in spans} >= {"dma", "mxu", "scalar", "vld", "vst"}
  end_us = max(e["ts"] + e["dur"] for e in spans)
  assert abs(end_us - r.device_time_s * 1e6) < 1e-3


def test_multichip_like_traces_have_one_process_per_chip():
  from palace._src.sim.trace import to_chrome_trace
  events = [((0, 0), "dma", "hbm->vmem", 0, 10, None), ((1, 0), "mxu", "matmul", 5, 20, None),
            ((1, 1), "mxu", "matmul", 5, 20, None)]
  data = to_chrome_trace(events, 1e9, "k")
  procs = {e["pid"] for e in data["traceEvents"] if e["name"] == "process_name"}
  threads = {(e["pid"], e["tid"]) for e in data["traceEvents"] if e["name"] == "thread_name"}
  assert procs == {0, 1} and len(threads) == 3


def test_same_run_twice_gives_identical_reports(tmp_path):
  a = run_matmul("v5e", 512, 256, 128, 128, timing_only=False)
  b = run_matmul("v5e", 512, 256, 128, 128, timing_only=False)
  assert a.as_dict() == b.as_dict()
  assert [e[:5] for e in a.events] == [e[:5] for e in b.events]
  pa, pb = a.to_perfetto(tmp_path / "a.json"), b.to_perfetto(tmp_path / "b.json")
  assert open(pa).read() == open(pb).read()


def test_dma_policies_do_not_change_timing():
  cycles = set()
  for policy in ("eager", "on_wait", "random"):
    x = np.ones((1024, 512), np.float32)
    with pl.virtual_tpu("v5e", dma_policy=policy, seed=3) as tpu:
      out = pl.pallas_call(lambda a, b, o: o.__setitem__(..., a[...] + b[...]),
                           out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                           in_specs=[pl.BlockSpec((256, 512), lambda i: (i, 0))] * 2,
                           out_specs=pl.BlockSpec((256, 512), lambda i: (i, 0)))(x, x)
    np.testing.assert_array_equal(out, 2 * x)
    cycles.add(tpu.reports[-1].device_cycles)
  assert len(cycles) == 1


def test_timing_only_gives_the_same_timeline_without_the_math():
  full = run_matmul("v5e", 512, 128, 256, 128, timing_only=False)
  fast = run_matmul("v5e", 512, 128, 256, 128, timing_only=True)
  assert fast.timing_only and not full.timing_only
  a, b = full.as_dict(), fast.as_dict()
  a.pop("timing_only"), b.pop("timing_only")
  assert a == b


def test_timing_only_skips_payloads_but_runs_scalar_work():
  def k(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  idx = np.array([3, 0, 2, 1], np.int32)
  x = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(4,),
      in_specs=[pl.BlockSpec((8, 128), lambda i, idx_ref: (idx_ref[i], 0))],
      out_specs=pl.BlockSpec((8, 128), lambda i, idx_ref: (i, 0)))
  call = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=grid_spec)
  with pl.virtual_tpu("v5e") as tpu:
    full = call(idx, x)
  with pl.virtual_tpu("v5e", timing_only=True) as tpu2:
    fast = call(idx, x)
  np.testing.assert_array_equal(full, np.concatenate([2 * x[8 * j:8 * j + 8] for j in idx]))
  assert not np.array_equal(fast, full)          # no payloads moved, no vector math done
  assert tpu.reports[-1].device_cycles == tpu2.reports[-1].device_cycles
  assert tpu.reports[-1].dma_count_by_direction == tpu2.reports[-1].dma_count_by_direction


def test_plot_timeline_png_size(tmp_path):
  r = run_matmul("v5e", 256, 128, 128, 128, timing_only=False)
  path = r.plot_timeline(tmp_path / "timeline.png", width_px=800, height_px=400)
  assert _png_size(path) == (800, 400)
  lanes = len({(e[0], e[1]) for e in r.events})
  path = r.plot_timeline(tmp_path / "timeline2.png")
  assert _png_size(path) == (1600, 120 + 60 * lanes)


def test_plot_roofline_png_size(tmp_path):
  reports = [run_matmul("v5e", 512, 128, 128, 128), run_matmul("v5e", 1024, 512, 1024, 1024),
             run_add("v5e", 1024, 256)[0], run_matmul("v6e", 1024, 512, 1024, 1024)]
  path = plot_roofline(reports, tmp_path / "roofline.png", width_px=1000, height_px=700)
  assert _png_size(path) == (1000, 700)
  assert _png_size(plot_roofline(reports[:1], tmp_path / "r2.png")) == (1200, 800)


def test_timing_only_outputs_take_no_host_memory():
  """A timing-only launch's outputs are shape and dtype only: a 1 GiB out_shape is a read-only
  broadcast of the uninitialised value (NaN), not an allocation; the modelled time is unchanged."""
  import tracemalloc

  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  rows = 2**18   # (2**18, 1024) f32 = 1 GiB
  x = np.ones((8, 1024), np.float32)
  f = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((rows, 1024), np.float32), grid=(4,),
                     in_specs=[pl.BlockSpec((8, 1024), lambda i: (0, 0))],
                     out_specs=pl.BlockSpec((8, 1024), lambda i: (i, 0)))
  tracemalloc.start()
  try:
    with pl.virtual_tpu("v5e", timing_only=True, trace=False) as tpu:
      out = f(x)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 16 * 2**20
  assert out.shape == (rows, 1024) and out.dtype == np.float32 and out.strides == (0, 0)
  assert np.isnan(out[123, 45]) and not out.flags.writeable
  assert tpu.reports[-1].grid_steps == 4
