"""The timing model against the kernels measured on a real TPU v5e (benchmarks/hw, recorded data).

Every case of benchmarks/hw/cases.py is built as it was on the chip, modelled by palace.jax on `v5e`
(timing only) and compared with its recorded device time (benchmarks/hw/data/v5e-timing-*.jsonl: runs
on 2026-12-05 to -08 (UTC), JAX 0.10.2, run-to-run spread 0.2% median). No TPU is used: the data is recorded.
Since session 30 the recorded time is the kernel's own (the XLA ops the module runs beside it left out,
`model.kernel_times`) and the jax wheel's kernels that changed after the chip's JAX are modelled from
the chip's JAX's files (`chip_wheel.py`); the bounds of flash, fa_published, gmm, paged attention,
scalar_prefetch, pv_parts, xlu_eup and holdout moved with that (docs/validation.md, "Session 30").

BOUNDS holds, per family, the median and worst |error| the model reaches today (rounded up to a whole
percent): a change that makes a family worse fails here. Families within issue 36's target (median
<= 5%, every point within 15%) are marked; the others are known gaps with their reasons in
docs/validation.md, "Measured on a TPU v5e".
"""
import os
import statistics
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from benchmarks.hw import chip_wheel, model  # noqa: E402

TARGET = (0.05, 0.15)
# family: (median |error| bound, worst |error| bound); "*": within issue 36's target
BOUNDS = {
    "elementwise": (0.02, 0.05), "transcendental": (0.02, 0.03), "softmax": (0.02, 0.10),
    "norm": (0.02, 0.03), "reduce": (0.01, 0.02), "fill": (0.01, 0.01), "dma_hbm": (0.01, 0.10),
    "dma_loop": (0.01, 0.01), "copy": (0.01, 0.08), "emit_pipeline": (0.02, 0.02),
    "step_loop": (0.03, 0.14),
    "matmul": (0.02, 0.04), "matmul_dtype": (0.03, 0.09), "matmul_skinny": (0.01, 0.09),
    "transpose": (0.09, 0.14), "scalar_prefetch": (0.08, 0.11), "small_launch": (0.03, 0.09),
    "flash": (0.04, 0.14), "splash": (0.03, 0.06), "gmm": (0.05, 0.05),
    "paged_attention": (0.16, 0.21), "op_chain": (0.03, 0.10), "dma_probe": (0.03, 0.10),
    "dma_sync": (0.02, 0.03), "op_overlap": (0.03, 0.11), "step_sweep": (0.05, 0.14),
    "step_mix": (0.12, 0.24), "dma_curve": (0.05, 0.11), "dma_order": (0.07, 0.28),
    # session 21 (cases_fence.py): probes of the issue rules
    "dma_fence": (0.03, 0.08), "loop_ilp": (0.04, 0.19), "dma_chunk": (0.08, 0.14),
    "pipe_fence": (0.04, 0.10), "flash_parts": (0.11, 0.23), "compute_parts": (0.06, 0.11),
    "latency_parts": (0.08, 0.13),
    # session 22 (cases_chain.py): the chains the vector latencies were fitted on
    "step_chain": (0.05, 0.15), "loop_chain": (0.04, 0.10),
    # session 22's last call, recorded for the next model step (the DMA-wait sync beside compute)
    "sync_sweep": (0.05, 0.09),
    # session 23 (cases_stream.py): the DMA wait's form and unit streaming, recorded for the next step
    "sync_size": (0.04, 0.08), "stream_pair": (0.04, 0.14), "unit_overlap": (0.03, 0.27),
    "pv_parts": (0.06, 0.09),
    "xlu_eup": (0.03, 0.15), "chain_dot": (0.02, 0.05),
    # session 24 (cases_parts.py): a matmul step's compute and copies apart, pv_softmax's rescale taken
    # apart, the pipeline's per-step cost per operand and grid rank, the wheel's flash step on fixed blocks
    "mm_parts": (0.05, 0.08), "pv_more": (0.09, 0.18), "step_ops": (0.09, 0.20), "wheel_step": (0.03, 0.09),
    # session 25 (cases_move.py): the flash step with moving blocks, chained dots, output block changes,
    # skipped steps
    "wheel_move": (0.03, 0.06), "mxu_chain": (0.02, 0.06), "out_switch": (0.05, 0.16),
    "skip_step": (0.03, 0.04),
    "copy_cost": (0.04, 0.11),
    # session 26 (cases_gather.py): the paged-attention step's page copies and the causal flash mask
    "page_gather": (0.04, 0.08), "causal_mask": (0.04, 0.07), "splash_step": (0.04, 0.05),
    "out_heavy": (0.03, 0.03), "splash_machinery": (0.03, 0.12),
    # session 27 (cases_branch.py): splash's machinery apart (a runtime branch around a heavy body,
    # index maps computing or reading SMEM tables)
    "step_branch": (0.03, 0.06),
    # session 27: benchmarks.validate's published flash-attention configuration (fa-*) on the chip
    "fa_published": (0.06, 0.07),
    # session 27: page_gather's page copies beside the wheel's flash step
    "page_heavy": (0.09, 0.13),
    # session 28 (cases_paged.py): the wheel's paged attention swept one parameter at a time, and the
    # 128-block tutorial matmul at 2048^3 and 4096^3 (the calibration point measured on the chip)
    "paged_sweep": (0.13, 0.32), "matmul_k": (0.03, 0.03),
    # session 28: paged attention's rolled page walk written plainly (copies, then the paged step)
    "page_loop": (0.07, 0.09),
    # session 28: that walk with its copies started 0 or 2 blocks ahead (how copies in flight overlap)
    "page_order": (0.05, 0.08),
    # session 28: that walk with the wheel's copy order (a block's K pages, then its V pages)
    "page_kfirst": (0.04, 0.06),
    # session 28: that walk prefetching the next grid step's first block (no cold step start)
    "page_cross": (0.01, 0.01),
    # session 28: that walk with the wheel's step line for line
    "page_wheelbody": (0.06, 0.10),
    # session 28: that walk with the wheel's dynamic trip count and a q block moving every step
    "page_wheelgrid": (0.02, 0.02),
    # session 29 (cases_mmstep.py): the 128-block tutorial matmul's step taken apart, and copy-only
    # pipelines of 32 and 64 KiB blocks of several dtypes and shapes with their output write-backs
    "mm_step": (0.05, 0.08), "copy_shape": (0.10, 0.26),
    # session 29: copy_shape's step with 2-D windows, the 3-D grid, the tutorial's copies alone
    "copy_window": (0.03, 0.03),
    # session 30 (cases_size.py): the wheel's flash at head_dim 64 over batch and sequence (does the step
    # grow with the operands?), the bf16 single-row gather again (its kernel: 37 cycles a step on the
    # chip), and the flash step's dots and whole step at head_dim 32-256. Since session 34 the head_dim
    # 64 operands and the bf16 gather table are in VMEM, where XLA puts them (jax/xla_placement.py):
    # read in place, no index map charged: flash_size 11.2% / 12.8% -> 2.4% / 4.4%, gather_rows1 +764%
    # -> +12%
    "flash_size": (0.03, 0.05), "gather_rows1": (0.10, 0.12), "head_dim": (0.05, 0.14),
    # session 30: a causal flash grid's q-row ends (with and without the output change)
    "row_end": (0.05, 0.11),
    # session 32 (cases_book.py): a grid step's own bookkeeping by grid rank, operand count and map form
    "step_book": (0.03, 0.14),
    # session 32 (cases_paged.py): page_wheelgrid's walk with JAX 0.10.2's wheel copy handling
    "page_wheelcopy": (0.04, 0.06),
    # session 33 (cases_issue.py): bursts of copies (reads, writes) over their number and size, waits on
    # rebuilt descriptors
    "write_burst": (0.01, 0.10),
    "dma_issue": (0.03, 0.34),
    # session 34 (cases_issue.py, cases_book.py): a page walk's start forms one at a time on a burst, and
    # what a never-taken pl.when costs beside a grid step's bookkeeping
    "issue_form": (0.03, 0.08), "step_body": (0.04, 0.06),
    # session 35 (cases_start.py): rounds of copies double-buffered in each start form (the engine streams)
    "start_form": (0.02, 0.07),
    # session 35 (cases_eup.py): the exp stream taken apart beside nothing, a dot or a lane max
    "eup_stream": (0.03, 0.22),
    # session 36 (cases_chain.eup_curve_cases): EUP chains by size, loops by chain length
    "eup_curve": (0.03, 0.09),
    # session 36 (cases_chain.step_raw_cases): one add or tanh link a grid step, reading the last store or not
    "step_raw": (0.02, 0.08),
    # session 37 (cases_s37.py, predicted first): the session's reduction, store and MXU rules on new shapes
    "reduce_chain": (0.08, 0.16),
    "store_stream": (0.03, 0.09),
    "dot_ilp": (0.13, 0.18),
    # session 37 (cases_start.start_body_cases, predicted first): DMA starts beside vector work
    "start_body": (0.06, 0.17),
    # session 38 (cases_s38, predicted first): vector work of six kinds beside 16 / 4 / 1 copies a round;
    # dead_store: the chip's compiler stores a scratch the loop never reads once, after the loop
    "dma_beside": (0.06, 0.31), "dead_store": (0.32, 16.15),
    # session 38's second call (cases_s38.write_queue_cases, predicted first): a write after a queued read
    "write_queue": (0.08, 0.19),
    # session 38's third call (cases_s38.vpu_chain_cases, predicted first): dependent VPU chains by width
    "vpu_chain": (0.10, 0.38),
    # measured after 655fb6c's predictions were recorded (v5e-holdout-predictions-*.json); the model
    # changed after that (the DMA-wait sync rule), so these are no longer blind predictions
    "holdout": (0.02, 0.16),
    # session 22: predicted (v5e-holdout-predictions-2026-12-06.json) before the chip ran them
    "holdout_chain": (0.04, 0.09),
}


