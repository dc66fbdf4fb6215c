"""The candidate rules of hw.ChipSpec (measured on a TPU v5e, not adopted on any chip: docs/validation.md
"Session 29"), as exact timelines on UNIT_CHIP: each is off by default, and on it changes the timeline by
what its field says and nothing else."""
import dataclasses
import math

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace._src import hw
from palace._src.sim import cost

from timing_helpers import ANY_SPEC, UNIT_CHIP, run_four_copies

SCALAR = UNIT_CHIP.scalar_op_cycles


def _events(report, unit):
  return [(e[2], e[3], e[4]) for e in report.events if e[1] == unit]


def test_the_measured_rules_are_on_for_v5e_only_and_the_candidates_off_everywhere():
  adopted = {"dma_wait_latency_cycles": 280, "dma_issue_cycles": 16, "dma_copy_overhead_bytes": 4096,
             "dma_run_overhead_bytes": 128, "mxu_handoff_cycles_per_vreg": 2.375, "mxu_chain_waits": True,
             "xlu_class_turnaround": True, "wait_write_backs_next_step": True,
             "grid_step_overhead_cycles": 24, "branch_cycles": 4,
             "index_map_cycles": 16, "index_map_plain_cycles": 12,
             "index_map_smem_cycles": 23, "index_map_subword_cycles": 40, "grid_step_dim_cycles": 4,
             "grid_step_operand_cycles": 3.5, "hbm_write_buffer_bytes": 144_000,
             "dma_sequential_no_overhead": True, "stores_in_order": True,
             "stores_stream_behind_values": True, "dma_issue_bare_cycles": 2,
             "dma_big_write_waits_queued_read": True}
  v5e = hw.get_chip("v5e")
  assert {k: getattr(v5e, k) for k in adopted} == adopted
  for k in adopted:   # each adopted value names its measurement
    assert "measured on a TPU v5e" in v5e.sources[k], k
  for chip in hw.CHIPS.values():
    off = {k: v for k, v in hw.RULES_OFF.items() if chip.name != "v5e" or k not in adopted}
    assert {k: getattr(chip, k) for k in off} == off, chip.name
    if chip.name != "v5e":
      assert (chip.grid_step_overhead_cycles, chip.dma_issue_cycles) == (37, 8), chip.name


def test_the_latency_form_sees_each_copy_a_fixed_time_after_it_landed():
  """dma_wait_latency_cycles = L: each wait ends at max(now, its copy's landing + L), then its scalar
  op; the stall (dma_wait_sync_cycles) is not paid and the copies' timing is unchanged."""
  lat = 280
  stall_cycles, stall_dones = run_four_copies(UNIT_CHIP)
  cycles, dones = run_four_copies(dataclasses.replace(UNIT_CHIP, dma_wait_latency_cycles=lat))
  assert dones == stall_dones
  now = dones[0] - 1   # (the clock before the first wait is below every landing)
  for done in dones:
    now = max(now, done + lat) + SCALAR
  assert cycles == now == dones[-1] + lat + SCALAR
  assert stall_cycles == dones[0] + UNIT_CHIP.dma_wait_sync_cycles + 4 * SCALAR


def test_the_latency_forms_floor_makes_every_wait_take_its_cycles():
  """dma_wait_landed_cycles = F (with the latency form): a wait ends at max(now + F, landing + L): the
  first wait is the latency's (its copy is still in flight), the three after it, on copies landed 8
  cycles apart, each take F."""
  lat, floor = 280, 45
  _, dones = run_four_copies(UNIT_CHIP)
  plain, _ = run_four_copies(dataclasses.replace(UNIT_CHIP, dma_wait_latency_cycles=lat))
  chip = dataclasses.replace(UNIT_CHIP, dma_wait_latency_cycles=lat, dma_wait_landed_cycles=floor)
  cycles, same = run_four_copies(chip)
  assert same == dones and plain == dones[-1] + lat + SCALAR
  assert [b - a for a, b in zip(dones, dones[1:])] == [8, 8, 8]
  assert cycles == dones[0] + lat + SCALAR + 3 * (floor + SCALAR)
  alone, _ = run_four_copies(dataclasses.replace(UNIT_CHIP, dma_wait_landed_cycles=floor))
  assert alone == run_four_copies(UNIT_CHIP)[0]   # (only with the latency form)


def test_a_copy_overhead_occupies_the_channel_as_extra_bytes():
  """dma_copy_overhead_bytes = B: each HBM copy is timed as B bytes longer (UNIT_CHIP moves 1000 bytes a
  cycle): four 4 KiB copies issued 8 cycles apart (4.1 cycles of transfer each) land 3 cycles later
  each with B = 3000 (7.1 cycles: no queue yet), and with B = 8000 (12.1 cycles) they queue, the k-th
  (from 0) starting k * 4.1 cycles later than 8 apart."""
  _, base = run_four_copies(UNIT_CHIP)
  _, dones = run_four_copies(dataclasses.replace(UNIT_CHIP, dma_copy_overhead_bytes=3000))
  assert [d - b for d, b in zip(dones, base)] == [3, 3, 3, 3]
  _, queued = run_four_copies(dataclasses.replace(UNIT_CHIP, dma_copy_overhead_bytes=8000))
  assert [d - b for d, b in zip(queued, base)] == [8, 12, 16, 20]


def _block_copy_dmas(chip, cols):
  """A grid of 8 steps copying (8, 128) blocks of a (64, cols) array (8 runs of 512 bytes a block when
  cols > 128, one run of whole rows when cols == 128) through VMEM; the DMAs' (kind, start, end)."""
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  x = np.arange(64 * cols, dtype=np.float32).reshape(64, cols)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid=(8,),
                         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  np.testing.assert_array_equal(out, x[:, :128])
  return _events(tpu.reports[-1], "dma")


