"""Collective matmul (examples/collective_matmul.py): results vs NumPy, hidden communication, SparseCore
offload; cross-core signalling from a SparseCore subcore to the TensorCore."""
import functools
import pathlib
import runpy

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace import tpu_sc as plsc

EX = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "examples" / "collective_matmul.py"))


@pytest.fixture(scope="module")
def big():
  """The example's 8-chip size, timing only (payloads skipped): comm and compute comparable."""
  return EX["run"](timing_only=True, verbose=False)


@pytest.mark.parametrize("n_chips", [2, 4])
def test_all_three_variants_equal_numpy(n_chips):
  reports = EX["run"](n_chips=n_chips, m=16, k=128, n=256, verbose=False)  # asserts vs x @ y inside
  assert set(reports) == {"blocking", "overlapped", "sparsecore"}


def test_results_equal_numpy_with_every_dma_policy():
  x = np.random.default_rng(0).integers(-4, 5, size=(4 * 16, 128)).astype(jnp.bfloat16)
  y = np.random.default_rng(1).integers(-4, 5, size=(128, 4 * 128)).astype(jnp.bfloat16)
  want = x.astype(np.float32) @ y.astype(np.float32)
  for policy in ("on_wait", "random"):
    for variant in ("blocking", "overlapped", "sparsecore_driven"):
      with pl.virtual_tpu("v5p", num_chips=4, dma_policy=policy, seed=5):
        out = EX[variant](x, y, pl.make_mesh((4,), ("x",)))
      np.testing.assert_array_equal(out, want, err_msg=f"{variant} {policy}")


@pytest.mark.parametrize("variant", ["overlapped", "sparsecore"])
def test_overlap_saves_at_least_the_communication_it_hides(big, variant):
  t_block = big["blocking"].device_time_s
  t = big[variant].device_time_s
  ici, mxu, hidden = EX["comm_compute_overlap_s"](big[variant])
  assert hidden > 0.8 * ici            # most of the all-gather runs under the matmuls
  assert t_block - t >= hidden * (1 - 1e-9)
  assert t < t_block


def test_blocking_variant_is_comm_plus_compute(big):
  ici, mxu, hidden = EX["comm_compute_overlap_s"](big["blocking"]) if big["blocking"].events else (0, 0, 0)
  r = big["blocking"]
  busy = r.unit_busy_cycles["mxu"] / r.chip.clock_hz
  # ring all-gather of 7 blocks of 256 KiB over one hop each, then 8 matmuls of (256, 512) @ (512, 4096)
  step = 256 * 512 * 2 / r.chip.ici_link_bytes_per_s_one_way + r.chip.ici_hop_latency_ns * 1e-9
  assert r.device_time_s >= 7 * step + busy
  assert hidden == 0


def test_sparsecore_issues_the_ici_copies_while_the_tensorcore_multiplies(big):
  r = big["sparsecore"]
  ici_dmas = [e for e in r.events if e[1] == "dma" and e[2] == "ici"]
  assert ici_dmas and all(e[0][1] >= 64 for e in ici_dmas)       # SparseCore subcore ids
  mxu = [e for e in r.events if e[1] == "mxu" and e[0][0] == 0]
  overlapping = [d for d in ici_dmas if d[0][0] == 0 and any(m[3] < d[4] and d[3] < m[4] for m in mxu)]
  assert len(overlapping) >= 5


def test_quick_example_runs_and_writes_a_perfetto_trace(tmp_path):
  path = tmp_path / "cm.json"
  reports = EX["main"](quick=True, trace_path=str(path))
  assert path.exists() and path.stat().st_size > 1000
  assert reports["sparsecore"].device_time_s < reports["blocking"].device_time_s


def test_sparsecore_signals_the_tensorcore_with_core_index():
  """A vector subcore writes a row to HBM and signals TensorCore 0's semaphore; the TensorCore waits
  for the signal, then reads the row (MPMD kernel on one chip)."""
  def tc_body(o_hbm, flag_hbm, sem):
    pl.semaphore_wait(sem, 1)

    def body(buf):
      pltpu.sync_copy(flag_hbm, buf)
      buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)
    pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.int32))

  def sc_body(o_hbm, flag_hbm, sem):
    def body(buf):
      buf[...] = jnp.full((8,), 41, jnp.int32)
      for r in range(8):
        for c in range(16):
          pltpu.sync_copy(buf, flag_hbm.at[r, pl.ds(c * 8, 8)])
    pl.run_scoped(body, pltpu.VMEM((8,), jnp.int32))
    pl.semaphore_signal(sem, 1, core_index=0)

  with pl.virtual_tpu("v5p") as tpu:
    k = pl.kernel([tc_body, sc_body],
                  out_type=(pl.ShapeDtypeStruct((8, 128), jnp.int32),) * 2,
                  mesh=[pltpu.TensorCoreMesh("tc", 1),
                        plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                               num_subcores=1)],
                  scratch_types=[pltpu.SemaphoreType.REGULAR])
    out, flag = k()
  np.testing.assert_array_equal(out, np.full((8, 128), 42))
  ev = tpu.reports[-1].events
  last_sc_copy = max(e[4] for e in ev if e[0][1] >= 64 and e[1] == "dma")
  first_tc_copy = min(e[3] for e in ev if e[0][1] == 0 and e[1] == "dma")
  assert first_tc_copy >= last_sc_copy
