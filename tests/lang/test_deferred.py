"""Deferred matmul sums (lang/deferred.py): same values and same modelled time as computing every product
when issued; one GEMM per accumulated output block; correct under copy on write and aliasing."""
import types

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.lang import deferred
from palace._src.sim import memory
from matmul_kernel import matmul_kernel as _matmul_kernel


def _tiled(x, y, b):
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      _matmul_kernel, out_shape=pl.ShapeDtypeStruct((m, n), x.dtype), grid=(m // b, n // b, k // b),
      in_specs=[pl.BlockSpec((b, b), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((b, b), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((b, b), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
  )(x, y)


def _bf16_exact(x):
  """float32 values exact in bf16: the MXU's default-precision rounding of float32 operands
  (docs/numerics.md) leaves them alone, so the references below are plain float32 products."""
  return np.asarray(x, np.float32).astype(jnp.bfloat16).astype(np.float32)


@pytest.fixture
def gemms(monkeypatch):
  """Records the BLAS calls made by deferred sums (not those of products computed when issued)."""
  calls = []
  real, real_batch = deferred.blas.matmul, deferred.blas.matmuls

  def counting(a, b, out=None):
    calls.append((a.shape, b.shape))
    return real(a, b, out=out)

  def counting_batch(products):   # (a batch of output blocks, sim/memory.PendingBlocks)
    calls.extend((a.shape, b.shape) for a, b, _ in products)
    return real_batch(products)

  monkeypatch.setattr(deferred, "blas", types.SimpleNamespace(matmul=counting, matmuls=counting_batch,
                                                              Lazy=deferred.blas.Lazy))
  return calls


@pytest.fixture
def defer_everything(monkeypatch):
  """Thresholds at zero, so small test kernels take the deferred paths."""
  monkeypatch.setattr(deferred, "MIN_FLOPS", 0)
  monkeypatch.setattr(deferred, "ZEROS_MIN_BYTES", 0)
  monkeypatch.setattr(memory, "LAZY_FILL_BYTES", 0)


def _small_ints(rng, shape):
  """Integer-valued float32 data in [-8, 8]: bf16-exact, and products sum exactly in float32."""
  return rng.integers(-8, 9, size=shape).astype(np.float32)


def _run_tiled(x, y, b, **tpu_kw):
  with pl.virtual_tpu("v5e", **tpu_kw) as tpu:
    z = _tiled(x, y, b)
  return z, tpu.reports[-1]


def test_k_sum_is_one_gemm_per_output_block_with_the_same_timeline(gemms, monkeypatch, rng):
  x = _bf16_exact(rng.standard_normal((512, 768), dtype=np.float32))
  y = _bf16_exact(rng.standard_normal((768, 512), dtype=np.float32))
  z, rep = _run_tiled(x, y, 256)
  assert gemms == [((256, 768), (768, 256))] * 4     # 2x2 output blocks, K = 3 blocks merged
  np.testing.assert_allclose(z, x @ y, rtol=1e-5, atol=1e-4)
  monkeypatch.setattr(deferred, "MIN_FLOPS", float("inf"))   # every product computed when issued
  z_eager, rep_eager = _run_tiled(x, y, 256)
  assert len(gemms) == 4
  np.testing.assert_allclose(z, z_eager, rtol=1e-5, atol=1e-4)
  assert rep.device_cycles == rep_eager.device_cycles
  assert rep.unit_busy_cycles == rep_eager.unit_busy_cycles


def test_bf16_operands_widen_each_span_once_and_round_once(gemms, monkeypatch, rng):
  widened = _conversions(monkeypatch)
  # small integers: every partial sum is exact in float32 whatever the host BLAS's summation order
  x = _small_ints(rng, (512, 512)).astype(jnp.bfloat16)
  y = _small_ints(rng, (512, 512)).astype(jnp.bfloat16) / 64   # exact in bf16, sums are not
  z, _ = _run_tiled(x, y, 256)
  assert z.dtype == jnp.bfloat16
  exact = x.astype(np.float64) @ y.astype(np.float64)
  np.testing.assert_array_equal(z, exact.astype(np.float32).astype(jnp.bfloat16))   # f32 sum, one rounding
  assert len(gemms) == 4
  assert sorted(widened) == [(256, 512)] * 2 + [(512, 256)] * 2   # 2 row spans + 2 column spans


def _conversions(monkeypatch):
  """Records the shape of every operand span HostCache converts (a cache miss)."""
  converted = []
  real = deferred.HostCache.converted

  def converting(cache, span, root, arrays, precision, *lazy):
    before = len(cache._spans)
    out = real(cache, span, root, arrays, precision, *lazy)
    if len(cache._spans) > before:
      converted.append(span.shape)
    return out

  monkeypatch.setattr(deferred.HostCache, "converted", converting)
  return converted


def test_f32_operands_are_rounded_to_bf16_once_per_span_not_copied_per_product(gemms, monkeypatch,
                                                                                rng):
  # at the default precision the MXU multiplies float32 operands rounded to bf16 (lang/mxu.py): the
  # deferred sum rounds each row / column span of the HBM operands once, instead of a bf16 copy of
  # every block per product; the values are the eager path's
  rounded = _conversions(monkeypatch)
  x = rng.standard_normal((512, 768), dtype=np.float32)
  y = rng.standard_normal((768, 512), dtype=np.float32)
  z, rep = _run_tiled(x, y, 256)
  assert gemms == [((256, 768), (768, 256))] * 4
  assert sorted(rounded) == [(256, 768)] * 2 + [(768, 256)] * 2   # 2 row spans + 2 column spans
  bf = lambda v: v.astype(jnp.bfloat16).astype(np.float64)   # noqa: E731
  exact = bf(x) @ bf(y)
  np.testing.assert_allclose(z, exact, rtol=1e-5, atol=1e-4)
  assert np.abs(z - x.astype(np.float64) @ y).max() > 1e-2     # (the rounding shows)
  monkeypatch.setattr(deferred, "MIN_FLOPS", float("inf"))    # every product computed when issued
  z_eager, rep_eager = _run_tiled(x, y, 256)
  np.testing.assert_allclose(z, z_eager, rtol=1e-5, atol=1e-4)
  assert rep.device_cycles == rep_eager.device_cycles


def test_a_batch_rounds_its_panels_on_its_threads_beside_the_gemms(monkeypatch, rng):
  # a launch's pending output blocks run as one batch (blas.matmuls): the operand spans their GEMMs need
  # rounded to bf16 are handed to it unconverted (blas.Lazy), each converted once by the first of the
  # batch's threads whose product needs it, so that one thread's conversions run beside another's
  # GEMMs (until session 24 all 8 were converted on the launch's thread before the batch started)
  from palace._src import blas
  monkeypatch.setattr(blas, "_controllers", [types.SimpleNamespace(num_threads=2, set_num_threads=id)])
  seen = []
  real = blas.matmuls

  def recording(products):
    seen.append([(a, b) for a, b, _ in products])
    return real(products)
  monkeypatch.setattr(blas, "matmuls", recording)
  ints = _small_ints(rng, (2, 1024, 1024))
  # 1 + 2^-9 rounds to 1 in bf16: the MXU's operands are the integers, whose products sum exactly
  x, y = ints[0] * np.float32(1 + 2**-9), ints[1] * np.float32(1 - 2**-10)
  z, _ = _run_tiled(x, y, 256)
  np.testing.assert_array_equal(z, ints[0] @ ints[1])
  assert len(seen) == 1 and len(seen[0]) == 16                     # 4 x 4 output blocks, one batch
  lazy = {id(p): p for pair in seen[0] for p in pair if type(p) is blas.Lazy}
  assert len(lazy) == 8 and all(p.done for p in lazy.values())     # 4 row + 4 column panels, made once
  assert all(type(p) is blas.Lazy for pair in seen[0] for p in pair)


def test_highest_precision_f32_operands_are_used_as_they_are(gemms, monkeypatch, rng):
  rounded = _conversions(monkeypatch)
  x = rng.standard_normal((512, 512), dtype=np.float32)

  def kernel(x_ref, y_ref, z_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32,
                            precision="highest")
    z_ref[...] = acc_ref[...]

  spec = lambda f: pl.BlockSpec((256, 256), f)   # noqa: E731
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((512, 512), np.float32), grid=(2, 2, 2),
                     in_specs=[spec(lambda i, j, k: (i, k)), spec(lambda i, j, k: (k, j))],
                     out_specs=spec(lambda i, j, k: (i, j)),
                     scratch_shapes=[pltpu.VMEM((256, 256), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    z = f(x, x)
  np.testing.assert_allclose(z, x.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)
  assert rounded == [] and len(gemms) == 4


def test_no_deferral_while_checkers_follow_storage(gemms, rng):
  x = _bf16_exact(rng.standard_normal((512, 512), dtype=np.float32))
  z, _ = _run_tiled(x, x, 256, detect_races=True)
  assert gemms == []
  np.testing.assert_allclose(z, x @ x, rtol=1e-5, atol=1e-4)


def _one_core(rng, n_out, rest):
  """On one core: (16, 128) a and (128, 128) b copied to VMEM, p = a @ b (float32), then
  `rest(p, bv, o_hbm, acc, tmp)` with n_out (16, 128) float32 output blocks in HBM and two (16, 128)
  float32 VMEM buffers. Returns (the output, a, b)."""
  a = _bf16_exact(rng.standard_normal((16, 128), dtype=np.float32))
  b = _bf16_exact(rng.standard_normal((128, 128), dtype=np.float32))

  def body(a_hbm, b_hbm, o_hbm, av, bv, acc, tmp):
    pltpu.sync_copy(a_hbm, av)
    pltpu.sync_copy(b_hbm, bv)
    rest(jnp.dot(av[...], bv[...], preferred_element_type=jnp.float32), bv, o_hbm, acc, tmp)

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((n_out, 16, 128), np.float32),
                mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((16, 128), jnp.float32), pltpu.VMEM((128, 128), jnp.float32),
                               pltpu.VMEM((16, 128), jnp.float32), pltpu.VMEM((16, 128), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    return k(a, b), a, b


@pytest.fixture
def pending_batches(monkeypatch):
  """The size of every batch of pending HBM blocks computed (sim/memory.PendingBlocks)."""
  batches = []
  real = memory.PendingBlocks.compute
  monkeypatch.setattr(memory.PendingBlocks, "compute",
                      lambda self: (batches.append(len(self.blocks)), real(self)))
  return batches


def test_deferred_values_in_other_ops_partial_access_and_dmas(defer_everything, gemms, rng):
  def rest(p, bv, o_hbm, acc, tmp):
    acc[...] = jnp.zeros((16, 128), jnp.float32)
    acc[...] += p
    acc[...] = acc[...] + p                        # 2 a @ b, still one deferred sum
    pltpu.sync_copy(acc, o_hbm.at[0])              # DMA straight out of the deferred buffer
    tmp[...] = acc[...]
    tmp[0:8] = jnp.full((8, 128), 5.0, jnp.float32)  # partial store computes the value first
    pltpu.sync_copy(tmp, o_hbm.at[1])
    o2 = p + p + p                                 # Deferred + Deferred
    tmp[...] = jnp.maximum(o2, 0.0)                # any other op reads the numbers
    pltpu.sync_copy(tmp, o_hbm.at[2])
    tmp[...] = acc[...] * 0.0 + jnp.sum(p, axis=0, keepdims=True)
    pltpu.sync_copy(tmp, o_hbm.at[3])
    tmp[...] = jnp.dot(acc[...], bv[...], preferred_element_type=jnp.float32)  # a sum as an operand
    pltpu.sync_copy(tmp, o_hbm.at[4])
    tmp[...] = acc[...].astype(jnp.bfloat16).astype(jnp.float32)
    pltpu.sync_copy(tmp, o_hbm.at[5])

  out, a, b = _one_core(rng, 6, rest)
  p = a @ b
  tol = dict(rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(out[0], 2 * p, **tol)
  np.testing.assert_allclose(out[1][8:], 2 * p[8:], **tol)
  np.testing.assert_array_equal(out[1][:8], 5.0)
  np.testing.assert_allclose(out[2], np.maximum(3 * p, 0), **tol)
  np.testing.assert_allclose(out[3], np.broadcast_to(p.sum(0), (16, 128)), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(out[4], _bf16_exact(2 * p) @ b, rtol=1e-4, atol=1e-2)   # operand rounded to bf16
  np.testing.assert_allclose(out[5], (2 * p).astype(jnp.bfloat16).astype(np.float32), rtol=1e-2)
  assert gemms, "the kernel should have taken the deferred paths"


def test_blocks_written_back_pending_read_back_and_overwritten(defer_everything, pending_batches, rng):
  # deferred sums DMA'd into blocks of an HBM buffer stay pending there (sim/memory.PendingBlocks) until
  # something reads the buffer; a later copy over a pending block wins, pending or not
  def rest(p, bv, o_hbm, acc, back):
    acc[...] = p
    pltpu.sync_copy(acc, o_hbm.at[0])              # pending
    acc[...] = p + p
    pltpu.sync_copy(acc, o_hbm.at[1])              # pending
    pltpu.sync_copy(o_hbm.at[0], back)             # a read of the buffer computes both
    acc[...] = back[...] * 3.0
    pltpu.sync_copy(acc, o_hbm.at[2])
    acc[...] = p + p + p
    pltpu.sync_copy(acc, o_hbm.at[3])              # pending
    acc[...] = p
    pltpu.sync_copy(acc, o_hbm.at[3])              # over a pending block: the first one is computed
    acc[...] = p + p
    pltpu.sync_copy(acc, o_hbm.at[4])              # pending, then a plain copy over it
    back[...] = jnp.full((16, 128), 7.0, jnp.float32)
    pltpu.sync_copy(back, o_hbm.at[4])

  out, a, b = _one_core(rng, 5, rest)
  p = a @ b
  tol = dict(rtol=1e-5, atol=1e-4)
  for i, want in enumerate([p, 2 * p, 3 * p, p]):
    np.testing.assert_allclose(out[i], want, **tol)
  np.testing.assert_array_equal(out[4], 7.0)
  # blocks 0 and 1 at the read; the first block 3 under the second; the second and block 4 under the
  # plain copy (any other write computes the buffer's pending blocks first)
  assert pending_batches == [2, 1, 2]


def test_pending_blocks_hold_bounded_operand_memory(monkeypatch, pending_batches, rng):
  batches = pending_batches
  x = _bf16_exact(rng.standard_normal((512, 512), dtype=np.float32))
  z, _ = _run_tiled(x, x, 256)                 # 4 output blocks, each sum holding 2 x 2 blocks (1 MiB)
  np.testing.assert_allclose(z, x @ x, rtol=1e-5, atol=1e-3)
  assert batches == [4]                        # one batch, at the end of the launch
  batches.clear()
  monkeypatch.setattr(memory.PendingBlocks, "MAX_BYTES", 3 * 2**19)   # room for one sum's operands
  z2, _ = _run_tiled(x, x, 256)
  np.testing.assert_array_equal(z2, z)
  assert batches == [1, 1, 1, 1]


def test_long_k_sums_are_computed_in_bounded_pieces(defer_everything, gemms, rng):
  n_k = deferred.MAX_TERMS + 6
  x = _bf16_exact(rng.standard_normal((8, 128 * n_k), dtype=np.float32))
  y = _bf16_exact(rng.standard_normal((128 * n_k, 128), dtype=np.float32))
  f = pl.pallas_call(
      _matmul_kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32), grid=(1, 1, n_k),
      in_specs=[pl.BlockSpec((8, 128), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((8, 128), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    z = f(x, y)
  np.testing.assert_allclose(z, x @ y, rtol=1e-4, atol=1e-3)
  assert [b[0] for _, b in gemms] == [128 * deferred.MAX_TERMS, 128 * 6]   # two bounded pieces


def test_output_accumulated_in_place_through_an_alias(defer_everything, rng):
  x = _bf16_exact(rng.standard_normal((256, 256), dtype=np.float32))
  c = _bf16_exact(rng.standard_normal((256, 256), dtype=np.float32))

  def kernel(x_ref, y_ref, c_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
      o_ref[...] = c_ref[...]
    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  spec = lambda f: pl.BlockSpec((128, 128), f)   # noqa: E731
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((256, 256), np.float32), grid=(2, 2, 2),
                     in_specs=[spec(lambda i, j, k: (i, k)), spec(lambda i, j, k: (k, j)),
                               spec(lambda i, j, k: (i, j))],
                     out_specs=spec(lambda i, j, k: (i, j)), input_output_aliases={2: 0})
  with pl.virtual_tpu("v5e"):
    z = f(x, x, c)
  np.testing.assert_allclose(z, c + x @ x, rtol=1e-5, atol=1e-4)


def test_widened_spans_are_not_reused_after_the_operand_changes(defer_everything, rng):
  # bf16 blocks of 64 KiB are borrowed views of HBM; the second product must see the new x
  x1 = _small_ints(rng, (256, 128)).astype(jnp.bfloat16)   # integer products: exact on any BLAS
  x2 = _small_ints(rng, (256, 128)).astype(jnp.bfloat16)
  y = _small_ints(rng, (128, 128)).astype(jnp.bfloat16)

  def body(x1_hbm, x2_hbm, y_hbm, o_hbm, w_hbm, xv, yv, acc):
    pltpu.sync_copy(x1_hbm, w_hbm)
    pltpu.sync_copy(y_hbm, yv)
    for step, src in enumerate((None, x2_hbm)):
      if src is not None:
        pltpu.sync_copy(src, w_hbm)          # the operand changes between the two products
      pltpu.sync_copy(w_hbm, xv)
      acc[...] = jnp.dot(xv[...], yv[...], preferred_element_type=jnp.float32)
      pltpu.sync_copy(acc, o_hbm.at[step])

  k = pl.kernel(body, out_type=(pl.ShapeDtypeStruct((2, 256, 128), np.float32),
                                pl.ShapeDtypeStruct((256, 128), jnp.bfloat16)),
                mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((256, 128), jnp.bfloat16), pltpu.VMEM((128, 128), jnp.bfloat16),
                               pltpu.VMEM((256, 128), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    out, _ = k(x1, x2, y)
  f64 = lambda v: v.astype(np.float64)   # noqa: E731
  np.testing.assert_array_equal(out[0], f64(x1) @ f64(y))
  np.testing.assert_array_equal(out[1], f64(x2) @ f64(y))


def test_value_read_through_a_borrowed_block_survives_a_write_to_its_old_lender(rng):
  # av borrows a's storage (whole-buffer DMA >= 64 KiB), v views it; av then borrows b's storage, and
  # a is overwritten: v must keep a's old values
  a = _bf16_exact(rng.standard_normal((128, 128), dtype=np.float32))
  b = _bf16_exact(rng.standard_normal((128, 128), dtype=np.float32))
  c = _bf16_exact(rng.standard_normal((128, 128), dtype=np.float32))

  def body(a_in, b_in, c_in, o_hbm, a_hbm, av, tmp):
    pltpu.sync_copy(a_in, a_hbm)
    pltpu.sync_copy(a_hbm, av)
    v = av[...]
    pltpu.sync_copy(b_in, av)
    pltpu.sync_copy(c_in, a_hbm)
    tmp[...] = v + av[...]
    pltpu.sync_copy(tmp, o_hbm)

  k = pl.kernel(body, out_type=(pl.ShapeDtypeStruct((128, 128), np.float32),
                                pl.ShapeDtypeStruct((128, 128), np.float32)),
                mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((128, 128), jnp.float32), pltpu.VMEM((128, 128), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    out, a_final = k(a, b, c)
  np.testing.assert_array_equal(out, a + b)
  np.testing.assert_array_equal(a_final, c)


def test_large_fresh_scratch_still_reads_as_uninitialised(defer_everything):
  def body(o_f, o_i, f_buf, i_buf):
    f_buf[0:8] = jnp.ones((8, 128), jnp.float32)
    pltpu.sync_copy(f_buf, o_f)
    pltpu.sync_copy(i_buf, o_i)

  k = pl.kernel(body, out_type=(pl.ShapeDtypeStruct((256, 128), np.float32),
                                pl.ShapeDtypeStruct((256, 128), np.int32)),
                mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((256, 128), jnp.float32), pltpu.VMEM((256, 128), jnp.int32)])
  with pl.virtual_tpu("v5e"):
    f, i = k()
  assert (f[:8] == 1).all() and np.isnan(f[8:]).all()
  assert (i == np.iinfo(np.int32).min).all()


def test_host_arrays_are_recycled_only_when_nobody_holds_them():
  from palace._src import hostmem
  a, b = hostmem.take((3, 5), np.float32), hostmem.take((3, 5), np.float32)
  kept = b[1:]                        # a view keeps b's memory in use
  owned = [a, b]
  del a, b
  hostmem.give_back(owned)
  assert owned == []
  c = hostmem.take((3, 5), np.float32)
  d = hostmem.take((3, 5), np.float32)
  assert c.flags.writeable and not np.shares_memory(d, kept) and not np.shares_memory(c, kept)
  kept[...] = 1.0
  c[...] = 2.0
  d[...] = 3.0
  assert (kept == 1.0).all()


def test_lax_dot_general_and_matmul_operator_defer_like_dot(defer_everything, gemms, rng):
  from palace import lax
  x = _bf16_exact(rng.standard_normal((16, 256), dtype=np.float32))
  y = _bf16_exact(rng.standard_normal((256, 128), dtype=np.float32))

  def kernel(x_ref, y_ref, o_ref):
    a = lax.dot_general(x_ref[:, 0:128], y_ref[0:128, :], (((1,), (0,)), ((), ())),
                        preferred_element_type=jnp.float32)
    o_ref[...] = a + x_ref[:, 128:256] @ y_ref[128:256, :]

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32))
  with pl.virtual_tpu("v5e"):
    z = f(x, y)
  np.testing.assert_allclose(z, x @ y, rtol=1e-5, atol=1e-4)
  assert gemms == [((16, 256), (256, 128))]   # the two halves of K are adjacent views: one GEMM


def test_emit_pipeline_matmul_defers(gemms, rng):
  x = _bf16_exact(rng.standard_normal((512, 1024), dtype=np.float32))
  y = _bf16_exact(rng.standard_normal((1024, 512), dtype=np.float32))

  def body(x_hbm, y_hbm, z_hbm):
    def with_acc(acc_ref):
      def step(xb, yb, zb):
        _matmul_kernel(xb, yb, zb, acc_ref)
      pltpu.emit_pipeline(step, grid=(2, 2, 4),
                          in_specs=[pl.BlockSpec((256, 256), lambda i, j, kk: (i, kk)),
                                    pl.BlockSpec((256, 256), lambda i, j, kk: (kk, j))],
                          out_specs=[pl.BlockSpec((256, 256), lambda i, j, kk: (i, j))])(x_hbm, y_hbm, z_hbm)
    pl.run_scoped(with_acc, pltpu.VMEM((256, 256), jnp.float32))

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((512, 512), np.float32),
                mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  with pl.virtual_tpu("v5e"):
    z = k(x, y)
  np.testing.assert_allclose(z, x @ y, rtol=1e-5, atol=1e-3)
  assert gemms == [((256, 1024), (1024, 256))] * 4


def test_megacore_split_defers_on_each_core(gemms, rng):
  x = _bf16_exact(rng.standard_normal((1024, 512), dtype=np.float32))
  y = _bf16_exact(rng.standard_normal((512, 512), dtype=np.float32))
  with pl.virtual_tpu("v5p") as tpu:          # two TensorCores share the "parallel" i axis
    z = _tiled(x, y, 256)
  np.testing.assert_allclose(z, x @ y, rtol=1e-5, atol=1e-3)
  assert gemms == [((256, 512), (512, 256))] * 8
  assert tpu.reports[-1].grid_steps == 4 * 2 * 2


def test_evicted_widened_spans_are_released_during_the_launch(monkeypatch):
  # a launch re-widening more panels than HostCache.MAX_BYTES keeps (an 8192^3 matmul with 512x1024
  # blocks) must not hold every span it ever widened until it ends: host memory stays bounded
  from palace._src import dtypes as dt
  from palace._src.lang.array import Array
  monkeypatch.setattr(deferred.HostCache, "MAX_BYTES", 4 * 64 * 128 * 4)
  cache = deferred.HostCache()
  root = np.zeros((64, 128 * 40), dt.bfloat16)
  alive = []
  for j in range(40):
    span = root[:, 128 * j:128 * (j + 1)]
    wide = cache.converted(span, root, [Array(span, span.shape, span.dtype, 0)], "DEFAULT")
    alive.append(__import__("weakref").ref(wide))
    del wide
  distinct = {id(w): w for w in (r() for r in alive) if w is not None}   # recycled spans repeat
  assert len(distinct) <= 5, len(distinct)   # the 4 the cache keeps and the one evicted last
  cache.release()


def test_a_strided_f32_span_is_rounded_to_the_same_bits_as_a_contiguous_one():
  # HostCache stages a non-contiguous float32 span (a column panel) through contiguous scratch before
  # rounding it: every sign, exponent and deciding low half (ties with even and odd kept halves,
  # carries, NaN payloads) as the bf16 cast rounds them
  from palace._src import dtypes as dt
  from palace._src.lang.array import Array
  high = np.arange(0, 1 << 16, 4, dtype=np.uint32) << 16   # (with the low halves: 32 to a row)
  low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000], np.uint32)
  u = (high[:, None] | low[None, :]).reshape(-1, 32)
  root = np.zeros((u.shape[0], 96), np.float32)
  root[:, 32:64] = u.view(np.float32)
  span = root[:, 32:64]
  assert not span.flags.c_contiguous
  cache = deferred.HostCache()
  wide = cache.converted(span, root, [Array(span, span.shape, span.dtype, 0)], "DEFAULT")
  with np.errstate(invalid="ignore"):   # (the cast of NaN payloads)
    expected = dt.bf16_to_f32(span.astype(dt.bfloat16))
  np.testing.assert_array_equal(wide.view(np.uint32), expected.view(np.uint32))
  cache.release()


def test_zeros_plus_an_array_adds_so_negative_zeros_become_positive(monkeypatch, rng):
  # `acc = zeros; acc += x` keeps 0 + x pending (an empty sum with x as its base); computed, it is the
  # float32 add, not a copy of x: 0.0 + -0.0 is +0.0, as the eager add (and a TPU) gives
  def kernel(x_ref, o_ref, acc_ref):
    acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += x_ref[...]
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)

  x = rng.standard_normal((128, 128), dtype=np.float32)
  x[::3] = -0.0
  x[1, :4] = [np.inf, -np.inf, np.nan, 0.0]

  def run(out_dtype):
    with pl.virtual_tpu("v5e"):
      return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, out_dtype),
                            scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)])(x)
  expected = np.float32(0) + x
  bits = lambda a: a.view(np.uint16 if a.dtype == jnp.bfloat16 else np.uint32)  # noqa: E731
  for out_dtype in (np.float32, jnp.bfloat16):
    z = run(out_dtype)
    assert not np.signbit(z[::3]).any()
    np.testing.assert_array_equal(bits(z), bits(expected.astype(out_dtype)))
    with monkeypatch.context() as m:   # the eager path (no empty sum): the same bits
      m.setattr(deferred, "ZEROS_MIN_BYTES", float("inf"))
      np.testing.assert_array_equal(bits(run(out_dtype)), bits(z))


def test_f32_rounding_on_the_bits_equals_the_bf16_cast():
  # mxu.round_to_bf16_as_f32 (the deferred sums' rounding) against bf16_to_f32(round_to_bf16(v)) on
  # every sign and exponent with the low halves that decide rounding: ties (0x8000) with an even and
  # an odd kept half, just below and above, carries into the exponent and to infinity, denormals,
  # infinities and NaN payloads (all 2^32 patterns agree too: checked once, it takes ~30 s)
  from palace._src import dtypes as dt
  from palace._src.lang import mxu
  high = np.arange(1 << 16, dtype=np.uint32) << 16
  low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000], np.uint32)
  u = (high[:, None] | low[None, :]).reshape(-1)
  u = np.concatenate([u, u + np.uint32(0x10000) * (u < 0xFFFF0000)])   # (the odd/even pairs)
  v = u.view(np.float32).reshape(-1, 64)
  with np.errstate(all="ignore"):
    want = dt.bf16_to_f32(mxu.round_to_bf16(v))
    got = mxu.round_to_bf16_as_f32(v[:, ::2], np.empty((v.shape[0], 32), np.float32).T.copy().T)
  np.testing.assert_array_equal(got.view(np.uint32), want[:, ::2].view(np.uint32))
  got = mxu.round_to_bf16_as_f32(v, np.empty_like(v))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

