"""palace.jax against a real TPU v5e's recorded accept / reject verdicts (benchmarks/hw/data/
v5e-limits-2026-12-05.jsonl, JAX 0.10.2): every recorded probe of `benchmarks/hw/limits.py` is
accepted by palace where the chip compiled and ran it, and rejected with a palace error where the
chip's compiler rejected it (docs/limits.md, 'Measured on a TPU v5e')."""
from pathlib import Path

import pytest

from benchmarks.hw import limits
from palace import PalaceError

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data" / "v5e-limits-2026-12-05.jsonl"
RECORDS = limits.load_records(str(DATA))

# palace's error for each recorded rejection: (error class, a phrase of its message)
REJECTIONS = {
    "block_f32_4x128": ("BlockSpecError", "divisible by 8 and 128"),
    "block_f32_8x64": ("BlockSpecError", "divisible by 8 and 128"),
    "block_f32_8x192": ("BlockSpecError", "divisible by 8 and 128"),
    "block_int8_8x128": ("BlockSpecError", "(32, 128) HBM tiling of an 8-bit array"),
    "block_int8_16x128": ("BlockSpecError", "(32, 128) HBM tiling of an 8-bit array"),
    "block_1d_f32_384": ("BlockSpecError", "not a valid rank-1 TPU block"),
    "block_1d_bf16_128": ("BlockSpecError", "power of 2 >= 256"),
    "buffered_3": ("BlockSpecError", "Only single (1) and double (2) buffering"),
    "vmem_blocks_20MiB_default": ("ResourceError", "of pipelined blocks requested"),
    "vmem_scratch_130MiB_limit128": ("ResourceError", "scratch operands count against the whole VMEM"),
    "prefetch_300K_int32": ("ResourceError", "SMEM over capacity for scalar_prefetch[0]"),
    "smem_scratch_256K_int32": ("ResourceError", "less 144 B the compiler reserves"),
    "smem_scratch_300K_int32": ("ResourceError", "SMEM over capacity for scratch[0]"),
    "int8_div": ("UnsupportedError", "no 8-bit integer"),
    "int16_div": ("UnsupportedError", "no 16-bit integer div"),
    "f64_add": ("UnsupportedError", ""),
    "sort_last_axis": ("UnsupportedError", "'sort'"),
    "cumsum_last_axis": ("UnsupportedError", "no cumulative sum on a TensorCore"),
    "gather_rows_take": ("UnsupportedError", "Only take_along_axis-like gathers supported"),
    "dimsem_length_mismatch": ("UsageError", "dimension_semantics has 2 entries"),
    "dma_semaphores_1024": ("ResourceError", "> 512 per core on v5e"),
    "dma_semaphores_65536": ("ResourceError", "> 512 per core on v5e"),
    "dma_shape_mismatch": ("ShapeError", "DMA shapes differ"),
    "dma_dtype_mismatch": ("ShapeError", "DMA dtypes differ"),
    "block_any_space_windowed": ("BlockSpecError", "expected the whole array"),
}
_DOTS = ("dot_f32_high", "dot_f32_precision_mixed", "dot_bf16_to_bf16", "dot_uint8_to_int32")


@pytest.fixture(scope="module")
def rows():
  return {r["name"]: r for r in limits.compare(RECORDS)}


def test_the_recorded_file_holds_the_89_probes_and_their_rejections():
  rejected = {r["name"] for r in RECORDS if not r["accepted"]}
  assert len(RECORDS) == 89 and rejected == set(REJECTIONS) | set(_DOTS)


@pytest.mark.parametrize("name", [r["name"] for r in RECORDS])
def test_palace_agrees_with_the_chip(rows, name):
  r = rows[name]
  assert r["palace_accepted"] == r["chip_accepted"], (r["chip_error"], r["palace_error"])
  if not r["chip_accepted"] and name in REJECTIONS:
    cls, phrase = REJECTIONS[name]
    assert r["palace_error_type"] == cls and phrase in r["palace_error"], r["palace_error"]
    import palace._src.errors as errors  # noqa: PLC0415
    assert issubclass(getattr(errors, cls), PalaceError)
