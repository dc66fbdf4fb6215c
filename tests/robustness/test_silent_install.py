"""A plain `pip install palace` gets single-threaded BLAS for block-sized products: threadpoolctl is
a core dependency (without it, a 64-step 512^3 bf16 matmul ran 3-80x slower on a busy machine)."""
import tomllib
from pathlib import Path

import numpy as np
import pytest

from palace._src import blas

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_threadpoolctl_is_a_core_dependency():
  project = tomllib.loads(PYPROJECT.read_text())["project"]
  core = [d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]]
  assert "threadpoolctl" in core, core


def test_blas_is_controlled_when_installed():
  pytest.importorskip("threadpoolctl")   # missing only in an environment installed before it was core
  if not blas._blas_controllers():
    return   # a NumPy without a BLAS threadpoolctl can see: nothing to control
  a = np.ones((64, 64), np.float32)
  with blas.kernel_mode():
    np.testing.assert_array_equal(blas.matmul(a, a), np.full((64, 64), 64, np.float32))
