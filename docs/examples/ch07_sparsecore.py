"""Chapter 7: SparseCore. v5p, v6e and 7x have SparseCores: many small vector subcores with their own
VMEM, made for gathers and scatters. Each subcore gathers its share of rows with one indexed DMA.
Run: python docs/examples/ch07_sparsecore.py
"""
import numpy as np

import palace as pl
import palace.lax as lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc

REQUIRES = ("palace.tpu_sc.VectorSubcoreMesh",)
PER_SUBCORE, WIDTH, ROWS = 8, 128, 4096


def gather_kernel(idx_hbm, table_hbm, out_hbm, idx_vmem, rows_vmem, sem):
  w = lax.axis_index(("core", "subcore"))             # this subcore's linear id
  pltpu.sync_copy(idx_hbm.at[pl.ds(w * PER_SUBCORE, PER_SUBCORE)], idx_vmem)
  pltpu.async_copy(table_hbm.at[idx_vmem], rows_vmem, sem).wait()   # indexed (gather) DMA
  pltpu.sync_copy(rows_vmem, out_hbm.at[pl.ds(w * PER_SUBCORE, PER_SUBCORE)])


def main(chip="v5p"):
  rng = np.random.default_rng(0)
  table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
  with pl.virtual_tpu(chip) as tpu:
    info = plsc.get_sparse_core_info()
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
    n = info.num_cores * info.num_subcores * PER_SUBCORE
    idx = rng.integers(0, ROWS, n).astype(np.int32)
    out = pl.kernel(gather_kernel, out_type=pl.ShapeDtypeStruct((n, WIDTH), np.float32), mesh=mesh,
                    scratch_types=[pltpu.VMEM((PER_SUBCORE,), np.int32),
                                   pltpu.VMEM((PER_SUBCORE, WIDTH), np.float32),
                                   pltpu.SemaphoreType.DMA])(idx, table)
  np.testing.assert_array_equal(out, table[idx])
  print(f"{info.num_cores} SparseCores x {info.num_subcores} subcores gathered {n} rows")
  print(tpu.reports[-1])


if __name__ == "__main__":
  main()
