"""The compiler limits measured on a TPU v5e (benchmarks/hw/data/v5e-limits-2026-12-05*.jsonl), through
palace's own front end: each test reads the chip's recorded verdict (and message) of a probe and checks
that palace accepts (and computes) what the chip accepted and raises where the chip's compiler rejected
(tests/jax_backend/test_chip_limits.py runs the probes themselves through palace.jax)."""
import json
from pathlib import Path

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

F32, I8, I16, I32, U8, U16 = np.float32, np.int8, np.int16, np.int32, np.uint8, np.uint16
MiB = 2**20
_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "hw" / "data"


def _load(name):
  with open(_DATA / name) as fh:
    return {r["name"]: r for r in map(json.loads, filter(str.strip, fh)) if "name" in r}


CHIP = _load("v5e-limits-2026-12-05-followup.jsonl")   # all 152 probes (the first run's 89 agree)


def _expect(probe, *quotes):
  """The chip's verdict of `probe` (True: accepted); the quoted fragments must be in its message."""
  rec = CHIP[probe]
  for q in quotes:
    assert q in rec["error"], (probe, rec["error"])
  return rec["accepted"]


def _arange(shape, dtype):   # the probes' inputs (benchmarks/hw/limits.py `_arange`)
  return (np.arange(int(np.prod(shape))) % 7 + 1).reshape(shape).astype(dtype)


def _copy(x, block, **kw):
  grid = tuple(s // b for s, b in zip(x.shape, block))
  spec = pl.BlockSpec(block, lambda *g: g)
  return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                        out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=grid, in_specs=[spec],
                        out_specs=spec, **kw)(x)


def _whole(fn, *args, out_dtype=None):
  def kernel(*refs):
    *ins, o_ref = refs
    o_ref[...] = fn(*(r[...] for r in ins))
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(args[0].shape, out_dtype or args[0].dtype))(
      *args)


# ------------------------------------------------------------------ 8-bit HBM tiling
@pytest.mark.parametrize("probe, shape, dtype, block", [
    ("block_int8_8x128", (64, 256), I8, (8, 128)), ("block_int8_16x128", (64, 256), I8, (16, 128)),
    ("block_int8_32x128", (64, 256), I8, (32, 128)), ("block_int8_16x256_8x128", (16, 256), I8, (8, 128)),
    ("block_int8_32x256_8x128", (32, 256), I8, (8, 128)),
    ("block_int8_96x256_32x128", (96, 256), I8, (32, 128)),
    ("block_int8_48x256_16x128", (48, 256), I8, (16, 128)),
    ("block_uint8_64x256_16x128", (64, 256), U8, (16, 128)),
    ("block_fp8_64x256_16x128", (64, 256), jnp.float8_e4m3fn, (16, 128)),
    ("block_fp8_64x256_32x128", (64, 256), jnp.float8_e4m3fn, (32, 128)),
    ("block_int16_128x256_8x128", (128, 256), I16, (8, 128)),
])
def test_8bit_arrays_whose_rows_are_a_multiple_of_32_take_32_row_blocks(probe, shape, dtype, block):
  # chip: "Operand of shape (..., 64, 256) has tiling (32, 128), but its block shape (..., 8, 128) is
  # not divisible by tiling evenly nor matches the full shape"; 48 and 16 rows: no such tiling
  x = _arange(shape, dtype)
  if _expect(probe):
    np.testing.assert_array_equal(_copy(x, block).view(np.uint8), x.view(np.uint8))
    return
  assert shape[0] % 32 == 0 and "has tiling (32, 128)" in CHIP[probe]["error"]
  with pytest.raises(pl.BlockSpecError, match=rf"Block shape for args\[0\] \(= \({block[0]}, 128\)\) does not "
                                              rf"fit the \(32, 128\) HBM tiling of an 8-bit array of shape "
                                              rf"\({shape[0]}, 256\) .*row count is a multiple of 32 .*"
                                              rf"Fix: use a multiple of 32 rows"):
    _copy(x, block)


def test_vmem_limit_above_the_chip_is_clamped_not_an_error():
  assert _expect("vmem_limit_256MiB")   # vmem_limit_bytes of 256 MiB compiles on v5e (128 MiB of VMEM)
  x = np.ones((16, 256), F32)
  out = _copy(x, (8, 128), compiler_params=pltpu.CompilerParams(vmem_limit_bytes=256 * MiB))
  np.testing.assert_array_equal(out, x)


