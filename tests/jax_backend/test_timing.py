"""palace.jax.device_time and the modelled timers run the timed call without data (timing-only: the
same modelled cycles) unless something of the call outlives it; then with data, and nothing wrong is
left behind."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace as ppl
import palace.jax as pj
from palace._src.jax import timing
from prefetch_kernels import skip_matmul


def _mm_kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(2) == nsteps - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


@functools.partial(jax.jit, static_argnames=["bm", "bk", "bn"])
def matmul(x, y, bm=128, bk=128, bn=128):
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      functools.partial(_mm_kernel, nsteps=k // bk), grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)


def _flags_kernel(x_ref, o_ref):
  o_ref[...] = (x_ref[...] > 0).astype(jnp.int32)


def flags_of(x):
  return pl.pallas_call(_flags_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))(x)


X = jnp.asarray(np.random.default_rng(0).standard_normal((512, 512)), jnp.bfloat16)
FLAGS = jnp.array([1, 0, 1, 1], jnp.int32)
XS = jnp.asarray(np.random.default_rng(1).standard_normal((512, 128)), jnp.float32)


@pytest.mark.parametrize("blocks", [(128, 128, 128), (256, 512, 256)])
def test_a_timed_call_runs_without_data_and_models_the_same_cycles(blocks):
  bm, bk, bn = blocks
  f = functools.partial(matmul, bm=bm, bk=bk, bn=bn)
  with pj.virtual_tpu("v5e") as tpu:
    with_data = pj.device_time(f, X, X, timing_only=False)
    without = pj.device_time(f, X, X)
  assert with_data.with_data and not without.with_data
  assert [r.timing_only for r in tpu.reports] == [False, True]
  assert without.device_cycles == with_data.device_cycles > 0
  assert without.total_time_s == with_data.total_time_s
  assert not tpu.timing_only   # the scoped override is gone


def test_scalar_prefetch_steers_the_timing_only_run_as_the_full_one():
  a = pj.device_time(skip_matmul, FLAGS, XS, timing_only=False)
  b = pj.device_time(skip_matmul, FLAGS, XS)
  c = pj.device_time(skip_matmul, jnp.zeros(4, jnp.int32), XS)
  assert not b.with_data and b.device_cycles == a.device_cycles
  # the flags really change the modelled time: no block computed is cheaper. (Not "every block computed
  # costs more": on v5e a light step's write-back starts while the next block's read streams, and the
  # engine serves it first, holding the read: flags 1, 0, 1, 1 model 6274 cycles, 1, 1, 1, 1 6205.)
  assert c.device_cycles < b.device_cycles


def test_a_launch_fed_by_an_earlier_launch_runs_with_data():
  chained = jax.jit(lambda x: skip_matmul(flags_of(x[:8])[0, :4], x))
  assert "earlier launch's output" in timing.needs_data(chained, XS)
  t = pj.device_time(chained, XS)
  assert t.with_data and t.launches == 2
  with pytest.raises(ppl.UsageError, match=r"timing_only=True\): the call must run with data, "
                                           r"because a later launch may take its control flow"):
    pj.device_time(chained, XS, timing_only=True)


def test_a_mutable_ref_written_by_the_timed_call_holds_the_right_values():
  ref = jax.new_ref(jnp.zeros((512, 512), jnp.bfloat16))

  @jax.jit
  def into_ref(x):
    ref[...] = matmul(x, x)
  assert timing.needs_data(into_ref, X) == "it has effects (WriteEffect)"
  t = pj.device_time(into_ref, X)
  assert t.with_data and t.launches == 1
  expect = np.asarray(X, np.float32) @ np.asarray(X, np.float32)
  np.testing.assert_allclose(np.asarray(ref[...], np.float32), expect, rtol=2e-2, atol=0.5)


def test_an_io_callback_sees_the_kernels_result():
  seen = []

  @jax.jit
  def f(x):
    y = matmul(x, x)
    io_callback(lambda v: seen.append(np.asarray(v, np.float32)), None, y)
    return y
  t = pj.device_time(f, X)
  assert t.with_data and len(seen) == 1 and np.isfinite(seen[0]).all()
  expect = np.asarray(X, np.float32) @ np.asarray(X, np.float32)
  np.testing.assert_allclose(seen[0], expect, rtol=2e-2, atol=0.5)


def test_donation_kernel_prints_and_untraceable_calls_run_with_data(capfd):
  assert timing.needs_data(jax.jit(matmul, donate_argnums=0), X, X) == "it donates buffers"

  def printing(x_ref, o_ref):
    pl.debug_print("first {}", x_ref[0, 0])
    o_ref[...] = x_ref[...]
  f = jax.jit(lambda x: pl.pallas_call(printing, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
  assert timing.needs_data(f, XS[:8]) == "a kernel prints (debug_print)"
  assert pj.device_time(f, XS[:8]).with_data
  untraceable = lambda: matmul(X, X).block_until_ready()  # noqa: E731  a method of a concrete array
  assert timing.needs_data(untraceable).startswith("it could not be traced")
  assert pj.device_time(untraceable).with_data


def test_earlier_asynchronous_launches_keep_their_data():
  with pj.virtual_tpu("v5e"):
    pending = [matmul(X, X + i) for i in range(3)]   # dispatched, maybe not run yet
    assert not pj.device_time(matmul, X, X).with_data
    results = [np.asarray(p, np.float32) for p in pending]
  for i, r in enumerate(results):
    expect = np.asarray(X, np.float32) @ np.asarray(X + i, np.float32)
    np.testing.assert_allclose(r, expect, rtol=2e-2, atol=0.5)


def test_pl_delay_moves_the_modelled_time_as_on_palaces_own_path():
  """JAX's `pl.delay(nanos)` (its interpret mode ignores it): the core sleeps, 1 us = 1500 v5e cycles,
  also with the duration read from a prefetched scalar."""
  x = np.ones((8, 128), np.float32)

  def kernel(n_ref, x_ref, o_ref):
    pl.delay(n_ref[0])
    pl.delay(1000)
    o_ref[...] = x_ref[...]
  spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                                      in_specs=[pl.BlockSpec((8, 128), lambda i, n: (0, 0))],
                                      out_specs=pl.BlockSpec((8, 128), lambda i, n: (0, 0)))
  f = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid_spec=spec))
  with pj.virtual_tpu("v5e") as tpu:
    np.testing.assert_array_equal(f(np.array([0], np.int32), x), x)
    np.testing.assert_array_equal(f(np.array([2000], np.int32), x), x)
  assert tpu.reports[1].device_cycles - tpu.reports[0].device_cycles == 3000