def test_a_run_overhead_charges_each_contiguous_run_of_a_copys_hbm_side():
  """dma_run_overhead_bytes = B: an HBM copy is timed as B bytes longer per contiguous run of its HBM
  window: the (8, 128) blocks of a (64, 256) array (8 runs each) time as with a per-copy overhead of
  8 B on the reads (the output blocks, whole rows of a (64, 128) array, as 1 B), and blocks of whole
  rows as 1 B."""
  b = 250
  runs = dataclasses.replace(UNIT_CHIP, dma_run_overhead_bytes=b)
  narrow = _block_copy_dmas(runs, 256)
  reads = [e for e in narrow if e[0] == "hbm->vmem"]
  writes = [e for e in narrow if e[0] == "vmem->hbm"]
  assert len(reads) == len(writes) == 8
  whole = _block_copy_dmas(runs, 128)
  assert whole == _block_copy_dmas(dataclasses.replace(UNIT_CHIP, dma_copy_overhead_bytes=b), 128)
  base = _block_copy_dmas(UNIT_CHIP, 256)
  first_read = [e for e in base if e[0] == "hbm->vmem"][0]
  assert reads[0][1] == first_read[1] and reads[0][2] == first_read[2] + 2   # (8 * 250 bytes: 2 cycles)


# small integers: every product and sum below is exact in float32 (and the (128, 128) dot's results,
# at most 128 * 36, round to bfloat16 as NumPy's cast of them does), so the references are exact
_X = (np.arange(128 * 128) % 7).astype(np.float32).reshape(128, 128)


def _dot_then(consume, chip):
  def k(x_ref, o_ref):
    s = jnp.dot(x_ref[...], x_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = consume(s)

  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(_X.shape, np.float32))(_X.astype(jnp.bfloat16))
  return out, tpu.reports[-1]


def _lane_max(s):
  return np.broadcast_to(s.max(-1, keepdims=True), s.shape)


@pytest.mark.parametrize("what, consume, reference, vregs", [
    ("a lane max of the result", lambda s: jnp.broadcast_to(jnp.max(s, axis=-1, keepdims=True), s.shape),
     _lane_max, 16),
    ("a lane max of the scaled result", lambda s: jnp.broadcast_to(jnp.max(s * 0.5, axis=-1, keepdims=True),
                                                                  s.shape), lambda s: _lane_max(s * 0.5), 16),
    ("an add (VPU only)", lambda s: s + 1.0, lambda s: s + 1.0, 0),
])
def test_the_mxu_handoff_delays_an_xlu_op_reading_an_mxu_result(what, consume, reference, vregs):
  """mxu_handoff_cycles_per_vreg = h: an XLU op whose operand is an MXU result, directly or through VPU
  ops, sees it h cycles per result vreg later (at most mxu_handoff_max_vregs: a (128, 128) f32 result is
  16 vregs); a VPU-only consumer pays nothing. The result is unchanged."""
  h = 2.5
  want = reference(_X @ _X)
  ref, base = _dot_then(consume, UNIT_CHIP)
  out, r = _dot_then(consume, dataclasses.replace(UNIT_CHIP, mxu_handoff_cycles_per_vreg=h))
  capped, r8 = _dot_then(consume, dataclasses.replace(UNIT_CHIP, mxu_handoff_cycles_per_vreg=h,
                                                       mxu_handoff_max_vregs=8))
  for got in (ref, out, capped):
    np.testing.assert_array_equal(got, want)
  assert r.device_cycles - base.device_cycles == int(h * vregs), what
  assert r8.device_cycles - base.device_cycles == int(h * min(vregs, 8)), what


def test_a_dot_fed_from_the_mxus_last_result_waits_for_it_with_mxu_chain_waits():
  """mxu_chain_waits: a dot whose operand is computed from the MXU's in-flight result starts on the MXU
  once that operand is ready; without it the second dot streams behind the first (same start)."""
  def consume(s):
    return jnp.dot(s.astype(jnp.bfloat16), jnp.ones((128, 128), jnp.bfloat16),
                   preferred_element_type=jnp.float32)

  want = (_X @ _X).astype(jnp.bfloat16).astype(np.float32) @ np.ones((128, 128), np.float32)
  ref, base = _dot_then(consume, UNIT_CHIP)
  out, r = _dot_then(consume, dataclasses.replace(UNIT_CHIP, mxu_chain_waits=True))
  np.testing.assert_array_equal(ref, want)
  np.testing.assert_array_equal(out, want)
  (_, s1, e1), (_, s2, _) = _events(base, "mxu")
  assert s2 == s1
  (_, c1, f1), (_, c2, _) = _events(r, "mxu")
  cast_ready = f1 + UNIT_CHIP.mxu_latency_cycles["bf16"] + 2   # the result, then the cast (latency 2)
  assert (c1, f1) == (s1, e1) and c2 == cast_ready
  assert r.device_cycles > base.device_cycles


