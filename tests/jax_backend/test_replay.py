"""Replayed launches (sim/replay.py, jax/schedule.py): a repeated palace.jax launch whose schedule the
kernel's jaxpr proves data-independent computes its data on an untimed core and reuses the first
launch's report. Every test compares with `replay=False` (every launch on the full machine): same
outputs, same reports; and kernels whose schedule follows their data are never replayed."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import jax_parity_harness as harness
from prefetch_kernels import skip_matmul
import palace as ppl
import palace.jax as pj
from palace._src.jax.registry import sub_jaxprs
from palace._src.jax.schedule import replay_blocker


def _figures(r):
  return (r.kernel_name, r.num_chips, r.device_cycles, r.flops, r.hbm_bytes, dict(r.unit_busy_cycles), r.vmem_peak_bytes,
          r.grid_steps, r.dma_count, r.stats, [e[:5] for e in r.events])


def _launches(calls, chip="v5e", **options):
  """Run `calls` [(fn, args)] in order on one virtual TPU: (outputs, reports, replayed launches); the
  launches replayed on the one kept from the last launch with their key go to `_WARM_HITS`."""
  with pj.virtual_tpu(chip, **options) as tpu:
    outs = [jax.tree.map(np.asarray, fn(*args)) for fn, args in calls]
  _WARM_HITS[0] = tpu.replays.warm_hits if tpu.replays is not None else 0
  return outs, [_figures(r) for r in tpu.reports], (tpu.replays.hits if tpu.replays is not None else 0)


_WARM_HITS = [0]


def _same_as_full_machine(calls, chip="v5e", **options):
  outs, reports, hits = _launches(calls, chip, **options)
  warm = _WARM_HITS[0]
  ref_outs, ref_reports, _ = _launches(calls, chip, replay=False, **options)
  _WARM_HITS[0] = warm
  for a, b in zip(jax.tree.leaves(outs), jax.tree.leaves(ref_outs)):
    np.testing.assert_array_equal(a, b)
  assert reports == ref_reports
  return outs, reports, hits


def _kernel_jaxpr(fn, *args):
  """The kernel jaxpr of the (first) pallas_call `fn` makes."""
  def find(j):
    for e in j.eqns:
      if e.primitive.name == "pallas_call":
        return e.params["jaxpr"]
      for sub in sub_jaxprs(e):
        hit = find(sub)
        if hit is not None:
          return hit
    return None
  return find(jax.make_jaxpr(fn)(*args).jaxpr)


# ------------------------------------------------------------------ kernels
def _mm_kernel(x_ref, y_ref, z_ref, acc_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


@functools.partial(jax.jit, static_argnames=["semantics"])
def matmul(x, y, semantics=("arbitrary", "arbitrary", "arbitrary")):
  return pl.pallas_call(
      _mm_kernel, grid=(2, 2, 2),
      in_specs=[pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
                pl.BlockSpec((128, 128), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
      out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))(x, y)


def _branch_on_data(x_ref, o_ref):
  o_ref[...] = x_ref[...]

  @pl.when(x_ref[0, 0] > 0)   # a loaded value decides: the schedule follows the data
  def _():
    o_ref[...] = jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.float32)


branch_on_data = jax.jit(lambda x: pl.pallas_call(
    _branch_on_data, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x))


def _loop_on_data(x_ref, o_ref):
  n = x_ref[0, 0].astype(jnp.int32)
  _, acc = lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.5 + 1.0),
                          (jnp.int32(0), x_ref[...]))
  o_ref[...] = acc


loop_on_data = jax.jit(lambda x: pl.pallas_call(
    _loop_on_data, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32))(x))


def _window_from_data(x_ref, o_ref):
  start = x_ref[0, 0].astype(jnp.int32)
  o_ref[...] = x_ref[pl.ds(start, 8), :]


def _counter_kernel(step_ref, x_ref, o_ref):
  step_ref[0] = step_ref[0] + 1   # a clean value stored into a keyed ref keeps it keyed (paged attention)

  @pl.when(step_ref[0] > 1)
  def _():
    o_ref[...] = x_ref[...] * 2.0


def _store_data_in_prefetch(step_ref, x_ref, o_ref):
  step_ref[0] = x_ref[0, 0].astype(jnp.int32)   # loaded data into a keyed ref: it stops being keyed

  @pl.when(step_ref[0] > 1)
  def _():
    o_ref[...] = x_ref[...] * 2.0


def _prefetch_call(kernel):
  return jax.jit(lambda s, x: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(2,),
          in_specs=[pl.BlockSpec((8, 128), lambda i, s: (i, 0))],
          out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0))))(s, x))


RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.integers(-4, 5, (256, 256)), jnp.float32)
Y = jnp.asarray(RNG.integers(-4, 5, (256, 256)), jnp.float32)
XS = jnp.asarray(RNG.integers(-4, 5, (512, 128)), jnp.float32)
X16 = jnp.asarray(RNG.integers(-4, 5, (16, 128)), jnp.float32)


# ------------------------------------------------------------------ replayed, and right
def test_a_repeated_launch_is_replayed_with_the_full_machines_outputs_and_report():
  outs, reports, hits = _same_as_full_machine([(matmul, (X, Y))] * 3)
  assert hits == 2
  assert reports[0] == reports[1] == reports[2]
  np.testing.assert_array_equal(outs[2], np.asarray(X) @ np.asarray(Y))   # integer-valued: exact


def test_a_new_operand_value_is_computed_not_remembered():
  x2 = X + 1.0
  outs, _, hits = _same_as_full_machine([(matmul, (X, Y)), (matmul, (x2, Y))])
  assert hits == 1
  np.testing.assert_array_equal(outs[1], np.asarray(x2) @ np.asarray(Y))


def test_a_kept_launch_computes_each_launchs_operands():
  """From the third launch on, a replayed launch runs on the core, refs, pipeline and buffers kept from
  the last one (launch/run.py `_Warm`): every launch's own operands, earlier outputs left alone."""
  xs = [X, X + 1.0, X - 2.0, X]
  outs, _, hits = _same_as_full_machine([(matmul, (x, Y)) for x in xs])
  assert hits == 3 and _WARM_HITS[0] == 2
  for x, out in zip(xs, outs):
    np.testing.assert_array_equal(out, np.asarray(x) @ np.asarray(Y))


