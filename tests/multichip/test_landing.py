"""Multi-chip: a remote copy's data lands in the receiver at its completion on the modelled clock
(sim/dma.py `land_due`), not when the sender issues it in the order palace runs the chips.

The reference is the chip: a receiver's own accesses before the arrival (its zeroing store, a read)
happen before the data is there, those after it find the data; JAX's
test_interpret_remote_dma_asymmetrical_indexer is the first kernel here.
"""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

ROWS = 8


def _x(n):
  return np.arange(n * ROWS * 128, dtype=np.float32).reshape(n * ROWS, 128) + 1


def _zero_then_send(n):
  """JAX's test_interpret_remote_dma_asymmetrical_indexer: each chip zeroes its (2, 8, 128) output,
  then copies its input into half 1 (even chips) or half 0 (odd chips) of the next chip's output."""
  def per_chip(xs):
    @functools.partial(pl.pallas_call, out_shape=pl.ShapeDtypeStruct((2, ROWS, 128), np.float32),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                       out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                       scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def kernel(x_ref, o_ref, send, recv):
      o_ref[...] = jnp.zeros_like(o_ref[...])
      me = lax.axis_index("x")
      odd = lax.rem(me, 2)
      for half, when in ((1, odd == 0), (0, odd == 1)):
        @pl.when(when)
        def _():
          copy = pltpu.make_async_remote_copy(x_ref, o_ref.at[half], send, recv,
                                              device_id={"x": lax.rem(me + 1, n)})
          copy.start()
          copy.wait()
    return kernel(xs)
  return per_chip


def _zero_then_send_reference(n):
  """The chip's answer: the zeroing precedes the neighbour's copy by microseconds."""
  x = _x(n).reshape(n, ROWS, 128)
  out = np.zeros((n, 2, ROWS, 128), np.float32)
  for i in range(n):
    out[(i + 1) % n, 1 if i % 2 == 0 else 0] = x[i]
  return out.reshape(n * 2, ROWS, 128)


def _run(per_chip, n, policy="eager"):
  with pl.virtual_tpu("v5e", num_chips=n, dma_policy=policy) as tpu:
    out = pl.shard_map(per_chip, mesh=pl.make_mesh((n,), ("x",)), in_specs=pl.P("x"),
                       out_specs=pl.P("x"))(_x(n))
  (report,) = tpu.reports
  return out, report


@pytest.mark.parametrize("n", [2, 4])
def test_a_zeroed_output_keeps_the_copy_that_lands_after_it(n):
  out, report = _run(_zero_then_send(n), n)
  np.testing.assert_array_equal(np.asarray(out), _zero_then_send_reference(n))
  # the data's landing moves no modelled time: the same cycles as when it moves at the waits
  assert report.device_cycles == _run(_zero_then_send(n), n, "on_wait")[1].device_cycles


def test_the_landing_is_deterministic():
  runs = [_run(_zero_then_send(4), 4) for _ in range(2)]
  np.testing.assert_array_equal(np.asarray(runs[0][0]), np.asarray(runs[1][0]))
  assert runs[0][1].device_cycles == runs[1][1].device_cycles
  assert len(runs[0][1].events) == len(runs[1][1].events)


def _read_while_in_flight(n, delay_ns):
  """Each chip fills its output with -1, starts a copy of its input into the next chip's output,
  sleeps `delay_ns`, reads its own output (outputs[1]: what it saw) and only then waits."""
  def per_chip(xs):
    shape = pl.ShapeDtypeStruct((ROWS, 128), np.float32)

    @functools.partial(pl.pallas_call, out_shape=(shape, shape),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                       out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM),) * 2,
                       scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def kernel(x_ref, o_ref, seen_ref, send, recv):
      o_ref[...] = jnp.full_like(o_ref[...], -1.0)
      copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv,
                                          device_id={"x": lax.rem(lax.axis_index("x") + 1, n)})
      copy.start()
      if delay_ns:
        pl.delay(delay_ns)
      seen_ref[...] = o_ref[...]
      copy.wait()
    return kernel(xs)
  return per_chip


