"""The jaxpr interpreter's rules on small kernels: each is compared with NumPy on integer-valued data."""
import gc
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jax._src.pallas import primitives as pallas_primitives  # load(..., other=) is not public

import palace.jax as pj
from palace._src import errors as pl_errors
from palace._src.sim.memory import Buffer

X = (np.arange(8 * 128) % 5).reshape(8, 128).astype(np.float32)


def _run(kernel, out_shape, *args):
  with pj.virtual_tpu("v5e") as tpu:
    out = jax.jit(pl.pallas_call(kernel, out_shape=out_shape))(*args)
  return jax.tree_util.tree_map(np.asarray, out), tpu


def test_scan_with_scanned_inputs_stacked_outputs_and_reverse():
  def kernel(x_ref, ys_ref, c_ref):
    def body(c, row):
      c = c + row
      return c, c * 2
    c, ys = lax.scan(body, jnp.zeros((128,), jnp.float32), x_ref[...], reverse=True)
    ys_ref[...] = ys
    c_ref[...] = jnp.broadcast_to(c, (8, 128))
  sds = jax.ShapeDtypeStruct((8, 128), jnp.float32)
  (ys, c), _ = _run(kernel, (sds, sds), X)
  np.testing.assert_array_equal(ys, np.cumsum(X[::-1], axis=0)[::-1] * 2)
  np.testing.assert_array_equal(c, np.broadcast_to(X.sum(0), (8, 128)))


def test_debug_print_placeholders_go_to_the_virtual_tpu():
  def kernel(x_ref, o_ref):
    pl.debug_print("first = {}, second = {}", x_ref[0, 1], x_ref[0, 2].astype(jnp.int32))
    o_ref[...] = x_ref[...]
  out, tpu = _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), X)
  np.testing.assert_array_equal(out, X)
  assert tpu.debug_output == ["first = 1.0, second = 2"]


def test_masked_load_reads_other_where_the_mask_is_off_and_masked_store():
  def kernel(x_ref, o_ref):
    col = lax.broadcasted_iota(jnp.int32, (8, 128), 1)
    v = pallas_primitives.load(x_ref, (slice(None), slice(None)), mask=col < 64, other=-1.0)
    o_ref[...] = jnp.zeros_like(o_ref)
    pltpu.store(o_ref, v + 1.0, mask=col % 2 == 0)
  out, _ = _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), X)
  col = np.arange(128)[None, :]
  want = np.where(col % 2 == 0, np.where(col < 64, X, -1.0) + 1.0, 0.0)
  np.testing.assert_array_equal(out, want)


def test_integer_ops_select_n_clamp_and_bitcast_convert():
  def kernel(x_ref, o_ref):
    i = x_ref[...].astype(jnp.int32)
    y = lax.clamp(1, i * 3 - 2, 9) + lax.rem(i, 3) - lax.div(i, 2) + (i ** 3)
    y = jnp.where(i > 2, y, -y)
    o_ref[...] = lax.bitcast_convert_type(lax.bitcast_convert_type(y, jnp.float32), jnp.int32)
  out, _ = _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.int32), X)
  i = X.astype(np.int64)
  y = np.clip(i * 3 - 2, 1, 9) + i % 3 - i // 2 + i ** 3
  np.testing.assert_array_equal(out, np.where(i > 2, y, -y))