# ------------------------------------------------------------------ integer vector ops
_OPS = [   # (probe, dtype, op, its name in palace's error, NumPy reference); (32, 128) operands
    ("int8_add_op", I8, lambda a, b: a + b, "add", None),
    ("int8_mul_op", I8, lambda a, b: a * b, "multiply", None),
    ("int8_max_op", I8, jnp.maximum, "maximum", None),
    ("int8_neg_op", I8, lambda a, b: -a, "negative", None),
    ("int8_and_op", I8, lambda a, b: a & b, "", lambda a, b: a & b),
    ("int8_shift_op", I8, lambda a, b: a >> 1, "right_shift", None),
    ("int8_where_op", I8, lambda a, b: jnp.where(a > b, a, b), "greater", None),
    ("int8_compare_op", I8, lambda a, b: (a > b).astype(I32), "greater", None),
    ("int8_cast_add_op", I8, lambda a, b: a.astype(I32) + b.astype(I32), "",
     lambda a, b: a.astype(I32) + b.astype(I32)),
    ("uint8_add_op", U8, lambda a, b: a + b, "add", None),
    ("int16_mul_op", I16, lambda a, b: a * b, "", lambda a, b: a * b),
    ("int16_rem_op", I16, lambda a, b: a % b, "remainder", None),
    ("int16_max_op", I16, jnp.maximum, "maximum", None),
    ("int16_shift_op", I16, lambda a, b: a >> 1, "right_shift", None),
    ("int16_where_op", I16, lambda a, b: jnp.where(a > b, a, b), "", lambda a, b: np.where(a > b, a, b)),
]


@pytest.mark.parametrize("probe, dtype, fn, name, ref", _OPS, ids=[o[0] for o in _OPS])
def test_integer_vector_ops_as_the_chip_compiles_them(probe, dtype, fn, name, ref):
  a = _arange((32, 128), dtype)
  b = a[::-1].copy()
  if _expect(probe):
    out = _whole(fn, a, b, out_dtype=np.asarray(ref(a, b)).dtype)
    np.testing.assert_array_equal(out, ref(a, b))
    return
  error = CHIP[probe]["error"]
  mlir_op = error.split('"arith.')[1].split('"')[0] if '"arith.' in error else ""
  bits = np.dtype(dtype).itemsize * 8
  with pytest.raises(pl.UnsupportedError, match=rf"jnp\.{name} of {np.dtype(dtype)} vectors of shape "
                                                rf"\(32, 128\) .*no {bits}-bit integer {name} on vectors "
                                                rf"\(Mosaic, measured on a TPU v5e .*{mlir_op}.*Fix: cast "
                                                rf"the operands to int32"):
    _whole(fn, a, b)


@pytest.mark.parametrize("dtype, fn, name, measured", [
    (I8, jnp.minimum, "minimum", "int8_max_op"), (U8, jnp.maximum, "maximum", "int8_max_op"),
    (U16, lambda a, b: a >> 1, "right_shift", "int16_shift_op"),
    (I8, lambda a, b: a == b, "equal", "int8_compare_op"), (U8, lambda a, b: a < b, "less", "int8_compare_op"),
])
def test_inferred_integer_rejections_say_so(dtype, fn, name, measured):
  # not measured: the unsigned twins and minimum take the rule of the measured signed op
  assert not _expect(measured)
  a = _arange((32, 128), dtype)
  with pytest.raises(pl.UnsupportedError, match=rf"jnp\.{name} of {np.dtype(dtype)} vectors .*inferred, "
                                                rf"not measured: .*probe {measured}"):
    _whole(fn, a, a)


def test_8bit_vector_add_is_rejected_and_the_cast_is_the_fix():
  assert not _expect("int8_add_op", "Only vector<i16> and vector<i32> are supported, but got 'i8'")
  a = np.full((32, 128), 3, I8)
  with pytest.raises(pl.UnsupportedError, match=r"jnp\.add of int8 vectors of shape \(32, 128\) at grid "
                                                r"point \(\) on chip 0 core 0 .*no 8-bit integer add on "
                                                r"vectors .*Fix: cast the operands to int32"):
    _whole(lambda u, v: u + v, a, a)
  with pytest.raises(NotImplementedError, match=r"jnp\.subtract of uint8"):
    _whole(lambda u, v: u - v, a.view(U8), a.view(U8))
  out = _whole(lambda u, v: (u.astype(jnp.int32) + v.astype(jnp.int32)).astype(jnp.int8), a, a)
  assert (out == 6).all()


