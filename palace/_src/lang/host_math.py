"""The host-math diagnostic (NOT what the chip computes): a kernel's transcendentals as XLA:CPU computes them.

palace computes `exp`, `log`, `tanh`, ... of kernel values with its own rule of what the chip computes
(NumPy's functions, with the chip's denormal flushes; `erf_inv` Mosaic's own polynomial, run op by op).
On a TPU a test's XLA reference runs the same functions as its Mosaic kernel (measured on a v5e:
benchmarks/hw/data/v5e-probes-s22-*.jsonl); under palace.jax the reference runs on XLA:CPU, whose
functions differ from those in the last bits (its own exp, log and tanh; fused multiply-adds in its
erf_inv). `VirtualTPU(host_math=True)` / `PALACE_JAX_HOST_MATH=1` makes the running launch evaluate them
by XLA:CPU instead, on the whole block (one jitted JAX function per name and operand type), to tell a
test whose reference differs only there from a kernel palace computes wrong (docs/jax.md, "Diagnostic:
math on XLA:CPU"). JAX is imported on first use (VirtualTPU refuses the switch where JAX is not
installed). Charges are unchanged: the same ops are charged as under the chip's rule.

`active()` is the one switch: every transcendental of the language is built through `pick` (its NumPy
function) or ends in `result` (a function computed as a sequence of ops), and both ask it. Inside a
kernel, numpy_elementwise's ops read the same setting from the executor they already hold
(`ex.host_math`, the launch's) and call `pick`'s chip function directly when it is off (`fn.chip`): no
two Python calls per op for a choice fixed for the launch.
"""
from __future__ import annotations

import functools

import numpy as np

from palace._src import executor
from palace._src.lang.array import Array

# palace's name of a transcendental -> the JAX function XLA:CPU evaluates for it (jax.numpy's, or
# jax.lax's where jax.numpy has none)
FUNCTIONS = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "log1p": "log1p", "tanh": "tanh",
             "logistic": "lax.logistic", "sqrt": "sqrt", "rsqrt": "lax.rsqrt", "sin": "sin", "cos": "cos",
             "tan": "tan", "arctan": "arctan", "sinh": "sinh", "cosh": "cosh", "erf": "lax.erf",
             "erf_inv": "lax.erf_inv"}


def active() -> bool:
  """Whether the running launch is under the host-math diagnostic (VirtualTPU(host_math=True),
  PALACE_JAX_HOST_MATH=1). NOT what the chip computes."""
  ex = executor.maybe_current()
  return ex is not None and ex.host_math


@functools.cache
def _jax_function(name: str):
  """The jitted JAX function of `name` (jax.jit keeps one XLA:CPU executable per operand type)."""
  import jax  # noqa: PLC0415
  path = FUNCTIONS[name]
  if path.startswith("lax."):
    return jax.jit(getattr(jax.lax, path[4:]))
  return jax.jit(getattr(jax.numpy, path))


def xla_cpu(name: str, x: np.ndarray) -> np.ndarray:
  """`name` of the NumPy block `x` as XLA:CPU computes it, in x's dtype."""
  import jax  # noqa: PLC0415
  fn = _jax_function(name)
  x = np.asarray(x)
  cpu = jax.devices("cpu")[0]
  out = np.asarray(fn(jax.device_put(x, cpu))).astype(x.dtype, copy=False)
  return out[()] if out.ndim == 0 else out   # (a 0-d operand gives a NumPy scalar, as NumPy's ufuncs do)


def result(name: str, x, out):
  """`out`, the chip's rule's value of the transcendental `name` of the kernel value `x` (charged as
  the chip computes it), or, in a launch under the host-math diagnostic, the same value with XLA:CPU's
  data (a function palace computes as a sequence of ops, e.g. `erf_inv` as Mosaic's polynomial)."""
  if not active() or type(x) is not Array or type(out) is not Array or x._data is None or out._data is None:
    return out
  return Array(xla_cpu(name, x._data).astype(out.dtype, copy=False), out.shape, out.dtype, out._ready,
               out._lanes)


def pick(name: str, chip_fn):
  """The NumPy-level function of the transcendental `name`: `chip_fn` (palace's rule of what the chip
  computes), or, in a launch under the host-math diagnostic, XLA:CPU's evaluation of it."""
  if name not in FUNCTIONS:
    raise KeyError(name)

  def fn(x):
    return xla_cpu(name, x) if active() else chip_fn(x)
  fn.__name__ = getattr(chip_fn, "__name__", name)
  fn.__doc__ = chip_fn.__doc__
  fn.chip = chip_fn   # (what fn computes where the diagnostic is off: callers holding the executor)
  return fn
