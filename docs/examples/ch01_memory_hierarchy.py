"""Chapter 1: the memory hierarchy. HBM is big and far, VMEM is where vectors are computed, SMEM holds
scalars; DMAs move data between them. Run: python docs/examples/ch01_memory_hierarchy.py
"""
import functools

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

REQUIRES = ()


def main():
  chip = pl.virtual_tpu("v5e").chip
  print(f"{chip.name}: HBM {chip.hbm_bytes_per_device / 1e9:.1f} GB at "
        f"{chip.hbm_bytes_per_s_per_device / 1e9:.0f} GB/s; VMEM {chip.vmem_bytes >> 20} MiB per TensorCore "
        f"({chip.default_scoped_vmem_bytes >> 20} MiB scoped by default); SMEM {chip.smem_bytes >> 10} KiB")

  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)

  # pl.kernel hands us HBM refs: we must DMA into VMEM before computing on the data.
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                     mesh=pltpu.TensorCoreMesh("core", num_cores=1),
                     scratch_types=[pltpu.VMEM(x.shape, x.dtype), pltpu.SMEM((1,), jnp.float32)])
  def scale(x_hbm, o_hbm, x_vmem, s_smem):
    s_smem[0] = 3.0                          # a scalar in SMEM
    pltpu.sync_copy(x_hbm, x_vmem)           # HBM -> VMEM (a DMA, waited)
    x_vmem[...] = x_vmem[...] * s_smem[0]    # vector load, multiply on the VPU, vector store
    pltpu.sync_copy(x_vmem, o_hbm)           # VMEM -> HBM

  with pl.virtual_tpu("v5e") as tpu:
    out = scale(x)
  np.testing.assert_array_equal(out, 3 * x)
  print(tpu.reports[-1])

  # Vector access to HBM does not exist on a TPU; palace says so.
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                     mesh=pltpu.TensorCoreMesh("core", num_cores=1))
  def wrong(x_hbm, o_hbm):
    o_hbm[...] = x_hbm[...]

  try:
    with pl.virtual_tpu("v5e"):
      wrong(x)
  except pl.MemorySpaceError as e:
    print(f"MemorySpaceError: {str(e).splitlines()[0][:120]}")

  # Blocks that do not fit the scoped VMEM are rejected before anything runs.
  big = np.zeros((2048, 2048), np.float32)
  try:
    with pl.virtual_tpu("v5e"):
      pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct(big.shape, big.dtype),
                     grid=(2,), in_specs=[pl.BlockSpec((1024, 2048), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((1024, 2048), lambda i: (i, 0)))(big)
  except pl.ResourceError as e:
    print(f"ResourceError: {str(e)[:120]}...")


if __name__ == "__main__":
  main()