def _read_scratch_then_write(x_ref, o_ref, acc_ref):
  o_ref[...] = acc_ref[...] + x_ref[...]   # step 0: the scratch was never written: NaN in every launch
  acc_ref[...] = x_ref[...]


def _read_block_then_write(x_ref, o_ref):
  # the output block was never written: NaN, so x (what an earlier launch left there would give -1)
  o_ref[...] = jnp.where(jnp.isnan(o_ref[...]), x_ref[...], -1.0)


@pytest.mark.parametrize("kernel,scratch", [(_read_scratch_then_write, [pltpu.VMEM((8, 128), jnp.float32)]),
                                            (_read_block_then_write, [])])
def test_a_kept_launch_starts_from_never_written_memory(kernel, scratch):
  """What a launch leaves in scratch and block buffers never reaches the next one: reads before the
  first write see the uninitialised value (NaN) in every launch, kept or not."""
  f = jax.jit(lambda x: pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
      in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
      scratch_shapes=scratch)(x))
  xs = [X16 + k for k in range(4)]
  outs, _, hits = _same_as_full_machine([(f, (x,)) for x in xs])
  assert hits == 3 and _WARM_HITS[0] == 2
  for x, out in zip(xs, outs):
    if scratch:   # step 0 reads the never-written scratch; step 1 what step 0 wrote
      assert np.isnan(out[:8]).all()
      np.testing.assert_array_equal(out[8:], np.asarray(x[:8] + x[8:]))
    else:
      np.testing.assert_array_equal(out, np.asarray(x))


