"""Kernels shared by the tests of launch operands and results carried between launches
(test_semaphore_results.py, test_kernel_memory_spaces.py): JAX's async copy split over two pallas_calls
(tpu_pallas_async_test's make_async_copy), and a one-core pl.kernel runner."""
import numpy as np

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
DMA_SEM = pltpu.SemaphoreType.DMA(())


def _start(x_ref, _aliased, o_ref, sem):
  pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _done(x_ref, o_ref, sem, _aliased):
  pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def copy_start(x):
  """(x, (copy of x in flight, its semaphore)), the copy started in its own launch."""
  s = jax.ShapeDtypeStruct(x.shape, x.dtype)
  x, out, sem = pl.pallas_call(_start, out_shape=(s, s, DMA_SEM), in_specs=[ANY], out_specs=(ANY, ANY, SEM),
                               input_output_aliases={0: 0})(x)
  return x, (out, sem)


def copy_done(x, future):
  out, sem = future
  return pl.pallas_call(_done, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), in_specs=[ANY, ANY, SEM],
                        out_specs=ANY, input_output_aliases={1: 0})(x, out, sem)


def _x(shape=(256, 512), seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run_kernel(body):
  pl.kernel(body, out_type=(), mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1))()


def copy_between_kernels(src_ref, dst_ref, sem, wait_sem=None):
  """JAX's stateful async copy: one pl.kernel starts a copy of `src_ref` into `dst_ref` on the
  semaphore ref `sem`, a later one waits for it on `wait_sem` (default: `sem`)."""
  @_run_kernel
  def _():
    pltpu.make_async_copy(src_ref, dst_ref, sem).start()

  @_run_kernel
  def _():
    pltpu.make_async_copy(src_ref, dst_ref, sem if wait_sem is None else wait_sem).wait()
