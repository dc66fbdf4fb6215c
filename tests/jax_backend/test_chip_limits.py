"""palace.jax against a real TPU v5e's recorded accept / reject verdicts (JAX 0.10.2, libtpu 0.0.42.1,
2026-12-05): benchmarks/hw/data/v5e-limits-2026-12-05.jsonl holds the first 89 probes of
`benchmarks/hw/limits.py`, v5e-limits-2026-12-05-followup.jsonl all 152. Every recorded probe is
accepted by palace where the chip compiled and ran it, and rejected with a palace error where the chip's
compiler rejected it, but for the disagreements `limits.KNOWN_DISAGREEMENTS` documents (docs/limits.md,
'Measured on a TPU v5e')."""
import os
from pathlib import Path

import pytest

from benchmarks.hw import limits
from palace import PalaceError

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data"
FILES = [str(DATA / "v5e-limits-2026-12-05.jsonl"), str(DATA / "v5e-limits-2026-12-05-followup.jsonl")]
ENV, RECORDS = limits.load_all(FILES)

_TILE8 = ("BlockSpecError", "(32, 128) HBM tiling of an 8-bit array")
_SMEM = "B the compiler reserves; the compiler's own use, measured on a TPU v5e"
_SEMS = ("ResourceError", "> 512 per core on v5e less 19 the compiler keeps (493 usable")
_NO_OP = "UnsupportedError"
# the integer ops the TPU compiler rejects: refused at lowering as palace's CompilerRejectError, an
# UnsupportedError that is also JAX's MosaicError (palace/_src/jax/compiler_errors.py)
_REJECT = "CompilerRejectError"
# palace's error for each recorded rejection: (error class, a phrase of its message)
REJECTIONS = {
    "block_f32_4x128": ("BlockSpecError", "divisible by 8 and 128"),
    "block_f32_8x64": ("BlockSpecError", "divisible by 8 and 128"),
    "block_f32_8x192": ("BlockSpecError", "divisible by 8 and 128"),
    "block_int8_8x128": _TILE8, "block_int8_16x128": _TILE8, "block_int8_32x256_8x128": _TILE8,
    "block_uint8_64x256_16x128": _TILE8, "block_fp8_64x256_16x128": _TILE8,
    "block_1d_f32_384": ("BlockSpecError", "not a valid rank-1 TPU block"),
    "block_1d_bf16_128": ("BlockSpecError", "power of 2 >= 256"),
    "buffered_3": ("BlockSpecError", "Only single (1) and double (2) buffering"),
    "vmem_blocks_20MiB_default": ("ResourceError", "of pipelined blocks requested"),
    "vmem_blocks_24MiB_limit20": ("ResourceError", "of pipelined blocks requested"),
    "vmem_blocks_132MiB_limit256": ("ResourceError", "of pipelined blocks requested"),
    "vmem_scratch_130MiB_limit128": ("ResourceError", "scratch operands count against the whole VMEM"),
    "prefetch_300K_int32": ("ResourceError", "SMEM over capacity for scalar_prefetch[0]"),
    "smem_scratch_256K_int32": ("ResourceError", "less 2048 " + _SMEM),
    "smem_scratch_300K_int32": ("ResourceError", "SMEM over capacity for scratch[0]"),
    **{f"prefetch_1MiB_minus_{b}B": ("ResourceError", "scalar_prefetch[0] on chip 0 core 0") for b in
       (1024, 576, 512, 256, 144, 140, 0)},
    **{f"smem_scratch_1MiB_minus_{b}B": ("ResourceError", "less 2048 " + _SMEM) for b in (1024, 512, 256, 144)},
    "int8_div": (_REJECT, "no 8-bit integer div"),
    "int16_div": (_REJECT, "no 16-bit integer div"),
    "int8_add_op": (_REJECT, "no 8-bit integer add"), "uint8_add_op": (_REJECT, "no 8-bit integer add"),
    "int8_mul_op": (_REJECT, "no 8-bit integer multiply"), "int8_max_op": (_REJECT, "no 8-bit integer maximum"),
    "int8_neg_op": (_REJECT, "no 8-bit integer negative"),
    "int8_shift_op": (_REJECT, "no 8-bit integer right_shift"),
    "int8_where_op": (_REJECT, "no 8-bit integer greater"), "int8_compare_op": (_REJECT, "no 8-bit integer greater"),
    "int16_rem_op": (_REJECT, "no 16-bit integer rem"), "int16_max_op": (_REJECT, "no 16-bit integer maximum"),
    "int16_shift_op": (_REJECT, "no 16-bit integer right_shift"),
    "f64_add": (_NO_OP, ""),
    "sort_last_axis": (_NO_OP, "no sort on a TensorCore"),
    "cumsum_last_axis": (_NO_OP, "no cumulative sum on a TensorCore"),
    "gather_rows_take": (_NO_OP, "Only take_along_axis-like gathers supported"),
    "dimsem_length_mismatch": ("UsageError", "dimension_semantics has 2 entries"),
    **{f"dma_semaphores_{n}": _SEMS for n in (500, 508, 511, 512, 513, 1024, 65536)},
    **{f"{kind}_semaphores_{n}": _SEMS for kind in ("regular", "grid_dma") for n in (508, 512, 513)},
    "dma_shape_mismatch": ("ShapeError", "DMA shapes differ"),
    "dma_dtype_mismatch": ("ShapeError", "DMA dtypes differ"),
    "block_any_space_windowed": ("BlockSpecError", "expected the whole array"),
}
_DOTS = ("dot_f32_high", "dot_f32_precision_mixed", "dot_bf16_to_bf16", "dot_uint8_to_int32")