def test_every_measured_family_has_a_bound():
  """Every recorded case's family (as benchmarks/hw/cases.py names it: the comparison's families; session
  38 filed four cases recorded under dma_beside as dead_store) has a bound, and nothing else does."""
  _, recs = model.load()
  assert {c.family for c in model.all_cases() if c.name in recs} == set(BOUNDS)
  assert len(recs) >= 993


@pytest.mark.parametrize("family", sorted(BOUNDS))
def test_family_error_within_its_bound(family):
  rows = [r for r in model.compare(only=family) if r.family == family]
  assert rows, family
  errs = [abs(r.error) for r in rows]
  med_bound, worst_bound = BOUNDS[family]
  worst = max(rows, key=lambda r: abs(r.error))
  assert statistics.median(errs) <= med_bound, (family, statistics.median(errs))
  assert abs(worst.error) <= worst_bound, (worst.name, worst.measured_us, worst.modelled_us)


def test_the_holdout_predictions_were_recorded_before_the_measurement():
  """The holdout predictions (model 655fb6c) were committed before the holdout kernels ran on the chip;
  the file holds every holdout case and the measured file none that the predictions lack."""
  import json
  path = os.path.join(model.DATA_DIR, "v5e-holdout-predictions-2026-12-05.json")
  with open(path) as f:
    rec = json.load(f)
  _, recs = model.load()
  measured = {n for n, r in recs.items() if r["family"] == "holdout"}
  assert rec["model_commit"] == "655fb6c" and set(rec["predicted_us"]) == measured


