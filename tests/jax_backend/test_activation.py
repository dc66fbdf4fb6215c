"""palace.jax activation: one host callback per launch, jit's cache never keeps a stale lowering, one
report per launch named after the kernel, uncovered primitives raise UnsupportedError with the line."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace as ppl
import palace.jax as pj
import palace.numpy as pjnp
from palace import tpu as ptpu


def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref):
  @pl.when(pl.program_id(1) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)
  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
  o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y):
  return pl.pallas_call(
      _matmul_kernel, out_shape=jax.ShapeDtypeStruct((256, 256), jnp.float32), grid=(2, 2),
      in_specs=[pl.BlockSpec((128, 128), lambda i, k: (i, k)),
                pl.BlockSpec((128, 256), lambda i, k: (k, 0))],
      out_specs=pl.BlockSpec((128, 256), lambda i, k: (i, 0)),
      scratch_shapes=[pltpu.VMEM((128, 256), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(x, y)


def _palace_matmul(x, y):
  def kernel(x_ref, y_ref, o_ref, acc_ref):
    @ppl.when(ppl.program_id(1) == 0)
    def _():
      acc_ref[...] = pjnp.zeros_like(acc_ref)
    acc_ref[...] += pjnp.dot(x_ref[...], y_ref[...], preferred_element_type=np.float32)
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)
  return ppl.pallas_call(
      kernel, out_shape=ppl.ShapeDtypeStruct((256, 256), np.float32), grid=(2, 2),
      in_specs=[ppl.BlockSpec((128, 128), lambda i, k: (i, k)),
                ppl.BlockSpec((128, 256), lambda i, k: (k, 0))],
      out_specs=ppl.BlockSpec((128, 256), lambda i, k: (i, 0)),
      scratch_shapes=[ptpu.VMEM((128, 256), np.float32)],
      compiler_params=ptpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))(x, y)


X = (np.arange(256 * 256) % 7).reshape(256, 256).astype(np.float32)  # integer-valued: exact products


def test_jit_and_eager_run_on_palace_with_one_report_per_launch():
  with pj.virtual_tpu("v5e") as tpu:
    a = jax.jit(matmul)(X, X)
    b = matmul(X, X)
  np.testing.assert_array_equal(np.asarray(a), X @ X)
  np.testing.assert_array_equal(np.asarray(b), X @ X)
  assert [r.kernel_name for r in tpu.reports] == ["_matmul_kernel"] * 2
  with ppl.virtual_tpu("v5e") as own:
    _palace_matmul(X, X)
  assert tpu.reports[0].device_cycles == own.reports[0].device_cycles  # same model, same figure


def test_leaving_the_context_waits_for_launches_dispatched_in_it():
  """JAX dispatches asynchronously: launches whose results were never read inside the `with` still
  run there and get their reports (before the fix, this left 0 of the 12 reports)."""
  from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: PLC0415

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  def per_device(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(64,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  mesh = jax.make_mesh((4,), ("x",))
  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False))
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    x = jax.device_put(jnp.zeros((4 * 512, 128), jnp.float32), NamedSharding(mesh, P("x")))
    for _ in range(3):
      x = step(x)            # three launches on each of the 4 devices, none read here
  assert [r.kernel_name for r in tpu.reports] == ["kernel"] * 12
  np.testing.assert_array_equal(np.asarray(x), np.full((4 * 512, 128), 3.0, np.float32))


def test_one_host_callback_per_launch_in_the_compiled_program():
  f = jax.jit(lambda x, y: matmul(x, y) + matmul(y, x))
  with pj.virtual_tpu("v5e") as tpu:
    hlo = f.lower(X, X).as_text()
    f(X, X).block_until_ready()
  assert hlo.count("xla_buffer_python_cpu_callback") == 2
  assert len(tpu.reports) == 2


def _int4_kernel(x_ref, o_ref):
  o_ref[...] = (x_ref[...].astype(jnp.int32) * 3 + 1).astype(jnp.int4)


def test_sub_byte_operands_take_xlas_python_callback_and_compute_right():
  """int4 (packed in XLA's buffers) operands and results take XLA's ordinary Python callback, which
  unpacks them (callback._emit_callback); the kernel's results are the same as for the buffer
  callback's dtypes."""
  x = jnp.tile(jnp.arange(-8, 8, dtype=jnp.int4).reshape(1, 16), (32, 16))   # (32, 256)
  f = jax.jit(pl.pallas_call(_int4_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.int4)))
  with pj.virtual_tpu("v5e") as tpu:
    hlo = f.lower(x).as_text()
    out = np.asarray(f(x)).astype(np.int32)
  assert "xla_buffer_python_cpu_callback" not in hlo and "xla_ffi_python_cpu_callback" in hlo
  ref = np.asarray(x).astype(np.int32) * 3 + 1
  np.testing.assert_array_equal(out, (ref + 8) % 16 - 8)   # int4 wraps
  assert len(tpu.reports) == 1


