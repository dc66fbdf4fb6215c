"""Malformed arguments to the language and launch APIs that used to end in a bare Python error (or a
message without a fix): each is a named PalaceError that names the operand and place and says what to do."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu

from errcheck import raises

X = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
SDS = pl.ShapeDtypeStruct((8, 128), jnp.float32)


def _in_kernel(fn, scratch=pltpu.SemaphoreType.REGULAR):
  """Run `fn(x_ref, sem)` inside a one-step pallas_call on v5e."""
  def kernel(x_ref, o_ref, sem):
    fn(x_ref, sem)
    o_ref[...] = x_ref[...]

  f = pl.pallas_call(kernel, out_shape=SDS, scratch_shapes=[scratch])
  with pl.virtual_tpu("v5e"):
    return f(X)


def _loop_upper_a(x, s):
  @pl.loop(0, "a")
  def _(i):
    pass


@pytest.mark.parametrize("fn,cls,operand", [
    (lambda x, s: pl.program_id("a"), pl.UsageError, r"pl\.program_id\(axis\) must be an integer; got 'a' \(str\)"),
    (lambda x, s: pl.num_programs(1.5), pl.UsageError, r"pl\.num_programs\(axis\) must be an integer; got 1\.5"),
    (lambda x, s: pl.semaphore_signal(s, "a"), pl.ShapeError, r"semaphore increment .* got 'a' \(str\)"),
    (lambda x, s: (pl.semaphore_signal(s, 2), pl.semaphore_wait(s, 1.5)), pl.ShapeError,
     r"semaphore value .* got 1\.5 \(float\)"),
    (_loop_upper_a, pl.ShapeError, r"pl\.loop upper .* got 'a' \(str\)"),
    (lambda x, s: lax.fori_loop(0, "a", lambda i, c: c, 0), pl.ShapeError, r"fori_loop upper .* got 'a' \(str\)"),
    (lambda x, s: x[pl.ds("a", 8), :], pl.UsageError, r"pl\.ds start .* got 'a' \(str\)"),
    (lambda x, s: x[pl.ds(0, "b"), :], pl.UsageError, r"pl\.ds size .* got 'b' \(str\)"),
], ids=["program_id", "num_programs", "semaphore_signal", "semaphore_wait", "loop", "fori_loop", "ds_start",
        "ds_size"])
def test_kernel_side_calls(fn, cls, operand):
  raises(lambda: _in_kernel(fn), cls, operand)


def test_make_async_copy_destination_not_a_ref():
  msg = raises(lambda: _in_kernel(lambda x, s: pltpu.make_async_copy(x, "dst", s), pltpu.SemaphoreType.DMA),
               pl.UsageError, r"make_async_copy dst_ref must be a ref .*; got 'dst' \(str\)",
               r"Fix: pass a kernel ref")
  assert "test_malformed_args.py" in msg   # the kernel source line


def test_make_async_copy_source_not_a_ref():
  raises(lambda: _in_kernel(lambda x, s: pltpu.make_async_copy(np.ones((8, 128)), x, s), pltpu.SemaphoreType.DMA),
         pl.UsageError, r"make_async_copy src_ref must be a ref .*; got a numpy.ndarray of shape \(8, 128\)", r"Fix: pass a kernel ref")


@pytest.mark.parametrize("args,operand", [
    (("x", lambda: (0, 0)), r"pl\.BlockSpec\(block_shape\) must be a tuple of block dimensions; got 'x'"),
    (((8, 128), "notcallable"), r"pl\.BlockSpec\(index_map\) must be a function .*; got 'notcallable'"),
])
def test_block_spec_arguments(args, operand):
  raises(lambda: pl.BlockSpec(*args), pl.BlockSpecError, operand)


@pytest.mark.parametrize("grid", [(2,), (16,)])   # per-step and the vectorised first try
def test_index_map_wrong_number_of_entries(grid):
  spec = pl.BlockSpec((8, 128), lambda i: (0,))
  f = pl.pallas_call(lambda x, o: None, SDS, grid=grid, in_specs=[spec],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
  raises(lambda: f(X), pl.OutOfBoundsError,
         r"index_map of args\[0\] returned 1 indices \(0,\) for an array of rank 2 at grid point \(0,\)",
         r"Fix: return one block index per dimension of args\[0\], e.g. \(i, 0\)")


@pytest.mark.parametrize("grid", [(2,), (16,)])
def test_index_map_that_raises(grid):
  def index_map(i):
    if i == 1:
      raise KeyError("boom")
    return (0, 0)

  f = pl.pallas_call(lambda x, o: None, SDS, grid=grid, in_specs=[pl.BlockSpec((8, 128), index_map)],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
  with pl.virtual_tpu("v5e"):
    raises(lambda: f(X), pl.BlockSpecError,
           r"index_map of args\[0\] \('index_map'\) raised KeyError\('boom'\) at grid point \(1,\)",
           r"Fix: make the index map return block indices for every point of its grid")


def test_index_map_that_raises_keeps_cause():
  def index_map(i):
    raise ZeroDivisionError("x")

  f = pl.pallas_call(lambda x, o: None, SDS, grid=(1,), in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
                     out_specs=pl.BlockSpec((8, 128), index_map))
  with pytest.raises(pl.BlockSpecError, match=r"index_map of outputs\[0\] .* at grid point \(0,\)") as info:
    f(X)
  assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_index_map_raising_a_palace_error_is_not_wrapped():
  def index_map(i):
    return (pl.program_id("a"), 0)

  f = pl.pallas_call(lambda x, o: None, SDS, grid=(1,), in_specs=[pl.BlockSpec((8, 128), index_map)],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)))
  raises(lambda: f(X), pl.UsageError, r"pl\.program_id\(axis\) must be an integer")


@pytest.mark.parametrize("out", [42, 1.5, "f32"])
def test_pallas_call_out_shape(out):
  raises(lambda: pl.pallas_call(lambda x, o: None, out_shape=out)(X), pl.UsageError,
         r"out_shape(\[0\])? = ", r"Fix: pass e\.g\. pl\.ShapeDtypeStruct")


def test_emit_pipeline_index_map_that_raises():
  def index_map(i):
    return (0, {}[i])   # KeyError at the first step

  def kernel(x_hbm, o_hbm):
    pltpu.emit_pipeline(lambda a, b: None, grid=(2,), in_specs=[pl.BlockSpec((8, 128), index_map)],
                        out_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))])(x_hbm, o_hbm)

  f = pl.pallas_call(kernel, SDS, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                     out_specs=pl.BlockSpec(memory_space=pl.ANY))
  with pl.virtual_tpu("v5e"):
    raises(lambda: f(X), pl.BlockSpecError, r"index_map of args\[0\] \('index_map'\) raised KeyError\(0\) at "
           r"grid point \(0,\)", r"Fix: make the index map return block indices for every point of its grid")