def test_the_recorded_data_names_its_chip_and_jax():
  envs, _ = model.load()
  assert len(envs) >= 6
  for env in envs:
    assert env["device_kind"] == "TPU v5 lite" and env["jax_version"] == chip_wheel.CHIP_JAX
    assert env["date"] in ("2026-12-05", "2026-12-06", "2026-12-07", "2026-12-08") and env["platform"] == "tpu"


def test_the_session_22_predictions_were_blind_and_within_10_percent():
  """The holdout_chain predictions were committed (2887ed9) before the chip ran those kernels; the
  recorded predictions, not today's model, are each within 10% of what the chip measured."""
  import json
  path = os.path.join(model.DATA_DIR, "v5e-holdout-predictions-2026-12-06.json")
  with open(path) as f:
    predicted = json.load(f)["modelled_us"]
  _, recs = model.load()
  measured = {n: r["measured_us"] for n, r in recs.items() if r["family"] == "holdout_chain"}
  assert set(predicted) == set(measured) and len(measured) == 10
  for n, us in measured.items():
    assert abs(predicted[n] / us - 1) < 0.10, (n, predicted[n], us)


def test_the_kernel_time_leaves_out_the_xla_ops_beside_the_kernel():
  """A case's measured time is its kernel's: the module's time less the other ops of its first launch
  (the kernel is the op named after the case, else the longest non-XLA op); a lone op is the module."""
  ops = [["copy-start", "XLA Ops", 0.5], ["copy", "XLA Ops", 30.0], ["hw_case.1", "XLA Ops", 100.0],
         ["copy.1", "XLA Ops", 4.5]]
  assert model.kernel_times({"module_us": [135.25, 136.0], "ops_first_run": ops}) == [100.25, 101.0]
  wheel = [["fusion.9", "XLA Ops", 0.9], ["while.22", "XLA Ops", 2.5], ["gmm.1", "XLA Ops", 250.0]]
  assert model.kernel_times({"module_us": [254.0], "ops_first_run": wheel}) == [250.6]
  lone = [["hw_copy_x.1", "XLA Ops", 6.98]]
  assert model.kernel_times({"module_us": [7.0], "ops_first_run": lone}) == [7.0]
  _, recs = model.load()
  fa = recs["fapub_s512"]   # the wheel's flash attention at head_dim 64: XLA relays out q, k and v
  assert 1880 < fa["measured_us"] < 1882 and 2034 < fa["median_us"] < 2035


