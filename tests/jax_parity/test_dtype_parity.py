"""The dtype predicates a loaded module sees (`jax.numpy` / `jax.dtypes` under palace.compat) agree with
real JAX for every TPU dtype: issubdtype against every category and dtype, promote_types and
result_type of every pair (incl. weak Python scalars), finfo and iinfo fields."""
import itertools
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as real_jnp  # noqa: E402

import palace.compat  # noqa: E402
from palace._src import dtypes as dt  # noqa: E402

NAMES = ["bool_", "int4", "int8", "int16", "int32", "uint4", "uint8", "uint16", "uint32", "bfloat16",
         "float16", "float32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz"]
CATEGORIES = ["generic", "number", "integer", "signedinteger", "unsignedinteger", "inexact",
              "floating", "bool_"]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
  f = tmp_path_factory.mktemp("dtypes") / "dtype_probe.py"
  f.write_text(textwrap.dedent("""
      import jax
      import jax.numpy as jnp
      from jax import dtypes
  """))
  return palace.compat.load_module(f)


def _outcome(fn):
  try:
    return np.dtype(fn()).name if not isinstance(r := fn(), bool) else r
  except Exception as e:  # noqa: BLE001
    return type(e).__name__.replace("TypePromotionError", "promotion").replace("ShapeError", "promotion")


@pytest.mark.parametrize("name", NAMES)
def test_issubdtype_against_every_category_and_dtype(shim, name):
  mine, real = getattr(shim.jnp, name), getattr(real_jnp, name)
  for cat in CATEGORIES:
    got = shim.jnp.issubdtype(mine, getattr(shim.jnp, cat))
    want = real_jnp.issubdtype(real, getattr(real_jnp, cat))
    assert got == want, (name, cat, got, want)
    assert shim.dtypes.issubdtype(mine, getattr(shim.jnp, cat)) == want, ("jax.dtypes", name, cat)
    assert shim.jnp.issubdtype(np.dtype(mine), getattr(shim.jnp, cat)) == want, ("np.dtype", name, cat)
  for other in NAMES:
    got = shim.jnp.issubdtype(mine, getattr(shim.jnp, other))
    want = real_jnp.issubdtype(real, getattr(real_jnp, other))
    assert got == want, (name, other, got, want)


@pytest.mark.parametrize("a", NAMES)
def test_promote_types_and_result_type_of_every_pair(shim, a):
  for b in NAMES:
    ma, mb, ra, rb = (getattr(shim.jnp, a), getattr(shim.jnp, b), getattr(real_jnp, a),
                      getattr(real_jnp, b))
    want = _outcome(lambda: real_jnp.promote_types(ra, rb))
    assert _outcome(lambda: shim.jnp.promote_types(ma, mb)) == want, ("promote_types", a, b)
    want = _outcome(lambda: real_jnp.result_type(ra, rb))
    assert _outcome(lambda: shim.jnp.result_type(ma, mb)) == want, ("result_type", a, b)
    want = _outcome(lambda: real_jnp.result_type(real_jnp.zeros((2,), ra), real_jnp.zeros((2,), rb)))
    got = _outcome(lambda: shim.jnp.result_type(np.zeros((2,), ma), np.zeros((2,), mb)))
    assert got == want, ("result_type of arrays", a, b)
  for scalar in (True, 1, 1.0):
    want = _outcome(lambda: real_jnp.result_type(getattr(real_jnp, a), scalar))
    assert _outcome(lambda: shim.jnp.result_type(getattr(shim.jnp, a), scalar)) == want, (a, scalar)


@pytest.mark.parametrize("name", [n for n in NAMES if "float" in n])
def test_finfo(shim, name):
  got, want = shim.jnp.finfo(getattr(shim.jnp, name)), real_jnp.finfo(getattr(real_jnp, name))
  for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "nmant", "nexp"):
    g, w = getattr(got, field), getattr(want, field)
    assert float(g) == float(w), (name, field, g, w)
  assert np.dtype(got.dtype) == np.dtype(want.dtype)


@pytest.mark.parametrize("name", [n for n in NAMES if "int" in n])
def test_iinfo(shim, name):
  got, want = shim.jnp.iinfo(getattr(shim.jnp, name)), real_jnp.iinfo(getattr(real_jnp, name))
  for field in ("bits", "min", "max"):
    assert int(getattr(got, field)) == int(getattr(want, field)), (name, field)


def test_palace_numpy_agrees_too():
  import palace.numpy as pjnp
  for a, b in itertools.product(NAMES, NAMES):
    want = _outcome(lambda: real_jnp.promote_types(getattr(real_jnp, a), getattr(real_jnp, b)))
    assert _outcome(lambda: pjnp.promote_types(getattr(pjnp, a), getattr(pjnp, b))) == want, (a, b)
  for name, cat in itertools.product(NAMES, CATEGORIES):
    assert pjnp.issubdtype(getattr(pjnp, name), getattr(pjnp, cat)) == \
        real_jnp.issubdtype(getattr(real_jnp, name), getattr(real_jnp, cat)), (name, cat)
  assert dt.SUPPORTED  # every TPU dtype is in NAMES
  assert {np.dtype(getattr(real_jnp, n)).name for n in NAMES} == {d.name for d in dt.SUPPORTED}
