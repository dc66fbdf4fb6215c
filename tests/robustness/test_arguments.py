"""Malformed arguments that used to end in a bare Python/NumPy error (or were truncated): each is now a
PalaceError naming the parameter and giving a fix."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

from errcheck import raises

BAD_SHAPES = [((-1, 128), r"\[0\] must be >= 0"), ((8, -128), r"\[1\] must be >= 0"),
              ((8.5, 128), r"\[0\] must be an integer"), (("a", 128), r"\[0\] must be an integer"),
              (None, " must be a tuple of dimensions"), ("ab", " must be a tuple of dimensions"),
              ((None, 8), r"\[0\] must be an integer"), (((8,), 8), r"\[0\] must be an integer"),
              ((True, 8), r"\[0\] must be an integer"), (2.0, " must be a tuple of dimensions")]


@pytest.mark.parametrize("shape,why", BAD_SHAPES)
def test_shape_dtype_struct_shapes(shape, why):
  raises(lambda: pl.ShapeDtypeStruct(shape, jnp.float32), pl.UsageError, r"ShapeDtypeStruct shape" + why)


@pytest.mark.parametrize("space", ["VMEM", "SMEM", "HBM", "ANY", "VMEM_SHARED"])
@pytest.mark.parametrize("shape,why", BAD_SHAPES[:6])
def test_memory_space_shapes(space, shape, why):
  mem = pl.MemorySpace[space]
  raises(lambda: mem(shape, jnp.float32), pl.UsageError, rf"pltpu\.{space}\(shape\)" + why)


@pytest.mark.parametrize("kind", ["REGULAR", "DMA", "BARRIER"])
@pytest.mark.parametrize("shape,why", [((-2,), r"\[0\] must be >= 0"), ((2.5,), r"\[0\] must be an integer"),
                                       (("x",), r"\[0\] must be an integer"), ((4, -1), r"\[1\] must be >= 0"),
                                       (None, " must be a tuple")])
def test_semaphore_array_shapes(kind, shape, why):
  t = getattr(pltpu.SemaphoreType, kind)
  raises(lambda: t(shape), pl.UsageError, rf"SemaphoreType\.{kind}\(shape\)" + why)


@pytest.mark.parametrize("field,value,why", [
    ("vmem_limit_bytes", "big", "must be an integer"), ("vmem_limit_bytes", 1.5e6, "must be an integer"),
    ("vmem_limit_bytes", -1, "must be >= 1"), ("vmem_limit_bytes", 0, "must be >= 1"),
    ("vmem_limit_bytes", [1], "must be an integer"),
    ("collective_id", "a", "must be an integer"), ("collective_id", -1, "must be >= 0"),
    ("collective_id", 0.5, "must be an integer"),
    ("internal_scratch_in_bytes", "x", "must be an integer"), ("internal_scratch_in_bytes", -8, "must be >= 0"),
    ("opt_level", 1.0, "must be an integer"), ("opt_level", "O2", "must be an integer"),
    ("disable_bounds_checks", 1, "must be a bool"), ("disable_bounds_checks", "yes", "must be a bool"),
    ("disable_semaphore_checks", None, "must be a bool"), ("skip_device_barrier", "no", "must be a bool"),
    ("allow_collective_id_without_custom_barrier", 0, "must be a bool"),
    ("shape_invariant_numerics", "true", "must be a bool"), ("needs_layout_passes", 2, "must be a bool"),
    ("fuse_transposed_lhs_in_matmul", [], "must be a bool"),
])
def test_compiler_params_fields(field, value, why):
  raises(lambda: pltpu.CompilerParams(**{field: value}), pl.UsageError,
         rf"CompilerParams\({field}\) {why}")


@pytest.mark.parametrize("value,why", [
    ("parallel", "one entry per grid axis"), (5, "one entry per grid axis"),
    (("parallel", "sideways"), "sideways"), ((1,), "expected one of"),
    (pltpu.PARALLEL, "one entry per grid axis"), ((None,), "expected one of")])
def test_compiler_params_dimension_semantics(value, why):
  raises(lambda: pltpu.CompilerParams(dimension_semantics=value), pl.UsageError, why)


@pytest.mark.parametrize("value", ["x", 5, ["a"]])
def test_compiler_params_flags(value):
  raises(lambda: pltpu.CompilerParams(flags=value), pl.UsageError, r"CompilerParams\(flags\) must be a dict")


@pytest.mark.parametrize("kwargs,operand", [
    (dict(block_shape="ab"), r"BlockSpec\(block_shape\)"), (dict(block_shape=5), r"BlockSpec\(block_shape\)"),
    (dict(block_shape=2.5), r"BlockSpec\(block_shape\)"),
    (dict(block_shape=(8, 128), index_map=5), r"BlockSpec\(index_map\)"),
    (dict(block_shape=(8, 128), index_map="lambda i: i"), r"BlockSpec\(index_map\)"),
    (dict(block_shape=(8, 128), index_map=(0, 0)), r"BlockSpec\(index_map\)"),
    (dict(block_shape=(8, 128), index_map=lambda i: (i, 0), pipeline_mode=2), r"BlockSpec\(pipeline_mode\)"),
    (dict(block_shape=(8, 128), index_map=lambda i: (i, 0), pipeline_mode="double"),
     r"BlockSpec\(pipeline_mode\)"),
    (dict(memory_space="vmem"), r"BlockSpec\(memory_space\)"), (dict(memory_space=3), r"BlockSpec\(memory_space\)"),
    (dict(memory_space=pltpu.VMEM((8, 128), jnp.float32)), r"BlockSpec\(memory_space\)"),
])
def test_block_spec_fields(kwargs, operand):
  raises(lambda: pl.BlockSpec(**kwargs), pl.BlockSpecError, operand)


@pytest.mark.parametrize("kwargs,why", [
    (dict(buffer_count="x"), "must be an integer"), (dict(buffer_count=0), "must be >= 1"),
    (dict(buffer_count=-1), "must be >= 1"), (dict(buffer_count=1.5), "must be an integer"),
    (dict(buffer_count=None), "must be an integer"), (dict(use_lookahead="yes"), "must be a bool"),
    (dict(use_lookahead=1), "must be a bool")])
def test_buffered(kwargs, why):
  raises(lambda: pl.Buffered(**kwargs), pl.UsageError, r"pl\.Buffered\(\w+\) " + why)


@pytest.mark.parametrize("kwargs,operand", [
    (dict(axis_name=""), r"TensorCoreMesh\(axis_name\)"), (dict(axis_name=5), r"TensorCoreMesh\(axis_name\)"),
    (dict(axis_name=None), r"TensorCoreMesh\(axis_name\)"), (dict(num_cores="x"), r"TensorCoreMesh\(num_cores\)"),
    (dict(num_cores=0), r"TensorCoreMesh\(num_cores\) must be >= 1"),
    (dict(num_cores=-2), r"TensorCoreMesh\(num_cores\) must be >= 1"),
    (dict(num_cores=1.5), r"TensorCoreMesh\(num_cores\) must be an integer")])
def test_tensorcore_mesh(kwargs, operand):
  raises(lambda: pltpu.TensorCoreMesh(**kwargs), pl.UsageError, operand)


@pytest.mark.parametrize("kwargs,operand", [
    (dict(chip=""), r"virtual_tpu\(chip\) must be a non-empty string"),
    (dict(chip=None), r"virtual_tpu\(chip\) must be a non-empty string"),
    (dict(chip=5), r"virtual_tpu\(chip\) must be a non-empty string"),
    (dict(num_chips=None), r"virtual_tpu\(num_chips\) must be an integer"),
    (dict(num_chips=0), r"virtual_tpu\(num_chips\) must be >= 1"),
    (dict(num_chips=-4), r"virtual_tpu\(num_chips\) must be >= 1"),
    (dict(num_chips=2.5), r"virtual_tpu\(num_chips\) must be an integer"),
    (dict(num_chips="4"), r"virtual_tpu\(num_chips\) must be an integer"),
    (dict(timing_only="no"), r"virtual_tpu\(timing_only\) must be a bool"),
    (dict(timing_only=1), r"virtual_tpu\(timing_only\) must be a bool"),
    (dict(trace=None), r"virtual_tpu\(trace\) must be a bool"),
    (dict(trace="off"), r"virtual_tpu\(trace\) must be a bool"),
    (dict(dma_policy="fast"), r"virtual_tpu\(dma_policy\) must be one of"),
    (dict(dma_policy=None), r"virtual_tpu\(dma_policy\) must be one of"),
    (dict(dma_policy=["eager"]), r"virtual_tpu\(dma_policy\) must be one of"),
    (dict(seed=1.5), r"virtual_tpu\(seed\) must be an integer"),
    (dict(seed="0"), r"virtual_tpu\(seed\) must be an integer"),
    (dict(seed=None), r"virtual_tpu\(seed\) must be an integer"),
    (dict(uninitialized="zero"), r"virtual_tpu\(uninitialized='zero'\)"),
    (dict(uninitialized=None), r"virtual_tpu\(uninitialized=None\)"),
    (dict(uninitialized=["nan"]), r"virtual_tpu\(uninitialized=\['nan'\]\)"),
])
def test_virtual_tpu_arguments(kwargs, operand):
  raises(lambda: pl.virtual_tpu(**kwargs), pl.UsageError, operand)


@pytest.mark.parametrize("chip,n,topology,why", [
    ("v5e", 4, "x", "must be a tuple of dimensions"), ("v5e", 4, (-2, -2), r"\[0\] must be >= 0"),
    ("v5e", 1, (), "is empty"), ("v5e", 4, (0, 4), r"\[0\] is 0"), ("v5e", 4, (4, 0), r"\[1\] is 0"),
    ("v5e", 8, (2, 2, 2), "2-D torus"), ("v5e", 4, (3,), "has 3 chips but num_chips=4"),
    ("v5e", 4, (2.0, 2), r"\[0\] must be an integer"), ("v4", 8, (2, 2, 2, 1), "3-D torus"),
    ("v5p", 8, (2, 2, 3), "has 12 chips"), ("v6e", 4, None.__class__, "must be a tuple"),
    ("7x", 2, (1, "2"), r"\[1\] must be an integer")])
def test_bad_topology(chip, n, topology, why):
  raises(lambda: pl.virtual_tpu(chip, n, topology=topology), pl.UsageError,
         r"virtual_tpu\(topology\).*" + why)


def test_mesh_before_tpu_and_non_mesh_shard_map():
  raises(lambda: pl.shard_map(lambda a: a, mesh="m", in_specs=pl.P(), out_specs=pl.P()), pl.UsageError,
         r"shard_map\(mesh=...\) must be a mesh.*'m'")


@pytest.mark.parametrize("mesh", [None, 5, ("x",), pltpu.TensorCoreMesh(num_cores=1), {"x": 2}])
def test_shard_map_mesh_types(mesh):
  raises(lambda: pl.shard_map(lambda a: a, mesh=mesh, in_specs=pl.P(), out_specs=pl.P()), pl.UsageError,
         r"shard_map\(mesh=...\) must be a mesh")


@pytest.mark.parametrize("f", [None, 5, "f"])
def test_shard_map_function_not_callable(f):
  with pl.virtual_tpu("v5e", 2):
    mesh = pl.make_mesh((2,), ("x",))
  raises(lambda: pl.shard_map(f, mesh=mesh, in_specs=pl.P(), out_specs=pl.P()), pl.UsageError,
         r"shard_map\(f\) must be callable")


@pytest.mark.parametrize("path,why", [(None, "expected a path"), (5, "expected a path"), ("", "expected a path"),
                                      (b"x.py", "expected a path")])
def test_load_module_non_paths(path, why):
  from palace.compat import load_module
  raises(lambda: load_module(path), pl.UsageError, r"load_module\(.*\): " + why)


def test_load_module_directory(tmp_path):
  from palace.compat import load_module
  raises(lambda: load_module(str(tmp_path)), pl.UsageError, "is a directory", "Fix: pass one of its .py files")


def test_load_module_missing_file(tmp_path):
  from palace.compat import load_module
  raises(lambda: load_module(str(tmp_path / "nope.py")), pl.UsageError, "nope.py.*no such file")


def _copy(x_ref, o_ref):
  o_ref[...] = x_ref[...]


X = np.ones((8, 128), np.float32)
SDS = pl.ShapeDtypeStruct((8, 128), jnp.float32)


@pytest.mark.parametrize("configs,why", [
    (5, "is not a collection"), ("abc", "is not a collection"), (None, "is not a collection"),
    ({"bm": 5}, r"configs\['bm'\] = 5 is not a list"), ({"bm": "128"}, r"configs\['bm'\] = '128'"),
    ([], "no configurations"), ((), "no configurations")])
def test_autotune_bad_configs(configs, why):
  raises(lambda: pl.autotune(lambda c: pl.pallas_call(_copy, SDS), configs, (X,)), pl.UsageError, why)


@pytest.mark.parametrize("make_call,why", [
    (5, r"autotune\(make_call\) must be callable"),
    (lambda c: None, r"make_call\(bm=8\) must be callable"),
    (lambda c: c, r"make_call\(bm=8\) must be callable")])
def test_autotune_bad_make_call(make_call, why):
  raises(lambda: pl.autotune(make_call, [{"bm": 8}], (X,)), pl.UsageError, why)


TC1 = pltpu.TensorCoreMesh("core", num_cores=1)


@pytest.mark.parametrize("body,scratch,why", [
    (lambda x: None, (), "1 input \\+ 1 output \\+ 0 scratch"),
    (lambda x, o, extra: None, (), "1 input \\+ 1 output \\+ 0 scratch"),
    (lambda: None, (), "1 input \\+ 1 output"),
    (lambda x, o: None, (pltpu.VMEM((8, 128), jnp.float32),), "1 scratch"),
    (lambda x, o, a, b: None, (pltpu.VMEM((8, 128), jnp.float32),), "1 scratch"),
    (lambda x, o, *, buf: None, {"tmp": pltpu.VMEM((8, 128), jnp.float32)}, "scratch keywords \\['tmp'\\]"),
])
def test_kernel_body_arity(body, scratch, why):
  raises(lambda: pl.kernel(body, out_type=SDS, mesh=TC1, scratch_types=scratch)(X), pl.UsageError,
         "cannot take the refs pl.kernel passes: .*" + why)


def _scoped_kernel(body, *types, **kw):
  def k(x, o):
    pl.run_scoped(body, *types, **kw)
  return lambda: pl.kernel(k, out_type=SDS, mesh=TC1)(X)


VM = pltpu.VMEM((8, 128), jnp.float32)


@pytest.mark.parametrize("call,why", [
    (_scoped_kernel(lambda: None, VM), "cannot take the 1 positional ref"),
    (_scoped_kernel(lambda a: None, VM, VM), "cannot take the 2 positional ref"),
    (_scoped_kernel(lambda a, b, c: None, VM, VM), "cannot take the 2 positional ref"),
    (_scoped_kernel(lambda a: None, VM, buf=VM), "keyword refs \\['buf'\\]"),
    (_scoped_kernel(lambda a, *, other: None, VM, buf=VM), "keyword refs \\['buf'\\]"),
    (_scoped_kernel(lambda sem: None), "cannot take the 0 positional ref"),
])
def test_run_scoped_body_arity(call, why):
  raises(call, pl.UsageError, r"pl\.run_scoped body .*" + why, "Fix: give the body one parameter")


@pytest.mark.parametrize("body", [None, 5, VM])
def test_run_scoped_body_not_callable(body):
  raises(_scoped_kernel(body, VM), pl.UsageError, r"pl\.run_scoped\(f\) must be callable")


# ------------------------------------------------------------------ more front ends
def _in_kernel(body, scratch=()):
  return lambda: pl.kernel(body, out_type=SDS, mesh=TC1, scratch_types=scratch)(X)


@pytest.mark.parametrize("body,why", [
    (lambda i: 0, "too many positional arguments"), (lambda: 0, "too many positional arguments"),
    (lambda i, c, extra: c, "missing a required argument")])
def test_fori_loop_body_arity(body, why):
  from palace import lax
  raises(_in_kernel(lambda x, o: (lax.fori_loop(0, 2, body, 0), None)[1]), pl.UsageError,
         r"lax\.fori_loop body '<lambda>' cannot be called as body\(i, carry\) \(" + why,
         "Fix: define it with two parameters")


def test_a_body_made_afresh_per_call_is_checked_every_time():
  """check_call memoises its answer per code object (kernels make their fori_loop and run_scoped
  bodies afresh on every step); a wrong body still raises on every call, with its own name, and a
  wrapper that inspect sees through (functools.wraps) is checked as the function it wraps."""
  import functools
  from palace._src import validate

  def make(bad):
    if bad:
      return lambda i: 0
    return lambda i, c: c
  for bad in (False, True, True, False):
    f = make(bad)
    if bad:
      with pytest.raises(pl.UsageError, match="too many positional arguments"):
        validate.check_call(f, 2, (), lambda e: f"body cannot take 2 ({e}).")
    else:
      validate.check_call(f, 2, (), lambda e: f"body cannot take 2 ({e}).")

  def wrap(g):
    @functools.wraps(g)
    def w(*args):
      return g(*args)
    return w
  validate.check_call(wrap(lambda i, c: c), 2, (), str)   # (same wrapper code, other signatures)
  with pytest.raises(pl.UsageError, match="too many positional arguments"):
    validate.check_call(wrap(lambda i: i), 2, (), lambda e: f"({e}).")


@pytest.mark.parametrize("body,n_out,why", [
    (lambda a, b: None, 0, "1 input \\+ 0 output block refs"),
    (lambda a: None, 1, "1 input \\+ 1 output block refs"),
    (lambda a, b, c: None, 1, "1 input \\+ 1 output block refs")])
def test_emit_pipeline_body_arity(body, n_out, why):
  spec = pl.BlockSpec((8, 128), lambda i: (0, 0))

  def k(x, o):
    pltpu.emit_pipeline(body, grid=(1,), in_specs=[spec], out_specs=[spec] * n_out)(x, *([o] * n_out))
  raises(_in_kernel(k), pl.UsageError, "emit_pipeline body '<lambda>' cannot take the refs it is given: " + why,
         "Fix: define it as body")


@pytest.mark.parametrize("fmt,args", [("{} {}", (1,)), ("{x}", (1,)), ("{0} {2}", (1, 2)), ("{:q}", (1,))])
def test_debug_print_format_mismatch(fmt, args):
  raises(_in_kernel(lambda x, o: pl.debug_print(fmt, *args)), pl.UsageError,
         r"pl\.debug_print\(.*\) with \d value\(s\): the format does not match", "one positional")


@pytest.mark.parametrize("grid_spec", [5, "grid", (1,), pl.BlockSpec()])
def test_grid_spec_type(grid_spec):
  raises(lambda: pl.pallas_call(_copy, SDS, grid_spec=grid_spec), pl.UsageError,
         "pallas_call grid_spec must be a pl.GridSpec")


@pytest.mark.parametrize("cost", [5, "cheap", {"flops": 1}])
def test_cost_estimate_type(cost):
  raises(lambda: pl.pallas_call(_copy, SDS, cost_estimate=cost), pl.UsageError,
         "pallas_call cost_estimate must be a pl.CostEstimate")


@pytest.mark.parametrize("interpret", ["yes", 1, pltpu.CompilerParams()])
def test_interpret_type(interpret):
  raises(lambda: pl.pallas_call(_copy, SDS, interpret=interpret)(X), pl.UsageError,
         "interpret= of kernel '_copy' must be a bool or pltpu.InterpretParams")


@pytest.mark.parametrize("fn", [5, None, "f"])
def test_explore_schedules_fn(fn):
  raises(lambda: pl.explore_schedules(fn), pl.UsageError, r"explore_schedules\(fn\) must be callable")


@pytest.mark.parametrize("front", ["pallas_call", "emit_pipeline"])
def test_bounded_slice_block_dims_are_refused_with_the_tpu_compilers_reason(front):
  """pl.BoundedSlice block dims: palace's pallas_call and emit_pipeline refuse them, naming the spec
  and that Mosaic's pallas_call lowering refuses them too (only JAX's own emit_pipeline takes them)."""
  spec = pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (pl.ds(i * 8, 8), 0))
  out_spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  x = np.ones((16, 128), np.float32)
  if front == "pallas_call":
    call = lambda: pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                                  grid=(2,), in_specs=[spec], out_specs=out_spec)(x)
  else:
    call = _in_kernel(lambda x_hbm, o_hbm: pltpu.emit_pipeline(
        lambda a, b: None, grid=(1,), in_specs=[spec], out_specs=[out_spec])(x_hbm, o_hbm))
  raises(call, pl.UnsupportedError, r"block_shape\[0\] of .*`pl\.BoundedSlice` block dims .*"
         r"Unsupported block dimension type", "Fix: use a full pl.Blocked dimension")
