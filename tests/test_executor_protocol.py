"""The executor seam is complete: the language uses only declared members, every executor has them all,
language state lives in the KernelContext (not on the core) and op cost classes are declared constants."""
import ast
import functools
import pathlib
import typing

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace import tpu_sc as plsc
from palace._src import executor
from palace._src.errors import UsageError
from palace._src.executor import Executor, OpClass, SparseCoreExecutor
from palace._src.sim import cost

SRC = pathlib.Path(__file__).resolve().parent.parent / "palace" / "_src"
LANGUAGE_SIDE = sorted((SRC / "lang").glob("*.py")) + [SRC / "pipeline.py"]


def _declared(proto) -> set:
  names = set()
  for cls in proto.__mro__:
    if cls in (object, typing.Protocol, typing.Generic):
      continue
    names |= set(getattr(cls, "__annotations__", {}))
    names |= {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
  return names


EXECUTOR = _declared(Executor)
SPARSECORE = _declared(SparseCoreExecutor)



def _used_members(path) -> set:
  tree = ast.parse(path.read_text())
  used = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ex":
      used.add(node.attr)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and \
        isinstance(node.value.func, ast.Attribute) and node.value.func.attr in ("current", "maybe_current") \
        and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == "executor":
      used.add(node.attr)
  return used


@pytest.mark.parametrize("path", LANGUAGE_SIDE, ids=lambda p: p.name)
def test_language_uses_only_declared_executor_members(path):
  undeclared = _used_members(path) - EXECUTOR
  assert not undeclared, f"{path.name} uses executor members {sorted(undeclared)} not declared in executor.py"


@pytest.mark.parametrize("path", LANGUAGE_SIDE, ids=lambda p: p.name)
def test_language_never_probes_the_executor_with_getattr(path):
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
        and node.func.id in ("getattr", "hasattr") and node.args \
        and isinstance(node.args[0], ast.Name) and node.args[0].id == "ex":
      raise AssertionError(f"{path.name}:{node.lineno} probes the executor with {node.func.id}: declare the "
                           f"member in executor.Executor instead")


@pytest.mark.parametrize("path", LANGUAGE_SIDE, ids=lambda p: p.name)
def test_language_never_writes_onto_the_executor(path):
  allowed = {"now"}   # the issue clock: primitives that wait on values advance it
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AugAssign, ast.AnnAssign)) else []
    for t in targets:
      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "ex":
        assert t.attr in allowed, (f"{path.name}:{node.lineno} sets ex.{t.attr}: per-kernel language state "
                                   f"belongs in lang/context.KernelContext")


@pytest.mark.parametrize("path", LANGUAGE_SIDE, ids=lambda p: p.name)
def test_op_classes_are_the_declared_constants(path):
  """No cost-class string literal in the language: every op names an executor.OpClass constant."""
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      for a in list(node.args) + [k.value for k in node.keywords]:
        if isinstance(a, ast.Constant) and a.value in OpClass.ALL:
          raise AssertionError(f"{path.name}:{node.lineno} passes the op class {a.value!r} as a string; "
                               f"use executor.OpClass.{a.value.upper()}")


def test_every_op_class_has_a_cost_and_nothing_else_does():
  assert set(cost.VECTOR_CLASSES) == set(OpClass.ALL)


def _capture(kernel_runner, names):
  """(executor, the protocol members it lacks, its `sparsecore`), seen while the kernel runs (the
  machine releases its cores' state when the launch ends)."""
  seen = []

  def body(*refs):
    ex = executor.current()
    seen.append((ex, sorted(n for n in names if not hasattr(ex, n)), ex.sparsecore))
  kernel_runner(body)
  return seen[0]


def test_tensorcore_implements_the_whole_protocol():
  out = pl.ShapeDtypeStruct((8, 128), np.float32)
  with pl.virtual_tpu("v5e"):
    ex, missing, sc = _capture(lambda body: pl.pallas_call(body, out_shape=out)(), EXECUTOR)
  assert not missing, f"TensorCore lacks {missing}"
  assert sc is None


