"""Resource limits like the hardware's: HBM per device (checked before any host memory is allocated, in
timing_only too), semaphores per core, the largest pod, huge grids."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src import hw, validate

from errcheck import raises

GiB = 2**30


def _noop(*refs, **kw):
  pass


def _hbm_out(shape, dtype=jnp.float32):
  return pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct(shape, dtype),
                        out_specs=pl.BlockSpec(memory_space=pl.ANY))


@pytest.mark.parametrize("timing_only", [False, True])
@pytest.mark.parametrize("chip,gib", [("v4", 40), ("v5e", 100), ("v5p", 120), ("v6e", 40), ("7x", 200)])
def test_huge_output_is_rejected_before_allocation(chip, gib, timing_only):
  # 100 GiB on v5e used to allocate host memory (MemoryError from NumPy, or swapping)
  with pl.virtual_tpu(chip, timing_only=timing_only):
    msg = raises(lambda: _hbm_out((gib * GiB // 4,))(), pl.ResourceError,
                 rf"HBM over capacity for kernel '_noop' on {chip}: outputs\[0\] alone is {gib}\.00 GiB")
  assert f"{hw.get_chip(chip).hbm_bytes_per_device:,} bytes" in msg


@pytest.mark.parametrize("dtype,n", [(jnp.bfloat16, 9 * GiB), (jnp.int8, 17 * GiB), (jnp.int32, 5 * GiB)])
def test_output_size_counts_the_dtype(dtype, n):
  raises(lambda: _hbm_out((n,), dtype)(), pl.ResourceError, r"outputs\[0\] alone is")


def test_outputs_that_fit_alone_but_not_together():
  f = pl.pallas_call(_noop, out_shape=[pl.ShapeDtypeStruct((3 * GiB,), jnp.float32)] * 2,
                     out_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2)
  raises(f, pl.ResourceError, r"2 HBM operands total 24\.00 GiB", "shard it over chips")


def test_hbm_scratch_counts():
  f = pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32),
                     scratch_shapes=[pltpu.HBM((5 * GiB,), jnp.float32)])
  raises(f, pl.ResourceError, r"scratch\[0\] alone is 20\.00 GiB")


def test_hbm_scratch_any_space_counts():
  f = pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32),
                     scratch_shapes=[pl.ANY((5 * GiB,), jnp.float32)])
  raises(f, pl.ResourceError, r"scratch\[0\] alone is 20\.00 GiB")


def test_pl_kernel_out_type_huge():
  f = pl.kernel(_noop, out_type=pl.ShapeDtypeStruct((100 * GiB // 4,), jnp.float32),
                mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  raises(f, pl.ResourceError, r"HBM over capacity for kernel '_noop'.*outputs\[0\] alone is 100\.00 GiB")


def test_pl_kernel_timing_only_huge():
  f = pl.kernel(_noop, out_type=[pl.ShapeDtypeStruct((3 * GiB,), jnp.float32)] * 3,
                mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  with pl.virtual_tpu("v6e", timing_only=True):   # 3 x 12 GiB > 32 GiB
    raises(f, pl.ResourceError, r"on v6e: outputs\[\d\] alone is 12\.00 GiB.*total 36\.00 GiB")


def test_input_plus_output_over_capacity():
  x = np.broadcast_to(np.float32(0), (3 * GiB,))   # 12 GiB input that occupies no host memory
  f = pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct((2 * GiB,), jnp.float32),
                     in_specs=[pl.BlockSpec(memory_space=pl.ANY)], out_specs=pl.BlockSpec(memory_space=pl.ANY))
  raises(lambda: f(x), pl.ResourceError, r"args\[0\] alone is 12\.00 GiB.*total 20\.00 GiB")


def test_fits_on_v5p_not_on_v5e():
  from palace._src.launch.host import check_hbm
  outs = {"outputs[0]": ((5 * GiB,), np.float32, pl.ANY)}   # 20 GiB
  with pl.virtual_tpu("v5p", timing_only=True):
    check_hbm("k", {}, outs, ())   # 95 GiB of HBM: fits (not run: it would allocate 20 GiB here)
  with pl.virtual_tpu("v5e", timing_only=True):
    raises(lambda: check_hbm("k", {}, outs, ()), pl.ResourceError, "20.00 GiB")


# ------------------------------------------------------------------ semaphores
# v5e (the default chip): 512 per core, measured (benchmarks/hw/data/v5e-limits-2026-12-05.jsonl: 1024
# DMA semaphores fail with "Allocation (size=4096) would exceed memory (size=2048) ... space=sflag")
@pytest.mark.parametrize("kind,n", [("DMA", 100_000), ("REGULAR", 5000), ("DMA", 513), ("REGULAR", 2**20)])
def test_too_many_semaphores_in_scratch(kind, n):
  t = getattr(pltpu.SemaphoreType, kind)((n,))
  f = pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32), scratch_shapes=[t])
  raises(f, pl.ResourceError, rf"Semaphores over capacity for scratch\[0\].*{n} requested "
         rf"{kind.lower()} semaphores > 512 per core on v5e", "Fix: reuse semaphores")


def test_semaphores_add_up():
  f = pl.pallas_call(_noop, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32),
                     scratch_shapes=[pltpu.SemaphoreType.DMA((300,)), pltpu.SemaphoreType.REGULAR((10, 30))])
  raises(f, pl.ResourceError, r"scratch\[1\].*300 in use \+ 300 requested")


def test_semaphores_in_run_scoped():
  def k(x, o):
    pl.run_scoped(lambda s: None, pltpu.SemaphoreType.DMA((10_000,)))
  f = pl.kernel(k, out_type=pl.ShapeDtypeStruct((8, 128), jnp.float32),
                mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  raises(lambda: f(np.ones((8, 128), np.float32)), pl.ResourceError, "run_scoped.*10000 requested")


def test_semaphores_at_the_limit_run():
  # v5e has 512 semaphores per core, of which the compiler keeps 19 (a TPU v5e rejects 500), and the
  # output block's pipeline takes one: 492 in scratch run, 493 do not
  def ones(o_ref, sems):
    o_ref[...] = jnp.ones((8, 128), jnp.float32)

  def call(n):
    return pl.pallas_call(ones, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32),
                          scratch_shapes=[pltpu.SemaphoreType.DMA((n,))])()

  np.testing.assert_array_equal(call(492), np.ones((8, 128), np.float32))
  raises(lambda: call(493), pl.ResourceError, r"493 in use \+ 1 requested dma semaphores > 512 per core "
         r"on v5e less 19 the compiler keeps \(493 usable")


# ------------------------------------------------------------------ pod size
@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_num_chips_beyond_the_largest_pod(chip):
  # num_chips=2**20 used to hang in the topology search
  pod = hw.get_chip(chip).max_pod_devices
  raises(lambda: pl.virtual_tpu(chip, 2**20), pl.UsageError,
         rf"num_chips=1048576\): the largest {chip} pod \(ICI domain\) has {pod} devices",
         f"num_chips <= {pod}")


@pytest.mark.parametrize("chip,n", [("v5e", 257), ("v6e", 1000), ("v4", 4097), ("v5p", 8961), ("7x", 18433)])
def test_num_chips_one_over_the_pod(chip, n):
  raises(lambda: pl.virtual_tpu(chip, n), pl.UsageError, rf"num_chips={n}\)")


@pytest.mark.parametrize("chip,n,shape", [("v4", 4096, (16, 16, 16)), ("v5e", 256, (16, 16)),
                                          ("v5p", 8960, (28, 20, 16)), ("7x", 18432, (32, 24, 24))])
def test_the_largest_pods_are_quick_to_lay_out(chip, n, shape):
  tpu = pl.virtual_tpu(chip, n)
  from palace._src.sim.ici import Topology
  assert Topology(tpu.chip, n).shape == shape


def test_pod_sizes_have_sources():
  for c in hw.CHIPS.values():
    assert "Pod / largest ICI domain" in c.sources["max_pod_devices"]
    assert c.sources["semaphores_per_core"]


# ------------------------------------------------------------------ grids
def _copy(x_ref, o_ref):
  o_ref[...] = x_ref[...]


def _grid_call(grid):
  spec = pl.BlockSpec((8, 128), lambda *idx: (0, 0))
  return pl.pallas_call(_copy, out_shape=pl.ShapeDtypeStruct((8, 128), jnp.float32), grid=grid,
                        in_specs=[spec], out_specs=spec)


@pytest.mark.parametrize("grid,cls,why", [
    ((2**31,), pl.UsageError, r"\[0\] = 2147483648 exceeds the int32 grid index range"),
    ((1, 2**40), pl.UsageError, r"\[1\] = 1099511627776 exceeds the int32"),
    ((2**23,), pl.ResourceError, "has 8,388,608 grid points"),
    ((2**12, 2**12), pl.ResourceError, "has 16,777,216 grid points"),
    ((2**11, 2**11, 2), pl.ResourceError, "has 8,388,608 grid points"),
    ((2**31 - 1,), pl.ResourceError, "has 2,147,483,647 grid points"),
])
def test_huge_grids_are_rejected_without_building_them(grid, cls, why):
  # grid=(2**31,) used to build a list of every point (gigabytes) before running
  raises(lambda: _grid_call(grid)(np.ones((8, 128), np.float32)), cls,
         r"grid of pallas_call '_copy'.*" + why, "Fix: use larger blocks")


def test_grid_limit_is_documented():
  assert validate.MAX_GRID_POINTS == 2**22
  assert "MAX_GRID_POINTS" in open(validate.__file__).read()


# Host refs (pl.new_ref / pl.empty_ref) are HBM buffers of one device: checked before host memory is
# allocated, with the message of pallas_call outputs.
@pytest.mark.parametrize("chip", ["v4", "v5e", "v6e"])
def test_empty_ref_over_hbm(chip):
  cap = hw.get_chip(chip).hbm_bytes_per_device
  n = cap // 4 + 1   # one float32 more than one device's HBM
  with pl.virtual_tpu(chip):
    msg = raises(lambda: pl.empty_ref(pl.ShapeDtypeStruct((n,), jnp.float32)), pl.ResourceError,
                 rf"HBM over capacity for pl\.empty_ref on {chip}: ref\(float32\[{n}\]\) is ", "Fix: shrink ref")
  assert f"{cap:,} bytes" in msg


def test_empty_ref_default_chip_over_hbm():
  raises(lambda: pl.empty_ref(pl.ShapeDtypeStruct((2**40,), jnp.int8)), pl.ResourceError,
         r"HBM over capacity for pl\.empty_ref on v5e: ref\(int8\[1099511627776\]\) is 1024\.00 GiB")


def test_new_ref_over_hbm_before_the_copy():
  big = np.broadcast_to(np.float32(1), (17 * 2**28,))   # 17 GiB as a strides-0 view: nothing allocated
  with pl.virtual_tpu("v5e"):   # 17.2e9 bytes of HBM
    raises(lambda: pl.new_ref(big), pl.ResourceError, r"HBM over capacity for pl\.new_ref on v5e: "
           r"ref\(float32\[4563402752\]\) is 17\.00 GiB, but one v5e device has 16\.02 GiB")


def test_host_refs_that_fit_still_work():
  with pl.virtual_tpu("v5e"):
    r = pl.empty_ref(pl.ShapeDtypeStruct((8, 128), jnp.float32))
    assert np.isnan(pl.freeze(r)).all()
    r = pl.new_ref(np.arange(8 * 128, dtype=np.int32).reshape(8, 128))
    np.testing.assert_array_equal(pl.freeze(r), np.arange(8 * 128).reshape(8, 128))
