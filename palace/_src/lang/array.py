"""Array: the value a kernel gets when it reads a ref (L4a).

It wraps a NumPy array (or None in timing-only mode) plus the cycle at which the value is ready on the
virtual core. Converting it to a Python bool/int raises, as tracing in real Pallas would.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.errors import ShapeError, TracingError, UsageError
from palace._src.util import user_frame_summary


class Array:
  # `_lanes`: the value is lane-replicated (a reduction over the last axis, or elementwise work on such
  # values): Mosaic keeps each row's result in every lane (an implicit minor dim), so re-inserting the
  # reduced axis is free and broadcasting it across lanes is a VPU op, not a lane broadcast (sim/cost.py)
  __slots__ = ("_data", "shape", "dtype", "_ready", "_lanes", "__weakref__")
  __array_priority__ = 1000  # so `np_array + Array` defers to Array

  def __init__(self, data, shape, dtype, ready=0, lanes=False):
    self._data = data
    self.shape = shape
    self.dtype = dtype
    self._ready = ready
    self._lanes = lanes

  # ---- metadata ----
  @property
  def ndim(self):
    return len(self.shape)

  @property
  def size(self):
    n = 1
    for s in self.shape:
      n *= s
    return n

  def __len__(self):
    if not self.shape:
      raise TypeError("len() of a 0-d array")
    return self.shape[0]

  def __repr__(self):
    return f"palace.Array(shape={self.shape}, dtype={self.dtype})"

  # ---- trace-time conversions are errors ----
  def _concrete_error(self, what):
    ex = executor.maybe_current()
    where = f" {ex.where()}" if ex is not None else ""
    return TracingError(
        f"{what} of a runtime value {self!r}{where} is not allowed in a kernel: in Pallas this value is "
        f"only known on the TPU. Fix: use pl.when(cond) / lax.cond / jnp.where for control flow and "
        f"lax.fori_loop for loops. ({user_frame_summary()})")

  def __bool__(self):
    raise self._concrete_error("Converting to a Python bool")

  def __int__(self):
    raise self._concrete_error("Converting to a Python int")

  def __index__(self):
    raise self._concrete_error("Using as a Python index")

  def __float__(self):
    raise self._concrete_error("Converting to a Python float")

  def __iter__(self):
    if not self.shape:
      raise TypeError("iteration over a 0-d array")
    return (self[i] for i in range(self.shape[0]))

  def __array__(self, dtype=None, copy=None):
    raise self._concrete_error("Converting to a NumPy array")

  def __hash__(self):
    raise TypeError("palace.Array is unhashable")

  # Operators (`+`, `.astype`, `.T`, `.sum`, ...; `@` in `numpy_linalg`) are bound when those are imported,
  # which `refs` (the only producer of Arrays) always does.


def concrete_value(x, what: str = "value"):
  """The concrete Python/NumPy value of x, for palace's own use (indices, SMEM scalars, conditions)."""
  if isinstance(x, Array):
    if x._data is None:
      return np.zeros(x.shape, x.dtype) if x.shape else x.dtype.type(0)
    return x._data
  return x


def concrete_int(x, what: str = "index") -> int:
  if type(x) is int:
    return x
  if isinstance(x, Array) and (x.shape or x.dtype.kind not in "iub"):
    raise ShapeError(f"Invalid {what}: got {x!r}; expected an integer scalar. Fix: pass a scalar, e.g. a "
                     f"value read from an SMEM ref or pl.program_id. ({user_frame_summary()})")
  if not isinstance(x, Array):
    # a host value: an integer, never a truncated float (index maps, pl.ds starts, loop bounds, ...)
    if validate.is_integer(x):
      return int(x)
    validate.as_int(x, f"{what} ({user_frame_summary()})", error=ShapeError,
                    hint="pass an integer (an int, an integer NumPy scalar or an integer kernel "
                         "scalar); floats are never truncated.")
  v = concrete_value(x, what)
  try:
    return int(v)
  except TypeError as e:
    raise ShapeError(f"Invalid {what}: got {x!r}; expected an integer scalar. Fix: pass an integer "
                     f"(an int or a 0-d integer kernel value). ({user_frame_summary()})") from e


def ready_of(*xs) -> int:
  r = 0
  for x in xs:
    if isinstance(x, Array) and x._ready > r:
      r = x._ready
  return r


def make(data, dtype=None, ready=0):
  """Wrap NumPy data as an Array (inside a kernel)."""
  data = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
  return Array(data, data.shape, data.dtype, ready)


class WeakArray(Array):
  """A kernel value built from Python scalars alone (`jnp.full(s, 10)`, `jnp.asarray(2.0)`,
  `jnp.where(c, 1.0, 0.0)`): weakly typed as in JAX, so in an op with a typed operand it takes that
  operand's type (int8 + jnp.full(s, 10) is int8) and a store casts it to the ref's dtype. Results of
  ops are ordinary (strong) Arrays."""
  __slots__ = ()


def weakly_typed(x):
  """`x`, made by an op from Python scalars alone, as a WeakArray (a plain Array only: a Deferred or a
  host NumPy result stays as it is)."""
  return WeakArray(x._data, x.shape, x.dtype, x._ready) if type(x) is Array else x


# a WeakArray's dtype is a Python scalar's default (bool, int32, float32): the Python value of its kind
_WEAK_KIND = {"b": False, "i": 0, "f": 0.0}


def promotion_type(x):
  """What `dt.result_type` takes for operand x: its dtype, or a Python value of its kind for weak
  operands (Python scalars, WeakArrays)."""
  if isinstance(x, Array):
    return _WEAK_KIND[x.dtype.kind] if type(x) is WeakArray else x.dtype
  return dtype_of(x)


def dtype_of(x) -> np.dtype | int | float | bool:
  """np.dtype for arrays (strong), the Python value itself for weak scalars."""
  if isinstance(x, Array):
    return x.dtype
  if isinstance(x, (bool, int, float)):
    return x
  if isinstance(x, np.generic):
    return dt.canonicalize(x.dtype)
  if isinstance(x, np.ndarray):
    if x.ndim and executor.maybe_current() is not None:
      raise UsageError(
          f"Kernel operand is a NumPy array of shape {x.shape}: kernels cannot close over array "
          f"constants (Pallas captures them as constants). Fix: pass the array as an input. "
          f"({user_frame_summary()})")
    return dt.canonicalize(x.dtype)
  raise ShapeError(f"Unsupported operand of type {type(x).__name__} in a kernel operation "
                   f"({user_frame_summary()}). Fix: pass kernel values (loaded from refs), NumPy "
                   f"scalars or Python numbers.")