def test_the_changed_wheel_kernels_are_modelled_from_the_chips_jax():
  """splash and paged attention changed between the chip's JAX and palace.jax's: the comparison loads
  the chip's files (unchanged ones are the plain import)."""
  import jax
  splash = chip_wheel.wheel_module("splash_attention.splash_attention_kernel")
  paged = chip_wheel.wheel_module("paged_attention.paged_attention_kernel")
  flash = chip_wheel.wheel_module("flash_attention")
  assert jax.__version__ != chip_wheel.CHIP_JAX
  assert splash.__name__.endswith("_jax_0_10_2.splash_attention.splash_attention_kernel")
  assert chip_wheel.WHEEL in paged.__file__ and callable(paged.paged_attention)
  assert flash is sys.modules["jax.experimental.pallas.ops.tpu.flash_attention"]


def test_a_missing_chip_wheel_says_how_to_fetch_it(monkeypatch, tmp_path):
  monkeypatch.setattr(chip_wheel, "WHEEL_DIR", str(tmp_path))
  monkeypatch.delitem(sys.modules, "benchmarks.hw._jax_0_10_2.paged_attention.paged_attention_kernel",
                      raising=False)
  with pytest.raises(chip_wheel.ChipWheelMissing,
                     match=r"ran JAX 0\.10\.2's paged_attention.*python -m benchmarks\.hw\.chip_wheel "
                           r"\(scripts/test\.sh runs it: pip download jax==0\.10\.2 --no-deps\)"):
    chip_wheel.wheel_module("paged_attention.paged_attention_kernel")


def test_the_session_30_predictions_were_recorded_before_the_chip_ran_them():
  """Session 30's predictions (v5e-s30-predictions-2026-12-07.json, committed before each device call)
  cover exactly its measured cases; recorded against recorded: the candidate set predicted the wheel's
  flash step on fixed blocks at head_dim 64 and 128 within 3%, today's model 15-18% short; and the
  causal row without q copies (`rend_fixedq`) within 1%, both models."""
  import json
  with open(os.path.join(model.DATA_DIR, "v5e-s30-predictions-2026-12-07.json")) as f:
    rec = json.load(f)
  _, recs = model.load()
  measured = {n: r["measured_us"] for n, r in recs.items()
              if r["family"] in ("flash_size", "gather_rows1", "head_dim", "row_end")}
  assert set(rec["modelled_us"]) == set(rec["candidate_modelled_us"]) == set(measured)
  assert len(measured) == 27 and rec["model_commit"] == "c8a3929"
  for n in ("hdim_full_d64", "hdim_full_d128"):
    assert abs(rec["candidate_modelled_us"][n] / measured[n] - 1) < 0.03
    assert -0.18 < rec["modelled_us"][n] / measured[n] - 1 < -0.15
  for pred in (rec["modelled_us"], rec["candidate_modelled_us"]):
    assert abs(pred["rend_fixedq"] / measured["rend_fixedq"] - 1) < 0.015


def _recorded_predictions(fname: str, families: tuple, model_commit: str):
  """(predicted us per case, measured us per case) of a session's predictions file (benchmarks/hw/data),
  checked to cover exactly the measured cases of `families` and to name the model it was made with."""
  import json
  with open(os.path.join(model.DATA_DIR, fname)) as f:
    rec = json.load(f)
  _, recs = model.load()
  measured = {n: r["measured_us"] for n, r in recs.items() if r["family"] in families}
  assert set(rec["cases"]) == set(measured) and rec["model"] == model_commit
  return rec["cases"], measured