def test_an_xlu_op_of_another_class_waits_for_the_previous_ones_result():
  """xlu_class_turnaround: a lane broadcast of a loaded column issued after a lane max starts once the
  max's result is out; without the rule it starts before that."""
  def k(x_ref, c_ref, o_ref):
    v = x_ref[...]
    m = jnp.max(v, axis=-1, keepdims=True)
    o_ref[...] = (v - m) + c_ref[...]

  x = (np.arange(8 * 128) % 11).astype(np.float32).reshape(8, 128)
  c = np.arange(8, dtype=np.float32).reshape(8, 1)
  reports = {}
  for turn in (False, True):
    with pl.virtual_tpu(dataclasses.replace(UNIT_CHIP, xlu_class_turnaround=turn)) as tpu:
      out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))(x, c)
    np.testing.assert_array_equal(out, (x - x.max(-1, keepdims=True)) + c)
    reports[turn] = tpu.reports[-1]
  (n1, a1, b1), (n2, a2, _) = _events(reports[False], "xlu")
  assert (n1, n2) == ("reduce_lane", "lane_broadcast") and a2 < b1 + 114
  (_, c1, d1), (_, c2, _) = _events(reports[True], "xlu")
  assert (c1, d1) == (a1, b1) and c2 == d1 + 114   # the reduction's end + its latency (docs 1.4)
  assert reports[True].device_cycles > reports[False].device_cycles


def test_benchmarks_hw_set_overrides_chip_fields_with_their_types():
  """`python -m benchmarks.hw --set FIELD=VALUE` (model.chip_with): typed per field; a wrong field or
  value is a one-line usage error naming it."""
  from benchmarks.hw import model   # (numpy only: the cases import neither JAX nor palace)
  spec = model.chip_with("v5e", ["dma_wait_latency_cycles=280", "mxu_chain_waits=true",
                                 "mxu_handoff_cycles_per_vreg=2", "dma_issue_cycles=16"])
  assert (spec.dma_wait_latency_cycles, spec.mxu_chain_waits) == (280, True)
  assert spec.mxu_handoff_cycles_per_vreg == 2.0 and isinstance(spec.mxu_handoff_cycles_per_vreg, float)
  assert spec.dma_issue_cycles == 16 and type(spec.dma_issue_cycles) is int
  assert model.chip_with("v5e", []) is hw.get_chip("v5e")
  with pytest.raises(ValueError, match=r"--set 'no_such=1': expected FIELD=VALUE"):
    model.chip_with("v5e", ["no_such=1"])
  with pytest.raises(ValueError, match=r"--set 'dma_issue_cycles=2.5': expected int, got '2.5'"):
    model.chip_with("v5e", ["dma_issue_cycles=2.5"])
  with pytest.raises(ValueError, match=r"--set 'mxu_chain_waits=yes': expected bool"):
    model.chip_with("v5e", ["mxu_chain_waits=yes"])
  assert model.chip_with("v5e", ["dma_wait_latency_cycles=none"]).dma_wait_latency_cycles is None
  with pytest.raises(ValueError, match=r"--set 'dma_issue_cycles=none': expected int, got 'none'"):
    model.chip_with("v5e", ["dma_issue_cycles=none"])
  with pytest.raises(ValueError, match=r"--set 'dma_wait_latency_cycles=inf': expected int or none, got 'inf'"):
    model.chip_with("v5e", ["dma_wait_latency_cycles=inf"])


def _pipelined_copy(chip, index_map):
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  x = np.arange(8 * 8 * 128, dtype=np.float32).reshape(64, 128)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid=(8,),
                         in_specs=[pl.BlockSpec((8, 128), index_map)],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  want = np.concatenate([x[8 * index_map(i)[0]:][:8] for i in range(8)])
  np.testing.assert_array_equal(out, want)
  return tpu.reports[-1].unit_busy_cycles["scalar"]


