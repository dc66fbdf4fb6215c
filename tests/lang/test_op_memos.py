"""Per-op work a kernel repeats every grid step, done once (session 25): a static ref index composed
once (refs._VIEWS), lax.dot_general's shapes and type checks once per signature (numpy_linalg
_dot_shapes / _dot_types), jnp.tile without np.tile's Python layers. Counted, and compared with NumPy."""
import numpy as np
import pytest

import palace as pl
import palace.lax as lax
import palace.numpy as jnp
from palace import tpu as pltpu
from palace._src.lang import mxu, numpy_linalg, refs

STEPS = 8


def _counting(monkeypatch, owner, name):
  calls = [0]
  real = getattr(owner, name)

  def counted(*a, **k):
    calls[0] += 1
    return real(*a, **k)
  monkeypatch.setattr(owner, name, counted)
  return calls


def _ints(shape, seed):
  return np.random.default_rng(seed).integers(-4, 5, shape).astype(np.float32)


def test_a_static_ref_index_is_composed_once_per_view(monkeypatch):
  x = _ints((STEPS, 2, 16, 128), 0)
  composed = _counting(monkeypatch, refs.Ref, "_compose")

  def kernel(x_ref, o_ref):
    o_ref[0, 0] = x_ref[0, 1] * 2.0                          # ints: a view
    o_ref[0, 1, pl.ds(8, 8), :] = x_ref[0, 0, pl.ds(0, 8), :]   # ints, pl.ds and ':'
    o_ref[0, 1, 0:8] = x_ref[0, 0, 8:16] + 1.0              # a bounded slice: composed every time
    o_ref[0, 1, 0, 0] = x_ref[0, 1, 3, 5]                   # one element

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(STEPS,),
                       in_specs=[pl.BlockSpec((1, 2, 16, 128), lambda i: (i, 0, 0, 0))],
                       out_specs=pl.BlockSpec((1, 2, 16, 128), lambda i: (i, 0, 0, 0)))(x)
  ref = np.empty_like(x)
  ref[:, 0] = x[:, 1] * 2
  ref[:, 1, 8:16] = x[:, 0, 0:8]
  ref[:, 1, 0:8] = x[:, 0, 8:16] + 1
  ref[:, 1, 0, 0] = x[:, 1, 3, 5]
  np.testing.assert_array_equal(out, ref)
  # six static indices once each (the first step; the blocks' two slots share a shape and view) and
  # the two bounded slices every step
  assert composed[0] == 6 + 2 * STEPS


@pytest.mark.parametrize("bad, error, match", [
    (1.0, pl.UsageError, "Unsupported index 1.0"),
    (True, pl.UsageError, "a bool is not an index"),
    (16, pl.OutOfBoundsError, "Index 16 out of bounds"),
    (slice(0.0, 8), pl.UsageError, "slice start 0.0 .*not an integer"),
])
def test_a_kept_index_never_answers_an_equal_index_of_another_type(bad, error, match):
  """1.0 == True == 1 and slice(0.0, 8) == slice(0, 8): each is checked as written, after the int
  form's view was kept."""
  x = _ints((16, 128), 1)

  def run(index):
    def kernel(x_ref, o_ref):
      o_ref[...] = jnp.zeros_like(o_ref)
      o_ref[0:8] = jnp.broadcast_to(x_ref[index], (8, 128)) if type(index) is not slice else \
          x_ref[index]
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  good = slice(0, 8) if type(bad) is slice else 1
  np.testing.assert_array_equal(run(good)[0:8], np.broadcast_to(x[good], (8, 128)))
  with pytest.raises(error, match=match):
    run(bad)


def test_dot_general_checks_its_signature_once_and_matches_numpy(monkeypatch):
  q, k = _ints((STEPS * 128, 64), 2), _ints((128, 64), 3)
  a, b = _ints((STEPS * 2, 32, 16), 4), _ints((2, 16, 128), 5)
  checks = _counting(monkeypatch, mxu, "check")
  numpy_linalg._DOT_TYPES.clear()
  numpy_linalg._DOT_SHAPES.clear()

  def kernel(q_ref, k_ref, a_ref, b_ref, s_ref, c_ref):
    s_ref[...] = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)      # q @ k.T
    c_ref[...] = lax.dot_general(a_ref[...], b_ref[...], (((2,), (1,)), ((0,), (0,))),
                                 precision="HIGHEST")         # batched

  s, c = pl.pallas_call(
      kernel, grid=(STEPS,),
      out_shape=(pl.ShapeDtypeStruct((STEPS * 128, 128), np.float32),
                 pl.ShapeDtypeStruct((STEPS * 2, 32, 128), np.float32)),
      in_specs=[pl.BlockSpec((128, 64), lambda i: (i, 0)), pl.BlockSpec((128, 64), lambda i: (0, 0)),
                pl.BlockSpec((2, 32, 16), lambda i: (i, 0, 0)),
                pl.BlockSpec((2, 16, 128), lambda i: (0, 0, 0))],
      out_specs=(pl.BlockSpec((128, 128), lambda i: (i, 0)),
                 pl.BlockSpec((2, 32, 128), lambda i: (i, 0, 0))))(q, k, a, b)
  np.testing.assert_array_equal(s, q @ k.T)   # (small integers: exact in any summation order)
  np.testing.assert_array_equal(c, np.einsum("bij,bjk->bik", a, np.tile(b, (STEPS, 1, 1))))
  assert checks[0] == 2   # once per signature, not per step


