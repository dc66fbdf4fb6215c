"""Static indices of refs and values are bounds-checked like pl.ds: NumPy would clip a slice beyond
the block (`x_ref[200:208, :]` of a (128, 256) block gave an empty array). Legal negative indices keep
their NumPy meaning."""
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import OutOfBoundsError, PalaceError
from palace import tpu as pltpu

X = np.arange(256 * 256, dtype=np.float32).reshape(256, 256)


def _run(index_fn, out_shape, on_value=False):
  """index_fn(x) -> value, on the (128, 256) block of args[0] at grid point (1,) (rows 128..255)."""
  def kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 1)
    def _():
      o_ref[...] = index_fn(x_ref[...] if on_value else x_ref)

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(out_shape, np.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((128, 256), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec(out_shape, lambda i: (0,) * len(out_shape)))
  with pl.virtual_tpu("v5e"):
    return f(X)


BAD_REF = [
    ("200:208, :", lambda r: r[200:208, :], (8, 256), "start 200"),
    ("120:136", lambda r: r[120:136], (8, 256), "stop 136"),
    (":, 250:260", lambda r: r[:8, 250:260], (8, 6), "stop 260"),
    ("-200:", lambda r: r[-200:-192], (8, 256), "start -200"),
    ("strided", lambda r: r[0:256:32], (8, 256), "stop 256"),
    ("ellipsis", lambda r: r[..., 300:301], (128, 1), "start 300"),
    ("int", lambda r: r[128], (256,), "Index 128"),
    ("negative int", lambda r: r[-129], (256,), "Index -1 "),
    ("at", lambda r: r.at[200:208][...], (8, 256), "start 200"),
    ("at then slice", lambda r: r.at[120:128][0:16], (8, 256), "stop 16"),
]


@pytest.mark.parametrize("name,fn,shape,what", BAD_REF, ids=[b[0] for b in BAD_REF])
def test_out_of_block_ref_index_is_an_error(name, fn, shape, what):
  with pytest.raises(OutOfBoundsError, match=what) as e:
    _run(fn, shape)
  msg = str(e.value)
  assert isinstance(e.value, IndexError) and isinstance(e.value, PalaceError)
  assert "args[0]" in msg and "shape (" in msg
  assert "grid point (1,)" in msg and "test_silent_indexing.py" in msg


def test_slice_message_names_operand_index_shape_point_and_line():
  with pytest.raises(OutOfBoundsError) as e:
    _run(lambda r: r[200:208, :], (8, 256))
  msg = str(e.value)
  for part in ("args[0]", "[200:208, :]", "shape (128, 256)", "grid point (1,)", "kernel 'kernel'",
               "test_silent_indexing.py", "Fix"):
    assert part in msg, (part, msg)


LEGAL = [
    ("-8:", lambda r: r[-8:], (8, 256), lambda b: b[-8:]),
    ("-16:-8", lambda r: r[-16:-8, -128:], (8, 128), lambda b: b[-16:-8, -128:]),
    ("strided", lambda r: r[0:16:2], (8, 256), lambda b: b[0:16:2]),
    ("full bounds", lambda r: r[0:128][120:128], (8, 256), lambda b: b[120:128]),
    ("int -1", lambda r: r[-1], (256,), lambda b: b[-1]),
    ("np int", lambda r: r[np.int32(5)], (256,), lambda b: b[5]),
    ("ds np", lambda r: r[pl.ds(np.int64(8), 8)], (8, 256), lambda b: b[8:16]),
    ("ds strided", lambda r: r[pl.ds(0, 8, 16)], (8, 256), lambda b: b[0:128:16]),
    ("ellipsis", lambda r: r[..., 8:16][0:8], (8, 8), lambda b: b[0:8, 8:16]),
]


CASES = [(*c, False) for c in LEGAL] + [(*c, True) for c in LEGAL if not c[0].startswith("ds")]


@pytest.mark.parametrize("name,fn,shape,ref,on_value", CASES,
                         ids=[f"{c[0]}-{'value' if c[4] else 'ref'}" for c in CASES])
def test_legal_indices_keep_numpy_meaning(name, fn, shape, ref, on_value):   # pl.ds: refs only, as JAX
  out = _run(fn, shape, on_value=on_value)
  np.testing.assert_array_equal(out, ref(X[128:]))


BAD_VALUE = [
    ("200:208", lambda v: v[200:208], (8, 256), "start 200"),
    ("120:136", lambda v: v[120:136], (8, 256), "stop 136"),
    ("ellipsis", lambda v: v[..., 250:260], (128, 6), "stop 260"),
    ("newaxis", lambda v: v[None, 0:8, 300:302][0], (8, 2), "start 300"),
    ("int", lambda v: v[128], (256,), "out of bounds"),
]


@pytest.mark.parametrize("name,fn,shape,what", BAD_VALUE, ids=[b[0] for b in BAD_VALUE])
def test_out_of_bounds_value_index_is_an_error(name, fn, shape, what):
  with pytest.raises(OutOfBoundsError, match=what) as e:
    _run(fn, shape, on_value=True)
  assert "(128, 256)" in str(e.value)


NON_INT = [
    ("float slice", lambda r: r[0:8.0], (8, 256), "slice stop 8.0"),
    ("float step", lambda r: r[0:16:2.0], (8, 256), "slice step 2.0"),
    ("bool", lambda r: r[True], (256,), "bool is not an index"),
    ("negative step", lambda r: r[16:0:-2], (8, 256), "not positive"),
    ("ds float start", lambda r: r[pl.ds(0.5, 8)], (8, 256), "pl.ds start"),
    ("ds float size", lambda r: r[pl.ds(0, 8.0)], (8, 256), "pl.ds size"),
    ("ds float stride", lambda r: r[pl.ds(0, 8, 1.5)], (8, 256), "pl.ds stride"),
    ("ds zero stride", lambda r: r[pl.ds(0, 8, 0)], (8, 256), "pl.ds stride"),
]


@pytest.mark.parametrize("name,fn,shape,what", NON_INT, ids=[b[0] for b in NON_INT])
def test_non_integer_ref_indices_are_errors(name, fn, shape, what):
  with pytest.raises(PalaceError, match=what) as e:
    _run(fn, shape)
  assert isinstance(e.value, (ValueError, TypeError, IndexError))


@pytest.mark.parametrize("idx,what", [(1.0, "must be integers"), (np.float32(2), "must be integers"),
                                      (True, "must be integers"), (pl.ds(0, 8), "pl.ds indexes refs")],
                         ids=["float", "np.float32", "bool", "pl.ds"])
def test_non_integer_value_indices_are_errors(idx, what):
  with pytest.raises(PalaceError, match=what) as e:
    _run(lambda v: v[idx], (256,), on_value=True)
  assert isinstance(e.value, ValueError)


def test_hbm_ref_view_beyond_the_array_is_an_error():
  def body(x_hbm, o_hbm, buf):
    pltpu.sync_copy(x_hbm.at[250:258], buf)
    pltpu.sync_copy(buf, o_hbm)

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((8, 256), np.float32),
                mesh=pltpu.TensorCoreMesh("core", 1), scratch_types=[pltpu.VMEM((8, 256), jnp.float32)])
  with pl.virtual_tpu("v5e"):
    with pytest.raises(OutOfBoundsError, match=r"args\[0\].*stop 258.*256 elements"):
      k(X)