def test_operands_are_views_of_xlas_buffers_not_based_on_its_buffer_objects(monkeypatch):
  """XLA's buffer callback hands palace its operand buffers: palace views them (no copy; operands
  under 64 KiB are copied), read-only, and no view has XLA's Buffer object as a base. Such views,
  kept past the callback (a failed launch keeps its operands in the traceback of the error the
  Engine keeps), made later launches receive corrupt buffers: test_interpreter's out-of-bounds view
  test followed by test_replay's megacore test failed with "Buffer.__array__ is only supported on
  CPU" (callback._emit_callback). (X is 256 KiB: the view path.)"""
  from palace._src.jax import launch as jax_launch
  seen, run = [], jax_launch.run_pallas_call

  def bases(a):
    while a is not None:
      yield type(a).__name__
      a = getattr(a, "base", None)

  def spy(params, args, tpu, cache=None, out=None):   # (inside the callback: views valid only here)
    seen.append([(a.copy(), a.flags.writeable, a.flags.owndata, list(bases(a))) for a in args])
    return run(params, args, tpu, cache, out)
  monkeypatch.setattr(jax_launch, "run_pallas_call", spy)
  with pj.virtual_tpu("v5e"):
    out = np.asarray(jax.jit(lambda a, b: matmul(a, b))(X, X + 1))
  np.testing.assert_array_equal(out, X @ (X + 1))
  (operands,) = seen
  assert len(operands) == 2
  for (data, writeable, owndata, kinds), ref in zip(operands, (X, X + 1)):
    np.testing.assert_array_equal(data, ref)
    assert not writeable and not owndata   # a read-only view of XLA's buffer
    assert not any("Buffer" in k for k in kinds), kinds


def _three_outputs_kernel(x_ref, small_ref, big_ref, alias_ref, o_small, o_big, o_alias):
  o_small[...] = small_ref[...] * 2.0
  o_big[...] = big_ref[...] + 1.0          # written at block (0, 0) only: the rest never
  o_alias[...] = alias_ref[...] - x_ref[...]