def test_the_session_34_predictions_were_recorded_before_the_chip_ran_them():
  """Session 34's predictions (v5e-s34-predictions-2026-12-07.json: the model of fa6c158, committed in
  867ab22 before the device call) cover exactly its measured timing cases. The model then charged a grid step with no
  condition in its body what step_book's step with two costs (body_w0_noadd_nofirst +36%, three
  never-taken conditions -19%); with the branch rule every step_body case is within 6%."""
  pred, measured = _recorded_predictions("v5e-s34-predictions-2026-12-07.json", ("issue_form", "step_body"),
                                         "fa6c158")
  assert len(measured) == 15
  assert pred["body_w0_noadd_nofirst"] / measured["body_w0_noadd_nofirst"] - 1 > 0.3
  assert pred["body_w3_noadd"] / measured["body_w3_noadd"] - 1 < -0.15
  for row in model.compare(only="step_body"):
    assert abs(row.error) < 0.06, (row.name, row.measured_us, row.modelled_us)


def test_the_session_35_predictions_were_recorded_before_the_chip_ran_them():
  """Session 35's predictions (v5e-s35-predictions-2026-12-07.json: the model of 14a65dc, committed in
  28d1fb5 before the device call) cover exactly its start_form cases. The model charged every start 16
  scalar cycles, which rounds of 4 KiB copies of consecutive rows do not pay in a stream (+17..+20%: the
  chip's 16 starts take ~38 cycles there, docs/validation.md "Session 35"); random pages and 8-16 KiB
  copies, whose engine time bounds the round, within 10%."""
  pred, measured = _recorded_predictions("v5e-s35-predictions-2026-12-07.json", ("start_form",), "14a65dc")
  assert len(measured) == 12
  for n in ("sf_seq_unroll_one", "sf_seq_dyn_one"):
    assert 0.15 < pred[n] / measured[n] - 1 < 0.21, n
  for n in ("sf_page_unroll_one", "sf_page_dyn_one", "sf_page_dyn_one_8KiB", "sf_page_dyn_one_16KiB"):
    assert abs(pred[n] / measured[n] - 1) < 0.10, n


def test_the_session_35b_predictions_were_recorded_before_the_chip_ran_them():
  """Session 35's second timing call (v5e-s35b-predictions-2026-12-07.json: the model of 6911d5e,
  committed in 9ff708f before the call) covers exactly its eup_stream cases. What it showed: a plain VPU
  stream accumulating into VMEM (c += b * 1e-3) beside an MXU dot or a lane max costs the chip nearly
  their sum, as the exp stream does (palace overlaps them: -21..-25%), while an exp stream summed in
  registers (no big store) overlaps both to within 2%: the shared resource is the stores, not the EUP
  (docs/validation.md "Session 35")."""
  pred, measured = _recorded_predictions("v5e-s35b-predictions-2026-12-07.json", ("eup_stream",), "6911d5e")
  assert len(measured) == 12
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  assert err["eups_dot_vpu_r2048"] < -0.2 and err["eups_max_vpu_r2048"] < -0.2
  assert abs(err["eups_dot_exp_sum_r2048"]) < 0.02 and abs(err["eups_max_exp_sum_r2048"]) < 0.03
  assert abs(err["eups_vpu_r2048"]) < 0.03


def test_the_session_36_predictions_were_recorded_before_the_chip_ran_them():
  """Session 36's call (v5e-s36-predictions-2026-12-07.json: the model of 2d0fccd, committed in 23231af
  before the device call) covers exactly its eup_curve cases. The model then charged a one-vreg tanh
  link 10 cycles of EUP latency (+30% on the unrolled chains: the chip's link is 8.9 cycles, exp's 10.9)
  and a rolled loop 3 cycles after its drain (+23..+29% on 2-4 multiply-adds an iteration: the chip's
  iteration is its chain, or 9-10 cycles); with the EUP's latency, its queue gap, exp's class and the
  iteration floor (docs/timing-model.md 1.1, 1.4) those come within 3% / 8%."""
  pred, measured = _recorded_predictions("v5e-s36-predictions-2026-12-07.json", ("eup_curve",), "2d0fccd")
  assert len(measured) == 20
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  assert all(0.28 < err[f"ecurve_tanh_r{r}_u8"] < 0.31 for r in (8, 16, 32))
  assert all(0.22 < err[f"lfloor_fma_k{k}_u1"] < 0.30 for k in (2, 3, 4))
  now = {row.name: row.error for row in model.compare(only="eup_curve")}
  assert all(abs(now[f"ecurve_tanh_r{r}_u8"]) < 0.03 for r in (8, 16, 32))
  assert all(abs(now[f"lfloor_fma_k{k}_u1"]) < 0.08 for k in (2, 3, 4))