def test_sparse_subcore_implements_the_sparsecore_protocol():
  with pl.virtual_tpu("v5p"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=1)
    ex, missing, sc = _capture(lambda body: pl.kernel(body, out_type=(), mesh=mesh)(), SPARSECORE)
  assert not missing, f"SparseSubcore lacks {missing}"
  assert sc is ex


def test_fetch_and_add_on_a_tensorcore_is_a_usage_error():
  # it used to fail with a bare AttributeError (peer_subcore_buffer exists only on SparseCores)
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", num_cores=1),
                     scratch_types=[pltpu.SMEM((1,), jnp.int32)])
  def k(o_hbm, counter):
    plsc.fetch_and_add(counter, 1, subcore_id=0)

  with pl.virtual_tpu("v5p"):
    with pytest.raises(UsageError, match=r"fetch_and_add\(\) .*core 0.*VectorSubcoreMesh"):
      k()


def test_prng_state_is_per_core_program_not_on_the_executor():
  def body(o_ref):
    pltpu.prng_seed(7)
    o_ref[...] = pltpu.prng_random_bits((8, 128))
    assert not hasattr(executor.current(), "prng")

  out = pl.ShapeDtypeStruct((8, 128), np.int32)
  with pl.virtual_tpu("v5e"):
    a = pl.pallas_call(body, out_shape=out)()
    b = pl.pallas_call(body, out_shape=out)()
  np.testing.assert_array_equal(a, b)


def test_prng_bits_before_a_seed_in_a_new_launch_is_an_error():
  def seeded(o_ref):
    pltpu.prng_seed(1)
    o_ref[...] = pltpu.prng_random_bits((8, 128))

  def unseeded(o_ref):
    o_ref[...] = pltpu.prng_random_bits((8, 128))

  out = pl.ShapeDtypeStruct((8, 128), np.int32)
  with pl.virtual_tpu("v5e"):
    pl.pallas_call(seeded, out_shape=out)()
    with pytest.raises(UsageError, match=r"prng_random_bits\(\) before pltpu.prng_seed\(\)"):
      pl.pallas_call(unseeded, out_shape=out)()


def test_kernel_context_primitives_outside_a_kernel():
  with pytest.raises(UsageError, match=r"pltpu.get_barrier_semaphore\(\) was called outside a kernel body"):
    pltpu.get_barrier_semaphore()
  with pytest.raises(UsageError, match=r"pltpu.prng_random_bits\(\) was called outside a kernel body"):
    pltpu.prng_random_bits((8, 128))


def test_scalar_ops_charges_what_as_many_scalar_op_calls_do():
  # palace.jax charges a fused run of scalar equations with one scalar_ops(n): the same clock and
  # scalar-unit time as n scalar_op calls, whose k-th result is ready at max(start + k * cycles, ready)
  seen = []

  def body(o_ref):
    ex = executor.current()
    for n in (1, 3, 40):
      readies = [ex.now + d for d in (0, 2, 5, 100)[:n]] + [0] * max(0, n - 4)
      t0, busy0 = ex.now, ex.unit_busy["scalar"]
      singles = [ex.scalar_op(r) for r in readies]
      t1, busy1 = ex.now, ex.unit_busy["scalar"]
      start, cycles = ex.scalar_ops(n)
      shift = start - t0   # (the same readies relative to the second start)
      fused = [max(start + (k + 1) * cycles, r + shift if r else 0) for k, r in enumerate(readies)]
      seen.append((start == t1, ex.now - t1 == t1 - t0, ex.unit_busy["scalar"] - busy1 == busy1 - busy0,
                   [s - t0 for s in singles] == [f - start for f in fused]))

  with pl.virtual_tpu("v5e"):
    pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32))()
  assert seen == [(True, True, True, True)] * 3