def test_large_outputs_are_computed_in_xlas_result_buffers(monkeypatch):
  """A pallas_call's outputs of 64 KiB or more are computed in XLA's result buffers (writable views:
  nothing copied after the launch), smaller ones copied in; results as palace computes them: blocks
  never written read NaN, an aliased output starts as its input (callback._emit_callback)."""
  from palace._src.jax import launch as jax_launch
  seen, run = [], jax_launch.run_pallas_call

  def spy(params, args, tpu, cache=None, out=None):
    res = run(params, args, tpu, cache, out)
    seen.append([(o is not None, o is not None and np.shares_memory(o, r)) for o, r in zip(out, res)])
    return res
  monkeypatch.setattr(jax_launch, "run_pallas_call", spy)
  small = np.ones((8, 128), np.float32)
  spec = pl.BlockSpec((128, 128), lambda i, j: (i, j))
  f = jax.jit(lambda x, s, b, a: pl.pallas_call(
      _three_outputs_kernel, grid=(2, 2),
      in_specs=[spec, pl.BlockSpec((8, 128), lambda i, j: (0, 0)),
                pl.BlockSpec((128, 128), lambda i, j: (0, 0)), spec],
      out_specs=[pl.BlockSpec((8, 128), lambda i, j: (0, 0)), pl.BlockSpec((128, 128), lambda i, j: (0, 0)),
                 spec],
      out_shape=[jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((256, 256), jnp.float32),
                 jax.ShapeDtypeStruct((256, 256), jnp.float32)],
      input_output_aliases={3: 2})(x, s, b, a))
  with pj.virtual_tpu("v5e"):
    for k in range(3):   # the full machine, a replay, a kept launch
      o_small, o_big, o_alias = (np.asarray(o) for o in f(X, small + k, X + k, X * 3))
      np.testing.assert_array_equal(o_small, (small + k) * 2.0)
      np.testing.assert_array_equal(o_big[:128, :128], X[:128, :128] + k + 1.0)
      assert np.isnan(o_big[128:]).all() and np.isnan(o_big[:128, 128:]).all()
      np.testing.assert_array_equal(o_alias, X * 2)
  assert seen == [[(False, False), (True, True), (True, True)]] * 3


def test_jit_cache_never_keeps_a_stale_lowering():
  f = jax.jit(matmul)
  with pytest.raises(Exception, match="Only interpret mode is supported on CPU"):
    f(X, X)                       # outside: JAX's own rule (no TPU on this host)
  with pj.virtual_tpu("v5e") as t1:
    f(X, X).block_until_ready()   # compiled outside, re-traced inside
  with pj.virtual_tpu("v6e") as t2:
    f(X, X).block_until_ready()   # a new context: its own engine, not t1's
  assert len(t1.reports) == 1 and len(t2.reports) == 1
  assert t2.reports[0].chip.name == "v6e"
  with pytest.raises(Exception, match="Only interpret mode is supported on CPU"):
    f(X, X)                       # and outside again: not the palace lowering


def test_uncovered_primitive_names_it_and_the_kernel_line():
  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.cumprod(x_ref[...], axis=0)  # the line the error must name
  line = kernel.__code__.co_firstlineno + 1
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
  with pj.virtual_tpu("v5e"):
    with pytest.raises(ppl.UnsupportedError, match=rf"primitive 'cumprod' \(kernel line "
                                                   rf"test_activation.py:{line} \(\S*kernel\)\)"):
      jax.jit(f)(np.ones((8, 128), np.float32))


