"""SparseCore sort and masked scans under palace.jax (registry entries masked_sort, sort, masked_cumsum,
masked_cummax), against NumPy references written from JAX's definitions (its SparseCore tests:
masked-off entries sort last in their original order; a masked running max keeps a lane's own value
before the first unmasked lane)."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import palace.jax as pj

N = 16   # lanes of a 7x vector subcore


def _run(body, n_out, *args):
  mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)
  dt = [a.dtype for a in args][:1] * n_out

  @pl.kernel(out_type=tuple(jax.ShapeDtypeStruct((N,), d) for d in dt), mesh=mesh,
             compiler_params=pltpu.CompilerParams(needs_layout_passes=False))
  def k(*refs):
    ins, outs = refs[:len(args)], refs[len(args):]

    def scoped(*bufs):
      vin, vout = bufs[:len(args)], bufs[len(args):]
      for h, v in zip(ins, vin):
        pltpu.sync_copy(h, v)
      res = body(*[v[...] for v in vin])
      for v, r in zip(vout, res):
        v[...] = r
      for v, h in zip(vout, outs):
        pltpu.sync_copy(v, h)
    pl.run_scoped(scoped, *[pltpu.VMEM((N,), a.dtype) for a in args],
                  *[pltpu.VMEM((N,), d) for d in dt])
  return [np.asarray(o) for o in k(*args)]


@pytest.mark.parametrize("descending", [False, True])
def test_masked_sort_key_val_puts_masked_entries_last_in_order(descending):
  rng = np.random.default_rng(0)
  keys = rng.permutation(N).astype(np.int32) - 8
  keys[3] = keys[1]
  vals = rng.permutation(N).astype(np.int32)
  mask = rng.random(N) < 0.5
  with pj.virtual_tpu("7x"):
    ok, ov, om = _run(lambda k, v, m: [x.astype(jnp.int32) for x in
                                       plsc.sort_key_val(k, v, mask=m != 0, descending=descending)],
                      3, keys, vals, mask.astype(np.int32))
  arg = -keys.astype(np.int64) if descending else keys.astype(np.int64)
  order = np.argsort(np.where(mask, arg, arg.max() + 1), kind="stable")
  np.testing.assert_array_equal(ok, keys[order])
  np.testing.assert_array_equal(ov, vals[order])
  np.testing.assert_array_equal(om, (np.arange(N) < mask.sum()).astype(np.int32))


def test_lax_sort_on_a_subcore_sorts_values_by_keys():
  rng = np.random.default_rng(1)
  keys = rng.permutation(N).astype(np.int32)
  vals = (rng.permutation(N) * 3).astype(np.int32)
  with pj.virtual_tpu("7x"):
    ok, ov = _run(lambda k, v: lax.sort((k, v), num_keys=1), 2, keys, vals)
  order = np.argsort(keys, kind="stable")
  np.testing.assert_array_equal(ok, keys[order])
  np.testing.assert_array_equal(ov, vals[order])


def test_masked_scans():
  x = np.random.default_rng(2).permutation(N).astype(np.int32)
  m = (x % 2) == 1
  with pj.virtual_tpu("7x"):
    cs, cm = _run(lambda v: [plsc.cumsum(v, mask=v % 2 == 1), plsc.cummax(v, mask=v % 2 == 1)], 2, x)
  np.testing.assert_array_equal(cs, np.cumsum(np.where(m, x, 0)))
  run = np.maximum.accumulate(np.where(m, x, np.iinfo(np.int32).min))
  np.testing.assert_array_equal(cm, np.where(np.cumsum(m) > 0, run, x))
