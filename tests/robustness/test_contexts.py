"""`pl.virtual_tpu` contexts: re-entering the same object, nesting and out-of-order exits never leave a
stale active TPU (a double entry used to leave v6e active for every later launch of the thread)."""
import numpy as np

import palace as pl
import palace.numpy as jnp
from palace._src.sim.machine import explicit_tpu


def _copy(x, o):
  o[...] = x[...]


def _launch():
  return pl.pallas_call(_copy, pl.ShapeDtypeStruct((8, 128), jnp.float32))(np.ones((8, 128), np.float32))


def test_double_entry_of_one_object():
  tpu = pl.virtual_tpu("v6e")
  with tpu:
    with tpu:
      assert explicit_tpu() is tpu
    assert explicit_tpu() is tpu     # still inside the outer `with`
    _launch()
  assert explicit_tpu() is None      # used to stay v6e for the rest of the thread
  assert len(tpu.reports) == 1       # recorded once, not once per entry


def test_triple_entry_then_nested_other():
  a, b = pl.virtual_tpu("v6e"), pl.virtual_tpu("v4")
  with a, a, a:
    with b:
      _launch()
      assert explicit_tpu() is b
    assert explicit_tpu() is a
  assert explicit_tpu() is None
  assert len(a.reports) == 1 and len(b.reports) == 1   # nested launches count for the enclosing one


def test_out_of_order_exits():
  a, b = pl.virtual_tpu("v6e"), pl.virtual_tpu("v4")
  a.__enter__()
  b.__enter__()
  a.__exit__(None, None, None)      # a leaves first: b stays active, and after b nothing is
  assert explicit_tpu() is b
  b.__exit__(None, None, None)
  assert explicit_tpu() is None


def test_out_of_order_exits_three_deep():
  a, b, c = pl.virtual_tpu("v4"), pl.virtual_tpu("v5p"), pl.virtual_tpu("v6e")
  for t in (a, b, c):
    t.__enter__()
  b.__exit__(None, None, None)
  assert explicit_tpu() is c
  c.__exit__(None, None, None)
  assert explicit_tpu() is a
  a.__exit__(None, None, None)
  assert explicit_tpu() is None


def test_exit_without_entry_is_harmless():
  a = pl.virtual_tpu("v6e")
  with pl.virtual_tpu("v4") as outer:
    a.__exit__(None, None, None)
    assert explicit_tpu() is outer
  assert explicit_tpu() is None


def test_exit_twice():
  a = pl.virtual_tpu("v6e")
  a.__enter__()
  a.__exit__(None, None, None)
  a.__exit__(None, None, None)
  assert explicit_tpu() is None


def test_reentry_after_exit_and_error_inside():
  a = pl.virtual_tpu("v6e")
  try:
    with a:
      raise KeyError("boom")
  except KeyError:
    pass
  assert explicit_tpu() is None
  with a:
    _launch()
  assert explicit_tpu() is None and len(a.reports) == 1


def test_interleaved_reentry():
  a, b = pl.virtual_tpu("v6e"), pl.virtual_tpu("v4")
  with a:
    with b:
      with a:
        assert explicit_tpu() is a
        _launch()
      assert explicit_tpu() is b
    assert explicit_tpu() is a
  assert explicit_tpu() is None
  assert len(a.reports) == 1 and len(b.reports) == 1   # each context records a launch once
