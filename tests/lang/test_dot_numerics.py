"""VirtualTPU(dot_numerics="mxu"): float dots in kernels summed in the order the v5e's MXU sums them
(lang/mxu.chip_product, docs/numerics.md), against the chip's recorded outputs
(benchmarks/hw/data/v5e-dot-bits-k128-2026-12-06.npz) and the slow reference rule
(benchmarks/hw/dot_bits.mxu_rule). palace.jax's side: tests/jax_backend/test_dot_numerics.py."""
import ml_dtypes
import numpy as np
import pytest
import threadpoolctl

import palace
import palace.numpy as pnp
import palace.tpu as pltpu
from benchmarks.hw import dot_bits
from benchmarks.kernels import tiled_matmul
from palace import lax
from palace._src.lang import mxu

BF16 = ml_dtypes.bfloat16


def _bf16_valued(shape, seed, scale=1.0):
  v = np.random.default_rng(seed).standard_normal(shape) * scale
  return v.astype(np.float32).astype(BF16).astype(np.float32)


def _reference(a, b):
  """dot_bits.mxu_rule on float64 operands, K padded with zeros to a multiple of 8."""
  k = a.shape[1]
  pad = -k % 8
  return dot_bits.mxu_rule(np.pad(a, ((0, 0), (0, pad))), np.pad(b, ((0, pad), (0, 0))))


def _dot_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = pnp.dot(x_ref[...], y_ref[...], preferred_element_type=np.float32)