@pytest.mark.parametrize("what, index_map, charged", [
    ("plain: the grid index", lambda i: (i, 0), False),
    ("plain: a constant block", lambda i: (0, 0), False),
    ("computed: (3 i) % 8", lambda i: ((3 * i) % 8, 0), True),
    ("computed: i // 2", lambda i: (i // 2, 0), True),
])
def test_a_computed_index_map_costs_its_cycles_every_step_after_the_first(what, index_map, charged):
  """index_map_cycles = c: a grid step (after the first, the prologue) whose input's map computes its
  block index (neither constant nor a grid index) spends c scalar cycles before it starts the next
  blocks' copies; a plain map
  costs nothing; the blocks are the same either way."""
  chip = dataclasses.replace(UNIT_CHIP, index_map_cycles=7, index_map_smem_cycles=50)
  extra = _pipelined_copy(chip, index_map) - _pipelined_copy(UNIT_CHIP, index_map)
  assert extra == (7 * 7 if charged else 0), what


@pytest.mark.parametrize("what, index_map, charged", [
    ("plain: the grid index", lambda i: (i, 0), 5),
    ("plain: a constant block", lambda i: (0, 0), 0),
    ("computed: (3 i) % 8", lambda i: ((3 * i) % 8, 0), 7),
])
def test_a_plain_index_map_whose_block_moves_costs_its_own_cycles(what, index_map, charged):
  """index_map_plain_cycles = p: an input whose block index is a grid index (not constant) costs p a step
  after the first; a constant block nothing; a computed one index_map_cycles (not p on top)."""
  chip = dataclasses.replace(UNIT_CHIP, index_map_cycles=7, index_map_plain_cycles=5)
  extra = _pipelined_copy(chip, index_map) - _pipelined_copy(UNIT_CHIP, index_map)
  assert extra == 7 * (charged + 5), what   # (+ the output's plain map, i)


def test_a_map_marked_computed_is_charged_whatever_blocks_it_gives():
  """A front end's map marked blocks.COMPUTED_INDEX_MAP (palace.jax: a map with arithmetic in it, which the
  chip's compiler evaluates every step) costs index_map_cycles even where its blocks never move."""
  from palace._src import blocks
  chip = dataclasses.replace(UNIT_CHIP, index_map_cycles=7)

  def index_map(i):
    return (0, 0)
  assert _pipelined_copy(chip, index_map) == _pipelined_copy(UNIT_CHIP, index_map)
  setattr(index_map, blocks.COMPUTED_INDEX_MAP, True)
  assert _pipelined_copy(chip, index_map) - _pipelined_copy(UNIT_CHIP, index_map) == 7 * 7


def _three_operands(chip, after=False):
  """A (2, 4) grid, two (8, 128) inputs (one moving with the last grid index, one fixed) and one output;
  the scalar cycles and the start cycle of every HBM read."""
  def k(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]

  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(32, 128)
  chip = dataclasses.replace(chip, index_map_after_starts=after)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid=(2, 4),
                         in_specs=[pl.BlockSpec((8, 128), lambda i, j: (j, 0)),
                                   pl.BlockSpec((8, 128), lambda i, j: (0, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i, j: (4 * i + j, 0)))(x, x)
  want = np.concatenate([x[8 * j:][:8] + x[:8] for i in range(2) for j in range(4)])
  np.testing.assert_array_equal(out, want)
  r = tpu.reports[-1]
  return r.unit_busy_cycles["scalar"], [e[3] for e in r.events if e[1] == "dma" and e[2] == "hbm->vmem"]


def test_grid_rank_and_operand_count_cost_their_cycles_every_step_after_the_first():
  """grid_step_dim_cycles = d per grid dimension beyond the first and grid_step_operand_cycles = o per
  pipelined operand beyond two, with the index maps' own charges (here one plain moving input: p, the
  output's computed map 4 i + j: c), every step after the first; a step's sum in whole cycles."""
  chip = dataclasses.replace(UNIT_CHIP, grid_step_dim_cycles=3, grid_step_operand_cycles=1.5,
                             index_map_plain_cycles=5, index_map_cycles=7)
  base, _ = _three_operands(UNIT_CHIP)
  charged, _ = _three_operands(chip)
  assert charged - base == 7 * 17   # (3 + 1.5 + 5 + 7 = 16.5 a step, rounded to whole cycles)


def test_index_map_after_starts_charges_the_same_cycles_after_the_next_copies_start():
  """index_map_after_starts: the same cycles, charged once the step's next blocks are started (before
  its waits): the scalar total is unchanged and the next block's copy starts earlier."""
  chip = dataclasses.replace(UNIT_CHIP, grid_step_dim_cycles=3, index_map_plain_cycles=5, index_map_cycles=7)
  before, reads_before = _three_operands(chip)
  after, reads_after = _three_operands(chip, after=True)
  assert before == after
  assert reads_after[:3] == reads_before[:3] and reads_after[3] < reads_before[3]


def _accumulate(chip, keep):
  """A grid of 8 steps adding (8, 128) input blocks into output blocks kept `keep` steps each."""
  def k(x_ref, o_ref):
    @pl.when(pl.program_id(0) % keep == 0)
    def _():
      o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += x_ref[...]

  x = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64 // keep, 128), np.float32), grid=(8,),
                         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (i // keep, 0)))(x)
  np.testing.assert_array_equal(out, x.reshape(8 // keep, keep, 8, 128).sum(1).reshape(-1, 128))
  r = tpu.reports[-1]
  steps = [e[3] for e in r.events if e[1] == "scalar" and e[2] == "grid step"]
  writes = [e[4] for e in r.events if e[1] == "dma" and e[2] == "vmem->hbm"]
  return r.device_cycles, steps, writes


def test_a_kept_output_blocks_write_back_is_waited_at_once_with_wait_kept_write_backs():
  """wait_kept_write_backs: an output block kept over 2+ steps is written back and waited when it
  changes, so the next grid step starts after that write-back is seen; a block written every step keeps
  its write-backs in flight (the timeline is unchanged)."""
  chip = dataclasses.replace(UNIT_CHIP, wait_kept_write_backs=True)
  base, _, _ = _accumulate(UNIT_CHIP, 4)
  cycles, steps, writes = _accumulate(chip, 4)
  assert cycles > base
  assert writes[0] + UNIT_CHIP.dma_wait_sync_cycles < steps[3]   # (the change after step 3: steps[3] is step 4's)
  assert _accumulate(chip, 1) == _accumulate(UNIT_CHIP, 1)


def test_with_wait_write_backs_next_step_a_write_back_is_seen_by_the_end_of_the_next_step():
  """wait_write_backs_next_step: each output write-back is waited at the end of the grid step after the
  one that started it, so a kept block's change is not waited at once (the next step starts before
  the write-back lands) but the step after it starts only once it is seen; every-step blocks too."""
  chip = dataclasses.replace(UNIT_CHIP, wait_write_backs_next_step=True)
  base, base_steps, _ = _accumulate(UNIT_CHIP, 4)
  cycles, steps, writes = _accumulate(chip, 4)
  # (steps[k] is step k + 1's start: step 0's is not an event)
  assert steps[:4] == base_steps[:4] and steps[3] < writes[0]   # (step 4 starts before step 3's lands)
  assert writes[0] + UNIT_CHIP.dma_wait_sync_cycles <= steps[4] and cycles >= base
  every, every_steps, every_writes = _accumulate(chip, 1)
  assert len(every_writes) == 8 and all(w + UNIT_CHIP.dma_wait_sync_cycles <= s
                                        for w, s in zip(every_writes, every_steps[1:]))


@pytest.mark.parametrize("write_backs", ["wait_kept_write_backs", "wait_write_backs_next_step"])
def test_the_candidate_rules_keep_steady_state_timing_exact(write_backs):
  """A long timing-only grid under every candidate rule (either write-back rule): the steady-state
  detector's total (it times a period once and advances over the rest) equals stepping every step."""
  chip = dataclasses.replace(UNIT_CHIP, dma_wait_latency_cycles=280, mxu_handoff_cycles_per_vreg=2.375,
                             mxu_chain_waits=True, xlu_class_turnaround=True, dma_copy_overhead_bytes=4096,
                             dma_run_overhead_bytes=64, index_map_cycles=10, index_map_smem_cycles=23,
                             index_map_plain_cycles=7, grid_step_dim_cycles=4, grid_step_operand_cycles=3.5,
                             **{write_backs: True})

  def k(x_ref, y_ref, o_ref):   # (an output block kept 4 steps, maps computed, a dot into the XLU and the MXU)
    s = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    t = jnp.dot(s.astype(jnp.bfloat16), y_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = jnp.broadcast_to(jnp.max(s, axis=-1, keepdims=True), s.shape) + t

  x = np.ones((8 * 128, 128), jnp.bfloat16)
  reports, skipped = {}, {}
  for steady in (True, False):
    with pl.virtual_tpu(chip, timing_only=True, steady_state=steady) as tpu:
      pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64 * 128, 128), np.float32), grid=(256,),
                     in_specs=[pl.BlockSpec((128, 128), lambda i: ((3 * i) % 8, 0)),
                               pl.BlockSpec((128, 128), lambda i: (i % 8, 0))],
                     out_specs=pl.BlockSpec((128, 128), lambda i: (i // 4, 0)))(x, x)
    reports[steady], skipped[steady] = tpu.reports[-1], tpu.extrapolated_steps
  assert skipped[False] == 0 and skipped[True] > 128   # (the detector advanced over most of the grid)
  assert reports[True].as_dict() == reports[False].as_dict()


def test_the_index_map_rules_leave_a_wrong_rank_map_to_the_steps_own_error():
  """With the index-map rules on, an index map returning too few indices is still reported by the step
  (OutOfBoundsError naming the operand), not by the rule's classification of its blocks."""
  chip = dataclasses.replace(UNIT_CHIP, index_map_cycles=7, index_map_plain_cycles=5, grid_step_dim_cycles=3)
  x = np.zeros((8, 128), np.float32)
  with pl.virtual_tpu(chip):
    with pytest.raises(pl.OutOfBoundsError, match=r"index_map of args\[0\] returned 1 indices"):
      pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32),
                     grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i,))])(x)


def _table_gather(chip, table_dtype):
  """A 1-D grid of 8 steps copying the (8, 128) block a scalar-prefetch table names (`table_dtype`
  entries); the scalar cycles of the launch."""
  def k(t_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]

  x = np.arange(8 * 8 * 128, dtype=np.float32).reshape(64, 128)
  table = np.array([3, 1, 4, 1, 5, 2, 6, 0], dtype=table_dtype)
  spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(8,),
                                      in_specs=[pl.BlockSpec((8, 128), lambda i, t: (t[i], 0))],
                                      out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0)))
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid_spec=spec)(table, x)
  np.testing.assert_array_equal(out, np.concatenate([x[8 * int(j):][:8] for j in table]))
  return tpu.reports[-1].unit_busy_cycles["scalar"]


