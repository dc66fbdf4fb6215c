"""Differential suite: every case in kernels/*.py runs under JAX's TPU interpret mode and under palace
(the same source file, loaded with palace.compat.load_module) and must agree (bit-identical unless the
case declares a tolerance)."""
import pytest


import jax_parity_harness as harness

pytest.importorskip("jax", reason="JAX 0.12 (Python >= 3.12) is not installed; the parity suite needs it")

FILES = sorted(p.name for p in harness.KERNELS.glob("k_*.py"))
CASES = [(f, c) for f in FILES for c in harness.case_names(f)]


@pytest.mark.parametrize("fname,case", CASES, ids=[f"{f[2:-3]}-{c[5:]}" for f, c in CASES])
def test_parity(fname, case):
  want, tol = harness.run_jax(fname, case)
  got, tol2, tpu = harness.run_palace(fname, case)
  assert tpu.reports, "palace ran no kernel"
  harness.compare(want, got, tol)
