"""The demo's collective part: TensorCore-only and SparseCore-driven all-gather + matmul (tools/demo.py)."""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace._src.tools import demo


def _run(chip, variant, m=8 * 32, k=256, n=8 * 128):
  rng = np.random.default_rng(0)
  bf16 = np.dtype(jnp.bfloat16)
  x = rng.integers(-4, 5, size=(m, k)).astype(bf16)
  y = rng.integers(-4, 5, size=(k, n)).astype(bf16)
  with pl.virtual_tpu(chip, num_chips=8) as tpu:
    mesh = pl.make_mesh((8,), ("x",))
    if variant == "sparsecore":
      fn = demo.make_sc_collective_matmul(mesh, m, k, n, bf16)
    else:
      fn = demo.make_collective_matmul(mesh, m, k, n, bf16, overlap=variant == "overlapped")
    z = fn(x, y)
  np.testing.assert_array_equal(np.asarray(z), (x.astype(np.float32) @ y.astype(np.float32)).astype(bf16))
  return tpu.reports[-1]


def test_sparsecore_driven_variant_is_exact_and_hides_ici_under_the_mxu():
  sc = _run("v5p", "sparsecore")
  blocking = _run("v5p", "blocking")
  assert sc.kernel_name == "collective_matmul_sparsecore"
  assert demo.ici_hidden_s(sc) > 0 and demo.ici_hidden_s(blocking) == 0
  assert sc.device_cycles < blocking.device_cycles


def test_demo_names_the_sparsecore_variant_and_its_chip(tmp_path):
  from rich.console import Console
  console = Console(record=True, width=200)
  failed = demo.run_demo(console, tmp_path, quick=True, chip="v5e")
  text = console.export_text()
  assert failed == 0, text
  assert "sparsecore: a SparseCore subcore forwards" in text and "v5p" in text
  assert (tmp_path / "collective_matmul_sparsecore_v5p.timeline.png").stat().st_size > 5000