@pytest.mark.parametrize("table_dtype, extra", [(np.int32, 0), (np.int8, 9)])
def test_a_map_reading_a_sub_word_table_costs_the_sub_word_cycles_more(table_dtype, extra):
  """index_map_smem_cycles = s per table-reading map and step after the first, index_map_subword_cycles
  = w more when the scalar-prefetch tables hold sub-word integers (int8 here); int32 tables pay s."""
  chip = dataclasses.replace(UNIT_CHIP, index_map_smem_cycles=11, index_map_subword_cycles=9)
  charged = _table_gather(chip, table_dtype) - _table_gather(UNIT_CHIP, table_dtype)
  assert charged == 7 * (11 + extra)


def _ordered_block_copies(chip, index_map):
  """8 steps copying (8, 128) blocks of a (64, 128) array, visited in `index_map`'s order; the DMAs."""
  x = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                         out_shape=pl.ShapeDtypeStruct((64, 128), np.float32), grid=(8,),
                         in_specs=[pl.BlockSpec((8, 128), index_map)],
                         out_specs=pl.BlockSpec((8, 128), index_map))(x)
  np.testing.assert_array_equal(out, x)
  return _events(tpu.reports[-1], "dma"), tpu.reports[-1].device_cycles


def test_a_copy_continuing_its_streams_last_copy_pays_no_per_copy_overhead():
  """dma_sequential_no_overhead: with a per-copy overhead of B bytes, blocks visited in order (each
  read and write continuing the previous one of its direction in the array's tiled layout) pay B only
  on the first read and the first write: the launch takes what it takes with no overhead plus the
  first read's B; visited backwards, every copy pays B, as without the rule."""
  b = 3000   # (3 cycles on UNIT_CHIP)
  over = dataclasses.replace(UNIT_CHIP, dma_copy_overhead_bytes=b)
  seq = dataclasses.replace(over, dma_sequential_no_overhead=True)
  forward, backward = (lambda i: (i, 0)), (lambda i: (7 - i, 0))
  none_evs, none_cycles = _ordered_block_copies(UNIT_CHIP, forward)
  evs, cycles = _ordered_block_copies(seq, forward)
  reads = [e for e in evs if e[0] == "hbm->vmem"]
  none_reads = [e for e in none_evs if e[0] == "hbm->vmem"]
  assert reads[0][2] == none_reads[0][2] + 3 and [e[2] - e[1] for e in reads[1:]] == \
      [e[2] - e[1] for e in none_reads[1:]]
  assert _ordered_block_copies(seq, backward) == _ordered_block_copies(over, backward)
  assert _ordered_block_copies(over, forward)[1] > cycles > none_cycles