def test_dot_general_errors_name_it():
  x = np.ones((8, 128), np.uint8)

  def kernel(x_ref, o_ref):
    o_ref[...] = lax.dot_general(x_ref[...], x_ref[...], (((1,), (1,)), ((), ())))

  with pytest.raises(pl.UnsupportedError, match="lax.dot_general"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 8), np.uint8))(x)
  with pytest.raises(pl.ShapeError, match="contracting dimensions differ"):
    pl.pallas_call(lambda x_ref, o_ref: lax.dot_general(
        x_ref[...], x_ref[...], (((1,), (0,)), ((), ()))),
        out_shape=pl.ShapeDtypeStruct((8, 8), np.float32))(x.astype(np.float32))


@pytest.mark.parametrize("shape, reps", [((8, 128), (1, 2)), ((8, 128), (2, 3)), ((16, 1), (1, 128)),
                                         ((128,), (2,)), ((2, 8, 128), (2, 1)), ((8, 128), (1, 2, 1))])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16.dtype, np.int32])
def test_tile_is_numpys(shape, reps, dtype, monkeypatch):
  x = _ints(shape, 6).astype(dtype)
  want = np.tile(x, reps)
  numpys = _counting(monkeypatch, np, "tile")   # (one broadcasting copy instead: no np.tile per step)

  def kernel(x_ref, o_ref):
    o_ref[...] = jnp.tile(x_ref[...], reps)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(want.shape, want.dtype))(x)
  assert out.dtype == want.dtype
  np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
  assert numpys[0] == 0


def test_value_indexing_and_reshapes_are_checked_once_per_signature(monkeypatch):
  from palace._src.lang import numpy_indexing, numpy_shape
  x = _ints((STEPS * 8, 128), 7)
  numpy_indexing._GETITEMS.clear()
  numpy_shape._RESHAPES.clear()
  indexed = _counting(monkeypatch, numpy_indexing, "_static_index")
  shaped = _counting(monkeypatch, numpy_shape, "_shape_of")   # (reshape's checks start with it)

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    m = jnp.max(v, axis=1)[:, None]              # (8,) -> (8, 1): a reshape
    row = v[3]                                    # an int: a relayout
    o_ref[...] = v - m + row[None, :] + v.reshape(8, 128)[:, ...][0:8]   # (a bounded slice: every step)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(STEPS,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  blocks = x.reshape(STEPS, 8, 128)
  want = blocks - blocks.max(axis=2, keepdims=True) + blocks[:, 3:4, :] + blocks
  np.testing.assert_array_equal(out, want.reshape(x.shape))
  assert indexed[0] == 4 + STEPS   # [:, None], [3], [None, :], [:, ...] once; [0:8] every step
  assert shaped[0] == 3            # reshapes (8,)->(8,1), (128,)->(1,128), (8,128)->(8,128) once


@pytest.mark.parametrize("bad, error, match", [
    ((1.0,), pl.UsageError, "indices must be integers"),
    ((True,), pl.UsageError, "indices must be integers"),
])
def test_a_kept_value_index_never_answers_an_equal_index_of_another_type(bad, error, match):
  x = _ints((8, 128), 8)

  def run(index):
    def kernel(x_ref, o_ref):
      o_ref[...] = jnp.broadcast_to(x_ref[...][index], (8, 128))
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  np.testing.assert_array_equal(run((1,)), np.broadcast_to(x[1], (8, 128)))
  with pytest.raises(error, match=match):
    run(bad)