def test_unit_dim_broadcasting_binary_ops_take_the_block_form_with_the_generic_results():
  """JAX 0.12 binds `max x:f32[8,128] y:f32[8,1]` (unit dims broadcast): such equations take the
  block form (rules_lax._vector_form) as same-shape ones do; results and the charged time are those of
  the generic elementwise op."""
  from palace._src.jax import rules_lax
  from palace.numpy import maximum

  def kernel(x_ref, o_ref):
    x = x_ref[...]
    col = jnp.max(x, axis=1, keepdims=True)            # (8, 1)
    row = jnp.min(x, axis=0, keepdims=True)            # (1, 128)
    o_ref[...] = jnp.maximum(x * 0.5, col - 3.0) + row - (col * row)
  y = X + np.arange(8, dtype=np.float32)[:, None]
  eqn = jax.make_jaxpr(lambda a, b: lax.max(a, b))(y, y[:, :1]).jaxpr.eqns[0]
  assert rules_lax._vector_form(eqn, maximum) is not None
  out, tpu = _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), y)
  col, row = y.max(axis=1, keepdims=True), y.min(axis=0, keepdims=True)
  np.testing.assert_array_equal(out, np.maximum(y * 0.5, col - 3.0) + row - col * row)
  calls = []
  monkey = pytest.MonkeyPatch()
  monkey.setattr(rules_lax, "_vector_form", lambda eqn, op: calls.append(eqn) and None)
  try:   # the same kernel without the block form (a new trace: JAX caches the lowering per function)
    def kernel2(x_ref, o_ref):
      kernel(x_ref, o_ref)
    out2, tpu2 = _run(kernel2, jax.ShapeDtypeStruct((8, 128), jnp.float32), y)
  finally:
    monkey.undo()
  assert calls
  np.testing.assert_array_equal(out2, out)
  assert tpu2.reports[0].device_cycles == tpu.reports[0].device_cycles

def test_element_block_dims_and_scalar_prefetch_index_maps():
  starts = np.array([5, 0, 17, 3], np.int32)       # element offsets of each step's rows
  x = (np.arange(64 * 128) % 11).reshape(64, 128).astype(np.float32)

  def kernel(starts_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  f = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(4,),
          in_specs=[pl.BlockSpec((pl.Element(8), 128), lambda i, s: (s[i], 0))],
          out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0))))
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.jit(f)(starts, x))
  want = np.concatenate([x[s:s + 8] * 2 for s in starts])
  np.testing.assert_array_equal(out, want)
  assert tpu.reports[0].grid_steps == 4


def _index_map_calls(monkeypatch, n_args: int) -> list:
  """The first argument (grid index, or a grid's index column) of every index-map evaluation from now
  on: palace.jax runs each map's jaxpr with `launch.run_program`, whose calls with `n_args` arguments
  are the maps' (the kernel body takes more)."""
  from palace._src.jax import launch as jax_launch
  calls = []
  real = jax_launch.run_program
  monkeypatch.setattr(jax_launch, "run_program", lambda prog, consts, args: (
      calls.extend(args[:len(args) == n_args]), real(prog, consts, args))[1])
  return calls


def test_index_maps_of_scalar_arithmetic_run_once_per_plan_on_int32_columns(monkeypatch):
  # `2 * i + 1` on a 2-step grid (one evaluation on whole index columns, kept by the plan, not one per
  # step and launch) and a map whose int32 arithmetic wraps back into range as JAX's does: i * 2**32 + i
  # is i in int32 (int64 columns would put block 1 out of bounds and fall back to per-step calls)
  calls = _index_map_calls(monkeypatch, 1)
  x = (np.arange(256 * 128) % 7).reshape(256, 128).astype(np.float32)

  def kernel(x_ref, y_ref, o_ref, p_ref):
    o_ref[...] = x_ref[...] * 10.0
    p_ref[...] = y_ref[...] + 1.0
  spec = pl.BlockSpec((64, 128), lambda i: (2 * i + 1, 0))
  wrap = pl.BlockSpec((64, 128), lambda i: (i * 1073741824 * 4 + i, 0))
  f = jax.jit(pl.pallas_call(kernel, grid=(2,), in_specs=[spec, wrap], out_specs=[spec, wrap],
                             out_shape=[jax.ShapeDtypeStruct((256, 128), jnp.float32)] * 2))
  with pj.virtual_tpu("v5e") as tpu:
    for _ in range(3):
      o, p = (np.asarray(a) for a in f(x, x))
  # two maps, each on the input's and the output's columns, at the first launch only
  assert [(c.dtype, c.tolist()) for c in calls] == [(np.int32, [0, 1])] * 4
  np.testing.assert_array_equal(o[64:128], x[64:128] * 10.0)
  np.testing.assert_array_equal(o[192:], x[192:] * 10.0)
  np.testing.assert_array_equal(p[:128], x[:128] + 1.0)
  assert tpu.reports[2].grid_steps == 2


