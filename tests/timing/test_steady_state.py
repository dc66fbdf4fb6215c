"""Steady-state extrapolation of timing-only grids (pipeline_steady.py, sim/steady.py): the report
with it is the report of stepping every grid point, field by field and event by event, and it does
skip steps where the steps repeat."""
import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.errors import SyncError
from matmul_kernel import matmul_kernel as _matmul_kernel

F32 = np.float32


def _run(fn, args, steady, chip="v5e", trace=False, **kw):
  with pl.virtual_tpu(chip, timing_only=True, trace=trace, steady_state=steady, **kw) as tpu:
    fn(*args)
  return tpu.reports[-1], tpu.extrapolated_steps


def _same(fn, *args, chip="v5e", trace=False, **kw):
  """The report with steady state equals the report without it; returns (report, steps skipped)."""
  off, skipped_off = _run(fn, args, False, chip, trace, **kw)
  on, skipped = _run(fn, args, True, chip, trace, **kw)
  assert skipped_off == 0
  a, b = off.as_dict(), on.as_dict()
  assert a.keys() == b.keys()
  for key in a:
    assert a[key] == b[key], key
  assert str(off) == str(on)
  assert list(off.events) == list(on.events)
  assert off.events.stats == on.events.stats
  return on, skipped


def _add(rows, cols, bm=8, bn=128):
  x = np.zeros((rows * bm, cols * bn), F32)
  spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))
  f = pl.pallas_call(lambda x_ref, y_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + y_ref[...]),
                     out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(rows, cols),
                     in_specs=[spec, spec], out_specs=spec)
  return f, x, x


def _matmul(g, b=128, semantics=None):
  x = np.zeros((g * b, g * b), F32)
  params = None if semantics is None else pltpu.CompilerParams(dimension_semantics=semantics)
  f = pl.pallas_call(_matmul_kernel, grid=(g, g, g),
                     in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)),
                               pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
                     out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
                     out_shape=pl.ShapeDtypeStruct(x.shape, F32),
                     scratch_shapes=[pltpu.VMEM((b, b), F32)], compiler_params=params)
  return f, x, x


def test_elementwise_is_extrapolated_exactly():
  report, skipped = _same(*_add(64, 64))
  assert report.grid_steps == 4096
  assert skipped > 3500   # counted: most steps were advanced over, not stepped


@pytest.mark.parametrize("buffers", [1, 3])
def test_buffer_counts(buffers):
  x = np.zeros((64 * 8, 32 * 128), F32)
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j), pipeline_mode=pl.Buffered(buffers))
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., jnp.exp(x_ref[...])),
                     out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(64, 32), in_specs=[spec],
                     out_specs=spec)
  assert _same(f, x)[1] > 1000


def test_matmul_with_pl_when_on_k():
  report, skipped = _same(*_matmul(12))
  assert skipped > 1000 and report.grid_steps == 12 ** 3


def test_row_dependent_work_is_checked_per_template():
  # the body's work depends on the row (axis 0): a period found inside a row is only repeated while
  # the row stays the same
  def body(x_ref, o_ref):
    @pl.when(pl.program_id(0) % 3 == 1)
    def _():
      o_ref[...] = jnp.sin(x_ref[...])

    @pl.when(pl.program_id(0) % 3 != 1)
    def _():
      o_ref[...] = x_ref[...]
  x = np.zeros((12 * 8, 256 * 128), F32)
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(12, 256),
                     in_specs=[spec], out_specs=spec)
  assert _same(f, x)[1] > 1500


def test_a_body_reading_every_index_stops_paying_the_proof(monkeypatch):
  # `pl.when(every program_id == 0)` on a 4-D grid of 4096 steps: the machine repeats every step, the
  # body's reads never provably do (every axis read), so no jump is proved; after FAILED_BOUNDARIES
  # failed boundaries in a row the detector checks half as often (counted: it used to try ~4 earlier
  # steps at each of the 4096 boundaries, 16,268 attempts)
  from palace._src import pipeline_steady
  calls = []
  attempt = pipeline_steady.Detector._attempt
  monkeypatch.setattr(pipeline_steady.Detector, "_attempt",
                      lambda self, *a: calls.append(a[0]) or attempt(self, *a))

  def body(x_ref, o_ref):
    first = functools.reduce(jnp.logical_and, [pl.program_id(d) == 0 for d in range(4)])

    @pl.when(first)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]
  x = np.zeros((8, 128), F32)
  spec = pl.BlockSpec((8, 128), lambda *g: (0, 0))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(8, 8, 8, 8),
                     in_specs=[spec], out_specs=spec)
  report, skipped = _same(f, x)
  assert report.grid_steps == 4096 and skipped == 0
  boundaries = sorted(set(calls))
  assert 64 <= len(boundaries) < 600 and len(calls) < 2000
  assert boundaries[-1] % 32 == 0   # (the late boundaries are checked at a coarser interval)