@pytest.fixture(scope="module")
def rows():
  return {r["name"]: r for r in limits.compare(RECORDS)}


def test_the_two_runs_agree_and_the_followup_holds_every_probe():
  first, followup = (limits.load_records(p) for p in FILES)
  assert len(first) == 89 and len(followup) == 152 and len(RECORDS) == 152
  verdicts = {r["name"]: r["accepted"] for r in followup}
  assert all(verdicts[r["name"]] == r["accepted"] for r in first)
  assert ENV["libtpu_version"] == "0.0.42.1" and ENV["device_kind"] == "TPU v5 lite"
  # load_all's default: every data file, a run's follow-up after the run itself
  names = [os.path.basename(p) for p in limits.data_files()]
  assert names.index(os.path.basename(FILES[0])) < names.index(os.path.basename(FILES[1]))
  assert {r["name"] for r in limits.load_all()[1]} >= set(verdicts)


def test_every_recorded_rejection_has_its_palace_error_listed():
  rejected = {r["name"] for r in RECORDS if not r["accepted"]}
  assert rejected == set(REJECTIONS) | set(_DOTS)


@pytest.mark.parametrize("name", [r["name"] for r in RECORDS])
def test_palace_agrees_with_the_chip(rows, name):
  r = rows[name]
  if name in limits.KNOWN_DISAGREEMENTS:   # palace keeps its rule: still stricter than the chip
    assert r["chip_accepted"] and not r["palace_accepted"], r
    return
  assert r["palace_accepted"] == r["chip_accepted"], (r["chip_error"], r["palace_error"])
  if not r["chip_accepted"] and name in REJECTIONS:
    cls, phrase = REJECTIONS[name]
    assert r["palace_error_type"] == cls and phrase in r["palace_error"], r["palace_error"]
    import palace._src.errors as errors  # noqa: PLC0415
    assert issubclass(getattr(errors, cls), PalaceError)


def test_known_disagreements_are_recorded_chip_verdicts():
  recorded = {r["name"] for r in RECORDS}
  assert set(limits.KNOWN_DISAGREEMENTS) <= recorded
  assert not set(limits.KNOWN_DISAGREEMENTS) & set(limits.THIRD_RUN)