def _conditions(chip, whens, static=False):
  """A 16-step grid whose body tests `whens` runtime conditions that never hold (a Python False each
  when `static`); the launch's cycles."""
  def k(x_ref, o_ref):
    i = pl.program_id(0)
    for w in range(whens):
      @pl.when(False if static else i > 100 + w)
      def _():
        o_ref[...] = x_ref[...]
    o_ref[...] = x_ref[...]

  x = np.ones((8, 128), np.float32)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), grid=(16,),
                         in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(x)
  np.testing.assert_array_equal(out, x)
  return tpu.reports[-1].device_cycles


def test_each_conditional_branch_costs_its_branch_cycles():
  """branch_cycles = B: every pl.when with a runtime condition costs B scalar cycles more, taken or
  not (16 steps x 3 conditions here); a Python bool condition is decided at trace time and costs none."""
  b = 5
  chip = dataclasses.replace(UNIT_CHIP, branch_cycles=b)
  assert _conditions(chip, 3) - _conditions(UNIT_CHIP, 3) == 16 * 3 * b
  assert _conditions(chip, 0) == _conditions(UNIT_CHIP, 0)
  assert _conditions(chip, 3, static=True) == _conditions(UNIT_CHIP, 3, static=True)


@pytest.mark.parametrize("name,in_map", [
    ("forward", lambda i: (i, 0)), ("backward", lambda i: (511 - i, 0)),
    ("pairs swapped", lambda i: ((i // 2) * 2 + 1 - i % 2, 0)), ("four kept", lambda i: (i % 4, 0)),
    ("every other", lambda i: ((2 * i) % 512, 0))])
def test_a_chip_with_the_sequential_rule_extrapolates_what_stepping_times(name, in_map):
  """dma_sequential_no_overhead keeps where each HBM stream ended, which no period of a grid repeats:
  the steady-state proof covers it by each operand's copies' continuity (a bit per step from the
  index maps: pipeline_steady._stream_codes) and sets the streams' ends after a jump. A long
  timing-only grid is extrapolated and its report is the stepped one, to the cycle, for block orders
  that continue, never continue, and continue every other copy; the rule changes the time."""
  seq = dataclasses.replace(UNIT_CHIP, dma_copy_overhead_bytes=3000, dma_sequential_no_overhead=True)
  x = np.zeros((512 * 8, 128), np.float32)
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] + 1),
                     out_shape=pl.ShapeDtypeStruct(x.shape, np.float32), grid=(512,),
                     in_specs=[pl.BlockSpec((8, 128), in_map)],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  cycles = {}
  for chip, steady in ((seq, False), (seq, True), (UNIT_CHIP, True)):
    with pl.virtual_tpu(chip, timing_only=True, steady_state=steady) as tpu:
      f(x)
    cycles[chip is seq, steady] = (tpu.reports[-1].device_cycles, tpu.extrapolated_steps)
  assert cycles[True, True][0] == cycles[True, False][0] and cycles[True, False][1] == 0
  assert cycles[True, True][1] > 400
  assert cycles[True, True][0] != cycles[False, True][0]


@pytest.mark.parametrize("shape,dtype,block", [
    ((64, 512), np.float32, (8, 128)), ((64, 512), np.float32, (16, 512)), ((64, 512), np.float32, (16, 256)),
    ((4, 32, 256), np.float16, (1, 16, 256)), ((4, 32, 256), np.int8, (2, 32, 256)),
    ((6, 16, 128), np.float32, (1, 8, 128)), ((64, 512), np.float32, (64, 512))])
def test_block_tile_ranges_is_tile_range_at_every_block(shape, dtype, block):
  """The steady-state proof's vectorised block ranges (sim/dma.block_tile_ranges: affine in the block
  offsets, derived from tile_range at the origin and one tiling unit along each dim) equal tile_range
  of every block's window, and are None exactly when the blocks are not one range."""
  from palace._src.sim import dma
  itemsize = np.dtype(dtype).itemsize
  grid = [n // b for n, b in zip(shape, block)]
  offs = np.array([[i * b for i, b in zip(ix, block)] for ix in np.ndindex(*grid)], np.int64)
  got = dma.block_tile_ranges(shape, itemsize, block, offs)
  windows = [tuple(slice(o, o + b) for o, b in zip(row, block)) for row in offs]
  each = [dma.tile_range(shape, itemsize, w) for w in windows]
  if got is None:
    assert all(r is None for r in each)
  else:
    assert list(zip(got[0].tolist(), got[1].tolist())) == each
  # ...and a pipeline's block (DmaRequest.hbm_block) gets tile_range's span and window_runs' runs from
  # its plan, block by block
  assert [dma.block_span(shape, itemsize, block, tuple(row.tolist())) for row in offs] == each
  runs = dma.block_plan(shape, itemsize, block)[1]
  assert all(dma.window_runs(shape, w) == runs for w in windows)


def test_a_stream_joined_by_another_owners_copy_is_refused_by_the_signature():
  """A copy from another owner (the body, another operand) on a stream a pipeline's operand owns makes
  its continuity no longer the index map's: the stream is marked mixed and the DMA engine's signature
  refuses the jump (sim/dma.DmaEngine.signature), while a stream with one owner is left out of it."""
  import types
  from palace._src.sim import dma
  buf = types.SimpleNamespace(shape=(64, 128), dtype=np.dtype(np.float32))

  def req(row, owner):
    return types.SimpleNamespace(src_buf=buf, src_index=(slice(row, row + 8), slice(None)), dst_buf=None,
                                 dst_index=None, src_indices=None, dst_indices=None, owner=owner,
                                 stream_span=None, hbm_block=None)

  streams, mixed = {}, set()
  mine, body = object(), object()
  assert dma.stream_overhead(streams, req(0, mine), True, 99, mixed) == 99
  assert dma.stream_overhead(streams, req(8, mine), True, 99, mixed) == 0
  engine = types.SimpleNamespace(queue=None, last_sem=(None, None), streams=streams, mixed=mixed)
  key = (id(buf), True)
  assert dma.DmaEngine.signature(engine, 0, lambda t: t, {key: mine}) == ((), id(None), None, ())
  assert dma.stream_overhead(streams, req(16, body), True, 99, mixed) == 0   # (continues: timed alike)
  assert key in mixed
  assert dma.DmaEngine.signature(engine, 0, lambda t: t, {key: mine}) is None


def _burst_of_eight(chip, sems: int):
  """Eight 32 KiB HBM->VMEM copies started back to back (on `sems` semaphores in turn), then a long
  vector body, then their waits: (device cycles, each copy's transfer start)."""
  def k(x_hbm, y_ref, o_ref, buf, sem):
    copies = [pltpu.make_async_copy(x_hbm.at[i], buf.at[i], sem.at[i % sems]) for i in range(8)]
    for c in copies:
      c.start()
    v = y_ref[...]
    for _ in range(12):
      v = jnp.tanh(v)
    o_ref[...] = v
    for c in copies:
      c.wait()

  x, y = np.ones((8, 64, 128), np.float32), np.ones((512, 128), np.float32)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct((512, 128), np.float32),
                         in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec((512, 128), lambda: (0, 0))],
                         scratch_shapes=[pltpu.VMEM((8, 64, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))])(x, y)
  want = np.ones((512, 128), np.float32)
  for _ in range(12):
    want = np.tanh(want)
  np.testing.assert_allclose(out, want, rtol=1e-5)
  r = tpu.reports[-1]
  starts = [e[3] for e in r.events if e[1] == "dma" and e[2] == "hbm->vmem"][1:]   # (after y's block)
  return r.device_cycles, starts