def test_with_scalar_prefetch_only_the_maps_reading_it_run_at_every_launch(monkeypatch):
  # `3 - i` reads no prefetched scalar: one evaluation on the grid's columns for the plan; `s[i]` reads
  # a table the kernel never writes: at every launch its first step on the core (charging its SMEM
  # loads, recorded), then one evaluation on the columns, the table's contents at hand
  # (prefetch_maps.py; tests/jax_backend/test_prefetch_maps.py checks the later steps' charges)
  calls = _index_map_calls(monkeypatch, 2)
  rows = np.array([2, 0, 3, 1], np.int32)
  x = (np.arange(32 * 128) % 9).reshape(32, 128).astype(np.float32)

  def kernel(s_ref, x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...] * 100.0
  f = jax.jit(pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(4,),
          in_specs=[pl.BlockSpec((8, 128), lambda i, s: (s[i], 0)),
                    pl.BlockSpec((8, 128), lambda i, s: (3 - i, 0))],
          out_specs=pl.BlockSpec((8, 128), lambda i, s: (i, 0)))))
  with pj.virtual_tpu("v5e"):
    for _ in range(2):
      out = np.asarray(f(rows, x, x))
  want = np.concatenate([x[8 * r:8 * r + 8] + x[8 * (3 - i):8 * (4 - i)] * 100 for i, r in enumerate(rows)])
  np.testing.assert_array_equal(out, want)
  columns = [c for c in calls if isinstance(c, np.ndarray)]
  assert [c.tolist() for c in columns] == [[0, 1, 2, 3]] * 3   # (the plan's, then one per launch)
  # s[i] at step 0 of both launches: first tried on the host, which has no SMEM, then on the core
  assert [c for c in calls if not isinstance(c, np.ndarray)] == [0, 0] * 2


def test_a_rule_giving_the_wrong_dtype_is_caught_not_computed(monkeypatch):
  import palace as ppl
  import palace.numpy as pjnp
  import dataclasses
  from palace._src.jax.registry import RULES
  bad = lambda eqn, x: pjnp.astype(x, jnp.int32)   # noqa: E731
  monkeypatch.setitem(RULES, "neg", dataclasses.replace(RULES["neg"], evaluate=bad, compiles=False))

  def kernel(x_ref, o_ref):
    o_ref[...] = -x_ref[...]
  # raised inside the callback; the context re-raises palace's own error
  with pytest.raises(ppl.UnsupportedError, match=r"primitive 'neg' .* gave a int32\[8, 128\] value "
                                                 r"where JAX expects float32\[8, 128\]"):
    _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), X)


