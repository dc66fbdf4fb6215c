"""JAX's `emit_pipeline` as a primitive (`jax_use_emit_pipeline_primitive`): palace traces JAX's
pipeline library over the equation as Mosaic's lowering does, so a kernel computes what it computes
with the flag off (JAX traces the pipeline into the kernel) in the same modelled cycles; a body's
program_id / num_programs answer the pipeline's step and grid. Also `jax.empty_ref` inside a kernel
(a scratch ref for the rest of its region) and refs in JAX's own device memory space."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax._src import config
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import jax_parity_harness as harness
import palace as ppl
import palace.jax as pj


EMIT_PIPELINE = [c for c in harness.case_names("k_kernel_pipeline.py") if "emit_pipeline" in c]


def _run(case, primitive: bool):
  mod = harness.jax_module("k_kernel_pipeline.py")
  with config.use_emit_pipeline_primitive(primitive), pj.virtual_tpu("v5e") as tpu:
    fn, args, _ = getattr(mod, case)()
    out = jax.block_until_ready(jax.jit(fn)(*args))
  return ([np.asarray(x) for x in jax.tree_util.tree_leaves(out)],
          [(r.device_cycles, dict(r.unit_busy_cycles), r.dma_count_by_direction) for r in tpu.reports])


@pytest.mark.parametrize("case", EMIT_PIPELINE)
def test_emit_pipeline_primitive_computes_and_times_as_the_traced_pipeline(case):
  """The parity suite's emit_pipeline kernels with the flag on give the flag-off path's outputs and
  reports (cycles, unit busy times, DMA counts)."""
  out, reports = _run(case, True)
  ref, ref_reports = _run(case, False)
  assert reports == ref_reports
  for x, y in zip(out, ref):
    np.testing.assert_array_equal(x, y)


def test_pipeline_body_grid_queries_and_device_memory_refs():
  """program_id / num_programs in a primitive pipeline's body are its step and its whole grid (as
  Mosaic lowers them), the core axis is bound; the output is a JAX ref (device memory space)."""
  grid = 8

  def pipeline_body(o_smem):
    o_smem[0], o_smem[1] = pl.program_id(0), pl.num_programs(0)
    o_smem[2], o_smem[3] = jax.lax.axis_size("core"), jax.lax.axis_index("core")

  with config.use_emit_pipeline_primitive(True), config.enable_checks(True), \
       pj.virtual_tpu("v5p") as tpu:
    mesh = pltpu.TensorCoreMesh(axis_name="core")

    @jax.jit
    def f():
      o_ref = jax.empty_ref(jax.ShapeDtypeStruct((grid, 128), jnp.int32))

      @pl.kernel(out_type=(), mesh=mesh)
      def _(o):
        pltpu.emit_pipeline(
            pipeline_body, grid=(grid,), core_axis_name="core",
            dimension_semantics=(pltpu.PARALLEL,),
            out_specs=pl.BlockSpec((None, 128), lambda i: (i, 0), memory_space=pltpu.SMEM))(o)
      _(o_ref)
      return jax.freeze(o_ref)
    out = np.asarray(f())[:, :4]
  cores = 2
  expected = [[i, grid, cores, i // (grid // cores)] for i in range(grid)]
  np.testing.assert_array_equal(out, expected)
  assert len(tpu.reports) == 1


def test_empty_ref_in_a_kernel_is_scratch_for_the_rest_of_its_region():
  x = np.arange(16 * 1024, dtype=np.float32).reshape(16, 1024)

  @pl.kernel(out_type=jax.ShapeDtypeStruct((16, 1024), jnp.float32),
             mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1))
  def k(x_hbm, o_hbm):
    def outer(xb, ob):   # each step: a scratch made in the body, two inner pipelines through it
      tmp = jax.empty_ref(jax.ShapeDtypeStruct((16, 512), jnp.float32), pltpu.VMEM)

      def twice(a, o):
        o[...] = a[...] * 2

      def plus_one(a, o):
        o[...] = a[...] + 1
      spec = [pl.BlockSpec((16, 128), lambda i: (0, i))]
      pltpu.emit_pipeline(twice, grid=(4,), in_specs=spec, out_specs=spec)(xb, tmp)
      pltpu.emit_pipeline(plus_one, grid=(4,), in_specs=spec, out_specs=spec)(tmp, ob)
    spec = [pl.BlockSpec((16, 512), lambda i: (0, i))]
    pltpu.emit_pipeline(outer, grid=(2,), in_specs=spec, out_specs=spec)(x_hbm, o_hbm)

  for flag in (False, True):
    with config.use_emit_pipeline_primitive(flag), pj.virtual_tpu("v5e") as tpu:
      np.testing.assert_array_equal(np.asarray(jax.jit(k)(x)), x * 2 + 1)
    # the scratch is freed at the end of each outer step: peak VMEM holds one, not one per step
    assert tpu.reports[-1].vmem_peak_bytes < 2 * 16 * 512 * 4 + 4 * 16 * 512 * 4


@pytest.mark.filterwarnings("ignore:jax.experimental.pallas.core_map is deprecated")  # (JAX's own form)
@pytest.mark.parametrize("primitive", [False, True])
def test_core_map_body_closing_over_a_scalar_array_reads_its_value(primitive):
  """A core_map body closing over a jax array takes it as a value (not a ref): here a pipeline's
  dynamic grid bound. Before, palace handed the body an HBM ref and the bound was refused."""
  @jax.jit
  def f(steps):
    o_ref = jax.empty_ref(jax.ShapeDtypeStruct((8, 128), jnp.int32))

    @pl.core_map(pltpu.TensorCoreMesh(axis_name="core", num_cores=1))
    def _():
      def run(acc):
        acc[...] = jnp.zeros_like(acc)

        def body():
          acc[...] += steps
        pltpu.emit_pipeline(body, grid=(steps,))()
        pltpu.sync_copy(acc, o_ref)
      pl.run_scoped(run, pltpu.VMEM((8, 128), jnp.int32))
    return jax.freeze(o_ref)

  with config.use_emit_pipeline_primitive(primitive), pj.virtual_tpu("v5e"):
    out = np.asarray(f(jnp.int32(5)))
  np.testing.assert_array_equal(out, np.full((8, 128), 25, np.int32))


def test_custom_fusion_in_a_kernel_runs_its_pallas_implementation():
  """`fuser.custom_fusion` called in a kernel (JAX's fusible matmuls fuse one into their epilogue):
  its Pallas implementation when it has one, else its own jaxpr, on its arguments."""
  from jax.experimental.pallas import fuser   # noqa: PLC0415

  @fuser.custom_fusion
  def ramp(start):
    return jnp.broadcast_to(jnp.arange(128, dtype=jnp.float32) + start, (8, 128))

  @fuser.custom_fusion
  def ramp_with_impl(start):
    return jnp.zeros((8, 128), jnp.float32)
  ramp_with_impl.def_pallas_impl(
      lambda start: jnp.broadcast_to(jnp.arange(128, dtype=jnp.float32) * 2 + start, (8, 128)))
  for f in (ramp, ramp_with_impl):   # (rules the fuser needs before a call; unused in a kernel)
    f.def_eval_rule(lambda ctx, *args: None)
    f.def_pull_block_spec(lambda bss: (None,))

  def kernel(x_ref, o_ref, p_ref):
    o_ref[...] = x_ref[...] + ramp(x_ref[0, 0])
    p_ref[...] = ramp_with_impl(1.0)

  x = np.full((8, 128), 3.0, np.float32)
  shape = jax.ShapeDtypeStruct((8, 128), jnp.float32)
  with pj.virtual_tpu("v5e"):
    o, p = pl.pallas_call(kernel, out_shape=(shape, shape))(x)
  np.testing.assert_array_equal(np.asarray(o), x + 3.0 + np.arange(128, dtype=np.float32))
  np.testing.assert_array_equal(np.asarray(p), np.broadcast_to(np.arange(128) * 2.0 + 1, (8, 128)))


def test_checkify_check_in_a_kernel_is_lowered_as_mosaic_lowers_it():
  """A debug check is nothing while pl.enable_debug_checks is off (JAX's fuser emits one for a
  dynamic slice's start); a non-debug check is refused, as Mosaic refuses it."""
  from jax.experimental import checkify   # noqa: PLC0415

  def kernel(debug, x_ref, o_ref):
    checkify.check(x_ref[0, 0] > 100.0, "start {s} too small", s=x_ref[0, 0], debug=debug)
    o_ref[...] = x_ref[...] + 1.0

  x = np.ones((8, 128), np.float32)
  shape = jax.ShapeDtypeStruct((8, 128), jnp.float32)
  with pj.virtual_tpu("v5e"):
    out = pl.pallas_call(functools.partial(kernel, True), out_shape=shape)(x)
  np.testing.assert_array_equal(np.asarray(out), x + 1.0)
  with pytest.raises(ppl.UnsupportedError, match=r"primitive .check. with debug=False .*Non-debug checks"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(pl.pallas_call(functools.partial(kernel, False), out_shape=shape)(x))


def test_pipeline_body_program_id_in_a_vmapped_pallas_call():
  """jax.vmap adds a grid axis to the pallas_call; a primitive pipeline's body still reads its own
  step (palace maps the kernel's axes past vmap's, not the pipeline's)."""
  def kernel(x_vmem, o_vmem):
    def body(x_ref, o_ref):
      o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32) * 10 + pl.program_id(1)
    spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    pltpu.emit_pipeline(body, grid=(2, 2), in_specs=[spec], out_specs=[spec])(x_vmem, o_vmem)

  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 256), jnp.float32))  # (VMEM blocks)
  x = np.zeros((3, 16, 256), np.float32)
  step = np.kron(np.array([[0, 1], [10, 11]], np.float32), np.ones((8, 128), np.float32))
  for flag in (False, True):
    with config.use_emit_pipeline_primitive(flag), pj.virtual_tpu("v5e"):
      out = np.asarray(jax.jit(jax.vmap(f))(x))
    np.testing.assert_array_equal(out, np.broadcast_to(step, x.shape))


@pytest.mark.parametrize("case", EMIT_PIPELINE)
def test_emit_pipeline_primitive_kernels_are_replayable_as_the_traced_ones(case):
  """The schedule analysis reads the traced pipeline and the bodies: a primitive pipeline kernel is
  replayed when the flag-off one is, and a repeated launch is replayed with the same report."""
  mod = harness.jax_module("k_kernel_pipeline.py")
  with config.use_emit_pipeline_primitive(True), pj.virtual_tpu("v5e") as tpu:
    fn, args, _ = getattr(mod, case)()
    f = jax.jit(fn)
    first = [np.asarray(x) for x in jax.tree_util.tree_leaves(f(*args))]
    again = [np.asarray(x) for x in jax.tree_util.tree_leaves(f(*args))]
  assert tpu.replays.hits == 1
  assert tpu.reports[0].device_cycles == tpu.reports[1].device_cycles
  for x, y in zip(first, again):
    np.testing.assert_array_equal(x, y)
