"""Failures a user meets beside the kernels themselves (issue 37's robustness items): failed multi-core
and multi-chip launches leave nothing behind, semaphore amounts beyond 32 bits, malformed kernels and
compiler-params dicts, binary files given to load_module, and a core_barrier one core skipped."""
import functools
import threading

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace.compat import load_module

X = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)


def _megacore(fail: bool):
  """Core 1 raises (when `fail`) while core 0 waits for its signal."""
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(X.shape, X.dtype),
                     mesh=pltpu.TensorCoreMesh("core", 2), scratch_types=[pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pl.semaphore_wait(sem, 1)
      pltpu.sync_copy(x_hbm, o_hbm)

    @pl.when(c == 1)
    def _():
      pl.delay(100)
      if fail:
        raise ValueError("core 1 fails")
      pl.semaphore_signal(sem, 1, core_index=0)

  with pl.virtual_tpu("v5p"):
    return k(X)


def _pod(fail: bool):
  """Chip 1 raises (when `fail`) while the other chips wait at the barrier semaphore."""
  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(xs.shape, xs.dtype),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def k(x_hbm, o_hbm):
      me = lax.axis_index("x")

      @pl.when(me == 1)
      def _():
        pl.delay(100)
        if fail:
          raise ValueError("chip 1 fails")
        for c in (0, 2, 3):
          pl.semaphore_signal(pltpu.get_barrier_semaphore(), 1, device_id={"x": c})

      @pl.when(me != 1)
      def _():
        pl.semaphore_wait(pltpu.get_barrier_semaphore(), 1)
      pltpu.sync_copy(x_hbm, o_hbm)
    return k(xs)

  with pl.virtual_tpu("v5e", num_chips=4):
    mesh = pl.make_mesh((4,), ("x",))
    return pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(X)


@pytest.mark.parametrize("launch", [_megacore, _pod], ids=["megacore", "pod"])
def test_failed_launches_leave_no_threads_and_the_next_launch_runs(launch):
  np.testing.assert_array_equal(launch(fail=False), X)
  baseline = threading.active_count()   # the launch's idle worker threads are kept for reuse
  for _ in range(3):
    with pytest.raises(ValueError, match=r"(core|chip) 1 fails"):
      launch(fail=True)
    assert threading.active_count() == baseline
  np.testing.assert_array_equal(launch(fail=False), X)
  assert threading.active_count() == baseline


@pytest.mark.parametrize("launch", [_megacore, _pod], ids=["megacore", "pod"])
def test_a_failed_launch_releases_its_machine(launch, monkeypatch):
  """A launch that raises lets go of its machine as a finished one does (`Machine.release`), so that a
  remote copy it left to land is dropped, not landed in a buffer that outlives it at a later access."""
  from palace._src.sim import machine as machine_mod
  released = []
  original = machine_mod.Machine.release
  monkeypatch.setattr(machine_mod.Machine, "release", lambda self: (released.append(1), original(self)))
  np.testing.assert_array_equal(launch(fail=False), X)
  assert len(released) == 1
  with pytest.raises(ValueError, match=r"(core|chip) 1 fails"):
    launch(fail=True)
  assert len(released) == 2
  np.testing.assert_array_equal(launch(fail=False), X)


def _signal_kernel(body):
  def kernel(x_ref, o_ref, sem):
    body(sem)
    o_ref[...] = x_ref[...]
  return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype),
                        scratch_shapes=[pltpu.SemaphoreType.REGULAR])


@pytest.mark.parametrize("body,text", [
    (lambda s: pl.semaphore_signal(s, 2**40), r"semaphore_signal of scratch\[0\] with semaphore increment "
                                              r"1099511627776: .*32-bit.*0 <= semaphore increment <= "
                                              r"2147483647"),
    (lambda s: pl.semaphore_signal(s, -1), r"semaphore increment -1: out of range"),
    (lambda s: pl.semaphore_wait(s, 2**32), r"semaphore_wait of scratch\[0\] with semaphore value "
                                            r"4294967296: out of range"),
])
def test_semaphore_amounts_beyond_32_bits_are_refused(body, text):
  with pytest.raises(pl.UsageError, match=text) as e:
    _signal_kernel(body)(X)
  assert isinstance(e.value, ValueError)