def test_repeated_calls_rerun_the_plan_cached_per_dynamic_grid_on_fresh_operands():
  """A lowering plans its launch once per grid: later calls (same or another dynamic grid bound)
  run that plan on the new operands."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2 + pl.program_id(0).astype(jnp.float32)

  def f(n, x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  xs = [np.arange(32 * 128, dtype=np.float32).reshape(32, 128) % (k + 3) for k in range(3)]
  with pj.virtual_tpu("v5e") as tpu:
    g = jax.jit(f)
    outs = [np.asarray(g(np.int32(n), x)) for n, x in zip((2, 4, 2), xs)]
  for n, x, out in zip((2, 4, 2), xs, outs):
    want = x[:8 * n] * 2 + np.repeat(np.arange(n, dtype=np.float32), 8)[:, None]
    np.testing.assert_array_equal(out[:8 * n], want)   # blocks past the grid are never written
  assert [r.grid_steps for r in tpu.reports] == [2, 4, 2]


def _hbm_call(kernel, scratch_shapes=()):
  """A pallas_call of `kernel(x_hbm, o_hbm, *scratch)` on X with both operands left in HBM."""
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY), scratch_shapes=scratch_shapes)


def test_a_dma_left_in_flight_is_reported_at_the_kernel_line_that_started_it():
  import inspect
  import palace as ppl

  def kernel(x_hbm, o_hbm, sem):
    pltpu.make_async_copy(x_hbm, o_hbm, sem).start()   # never waited

  line = inspect.getsourcelines(kernel)[1] + 1
  f = _hbm_call(kernel, [pltpu.SemaphoreType.DMA])
  with pytest.raises(ppl.SyncError, match=rf"started at test_interpreter.py:{line} "):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(f)(X))


def test_a_dma_on_the_priority_one_queue_moves_the_same_data_and_a_priority_two_is_refused():
  import palace as ppl

  def kernel(priority):
    def k(x_hbm, o_hbm, sem):
      pltpu.async_copy(x_hbm, o_hbm, sem, priority=priority).wait()
    return k

  with pj.virtual_tpu("v5e"):
    out = jax.jit(_hbm_call(kernel(1), [pltpu.SemaphoreType.DMA]))(X)
  np.testing.assert_array_equal(np.asarray(out), X)
  with pytest.raises(ppl.UnsupportedError, match=r"priority=2 on a local copy.*only support priority 0 or 1"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(_hbm_call(kernel(2), [pltpu.SemaphoreType.DMA]))(X))


def test_a_dma_with_no_user_frame_is_reported_at_the_kernel_definition(tmp_path):
  # JAX's emit_pipeline starts its DMAs in library code, inside run_scoped: such equations have no
  # user frame, so their site is the kernel function's definition (from the jaxpr's debug info: the
  # launch's fixed site), not what a stack walk finds (a JAX frame).
  # Here the whole kernel is library code: a file excluded from user frames as jax's own files are.
  import importlib.util
  import palace as ppl
  from jax._src import source_info_util
  lib = tmp_path / "dma_library.py"
  lib.write_text("from jax.experimental import pallas as pl\n"
                 "from jax.experimental.pallas import tpu as pltpu\n"
                 "def kernel(x_hbm, o_hbm):\n"
                 "  def body(sem):\n"
                 "    pltpu.make_async_copy(x_hbm, o_hbm, sem).start()   # never waited\n"
                 "  pl.run_scoped(body, pltpu.SemaphoreType.DMA)\n")
  spec = importlib.util.spec_from_file_location("dma_library", lib)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  source_info_util.register_exclusion(str(tmp_path))
  f = _hbm_call(mod.kernel)
  with pytest.raises(ppl.SyncError, match=r"DMA args\[0\] -> outputs\[0\] started at dma_library.py:3 was "
                                          r"never waited"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(f)(X))


def _two_row_copies(ds, make_async_copy, wait_whole: bool):
  # copies of rows 0-3 and 4-7 of x into o on one semaphore, waited per copy (each wait the copy its
  # start made) or at once (one wait for all 8 rows, a placeholder descriptor as the wheel's paged
  # attention uses); the same code on JAX's refs and on palace's
  def kernel(x_hbm, o_hbm, sem):
    for r in (0, 4):
      make_async_copy(x_hbm.at[ds(r, 4)], o_hbm.at[ds(r, 4)], sem).start()
    if wait_whole:
      make_async_copy(o_hbm, o_hbm, sem).wait()
    else:
      for r in (0, 4):
        make_async_copy(x_hbm.at[ds(r, 4)], o_hbm.at[ds(r, 4)], sem).wait()
  return kernel


@pytest.mark.parametrize("wait_whole", [False, True])
def test_dma_waits_on_the_started_copy_time_as_palaces_own_waits(monkeypatch, wait_whole):
  # a local dma_wait for the bytes of the oldest copy started on its semaphore waits on that copy
  # (rules_state._StartedCopies: no descriptor or prepared copy of its own); the model's figure is
  # that of palace's own kernel, whose waits make their own; a wait for other bytes takes its own path
  import palace as ppl
  from palace import tpu as ppltpu
  from palace._src.lang import tpu_primitives
  prepared = []
  real = tpu_primitives.AsyncCopyDescriptor.prepare
  monkeypatch.setattr(tpu_primitives.AsyncCopyDescriptor, "prepare",
                      lambda self, *a, **k: prepared.append(1) or real(self, *a, **k))
  f = jax.jit(_hbm_call(_two_row_copies(pl.ds, pltpu.make_async_copy, wait_whole),
                        [pltpu.SemaphoreType.DMA]))
  with pj.virtual_tpu("v5e") as tpu:
    for _ in range(2):
      np.testing.assert_array_equal(np.asarray(f(X)), X)
  # 2 starts per launch; the whole wait makes its own at each launch, and its first one stops the
  # starts' queueing; per-copy waits use the started ones
  assert len(prepared) == ((2 + 1) * 2 if wait_whole else 2 * 2)
  own = ppl.pallas_call(_two_row_copies(ppl.ds, ppltpu.make_async_copy, wait_whole),
                        out_shape=ppl.ShapeDtypeStruct(X.shape, X.dtype),
                        in_specs=[ppl.BlockSpec(memory_space=ppl.ANY)],
                        out_specs=ppl.BlockSpec(memory_space=ppl.ANY),
                        scratch_shapes=[ppltpu.SemaphoreType.DMA])
  with ppl.virtual_tpu("v5e") as mine:
    np.testing.assert_array_equal(own(X), X)
  assert [r.device_cycles for r in tpu.reports] == [mine.reports[0].device_cycles] * 2
  assert tpu.reports[1].unit_busy_cycles == mine.reports[0].unit_busy_cycles


def test_a_wait_whose_descriptor_sides_differ_is_rejected_even_after_a_matching_start():
  # the wait's source has the bytes of the copy started on its semaphore, but its destination is
  # smaller: the checked path's error, not a wait on the started copy
  import palace as ppl

  def kernel(x_hbm, o_hbm, sem):
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 4)], o_hbm.at[pl.ds(0, 4)], sem).start()
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 4)], o_hbm.at[pl.ds(0, 2)], sem).wait()
  f = _hbm_call(kernel, [pltpu.SemaphoreType.DMA])
  with pytest.raises(ppl.ShapeError, match=r"DMA shapes differ: args\[0\]\[0:4, 0:128\] has shape \(4, 128\) "
                                           r"but outputs\[0\]\[0:2, 0:128\] has shape \(2, 128\)"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(f)(X))


def test_a_deadlocked_wait_names_the_kernel_not_a_jax_frame():
  # the machine's own records (blocked waits, races, uninitialised reads) take the user's line from
  # the stack; while a jaxpr runs none is there, so they name the kernel function's definition
  import inspect
  import palace as ppl

  def kernel(x_hbm, o_hbm, sem):
    pl.semaphore_wait(sem, 1)   # nothing ever signals it

  line = inspect.getsourcelines(kernel)[1]
  f = _hbm_call(kernel, [pltpu.SemaphoreType.REGULAR])
  with pytest.raises(ppl.SyncError, match=rf"waits at test_interpreter.py:{line} for"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(f)(X))


def test_pl_kernel_repeated_calls_rerun_its_cached_plan_with_fresh_mutable_refs():
  """pl.kernel launches plan once per lowering too; aliased inputs (JAX mutable refs after state
  discharge) get a fresh palace ref per call, so each call updates its own input."""
  mesh = pltpu.TensorCoreMesh(axis_name="core", num_cores=1)

  @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh,
             scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])
  def kernel(x_hbm, acc_hbm, o_hbm, buf):
    pltpu.sync_copy(x_hbm, buf)
    buf[...] = buf[...] * 2.0
    pltpu.sync_copy(buf, o_hbm)
    pltpu.sync_copy(acc_hbm, buf)
    buf[...] = buf[...] + 1.0
    pltpu.sync_copy(buf, acc_hbm)

  @jax.jit
  def f(x, acc):
    acc_ref = jax.new_ref(acc)
    out = kernel(x, acc_ref)
    return out, acc_ref[...]
  xs = [X + k for k in range(3)]
  with pj.virtual_tpu("v5e") as tpu:
    outs = [jax.tree_util.tree_map(np.asarray, f(x, x * 10)) for x in xs]
  for x, (out, acc) in zip(xs, outs):
    np.testing.assert_array_equal(out, 2 * x)
    np.testing.assert_array_equal(acc, x * 10 + 1)
  assert [r.kernel_name for r in tpu.reports] == ["kernel"] * 3


def test_pallas_call_updates_a_closed_over_jax_mutable_ref_in_place():
  """JAX's way to hand a `jax.new_ref` to a pallas_call is to close over it (a ref operand fails in
  JAX's own grid mapping): its state discharge aliases the ref to an extra output, and the kernel
  writes through the input side of that pair. JAX's interpret mode gives the same values."""
  @jax.jit
  def f(x, acc):
    acc_ref = jax.new_ref(acc)

    def kernel(x_ref, o_ref, buf):
      o_ref[...] = x_ref[...] * 2
      pltpu.sync_copy(acc_ref, buf)
      buf[...] = buf[...] + x_ref[...]
      pltpu.sync_copy(buf, acc_ref)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                         scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])(x)
    return out, acc_ref[...]
  with pj.virtual_tpu("v5e") as tpu:
    out, acc = jax.tree_util.tree_map(np.asarray, f(X, X * 10))
  np.testing.assert_array_equal(out, 2 * X)
  np.testing.assert_array_equal(acc, X * 11)
  assert [r.kernel_name for r in tpu.reports] == ["kernel"]


