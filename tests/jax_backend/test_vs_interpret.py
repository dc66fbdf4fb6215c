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
# equation (palace.jax's specialised scalar forms: numpy_elementwise._on_scalars, _where_on_scalars,
# numpy_dtypes._astype_on_scalars), each result written back to SMEM.
_NOT_SCALAR = {"argmax", "max reduction with NaN"}   # their fns need a row


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
