"""TensorCore meshes: one body per core, cross-core signalling, megacore pallas_call, deadlocks."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from matmul_kernel import matmul_kernel as _mm_kernel


def _halves_kernel(x_hbm, o_hbm):
  c = lax.axis_index("core")

  def body(buf):
    pltpu.sync_copy(x_hbm.at[pl.ds(c * 8, 8)], buf)
    buf[...] = buf[...] * 2 + c.astype(jnp.float32)
    pltpu.sync_copy(buf, o_hbm.at[pl.ds(c * 8, 8)])

  pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32))


def test_each_tensorcore_handles_its_half():
  x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
  f = pl.kernel(_halves_kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                mesh=pltpu.TensorCoreMesh("core", 2))
  with pl.virtual_tpu("v5p"):
    y = f(x)
  expected = x * 2
  expected[8:] += 1
  np.testing.assert_array_equal(y, expected)


def test_num_cores_defaults_to_chip_and_larger_is_an_error():
  x = np.zeros((16, 128), np.float32)
  f = pl.kernel(_halves_kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                mesh=pltpu.TensorCoreMesh("core"))
  with pl.virtual_tpu("v4") as tpu:
    f(x)
  assert len({e[0] for e in tpu.reports[-1].events}) == 2  # two cores show up in the trace
  g = pl.kernel(_halves_kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                mesh=pltpu.TensorCoreMesh("core", 2))
  with pl.virtual_tpu("v5e"), pytest.raises(pl.UsageError, match=r"v5e has 1 TensorCore"):
    g(x)


def test_cross_core_handoff_ordered_by_semaphore():
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(x.shape, x.dtype),
                     mesh=pltpu.TensorCoreMesh("core", 2),
                     scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.VMEM((8, 128), jnp.float32)])
  def handoff(x_hbm, o_hbm, sem, buf):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.sync_copy(x_hbm, buf)
      buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)
      pl.semaphore_signal(sem, 1, device_id={"core": 1})

    @pl.when(c == 1)
    def _():
      pl.semaphore_wait(sem, 1)
      pltpu.sync_copy(o_hbm, buf)
      buf[...] = buf[...] * 10
      pltpu.sync_copy(buf, o_hbm)

  with pl.virtual_tpu("v5p") as tpu:
    y = handoff(x)
  np.testing.assert_array_equal(y, (x + 1) * 10)
  # core 1 waits for core 0's signal, sent after core 0's last copy, then copies twice itself: its
  # timeline ends after core 0's
  ends = {}
  for (chip, core), unit, name, start, end, args in tpu.reports[-1].events:
    ends[core] = max(ends.get(core, 0), end)
  assert ends[1] > ends[0]


def test_deadlock_names_every_core():
  @functools.partial(pl.kernel, out_type=(), mesh=pltpu.TensorCoreMesh("core", 2),
                     scratch_types=[pltpu.SemaphoreType.REGULAR])
  def stuck(sem):
    pl.semaphore_wait(sem, 1)

  with pl.virtual_tpu("v5p"), pytest.raises(pl.SyncError) as e:
    stuck()
  msg = str(e.value)
  assert "Deadlock in kernel 'stuck'" in msg
  assert "chip 0 core 0 waits at test_tensorcore_mesh.py" in msg
  assert "chip 0 core 1 waits" in msg and "semaphore scratch[0]: needs 1, has 0" in msg


def test_core_barrier_and_run_on_first_core():
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 2),
                     scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.VMEM((8, 128), jnp.float32)])
  def k(o_hbm, sem, buf):
    @pltpu.run_on_first_core("core")
    def _():
      buf[...] = jnp.full((8, 128), 3.0, jnp.float32)
      pltpu.sync_copy(buf, o_hbm)

    pltpu.core_barrier(sem, core_axis_name="core")

    @pl.when(lax.axis_index("core") == 1)
    def _():
      pltpu.sync_copy(o_hbm, buf)
      buf[...] = buf[...] + 1
      pltpu.sync_copy(buf, o_hbm)

  with pl.virtual_tpu("v5p"):
    y = k()
  np.testing.assert_array_equal(y, np.full((8, 128), 4.0, np.float32))


def _mm(x, sem, b=256):
  m = x.shape[0]
  return pl.pallas_call(
      _mm_kernel, out_shape=pl.ShapeDtypeStruct((m, m), x.dtype), grid=(m // b, m // b, m // b),
      in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)), pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem))(x, x)


def test_megacore_parallel_is_identical_and_faster():
  x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
  times, outs = {}, {}
  for sem in [("parallel", "parallel", "arbitrary"), ("arbitrary",) * 3]:
    with pl.virtual_tpu("v5p") as tpu:
      outs[sem[0]] = _mm(x, sem)
    times[sem[0]] = tpu.reports[-1].device_time_s
  np.testing.assert_array_equal(outs["parallel"], outs["arbitrary"])
  xb = x.astype(jnp.bfloat16).astype(np.float32)   # the MXU's default precision (docs/numerics.md)
  np.testing.assert_allclose(outs["parallel"], xb @ xb, rtol=1e-4, atol=1e-3)
  assert times["parallel"] < 0.65 * times["arbitrary"]


def test_parallel_is_a_no_op_on_single_core_chips():
  x = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)
  t = {}
  for sem in [("parallel", "parallel", "arbitrary"), ("arbitrary",) * 3]:
    with pl.virtual_tpu("v5e") as tpu:
      _mm(x, sem)
    t[sem[0]] = tpu.reports[-1].device_cycles
  assert t["parallel"] == t["arbitrary"]