@pytest.mark.parametrize("n", [3, 8])
def test_dma_of_a_dynamic_size_slice(n):
  # a window whose size is known only when the kernel runs (what pl.BoundedSlice blocks make)
  def kernel(n_ref, x_hbm, zeros_hbm, o_hbm, sem):
    del zeros_hbm
    rows = n_ref[0]
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, rows)], o_hbm.at[pl.ds(0, rows)], sem)
    copy.start()
    copy.wait()

  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  call = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
      grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, in_specs=[any_spec, any_spec],
                                             out_specs=any_spec,
                                             scratch_shapes=[pltpu.SemaphoreType.DMA]),
      input_output_aliases={2: 0})
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.jit(call)(jnp.array([n], jnp.int32), X + 1, jnp.zeros((8, 128), jnp.float32)))
  expected = np.zeros((8, 128), np.float32)
  expected[:n] = X[:n] + 1
  np.testing.assert_array_equal(out, expected)
  # the DMA read and wrote n rows, not the bound (+ 4 bytes: the scalar prefetch)
  assert tpu.reports[-1].hbm_bytes == 2 * n * 128 * 4 + 4


def test_error_inside_jax_library_code_names_the_users_line():
  # emit_pipeline's DMAs are traced from JAX's own pipeline.py (no user frame): the note names the
  # kernel line that called emit_pipeline, and the primitive that failed
  def kernel(x_hbm, o_hbm):
    def body(x_vmem, o_vmem):
      o_vmem[...] = x_vmem[...]
    pipeline = pltpu.emit_pipeline(body, grid=(2,), out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                                   in_specs=[pl.BlockSpec((8, 128), lambda i: (i + 1, 0))])
    pipeline(x_hbm, o_hbm)  # LINE

  any_spec = pl.BlockSpec(memory_space=pl.ANY)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                        in_specs=[any_spec], out_specs=any_spec)
  line = next(i for i, l in enumerate(open(__file__).read().splitlines(), 1) if l.endswith("# LINE"))
  with pytest.raises(pl_errors.OutOfBoundsError) as info:
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(jax.jit(call)(np.zeros((16, 128), np.float32)))
  notes = "\n".join(getattr(info.value, "__notes__", []))
  assert re.search(rf"in the JAX kernel at test_interpreter.py:{line} \(\S*kernel\), primitive 'dma_start'",
                   notes), notes