def test_a_start_beyond_the_engines_queue_waits_for_its_oldest_copy_to_begin():
  """dma_queue_depth = 4 (a candidate, off): the engine holds four started copies not yet moving; the
  fifth start finds the first moving and issues, the sixth to eighth each wait for the second to fourth
  to begin (FIFO on one channel). With 2-cycle starts the eighth issues at the fourth's start instead of
  14 cycles after the first's: the body after the starts, which bounds the launch, is that much later.
  The copies themselves move as before."""
  base = dataclasses.replace(UNIT_CHIP, dma_issue_cycles=2)
  plain, s = _burst_of_eight(base, 1)
  queued, s_q = _burst_of_eight(dataclasses.replace(base, dma_queue_depth=4), 1)
  assert s_q == s and len(s) == 8
  assert queued - plain == math.ceil(s[3]) - (s[0] + 14)


def test_a_start_on_another_semaphore_than_the_last_costs_its_switch_cycles():
  """dma_issue_switch_cycles = 5 (a candidate, off): a start whose semaphore is not the previous
  start's costs 5 scalar cycles more. Eight starts alternating two semaphores switch seven times more
  than eight on one."""
  sw = dataclasses.replace(UNIT_CHIP, dma_issue_cycles=2, dma_issue_switch_cycles=5)
  assert _burst_of_eight(sw, 2)[0] - _burst_of_eight(sw, 1)[0] == 7 * 5
  off = dataclasses.replace(UNIT_CHIP, dma_issue_cycles=2)
  assert _burst_of_eight(off, 2)[0] == _burst_of_eight(off, 1)[0]