def test_a_kept_launch_keeps_no_array_of_the_launches_it_ran():
  """Between launches the kept state holds no operand or output array (parked), so it does not keep
  a launch's arrays alive."""
  with pj.virtual_tpu("v5e") as tpu:
    for x in (X, X + 1.0, X + 2.0):
      np.testing.assert_array_equal(np.asarray(matmul(x, Y)), np.asarray(x) @ np.asarray(Y))
    (kept,) = [e[2] for e in tpu.replays._entries.values()]
  assert tpu.replays.warm_hits == 1
  bufs = kept.program.in_bufs + kept.out_bufs
  assert len(bufs) == 3 and all(b._storage is None for b in bufs)
  assert kept.program.launch is None


def test_scalar_prefetch_values_key_the_replay():
  a, b = jnp.array([1, 0, 1, 1], jnp.int32), jnp.ones(4, jnp.int32)
  calls = [(skip_matmul, (a, XS)), (skip_matmul, (b, XS))] * 4
  _, reports, hits = _same_as_full_machine(calls)
  assert hits == 6                         # from the third launch on
  assert _WARM_HITS[0] == 4                # from the fifth on, each key's own kept launch
  assert reports[0][2] != reports[1][2]    # the flags change the modelled time
  assert reports[2::2] == [reports[0]] * 3 and reports[3::2] == [reports[1]] * 3


def test_a_kept_pipeline_plays_its_recorded_schedule(monkeypatch):
  """The first run of a kept launch records its pipeline's schedule; later runs play it instead of
  deciding it again (pipeline.Pipeline): the step loop runs for the full machine's launch, the first
  replay and the recording run only, and every launch computes its own operands."""
  from palace._src import pipeline
  calls, steps = [0], pipeline._steps

  def counted(*args):
    calls[0] += 1
    return steps(*args)
  monkeypatch.setattr(pipeline, "_steps", counted)
  xs = [X + k for k in range(6)]
  outs, _, hits = _same_as_full_machine([(matmul, (x, Y)) for x in xs])
  assert hits == 5 and _WARM_HITS[0] == 4
  assert calls[0] == 3 + 6   # (+ the replay=False run's six)
  for x, out in zip(xs, outs):
    np.testing.assert_array_equal(out, np.asarray(x) @ np.asarray(Y))


def test_clean_stores_into_a_prefetch_ref_keep_the_launch_replayable():
  s = jnp.zeros(1, jnp.int32)
  assert replay_blocker(_kernel_jaxpr(_prefetch_call(_counter_kernel), s, X16), keyed=[0]) is None
  _, _, hits = _same_as_full_machine([(_prefetch_call(_counter_kernel), (s, X16))] * 2)
  assert hits == 1


_MULTI_CHIP = {"case_remote_ring_shift", "case_remote_barrier_and_vmem_send", "case_remote_ring_all_reduce",
               "case_remote_gather_to_device0", "case_wheel_all_gather", "case_wheel_all_gather_hbm"}


def _unkept(fname, case) -> int:
  """Launches of a case that replay but are not kept: mutable refs among their operands."""
  return int(case == "case_kernel_mutable_ref_in_place")


def _parity_cases():
  return [(f, c) for f in sorted(p.name for p in harness.KERNELS.glob("k_*.py")) for c in harness.case_names(f)]


