"""One flat launch plan (launch/plan.py) run by one function (launch/run.py): hand-built plans run like
the front ends' (what the JAX front end will do), and a kernel body runs a few frames below the call."""
import dataclasses
import sys

import numpy as np
import pytest

import palace as pl
from palace import tpu as pltpu
from palace._src.blocks import canonicalize
from palace._src.core import BlockSpec, CompilerParams, MemorySpace, TensorCoreMesh
from palace._src.errors import UsageError
from palace._src.launch.plan import ENTRIES, LEAVES, LaunchPlan, Operand, Output
from palace._src.launch.run import run
from palace._src.util import tree_flatten

X = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)


def _grid_plan(body, x=X, params=CompilerParams()):
  spec = BlockSpec((8, 128), lambda i: (i, 0))
  m_in = canonicalize(spec, x.shape, x.dtype, "args[0]", 0)
  m_out = canonicalize(spec, x.shape, x.dtype, "outputs[0]", 0)
  _, no_prefetch = tree_flatten(())
  _, one_output = tree_flatten(0)
  return LaunchPlan("hand_grid", ("test", 0), params, (Operand("args[0]", x.shape, x.dtype),),
                    no_prefetch, (Output("outputs[0]", x.shape, x.dtype),), one_output, outputs_as=LEAVES,
                    bodies=(body,), grid=(x.shape[0] // 8,), in_maps=(m_in,), out_maps=(m_out,))


def _double(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0


def test_a_hand_built_grid_plan_runs_like_pallas_call():
  with pl.virtual_tpu("v5e") as tpu:
    (out,) = run(_grid_plan(_double), [X])
    ref = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                         in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                         out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(X)
  np.testing.assert_array_equal(out, 2 * X)
  np.testing.assert_array_equal(ref, 2 * X)
  hand, front = tpu.reports[-2:]
  assert hand.kernel_name == "hand_grid"
  assert hand.device_cycles == front.device_cycles and hand.grid_steps == front.grid_steps == 2


def test_a_hand_built_mesh_plan_runs_like_pl_kernel():
  def body(x_hbm, o_hbm):
    pltpu.sync_copy(x_hbm, o_hbm)

  _, args_tree = tree_flatten((X,))
  _, outs_tree = tree_flatten([0])
  plan = LaunchPlan("hand_mesh", ("test", 0), CompilerParams(), (Operand("args[0]", X.shape, X.dtype),),
                    args_tree, (Output("outputs[0]", X.shape, X.dtype),), outs_tree, outputs_as=ENTRIES,
                    bodies=(body,), meshes=(TensorCoreMesh("core", num_cores=1),))
  with pl.virtual_tpu("v5e") as tpu:
    (out,) = run(plan, [X])
    ref = pl.kernel(body, out_type=[pl.ShapeDtypeStruct(X.shape, X.dtype)],
                    mesh=pltpu.TensorCoreMesh("core", num_cores=1))(X)
  np.testing.assert_array_equal(out, X)
  np.testing.assert_array_equal(ref[0], X)
  assert tpu.reports[-2].device_cycles == tpu.reports[-1].device_cycles


def test_a_mesh_body_that_returns_a_value_is_an_error():
  def body(x_hbm, o_hbm):
    return 1

  f = pl.kernel(body, out_type=pl.ShapeDtypeStruct(X.shape, X.dtype),
                mesh=pltpu.TensorCoreMesh("c", num_cores=1))
  with pl.virtual_tpu("v5e"):
    with pytest.raises(UsageError, match="Kernel 'body' returned int; pl.kernel bodies must return None"):
      f(X)


def test_front_ends_record_the_call_site_in_their_plan(monkeypatch):
  from palace._src.launch import kernel as kernel_mod
  from palace._src.launch import pallas_call as pallas_mod
  plans = []

  def spy(plan, operands, out=None, tpu=None):
    plans.append(plan)
    return [np.zeros(o.shape, o.dtype) for o in plan.outputs]

  monkeypatch.setattr(pallas_mod, "run", spy)
  monkeypatch.setattr(kernel_mod, "run", spy)
  out = pl.ShapeDtypeStruct(X.shape, X.dtype)
  with pl.virtual_tpu("v5e"):
    mesh = pltpu.TensorCoreMesh("c", num_cores=1)
    pl.pallas_call(_double, out_shape=out)(X)
    line = sys._getframe().f_lineno - 1
    pl.kernel(lambda x, o: None, out_type=out, mesh=mesh)(X)
  assert [p.site for p in plans] == [(__file__, line), (__file__, line + 2)]
  assert plans[0].is_grid and not plans[1].is_grid
  assert plans[0].in_maps[0].space == MemorySpace.VMEM


def _depth_below(marker: str) -> int:
  f, n = sys._getframe(2), 0
  while f.f_code.co_name != marker:
    n += 1
    f = f.f_back
  return n


def test_kernel_bodies_run_a_few_frames_below_the_call():
  """Before the flat plan: 19 frames (pallas_call) and 12 (pl.kernel); then 8 and 5; 7 and 4 since the
  machine's run lost its GC-pausing wrapper frame (the launch holds the pause); 8 and 5 since a core's
  program opens its scopes and runs its body in two methods (a replayed launch keeps the first's
  work for the next launch: launch/run.py `_CoreProgram`)."""
  depth = {}

  def grid_body(x_ref, o_ref):
    depth["pallas_call"] = _depth_below("launch_pallas_call")
    o_ref[...] = x_ref[...]

  def mesh_body(x_hbm, o_hbm):
    depth["pl.kernel"] = _depth_below("launch_kernel")
    pltpu.sync_copy(x_hbm, o_hbm)

  def launch_pallas_call():
    pl.pallas_call(grid_body, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                   in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                   out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(X)

  def launch_kernel():
    pl.kernel(mesh_body, out_type=pl.ShapeDtypeStruct(X.shape, X.dtype),
              mesh=pltpu.TensorCoreMesh("c", num_cores=1))(X)

  with pl.virtual_tpu("v5e"):
    launch_pallas_call()
    launch_kernel()
  assert depth == {"pallas_call": 8, "pl.kernel": 5}


def test_pallas_call_plans_once_per_operand_signature_and_chip():
  # a plan is reused for the same shapes, dtypes and chip, and made afresh for new ones: the results
  # stay those of the operands passed, and the reports those of their shapes
  f = pl.pallas_call(_double, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  y = X + 1
  with pl.virtual_tpu("v5e") as tpu:
    first, _ = f.plan(X)
    np.testing.assert_array_equal(f(X), 2 * X)
    np.testing.assert_array_equal(f(y), 2 * y)
    again, arrays = f.plan(y)
    assert again is first and arrays[0] is not X
    assert f.plan(X.astype(np.float64))[0] is first   # (narrowed to f32, as JAX does: the same plan)
    with pytest.raises(pl.BlockSpecError, match=r"args\[0\] \(= \(8, 128\)\) must have the same number"):
      f(np.ones((16,), np.float32))   # a new shape is planned, so checked, again
    half = f.plan(X.astype(np.int32))[0]
    assert half is not first and half.operands[0].dtype == np.int32
  with pl.virtual_tpu("v5p") as tpu5p:
    other, _ = f.plan(X)
    np.testing.assert_array_equal(f(X), 2 * X)
  assert other is not first
  assert tpu.reports[0].device_cycles == tpu.reports[1].device_cycles
  assert tpu5p.reports[-1].chip.name == "v5p"


def test_a_plans_cache_leaks_nothing_between_launches():
  # one plan (its cache: megacore split, lazy outputs, VMEM total, block offsets of grids long enough
  # to evaluate index maps on all steps at once) run on chips with one and two TensorCores per device
  # and on other operands: every launch is what a fresh plan gives
  for rows in (16, 128):
    x0 = np.arange(rows * 128, dtype=np.float32).reshape(rows, 128)

    def fresh():
      return _grid_plan(_double, x0, CompilerParams(dimension_semantics=("parallel",)))

    shared = fresh()
    for chip in ("v5e", "v5p", "v5e", "v4"):
      for x in (x0, x0[::-1] - 7, x0):
        with pl.virtual_tpu(chip) as tpu:
          (out,) = run(shared, [x])
          (ref,) = run(fresh(), [x])
        np.testing.assert_array_equal(out, 2 * x)
        np.testing.assert_array_equal(ref, 2 * x)
        a, b = tpu.reports
        assert (a.device_cycles, a.unit_busy_cycles, a.dma_count, a.hbm_bytes, a.grid_steps) == \
            (b.device_cycles, b.unit_busy_cycles, b.dma_count, b.hbm_bytes, b.grid_steps), (rows, chip)
    assert shared.cache() and dataclasses.replace(shared, kernel_name="other").cache() == {}
