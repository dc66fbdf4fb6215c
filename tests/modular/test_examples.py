"""The modular-API examples run as scripts, and the ragged gather against NumPy on edge cases."""
import pathlib
import runpy

import numpy as np
import pytest

import palace as pl

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
RG = runpy.run_path(str(EXAMPLES / "ragged_gather.py"))


@pytest.mark.parametrize("script", ["kernel_matmul.py", "ragged_gather.py"])
def test_example_runs_as_a_script(script, capsys):
  runpy.run_path(str(EXAMPLES / script), run_name="__main__")
  out = capsys.readouterr().out
  assert "device time" in out


@pytest.mark.parametrize("policy,seed", [("eager", 0), ("on_wait", 0), ("random", 5)])
def test_ragged_gather_edge_cases(policy, seed):
  rng = np.random.default_rng(3)
  table = rng.standard_normal((64, 128)).astype(np.float32)
  # repeated ids, the first and last rows, an empty group and a full one
  indices = np.array([63, 0, 0, 7, 63, 1, 2, 3, 4, 5, 6, 7, 8], np.int32)
  offsets = np.array([0, 3, 5, 5, 13], np.int32)
  with pl.virtual_tpu("v5e", dma_policy=policy, seed=seed):
    rows, sums = RG["ragged_gather"](table, indices, offsets, max_rows=8)
  ref_rows, ref_sums = RG["reference"](table, indices, offsets, 8)
  np.testing.assert_array_equal(rows, ref_rows)
  np.testing.assert_allclose(sums, ref_sums, rtol=1e-5, atol=1e-5)


def test_ragged_gather_bad_index_is_out_of_bounds():
  table = np.zeros((64, 128), np.float32)
  with pytest.raises(pl.OutOfBoundsError, match=r"Slice \[64:65\] out of bounds for axis 0 of args\[2\]"):
    RG["ragged_gather"](table, np.array([1, 64], np.int32), np.array([0, 2], np.int32), max_rows=8)
