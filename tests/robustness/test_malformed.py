"""Malformed calls that palace used to accept silently (or run with a meaning the user did not intend):
each is now rejected with the operand named and a fix."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

from errcheck import raises

X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
SDS = pl.ShapeDtypeStruct((8, 128), jnp.float32)


def _add(a, b, o):
  o[...] = a[...] + b[...]


def _copy(x, o):
  o[...] = x[...]


# ------------------------------------------------------------------ input_output_aliases
@pytest.mark.parametrize("aliases,why", [
    ({0: 0, 1: 0}, "inputs 0 and 1 are both aliased to output 0"),
    ({1: 0, 0: 0}, "inputs 1 and 0 are both aliased to output 0"),
    ({np.int64(0): 0, 1: np.int32(0)}, "inputs 0 and 1 are both aliased to output 0"),
])
def test_two_inputs_aliased_to_one_output(aliases, why):
  raises(lambda: pl.pallas_call(_add, SDS, input_output_aliases=aliases)(X, X), pl.UsageError,
         r"input_output_aliases of pallas_call '_add': " + why, "alias each output to at most one input")


@pytest.mark.parametrize("aliases,why", [
    ({"a": 0}, r"key 'a' must be an integer"), ({0.0: 0}, r"key 0\.0 must be an integer"),
    ({None: 0}, r"key None must be an integer"), ({(0,): 0}, r"key \(0,\) must be an integer"),
    ({-1: 0}, r"key -1 must be >= 0"), ({True: 0}, r"key True must be an integer"),
    ({0: "b"}, r"value for input 0 must be an integer"), ({0: 0.0}, r"value for input 0 must be an integer"),
    ({0: -1}, r"value for input 0 must be >= 0"), ({0: None}, r"value for input 0 must be an integer"),
    ([(0, 0)], r"must be a dict"), ("0:0", r"must be a dict"), (((0, 0),), r"must be a dict"),
])
def test_malformed_alias_entries(aliases, why):
  raises(lambda: pl.pallas_call(_copy, SDS, input_output_aliases=aliases)(X), pl.UsageError,
         r"input_output_aliases of pallas_call '_copy'.*" + why)


@pytest.mark.parametrize("aliases", [{5: 0}, {0: 3}])
def test_alias_to_missing_operand(aliases):
  raises(lambda: pl.pallas_call(_copy, SDS, input_output_aliases=aliases)(X), pl.UsageError,
         r"input_output_aliases \{\d: \d\} refers to a missing operand", "Fix")


def test_alias_shape_mismatch():
  raises(lambda: pl.pallas_call(_copy, pl.ShapeDtypeStruct((8, 256), jnp.float32),
                                input_output_aliases={0: 0})(X),
         pl.ShapeError, r"input_output_aliases \{0: 0\}: input float32\[8, 128\]", "Fix")


# ------------------------------------------------------------------ meshes and partition specs
@pytest.mark.parametrize("shape,names,why", [
    ((1, 1), ("x", "x"), r"repeat \['x'\]"), ((1, 1, 1), ("x", "y", "x"), r"repeat \['x'\]"),
    ((1, 1), ("x", ""), r"\[1\] must be a non-empty string"),
    ((1,), (5,), r"\[0\] must be a non-empty string"),
    ((1,), (None,), r"\[0\] must be a non-empty string"),
])
def test_make_mesh_axis_names(shape, names, why):
  with pl.virtual_tpu("v5e", 1):
    raises(lambda: pl.make_mesh(shape, names), pl.UsageError, "mesh axis_names.*" + why)


@pytest.mark.parametrize("shape,names,why", [
    ((2, 0), ("x", "y"), "mesh axis 'y' has size 0"), ((-1,), ("x",), r"mesh axis sizes\[0\] must be >= 0"),
    ((2.0,), ("x",), r"mesh axis sizes\[0\] must be an integer"),
    ((2, 2), ("x", "x"), r"repeat \['x'\]")])
def test_mesh_shapes(shape, names, why):
  raises(lambda: pl.Mesh(shape, names), pl.UsageError, why)


@pytest.mark.parametrize("parts,why", [
    (("x", "x"), "uses mesh axis 'x' twice"), ((("x", "y"), "x"), "uses mesh axis 'x' twice"),
    ((None, ("y", "y")), "uses mesh axis 'y' twice"), (("x", None, "x"), "uses mesh axis 'x' twice"),
    ((5,), "entry 0 must be a non-empty string"), (("",), "entry 0 must be a non-empty string"),
    ((("x", 3),), "entry 0 must be a non-empty string"), ((None, 1.5), "entry 1 must be a non-empty string"),
])
def test_partition_spec_entries(parts, why):
  raises(lambda: pl.P(*parts), pl.UsageError, r"P\(.*\) " + why)


def _mesh2():
  with pl.virtual_tpu("v5e", 2):
    return pl.make_mesh((2,), ("x",))


def _in_pod(fn):
  def run():
    with pl.virtual_tpu("v5e", 2):
      return fn()
  return run


@pytest.mark.parametrize("in_spec,why", [
    (pl.P("x", None, None), r"args\[0\]: PartitionSpec P\('x', None, None\) has 3 entries but the value has 2"),
    (pl.P(None, None, "x"), r"args\[0\]: PartitionSpec P\(None, None, 'x'\) has 3 entries"),
    (pl.P("x", None, None, None), r"args\[0\]: PartitionSpec .* has 4 entries")])
def test_shard_map_in_spec_of_higher_rank(in_spec, why):
  mesh = _mesh2()
  f = pl.shard_map(lambda a: a, mesh=mesh, in_specs=in_spec, out_specs=pl.P("x"))
  raises(_in_pod(lambda: f(X)), pl.UsageError, why, "at most one entry per dimension")


def test_shard_map_out_spec_of_higher_rank():
  mesh = _mesh2()
  f = pl.shard_map(lambda a: a, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x", None, None))
  raises(_in_pod(lambda: f(X)), pl.UsageError, r"outputs\[0\]: PartitionSpec .* has 3 entries")


@pytest.mark.parametrize("out_specs", [pl.P("x"), pl.P(), [pl.P("x")], (pl.P(), pl.P())])
def test_shard_map_function_returning_none(out_specs):
  mesh = _mesh2()
  f = pl.shard_map(lambda a: None, mesh=mesh, in_specs=pl.P("x"), out_specs=out_specs)
  raises(_in_pod(lambda: f(X)), pl.UsageError, r"shard_map function '<lambda>' returned None but out_specs=",
         "Fix: return the per-chip results")


def test_shard_map_without_outputs_is_fine():
  mesh = _mesh2()
  f = pl.shard_map(lambda a: None, mesh=mesh, in_specs=pl.P("x"), out_specs=())
  assert _in_pod(lambda: f(X))() is None


@pytest.mark.parametrize("n_specs", [2, 3])
def test_shard_map_in_specs_count(n_specs):
  mesh = _mesh2()
  f = pl.shard_map(lambda a: a, mesh=mesh, in_specs=[pl.P("x")] * n_specs, out_specs=pl.P("x"))
  raises(_in_pod(lambda: f(X)), pl.UsageError, rf"shard_map: {n_specs} in_specs for 1 arguments",
         "one PartitionSpec per argument")


def test_shard_map_out_specs_count():
  mesh = _mesh2()
  f = pl.shard_map(lambda a: (a, a), mesh=mesh, in_specs=pl.P("x"), out_specs=[pl.P("x")] * 3)
  raises(_in_pod(lambda: f(X)), pl.UsageError, r"shard_map: 3 out_specs for 2 outputs", "one PartitionSpec per output")


# ------------------------------------------------------------------ virtual_tpu flags and topology
@pytest.mark.parametrize("flag", ["detect_races", "timing_only", "trace"])
@pytest.mark.parametrize("value", ["yes", 1, 0.0, [True]])
def test_non_bool_flags(flag, value):
  raises(lambda: pl.virtual_tpu("v5e", **{flag: value}), pl.UsageError,
         rf"virtual_tpu\({flag}\) must be a bool", "pass True or False")


@pytest.mark.parametrize("chip", ["", "   ", "tpu"])
def test_empty_chip_names(chip):
  # "" used to mean the default chip; "tpu" stripped to ""
  with pytest.raises(pl.UsageError, match="chip"):
    pl.virtual_tpu(chip)


# ------------------------------------------------------------------ collective_axes
TC = pltpu.TensorCoreMesh("core", num_cores=1)


@pytest.mark.parametrize("axes,why", [
    ("x", "'x' is not an axis of the kernel's mesh"), (("core", "y"), "'y' is not an axis"),
    (("cores",), "'cores' is not an axis")])
def test_unknown_collective_axes(axes, why):
  def k(x, o):
    pl.run_scoped(lambda buf: None, pltpu.VMEM_SHARED((8, 128), jnp.float32), collective_axes=axes)
  raises(lambda: pl.kernel(k, out_type=SDS, mesh=TC)(X), pl.UsageError,
         r"pl\.run_scoped\(collective_axes=.*\): " + why, "Fix: name an axis of the pl.kernel mesh")


def test_known_collective_axis_runs():
  def k(x, o):
    pl.run_scoped(lambda buf: None, pltpu.VMEM_SHARED((8, 128), jnp.float32), collective_axes="core")
    pltpu.sync_copy(x, o)
  np.testing.assert_array_equal(pl.kernel(k, out_type=SDS, mesh=TC)(X), X)


# ------------------------------------------------------------------ None operands
@pytest.mark.parametrize("args,n_specs,bad", [((None,), 1, 0), ((X, None), 2, 1), ((None, X), 2, 0)])
def test_none_operand_with_a_block_spec(args, n_specs, bad):
  # None is an empty pytree (JAX): its in_specs entry used to be dropped silently
  spec = pl.BlockSpec((8, 128), lambda: (0, 0))
  f = pl.pallas_call(lambda *refs: None, SDS, in_specs=[spec] * n_specs)
  raises(lambda: f(*args), pl.UsageError, rf"pallas_call args\[{bad}\] is None but in_specs\[{bad}\] is a BlockSpec",
         "Fix: pass an array, or None as its in_specs entry")


def test_none_operand_with_none_spec_reaches_the_kernel_as_none():
  seen = []

  def k(a, b, o):
    seen.append(b)
    o[...] = a[...]
  spec = pl.BlockSpec((8, 128), lambda: (0, 0))
  np.testing.assert_array_equal(pl.pallas_call(k, SDS, in_specs=[spec, None], out_specs=spec)(X, None), X)
  assert seen == [None]


def test_shape_dtype_struct_without_dtype():
  raises(lambda: pl.ShapeDtypeStruct((8, 128), None), pl.UsageError, "ShapeDtypeStruct dtype is None",
         "Fix: pass a dtype")
