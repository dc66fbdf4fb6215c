"""pl.HOST: pallas_call operands and outputs in the host's pinned memory, reached by DMA only, across
the chip's host link (ChipSpec.host_link_bytes_per_s_one_way each way, host_link_latency_ns)."""
import numpy as np
import pytest

import palace as pl
from palace import tpu as pltpu
from palace._src import hw


def _copy_call(rows, src_space, dst_space):
  def kernel(x_ref, o_ref, sem):
    pltpu.async_copy(x_ref, o_ref, sem).wait()
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((rows, 128), np.float32),
                        in_specs=[pl.BlockSpec(memory_space=src_space)],
                        out_specs=pl.BlockSpec(memory_space=dst_space),
                        scratch_shapes=[pltpu.SemaphoreType.DMA])


@pytest.mark.parametrize("src,dst,kind", [(pl.HOST, pl.ANY, "host->hbm"), (pl.ANY, pl.HOST, "hbm->host")])
def test_a_host_copy_moves_the_data_and_is_timed_on_the_host_link(src, dst, kind):
  chip = hw.CHIPS["v5e"]
  cycles = []
  for rows in (512, 1024):
    x = np.arange(rows * 128, dtype=np.float32).reshape(rows, 128)
    with pl.virtual_tpu("v5e") as tpu:
      out = _copy_call(rows, src, dst)(x)
    np.testing.assert_array_equal(np.asarray(out), x)
    report = tpu.reports[-1]
    assert report.dma_bytes_by_direction == {kind: x.nbytes}
    cycles.append(report.device_cycles)
  # 256 KiB more over the 16 GB/s link ([SB-tpus]): the link, not HBM (819 GB/s), sets the pace
  extra = 512 * 128 * 4 / chip.host_link_bytes_per_s_one_way * chip.clock_hz
  assert abs((cycles[1] - cycles[0]) - extra) <= 2, (cycles, extra)
  # and the first copy pays the link's latency (1 us, a modelling assumption) beside its bytes
  assert cycles[0] >= chip.ns_to_cycles(chip.host_link_latency_ns) + extra


def test_a_kernel_reads_host_memory_by_dma_only():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  call = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32),
                        in_specs=[pl.BlockSpec(memory_space=pl.HOST)])
  with pytest.raises(pl.MemorySpaceError, match=r"Load of args\[0\] \(host memory\).*by DMA only.*sync_copy"):
    with pl.virtual_tpu("v5e"):
      call(np.zeros((8, 128), np.float32))


def test_a_host_operand_is_not_windowed():
  call = pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32),
                        grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0), memory_space=pl.HOST)])
  with pytest.raises(pl.BlockSpecError, match=r"must equal the array shape \(16, 128\) for a pl.HOST operand"):
    with pl.virtual_tpu("v5e"):
      call(np.zeros((16, 128), np.float32))