def test_a_kept_reshape_never_answers_an_equal_shape_of_another_type():
  x = _ints((8, 128), 9)

  def run(shape):
    def kernel(x_ref, o_ref):
      o_ref[...] = x_ref[...].reshape(shape).reshape(8, 128)
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  np.testing.assert_array_equal(run((4, 256)), x)
  np.testing.assert_array_equal(run((np.int32(4), 256)), x)
  with pytest.raises(pl.ShapeError, match=r"reshape shape\[0\]"):
    run((4.0, 256))


def test_a_kept_hbm_view_into_the_tile_padding_is_not_a_vmem_ones():
  """x_hbm.at[pl.ds(0, 16)] of a (12, 128) float32 HBM array reaches into its last 8-row tile's
  padding (hbm_tiles); the same window of a VMEM buffer of that shape and dtype is out of bounds,
  after the HBM view was kept."""
  x = _ints((12, 128), 10)
  seen = []

  def kernel(x_hbm, o_ref, scratch):
    for _ in range(2):
      seen.append(x_hbm.at[pl.ds(0, 16)].shape)
    o_ref[...] = jnp.zeros_like(o_ref)
    scratch.at[pl.ds(0, 16)]

  with pytest.raises(pl.OutOfBoundsError, match=r"Slice \[0:16\] out of bounds for axis 0"):
    pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.float32),
                   in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                   scratch_shapes=[pltpu.VMEM((12, 128), np.float32)])(x)
  assert seen == [(16, 128)] * 2


def test_a_kernel_reduction_enters_no_context_manager(monkeypatch):
  """Kernels run under np.errstate(all="ignore") set once per core: a reduction without a where=
  mask calls the ufunc's reduce directly (before: two nullcontexts entered and left, six calls)."""
  from palace._src.lang import numpy_reductions
  entered = _counting(monkeypatch, numpy_reductions.contextlib, "nullcontext")
  x = _ints((8, 128), 11)

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = v - jnp.max(v, axis=1, keepdims=True) + jnp.sum(v, axis=0)[None, :]

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))(x)
  np.testing.assert_array_equal(out, x - x.max(axis=1, keepdims=True) + x.sum(axis=0)[None, :])
  assert entered[0] == 0


def test_iota_and_where_are_worked_out_once_per_signature(monkeypatch):
  from palace._src.lang import lax_ops, numpy_elementwise
  lax_ops._IOTAS.clear()
  numpy_elementwise._WHERES.clear()
  iotas = _counting(monkeypatch, lax_ops, "_dtype_arg")   # (an iota's checks, then its data)
  promotions = _counting(monkeypatch, numpy_elementwise, "_broadcast_shapes")
  x = _ints((STEPS * 8, 128), 12)

  def kernel(x_ref, o_ref, i_ref):
    rows = lax.broadcasted_iota(jnp.int32, (8, 128), 0) + pl.program_id(0) * 8
    cols = lax.broadcasted_iota(jnp.int32, (8, 128), 1)
    o_ref[...] = jnp.where(cols <= rows, x_ref[...], -1e9)        # a causal mask
    i_ref[...] = jnp.where(cols < 64, lax.broadcasted_iota(jnp.float32, (8, 128), 1), 2)

  out, io = pl.pallas_call(
      kernel, grid=(STEPS,),
      out_shape=(pl.ShapeDtypeStruct(x.shape, x.dtype), pl.ShapeDtypeStruct(x.shape, np.float32)),
      in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
      out_specs=(pl.BlockSpec((8, 128), lambda i: (i, 0)), pl.BlockSpec((8, 128), lambda i: (i, 0))))(x)
  r, c = np.indices(x.shape)
  np.testing.assert_array_equal(out, np.where(c <= r, x, np.float32(-1e9)))
  np.testing.assert_array_equal(io, np.where(c < 64, c, 2).astype(np.float32))
  assert iotas[0] == 3                    # three iotas (int32 rows, int32 cols, float32 cols), once each
  # the two wheres' promotion and broadcasting once each (the elementwise ops take their fast paths)
  assert promotions[0] == 2


def test_a_kept_iota_never_answers_an_equal_dimension_of_another_type():
  def run(dimension):
    def kernel(o_ref):
      o_ref[...] = lax.broadcasted_iota(jnp.int32, (8, 128), dimension)
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((8, 128), np.int32))()
  np.testing.assert_array_equal(run(1), np.indices((8, 128))[1])
  with pytest.raises(pl.ShapeError, match="dimension"):
    run(1.0)


