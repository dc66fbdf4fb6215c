"""Differential tests: the same elementwise kernels through palace.jax and through JAX's own TPU interpret
mode, on edge-case inputs (zeros of both signs, NaN, infinities, integer limits, zero divisors, shift
counts past the width, out-of-range casts). Results must be bit-identical, except that NaN payloads
are compared as NaN. Comparing the two engines found the saturating-cast, integer-division and sign
bugs fixed in session 6.

Not compared here, by decision: transcendental functions (palace uses NumPy's libm, XLA its own
approximations: 1-ulp differences, and a TPU has a third set), bf16/f16 arithmetic (XLA on the host
CPU fuses and rounds once, where palace rounds after each op as Mosaic does), division by a constant
(XLA on the CPU multiplies by the reciprocal), and the sign of a zero chosen by max/min.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import palace.jax as pj

_LO, _HI = np.iinfo(np.int32).min, np.iinfo(np.int32).max
I = np.tile(np.array([7, -7, 0, 1, -1, _HI, _LO, 100], np.int32), (8, 16))
J = np.tile(np.array([0, 2, -3, 0, 33, 31, 32, -1], np.int32), (8, 16))
U = np.tile(np.array([7, 0, 5, 2**32 - 1, 1, 2**31, 3, 9], np.uint32), (8, 16))
V = np.tile(np.array([0, 0, 2, 7, 33, 1, 0, 4], np.uint32), (8, 16))
F = np.tile(np.array([-0.0, 2.5, -2.5, np.nan, np.inf, -7.3, 3e9, 0.5], np.float32), (8, 16))
G = np.tile(np.array([0.0, -2.0, 3.0, 1.0, np.nan, 2.0, -np.inf, 0.0], np.float32), (8, 16))
I8 = np.tile(np.array([0, 1, -1, 127, -128, 16, 3, -64], np.int8), (8, 16))
T = np.tile(np.array([0.0, -0.0, 1e-45, -1e-45, 3.4028235e38, -1.1754944e-38, 0.0, np.inf], np.float32),
            (8, 16))
R = np.random.default_rng(11).integers(0, 2**32, (8, 128), dtype=np.uint64).astype(np.uint32).view(np.float32)

CASES = {
    "lax.div": (lax.div, I, J), "lax.rem": (lax.rem, I, J),
    "floor_divide": (lambda a, b: a // b, I, J), "remainder": (lambda a, b: a % b, I, J),
    "unsigned div": (lax.div, U, V), "unsigned rem": (lax.rem, U, V),
    "unsigned //": (lambda a, b: a // b, U, V), "unsigned %": (lambda a, b: a % b, U, V),
    "shift_left": (lax.shift_left, I, J), "shift_right_arithmetic": (lax.shift_right_arithmetic, I, J),
    "shift_right_logical": (lax.shift_right_logical, I, J),
    "abs int": (jnp.abs, I), "negate int": (lambda a: -a, I), "add wraps": (lambda a: a + a, I),
    "mul wraps": (lambda a: a * 3, I), "integer_pow": (lambda a: a ** 3, I),
    "float -> int32": (lambda a: a.astype(jnp.int32), F), "float -> uint32": (lambda a: a.astype(jnp.uint32), F),
    "float -> int8": (lambda a: a.astype(jnp.int8), F), "int32 -> uint32": (lambda a: a.astype(jnp.uint32), I),
    "float -> bool": (lambda a: a.astype(jnp.bool_).astype(jnp.int32), F),
    "sign": (jnp.sign, F), "round": (jnp.round, F), "floor": (jnp.floor, F), "ceil": (jnp.ceil, F),
    "float //": (lambda a, b: a // b, F, G), "float %": (lambda a, b: a % b, F, G),
    "true_divide": (lambda a, b: a / b, F, G), "where": (lambda a, b: jnp.where(a > b, a, b), F, G),
    "sqrt": (jnp.sqrt, F), "isfinite": (lambda a: jnp.isfinite(a).astype(jnp.int32), F),
    "argmax": (lambda a: jnp.argmax(a, axis=1).astype(jnp.int32)[:, None] * jnp.ones((1, 128), jnp.int32), F),
    "max reduction with NaN": (lambda a: jnp.max(a, axis=1, keepdims=True) * jnp.ones((1, 128), jnp.float32), F),
    "bitcast": (lambda a: lax.bitcast_convert_type(a, jnp.int32), F),
    "int -> float": (lambda a: a.astype(jnp.float32), I),
    "clz": (lax.clz, I), "clz uint32": (lax.clz, U), "clz int8": (lax.clz, I8),
    "population_count": (lax.population_count, I), "population_count uint32": (lax.population_count, U),
    "population_count int8": (lax.population_count, I8),
    "nextafter": (lax.nextafter, F, G), "nextafter back": (lax.nextafter, G, F),
    "nextafter of zeros and tiny": (lax.nextafter, T, F),
    "reduce_precision bf16": (lambda a: lax.reduce_precision(a, 8, 7), R),
    "reduce_precision f16": (lambda a: lax.reduce_precision(a, 5, 10), R),
    "reduce_precision e4m3": (lambda a: lax.reduce_precision(a, 4, 3), R),
    "reduce_precision e2m0": (lambda a: lax.reduce_precision(a, 2, 0), R),
}


def _call(fn, args):
  def kernel(*refs):
    refs[-1][...] = fn(*[r[...] for r in refs[:-1]])
  out = jax.eval_shape(fn, *args)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype))(*args)


def _same(a, b):
  if a.dtype != b.dtype or a.shape != b.shape:
    return False
  if a.dtype.kind == "f":
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32),
                                                               b[~nan].view(np.uint32))
  return np.array_equal(a, b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_palace_jax_matches_jax_interpret_mode_bit_for_bit(name):
  fn, *args = CASES[name]
  args = [jnp.asarray(a) for a in args]
  with pltpu.force_tpu_interpret_mode():
    ref = np.asarray(_call(fn, args))
  with pj.virtual_tpu("v5e"):
    out = np.asarray(_call(fn, args))
  assert _same(out, ref), f"{name}: palace {out[0, :8]} vs JAX interpret mode {ref[0, :8]}"


# The same cases on scalars: SMEM operands read one element at a time, so every operation is a 0-d
# equation (palace.jax's specialised scalar forms: numpy_elementwise.on_scalars, where_on_scalars,
# numpy_dtypes.astype_on_scalars), each result written back to SMEM.
_NOT_SCALAR = {"argmax", "max reduction with NaN",   # their fns need a row
               # Mosaic lowers population_count for vectors only (test below)
               "population_count", "population_count uint32", "population_count int8",
               # the TPU compiler rejects integer scalar ops on any width but 32 bits (math.ctlz on
               # i8: lang/int_rejects.py; JAX's interpret mode computes it)
               "clz int8"}


def _scalar_call(fn, args):
  n = args[0].shape[-1]
  out = jax.eval_shape(fn, *[a[0] for a in args])
  wide = jnp.int32 if out.dtype.itemsize < 4 or out.dtype == jnp.bool_ else out.dtype

  def kernel(*refs):
    for k in range(n):
      refs[-1][k] = fn(*[r[k] for r in refs[:-1]]).astype(wide)
  smem = pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), wide),
                        in_specs=[smem] * len(args), out_specs=smem)(*args)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(set(CASES) - _NOT_SCALAR))
def test_scalar_equations_match_jax_interpret_mode_bit_for_bit(name):
  fn, *args = CASES[name]
  args = [jnp.asarray(a[0, :8]) for a in args]
  with pltpu.force_tpu_interpret_mode():
    ref = np.asarray(_scalar_call(fn, args))
  with pj.virtual_tpu("v5e"):
    out = np.asarray(_scalar_call(fn, args))
  assert _same(out, ref), f"{name} on scalars: palace {out} vs JAX interpret mode {ref}"


def test_a_scalar_population_count_is_rejected_as_the_tpu_compiler_does():
  x = jnp.asarray(np.array([7, 8], np.int32))

  def kernel(x_ref, o_ref):
    o_ref[0] = lax.population_count(x_ref[0])
  smem = pl.BlockSpec(memory_space=pltpu.SMEM)
  with pj.virtual_tpu("v5e"), pytest.raises(Exception, match="population_count of a scalar"):
    jax.block_until_ready(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2,), jnp.int32),
                                         in_specs=[smem], out_specs=smem)(x))


@pytest.mark.parametrize("bits", [(8, 7), (5, 10), (4, 3), (5, 2), (3, 1), (2, 0), (8, 23), (6, 23), (8, 0)])
def test_reduce_precision_matches_xla_bit_for_bit_on_every_kind_of_float(bits):
  """palace's float32 reduce_precision against XLA's own (jax.lax.reduce_precision on the CPU) on a
  million random bit patterns: normals, subnormals, infinities, NaNs with payloads."""
  from palace._src.lang.lax_ops import _reduce_precision_f32
  x = np.random.default_rng(sum(bits)).integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32)
  x = x.view(np.float32)
  want = np.asarray(lax.reduce_precision(jnp.asarray(x), *bits)).view(np.uint32)
  got = _reduce_precision_f32(x, *bits).view(np.uint32)
  bad = np.flatnonzero(got != want)
  assert not bad.size, f"{bits}: {bad.size} differ, e.g. {x.view(np.uint32)[bad[:3]]} -> {got[bad[:3]]} " \
                       f"vs {want[bad[:3]]}"
