"""JAX's `emit_pipeline` as a primitive (`jax_use_emit_pipeline_primitive`): palace traces JAX's
pipeline library over the equation as Mosaic's lowering does, so a kernel computes what it computes
with the flag off (JAX traces the pipeline into the kernel) in the same modelled cycles; a body's
program_id / num_programs answer the pipeline's step and grid. Also `jax.empty_ref` inside a kernel
(a scratch ref for the rest of its region) and refs in JAX's own device memory space."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax._src import config
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj


def _matmul(x, y, bm=128, bk=128, bn=128):
  m, k = x.shape
  n = y.shape[1]

  def body(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
      o_ref[...] = acc_ref[...]

  def kernel(x_hbm, y_hbm, o_hbm):
    def run(acc_ref):
      pltpu.emit_pipeline(
          lambda a, b, o: body(a, b, o, acc_ref), grid=(m // bm, n // bn, k // bk),
          in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                    pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
          out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)))(x_hbm, y_hbm, o_hbm)
    pl.run_scoped(run, pltpu.VMEM((bm, bn), jnp.float32))

  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                        in_specs=[any_spec, any_spec], out_specs=any_spec)(x, y)


@pytest.mark.parametrize("primitive", [False, True])
def test_emit_pipeline_primitive_computes_and_times_as_the_traced_pipeline(primitive):
  rng = np.random.default_rng(0)
  x = rng.integers(-4, 4, (256, 384)).astype(jnp.bfloat16)   # exact in bf16 and f32 sums
  y = rng.integers(-4, 4, (384, 256)).astype(jnp.bfloat16)
  runs = {}
  for flag in (False, primitive):
    with config.use_emit_pipeline_primitive(flag), pj.virtual_tpu("v5e") as tpu:
      out = np.asarray(jax.jit(_matmul)(x, y))
    runs[flag] = (out, tpu.reports[-1].device_cycles)
  ref = x.astype(np.float32) @ y.astype(np.float32)
  np.testing.assert_array_equal(runs[primitive][0], ref)
  assert runs[primitive][1] == runs[False][1]


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