@pytest.mark.parametrize("fname,case", _parity_cases())
def test_every_parity_kernel_replays_as_it_ran_on_the_full_machine(fname, case):
  """Manual DMAs, semaphores, emit_pipeline, aliases, mutable refs, SMEM blocks, scalar prefetch, the
  wheel's kernels: the second to fourth launches are replayed (multi-chip launches never are), the
  third and fourth on the launch kept from the second (the fourth playing the schedules the third
  recorded), with the full machine's outputs and report."""
  mod = harness.jax_module(fname)
  chips = getattr(mod, "NUM_DEVICES", 1)
  fn, args, _ = getattr(mod, case)()
  f = jax.jit(fn)
  try:
    with pj.virtual_tpu("v5e", num_chips=chips):
      jax.block_until_ready(f(*args))
  except jax.errors.TracerArrayConversionError:   # (a case that ends in NumPy on the host)
    f = fn
  outs, reports, hits = _same_as_full_machine([(f, args)] * 4, num_chips=chips)
  single = [r[1] == 1 for r in reports[:len(reports) // 4]]   # each launch of the first call
  assert hits == 3 * sum(single) and (hits > 0 or case in _MULTI_CHIP)
  # the third and fourth calls' launches run on the kept ones (the fourth plays recorded schedules)
  assert _WARM_HITS[0] == 2 * (sum(single) - _unkept(fname, case))
  for out in outs[1:]:
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(out)):
      np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ never replayed
def test_a_branch_on_loaded_data_is_never_replayed():
  assert replay_blocker(_kernel_jaxpr(branch_on_data, X)) == "'cond' decides its branch from loaded data"
  pos, neg = jnp.abs(X) + 1.0, -jnp.abs(X) - 1.0
  outs, reports, hits = _same_as_full_machine([(branch_on_data, (pos,)), (branch_on_data, (neg,))])
  assert hits == 0
  assert reports[0][2] > reports[1][2]     # only the positive input runs the matmul
  np.testing.assert_array_equal(outs[1], np.asarray(neg))


def test_a_loop_bound_from_loaded_data_is_never_replayed():
  assert replay_blocker(_kernel_jaxpr(loop_on_data, X)) == "a while loop's predicate depends on loaded data"
  few, many = jnp.full((8, 128), 2.0), jnp.full((8, 128), 40.0)
  _, reports, hits = _same_as_full_machine([(loop_on_data, (few,)), (loop_on_data, (many,))])
  assert hits == 0 and reports[1][2] > reports[0][2]


def test_other_data_dependent_schedules_are_named():
  window = jax.jit(lambda x: pl.pallas_call(
      _window_from_data, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x))
  assert replay_blocker(_kernel_jaxpr(window, X16)) == "'get' decides its ref index (or mask) from loaded data"
  s = jnp.zeros(1, jnp.int32)
  assert replay_blocker(_kernel_jaxpr(_prefetch_call(_store_data_in_prefetch), s, X16), keyed=[0]) == (
      "'swap' writes loaded data into a keyed (scalar prefetch / SMEM) operand")
  # the same kernel with its prefetch operand not keyed: reading it is reading data
  assert replay_blocker(_kernel_jaxpr(_prefetch_call(_counter_kernel), s, X16)) == (
      "'cond' decides its branch from loaded data")


@pytest.mark.parametrize("options", [dict(detect_races=True), dict(dma_policy="on_wait"),
                                     dict(uninitialized="raise"), dict(replay=False)])
def test_checked_launches_and_other_dma_policies_run_on_the_full_machine(options):
  _, reports, hits = _launches([(matmul, (X, Y))] * 2, **options)
  assert hits == 0 and reports[0] == reports[1]


def test_megacore_launches_run_on_the_full_machine():
  par = functools.partial(matmul, semantics=("parallel", "parallel", "arbitrary"))
  _, reports, hits = _same_as_full_machine([(par, (X, Y))] * 2, chip="v5p")
  assert hits == 0 and reports[0] == reports[1]


def test_device_time_without_data_is_not_served_by_a_replay():
  with pj.virtual_tpu("v5e") as tpu:
    jax.block_until_ready(matmul(X, Y))
    t = pj.device_time(matmul, X, Y)   # timing-only: its own machine, no data
  assert not t.with_data and tpu.replays.hits == 0
  assert [r.timing_only for r in tpu.reports] == [False, True]
  assert tpu.reports[0].device_cycles == tpu.reports[1].device_cycles


def test_replay_must_be_a_bool():
  with pytest.raises(ppl.UsageError, match=r"replay"):
    ppl.virtual_tpu("v5e", replay="yes")


def test_an_equation_the_analysis_cannot_read_leaves_the_kernel_unreplayable_not_broken():
  class Odd:   # a primitive of a known name whose operands do not have the expected layout
    primitive = type("P", (), {"name": "dma_start"})()
    invars, outvars, params = [], [], {}
  jaxpr = type("J", (), {"invars": [], "eqns": [Odd()]})()
  assert replay_blocker(jaxpr).startswith("the analysis could not read an equation (KeyError")
