"""Host work per grid step of a K-tiled matmul (issue 35), counted, never timed: the Python calls one
launch makes (sys.setprofile), so the figures hold on any machine however busy. The kernel is the
tiled f32 matmul of issue 35's table (3-D grid, f32 accumulator scratch, pl.when init/finalize on k)
at 1024^3 with 256 blocks: 64 grid steps, 128 block DMAs in, 16 write-backs, 16 deferred K sums."""
import collections
import sys

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from benchmarks.kernels import tiled_matmul, window_copies
from palace._src import blas
from palace._src.lang import mxu, primitives, refs

STEPS = 64


@pytest.fixture
def one_thread(monkeypatch):
  """No BLAS controller: the launch's products and panel conversions all run on the calling thread
  (blas.py), so every Python call is seen by the profiler, in the same order every run."""
  monkeypatch.setattr(blas, "_controllers", [])


def _counted(run):
  """(run(), Counter of code object -> Python calls made by that call), after a first call of `run`
  (which warms the caches)."""
  run()
  calls = collections.Counter()

  def profile(frame, event, arg):
    if event == "call":
      calls[frame.f_code] += 1
  sys.setprofile(profile)
  try:
    out = run()
  finally:
    sys.setprofile(None)
  return out, calls


def _counted_launch():
  """(output, Counter of code object -> calls) of the second of two identical launches."""
  x = (np.arange(1024 * 1024) % 7 - 3).reshape(1024, 1024).astype(np.float32)

  def run():
    with pl.virtual_tpu("v5e"):
      return tiled_matmul(x, x, 256)
  z, calls = _counted(run)
  np.testing.assert_array_equal(z, x @ x)   # (small integers: exact in bf16 and in any summation order)
  return z, calls


def test_a_k_tiled_matmul_step_makes_few_python_calls(one_thread):
  _, calls = _counted_launch()
  per_step = sum(calls.values()) / STEPS
  # 190.6 calls a step (launch and end-of-launch GEMM bookkeeping included) until session 24, 158.1
  # after it (156.4 counted here); session 25: every load, store and pl.when calls its one function
  # (+6.75 a step), a borrowed block's owners are found without a frame per lender (-8), the bf16
  # rounding's NaN test and the dot's operand conversion make fewer calls: 153.6; session 33: v5e's
  # measured rules (the step's index-map charge, the latency-form DMA wait, the write-back waited a
  # step later) add ~3.4: 157.0; session 35: v5e's stream rule (dma_sequential_no_overhead) looks up
  # each copy's stream (one call a copy, its tile span found once a request): 160.1; session 37's MXU
  # and arbiter rules add no call on this path's every step (159.97); session 38's bare-start rule
  # (dma_issue_bare_cycles) marks each grid step's basic block: one call a step (161.0)
  assert per_step <= 161.5, per_step
  # jnp.dot's precision and result-type checks run once per kernel signature, not per step
  assert calls[mxu.precision_of.__code__] == 0 and calls[mxu.check.__code__] == 0


def test_loads_stores_and_when_each_make_one_cheap_call(one_thread):
  """A ref access finds what it reads or writes in Ref._target, pl.when tests its condition in
  primitives._truth: one call each, every time (no copy of their common case in the callers), and
  whole-ref accesses and bool-scalar conditions take their first branch: no index is composed, no
  view made, no value made concrete."""
  _, calls = _counted_launch()
  accesses = calls[refs.Ref.__getitem__.__code__] + calls[refs.Ref.__setitem__.__code__]
  assert accesses >= 4 * STEPS
  assert calls[refs.Ref._target.__code__] == accesses
  assert calls[primitives._truth.__code__] == calls[primitives.when.__code__] == 2 * STEPS
  for cost in (refs.Ref._compose, refs.Ref._view, primitives.concrete_value):
    assert calls[cost.__code__] == 0, cost
  assert calls[refs.Ref.__init__.__code__] <= 16   # (the launch's own refs, 13; none per step)


def test_a_manual_dma_start_makes_few_python_calls():
  """make_async_copy(...).start() of an HBM window into a VMEM slot: the descriptor is marked used
  once (by prepare) and the HBM tile-padding test makes no generator frame (session 25: 31 -> 24
  calls a start in JAX's paged attention)."""
  from palace._src.lang import hbm_tiles, tpu_primitives
  n, rows = 8, 16
  f, x = window_copies(n, rows)
  with pl.virtual_tpu("v5e"):
    out, calls = _counted(lambda: f(x))
  np.testing.assert_array_equal(out, x.reshape(n, rows, 128).sum(axis=0))
  assert calls[tpu_primitives.AsyncCopyDescriptor._used.__code__] == n
  assert calls[hbm_tiles.beyond.__code__] == 2 * n
  assert not [c for c in calls if c.co_name == "<genexpr>" and c.co_filename == hbm_tiles.__file__]
  # `ref.at` makes its indexer with one call, the indexer's own (session 27: a lambda frame before it)
  assert refs.Ref.at.fget is refs._AtIndexer
  at_lambdas = [c for c in calls if c.co_name == "<lambda>" and c.co_filename == refs.__file__ and
                "_AtIndexer" in c.co_names]
  assert at_lambdas == [] and calls[refs._AtIndexer.__init__.__code__] == n   # (one .at a copy)


def test_a_transcendental_asks_for_the_host_math_diagnostic_without_a_call():
  """Inside a kernel an elementwise transcendental reads the launch's host-math setting from the
  executor it holds and runs the chip's rule directly: no call of host_math.pick's wrapper or of
  host_math.active per op (two a transcendental until session 27). The result is the chip rule's."""
  from palace._src.lang import host_math

  def kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = jnp.exp(x) + jnp.tanh(x) * jnp.sqrt(jnp.abs(x))
  x = np.linspace(-3, 3, 4 * 8 * 128, dtype=np.float32).reshape(32, 128)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pl.virtual_tpu("v5e"):
    out, calls = _counted(lambda: f(x))
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(out, np.exp(x) + np.tanh(x) * np.sqrt(np.abs(x)))
  assert calls[host_math.active.__code__] == 0
  assert not [c for c in calls if c.co_filename == host_math.__file__]


def test_a_pipeline_block_copy_takes_its_stream_span_and_runs_from_its_block_plan():
  """v5e times a copy's HBM side by its tile span (dma_sequential_no_overhead) and contiguous runs
  (dma_run_overhead_bytes). A pipeline's whole-block copy carries its block's offsets
  (DmaRequest.hbm_block), and the machine computes both from the block's plan, once per (array, block)
  shape (sim/dma.block_plan), not from each window (session 36: tile_range and window_runs on every
  copy were ~11 of a 4096-step copy kernel's 75 us a step)."""
  from palace._src.sim import dma
  n = 64
  x = np.arange(8 * n * 128, dtype=np.float32).reshape(8 * n, 128)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2.0),
                     out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))

  def run():
    with pl.virtual_tpu("v5e"):
      return f(x)
  out, calls = _counted(run)
  np.testing.assert_array_equal(out, x * 2)
  assert calls[dma.block_span.__code__] == 2 * n   # (each copy's span, in and out)
  assert calls[dma.tile_range.__code__] == calls[dma.window_runs.__code__] == 0
