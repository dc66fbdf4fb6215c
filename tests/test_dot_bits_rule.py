"""The v5e's DEFAULT-precision dot summation rule found in session 22 (benchmarks/hw/dot_bits.py
`mxu_rule`) against the chip's recorded outputs (K = 128, float32 and bf16 operands): bit-identical on
all but a few outputs, those 1 ulp apart; the plain float32 sum of the same products is not."""
import os

import ml_dtypes
import numpy as np
import pytest

from benchmarks.hw import dot_bits

DATA = os.path.join(os.path.dirname(dot_bits.__file__), "data", "v5e-dot-bits-k128-2026-12-06.npz")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_measured_summation_rule_matches_the_chip(dtype):
  chip = np.load(DATA)[dot_bits.name(128, dtype, "default")]
  x, y = dot_bits._inputs(128, dtype)
  xs = x.astype(ml_dtypes.bfloat16).astype(np.float32)
  ys = y.astype(ml_dtypes.bfloat16).astype(np.float32)
  got = dot_bits.mxu_rule(xs, ys)
  ulps = np.abs(got.view(np.int32).astype(np.int64) - chip.view(np.int32).astype(np.int64))
  assert (ulps != 0).sum() <= 3 and ulps.max() <= 1
  # the exact sum rounded once (what a correctly rounded dot gives) is not the chip's
  exact = (xs.astype(np.float64) @ ys.astype(np.float64)).astype(np.float32)
  assert (exact != chip).mean() > 0.4
