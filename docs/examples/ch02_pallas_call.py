"""Chapter 2: pallas_call. A grid of kernel invocations, BlockSpecs that say which block of each operand
each invocation sees, and the automatic double-buffered pipeline between HBM and VMEM.
Run: python docs/examples/ch02_pallas_call.py
"""
import numpy as np

import palace as pl

REQUIRES = ()


def add_kernel(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...]


def add(x, y, block_rows=256):
  rows, cols = x.shape
  spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))   # grid index -> block index
  return pl.pallas_call(add_kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype),
                        grid=(rows // block_rows,), in_specs=[spec, spec], out_specs=spec)(x, y)


def main():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2048, 512)).astype(np.float32)
  y = rng.standard_normal((2048, 512)).astype(np.float32)
  for block_rows in (64, 256, 1024):
    with pl.virtual_tpu("v5e") as tpu:
      out = add(x, y, block_rows)
    np.testing.assert_array_equal(out, x + y)
    r = tpu.reports[-1]
    print(f"block ({block_rows}, 512): {r.device_time_s * 1e6:7.1f} us, {r.grid_steps} grid steps, "
          f"{100 * r.hbm_fraction:.0f}% of HBM bandwidth, {r.bound}-bound")
  print(r)
  path = r.to_perfetto("add.trace.json")
  print(f"trace written to {path}: open it in https://ui.perfetto.dev")


if __name__ == "__main__":
  main()
