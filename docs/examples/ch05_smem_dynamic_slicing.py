"""Chapter 5: SMEM and dynamic slicing. Scalar-prefetch operands land in SMEM before the grid runs; index
maps and the kernel read them to choose *which* data to touch: here a ragged gather of row groups at
arbitrary offsets. Run: python docs/examples/ch05_smem_dynamic_slicing.py
"""
import numpy as np

import palace as pl
import palace.lax as lax
import palace.numpy as jnp
from palace import tpu as pltpu

REQUIRES = ("palace.tpu.PrefetchScalarGridSpec", "palace.Element")
ROWS, WIDTH, GROUPS, BLOCK = 1024, 128, 16, 16


def ragged_gather_kernel(starts_ref, lens_ref, table_ref, o_ref):
  n = lens_ref[pl.program_id(0)]                     # a scalar read from SMEM
  rows = lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
  o_ref[...] = jnp.where(rows < n, table_ref[...], 0.0)


def ragged_gather(starts, lens, table):
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2, grid=(GROUPS,),
      # pl.Element: the index map returns an element offset (any row), not a block index
      in_specs=[pl.BlockSpec((pl.Element(BLOCK), WIDTH), lambda g, starts, lens: (starts[g], 0))],
      out_specs=pl.BlockSpec((BLOCK, WIDTH), lambda g, starts, lens: (g, 0)))
  return pl.pallas_call(ragged_gather_kernel, grid_spec=grid_spec,
                        out_shape=pl.ShapeDtypeStruct((GROUPS * BLOCK, WIDTH), table.dtype))(
                            starts, lens, table)


def window_sum_kernel(offs_ref, x_ref, o_ref):
  """Dynamic slicing of a VMEM block with a scalar from SMEM: o = x[off : off + 8] * 2."""
  off = offs_ref[pl.program_id(0)]
  o_ref[...] = x_ref[pl.ds(pl.multiple_of(off, 8), 8), :] * 2.0


def main():
  rng = np.random.default_rng(0)
  table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
  starts = rng.integers(0, ROWS - BLOCK, GROUPS).astype(np.int32)
  lens = rng.integers(1, BLOCK + 1, GROUPS).astype(np.int32)
  with pl.virtual_tpu("v5e") as tpu:
    out = ragged_gather(starts, lens, table)
  want = np.zeros_like(out)
  for g in range(GROUPS):
    want[g * BLOCK:g * BLOCK + lens[g]] = table[starts[g]:starts[g] + lens[g]]
  np.testing.assert_array_equal(out, want)
  print(tpu.reports[-1])

  offs = np.array([0, 64, 8, 120], np.int32)
  gs = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(4,),
                                    in_specs=[pl.BlockSpec((128, WIDTH), lambda i, offs: (0, 0))],
                                    out_specs=pl.BlockSpec((8, WIDTH), lambda i, offs: (i, 0)))
  with pl.virtual_tpu("v5e"):
    win = pl.pallas_call(window_sum_kernel, grid_spec=gs,
                         out_shape=pl.ShapeDtypeStruct((32, WIDTH), np.float32))(offs, table[:128])
  np.testing.assert_array_equal(win, np.concatenate([table[o:o + 8] * 2 for o in offs]))
  print("dynamic VMEM windows at offsets", offs.tolist(), "match NumPy")


if __name__ == "__main__":
  main()
