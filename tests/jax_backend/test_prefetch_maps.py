"""Index maps over scalar-prefetch tables (palace/_src/prefetch_maps.py): a map that reads only
prefetched tables the kernel never writes is evaluated on the core for its first step and once on the
host for the whole grid; every other step is charged its loads and scalar ops by replay. Each test
compares with the same launch with that mechanism off (every step's map evaluated on the core, as
before it): same outputs, same reports, events included."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj
from palace._src import prefetch_maps
from palace._src.jax import launch as jlaunch
from palace._src.jax.registry import sub_jaxprs

ROWS, COLS = 16, 2   # a (16 * 8, 2 * 128) array of (8, 128) blocks; the grid is (COLS, ROWS)


def _gather_kernel(ids_ref, off_ref, x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2.0 + ids_ref[pl.program_id(1)].astype(jnp.float32)


def _gather(ids, off, x, aliases=None, kernel=_gather_kernel):
  """Output block (i, j) = 2 * x block (ids[i] - off[0], j) + ids[i]: the input's index map reads both
  tables (a runtime element and a static one) and computes with them."""
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((ROWS * 8, COLS * 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(COLS, ROWS),
          in_specs=[pl.BlockSpec((8, 128), lambda j, i, ids, off: (ids[i] - off[0], j))],
          out_specs=pl.BlockSpec((8, 128), lambda j, i, ids, off: (i, j))),
      input_output_aliases=aliases or {})(ids, off, x)


def _operands(seed=0):
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(3, 3 + ROWS, ROWS).astype(np.int32))
  off = jnp.asarray(np.array([3], np.int32))
  x = jnp.asarray(rng.standard_normal((ROWS * 8, COLS * 128)).astype(np.float32))
  return ids, off, x


def _expected(ids, off, x):
  ids, off, x = np.asarray(ids), np.asarray(off), np.asarray(x)
  blocks = x.reshape(ROWS, 8, COLS * 128)
  return (blocks[ids - off[0]] * np.float32(2) + ids[:, None, None].astype(np.float32)).reshape(x.shape)


def _figures(r):
  return (r.kernel_name, r.device_cycles, r.flops, r.hbm_bytes, dict(r.unit_busy_cycles), r.vmem_peak_bytes,
          r.grid_steps, r.dma_count, r.stats, r.events)


def _run(fn, args, *, tables=True, monkeypatch=None, **options):
  """(output, report figures, calls of the launch's index maps) of `fn(*args)` in a fresh jit (a new
  plan), with the tables mechanism on or off."""
  calls = [0]
  make = jlaunch._index_map

  def counting(bm, extra=0):
    index_map = make(bm, extra)
    if getattr(index_map, "palace_pure_index_map", False):
      return index_map

    def counted(*args):
      calls[0] += 1
      return index_map(*args)
    counted.__dict__.update(index_map.__dict__)
    return counted
  monkeypatch.setattr(jlaunch, "_index_map", counting)
  if not tables:
    monkeypatch.setattr(jlaunch, "_reads_unwritten_tables", lambda params, bm: False)
  with pj.virtual_tpu("v5e", replay=False, **options) as tpu:
    out = np.asarray(jax.jit(fn)(*args))
  monkeypatch.undo()
  return out, [_figures(r) for r in tpu.reports], calls[0]


def test_table_map_is_evaluated_three_times_a_launch_and_charged_as_per_step(monkeypatch):
  args = _operands()
  out, reports, calls = _run(_gather, args, monkeypatch=monkeypatch)
  ref_out, ref_reports, ref_calls = _run(_gather, args, tables=False, monkeypatch=monkeypatch)
  np.testing.assert_array_equal(out, _expected(*args))
  np.testing.assert_array_equal(out, ref_out)
  assert reports == ref_reports   # cycles, units, DMAs and every event: the charges replayed exactly
  assert ref_calls == COLS * ROWS + 1   # (per step on the core, after one failed try on the host)
  # the failed host try, the first step on the core (recorded), the whole grid on the host
  assert calls == 3


def test_replayed_charges_keep_their_order_with_a_checker(monkeypatch):
  # the race detector sees every load the per-step evaluation made, at the same clock
  args = _operands(1)
  out, reports, calls = _run(_gather, args, monkeypatch=monkeypatch, detect_races=True)
  ref_out, ref_reports, _ = _run(_gather, args, tables=False, monkeypatch=monkeypatch, detect_races=True)
  np.testing.assert_array_equal(out, ref_out)
  assert reports == ref_reports and calls == 3


def test_an_out_of_bounds_table_entry_is_raised_at_its_grid_point(monkeypatch):
  ids, off, x = _operands(2)
  ids = ids.at[5].set(3 + ROWS)   # block ROWS of ROWS: out of bounds at grid point (0, 5)
  for tables in (True, False):
    with pytest.raises(Exception, match=r"grid point \(0, 5\)"):
      _run(_gather, (ids, off, x), tables=tables, monkeypatch=monkeypatch)


def _mappings(fn, *args):
  """(params, JAX's block mappings) of the (first) pallas_call `fn` makes."""
  def find(j):
    for e in j.eqns:
      if e.primitive.name == "pallas_call":
        return e.params
      for sub in sub_jaxprs(e):
        hit = find(sub)
        if hit is not None:
          return hit
    return None
  params = find(jax.make_jaxpr(fn)(*args).jaxpr)
  return params, params["grid_mapping"].block_mappings


def _writes_table_when(ids_ref, off_ref, x_ref, o_ref):
  @pl.when(pl.program_id(1) == 0)
  def _():
    ids_ref[0] = ids_ref[1]
  o_ref[...] = x_ref[...]


def _writes_table_by_dma(ids_ref, off_ref, x_ref, o_ref):
  def copy(tmp, sem):
    pltpu.async_copy(tmp, ids_ref, sem).wait()
  pl.run_scoped(lambda tmp: pl.run_scoped(lambda sem: copy(tmp, sem), pltpu.SemaphoreType.DMA),
                pltpu.SMEM((ROWS,), jnp.int32))
  o_ref[...] = x_ref[...]


def _writes_output(ids_ref, off_ref, x_ref, o_ref):
  o_ref[...] = x_ref[...].astype(jnp.int32)


@pytest.mark.parametrize("kernel, aliases, expected", [
    (_gather_kernel, None, True),
    (_writes_table_when, None, False),   # a store in a pl.when (JAX's effect on the kernel jaxpr)
    (_writes_table_by_dma, None, False),   # a DMA into the table
    (_writes_output, {0: 0}, False),   # the table aliased to an output
])
def test_only_maps_over_tables_nothing_writes_qualify(kernel, aliases, expected):
  ids, off, x = _operands()
  if aliases:   # (an alias needs equal shapes: the table is the output's size here)
    ids = jnp.zeros((ROWS * 8, COLS * 128), jnp.int32)

    def fn(ids, off, x):
      return pl.pallas_call(
          kernel, out_shape=jax.ShapeDtypeStruct(ids.shape, jnp.int32),
          grid_spec=pltpu.PrefetchScalarGridSpec(
              num_scalar_prefetch=2, grid=(COLS, ROWS),
              in_specs=[pl.BlockSpec((8, 128), lambda j, i, ids, off: (ids[i, 0] - off[0], j))],
              out_specs=pl.BlockSpec((8, 128), lambda j, i, ids, off: (i, j))),
          input_output_aliases=aliases)(ids, off, x)
  else:
    def fn(ids, off, x):
      return _gather(ids, off, x, kernel=kernel)
  params, bms = _mappings(fn, ids, off, x)
  assert jlaunch._reads_unwritten_tables(params, bms[0]) is expected
  assert jlaunch._reads_unwritten_tables(params, bms[1]) is False   # (reads no table)


def test_a_kernel_writing_its_table_keeps_per_step_maps(monkeypatch):
  args = _operands(3)
  out, _, calls = _run(lambda *a: _gather(*a, kernel=_writes_table_when), args, monkeypatch=monkeypatch)
  ref_out, _, _ = _run(lambda *a: _gather(*a, kernel=_writes_table_when), args, tables=False,
                       monkeypatch=monkeypatch)
  np.testing.assert_array_equal(out, ref_out)
  assert calls == COLS * ROWS + 1


def test_a_settled_map_charges_what_its_first_step_recorded():
  # the recorder passes the core's configuration through, and anything else marks the map per-step
  class Core:
    bounds_checks = True

    def scalar_op(self, ready=0):
      return ready

    def vector_op(self, *a):
      return 0
  rec = prefetch_maps._Recording(Core())
  assert rec.bounds_checks is True and not rec.other
  rec.scalar_op()
  rec.scalar_op()
  assert rec.tape == [2]
  rec.vector_op("add", (8, 128), np.float32, 0)
  assert rec.other