def test_causal_skip_of_blocks_and_work():
  # lower-triangular: blocks above the diagonal are neither fetched (clamped index) nor computed
  def body(q_ref, k_ref, o_ref):
    @pl.when(pl.program_id(1) <= pl.program_id(0))
    def _():
      o_ref[...] += jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=F32)
  n, b = 24, 128
  q = np.zeros((n * b, b), F32)
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((n * b, b), F32), grid=(n, n),
                     in_specs=[pl.BlockSpec((b, b), lambda i, j: (i, 0)),
                               pl.BlockSpec((b, b), lambda i, j: (jnp.minimum(i, j), 0))],
                     out_specs=pl.BlockSpec((b, b), lambda i, j: (i, 0)))
  _same(f, q, q)


def test_revisited_output_blocks_accumulate():
  # each output row block is revisited along the whole second axis (consecutively)
  def body(x_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]
  x = np.zeros((64 * 8, 128 * 128), F32)
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((64 * 8, 128), F32), grid=(64, 128),
                     in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                     out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, 0)))
  assert _same(f, x)[1] > 4000


def test_non_consecutive_revisit_still_raises_where_stepping_does():
  x = np.zeros((8, 128 * 128), F32)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                     out_shape=pl.ShapeDtypeStruct((8, 2 * 128), F32), grid=(128,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (0, i))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, jnp.where(i == 100, 0, 1))))
  messages = []
  for steady in (False, True):
    with pytest.raises(SyncError, match="Revisited block") as e:
      _run(f, (x,), steady)
    messages.append(str(e.value))
  assert messages[0] == messages[1]


def test_scalar_prefetch_driving_index_maps():
  idx = (np.arange(256, dtype=np.int32) * 7) % 32
  x = np.zeros((32 * 8, 128), F32)

  def body(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(256,),
                                    in_specs=[pl.BlockSpec((8, 128), lambda i, s: (s[i], 0))],
                                    out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((256 * 8, 128), F32), grid_spec=gs)
  _same(f, idx, x)


def test_a_body_reading_smem_is_stepped():
  flags = (np.arange(512) % 5 == 0).astype(np.int32)
  x = np.zeros((512 * 8, 128), F32)

  def body(flag_ref, x_ref, o_ref):
    @pl.when(flag_ref[pl.program_id(0)] == 1)
    def _():
      o_ref[...] = jnp.exp(x_ref[...])

    @pl.when(flag_ref[pl.program_id(0)] == 0)
    def _():
      o_ref[...] = x_ref[...]
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(512,),
                                    in_specs=[pl.BlockSpec((8, 128), lambda i, s: (i, 0))],
                                    out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid_spec=gs)
  assert _same(f, flags, x)[1] == 0


def test_megacore_parallel_grid_on_v5p():
  _same(*_matmul(8, semantics=("parallel", "parallel", "arbitrary")), chip="v5p")


def test_emit_pipeline_in_a_kernel():
  x = np.zeros((64 * 8, 64 * 128), F32)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, F32),
                     mesh=pltpu.TensorCoreMesh("core", 1))
  def k(x_hbm, o_hbm):
    def body(x_ref, o_ref):
      o_ref[...] = jnp.exp(x_ref[...])
    spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(64, 64), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
  assert _same(k, x)[1] > 3000


def test_trace_keeps_the_events_of_stepping():
  # 32,768 steps record more than the 200,000 events a launch's trace keeps: the stepped tail
  # records all of them, the truncation marker included
  report, skipped = _same(*_add(128, 256), trace=True)
  assert skipped > 0
  assert len(report.events) == 200_001


def test_trace_of_a_matmul_and_of_lookahead_copies():
  # a period of two k-sweeps (slot parity), and three block buffers fetched ahead
  report, skipped = _same(*_matmul(32), trace=True)
  assert skipped > 30000
  x = np.zeros((128 * 8, 256 * 128), F32)
  spec = pl.BlockSpec((8, 128), lambda i, j: (i, j), pipeline_mode=pl.Buffered(3))
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                     out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(128, 256), in_specs=[spec],
                     out_specs=spec)
  assert _same(f, x, trace=True)[1] > 30000