def _call(shape):
  return palace.pallas_call(_dot_kernel, out_shape=palace.ShapeDtypeStruct(shape, np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_kernel_dot_reproduces_the_chip_bits(dtype):
  x, y, chip = dot_bits.recorded(dtype)
  with palace.virtual_tpu("v5e", dot_numerics="mxu"):
    ulps = dot_bits.ulps(np.asarray(_call((256, 256))(x, y)), chip)
  # the rule's known outliers on this record: 3 of 65536 outputs, each 1 ulp (docs/numerics.md)
  assert (ulps != 0).sum() == 3 and ulps.max() == 1
  with palace.virtual_tpu("v5e"):   # the default, the host BLAS's order: thousands differ
    assert (dot_bits.ulps(np.asarray(_call((256, 256))(x, y)), chip) != 0).sum() > 10000


def test_a_launch_in_interpret_mode_keeps_the_mode():
  # interpret=InterpretParams runs on a VirtualTPU made like the active one (launch/host.interpret_context)
  x, y, chip = dot_bits.recorded("float32")
  call = palace.pallas_call(_dot_kernel, out_shape=palace.ShapeDtypeStruct((256, 256), np.float32),
                            interpret=pltpu.InterpretParams())
  with palace.virtual_tpu("v5e", dot_numerics="mxu"):
    assert (dot_bits.ulps(np.asarray(call(x, y)), chip) != 0).sum() == 3


@pytest.mark.parametrize("m,k,n", [(8, 128, 128), (64, 200, 96), (33, 384, 130), (8, 5, 7), (16, 1000, 128)])
def test_every_dot_form_follows_the_reference_rule(m, k, n):
  a, b = _bf16_valued((m, k), 1), _bf16_valued((k, n), 2)
  want = _reference(a, b)

  def forms(x_ref, y_ref, bt_ref, o1, o2, o3, o4):
    o1[...] = pnp.dot(x_ref[...], y_ref[...])                          # float32 at DEFAULT
    o2[...] = lax.dot_general(x_ref[...].astype(np.dtype(BF16)), y_ref[...].astype(np.dtype(BF16)),
                              (((1,), (0,)), ((), ())), preferred_element_type=np.float32)
    o3[...] = lax.dot_general(x_ref[...], bt_ref[...], (((1,), (1,)), ((), ())))   # a @ b.T
    o4[...] = pnp.einsum("bmk,bkn->bmn", x_ref[...][None], y_ref[...][None])[0]    # batched
  out = palace.ShapeDtypeStruct((m, n), np.float32)
  with palace.virtual_tpu("v5e", dot_numerics="mxu"):
    got = palace.pallas_call(forms, out_shape=[out] * 4)(a, b, np.ascontiguousarray(b.T))
  for g in got:
    np.testing.assert_array_equal(np.asarray(g).view(np.int32), want.view(np.int32))


def test_a_k_tiled_accumulation_equals_one_dot_over_k():
  # blocks of 128 along K added into an accumulator: the chip's chunk sums added in order, the bits of
  # one dot over the whole K (never a deferred BLAS sum in this mode)
  x, y = _bf16_valued((512, 512), 3), _bf16_valued((512, 512), 4)
  with palace.virtual_tpu("v5e", dot_numerics="mxu"):
    tiled = np.asarray(tiled_matmul(x, y, 256, 128, 256))
    whole = np.asarray(_call((512, 512))(x, y))
  want = _reference(x, y)
  np.testing.assert_array_equal(tiled.view(np.int32), want.view(np.int32))
  np.testing.assert_array_equal(whole.view(np.int32), want.view(np.int32))


def test_the_rule_does_not_depend_on_the_host_blas():
  a, b = _bf16_valued((96, 384), 5), _bf16_valued((384, 160), 6)
  with threadpoolctl.threadpool_limits(1):
    one = mxu.chip_product(a, b)
  with threadpoolctl.threadpool_limits(2):
    two = mxu.chip_product(a, b)
  np.testing.assert_array_equal(one.view(np.int32), two.view(np.int32))
  # each four-sum is exact, so any order of a four-slice's products (a BLAS's choice) gives these bits;
  # a float32 BLAS product does not survive the same permutation
  perm = np.arange(384).reshape(-1, 4)[:, ::-1].ravel()
  swapped = mxu.chip_product(a[:, perm], b[perm])
  np.testing.assert_array_equal(swapped.view(np.int32), one.view(np.int32))
  assert not np.array_equal(a @ b, a[:, perm] @ b[perm])


def test_four_products_spanning_more_than_float64_holds_are_summed_in_a_fixed_order():
  a, b = _bf16_valued((8, 16), 7), _bf16_valued((16, 8), 8)
  a[:, 1] *= 2.0 ** 30   # with the 2^-20 below: products of a four-slice 2^50 apart (> 2^35)
  b[2] *= 2.0 ** -20
  got = mxu.chip_product(a, b)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  want = np.zeros((8, 8), np.float32)
  groups = []
  for s in range(0, 16, 8):
    halves = []
    for h in (s, s + 4):
      p = a64[:, h, None] * b64[h]
      for t in range(h + 1, h + 4):
        p = p + a64[:, t, None] * b64[t]
      halves.append(p.astype(np.float32))
    groups.append((halves[0] + halves[1]).astype(np.float32))
  want = (np.float32(0) + groups[0]).astype(np.float32)
  want = (want + groups[1]).astype(np.float32)
  np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_integer_and_highest_dots_are_unchanged_and_timing_is_the_same():
  xi = np.random.default_rng(9).integers(-128, 128, (128, 256)).astype(np.int8)
  yi = np.random.default_rng(10).integers(-128, 128, (256, 128)).astype(np.int8)
  x, y = _bf16_valued((256, 512), 11) * 1.001, _bf16_valued((512, 256), 12)

  def kernel(xi_ref, yi_ref, x_ref, y_ref, oi_ref, oh_ref):
    oi_ref[...] = pnp.dot(xi_ref[...], yi_ref[...], preferred_element_type=np.int32)
    oh_ref[...] = pnp.dot(x_ref[...], y_ref[...], precision="highest")
  call = palace.pallas_call(kernel, out_shape=[palace.ShapeDtypeStruct((128, 128), np.int32),
                                               palace.ShapeDtypeStruct((256, 256), np.float32)])
  runs = {}
  for mode in ("blas", "mxu"):
    with palace.virtual_tpu("v5e", dot_numerics=mode) as tpu:
      outs = [np.asarray(o) for o in call(xi, yi, x, y)]
      np.asarray(tiled_matmul(x, y, 128))
    runs[mode] = outs, [r.as_dict() for r in tpu.reports]
  for o_blas, o_mxu in zip(runs["blas"][0], runs["mxu"][0]):
    np.testing.assert_array_equal(o_blas, o_mxu)
  np.testing.assert_array_equal(runs["mxu"][0][0], xi.astype(np.int32) @ yi.astype(np.int32))
  assert runs["blas"][1] == runs["mxu"][1]   # numerics never change timing


def test_an_unknown_mode_is_a_usage_error():
  with pytest.raises(palace.UsageError, match=r"dot_numerics\) must be one of 'blas', 'mxu'; got .*chip"):
    palace.virtual_tpu("v5e", dot_numerics="chip")
  assert "dot_numerics='mxu'" in repr(palace.virtual_tpu("v5e", dot_numerics="mxu"))