@pytest.mark.parametrize("n", [2, 4])
def test_a_read_before_the_arrival_sees_the_old_data_and_one_after_it_the_copy(n):
  x = _x(n).reshape(n, ROWS, 128)
  sent = np.roll(x, 1, axis=0).reshape(n * ROWS, 128)   # chip i receives chip i - 1's input
  (out, seen), report = _run(_read_while_in_flight(n, 0), n)
  np.testing.assert_array_equal(np.asarray(out), sent)
  np.testing.assert_array_equal(np.asarray(seen), np.full_like(sent, -1.0))   # read at issue + a few cycles
  # 20 us later the copy (4 KiB over one ICI hop, about a microsecond) has landed: the read finds it
  assert 1e9 * report.device_cycles / report.chip.clock_hz < 20_000   # (the whole kernel took less)
  (out, seen), _ = _run(_read_while_in_flight(n, 20_000), n)
  np.testing.assert_array_equal(np.asarray(out), sent)
  np.testing.assert_array_equal(np.asarray(seen), sent)


def test_a_source_written_after_its_send_completed_still_lands_as_it_was_sent():
  """The sender may reuse its source once .wait_send() returns; the copy lands later with the data it
  read (copy on write of the held source, memory.snapshot)."""
  n = 2

  def per_chip(xs):
    @functools.partial(pl.pallas_call, out_shape=pl.ShapeDtypeStruct((ROWS, 128), np.float32),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                       out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                       scratch_shapes=[pltpu.VMEM((ROWS, 128), np.float32), pltpu.SemaphoreType.DMA,
                                       pltpu.SemaphoreType.DMA])
    def kernel(x_ref, o_ref, buf, send, recv):
      buf[...] = x_ref[...]
      o_ref[...] = jnp.zeros_like(o_ref[...])
      copy = pltpu.make_async_remote_copy(buf, o_ref, send, recv,
                                          device_id={"x": lax.rem(lax.axis_index("x") + 1, n)})
      copy.start()
      copy.wait_send()
      buf[...] = jnp.full_like(buf[...], -5.0)
      copy.wait_recv()
    return kernel(xs)

  out, _ = _run(per_chip, n)
  np.testing.assert_array_equal(np.asarray(out), np.roll(_x(n).reshape(n, ROWS, 128), 1, axis=0)
                                .reshape(n * ROWS, 128))


def test_copies_into_one_place_land_in_the_order_they_complete():
  """Chip 1 copies 64 rows and chip 3 8 rows into rows 0:8 of chip 0's output; chip 1 issues first (in
  the order palace runs the chips) but its copy completes later: the chip's rows 0:8 are chip 1's."""
  n, big = 4, 64

  def per_chip(xs):
    @functools.partial(pl.pallas_call, out_shape=pl.ShapeDtypeStruct((big, 128), np.float32),
                       in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
                       out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                       scratch_shapes=[pltpu.SemaphoreType.DMA] * 4)
    def kernel(x_ref, o_ref, send1, recv1, send3, recv3):
      me = lax.axis_index("x")
      o_ref[...] = jnp.zeros_like(o_ref[...])

      @pl.when(me == 0)
      def _():
        pltpu.make_async_copy(x_ref, o_ref, recv1).wait()                     # chip 1's copy
        pltpu.make_async_copy(x_ref.at[0:8], o_ref.at[0:8], recv3).wait()     # chip 3's

      for chip, rows, send, recv in ((1, big, send1, recv1), (3, 8, send3, recv3)):
        @pl.when(me == chip)
        def _():
          copy = pltpu.make_async_remote_copy(x_ref.at[0:rows], o_ref.at[0:rows], send, recv,
                                              device_id={"x": 0})
          copy.start()
          copy.wait_send()
    return kernel(xs)

  x = np.arange(n * big * 128, dtype=np.float32).reshape(n * big, 128) + 1
  with pl.virtual_tpu("v5e", num_chips=n) as tpu:
    out = np.asarray(pl.shard_map(per_chip, mesh=pl.make_mesh((n,), ("x",)), in_specs=pl.P("x"),
                                  out_specs=pl.P("x"))(x))
  done = {e[0][0]: e[4] for e in tpu.reports[-1].events if e[1] == "ici"}   # sender chip -> completion
  assert done[1] > done[3]
  np.testing.assert_array_equal(out[:big], x[big:2 * big])   # chip 1's rows, landed last
