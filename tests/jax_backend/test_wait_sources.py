"""A local DMA wait's source window is dead code on the chip (palace/_src/jax/wait_sources.py): a kernel
that rebuilds each page copy's descriptor, page number read from SMEM, to wait on it (as the jax wheel's
paged attention does) is modelled as one that waits on the copies it started."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace as ppl
import palace.jax as pj
from palace._src.jax import wait_sources

PAGES, ROWS, N = 16, 8, 4   # a table of 16 (8, 128) pages; 4 of them gathered


def _gather(rebuild: bool, mismatched: bool = False):
  def kernel(idx_ref, pages_hbm, o_ref, buf, sem):
    copies = [pltpu.make_async_copy(pages_hbm.at[idx_ref[j]], buf.at[j], sem.at[0]) for j in range(N)]
    for cp in copies:
      cp.start()
    for j, cp in enumerate(copies):
      if rebuild:   # (a descriptor built again: its page number loaded from SMEM again)
        src = pages_hbm.at[idx_ref[j] * 1 + 0]
        if mismatched:
          src = pages_hbm.at[idx_ref[j], pl.ds(0, ROWS // 2)]
        pltpu.make_async_copy(src, buf.at[j], sem.at[0]).wait()
      else:
        cp.wait()
    o_ref[...] = buf[...].sum(axis=0)

  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
          out_specs=pl.BlockSpec((ROWS, 128), lambda i, idx: (0, 0)),
          scratch_shapes=[pltpu.VMEM((N, ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))]))


def _operands():
  rng = np.random.default_rng(3)
  idx = jnp.asarray(rng.permutation(PAGES)[:N].astype(np.int32))
  # (small integers: their f32 sums are exact in any order)
  pages = jnp.asarray(rng.integers(-64, 64, (PAGES, ROWS, 128)).astype(np.float32))
  return idx, pages


def _run(rebuild):
  idx, pages = _operands()
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.block_until_ready(_gather(rebuild)(idx, pages)))
  np.testing.assert_array_equal(out, np.asarray(pages)[np.asarray(idx)].sum(axis=0))
  return tpu.reports[0]


def test_a_rebuilt_wait_descriptor_costs_what_waiting_the_started_copy_costs():
  rebuilt, started = _run(True), _run(False)
  assert rebuilt.device_cycles == started.device_cycles
  assert rebuilt.unit_busy_cycles == started.unit_busy_cycles


def test_the_rewrite_drops_only_what_fed_the_waits_sources():
  idx, pages = _operands()
  jaxpr = jax.make_jaxpr(_gather(True))(idx, pages).jaxpr
  call = next(e for e in jaxpr.eqns if e.primitive.name == "pallas_call")
  kernel = call.params["jaxpr"]
  dropped = wait_sources.wait_sources_dropped(kernel)
  names = lambda j: [e.primitive.name for e in j.eqns]   # noqa: E731
  # the N starts' page-number loads stay; the N waits' own loads and their `* 1 + 0` arithmetic go
  assert names(kernel).count("get") - names(dropped).count("get") == N
  assert names(dropped).count("dma_wait") == names(kernel).count("dma_wait") == N
  assert names(dropped).count("dma_start") == N
  for e in dropped.eqns:
    if e.primitive.name == "dma_wait":
      src, dst, *_ = e.params["tree"].unflatten(list(e.invars))
      assert wait_sources._same(src, dst)
  assert wait_sources.wait_sources_dropped(dropped) is dropped   # (nothing more to drop)


def test_a_wait_whose_sides_differ_keeps_its_source_and_is_rejected():
  idx, pages = _operands()
  with pytest.raises(ppl.ShapeError,
                     match=r"DMA shapes differ: args\[1\]\[\d+, 0:4, 0:128\] has shape \(4, 128\) but "
                           r"scratch\[0\]\[\d+, 0:8, 0:128\] has shape \(8, 128\).*Fix: slice both"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(_gather(True, mismatched=True)(idx, pages))