def test_the_session_36b_predictions_were_recorded_before_the_chip_ran_them():
  """Session 36's second call (v5e-s36b-predictions-2026-12-07.json: the model of c8cf8d7, committed in
  fdbba05 before the call) covers exactly its step_raw cases. What it showed: a grid step that loads what
  the step before it stored costs the chip what one that loads a fixed input does (within 0.1% at 16 and
  64 vregs: no store-to-load wait), as the model has it; but a step's one tanh link on 16 / 64 vregs
  costs the chip ~7 cycles more than an add link (its in-kernel timeline: the body's segment 37 against
  30 cycles), which the model does not charge (-19% / -10%)."""
  pred, measured = _recorded_predictions("v5e-s36b-predictions-2026-12-07.json", ("step_raw",), "c8cf8d7")
  assert len(measured) == 12
  for op in ("add", "tanh"):
    for rows in (128, 512):
      raw, fresh = measured[f"sraw_{op}_r{rows}_raw"], measured[f"sraw_{op}_r{rows}_fresh"]
      assert abs(raw / fresh - 1) < 0.002
      assert pred[f"sraw_{op}_r{rows}_raw"] == pred[f"sraw_{op}_r{rows}_fresh"]
  assert measured["sraw_tanh_r128_raw"] / measured["sraw_add_r128_raw"] > 1.12
  assert pred["sraw_tanh_r128_raw"] / measured["sraw_tanh_r128_raw"] - 1 < -0.15


def test_the_session_37_predictions_were_recorded_before_the_chip_ran_them():
  """Session 37's holdout (v5e-s37-predictions-2026-12-07.json: the model of 5e55a50, committed in
  79ff751 before the device call) covers exactly its reduce_chain, store_stream and dot_ilp cases: the
  session's reduction chain, block-store and MXU rules on shapes they were not fitted on. What it
  showed: long row and leading-axis sums within 3% (the model before the chain rule: -70%), store
  streams within 9%; but the lane tiles of a wide row fold without a chain (+20% predicted), and two
  chains on two weight matrices cost the chip what two on one do (+28% predicted: since then each MXU
  keeps its own weights)."""
  pred, measured = _recorded_predictions("v5e-s37-predictions-2026-12-07.json",
                                         ("reduce_chain", "store_stream", "dot_ilp"), "5e55a50")
  assert len(measured) == 19
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  for n in ("s37_rchain_rows_r1024", "s37_rchain_lead_r1024", "s37_sstream_exp_r1024",
            "s37_sstream_tanh_add_r512"):
    assert abs(err[n]) < 0.03, n
  assert err["s37_rchain_lanes_w2048_r8"] > 0.18 and err["s37_dilp_c2_w2_u8"] > 0.25
  assert abs(measured["s37_dilp_c2_w2_u8"] / measured["s37_dilp_c2_w1_u8"] - 1) < 0.01
  now = {row.name: row.error for row in model.compare(only="s37_")}
  assert abs(now["s37_rchain_lanes_w2048_r8"]) < 0.06 and abs(now["s37_dilp_c2_w2_u8"]) < 0.14


def test_the_session_37b_predictions_were_recorded_before_the_chip_ran_them():
  """Session 37's second call (v5e-s37b-predictions-2026-12-07.json: the model of 379af34, committed in
  7c0fd76 before the call) covers exactly its start_body cases. What it showed, for the next DMA step:
  vector work beside a stream's starts costs the chip time the model hides (64 vregs of multiply-add
  between the starts and the waits +7.6 us over 256 rounds, before the starts +3.9 us; the model: +0.03
  and 0), and work on the landed copies after the waits +17.1 us (the model +1.5): the model's bare
  rounds are 19% slow (its 16 issue cycles a start), its rounds with work 6-12% slow or 6% fast."""
  pred, measured = _recorded_predictions("v5e-s37b-predictions-2026-12-07.json", ("start_body",), "379af34")
  assert len(measured) == 8
  assert 7.0 < measured["sb_v64_after"] - measured["sb_none"] < 8.2
  assert 3.4 < measured["sb_v64_before"] - measured["sb_none"] < 4.4
  assert 16.0 < measured["sb_dep"] - measured["sb_none"] < 18.0
  assert pred["sb_v64_after"] - pred["sb_none"] < 0.1 and pred["sb_none"] / measured["sb_none"] - 1 > 0.18


