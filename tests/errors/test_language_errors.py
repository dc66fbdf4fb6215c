"""One test per user-facing language / pallas_call error: the class and a message naming the operand,
the grid point and the fix."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

F32 = np.float32


def _call(kernel, out_shape=(8, 128), out_dtype=F32, **kw):
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(out_shape, out_dtype), **kw)


X = np.zeros((16, 256), F32)


# ---------------------------------------------------------------- tracing: runtime values in Python
@pytest.mark.parametrize("use", ["if", "bool", "int", "float", "range", "index", "numpy"])
def test_runtime_value_to_python_raises_tracing_error(use):
  def kernel(x_ref, o_ref):
    v = x_ref[0, 0]
    i = pl.program_id(0)
    if use == "if":
      if v > 0:
        pass
    elif use == "bool":
      bool(i == 0)
    elif use == "int":
      int(i)
    elif use == "float":
      float(v)
    elif use == "range":
      for _ in range(i):
        pass
    elif use == "index":
      [1, 2, 3][i]
    else:
      np.asarray(v)

  with pytest.raises(pl.TracingError, match=r"runtime value .* pl\.when\(cond\) / lax\.cond") as e:
    _call(kernel, grid=(2,))(X)
  assert isinstance(e.value, TypeError)


def test_python_and_of_runtime_values_raises():
  def kernel(x_ref, o_ref):
    if pl.program_id(0) == 0 and x_ref[0, 0] > 0:
      pass

  with pytest.raises(pl.TracingError, match="Converting to a Python bool"):
    _call(kernel, grid=(1,))(X)


# ---------------------------------------------------------------- 64-bit types inside kernels
def test_vmem_scratch_float64():
  with pytest.raises(pl.ShapeError, match=r"dtype for scratch\[1\]: float64.*no 64-bit types\. Fix: use float32"):
    _call(lambda o, a, b: None,
          scratch_shapes=[pltpu.VMEM((8, 128), F32), pltpu.VMEM((8, 128), np.float64)])()


def test_smem_scratch_int64_in_dict():
  with pytest.raises(pl.ShapeError, match=r"scratch\['idx'\]: int64.*Fix: use int32"):
    _call(lambda o, *, idx: None, scratch_shapes={"idx": pltpu.SMEM((4,), np.int64)})()


@pytest.mark.parametrize("make", [
    lambda v: v.astype(np.float64),
    lambda v: v.astype(jnp.float64),
    lambda v: jnp.zeros((8, 128), jnp.float64),
    lambda v: jnp.full_like(v, 1, dtype=np.int64),
    lambda v: jnp.arange(128, dtype=np.int64),
    lambda v: jnp.sum(v, dtype=np.float64),
    lambda v: jnp.dot(v, v.T, preferred_element_type=np.float64),
    lambda v: lax.broadcasted_iota(np.int64, (8, 128), 0),
], ids=["astype-np", "astype-jnp", "zeros", "full_like", "arange", "sum", "dot", "iota"])
def test_64bit_values_inside_kernels(make):
  def kernel(x_ref, o_ref):
    make(x_ref[...])

  with pytest.raises(pl.ShapeError, match=r"Unsupported dtype for .* at grid point \(0,\) on chip 0 core 0 "
                                          r"in kernel 'kernel': (float|int)64; .*no 64-bit types.*"
                                          r"test_language_errors\.py:\d+"):
    _call(kernel, grid=(1,))(X[:8, :128])


def test_64bit_memory_ref_output():
  with pytest.raises(pl.ShapeError, match=r"out_shape\[0\]: float64"):
    pl.pallas_call(lambda o: None, out_shape=pltpu.VMEM((8, 128), np.float64))()


def test_fp8_mixing_needs_explicit_cast():
  def kernel(x_ref, o_ref):
    a = x_ref[...].astype(jnp.float8_e4m3fn)
    o_ref[...] = (a + x_ref[...].astype(jnp.bfloat16)).astype(F32)

  with pytest.raises(pl.ShapeError, match=r"Type promotion error for operands of dtypes float8_e4m3fn and "
                                          r"bfloat16.*Fix: cast one operand explicitly"):
    _call(kernel)(X[:8, :128])


# ---------------------------------------------------------------- stores
def test_store_dtype_mismatch_names_operand_and_fix():
  def kernel(x_ref, o_ref):
    v = x_ref[...]

    @pl.when(pl.program_id(0) == 1)
    def _():
      o_ref[...] = v.astype(jnp.bfloat16)

  pat = (r"Cannot store a value of dtype bfloat16 into outputs\[0\] block of dtype float32 at grid point "
         r"\(1,\) on chip 0 core 0 in kernel 'kernel': .*use \.astype\(float32\)\. "
         r"\(test_language_errors\.py:\d+\)")
  with pytest.raises(pl.ShapeError, match=pat):
    _call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (0, i))],
          out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))(X[:8])


def test_store_numpy_scalar_of_other_dtype():
  def kernel(o_ref):
    o_ref[...] = np.int32(3)

  with pytest.raises(pl.ShapeError, match=r"Cannot store a int32 scalar into outputs\[0\] block of dtype "
                                          r"float32"):
    _call(kernel)()


def test_store_shape_mismatch():
  def kernel(x_ref, o_ref):
    o_ref[0:4] = x_ref[:, :64]

  with pytest.raises(pl.ShapeError, match=r"Cannot store a value of shape \(8, 64\) into outputs\[0\] block"
                                          r"\[0:4, 0:128\] of shape \(4, 128\).*must match or broadcast"):
    _call(kernel)(X[:8, :128])


def test_store_of_closed_over_numpy_array():
  const = np.ones((8, 128), F32)

  def kernel(o_ref):
    o_ref[...] = const

  with pytest.raises(pl.UsageError, match=r"kernels cannot close over array constants\. Fix: pass the array as an "
                                          r"input"):
    _call(kernel)()


# ---------------------------------------------------------------- ref indexing
def test_ref_index_out_of_bounds():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(12, 8)]

  pat = r"Slice \[12:20\] out of bounds for axis 0 of args\[0\] block \(shape \(16, 128\), vmem\) at grid "
  with pytest.raises(pl.OutOfBoundsError, match=pat + r"point \(0,\)"):
    _call(kernel, grid=(1,), in_specs=[pl.BlockSpec((16, 128), lambda i: (0, 0))])(X)


def test_dynamic_index_out_of_bounds_names_grid_point():
  idx = np.array([0, 3, 9], np.int32)

  def kernel(i_ref, x_ref, o_ref):
    o_ref[0] = x_ref[i_ref[pl.program_id(0)]]

  with pytest.raises(pl.OutOfBoundsError, match=r"Index 9 out of bounds for axis 0 of args\[1\] block .* "
                                                r"at grid point \(2,\)"):
    _call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        1, grid=(3,), in_specs=[pl.BlockSpec((8, 128), lambda i, r: (0, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, r: (0, 0))))(idx, X)


def test_python_slice_with_runtime_bounds():
  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = x_ref[i:i + 8]

  with pytest.raises(pl.UsageError, match=r"runtime bounds needs pl\.ds\(start, size\)"):
    _call(kernel, grid=(1,))(X[:, :128])


def test_ds_size_must_be_static():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(0, pl.program_id(0) + 8)]

  with pytest.raises(pl.UsageError, match=r"pl\.ds size must be a static Python int"):
    _call(kernel, grid=(1,))(X[:, :128])


def test_value_indexing_with_runtime_index():
  def kernel(x_ref, o_ref):
    o_ref[0] = x_ref[...][pl.program_id(0)]

  with pytest.raises(pl.UsageError, match=r"runtime index is not supported.*pl\.ds"):
    _call(kernel, grid=(1,))(X[:8, :128])


# ---------------------------------------------------------------- memory spaces
def test_vector_load_of_any_ref_says_dma():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  with pytest.raises(pl.MemorySpaceError, match=r"Load of args\[0\] \(any\) from the vector unit at grid "
                                                r"point \(0,\).*pltpu\.sync_copy / pltpu\.async_copy"):
    _call(kernel, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)])(X[:8, :128])


def test_vector_store_to_hbm_output_says_dma():
  def kernel(x_ref, o_ref):
    o_ref[0:8] = x_ref[...]

  with pytest.raises(pl.MemorySpaceError, match=r"Store of outputs\[0\] \(any\).*Fix: copy a block into VMEM"):
    _call(kernel, out_specs=pl.BlockSpec(memory_space=pltpu.HBM))(X[:8, :128])


def test_vector_access_to_smem():
  def kernel(s_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref) + s_ref[0:4].sum()

  with pytest.raises(pl.MemorySpaceError, match=r"Vector load of args\[0\]\[0:4\] \(shape \(4,\)\) in SMEM.*"
                                                r"SMEM holds scalars only"):
    _call(kernel, in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)])(np.arange(8, dtype=np.int32))


def test_vector_store_to_smem_scratch():
  def kernel(o_ref, s_ref):
    s_ref[...] = jnp.zeros((8,), jnp.int32)

  with pytest.raises(pl.MemorySpaceError, match=r"Vector store of scratch\[0\] \(shape \(8,\)\) in SMEM"):
    _call(kernel, scratch_shapes=[pltpu.SMEM((8,), jnp.int32)])()


def test_semaphore_load():
  def kernel(o_ref, sem):
    sem[...]

  with pytest.raises(pl.MemorySpaceError, match=r"semaphore scratch\[0\] at grid point .*: semaphores are not data\. Fix: use pl\.semaphore_read"):
    _call(kernel, scratch_shapes=[pltpu.SemaphoreType.DMA])()


# ---------------------------------------------------------------- block specs
@pytest.mark.parametrize("block,shape,pat", [
    ((8, 100), (16, 256), r"args\[0\] \(= \(8, 100\)\) breaks the TPU tiling rule .* dim 1 is 100, not a "
                          r"multiple of 128 nor the array dim 256"),
    ((4, 128), (16, 256), r"dim 0 is 4, not a multiple of 8 nor the array dim 16"),
    ((2, 8, 100), (2, 16, 256), r"dim 2 is 100"),
    ((8,), (16, 256), r"args\[0\] \(= \(8,\)\) must have the same number of dimensions as the array shape "
                      r"\(16, 256\)"),
    ((100,), (1000,), r"args\[0\] \(= \(100,\)\) is not a valid rank-1 TPU block .* expected the full "
                      r"length 1000, a multiple of 1024, or a power of 2 >= 128"),
    ((0, 128), (16, 256), r"non-positive size"),
])
def test_block_shape_rules(block, shape, pat):
  x = np.zeros(shape, F32)
  with pytest.raises(pl.BlockSpecError, match=pat) as e:
    _call(lambda x_ref, o_ref: None, in_specs=[pl.BlockSpec(block, lambda: (0,) * len(block))])(x)
  assert isinstance(e.value, ValueError)


def test_rank1_block_bound_depends_on_bitwidth():
  ok = np.zeros((4096,), np.int8)
  _call(lambda x_ref, o_ref: None, in_specs=[pl.BlockSpec((512,), lambda: (0,))])(ok)   # 512 = 128 * 32/8
  with pytest.raises(pl.BlockSpecError, match=r"power of 2 >= 512"):
    _call(lambda x_ref, o_ref: None, in_specs=[pl.BlockSpec((256,), lambda: (0,))])(ok)


def test_output_block_shape_rule_names_output():
  with pytest.raises(pl.BlockSpecError, match=r"Block shape for outputs\[1\]"):
    pl.pallas_call(lambda o1, o2: None,
                   out_shape=[pl.ShapeDtypeStruct((8, 128), F32), pl.ShapeDtypeStruct((16, 256), F32)],
                   out_specs=[pl.BlockSpec((8, 128), lambda: (0, 0)),
                              pl.BlockSpec((8, 64), lambda: (0, 0))])()


def test_any_space_block_must_be_whole_array():
  with pytest.raises(pl.BlockSpecError, match=r"args\[0\] .* must equal the array shape \(16, 256\) for a "
                                              r"pl\.ANY / pltpu\.HBM operand"):
    _call(lambda x, o: None, in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0), memory_space=pl.ANY)])(X)


def test_index_map_out_of_bounds_names_grid_point():
  pat = r"Block index out of bounds for args\[0\] \(shape \(16, 256\)\) at grid point \(2,\).*\(2, 0\)"
  with pytest.raises(pl.OutOfBoundsError, match=pat):
    _call(lambda x, o: None, grid=(3,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(X)


def test_index_map_wrong_rank():
  with pytest.raises(pl.OutOfBoundsError, match=r"index_map of args\[0\] returned 1 indices"):
    _call(lambda x, o: None, grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i,))])(X)


def test_spec_count_mismatch():
  with pytest.raises(pl.UsageError, match=r"in_specs has 1 BlockSpecs but there are 2 operands"):
    _call(lambda x, y, o: None, in_specs=[pl.BlockSpec((8, 128), lambda: (0, 0))])(X, X)


def test_grid_spec_and_grid_together():
  with pytest.raises(pl.UsageError, match=r"pass either grid_spec or grid"):
    pl.pallas_call(lambda o: None, out_shape=pl.ShapeDtypeStruct((8, 128), F32), grid=(2,),
                   grid_spec=pl.GridSpec(grid=(2,)))


# ---------------------------------------------------------------- resources
def _two_step_copy(x, block):
  return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct(x.shape, F32), grid=(2,),
                        in_specs=[pl.BlockSpec(block, lambda i: (i, 0))],
                        out_specs=pl.BlockSpec(block, lambda i: (i, 0)), name="kernel")(x)


def test_vmem_over_scoped_limit_shows_arithmetic_and_fix():
  x = np.zeros((4096, 1024), F32)   # two 8 MiB blocks, double-buffered
  pat = (r"VMEM over capacity for kernel 'kernel' on each TensorCore \(v5e\): 32\.00 MiB of pipelined "
         r"blocks requested "
         r"\(args\[0\] 2 x 8\.00 MiB block float32\[2048, 1024\] \+ outputs\[0\] 2 x 8\.00 MiB block .*\) "
         r"but the scoped VMEM limit is 16\.00 MiB .*raise CompilerParams\(vmem_limit_bytes=\.\.\.\) "
         r"to at least 33554432 \(32\.00 MiB; v5e has 128\.00 MiB of VMEM\)")
  with pytest.raises(pl.ResourceError, match=pat) as e:
    with pl.virtual_tpu("v5e"):
      _two_step_copy(x, (2048, 1024))
  assert isinstance(e.value, MemoryError)


def test_vmem_limit_bytes_raises_the_limit():
  x = np.zeros((2048, 1024), F32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  params = pltpu.CompilerParams(vmem_limit_bytes=64 * 2**20)
  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, F32), compiler_params=params)(x)
  assert (out == 1).all()


def test_vmem_scratch_counts_against_the_whole_vmem_not_the_scoped_limit():
  # a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05.jsonl): 20 MiB of scratch compiles under the
  # 16 MiB default scoped limit; 130 MiB does not ("Allocation (size=136314880) would exceed memory
  # (size=134217728) ... tag = 'scratch operand'")
  _call(lambda o, s: None, scratch_shapes=[pltpu.VMEM((5 * 1024, 1024), F32)])()
  with pytest.raises(pl.ResourceError, match=r"130\.00 MiB requested \(outputs\[0\] 1 x 4\.00 KiB block "
                                             r"float32\[8, 128\] \+ scratch\[0\] 130\.00 MiB\) but v5e has 127\.93 MiB of VMEM .*scratch operands "
                                             r"count against the whole VMEM.*Fix: reduce"):
    _call(lambda o, s: None, scratch_shapes=[pltpu.VMEM((130 * 256, 1024), F32)])()


def test_smem_over_capacity():
  # the compiler keeps up to ~1950 B of the 1 MiB (a TPU v5e: 'Exceeded smem capacity by 1.4K' for
  # 1 MiB - 512 B of SMEM scratch, benchmarks/hw/data/v5e-limits-2026-12-05-followup.jsonl): 2048 B
  with pytest.raises(pl.ResourceError, match=r"SMEM over capacity for scratch\[1\] .*: 4\.00 KiB in use \+ "
                                             r"1\.00 MiB requested > 1022\.00 KiB usable on v5e \(1\.00 MiB "
                                             r"SMEM less 2048 B the compiler reserves.*\).*move arrays to VMEM"):
    _call(lambda o, a, b: None, scratch_shapes=[pltpu.SMEM((1024,), jnp.int32),
                                                pltpu.SMEM((256 * 1024,), jnp.int32)])()


# ---------------------------------------------------------------- pipeline semantics
def test_non_consecutive_output_revisit():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  with pytest.raises(pl.SyncError, match=r"Revisited block for outputs\[0\] at grid point \(2,\) on chip 0 "
                                         r"core 0: .*Fix: put the reduction axis last in the grid") as e:
    _call(kernel, out_shape=(16, 128), grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i % 2, 0))],
          out_specs=pl.BlockSpec((8, 128), lambda i: (i % 2, 0)))(X[:, :128])
  assert isinstance(e.value, RuntimeError)


def test_alias_shape_mismatch():
  with pytest.raises(pl.ShapeError, match=r"input_output_aliases \{0: 0\}: input float32\[16, 256\] and "
                                          r"output float32\[8, 128\] must have the same shape and dtype"):
    _call(lambda x, o: None, input_output_aliases={0: 0})(X)


def test_alias_missing_operand():
  with pytest.raises(pl.UsageError, match=r"input_output_aliases \{3: 0\} refers to a missing operand"):
    _call(lambda x, o: None, input_output_aliases={3: 0})(X)


def test_program_id_axis_out_of_range():
  with pytest.raises(pl.UsageError, match=r"pl\.program_id\(2\): the grid has 2 axes \(1, 1\)"):
    _call(lambda o: pl.program_id(2), grid=(1, 1))()


def test_language_ops_outside_kernel():
  with pytest.raises(pl.UsageError, match=r"pl\.program_id\(\) was called outside a kernel body"):
    pl.program_id(0)


def test_unknown_chip():
  with pytest.raises(pl.UsageError, match=r"Unknown TPU chip 'v9'"):
    pl.virtual_tpu("v9")


def test_wrong_compiler_params_type():
  with pytest.raises(pl.UsageError, match=r"compiler_params must be a pltpu\.CompilerParams"):
    pl.pallas_call(lambda o: None, out_shape=pl.ShapeDtypeStruct((8, 128), F32), compiler_params=object())


def test_tracing_error_names_grid_point_and_kernel_line():
  steps = []

  def kernel(x_ref, o_ref):
    steps.append(None)
    if len(steps) == 2 and x_ref[0, 0] > 0:   # the second grid step converts a runtime value
      pass

  pat = (r"Converting to a Python bool of a runtime value palace\.Array\(shape=\(\), dtype=bool\) at grid "
         r"point \(1,\) on chip 0 core 0 in kernel 'kernel'.*\(test_language_errors\.py:\d+\)")
  with pytest.raises(pl.TracingError, match=pat):
    _call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(X[:, :128] + 1)


def test_closing_over_numpy_array_in_an_op():
  const = np.ones((8, 128), F32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + const

  with pytest.raises(pl.UsageError, match=r"NumPy array of shape \(8, 128\): kernels cannot close over array "
                                          r"constants.*pass the array as an input"):
    _call(kernel)(X[:8, :128])


def test_weak_int_out_of_range_for_array_dtype_wraps_as_in_jax():
  # JAX 0.12: int16 + 70000 wraps the weak 70000 into int16 (4464); (int16: 8-bit vector adds do
  # not compile on a TPU, benchmarks/hw/data/v5e-limits-2026-12-05.jsonl)
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 70000

  out = _call(kernel, (16, 128), np.int16)(np.full((16, 128), 2, np.int16))
  assert (out == 4466).all()

  def kernel2(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 2 ** 70

  with pytest.raises(pl.ShapeError, match=r"Python int 1180591620717411303424 does not fit 64 bits: a weak "
                                          r"Python scalar takes the dtype of the array"):
    _call(kernel2, (16, 128), np.int16)(np.zeros((16, 128), np.int16))


@pytest.mark.parametrize("value,pat", [(1.5, r"Python float 1\.5 into outputs\[0\] block of dtype int32"),
                                       (2 ** 40, r"Python int 1099511627776 into outputs\[0\] block of "
                                                 r"dtype int32.*out of range")])
def test_scalar_store_that_does_not_fit_the_ref(value, pat):
  def kernel(o_ref):
    o_ref[...] = value

  with pytest.raises(pl.ShapeError, match=pat):
    _call(kernel, out_dtype=np.int32)()


def test_kernel_must_return_none():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
    return o_ref[...]

  with pytest.raises(pl.UsageError, match=r"Kernel 'kernel' returned a value of type Array; a Pallas kernel "
                                          r"must return None"):
    _call(kernel)(X[:8, :128])


def test_kernel_arity_mismatch_lists_the_refs():
  def kernel(x_ref, o_ref):
    pass

  pat = (r"Kernel 'kernel' cannot take the refs pallas_call passes: 1 scalar-prefetch \+ 1 input \+ 1 output "
         r"\+ 1 scratch positional refs")
  with pytest.raises(pl.UsageError, match=pat):
    _call(kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
        1, grid=(1,), scratch_shapes=[pltpu.VMEM((8, 128), F32)]))(np.zeros(2, np.int32), X)


def test_index_map_arity_mismatch():
  pat = (r"index_map of args\[0\] cannot be called with the grid indices: the grid \(2, 3\) has 2 axes, "
         r"so it gets 2 arguments")
  with pytest.raises(pl.UsageError, match=pat):
    _call(lambda x, o: None, grid=(2, 3), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))])(X)


def test_rank0_vmem_block():
  pat = (r"Block shape for args\[0\] \(= \(\)\) is rank 0; expected rank "
         r">= 1.*pltpu\.SMEM")
  with pytest.raises(pl.BlockSpecError, match=pat):
    _call(lambda x, o: None)(np.float32(3))


def test_incompatible_operand_shapes():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + x_ref[0:4, 0:64]

  pat = (r"Incompatible shapes for jnp\.add at grid point \(\) .*: \(8, 128\), "
         r"\(4, 64\); expected shapes that broadcast")
  with pytest.raises(pl.ShapeError, match=pat):
    _call(kernel)(X[:8, :128])


def test_value_index_out_of_bounds():
  def kernel(x_ref, o_ref):
    o_ref[0] = x_ref[...][8]

  pat = (r"Index \(8,\) out of bounds for a value of shape \(8, 128\)")
  with pytest.raises(pl.OutOfBoundsError, match=pat):
    _call(kernel)(X[:8, :128])


def test_float_value_as_ref_index():
  def kernel(x_ref, o_ref):
    o_ref[0] = x_ref[x_ref[0, 0]]

  with pytest.raises(pl.ShapeError, match=r"Invalid index: got palace\.Array\(shape=\(\), dtype=float32\); "
                                          r"expected an integer scalar"):
    _call(kernel)(X[:8, :128])


def test_vmem_over_physical_capacity_says_limit_cannot_help():
  x = np.zeros((4096, 1024), F32)
  pat = (r"\(v4\): 32\.00 MiB of pipelined blocks requested .*raising vmem_limit_bytes cannot "
         r"help: v4 has only 16\.00 MiB of VMEM")
  with pytest.raises(pl.ResourceError, match=pat):
    with pl.virtual_tpu("v4"):
      _two_step_copy(x, (2048, 1024))


def test_scratch_entry_must_be_an_allocation_type():
  pat = (r"scratch\[1\] = ShapeDtypeStruct\(shape=\(8, 128\), dtype=float32\) is "
         r"not an allocation type\. Fix: use pltpu\.VMEM\(shape, dtype\)")
  with pytest.raises(pl.UsageError, match=pat):
    _call(lambda o, a, b: None,
          scratch_shapes=[pltpu.VMEM((8, 128), F32), pl.ShapeDtypeStruct((8, 128), F32)])()


def test_buffered_needs_a_buffer():
  with pytest.raises(pl.UsageError, match=r"pl\.Buffered\(buffer_count\) must be >= 1; got 0"):
    pl.Buffered(0)


def test_unsupported_operand_dtype():
  pat = (r"Unsupported dtype for args\[0\]: complex128; expected a real type")
  with pytest.raises(pl.ShapeError, match=pat):
    _call(lambda x, o: None)(np.zeros((8, 128), np.complex128))


def test_integer_to_negative_power():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] ** -1

  pat = r"Invalid operands for jnp\.power at grid point \(\) .*negative integer powers"
  with pytest.raises(pl.ShapeError, match=pat):
    _call(kernel, out_dtype=np.int32)(np.ones((8, 128), np.int32))


@pytest.mark.parametrize("use", ["when", "cond", "while"])
def test_vector_conditions(use):
  def kernel(x_ref, o_ref):
    c = x_ref[...] > 0
    if use == "when":
      pl.when(c)(lambda: None)
    elif use == "cond":
      lax.cond(c, lambda: None, lambda: None)
    else:
      lax.while_loop(lambda s: c, lambda s: s, 0)

  pat = r"A condition must be a scalar; got shape \(8, 128\) at grid point.*jnp\.any"
  with pytest.raises(pl.UsageError, match=pat):
    _call(kernel)(X[:8, :128])


def test_program_id_without_a_grid_says_the_call_has_none():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[:8, :128] + pl.program_id(0)

  with pytest.raises(pl.UsageError, match=r"pl.program_id\(0\) in a pallas_call without a grid "
                                          r"\(grid=\(\)\) .*kernel 'kernel'.*Fix: give the call a grid"):
    _call(kernel)(X)
