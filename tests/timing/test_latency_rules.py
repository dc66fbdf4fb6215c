"""The vector-latency rules measured on a TPU v5e in session 22 (docs/timing-model.md 1.1 and 1.4), as
exact timelines on UNIT_CHIP: lane-replicated reduction results broadcast on the VPU while any other
(N, 1) column needs an XLU lane broadcast, reductions are charged on their operand's vregs, and a grid
step's bookkeeping overlaps the tail of the step's vector results."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.sim import cost

from timing_helpers import UNIT_CHIP

RED = cost.VECTOR_CLASSES["reduce_lane"]
LBC = cost.VECTOR_CLASSES["lane_broadcast"]
CHEAP_LAT = cost.VECTOR_CLASSES["cheap"][2]


def _run(kernel, *args, out_shape, grid=(), in_specs=None, scratch=()):
  kw = {} if in_specs is None else {"in_specs": in_specs, "out_specs": pl.BlockSpec(out_shape, lambda i: (0, 0))}
  with pl.virtual_tpu(UNIT_CHIP) as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(out_shape, np.float32), grid=grid,
                         scratch_shapes=list(scratch), **kw)(*args)
  return out, tpu.reports[-1]


def _ops(report, unit):
  return [(e[2], e[4] - e[3]) for e in report.events if e[1] == unit]


def test_a_reduction_result_broadcasts_back_on_the_vpu_a_loaded_column_on_the_xlu():
  """x - max(x) needs no lane broadcast (the XLU leaves the max in every lane); x + c for a loaded
  (8, 1) column c does: one XLU lane broadcast of the (8, 128) result's vreg."""
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128) % 13
  c = np.arange(8, dtype=np.float32).reshape(8, 1)

  def sub_max(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = v - jnp.max(v, axis=-1, keepdims=True)

  def add_col(x_ref, c_ref, o_ref):
    o_ref[...] = x_ref[...] + c_ref[...]

  out, r = _run(sub_max, x, out_shape=(8, 128))
  np.testing.assert_array_equal(out, x - x.max(-1, keepdims=True))
  busy = -(-RED[1] // UNIT_CHIP.num_xlus)
  assert _ops(r, "xlu") == [("reduce_lane", busy)]

  out, r = _run(add_col, x, c, out_shape=(8, 128))
  np.testing.assert_array_equal(out, x + c)
  assert _ops(r, "xlu") == [("lane_broadcast", -(-LBC[1] // UNIT_CHIP.num_xlus))]


def test_reductions_are_charged_on_the_operand_vregs():
  """A lane max of (128, 128) is 16 XLU reductions (one per 8 rows); of (8, 1024) one, after VPU folds
  of the 7 other lane tiles; a sum over rows of (128, 128) is 16 vregs of VPU work (15 folds, then one
  vreg's sublane reduction)."""
  def lane_max(x_ref, o_ref):
    o_ref[...] = jnp.broadcast_to(jnp.max(x_ref[...], axis=-1, keepdims=True), o_ref.shape)

  def col_sum(x_ref, o_ref):
    o_ref[...] = jnp.broadcast_to(jnp.sum(x_ref[...], axis=0, keepdims=True), o_ref.shape)

  x = np.arange(128 * 128, dtype=np.float32).reshape(128, 128) % 17
  out, r = _run(lane_max, x, out_shape=(128, 128))
  np.testing.assert_array_equal(out, np.broadcast_to(x.max(-1, keepdims=True), x.shape))
  assert _ops(r, "xlu") == [("reduce_lane", -(-16 * RED[1] // UNIT_CHIP.num_xlus))]

  w = np.arange(8 * 1024, dtype=np.float32).reshape(8, 1024) % 19
  out, r = _run(lane_max, w, out_shape=(8, 1024))
  np.testing.assert_array_equal(out, np.broadcast_to(w.max(-1, keepdims=True), w.shape))
  assert _ops(r, "xlu") == [("reduce_lane", -(-RED[1] // UNIT_CHIP.num_xlus))]
  assert ("cheap", -(-7 // UNIT_CHIP.vpu_alus_per_lane)) in _ops(r, "vpu")   # the 7 folds

  out, r = _run(col_sum, x, out_shape=(128, 128))
  np.testing.assert_array_equal(out, np.broadcast_to(x.sum(0, keepdims=True), x.shape))
  # (the 15 other row tiles folded into one vreg, then that vreg's sublane reduction: a trace shows a
  # queued op from the op before it's start)
  ops = _ops(r, "vpu")
  assert ops[0] == ("cheap", -(-15 // UNIT_CHIP.vpu_alus_per_lane)) and ops[1][0] == "reduce_sublane"


@pytest.mark.parametrize("links", [2, 3])
def test_a_grid_step_overlaps_the_tail_of_its_chain(links):
  """A grid step with `links` dependent x - max(x) * 0.5 on one vreg costs its chain plus the drain (the
  step's bookkeeping overlaps the chain's tail), so each link more adds its latency (the reduction, the
  multiply, the VPU broadcast back, the subtract) to every step, and a step with no chain costs the
  bookkeeping alone: the one-link step is shorter than bookkeeping + chain by the bookkeeping less the
  drain."""
  steps = 4

  def cycles(n):
    def kernel(x_ref, o_ref, acc_ref):
      @pl.when(pl.program_id(0) == 0)
      def _():
        acc_ref[...] = x_ref[...]
      v = acc_ref[...]
      for _ in range(n):
        v = v - jnp.max(v, axis=-1, keepdims=True) * 0.5
      acc_ref[...] = v
      o_ref[...] = v

    x = np.full((8, 128), 2.0, np.float32)
    spec = pl.BlockSpec((8, 128), lambda i: (0, 0))
    out, r = _run(kernel, x, out_shape=(8, 128), grid=(steps,), in_specs=[spec],
                  scratch=[pltpu.VMEM((8, 128), jnp.float32)])
    v = x.copy()
    for _ in range(n * steps):
      v = v - v.max(-1, keepdims=True) * 0.5
    np.testing.assert_allclose(out, v)
    grid = [e for e in r.events if e[1] == "scalar" and e[2] == "grid step"]
    return r.device_cycles, grid

  link = RED[2] + 2 * CHEAP_LAT   # the reduction, * 0.5, the subtract (its lane-replicated operand: no broadcast)
  base, grid0 = cycles(0)
  one, _ = cycles(1)
  more, _ = cycles(links)
  assert more - one == steps * (links - 1) * link
  # the bookkeeping overlaps a chain's tail: one link costs each step less than its latency (where a
  # drain before the bookkeeping would add it in full), but more than the latency less the bookkeeping
  overlap = UNIT_CHIP.grid_step_overhead_cycles - UNIT_CHIP.grid_step_drain_cycles
  assert steps * (link - overlap) < one - base < steps * link
  # with no chain the next step issues the bookkeeping after the previous one: 40 cycles a step apart
  starts = [e[3] for e in grid0]
  ends = [e[4] for e in grid0]
  assert all(e - s == UNIT_CHIP.grid_step_overhead_cycles for s, e in zip(starts, ends))


def _eup_events(report):
  return [(e[2], e[3], e[4]) for e in report.events if e[1] == "eup"]


def test_back_to_back_eup_ops_are_two_cycles_apart_and_a_lone_one_is_not_delayed():
  """Measured on a TPU v5e (benchmarks/hw eup_curve, session 36): an EUP op streams its vregs at one a
  cycle, an op queued behind another starts QUEUE_GAP_CYCLES after it (a grid step's chain of tanh
  links on 16 / 64 / 256 vregs costs 18 / 67 / 259 cycles a link), and a lone op's result comes
  `latency` after its last vreg (one-vreg tanh links 8.9 cycles: 7 + the multiply's 2)."""
  gap = cost.QUEUE_GAP_CYCLES["eup"]
  lat = cost.VECTOR_CLASSES["transcendental"][2]
  x = (np.arange(128 * 128, dtype=np.float32).reshape(128, 128) % 7) * 0.1

  def two(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = jnp.tanh(v) + jnp.tanh(v * 0.5)   # (independent: the second queues behind the first)

  out, r = _run(two, x, out_shape=(128, 128))
  np.testing.assert_allclose(out, np.tanh(x) + np.tanh(x * 0.5), rtol=1e-6, atol=1e-6)
  (a, s0, e0), (b, s1, e1) = _eup_events(r)
  assert (a, b) == ("transcendental", "transcendental")
  assert e0 - s0 == 16 and e1 == e0 + gap + 16

  def chain(links):
    def k(x_ref, o_ref):
      v = x_ref[...][:8]
      for _ in range(links):
        v = jnp.tanh(v)   # (each waits for the last one's result; the gap hides behind that wait)
      o_ref[...] = v
    return k

  cycles = []
  for links in (1, 2, 3):
    out, r = _run(chain(links), x, out_shape=(8, 128))
    want = x[:8]
    for _ in range(links):
      want = np.tanh(want)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    cycles.append(r.device_cycles)
  assert cycles[1] - cycles[0] == cycles[2] - cycles[1] == lat


def test_exp_is_two_cycles_slower_than_exp2_and_tanh():
  """Measured on a TPU v5e (eup_curve, session 36): one-vreg chains of exp links cost 10.9 cycles a link,
  exp2 and tanh links 8.9 (Mosaic's LLO has one llo.vexp a vreg, no multiply before it): exp is its own cost
  class with two cycles more latency, on the EUP like the others."""
  assert cost.VECTOR_CLASSES["transcendental_exp"] == ("eup", 1, cost.VECTOR_CLASSES["transcendental"][2] + 2)
  x = (np.arange(8 * 128, dtype=np.float32).reshape(8, 128) % 7) * -0.1

  def chain(fn):
    def k(x_ref, o_ref):
      v = x_ref[...]
      for _ in range(4):
        v = fn(v) * 0.25
      o_ref[...] = v
    return k

  cycles = {}
  for name, fn, ref in (("exp", jnp.exp, np.exp), ("exp2", jnp.exp2, np.exp2), ("tanh", jnp.tanh, np.tanh)):
    out, r = _run(chain(fn), x, out_shape=(8, 128))
    want = x
    for _ in range(4):
      want = ref(want) * 0.25
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)
    cycles[name] = r.device_cycles
    assert {e[0] for e in _eup_events(r)} == {"transcendental_exp" if name == "exp" else "transcendental"}
  assert cycles["exp2"] == cycles["tanh"] and cycles["exp"] - cycles["tanh"] == 4 * 2


def test_a_reduction_accumulates_its_vregs_in_a_dependent_chain():
  """Measured on a TPU v5e (session 37: `eups_exp_sum_r2048`, a column sum of 256 exp vregs, cost the chip
  ~567 cycles a step, 310 more than the exp stream alone; `lpart_sublane_sum`): a reduction first adds its
  operand's vregs into one vreg per output tile, one after another. A sum over the rows of (128, 128) is
  15 dependent adds (CHEAP_LAT each) and then one vreg's sublane reduction; a sum over the leading axis of
  (32, 8, 128) is 31 adds; a lane max of (8, 128) has nothing to accumulate."""
  got = {}

  def kernel(x_ref, y_ref, o_ref):
    x = x_ref[...]
    rows = jnp.sum(x, axis=0, keepdims=True)
    lead = jnp.sum(y_ref[...], axis=0)
    got["x"], got["rows"], got["lead"] = x._ready, rows._ready, lead._ready
    o_ref[...] = rows + lead

  x = (np.arange(128 * 128, dtype=np.float32).reshape(128, 128) % 5) * 0.5
  y = (np.arange(32 * 8 * 128, dtype=np.float32).reshape(32, 8, 128) % 3) * 0.25
  with pl.virtual_tpu(UNIT_CHIP, trace=True) as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))(x, y)
  np.testing.assert_allclose(out, x.sum(0, keepdims=True) + y.sum(0), rtol=1e-6)
  vpu = [(e[2], e[3]) for e in tpu.reports[-1].events if e[1] == "vpu"]
  (c1, s1), (sub, _), (c2, s2) = vpu[:3]
  assert (c1, sub, c2) == ("cheap", "reduce_sublane", "cheap")
  sub_lat = cost.VECTOR_CLASSES["reduce_sublane"][2]
  assert got["rows"] == max(s1 + 15 * CHEAP_LAT, got["x"] + CHEAP_LAT) + sub_lat
  assert got["lead"] == s2 + 31 * CHEAP_LAT