def test_bounded_slice_block_dims_of_a_pallas_call_are_refused_as_mosaic_refuses_them():
  """A pallas_call with pl.BoundedSlice block dims: Mosaic's lowering raises NotImplementedError
  ('Unsupported block dimension type'), so palace.jax refuses it at lowering, saying so, and points to
  JAX's emit_pipeline, which takes such blocks."""
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((pl.BoundedSlice(8), 128), lambda i: (pl.ds(i * 8, 8), 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pj.virtual_tpu("v5e"):
    with pytest.raises(ppl.UnsupportedError, match=r"pallas_call 'kernel': pl\.BoundedSlice block dims "
                                                   r"\(.*\) are not supported, as JAX's TPU compiler "
                                                   r"rejects them .*Fix: .*emit_pipeline"):
      jax.jit(f)(np.ones((16, 128), np.float32))


def test_runtime_errors_inside_the_callback_keep_their_palace_type():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(3,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  with pytest.raises(ppl.OutOfBoundsError, match="grid point"):
    with pj.virtual_tpu("v5e"):
      jax.block_until_ready(f(np.ones((16, 128), np.float32)))


def test_device_time_counts_the_launches_of_one_call():
  f = jax.jit(lambda x: matmul(x, x) * 2)
  t = pj.device_time(f, X)
  assert t.launches == 1 and t.device_cycles == t.reports[0].device_cycles > 0
  assert t.total_time_s > t.device_time_s > 0


def test_timing_only_and_detect_races_options_reach_the_machine():
  with pj.virtual_tpu("v5e", timing_only=True, detect_races=True) as tpu:
    jax.block_until_ready(jax.jit(matmul)(X, X))
  assert tpu.reports[0].timing_only and tpu.timing_only and tpu.detect_races


def test_process_wide_switch_from_the_environment(tmp_path):
  prog = tmp_path / "prog.py"
  prog.write_text(
      "import sys, numpy as np, jax, jax.numpy as jnp\n"
      f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
      "from test_activation import matmul, X\n"
      "np.testing.assert_array_equal(np.asarray(jax.jit(matmul)(X, X)), X @ X)\n"
      "print('ok')\n")
  env = dict(os.environ, PALACE_JAX="v5e", PYTHONPATH=os.pathsep.join(sys.path))
  r = subprocess.run([sys.executable, "-m", "palace._src.jax.run", str(prog)], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "ok" and "palace: _matmul_kernel:" in r.stderr



_DISPATCH_AND_EXIT = """
import os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import numpy as np, jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P
import palace.jax
tpu = palace.jax.activate("v5e", 4)
mesh = jax.make_mesh((4,), ("x",))

def kernel(x_ref, o_ref, send, recv):   # a ring shift: one pod launch of 4 chips
  me = lax.axis_index("x")
  pl.semaphore_signal(pltpu.get_barrier_semaphore(), 1, device_id={"x": lax.rem(me + 3, 4)})
  pl.semaphore_wait(pltpu.get_barrier_semaphore(), 1)
  c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": lax.rem(me + 1, 4)})
  c.start()
  c.wait()

def local(x):
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
                        compiler_params=pltpu.CompilerParams(collective_id=0))(x)

f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
x = jax.device_put(np.ones((4 * 2048, 2048), np.float32), jax.NamedSharding(mesh, P("x")))
jax.block_until_ready(f(x))
for _ in range(3):
  f(x)    # dispatched, results dropped: the program ends while these launches run
print("dispatched", flush=True)
"""


def test_a_program_that_exits_while_its_launches_run_exits_cleanly(tmp_path):
  """JAX dispatches asynchronously: a program may end while pod launches it never read still run
  palace code on XLA's threads. The exit waits for them (activation._drain_at_exit) and they run to
  the end (their cores on reused worker threads: Python 3.12 starts no thread at shutdown); before,
  the process died in XLA's teardown (SIGSEGV or abort, as JAX's distributed tutorial did)."""
  prog = tmp_path / "prog.py"
  prog.write_text(_DISPATCH_AND_EXIT)
  env = dict(os.environ, PALACE_JAX="", PYTHONPATH=os.pathsep.join(sys.path))
  for _ in range(2):
    r = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "dispatched"
    assert "failed" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]

def test_get_tpu_info_answers_for_the_active_virtual_chip():
  with pytest.raises(ValueError, match="Unsupported TPU device kind: cpu"):
    pltpu.get_tpu_info()
  with pj.virtual_tpu("v5e"):
    v5e = pltpu.get_tpu_info()
  with pj.virtual_tpu("v5p"):
    v5p = pltpu.get_tpu_info()
  assert v5e.chip_version == pltpu.ChipVersion.TPU_V5E and v5e.num_cores == 1
  assert v5p.chip_version == pltpu.ChipVersion.TPU_V5P and v5p.num_cores == 2
  assert v5e.vmem_capacity_bytes == 128 * 2**20


def test_pl_kernel_over_a_tensorcore_mesh_runs_on_palace():
  mesh = pltpu.TensorCoreMesh(axis_name="core", num_cores=1)

  def run(x):
    @jax.jit
    def f(x):
      @pl.kernel(out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32), mesh=mesh,
                 scratch_types=[pltpu.VMEM((64, 128), jnp.float32)])
      def double(x_hbm, o_hbm, buf):
        pltpu.sync_copy(x_hbm, buf)
        buf[...] = buf[...] * 2.0 + jax.lax.axis_index("core").astype(jnp.float32)
        pltpu.sync_copy(buf, o_hbm)
      return double(x)
    return f(x)

  x = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
  with pj.virtual_tpu("v5e") as tpu:
    out = run(x)
  np.testing.assert_array_equal(np.asarray(out), 2 * x)
  assert [r.kernel_name for r in tpu.reports] == ["double"]


def test_vmap_of_a_pallas_call_adds_a_grid_axis_the_kernel_does_not_see():
  def f(x):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...] * 2 + pl.program_id(0).astype(jnp.float32) + 10 * pl.num_programs(0)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32), grid=(2,),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  x = np.arange(3 * 16 * 128, dtype=np.float32).reshape(3, 16, 128)
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(jax.jit(jax.vmap(f))(x))
  np.testing.assert_array_equal(out, x * 2 + 20 + np.repeat(np.arange(2), 8)[None, :, None])
  assert len(tpu.reports) == 1 and tpu.reports[0].grid_steps == 3 * 2