def test_data_runs_step_every_point():
  f, x, y = _add(16, 16)
  with pl.virtual_tpu("v5e") as tpu:
    f(x, y)
  assert tpu.extrapolated_steps == 0


def test_option_is_validated():
  with pytest.raises(pl.PalaceError, match="steady_state"):
    pl.virtual_tpu("v5e", steady_state="yes")


def test_random_bits_continuing_across_steps_are_stepped():
  # 0-d random bits are computed in timing-only mode and may steer control flow: a generator seeded
  # at the first step carries its state from step to step, so no step repeats another
  def make():
    seeded = []

    def body(x_ref, o_ref):
      if not seeded:
        pltpu.prng_seed(7)
        seeded.append(True)
      bit = pltpu.prng_random_bits(())

      @pl.when(bit % 2 == 0)
      def _():
        o_ref[...] = jnp.exp(x_ref[...])

      @pl.when(bit % 2 != 0)
      def _():
        o_ref[...] = x_ref[...]
    return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(512,),
                          in_specs=[spec], out_specs=spec)
  x = np.zeros((512 * 8, 128), F32)
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  report, skipped = _same(lambda x: make()(x), x)
  assert skipped == 0
  assert report.unit_busy_cycles["eup"] > 0   # (some steps took the exp branch)


def test_random_bits_seeded_every_step():
  def body(x_ref, o_ref):
    pltpu.prng_seed(pl.program_id(0) % 4)
    bit = pltpu.prng_random_bits(())

    @pl.when(bit % 2 == 0)
    def _():
      o_ref[...] = jnp.exp(x_ref[...])
  x = np.zeros((512 * 8, 128), F32)
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(512,), in_specs=[spec],
                     out_specs=spec)
  _same(f, x)


@st.composite
def _grids(draw):
  rows = draw(st.integers(1, 12))
  cols = draw(st.sampled_from([16, 32, 64, 96]))
  in_map = draw(st.sampled_from(["same", "reversed", "causal", "modulo", "row"]))
  out_revisits = draw(st.booleans())
  buffers = draw(st.sampled_from([None, 1, 2, 3]))
  branch_axis = draw(st.sampled_from([None, 0, 1]))
  modulus = draw(st.integers(2, 5))
  dtype = draw(st.sampled_from([np.float32, jnp.bfloat16]))
  return rows, cols, in_map, out_revisits, buffers, branch_axis, modulus, dtype


@settings(max_examples=25, deadline=None)
@given(_grids())
def test_random_grids_report_as_stepped(case):
  rows, cols, in_map, out_revisits, buffers, branch_axis, modulus, dtype = case
  maps = {"same": lambda i, j: (i, j), "reversed": lambda i, j: (rows - 1 - i, cols - 1 - j),
          "causal": lambda i, j: (i, jnp.minimum(i, j)), "modulo": lambda i, j: (i, j % 3),
          "row": lambda i, j: (i, 0)}
  x = np.zeros((rows * 8, cols * 128), dtype)
  mode = None if buffers is None else pl.Buffered(buffers)

  def body(x_ref, o_ref):
    if branch_axis is not None:
      @pl.when(pl.program_id(branch_axis) % modulus == 1)
      def _():
        o_ref[...] = jnp.exp(x_ref[...].astype(F32)).astype(o_ref.dtype)

      @pl.when(pl.program_id(branch_axis) % modulus != 1)
      def _():
        o_ref[...] = x_ref[...]
    else:
      o_ref[...] = x_ref[...] * 2
  out_map = (lambda i, j: (i, 0)) if out_revisits else (lambda i, j: (i, j))
  out_cols = 1 if out_revisits else cols
  f = pl.pallas_call(body, grid=(rows, cols),
                     out_shape=pl.ShapeDtypeStruct((rows * 8, out_cols * 128), dtype),
                     in_specs=[pl.BlockSpec((8, 128), maps[in_map], pipeline_mode=mode)],
                     out_specs=pl.BlockSpec((8, 128), out_map))
  _same(f, x, trace=True)


def test_copies_the_body_issues_itself():
  # an ANY operand the body copies from at the row of its grid row: its copies are timed in the
  # period like the pipeline's (with a trace, their events are not moved: the tail is stepped)
  def body(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(pl.program_id(0) * 8, 8)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] * 2
  x = np.zeros((4 * 8, 128), F32)
  f = pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((4 * 8, 256 * 128), F32), grid=(4, 256),
                     in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     out_specs=pl.BlockSpec((8, 128), lambda r, i: (r, i)),
                     scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA])
  assert _same(f, x)[1] > 500
  _same(f, x, trace=True)
