"""Every message names the operand and place and says what to do: the errors that used to state only
the problem ("in_specs has 1 BlockSpecs but there are 2 operands") now end with a fix."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

from errcheck import raises

X = np.ones((8, 128), np.float32)
SDS = pl.ShapeDtypeStruct((8, 128), jnp.float32)
SPEC = pl.BlockSpec((8, 128), lambda: (0, 0))


def _add(a, b, o):
  o[...] = a[...] + b[...]


def _copy(x, o):
  o[...] = x[...]


@pytest.mark.parametrize("kwargs,args,why", [
    (dict(in_specs=[SPEC]), (X, X), r"in_specs has 1 BlockSpecs but there are 2 operands"),
    (dict(in_specs=[SPEC] * 3), (X, X), r"in_specs has 3 BlockSpecs but there are 2 operands"),
    (dict(out_specs=[SPEC, SPEC]), (X, X), r"out_specs has 2 BlockSpecs but there are 1 operands"),
])
def test_spec_counts(kwargs, args, why):
  raises(lambda: pl.pallas_call(_add, SDS, **kwargs)(*args), pl.UsageError, why, "Fix: give \\w+_specs one BlockSpec per")


@pytest.mark.parametrize("kw", ["grids", "in_spec", "scratch", "aliases"])
def test_misspelt_pallas_call_keywords(kw):
  raises(lambda: pl.pallas_call(_copy, SDS, **{kw: ()}), pl.UsageError,
         rf"unexpected keyword\(s\) \['{kw}'\]", "Fix: check the spelling")


def test_missing_scalar_prefetch_operands():
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=(1,))
  raises(lambda: pl.pallas_call(_copy, SDS, grid_spec=gs)(X), pl.UsageError,
         "expects 2 scalar-prefetch operands; got 1", "Fix: pass the scalar-prefetch arrays first")


@pytest.mark.parametrize("sem,grid", [(("parallel",), (2, 2)), (("parallel", "arbitrary", "parallel"), (2, 2))])
def test_dimension_semantics_count(sem, grid):
  spec = pl.BlockSpec((8, 128), lambda i, j: (0, 0))
  f = pl.pallas_call(_copy, SDS, grid=grid, in_specs=[spec], out_specs=spec,
                     compiler_params=pltpu.CompilerParams(dimension_semantics=sem))
  with pl.virtual_tpu("v5p"):
    raises(lambda: f(X), pl.UsageError, rf"dimension_semantics has {len(sem)} entries", "one entry per grid axis")


@pytest.mark.parametrize("spec,why", [
    ("spec", "The spec for args\\[0\\] is 'spec'; expected a pl.BlockSpec"),
    (5, "The spec for args\\[0\\] is 5"),
    (pl.BlockSpec((1, 8, 128), lambda: (0, 0, 0)), r"args\[0\] \(= \(1, 8, 128\)\) must have the same number"),
    (pl.BlockSpec((128,), lambda: (0,)), r"args\[0\] \(= \(128,\)\) must have the same number"),
    (pl.BlockSpec((8, 64), lambda: (0, 0), memory_space=pl.ANY), r"args\[0\] \(= \(8, 64\)\) must equal"),
    (pl.BlockSpec((0, 128), lambda: (0, 0)), r"args\[0\] \(= \(0, 128\)\) has a non-positive size"),
])
def test_block_spec_messages(spec, why):
  raises(lambda: pl.pallas_call(_copy, SDS, in_specs=[spec])(X), pl.BlockSpecError, "Block shape for " + why
         if why.startswith("args") else why)


def test_rank1_block_message():
  spec = pl.BlockSpec((100,), lambda i: (i,))
  f = pl.pallas_call(_copy, pl.ShapeDtypeStruct((1000,), jnp.float32), grid=(10,), in_specs=[spec], out_specs=spec)
  raises(lambda: f(np.ones(1000, np.float32)), pl.BlockSpecError, r"args\[0\] \(= \(100,\)\) is not a valid rank-1",
         "Fix: use one of those block lengths")


@pytest.mark.parametrize("out,why", [(5, "out_shape\\[0\\] = 5"), ("f32", "out_shape\\[0\\] = 'f32'")])
def test_bad_out_shape_entries(out, why):
  raises(lambda: pl.pallas_call(_copy, out)(X), pl.UsageError, why, "Fix: pass e.g. pl.ShapeDtypeStruct")


@pytest.mark.parametrize("params", ["fast", 3, {"gpu": {}}])
def test_bad_compiler_params_objects(params):
  raises(lambda: pl.pallas_call(_copy, SDS, compiler_params=params), pl.UsageError, "compiler_params", "pltpu.CompilerParams")


TC1 = pltpu.TensorCoreMesh("core", num_cores=1)


@pytest.mark.parametrize("mesh", ["core", 2, None])
def test_pl_kernel_mesh_types(mesh):
  raises(lambda: pl.kernel(_copy, out_type=SDS, mesh=mesh)(X), pl.UsageError, "pl.kernel mesh must be",
         "Fix: pass e.g. mesh=pltpu.TensorCoreMesh")


def test_mpmd_mesh_count():
  raises(lambda: pl.kernel([_copy, _copy], out_type=SDS, mesh=[TC1])(X), pl.UsageError,
         "MPMD pl.kernel needs one mesh per body", "one per body")


def test_same_ref_twice():
  r = pl.new_ref(X)
  raises(lambda: pl.kernel(lambda a, b: None, out_type=(), mesh=TC1)(r, r), pl.UsageError,
         r"args\[1\] of kernel '<lambda>': the same ref is passed twice", "Fix: pass it once")


def test_freed_ref():
  r = pl.new_ref(X)
  pl.freeze(r)
  raises(lambda: pl.kernel(lambda a: None, out_type=(), mesh=TC1)(r), pl.UsageError,
         r"args\[0\] of kernel '<lambda>' is a frozen or freed ref", "Fix: pass a live")


@pytest.mark.parametrize("shape,names,why", [((2,), ("x", "y"), "1 axis sizes but 2 axis names"),
                                             ((1, 2), ("x",), "2 axis sizes but 1 axis names")])
def test_make_mesh_name_count(shape, names, why):
  with pl.virtual_tpu("v5e", 2):
    raises(lambda: pl.make_mesh(shape, names), pl.UsageError, why, "one name per axis size")


def test_make_mesh_devices():
  with pl.virtual_tpu("v5e", 2):
    raises(lambda: pl.make_mesh((2,), ("x",), devices=[0, 0]), pl.UsageError, "must list each of the 2 chips once",
           r"permutation of range\(2\)")


def test_partition_spec_unknown_axis():
  with pl.virtual_tpu("v5e", 2):
    mesh = pl.make_mesh((2,), ("x",))
    f = pl.shard_map(lambda a: a, mesh=mesh, in_specs=pl.P("y"), out_specs=pl.P("y"))
    raises(lambda: f(X), pl.UsageError, r"args\[0\]: PartitionSpec P\('y',\) names axis 'y'", "name only mesh axes")


def test_autotune_all_rejected():
  def make(c):
    spec = pl.BlockSpec((c["b"], 128), lambda i: (i, 0))
    return pl.pallas_call(_copy, pl.ShapeDtypeStruct((c["b"] * 2, 128), jnp.float32), grid=(2,),
                          in_specs=[spec], out_specs=spec)
  res = pl.autotune(make, [{"b": 2**17}], (np.ones((2**18, 128), np.float32),))
  raises(lambda: res.best, pl.UsageError, "all 1 configurations were rejected", "Fix: try smaller blocks")


def _barrier_kernel(skip_on):
  def body(x, o, sem):
    c = lax.axis_index("core")

    @pl.when(c != skip_on)
    def _():
      pltpu.core_barrier(sem, core_axis_name="core")
  return pl.kernel(body, out_type=SDS, mesh=pltpu.TensorCoreMesh("core", num_cores=2),
                   scratch_types=[pltpu.SemaphoreType.BARRIER])


@pytest.mark.parametrize("skip_on,stuck", [(1, 0), (0, 1)])
def test_skipped_core_barrier_names_the_stuck_core(skip_on, stuck):
  with pl.virtual_tpu("v5p"):
    raises(lambda: _barrier_kernel(skip_on)(X), pl.SyncError,
           rf"Core {stuck} of axis 'core' is stuck in pltpu.core_barrier\(core_axis_name='core'\) at "
           rf"test_messages.py:\d+", "do not put it under pl.when")


@pytest.mark.parametrize("chip,n", [("v5e", 2), ("v6e", 4), ("v5p", 3), ("7x", 2)])
def test_tensorcore_mesh_larger_than_the_chip(chip, n):
  f = pl.kernel(_copy, out_type=SDS, mesh=pltpu.TensorCoreMesh("core", num_cores=n))
  with pl.virtual_tpu(chip):
    raises(lambda: f(X), pl.UsageError, rf"TensorCoreMesh\(num_cores={n}\) for kernel '_copy': {chip} has",
           "Fix: pass num_cores=")


@pytest.mark.parametrize("call,cls,why,fix", [
    (lambda: pl.empty_ref((8, 128)), pl.UsageError, "pl.empty_ref expects a ShapeDtypeStruct", "Fix: pass"),
    (lambda: pl.freeze(X), pl.UsageError, "pl.freeze expects a live mutable ref", "Fix: pass a ref"),
    (lambda: pl.new_ref(X, memory_space=pltpu.VMEM), pl.UsageError, r"pl\.new_ref\(memory_space=vmem\) on the host",
     "Fix: drop memory_space"),
])
def test_host_ref_messages(call, cls, why, fix):
  raises(call, cls, why, fix)


def _values_kernel(fn):
  def k(x, o):
    fn(x[...])
  return lambda: pl.kernel(lambda x, o: pl.run_scoped(lambda v: (pltpu.sync_copy(x, v), k(v, o)),
                                                       pltpu.VMEM((8, 128), jnp.float32)),
                           out_type=SDS, mesh=TC1)(X)


@pytest.mark.parametrize("fn,why,fix", [
    (lambda v: jnp.dot(v, v), r"dot_general contracting dimensions differ: lhs \(8, 128\) dim 1",
     "Fix: transpose an operand"),
    (lambda v: jnp.einsum("ij,kj", v, v), "jnp.einsum in kernels supports two operands", "Fix: write the subscripts"),
    (lambda v: lax.dynamic_slice(v, (0, 0), (16, 128)), "slice size 16 does not fit dimension 8",
     "Fix: use a slice size between 0 and 8"),
    (lambda v: lax.dynamic_update_slice(v, v.astype(jnp.bfloat16), (0, 0)), "update dtype bfloat16 differs",
     r"Fix: cast the update with \.astype\(float32\)"),
])
def test_kernel_value_messages(fn, why, fix):
  raises(_values_kernel(fn), pl.ShapeError if "einsum" not in why else pl.UsageError, why, fix)