def test_the_largest_semaphore_amount_still_works():
  def body(s):
    pl.semaphore_signal(s, 2**31 - 1)
    pl.semaphore_wait(s, 2**31 - 1)
  np.testing.assert_array_equal(_signal_kernel(body)(X), X)


def test_a_kernel_that_is_not_callable():
  with pytest.raises(pl.UsageError, match=r"pallas_call\(kernel\) must be callable; got 42 \(int\)"):
    pl.pallas_call(42, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype))
  mesh = pltpu.TensorCoreMesh("core", 1)
  with pytest.raises(pl.UsageError, match=r"pl.kernel\(body\) must be callable; got 'body' \(str\)"):
    pl.kernel("body", out_type=pl.ShapeDtypeStruct(X.shape, X.dtype), mesh=mesh)
  with pytest.raises(pl.UsageError, match=r"pl.kernel\(body\[1\]\) must be callable; got None"):
    pl.kernel([lambda *r: None, None], out_type=(), mesh=[mesh, mesh])


@pytest.mark.parametrize("params,text", [
    ({"mosaic": {"dimension_semantic": ("parallel",)}},
     r"compiler_params\['mosaic'\] has the unknown key\(s\) \['dimension_semantic'\]; expected "
     r"pltpu.CompilerParams fields: dimension_semantics, .*vmem_limit_bytes"),
    ({"mosaic_tpu": {1: True}}, r"compiler_params=\{'mosaic_tpu': \.\.\.\} must map to a dict of "
                                r"pltpu.CompilerParams fields"),
    ({"mosaic": ["parallel"]}, r"must map to a dict .*got \['parallel'\]"),
])
def test_a_bad_compiler_params_dict(params, text):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  with pytest.raises(pl.UsageError, match=text):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), compiler_params=params)
  with pytest.raises(pl.UsageError, match=text.replace("pallas_call", "pl.kernel")):
    pl.kernel(kernel, out_type=pl.ShapeDtypeStruct(X.shape, X.dtype),
              mesh=pltpu.TensorCoreMesh("core", 1), compiler_params=params)


def test_a_good_compiler_params_dict_is_used():
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(X.shape, X.dtype), grid=(2,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     compiler_params={"mosaic": {"dimension_semantics": ("parallel",)}})
  np.testing.assert_array_equal(f(X), X * 2)


@pytest.mark.parametrize("data", [bytes(range(256)), b"x = 1\x00\n", "x = 'é'\n".encode("latin-1")],
                         ids=["binary", "nul", "latin-1 without a coding line"])
def test_load_module_of_a_file_that_is_not_python_text(tmp_path, data):
  f = tmp_path / "kernels.py"
  f.write_bytes(data)
  with pytest.raises(pl.UsageError, match=r"load_module: .*kernels.py is not Python source text.*Fix: "
                                          r"pass a .py file") as e:
    load_module(f)
  assert isinstance(e.value, ValueError)


def test_load_module_honours_a_coding_line(tmp_path):
  f = tmp_path / "latin.py"
  f.write_bytes("# -*- coding: latin-1 -*-\nNAME = 'é'\n".encode("latin-1"))
  assert load_module(f).NAME == "é"


def test_a_core_barrier_skipped_by_one_core_names_the_core_left_waiting():
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(X.shape, X.dtype),
                     mesh=pltpu.TensorCoreMesh("core", 2),
                     scratch_types=[pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR])
  def k(x_hbm, o_hbm, sem, done):
    c = lax.axis_index("core")

    @pl.when(c == 0)
    def _():
      pltpu.core_barrier(sem, core_axis_name="core")
      pl.semaphore_signal(done, 1, core_index=1)

    @pl.when(c == 1)
    def _():
      pl.semaphore_wait(done, 1)   # BUG: core 1 never reaches the barrier core 0 waits in

  with pl.virtual_tpu("v5p"), pytest.raises(
      pl.SyncError, match=r"(?s)Deadlock in kernel 'k'.*chip 0 core 0 is left waiting in "
                          r"pltpu.core_barrier\(core_axis_name='core'\) at test_launch_failures.py:\d+: "
                          r"chip 0 core 1 never reached a core_barrier. Fix:"):
    k(X)