def test_atan2_maps_to_palace_arctan2():
  y = (X - 2.0) / 3.0
  (out,), _ = _run(lambda a_ref, b_ref, o_ref: o_ref.__setitem__(..., jnp.arctan2(a_ref[...], b_ref[...])),
                   (jax.ShapeDtypeStruct((8, 128), jnp.float32),), y, X - 1.5)
  np.testing.assert_allclose(out, np.arctan2(y, X - 1.5), rtol=1e-6, atol=1e-7)


def test_log2_and_stop_gradient_run_as_the_libraries_kernels_use_them():
  """Two of the walls third-party kernel libraries met (issue 37): `jnp.log2` (JAX's `log2` primitive)
  and `lax.stop_gradient` inside a kernel; palace computes log2 in float32 and passes the value through."""
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.log2(lax.stop_gradient(x_ref[...]) + 1.0)
  x = (np.arange(8 * 128) % 64).reshape(8, 128).astype(np.float32)
  out, tpu = _run(kernel, jax.ShapeDtypeStruct((8, 128), jnp.float32), x)
  assert len(tpu.reports) == 1   # ran on palace
  np.testing.assert_allclose(out, np.log2(x + 1.0), rtol=2e-6)
  powers = x + 1.0 == 2.0 ** np.round(np.log2(x + 1.0))
  np.testing.assert_array_equal(out[powers], np.log2(x + 1.0)[powers])   # exact on powers of two