def test_broadcasting_is_worked_out_once_per_shapes(monkeypatch):
  from palace._src.lang import numpy_base
  numpy_base._BROADCASTS.clear()
  x = _ints((STEPS * 8, 128), 13)
  numpys = _counting(monkeypatch, np, "broadcast_shapes")

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    o_ref[...] = v * jnp.max(v, axis=1, keepdims=True) - jnp.min(v, axis=0, keepdims=True)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(STEPS,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  b = x.reshape(STEPS, 8, 128)
  want = b * b.max(axis=2, keepdims=True) - b.min(axis=1, keepdims=True)
  np.testing.assert_array_equal(out, want.reshape(x.shape))
  assert numpys[0] == 2   # ((8, 128), (8, 1)) and ((8, 128), (1, 128)), once each


def test_einsum_parses_its_subscripts_once():
  """One dimension-numbers tuple per subscripts: dot_general's identity-keyed memo finds it on every
  later step (a fresh tuple per call missed it and was kept alive, up to 1024 of them)."""
  numpy_linalg._EINSUMS.clear()
  numpy_linalg._DIMENSION_NUMBERS.clear()
  q, k = _ints((STEPS * 8, 128), 14), _ints((STEPS * 128, 128), 15)

  def kernel(q_ref, k_ref, o_ref):
    o_ref[...] = jnp.einsum("qd,kd->qk", q_ref[...], k_ref[...], preferred_element_type=jnp.float32)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((STEPS * 8, 128), np.float32), grid=(STEPS,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)),
                                 pl.BlockSpec((128, 128), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(q, k)
  want = np.einsum("bqd,bkd->bqk", q.reshape(STEPS, 8, 128), k.reshape(STEPS, 128, 128))
  np.testing.assert_array_equal(out, want.reshape(STEPS * 8, 128))
  assert len(numpy_linalg._EINSUMS) == 1 and len(numpy_linalg._DIMENSION_NUMBERS) == 1


def test_a_reduction_is_analysed_once_per_signature(monkeypatch):
  """A reduction's axes, result type and shape and cost class are worked out once per (reduction,
  operand shape and dtype, axis, keepdims) (numpy_reductions._PLANS, session 27), and the two-Array
  elementwise ops that broadcast a reduced column or row take their one-dtype path: no type
  promotion. Results are NumPy's."""
  from palace._src import dtypes
  from palace._src.lang import numpy_reductions
  numpy_reductions._PLANS.clear()
  analysed = _counting(monkeypatch, numpy_reductions, "_norm_axes")
  promoted = _counting(monkeypatch, dtypes, "result_type")
  x = _ints((STEPS * 8, 128), 14)

  def kernel(x_ref, o_ref):
    v = x_ref[...]
    m = jnp.max(v, axis=-1, keepdims=True)
    o_ref[...] = (v - m) * jnp.sum(v, axis=1, keepdims=True) + jnp.min(v, axis=0, keepdims=True) + \
        jnp.sum(v, axis=0)[None, :] + jnp.max(v)

  out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(STEPS,),
                       in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                       out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x)
  b = x.reshape(STEPS, 8, 128)
  want = (b - b.max(axis=2, keepdims=True)) * b.sum(axis=2, keepdims=True) + \
      b.min(axis=1, keepdims=True) + b.sum(axis=1)[:, None, :] + b.max(axis=(1, 2), keepdims=True)
  np.testing.assert_array_equal(out, want.reshape(x.shape))
  assert analysed[0] == 5      # (axis -1 and 1 of one shape are two signatures; keepdims another)
  assert promoted[0] == 0


def test_a_kept_reduction_never_answers_another_axis_form():
  """An axis is kept by its value and its entries' types (an equal axis of another type is analysed
  on its own, and raises its own error); an out-of-range axis raises every time."""
  x = _ints((8, 128), 15)

  def run(**kw):
    def kernel(x_ref, o_ref):
      o_ref[...] = jnp.sum(x_ref[...], keepdims=True, **kw)
    return pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((1, 1) if "axis" not in kw or
                                                                 kw["axis"] == (0, 1) else (8, 1)
                                                                 if kw["axis"] in (1, -1) else (1, 128),
                                                                 x.dtype))(x)
  np.testing.assert_array_equal(run(axis=1), x.sum(axis=1, keepdims=True))
  np.testing.assert_array_equal(run(axis=-1), x.sum(axis=1, keepdims=True))
  np.testing.assert_array_equal(run(axis=(0, 1)), x.sum(keepdims=True))
  np.testing.assert_array_equal(run(), x.sum(keepdims=True))
  for _ in range(2):
    with pytest.raises(pl.ShapeError, match="Reduction axis 2 is out of range"):
      run(axis=2)
    with pytest.raises(pl.ShapeError, match="axis"):
      run(axis=(0, 1.0))
    np.testing.assert_array_equal(run(axis=(0, 1)), x.sum(keepdims=True))