def test_jax_own_interpret_mode_still_works_for_pallas_call_and_pl_kernel():
  """palace's lowering rules hand launches without an engine back to JAX's own rules."""
  from jax.experimental.pallas import tpu as jpltpu
  mesh = pltpu.TensorCoreMesh(axis_name="core", num_cores=1)
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  jpltpu.reset_tpu_interpret_mode_state()
  with jpltpu.force_tpu_interpret_mode(jpltpu.InterpretParams()):
    @pl.kernel(out_type=jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh)  # reads the config
    def copy(x_hbm, o_hbm):
      pltpu.sync_copy(x_hbm, o_hbm)

    np.testing.assert_array_equal(np.asarray(jax.jit(copy)(x)), x)
    np.testing.assert_array_equal(np.asarray(jax.jit(matmul)(X, X)), X @ X)


def test_shard_map_shard_local_kernels_run_per_device_and_communicating_ones_as_one_pod_launch():
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((4,), ("x",))
  x = jax.device_put(np.arange(32 * 128, dtype=np.float32).reshape(32, 128),
                     jax.sharding.NamedSharding(mesh, P("x")))

  def local(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  def talks(x_ref, o_ref):
    o_ref[...] = x_ref[...] + jax.lax.axis_index("x").astype(jnp.float32)   # needs the device id

  def sharded(kernel):
    def per_device(x):
      return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False))

  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    a = np.asarray(sharded(local)(x))
    b = np.asarray(sharded(talks)(x))
  np.testing.assert_array_equal(a, np.asarray(x) + 1.0)
  np.testing.assert_array_equal(b, np.asarray(x) + np.repeat(np.arange(4), 8)[:, None])
  # one one-chip launch per device, then one 4-chip pod launch
  assert [(r.kernel_name, r.num_chips) for r in tpu.reports] == [("local", 1)] * 4 + [("talks", 4)]


