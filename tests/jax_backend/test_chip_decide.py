"""Questions issue 37 left to the chip, answered by a real TPU v5e (benchmarks/hw/data/v5e-decide-2026-12-05
.jsonl, JAX 0.10.2; `benchmarks/hw/chip_decide.py`; docs/jax.md "Decided on the chip")."""
import json
from pathlib import Path

import numpy as np
import pytest

import palace.jax as pj
from benchmarks.hw import chip_decide as d
from palace import OutOfBoundsError

DATA = Path(d.DATA_DIR) / "v5e-decide-2026-12-05.jsonl"
DATA_20 = Path(d.DATA_DIR) / "v5e-decide-2026-12-06.jsonl"   # session 20: the two above again, and quantized KV


def _records(path=DATA):
  return {r.get("name", "env"): r for r in map(json.loads, path.read_text().splitlines())}


def _kernel_question(name, path=DATA):
  """(chip kernel, palace.jax kernel, exact f32 reference here, chip XLA at default precision) of one
  kernel question (chip_decide.KERNEL_QUESTIONS) on its fixed inputs."""
  rec = _records(path)[name]
  assert rec["error"] is None
  inputs, run, reference, _ = d.KERNEL_QUESTIONS[name]
  args = inputs()
  with pj.virtual_tpu("v5e"):
    out = run(*args)
  return d._dec(rec["kernel"]), out, reference(*args, precision="highest"), d._dec(rec["xla_default"])


def test_the_record_is_from_a_tpu():
  env = _records()["env"]
  assert env["device_kind"].startswith("TPU v5")
  assert env["jax_version"] == "0.10.2"


def test_paged_attention_f32_grouped_queries_computes_what_the_chip_computes():
  """The wheel's paged attention on f32 pages with 4 query heads per KV head: the chip's kernel output
  is 1.3e-2 (relative) away from an exact f32 reference and 1.8e-4 from one on bf16-rounded q, k, v
  (its default-precision dots); palace.jax gives the chip's output. So JAX's
  tpu_paged_attention_kernel_test fails on palace.jax only because its reference runs on XLA:CPU,
  which multiplies f32 exactly, where the chip's XLA rounds too (the chip's own XLA reference is 2e-3
  from the kernel, inside the test's tolerance)."""
  chip, out, exact, chip_xla = _kernel_question("paged_f32_gqa")
  assert d._rel(chip, exact) > 5e-3             # the chip is far from exact f32 ...
  assert d._rel(out, chip) < 1e-4               # ... and palace.jax is where the chip is
  assert d._rel(chip_xla, chip) < 1e-2          # the chip's own XLA agrees within the test's tol


def test_scalar_read_past_the_prefetch_end_runs_on_the_chip_but_palace_refuses_it():
  """The chip runs a kernel that reads `idx_ref[n]` (one past an 8-element scalar-prefetch array) and
  discards it with jnp.where: its output is what the kernel means. Palace refuses the read: on a chip
  that word is whatever the compiler placed next in SMEM, and palace cannot prove every use discards it
  (decision recorded in docs/jax.md); the message names the read and the fix."""
  rec = _records()["select_oob_scalar"]
  assert rec["error"] is None
  np.testing.assert_array_equal(d._dec(rec["output"]), [11, 12, 13, 14, 15, 16, 17, -1])
  with pj.virtual_tpu("v5e"), pytest.raises(Exception) as info:
    d.run_select_oob()
  msg = str(info.value)
  assert "Index 8 out of bounds for axis 0 of scalar_prefetch[0]" in msg
  assert "OutOfBoundsError" in msg or isinstance(info.value, OutOfBoundsError)


def test_paged_attention_with_int8_kv_pages_computes_what_the_chip_computes():
  """bf16 queries, int8-quantized K/V pages, 8 query heads per KV head (JAX's failing
  test_paged_attention861 / 863 / 429 shapes): the kernel dequantizes to f32 and its default-precision
  dots round to bf16, so the chip's output is 2.4e-2 (relative) from an exact f32 reference, and
  palace.jax's is within a bf16 output rounding (9.5e-4) of the chip's; the chip's own XLA reference at
  default precision is 5.3e-3 from its kernel. Those cases fail on palace.jax only because the test's
  reference runs on XLA:CPU (session 20's chip run)."""
  env = _records(DATA_20)["env"]
  assert env["device_kind"].startswith("TPU v5") and env["date"] == "2026-12-06"
  chip, out, exact, chip_xla = _kernel_question("paged_quant_bf16_gqa", DATA_20)
  assert d._rel(chip, exact) > 1e-2
  assert d._rel(out, chip) < 2e-3
  assert d._rel(chip_xla, chip) < 1e-2


def test_the_session_20_record_repeats_the_earlier_answers():
  """The same two questions, asked again on 2026-12-06, got the same answers."""
  old, new = _records(), _records(DATA_20)
  np.testing.assert_array_equal(d._dec(new["select_oob_scalar"]["output"]),
                                d._dec(old["select_oob_scalar"]["output"]))
  assert d._rel(d._dec(new["paged_f32_gqa"]["kernel"]), d._dec(old["paged_f32_gqa"]["kernel"])) < 1e-6