def test_pl_kernel_operand_constrained_to_smem_is_staged_there():
  """pltpu.with_memory_space_constraint(x, SMEM) on a pl.kernel argument (how tokamax's gmm_v2 passes
  its group sizes): the body reads scalars from it; palace stages the copy with one HBM->SMEM DMA
  before the body. (It reached the kernel as an HBM ref, which refused the scalar loads; JAX 0.12's
  own interpret mode raises "Unsupported memory space: smem" here.)"""
  def body(s_ref, x_ref, o_ref):
    def inner(buf):
      pltpu.sync_copy(x_ref.at[pl.ds(s_ref[1] * 8, 8)], buf)
      buf[...] = buf[...] * 2.0
      pltpu.sync_copy(buf, o_ref)
    pl.run_scoped(inner, pltpu.VMEM((8, 128), jnp.float32))

  def f(s, x):
    s = pltpu.with_memory_space_constraint(s, pltpu.SMEM)
    return pl.kernel(body, out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                     mesh=pltpu.create_tensorcore_mesh("core", num_cores=1))(s, x)
  x = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
  s = np.array([0, 2, 1, 3], np.int32)
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.jit(f)(s, x))
  np.testing.assert_array_equal(out, x[16:24] * 2)
  assert tpu.reports[-1].dma_count_by_direction == {"hbm->smem": 1, "hbm->vmem": 1, "vmem->hbm": 1}


@pytest.mark.parametrize("front", ["pallas_call", "kernel"])
def test_a_finished_launch_leaves_no_buffer_alive(front):
  """The compiled kernel (kept with its jaxpr by JAX's caches) caches ref views per equation; those
  caches must not keep a finished launch's refs, hence its buffers: here the HBM operand and output,
  which view the arrays XLA handed the callback (tokamax's gmm_v2 at m=262144, k=7168 kept 7 GiB of
  them per traced kernel). emit_pipeline's DMAs take their windows through such cached views."""
  shape = (24, 384)   # a shape no other buffer of this test has

  def body(x_hbm, o_hbm):
    def step(x_vmem, o_vmem):
      o_vmem[...] = x_vmem[...] + 1
    spec = pl.BlockSpec((8, 384), lambda i: (i, 0))
    pltpu.emit_pipeline(step, grid=(3,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

  out_shape = jax.ShapeDtypeStruct(shape, jnp.float32)
  if front == "pallas_call":
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(body, out_shape=out_shape, in_specs=[any_spec], out_specs=any_spec)
  else:
    call = pl.kernel(body, out_type=out_shape, mesh=pltpu.create_tensorcore_mesh("core", num_cores=1))
  x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 7
  for _ in range(2):    # a second launch of the same compiled kernel, then nothing left of either
    with pj.virtual_tpu("v5e") as tpu:
      out = np.asarray(jax.jit(call)(x))
    np.testing.assert_array_equal(out, x + 1)
    assert tpu.reports[-1].dma_count > 0
  del tpu
  gc.collect()
  left = [b.name for b in gc.get_objects() if isinstance(b, Buffer) and tuple(b.shape) == shape]
  assert left == []


def test_views_kept_across_launches_read_each_launchs_buffers_and_are_checked_again():
  """The compiled kernel keeps the parts of the views it derives (Ref.parts: a pure function of the
  base view and the index values) from launch to launch: a later launch rebuilds them on its own
  buffers (new data, new results) and a new index value is bounds-checked as on the first launch."""
  def kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[pl.ds(idx_ref[0], 8), :] * 2

  call = jax.jit(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                                in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM),
                                          pl.BlockSpec(memory_space=pltpu.VMEM)]))
  rng = np.random.default_rng(3)
  with pytest.raises(pl_errors.OutOfBoundsError, match=r"Slice \[25:33\] out of bounds for axis 0"):
    with pj.virtual_tpu("v5e") as tpu:   # (one lowering: every call runs the same compiled kernel)
      for start in (8, 8, 16, 8):
        x = rng.integers(-9, 9, (32, 128)).astype(np.float32)
        out = np.asarray(call(np.array([start], np.int32), x))
        np.testing.assert_array_equal(out, x[start:start + 8] * 2)
      assert len(tpu.reports) == 4
      call(np.array([25], np.int32), x).block_until_ready()