def test_16bit_vector_division_is_rejected():
  assert _expect("int16_add") and not _expect("int16_div", "arith.divsi")
  a = np.full((16, 128), 7, I16)
  assert (_whole(lambda u, v: u + v, a, a) == 14).all()
  with pytest.raises(pl.UnsupportedError, match=r"jnp\.floor_divide of int16 vectors .*no 16-bit integer "
                                                r"floor_divide on vectors .*arith\.divsi"):
    _whole(lambda u, v: u // v, a, a)


# ------------------------------------------------------------------ SMEM
def _prefetch(n):
  def kernel(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] + s_ref[n - 1].astype(jnp.float32)
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(2,),
                                    in_specs=[pl.BlockSpec((8, 128), lambda i, s: (s[i], 0))],
                                    out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))
  s = np.zeros((n,), I32)
  s[1], s[n - 1] = 1, 5
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), F32), grid_spec=gs)(
      s, _arange((16, 128), F32))


def _smem_scratch(n):
  def kernel(x_ref, o_ref, s_ref):
    s_ref[0] = 1
    s_ref[n - 1] = 2
    o_ref[...] = x_ref[...] + (s_ref[0] + s_ref[n - 1]).astype(jnp.float32)
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), F32),
                        scratch_shapes=[pltpu.SMEM((n,), jnp.int32)])(_arange((8, 128), F32))


@pytest.mark.parametrize("probe, run, n", [
    ("prefetch_200K_int32", _prefetch, 200 * 1024), ("prefetch_1MiB_minus_1024B", _prefetch, 262144 - 256),
    ("prefetch_1MiB_minus_144B", _prefetch, 262144 - 36),
    ("smem_scratch_128K_int32", _smem_scratch, 128 * 1024),
    ("smem_scratch_1MiB_minus_1024B", _smem_scratch, 262144 - 256),
])
def test_smem_less_the_compilers_own_use(probe, run, n):
  # chip: the compiler's own SMEM use depends on the kernel, 144-1950 B: palace keeps 2048 B
  x = _arange((16, 128), F32)
  if _expect(probe):
    out = run(n)
    want = x[8:] + 5 if run is _prefetch else x[:8] + 3
    np.testing.assert_array_equal(out[8:] if run is _prefetch else out, want)
    return
  assert "Ran out of memory in memory space smem" in CHIP[probe]["error"]
  what = r"scalar_prefetch\[0\]" if run is _prefetch else r"scratch\[0\]"
  with pytest.raises(pl.ResourceError, match=rf"SMEM over capacity for {what} .* > 1022\.00 KiB usable on "
                                             rf"v5e \(1\.00 MiB SMEM less 2048 B the compiler reserves; .*"
                                             rf"Exceeded smem capacity by 1\.4K'\)\. Fix: keep SMEM"):
    run(n)


# ------------------------------------------------------------------ semaphores
def _dma_sems(n):
  def body(x_hbm, o_hbm, sems):
    c = pltpu.make_async_copy(x_hbm, o_hbm, sems.at[n - 1])
    c.start()
    c.wait()
  return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((16, 128), F32),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])(_arange((16, 128), F32))


def _regular_sems(n):
  def body(x_ref, o_ref, sems):
    pltpu.semaphore_signal(sems.at[n - 1], 1)
    pltpu.semaphore_wait(sems.at[n - 1], 1)
    o_ref[...] = x_ref[...]
  return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((8, 128), F32),
                        scratch_shapes=[pltpu.SemaphoreType.REGULAR((n,))])(_arange((8, 128), F32))


def _grid_dma_sems(n):
  def body(x_ref, o_ref, sems):
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[n - 1])
    c.start()
    c.wait()
  spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
  return pl.pallas_call(body, out_shape=pl.ShapeDtypeStruct((16, 128), F32), grid=(2,), in_specs=[spec],
                        out_specs=spec, scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])(
                            _arange((16, 128), F32))