def _two_stores(chip, cols=128):
  """A dot's (256, 128) f32 result stored, then an independent VPU add's (256, cols) stored: the vst
  events, the MXU's."""
  def k(x_ref, w_ref, b_ref, o1, o2):
    o1[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o2[...] = b_ref[...] + 1.0

  x, w, b = np.ones((256, 128), np.float32), np.ones((128, 128), np.float32), np.ones((256, cols), np.float32)
  with pl.virtual_tpu(chip) as tpu:
    o1, o2 = pl.pallas_call(k, out_shape=(pl.ShapeDtypeStruct((256, 128), np.float32),
                                          pl.ShapeDtypeStruct((256, cols), np.float32)))(x, w, b)
  np.testing.assert_array_equal(o1, 128.0)
  np.testing.assert_array_equal(o2, 2.0)
  r = tpu.reports[-1]
  return _events(r, "vst"), _events(r, "mxu")


def test_with_stores_in_order_a_store_waits_for_the_earlier_stores_late_value():
  """stores_in_order (a candidate, off; session 35's eup_stream: a VPU stream's stores beside a dot's
  cost the chip nearly their sum): the add's store, independent of the dot, ends its 32 store cycles
  after the dot's result arrived (the MXU's end plus its latency), not 32 after it could start; a
  column's store is not held."""
  plain_st, mxu = _two_stores(UNIT_CHIP)
  held_st, _ = _two_stores(dataclasses.replace(UNIT_CHIP, stores_in_order=True))
  busy = 256 * 128 * 4 // 4096   # (32 vregs, one store a cycle)
  ready = mxu[0][2] + UNIT_CHIP.mxu_latency_cycles["f32"]
  assert plain_st[1][2] == plain_st[1][1] + 2 * busy   # (interleaved behind the first store's cycles)
  assert held_st[1][2] == ready + busy and held_st[0] == plain_st[0]
  # an (N, 1) column's store does not wait (a lane reduction's result stored beside a dot's: the chip
  # overlaps them, session 23's unit_overlap)
  chip = dataclasses.replace(UNIT_CHIP, stores_in_order=True)
  assert _two_stores(chip, cols=1)[0] == _two_stores(UNIT_CHIP, cols=1)[0]


def _tanh_steps(chip, rows):
  """Two grid steps of o = tanh(x) on fixed (rows, 128) f32 blocks: (the second step's bookkeeping
  start, the first step's EUP end, its store's (start, end))."""
  def k(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...])

  x = np.linspace(-2, 2, rows * 128, dtype=np.float32).reshape(rows, 128)
  fixed = pl.BlockSpec((rows, 128), lambda i: (0, 0))
  with pl.virtual_tpu(chip, trace=True) as tpu:
    out = pl.pallas_call(k, out_shape=pl.ShapeDtypeStruct(x.shape, np.float32), grid=(2,),
                         in_specs=[fixed], out_specs=fixed)(x)
  np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6)
  r = tpu.reports[-1]
  steps = [e for e in _events(r, "scalar") if e[0] == "grid step"]
  return steps[0][1], _events(r, "eup")[0][2], _events(r, "vst")[0][1:]


def test_with_stores_stream_behind_values_a_block_store_holds_the_unit_until_its_last_vreg():
  """stores_stream_behind_values (v5e; session 36's step_raw: a 16- or 64-vreg tanh step costs the chip
  7 cycles more than the same step's add): a block's store ends when the last vreg of its value has come
  and been stored, and the step's bookkeeping starts after it; without the rule it starts when the
  store unit's own cycles end, the EUP's results still in flight. A one-vreg store is not held."""
  lat = cost.VECTOR_CLASSES["transcendental"][2]
  st_lat = cost.VECTOR_CLASSES["store"][2]
  on = dataclasses.replace(UNIT_CHIP, stores_stream_behind_values=True)
  step, eup_end, (st_start, st_end) = _tanh_steps(UNIT_CHIP, 128)
  assert step == st_end == st_start + 16 < eup_end + lat
  step, eup_end, _ = _tanh_steps(on, 128)
  assert step == eup_end + lat + st_lat
  assert _tanh_steps(on, 8) == _tanh_steps(UNIT_CHIP, 8)


def _loop_starts(chip, body_work: bool, n: int = 3, k: int = 4):
  """`n` iterations of a rolled loop that starts `k` one-row HBM->VMEM copies (a 0.5-cycle transfer on
  UNIT_CHIP, so each transfer begins when it is issued) and waits them, with or without a one-vreg add
  after the starts: the transfer starts of each iteration's copies."""
  def k_(x_hbm, o_ref, buf, acc, sem):
    acc[...] = jnp.zeros_like(acc)

    def body(i, c):
      copies = [pltpu.make_async_copy(x_hbm.at[i, j], buf.at[j], sem.at[0]) for j in range(k)]
      for cp in copies:
        cp.start()
      if body_work:
        acc[...] += 1.0
      for cp in copies:
        cp.wait()
      return c

    lax.fori_loop(0, n, body, 0)
    o_ref[...] = acc[...] + buf[0]

  x = np.arange(n * k * 128, dtype=np.float32).reshape(n, k, 1, 128)
  with pl.virtual_tpu(chip) as tpu:
    out = pl.pallas_call(k_, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), in_specs=[ANY_SPEC],
                         scratch_shapes=[pltpu.VMEM((k, 1, 128), jnp.float32), pltpu.VMEM((8, 128), jnp.float32),
                                         pltpu.SemaphoreType.DMA((1,))])(x)
  np.testing.assert_array_equal(out, np.full((8, 128), float(n) if body_work else 0.0) + x[n - 1, 0])
  starts = sorted(e[3] for e in tpu.reports[-1].events if e[1] == "dma" and e[2] == "hbm->vmem")
  return [starts[i * k:(i + 1) * k] for i in range(n)]


def test_a_dma_only_loop_issues_its_starts_at_the_bare_cost():
  """dma_issue_bare_cycles = 2 (v5e: a loop body of starts and waits alone issues 16 4 KiB starts in ~38
  cycles; beside vector work each start costs the chip ~16-18 in series with it, session 38's
  `dma_beside`): a loop iteration whose basic block, and the latest block before it that started copies
  or computed, issued no vector op starts its copies 2 cycles apart; the same loop with a one-vreg add
  after its starts pays the full `dma_issue_cycles` (8) a start in every iteration, and so does the rule
  off. palace marks blocks at loop back edges and grid steps: the first iteration shares its block with
  the kernel's zeroing store before the loop, the second follows that block, the third is bare."""
  chip = dataclasses.replace(UNIT_CHIP, dma_issue_bare_cycles=2)
  gaps = [[b - a for a, b in zip(it, it[1:])] for it in _loop_starts(chip, False, n=4)]
  assert gaps == [[8, 8, 8]] * 2 + [[2, 2, 2]] * 2
  for it in _loop_starts(chip, True) + _loop_starts(UNIT_CHIP, False):
    assert [b - a for a, b in zip(it, it[1:])] == [8, 8, 8]
