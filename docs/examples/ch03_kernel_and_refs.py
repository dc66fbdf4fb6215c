"""Chapter 3: pl.kernel and mutable refs. One body per core, operands stay in HBM, and a mutable ref
passed to a kernel is updated in place (no output, no copy). Run: python docs/examples/ch03_kernel_and_refs.py
"""
import functools

import numpy as np

import palace as pl
from palace import tpu as pltpu

REQUIRES = ("palace.new_ref", "palace.freeze", "palace.kernel")


@functools.partial(pl.kernel, mesh=pltpu.TensorCoreMesh("core", num_cores=1),
                   scratch_types=[pltpu.VMEM((8, 128), np.float32), pltpu.VMEM((8, 128), np.float32)])
def accumulate(x_hbm, acc_hbm, x_vmem, acc_vmem):
  """acc += x, where acc is a mutable ref that lives in HBM across calls."""
  pltpu.sync_copy(x_hbm, x_vmem)
  pltpu.sync_copy(acc_hbm, acc_vmem)
  acc_vmem[...] += x_vmem[...]
  pltpu.sync_copy(acc_vmem, acc_hbm)


def main():
  acc = pl.new_ref(np.zeros((8, 128), np.float32))
  with pl.virtual_tpu("v5e") as tpu:
    for step in range(3):
      accumulate(np.full((8, 128), step + 1, np.float32), acc)
  total = pl.freeze(acc)          # the final value; the ref is no longer usable
  np.testing.assert_array_equal(total, np.full((8, 128), 6.0, np.float32))
  print(f"after 3 launches acc = {total[0, 0]} everywhere; {len(tpu.reports)} reports, the last:")
  print(tpu.reports[-1])


if __name__ == "__main__":
  main()
