"""Session 30's measured kernels: does a kernel's step cost grow with its operands' size?

The wheel's flash attention at head_dim 64 (default blocks, non-causal) costs the chip 646 cycles a
grid step at batch 4 / seq 512 (`flash_full_b4h8s512d64`, 220 us) and 689 / 731 / 756 at batch 32 and
seq 512 / 1024 / 2048 (`fa_published`, 1.9-33 ms), all with the same (128, 64) blocks; at head_dim 128
two launches of 4 MiB operands cost 733 and 732 whatever their length. These cases separate the
operands' size (batch, sequence) from the launch's length (`flash_size`), and time again the one
recorded kernel whose own op is implausibly short (`gather_bf16_rows1_8192x2048_n512`: 13 us for 512
steps of one 4 KiB copy each, after a 91 us relayout copy of its table) with four times the steps and
a quarter of the table (`gather_rows1`).
"""
from __future__ import annotations

from benchmarks.hw.cases import Case, _flash, _gather_rows


def flash_size_cases() -> list[Case]:
  F = "flash_size"
  return [Case(f"fsize_b{b}h8s{s}d{d}", F, _flash(b, 8, s, d, False))
          for b, s, d in ((8, 512, 64), (16, 512, 64), (32, 512, 64), (4, 1024, 64), (4, 2048, 64),
                          (1, 512, 64), (8, 1024, 128))]


def gather_rows1_cases() -> list[Case]:
  F = "gather_rows1"
  return [Case("grow1_bf16_8192x2048_n2048", F, _gather_rows(8192, 2048, 2048, 1, "bfloat16")),
          Case("grow1_bf16_2048x2048_n512", F, _gather_rows(2048, 2048, 512, 1, "bfloat16")),
          Case("grow1_f32_8192x2048_n512", F, _gather_rows(8192, 2048, 512, 1, "float32"))]