def test_the_session_38_predictions_were_recorded_before_the_chip_ran_them():
  """Session 38's call (v5e-s38-predictions-2026-12-08.json: the model of 6c76574, committed in ed01ea9
  before the call) covers exactly its dma_beside and dead_store cases. What it showed: 16 4 KiB reads a
  round cost the chip their round trip alone (the model's 16 issue cycles a start: +16%) but the work
  plus ~18 cycles a copy beside ~256 vregs of any kind of vector work (the model within 1% for loads
  and stores, exp and 1024 vregs), while 4 or 1 copies a round hide the same work; since then a DMA-only
  loop body's starts cost 2 cycles (hw.ChipSpec.dma_issue_bare_cycles). And the chip's compiler stores
  a scratch that a loop stores every round and never reads once, after the loop (`b38_c0_st`: 1.3 us
  where 256 vregs a round take 23)."""
  pred, measured = _recorded_predictions("v5e-s38-predictions-2026-12-08.json", ("dma_beside", "dead_store"),
                                         "6c76574")
  assert len(measured) == 36
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  assert 0.15 < err["b38_c16x4k_none"] < 0.18
  for n in ("b38_c16x4k_ldst", "b38_c16x4k_eup", "b38_c16x4k_ldst4", "b38_w16x4k_ldst"):
    assert abs(err[n]) < 0.01, n
  for work in ("ldst", "ld", "reg", "eup"):   # 16 copies add about the work; 4 and 1 hide it
    assert measured[f"b38_c16x4k_{work}"] - measured["b38_c16x4k_none"] > 0.65 * measured[f"b38_c0_{work}"]
    for tag in ("c4x16k", "c1x64k"):
      assert measured[f"b38_{tag}_{work}"] - measured[f"b38_{tag}_none"] < 2.0
  assert measured["b38_c0_st"] < 0.1 * measured["b38_c0_ldst"]
  now = {row.name: row.error for row in model.compare(only="b38_c16x4k_none")}
  assert abs(now["b38_c16x4k_none"]) < 0.02


def test_the_session_38b_predictions_were_recorded_before_the_chip_ran_them():
  """Session 38's second call (v5e-s38b-predictions-2026-12-08.json: the model of 97a5aa5, committed in
  f99c924 before the call) covers exactly its write_queue cases. What it showed: a 128 KiB read started
  behind a 512 KiB write lands before a second 512 KiB write started 0-900 ns after it (the rounds'
  delay after the read's wait hides under that write: 63-69 us over 32 rounds, where the model's
  write-first order predicted 90), while a second 128 KiB write goes first; the skinny K = 128 matmuls,
  whose output writes are 256 KiB-1 MiB, were predicted +22..+40%. Since then a write larger than the
  HBM write buffer waits for a read queued behind a write (hw.ChipSpec.dma_big_write_waits_queued_read)."""
  pred, measured = _recorded_predictions("v5e-s38b-predictions-2026-12-08.json", ("write_queue",), "97a5aa5")
  assert len(measured) == 15
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  assert all(err[f"wq_w512_r128_d{d}"] > 0.3 for d in (0, 200, 600))
  assert abs(err["wq_w128_r128_d0"]) < 0.03 and abs(err["wq_w512_noread"]) < 0.01
  assert all(err[n] > 0.2 for n in measured if n.startswith("skinny_k128"))
  now = {row.name: row.error for row in model.compare(only="wq_w512_r128_d")}
  assert all(abs(e) < 0.06 for e in now.values()), now