def test_jax_debug_callback_in_a_kernel_runs_with_the_values_and_costs_nothing():
  """As in JAX's interpret mode, the callback sees the kernel's values (Mosaic compiles it away on a
  TPU, so it adds no modelled time of its own)."""
  seen = []
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)

  def with_callback(x_ref, o_ref):
    jax.debug.callback(lambda v, w: seen.append((float(v), w.shape)), x_ref[1, 2], x_ref[0:2, :])
    o_ref[...] = x_ref[...] + 1

  def without(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  with pj.virtual_tpu("v5e") as tpu:
    for k in (with_callback, without):
      out = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
      np.testing.assert_array_equal(np.asarray(out), x + 1)
  assert seen == [(x[1, 2], (2, 128))]
  # the callback itself is free; only the two reads that feed it are charged (a scalar and a vreg load)
  assert 0 < tpu.reports[0].device_cycles - tpu.reports[1].device_cycles <= 2


def test_debug_print_with_keyword_arguments_is_rejected_as_mosaic_does():
  def kernel(x_ref, o_ref):
    jax.debug.print("first {f}", f=x_ref[0, 0])
    o_ref[...] = x_ref[...]
  x = np.ones((8, 128), np.float32)
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match="prints positional values only"):
    jax.block_until_ready(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))


def test_a_zero_length_scan_gives_empty_stacked_outputs():
  def kernel(x_ref, o_ref):
    def body(c, x):
      return c + x, (c * 2).astype(jnp.int32)
    c, ys = lax.scan(body, jnp.full((128,), 3.0, jnp.float32), x_ref[0:0, :])
    o_ref[...] = x_ref[...] + c[None, :] + jnp.sum(ys).astype(jnp.float32) + ys.shape[0]

  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  f = lambda v: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype))(v)  # noqa: E731
  with pltpu.force_tpu_interpret_mode():
    want = np.asarray(f(x))
  with pj.virtual_tpu("v5e"):
    got = np.asarray(f(x))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, x + 3)


def test_kernels_that_differ_only_in_shape_share_one_compiled_program_text(monkeypatch):
  # the generated program names every value through its namespace, so a kernel launched at another
  # shape compiles nothing new, and still computes at its own shape
  from palace._src.jax import interpret
  compiled = []
  real = compile
  monkeypatch.setattr(interpret, "_CODE", {})
  monkeypatch.setattr(interpret, "compile", lambda *a: compiled.append(a[0]) or real(*a), raising=False)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0
  outs = []
  for rows in (8, 16, 24):
    x = (np.arange(rows * 128) % 7).reshape(rows, 128).astype(np.float32)
    out, _ = _run(kernel, jax.ShapeDtypeStruct((rows, 128), jnp.float32), x)
    np.testing.assert_array_equal(out, x * 2.0 + 1.0)
    outs.append(len(compiled))
  assert outs[0] >= 1 and outs[1] == outs[0] and outs[2] == outs[0], outs