def test_a_communicating_kernel_needs_a_virtual_tpu_with_the_mesh_chip_count():
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((4,), ("x",))
  x = jax.device_put(np.zeros((32, 128), np.float32), jax.sharding.NamedSharding(mesh, P("x")))

  def talks(x_ref, o_ref):
    o_ref[...] = x_ref[...] + jax.lax.axis_index("x").astype(jnp.float32)

  def per_device(x):
    return pl.pallas_call(talks, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
  with pj.virtual_tpu("v5e", num_chips=2):
    with pytest.raises(ppl.UsageError, match=r"the mesh has 4 chips but the virtual TPU has 2"):
      f(x)


@pytest.mark.parametrize("chip", ["v4", "v5e", "v5p", "v6e", "7x"])
def test_every_chip_and_megacore_split_matches_palace_own_path(chip):
  with pj.virtual_tpu(chip) as tpu:
    out = jax.jit(matmul)(X, X)
  with ppl.virtual_tpu(chip) as own:
    _palace_matmul(X, X)
  np.testing.assert_array_equal(np.asarray(out), X @ X)
  assert tpu.reports[0].device_cycles == own.reports[0].device_cycles
  assert tpu.reports[0].unit_busy_cycles == own.reports[0].unit_busy_cycles


def test_pl_kernel_ring_shift_with_remote_dma_inside_shard_map_is_one_pod_launch():
  from jax.sharding import PartitionSpec as P
  mesh = jax.make_mesh((4,), ("x",))
  x = jax.device_put(np.arange(32 * 128, dtype=np.float32).reshape(32, 128),
                     jax.sharding.NamedSharding(mesh, P("x")))

  def per_device(x):
    @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
               mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1),
               scratch_types=[pltpu.VMEM(x.shape, x.dtype), pltpu.VMEM(x.shape, x.dtype),
                              pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])
    def ring(x_hbm, o_hbm, buf, rbuf, send, recv):
      right = (jax.lax.axis_index("x") + 1) % 4
      pltpu.sync_copy(x_hbm, buf)
      copy = pltpu.make_async_remote_copy(buf, rbuf, send, recv, device_id=(right,))
      copy.start()
      copy.wait()
      pltpu.sync_copy(rbuf, o_hbm)
    return ring(x)

  f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    out = np.asarray(f(x))
  np.testing.assert_array_equal(out, np.roll(np.asarray(x).reshape(4, 8, 128), 1, axis=0).reshape(32, 128))
  assert [(r.kernel_name, r.num_chips, r.ici_bytes) for r in tpu.reports] == [("ring", 4, 4 * 8 * 128 * 4)]


def test_a_launch_through_jax_leaves_no_cyclic_garbage_per_step():
  """palace pauses the cyclic GC during a launch (sim/machine.paused_gc): safe only because the
  interpreter's per-step objects form no reference cycles either."""
  import gc

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  found = []
  for n in (128, 1024):
    x = jnp.ones((8 * n, 128), jnp.float32)
    f = jax.jit(lambda x, n=n: pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x))
    with pj.virtual_tpu("v5e"):
      np.testing.assert_array_equal(np.asarray(f(x)), np.full(x.shape, 2.0, np.float32))
      gc.collect()
      gc.disable()
      try:
        np.asarray(f(x))
        found.append(gc.collect())
      finally:
        gc.enable()
  assert found[1] - found[0] < (1024 - 128) // 4, found


def test_the_engine_benchmarks_callback_floor_rows_measure_palaces_own_callback():
  # benchmarks.jax_engine splits a one-step launch into XLA's dispatch and callback (a call of the host
  # callback palace.jax emits, doing nothing) and the time inside palace.jax's host function
  sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
  from benchmarks import jax_engine
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax_engine._noop_palace_callback())(x)), x)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  assert 0 < jax_engine._time_in_host(pl, kernel, x, 3) < 1.0


def test_the_engine_benchmark_times_every_side_of_a_kernel_and_its_floor(capsys):
  # benchmarks.jax_engine: palace.jax (replayed), JAX interpret mode, palace's own path, replay=False;
  # and the --floor table over the same timing
  sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
  from benchmarks import jax_engine
  times = jax_engine.time_case("k_basic.py", "case_add", 1)
  assert len(times) == 4 and all(0 < t < 5.0 for t in times)
  jax_engine.floor_table(1, lambda name: name == "basic:add")
  assert "geomean over 1 kernels" in capsys.readouterr().out