def test_the_session_38c_predictions_were_recorded_before_the_chip_ran_them():
  """Session 38's third call (v5e-s38c-predictions-2026-12-08.json: the model of 10d6a3b, committed in
  7b69260 before the call) covers exactly its vpu_chain cases, recorded for the next VPU step. What it
  showed: a chain of dependent adds costs the chip ~2.3 cycles an op on 1 or 8 vregs alike, and so does
  a multiply-add chain on 1-4 vregs, but on 8 / 16 / 32 vregs it costs ~3.3 / 5.5 / 9.6 cycles an op
  (palace: 2 / 2.7 / 5.5, -32 / -23 / -15%): the multiplies go at about half the adds' rate (on 8 vregs a
  multiply-add chain's op ~45% dearer than an add chain's), and a wide chain's multiplies and adds
  overlap."""
  pred, measured = _recorded_predictions("v5e-s38c-predictions-2026-12-08.json", ("vpu_chain",), "10d6a3b")
  assert len(measured) == 10
  err = {n: pred[n] / measured[n] - 1 for n in measured}
  for w in (1, 2, 4):
    assert abs(err[f"vchain_w{w}_d32_fma"]) < 0.06
  assert err["vchain_w8_d32_fma"] < -0.3 and err["vchain_w8_d64_fma"] < -0.35
  assert measured["vchain_w8_d64_fma"] > 2.8 * measured["vchain_w8_d64_add"]
  assert abs(measured["vchain_w8_d64_add"] / measured["vchain_w1_d64_add"] - 1) < 0.03


def test_the_whole_suite_ran_again_in_one_call_and_agrees_with_the_record():
  """Session 34 ran every case again in one call (`python3 -m benchmarks.hw.chip --out DIR --tag=-full34
  --no-probes`: 849 kernels, 85 families, 528 s on the chip; kept apart as v5e-rerun-2026-12-07-full34.jsonl,
  not part of the comparison): run-to-run, the median difference is 0.13% and 836 of 849 are within 5%."""
  _, recs = model.load()
  _, rerun = model.load(os.path.join(model.DATA_DIR, "v5e-rerun-2026-12-07-full34.jsonl"))
  diffs = [abs(r["measured_us"] / recs[n]["measured_us"] - 1) for n, r in rerun.items()
           if r.get("measured_us") and recs.get(n, {}).get("measured_us")]
  assert len(diffs) == 849
  assert statistics.median(diffs) < 0.005 and sum(d <= 0.05 for d in diffs) >= 830


def test_the_whole_suite_of_session_37_ran_again_in_one_call_within_ten_minutes():
  """Session 37 ran every case again in one call (`python3 -m benchmarks.hw.chip --out DIR --tag=-full37
  --no-probes --reps 3`: 932 kernels, 93 families, 565 s on the chip, issue 36's "one call within 10
  minutes"; kept apart as v5e-rerun-2026-12-07-full37.jsonl): the median difference from the record is
  0.15%, 921 of 932 within 5%, the largest 19.9% (`step_read2_bf16_4096x2048_b512`)."""
  _, recs = model.load()
  _, rerun = model.load(os.path.join(model.DATA_DIR, "v5e-rerun-2026-12-07-full37.jsonl"))
  diffs = [abs(r["measured_us"] / recs[n]["measured_us"] - 1) for n, r in rerun.items()
           if r.get("measured_us") and recs.get(n, {}).get("measured_us")]
  assert len(diffs) == 932
  assert statistics.median(diffs) < 0.003 and sum(d <= 0.05 for d in diffs) >= 915


def test_the_whole_suite_of_session_38_ran_again_in_one_call_within_ten_minutes():
  """Session 38 ran every case again in one call (`python3 -m benchmarks.hw.chip --out DIR --tag=-full38
  --no-probes --reps 2`: 993 kernels, 97 families, 576 s on the chip, issue 36's "one call within 10
  minutes" with the grown suite; kept apart as v5e-rerun-2026-12-08-full38.jsonl): the median difference
  from the record is 0.16%, 972 of 993 within 5%, the largest 37.9% (`small_dma_hbm_8x128`, a 0.3 us
  launch)."""
  _, recs = model.load()
  _, rerun = model.load(os.path.join(model.DATA_DIR, "v5e-rerun-2026-12-08-full38.jsonl"))
  diffs = [abs(r["measured_us"] / recs[n]["measured_us"] - 1) for n, r in rerun.items()
           if r.get("measured_us") and recs.get(n, {}).get("measured_us")]
  assert len(diffs) == 993
  assert statistics.median(diffs) < 0.003 and sum(d <= 0.05 for d in diffs) >= 965