@pytest.mark.parametrize("probe, run, n, pipeline_sems", [
    ("dma_semaphores_256", _dma_sems, 256, 0), ("dma_semaphores_500", _dma_sems, 500, 0),
    ("dma_semaphores_512", _dma_sems, 512, 0), ("regular_semaphores_508", _regular_sems, 508, 2),
    ("grid_dma_semaphores_508", _grid_dma_sems, 508, 4),
])
def test_semaphores_512_words_less_the_compilers_19(probe, run, n, pipeline_sems):
  # chip: 2048 B of sflag, 4 B a semaphore; the compiler's own 76 B (19) plus one per pipelined block
  # buffer: "Exceeded sflag capacity by 28B" for 500 DMA semaphores, 68 B for 508 REGULAR (+ 2)
  if _expect(probe):
    assert n + pipeline_sems + 19 <= 512
    np.testing.assert_array_equal(run(n), _arange((16, 128) if run is not _regular_sems else (8, 128), F32))
    return
  over = 4 * (n + pipeline_sems + 19) - 2048   # bytes: the rule's figure, equal to the chip's
  assert f"Exceeded sflag capacity by {over}B" in CHIP[probe]["error"]
  with pytest.raises(pl.ResourceError, match=r"Semaphores over capacity for .* semaphores > 512 per core on "
                                             r"v5e less 19 the compiler keeps \(493 usable; .*Fix: reuse"):
    run(n)


def test_semaphores_up_to_the_bound_run():
  # 512 - 19 DMA semaphores without pipelined blocks fit (not measured: the chip ran 256, rejected 500)
  x = _arange((16, 128), F32)
  np.testing.assert_array_equal(_dma_sems(493), x)
  with pytest.raises(pl.ResourceError, match=r"0 in use \+ 494 requested dma semaphores > 512 per core"):
    _dma_sems(494)


# ------------------------------------------------------------------ VMEM
def _run_scoped(mib):
  rows = mib * MiB // 4096

  def kernel(x_ref, o_ref):
    def body(s_ref):
      s_ref[pl.ds(rows - 8, 8), :] = x_ref[...]
      o_ref[...] = s_ref[pl.ds(rows - 8, 8), :] + 1.0
    pl.run_scoped(body, pltpu.VMEM((rows, 1024), jnp.float32))
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 1024), F32))(_arange((8, 1024), F32))


@pytest.mark.parametrize("probe, mib", [("vmem_run_scoped_20MiB_default", 20),
                                        ("vmem_run_scoped_100MiB_default", 100)])
def test_run_scoped_vmem_counts_against_the_whole_vmem_not_the_scoped_limit(probe, mib):
  # chip: 20 and 100 MiB of run_scoped VMEM compile under the 16 MiB default scoped limit, 20 MiB of
  # pipelined blocks do not ("Scoped allocation with size 20.00M and limit 16.00M exceeded")
  assert _expect(probe) and not _expect("vmem_blocks_20MiB_default", "limit 16.00M exceeded")
  np.testing.assert_array_equal(_run_scoped(mib), _arange((8, 1024), F32) + 1)
  with pytest.raises(pl.ResourceError, match=r"run_scoped\[0\] needs 130\.00 MiB but 64\.00 KiB of the "
                                             r"127\.93 MiB of VMEM on v5e .*Fix: reduce scratch, run_scoped"):
    _run_scoped(130)
  x = np.ones((2560, 1024), F32)   # 20 MiB of double-buffered blocks: over the scoped limit
  with pytest.raises(pl.ResourceError, match=r"20\.00 MiB of pipelined blocks requested"):
    _copy(x, (1280, 1024))


# ------------------------------------------------------------------ gathers
def test_take_along_axis_gathers_along_the_minor_dims_only():
  assert _expect("gather_take_along_lanes") and not _expect("gather_rows_take")
  x = np.arange(8 * 128, dtype=F32).reshape(8, 128)
  idx = ((np.arange(8 * 128) * 37) % 128).astype(I32).reshape(8, 128)
  out = _whole(lambda a, i: jnp.take_along_axis(a, i, axis=-1), x, idx)
  np.testing.assert_array_equal(out, np.take_along_axis(x, idx, axis=-1))
  # indices longer than the value along the gather axis: the result has their shape (JAX's own
  # tpu_ops_test test_dynamic_gather_along_axis gathers 32 rows from an 8-row value)
  rows = ((np.arange(32 * 128) * 5) % 8).astype(I32).reshape(32, 128)

  def longer(x_ref, i_ref, o_ref):
    o_ref[...] = jnp.take_along_axis(x_ref[...], i_ref[...], axis=-2)
  got = pl.pallas_call(longer, out_shape=pl.ShapeDtypeStruct((32, 128), F32))(x, rows)
  np.testing.assert_array_equal(got, np.take_along_axis(x, rows, axis=-2))
  x3 = np.zeros((2, 8, 128), F32)
  with pytest.raises(pl.UnsupportedError, match=r"take_along_axis along axis 0 of a rank-3 value .*only "
                                                r"along the two minor dims"):
    _whole(lambda a, i: jnp.take_along_axis(a, i, axis=0), x3, np.zeros((2, 8, 128), I32))
