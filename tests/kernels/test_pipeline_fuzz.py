"""Property test of the pallas_call pipeline: random shapes, blocks, index maps and buffer counts
against NumPy (covers vectorised index maps, ragged edges, revisits, lazy output initialisation)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


@st.composite
def cases(draw):
  rb = draw(st.sampled_from([8, 16, 32]))
  cb = draw(st.sampled_from([128, 256]))
  nr = draw(st.integers(1, 5))
  nc = draw(st.integers(1, 3))
  ragged = draw(st.booleans())
  rows = nr * rb - (draw(st.integers(1, rb - 1)) if ragged and nr > 1 else 0)
  cols = nc * cb
  reverse = draw(st.booleans())
  buffers = draw(st.sampled_from([None, 1, 2, 3]))
  dtype = draw(st.sampled_from([np.float32, jnp.bfloat16, np.int32]))
  policy = draw(st.sampled_from(["eager", "on_wait", "random"]))
  seed = draw(st.integers(0, 3))
  return rb, cb, nr, nc, rows, cols, reverse, buffers, dtype, policy, seed


@settings(max_examples=40, deadline=None)
@given(cases())
def test_blockwise_scale_and_row_sums_match_numpy(case):
  rb, cb, nr, nc, rows, cols, reverse, buffers, dtype, policy, seed = case
  rng = np.random.default_rng(seed)
  x = (rng.integers(-50, 50, size=(rows, cols))).astype(dtype)
  mode = None if buffers is None else pl.Buffered(buffers)

  def imap(i, j):
    return ((nr - 1 - i) if reverse else i, j)

  def kernel(x_ref, y_ref, s_ref):
    y_ref[...] = x_ref[...] * 2

    @pl.when(pl.program_id(1) == 0)
    def _():
      s_ref[...] = jnp.zeros_like(s_ref)

    # the row-sum block is revisited on consecutive steps (j innermost): an accumulator
    s_ref[...] += jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True) * \
        jnp.ones((1, 128), jnp.float32)

  f = pl.pallas_call(
      kernel, grid=(nr, nc),
      out_shape=(pl.ShapeDtypeStruct((rows, cols), x.dtype),
                 pl.ShapeDtypeStruct((rows, 128), np.float32)),
      in_specs=[pl.BlockSpec((rb, cb), imap, pipeline_mode=mode)],
      out_specs=[pl.BlockSpec((rb, cb), imap), pl.BlockSpec((rb, 128), lambda i, j: (imap(i, j)[0], 0))],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))
  with pl.virtual_tpu("v5p" if seed % 2 else "v5e", dma_policy=policy, seed=seed):
    y, s = f(x)
  np.testing.assert_array_equal(y, (x.astype(np.float32) * 2).astype(dtype))
  expected = np.broadcast_to(x.astype(np.float32).sum(axis=1, keepdims=True), (rows, 128))
  np.testing.assert_array_equal(s, expected)
