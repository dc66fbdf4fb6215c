"""Chapter 8: core meshes. Megacore chips (v4, v5p) have two TensorCores per device. pallas_call splits
a leading "parallel" grid axis across them; pl.kernel over a TensorCoreMesh runs one body per core, which
finds its share with lax.axis_index and can synchronise with pltpu.core_barrier.
Run: python docs/examples/ch08_core_meshes.py
"""
import functools

import numpy as np

import palace as pl
import palace.lax as lax
from palace import tpu as pltpu

REQUIRES = ("palace.tpu.TensorCoreMesh", "palace.tpu.core_barrier")
ROWS, COLS = 1024, 512


def double_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0


def main():
  x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
  # 1) pallas_call with a parallel grid axis: the two cores of a v5p each take half of the grid.
  spec = pl.BlockSpec((128, COLS), lambda i: (i, 0))
  for chip in ("v5e", "v5p"):
    with pl.virtual_tpu(chip) as tpu:
      out = pl.pallas_call(double_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
                           in_specs=[spec], out_specs=spec,
                           compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)
    np.testing.assert_array_equal(out, 2 * x)
    print(f"pallas_call on {chip} ({tpu.chip.num_tensorcores_per_device} TensorCore(s)): "
          f"{tpu.reports[-1].device_time_s * 1e6:.1f} us")

  # 2) pl.kernel over both cores: each core doubles its half, then they meet at a barrier.
  mesh = pltpu.TensorCoreMesh("core", num_cores=2)
  half = ROWS // 2

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype), mesh=mesh,
                     scratch_types=[pltpu.VMEM((half, COLS), np.float32), pltpu.SemaphoreType.REGULAR])
  def per_core(x_hbm, o_hbm, buf, sem):
    c = lax.axis_index("core")
    rows = pl.ds(c * half, half)
    pltpu.sync_copy(x_hbm.at[rows], buf)
    buf[...] = buf[...] * 2.0
    pltpu.sync_copy(buf, o_hbm.at[rows])
    pltpu.core_barrier(sem, core_axis_name="core")

  with pl.virtual_tpu("v5p") as tpu:
    out = per_core(x)
  np.testing.assert_array_equal(out, 2 * x)
  print(tpu.reports[-1])


if __name__ == "__main__":
  main()
