"""Schedule exploration, unchecked (disable_bounds_checks) accesses, determinism of bug reports."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

F32 = jnp.float32
X = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)


def _racy_read(x):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((16, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 1),
                     scratch_types=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA])
  def k(x_hbm, o_hbm, buf, sem):
    buf[...] = jnp.zeros((16, 128), F32)
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    buf[...] = buf[...] + 1          # BUG: sees the copy's data only if it moved at its start
    copy.wait()
    pltpu.sync_copy(buf, o_hbm)
  return k(x)


def _two_cores_same_block(x):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.VMEM((8, 128), F32)])
  def k(x_hbm, o_hbm, buf):
    c = lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[pl.ds(c * 8, 8)], buf)
    pltpu.sync_copy(buf, o_hbm)      # BUG: both cores write the whole output
  return k(x)


def test_explore_schedules_reports_the_divergence_of_a_racy_read():
  rep = pl.explore_schedules(_racy_read, X, seeds=range(4))
  assert not rep.ok
  assert rep.schedules[:2] == ("eager", "on_wait")
  d = next(d for d in rep.divergences if d.schedule == "on_wait")
  assert d.output == 0 and d.first_index == (0, 0) and d.max_abs_diff == 1.0   # x + 1 vs x
  assert "on_wait: output 0 differs" in str(rep)
  assert "random seed=" in " ".join(rep.differing_schedules)


def test_explore_schedules_random_core_order_exposes_a_multicore_race():
  rep = pl.explore_schedules(_two_cores_same_block, X, seeds=range(8), chip="v5p")
  assert not rep.ok
  assert all(d.schedule.startswith("random") for d in rep.divergences)
  assert {d.max_abs_diff for d in rep.divergences} == {1024.0}


def test_explore_schedules_of_correct_kernels_agree_and_errors_are_findings():
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                     out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  rep = pl.explore_schedules(f, X, seeds=range(3), detect_races=True)
  assert rep.ok and len(rep.schedules) == 5 and "all outputs identical" in str(rep)
  np.testing.assert_array_equal(rep.outputs, 2 * X)
  with pytest.raises(pl.RaceError):   # the reference schedule itself fails: raised as is
    pl.explore_schedules(_racy_read, X, seeds=[], policies=("eager",), detect_races=True)
  with pytest.raises(pl.UsageError, match="not one of"):
    pl.explore_schedules(_racy_read, X, policies=("fifo",))


def test_race_reports_are_identical_across_runs_and_policies():
  msgs = set()
  for policy in ("eager", "on_wait", "random"):
    with pl.virtual_tpu("v5p", detect_races=True, dma_policy=policy), pytest.raises(pl.RaceError) as e:
      _two_cores_same_block(X)
    msgs.add(str(e.value))
  assert len(msgs) <= 2 and all("outputs[0][0:8, 0:128]" in m for m in msgs)
  again = set()
  for _ in range(2):
    with pl.virtual_tpu("v5p", detect_races=True), pytest.raises(pl.RaceError) as e:
      _two_cores_same_block(X)
    again.add(str(e.value))
  assert len(again) == 1


# ====================================================================== disable_bounds_checks
def _unchecked_kernel(start):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 1),
                     scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.VMEM((8, 128), F32)],
                     compiler_params=pltpu.CompilerParams(disable_bounds_checks=True))
  def k(x_hbm, o_hbm, a, b):
    a[...] = jnp.zeros((8, 128), F32)
    pltpu.sync_copy(x_hbm.at[pl.ds(start, 8)], a)       # rows past the end are not copied
    b[...] = jnp.full((8, 128), 5.0, F32)
    b[pl.ds(start - 8, 8), :] = a[...]                  # out-of-bounds rows of the store are dropped
    v = b[pl.ds(start - 8, 8), :]                        # out-of-bounds rows of the load are garbage
    b[...] = jnp.where(jnp.isnan(v), -1.0, v)
    pltpu.sync_copy(b, o_hbm)
  return k


def test_disable_bounds_checks_clips_loads_stores_and_dmas_instead_of_crashing():
  with pl.virtual_tpu("v5e"), pytest.raises(pl.OutOfBoundsError, match=r"Slice \[12:20\]"):
    pl.kernel(lambda x, o: pltpu.sync_copy(x.at[pl.ds(12, 8)], o),
              out_type=pl.ShapeDtypeStruct((8, 128), np.float32), mesh=pltpu.TensorCoreMesh("c", 1))(X)
  with pl.virtual_tpu("v5e", detect_races=True, uninitialized="raise"):
    out = _unchecked_kernel(12)(X)        # copies rows 12:16; the store/load window is rows 4:12 of 8
  want = np.full((8, 128), -1.0, np.float32)   # b = the loaded window: rows 4:8 of b, then garbage
  want[0:4] = X[12:16]
  np.testing.assert_array_equal(out, want)
  with pl.virtual_tpu("v5e"):
    out = _unchecked_kernel(-4)(X)        # negative starts do not wrap around as in NumPy
  want = np.full((8, 128), -1.0, np.float32)   # load window rows -12:-4: all garbage
  np.testing.assert_array_equal(out, want)
  with pl.virtual_tpu("v5e"):
    out = _unchecked_kernel(40)(X)        # nothing in bounds: the copy moves nothing
  np.testing.assert_array_equal(out, np.full((8, 128), -1.0, np.float32))


def test_disable_bounds_checks_skips_out_of_bounds_rows_of_an_indexed_dma():
  from palace import tpu_sc as plsc
  table = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
  idx = np.array([1, 20, 3, -2, 5, 6, 7, 0], np.int32)

  def run(params):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1,
                                  num_subcores=1)

    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32), mesh=mesh,
                       scratch_types=[pltpu.VMEM((8,), jnp.int32), pltpu.VMEM((8, 128), F32)],
                       compiler_params=params)
    def gather(table_hbm, idx_hbm, out_hbm, idx_vmem, rows_vmem):
      pltpu.sync_copy(idx_hbm, idx_vmem)
      rows_vmem[...] = jnp.full((8, 128), -1.0, F32)
      pltpu.sync_copy(table_hbm.at[idx_vmem], rows_vmem)
      pltpu.sync_copy(rows_vmem, out_hbm)
    return gather(table, idx)

  with pl.virtual_tpu("v6e"), pytest.raises(pl.OutOfBoundsError, match=r"index 20 is out of bounds"):
    run(None)
  with pl.virtual_tpu("v6e", detect_races=True):
    out = run(pltpu.CompilerParams(disable_bounds_checks=True))
  np.testing.assert_array_equal(out[:, 0], [128, -1, 384, -1, 640, 768, 896, 0])


def test_check_options_are_validated_and_work_in_timing_only_runs():
  with pytest.raises(pl.UsageError, match=r"uninitialized='zero'.*'nan'.*'raise'"):
    pl.virtual_tpu("v5e", uninitialized="zero")
  f = pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                     out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))
  with pl.virtual_tpu("v5p", timing_only=True, detect_races=True, uninitialized="raise") as tpu:
    f(X)
  assert tpu.reports[-1].timing_only
  with pl.virtual_tpu("v5p", timing_only=True, detect_races=True), pytest.raises(pl.RaceError):
    _two_cores_same_block(X)
