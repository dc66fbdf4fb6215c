"""jnp.where's data path (numpy_base._select): the same bits as np.where for every dtype and broadcast,
above and below the size where it switches to a branch-free bit select."""
import zlib

import ml_dtypes
import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace._src.lang.numpy_base import _SELECT_BITWISE_MIN, _select

_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.float16,
           ml_dtypes.bfloat16, np.float32, np.float64, np.complex64, np.complex128]


def _values(rng, shape, dtype):
  if np.dtype(dtype) == np.bool_:
    return rng.random(shape) < 0.5
  bits = rng.integers(0, 256, (*shape, np.dtype(dtype).itemsize), dtype=np.uint8)
  v = bits.view(dtype).reshape(shape)   # every bit pattern: NaNs with payloads, -0.0, infinities
  return v


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", [((64, 128),) * 3, ((8, 4),) * 3, ((64, 128), (64, 1), (1, 128)),
                                    ((64, 1), (64, 128), ()), ((), (32, 64), (32, 64))],
                         ids=["equal", "small", "broadcast", "mask-column", "scalar-mask"])
def test_select_gives_np_where_bits(dtype, shapes):
  rng = np.random.default_rng(zlib.crc32(repr((np.dtype(dtype).name, shapes)).encode()))
  cs, xs, ys = shapes
  c = rng.random(cs) < 0.5
  x, y = _values(rng, xs, dtype), _values(rng, ys, dtype)
  got, want = _select(c, x, y), np.where(c, x, y)
  assert got.dtype == want.dtype and got.shape == want.shape
  u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[want.dtype.itemsize]
  assert np.array_equal(np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u))


def test_select_uses_the_bit_select_from_one_vreg_up(monkeypatch):
  calls = []
  real = np.where
  monkeypatch.setattr(np, "where", lambda *a: calls.append(1) or real(*a))
  c = np.arange(_SELECT_BITWISE_MIN) % 3 == 0
  x = np.arange(_SELECT_BITWISE_MIN, dtype=np.float32)
  _select(c, x, -x)
  assert not calls
  _select(c[:8], x[:8], -x[:8])
  assert calls == [1]


def test_where_in_a_kernel_matches_numpy_on_random_masks():
  rng = np.random.default_rng(3)
  a = rng.standard_normal((256, 256)).astype(np.float32)
  a[::7, ::5] = np.nan
  b = rng.standard_normal((256, 256)).astype(np.float32)

  def kernel(a_ref, b_ref, o_ref):
    x, y = a_ref[...], b_ref[...]
    o_ref[...] = jnp.where(x > y, x, jnp.where(y > 0, y, -0.0))

  spec = pl.BlockSpec((128, 256), lambda i: (i, 0))
  with pl.virtual_tpu("v5e"):
    out = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(a.shape, a.dtype), grid=(2,),
                         in_specs=[spec, spec], out_specs=spec)(a, b)
  want = np.where(a > b, a, np.where(b > 0, b, np.float32(-0.0)))
  assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
