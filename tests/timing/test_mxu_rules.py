"""The MXU issue rules measured on a TPU v5e in session 37 (docs/timing-model.md 1.3, `cost.matmul_issue`):
a product that fills fewer MXUs than the core has holds the MXU unit only for its share, and weights
used again in the same basic block stay latched. Exact timelines on UNIT_CHIP (v5e's MXUs)."""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace._src.sim import cost

from timing_helpers import UNIT_CHIP

BF16 = jnp.bfloat16
CADENCE = UNIT_CHIP.vmatmul_cadence_cycles["bf16"]          # one vmatmul of 16 bf16 rows
LATCH = UNIT_CHIP.latch_cadence_cycles["bf16"] * 128 // 16  # one 128x128 latch
LAT = UNIT_CHIP.mxu_latency_cycles["bf16"]
ONE = CADENCE + LATCH + 4     # an (8, 128) x (128, 128) product: one vmatmul, its latch, MRB reuse
KEPT = CADENCE + 4            # the same with its weights kept latched


def test_small_products_hold_their_share_of_the_mxus():
  assert cost.matmul_mxus(UNIT_CHIP, 8, 128, 128, 1, BF16, BF16) == 1
  assert cost.matmul_mxus(UNIT_CHIP, 32, 128, 128, 1, BF16, BF16) == 2
  assert cost.matmul_mxus(UNIT_CHIP, 8, 128, 512, 1, BF16, BF16) == 4
  assert cost.matmul_mxus(UNIT_CHIP, 128, 128, 128, 1, BF16, BF16) == 4
  assert cost.matmul_issue(UNIT_CHIP, 8, 128, 128, 1, BF16, BF16, False) == (ONE // 4, LAT + ONE - ONE // 4)
  kept = -(-KEPT // 4)
  assert cost.matmul_issue(UNIT_CHIP, 8, 128, 128, 1, BF16, BF16, True) == (kept, LAT + KEPT - kept)
  # a product over every MXU holds them all; its kept weights save its first latch only
  busy, lat = cost.matmul_cycles(UNIT_CHIP, 128, 128, 128, 1, BF16, BF16)
  assert cost.matmul_issue(UNIT_CHIP, 128, 128, 128, 1, BF16, BF16, False) == (busy, lat)
  assert cost.matmul_issue(UNIT_CHIP, 128, 128, 128, 1, BF16, BF16, True) == (busy - LATCH, lat)
  # weights of more latches than MXUs cannot stay: latched or not, the same charge
  assert cost.matmul_issue(UNIT_CHIP, 8, 512, 512, 1, BF16, BF16, True) == \
      cost.matmul_issue(UNIT_CHIP, 8, 512, 512, 1, BF16, BF16, False)


def _chains(x, w, chains, n, unroll):
  """`chains` dot chains in a fori_loop; w (128, 128) or (k, 128, 128): chain c multiplies by w[c % k]."""
  ws = w if w.ndim == 3 else w[None]

  def kernel(x_ref, w_ref, o_ref):
    wv = [w_ref[i] for i in range(ws.shape[0])]
    init = tuple(x_ref[...] + float(c) for c in range(chains))
    out = lax.fori_loop(0, n, lambda i, xs: tuple(
        jnp.dot(v.astype(BF16), wv[c % len(wv)], preferred_element_type=jnp.float32)
        for c, v in enumerate(xs)), init, unroll=unroll)
    acc = out[0]
    for y in out[1:]:
      acc = acc + y
    o_ref[...] = acc

  with pl.virtual_tpu(UNIT_CHIP, trace=True) as tpu:
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))(x, ws)
  report = tpu.reports[-1]
  ends = [e[4] for e in report.events if e[1] == "mxu"]
  return out, [b - a for a, b in zip(ends, ends[1:])]


def _reference(x, w, chains, n):
  ws = np.asarray(w if w.ndim == 3 else w[None], np.float32)
  acc = np.zeros((8, 128), np.float32)
  for c in range(chains):
    v = x + np.float32(c)
    for _ in range(n):
      v = np.asarray(v.astype(BF16), np.float32) @ ws[c % len(ws)]
    acc = acc + v
  return acc


def test_independent_small_dots_share_the_mxus_and_keep_their_weights():
  """Four independent chains of (8, 128) x (128, 128) dots on the same weights: in each iteration of a
  rolled loop the first dot latches them (ONE cycles, a quarter of them on the MXU unit), the other
  three find them latched (KEPT); unrolled, only the very first dot latches."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((8, 128)).astype(np.float32) * 0.1
  w = (rng.standard_normal((128, 128)) * 0.05).astype(BF16)
  out, held = _chains(x, w, chains=4, n=3, unroll=1)
  np.testing.assert_allclose(out, _reference(x, w, 4, 3), rtol=2e-2, atol=1e-3)
  kept = -(-KEPT // 4)
  # (the MXU unit's end, dot after dot: each queues behind the one before it; the iterations' dependent
  # chains wait for the previous results, which come ONE or KEPT cycles after the share plus LAT)
  assert held[0:3] == held[4:7] == [kept] * 3
  _, held = _chains(x, w, chains=1, n=4, unroll=True)
  assert held == [kept] * 3


def test_four_independent_chains_cost_little_more_than_one():
  """What `loop_ilp` measured (171 / 171 / 178 cycles an iteration for 1 / 2 / 4 chains): the three
  other chains' dots end their shares of the MXU unit and their kept latency before the first chain's
  dot, which pays the latch, so four chains cost the model what one does (it charged each dot in
  series before: 3 x ONE cycles more an iteration)."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 128)).astype(np.float32) * 0.1
  w = (rng.standard_normal((128, 128)) * 0.05).astype(BF16)

  def cycles(chains):
    _chains(x, w, chains, 8, 1)
    with pl.virtual_tpu(UNIT_CHIP, timing_only=True) as tpu:
      _chains(x, w, chains, 8, 1)
    return tpu.reports[-1].device_cycles

  assert cycles(4) == cycles(2) == cycles(1) > 8 * (ONE + LAT)


def test_each_mxu_keeps_its_own_weights():
  """Two chains on two weight matrices, unrolled (session 37's holdout, `s37_dilp_c2_w2_u8`: the chip
  takes them in the time of two chains on one matrix): the first dot of each latches, every later one
  finds its weights kept; five matrices in turn overflow the four MXUs, and every dot latches."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((8, 128)).astype(np.float32) * 0.1
  w = (rng.standard_normal((5, 128, 128)) * 0.05).astype(BF16)
  kept = -(-KEPT // 4)
  out, held = _chains(x, w[:2], chains=2, n=3, unroll=True)
  np.testing.assert_allclose(out, _reference(x, w[:2], 2, 3), rtol=2e-2, atol=1e-3)
  assert held[1:] == [kept] * 4 and held[0] == ONE // 4
  _, held = _chains(x, w, chains=5, n=2, unroll=True)
  assert held == [ONE // 4] * 9
