"""Validation of user parameters (L0): the one place each kind of parameter is checked.

Every public entry point converts its integers, shapes, flags and names through these helpers, so a
non-integer is never truncated, a negative dimension never reaches NumPy and every message names the
parameter and says what to pass instead. `what` is the parameter as the user wrote it
(e.g. "grid[0] of pallas_call(kernel)"); `hint` is appended as the fix.

Integers: Python ints, NumPy integer scalars and 0-d integer arrays (JAX's too, through `__index__`) are
integers; bools, floats (even 2.0), strings and None are not.
"""
from __future__ import annotations

import operator
import types

from palace._src.errors import OutOfBoundsError, ResourceError, UsageError


def _kind(value) -> str:
  t = type(value)
  mod = t.__module__
  name = t.__name__ if mod in ("builtins", None) else f"{mod.split('.')[0]}.{t.__name__}"
  shape = getattr(value, "shape", None)
  if isinstance(shape, tuple) and shape and hasattr(value, "dtype"):   # not the whole array's repr
    return f"a {name} of shape {shape} and dtype {value.dtype}"
  return f"{value!r} ({name})"


def describe(value) -> str:
  """`value` for a message: its repr and type (`'a' (str)`), or the shape and dtype of an array."""
  return _kind(value)


def is_integer(value) -> bool:
  """Whether `value` is an integer scalar (not a bool, not a float however integral)."""
  if type(value) is int:   # (the common case first; bool is a subclass, not this type)
    return True
  if isinstance(value, bool):
    return False
  if isinstance(value, int):
    return True
  dtype = getattr(value, "dtype", None)
  if dtype is not None:
    if getattr(value, "shape", None) not in ((), None) or getattr(dtype, "kind", "") not in "iu":
      return False
  elif isinstance(value, float) or not hasattr(value, "__index__"):
    return False
  try:
    operator.index(value)
  except TypeError:
    return False
  return True


def as_int(value, what: str, *, min_value: int | None = None, max_value: int | None = None,
           hint: str = "", error=UsageError) -> int:
  """`value` as a Python int, or `error` naming `what`, the value and its type, and the fix."""
  if type(value) is int and (min_value is None or value >= min_value) and \
      (max_value is None or value <= max_value):
    return value
  if not is_integer(value):
    fix = hint or "pass an integer (an int or an integer NumPy/JAX scalar; floats are never truncated)."
    raise error(f"{what} must be an integer; got {_kind(value)}. Fix: {fix}")
  v = operator.index(value)
  if min_value is not None and v < min_value:
    fix = hint or f"pass an integer >= {min_value}."
    raise error(f"{what} must be >= {min_value}; got {v}. Fix: {fix}")
  if max_value is not None and v > max_value:
    fix = hint or f"pass an integer <= {max_value}."
    raise error(f"{what} must be <= {max_value}; got {v}. Fix: {fix}")
  return v


def as_dims(shape, what: str, *, allow_none: bool = False, hint: str = "", error=UsageError) -> tuple:
  """A shape as a tuple of non-negative ints (`None` entries kept when `allow_none`, e.g. squeezed)."""
  if type(shape) is tuple:   # (already one: returned as it is)
    for d in shape:
      if type(d) is not int or d < 0:
        break
    else:
      return shape
  if is_integer(shape):
    shape = (shape,)
  if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
    fix = hint or "pass a tuple of non-negative integers, e.g. (128, 256)."
    raise error(f"{what} must be a tuple of dimensions; got {_kind(shape)}. Fix: {fix}")
  out = []
  for i, d in enumerate(tuple(shape)):
    if d is None and allow_none:
      out.append(None)
      continue
    out.append(as_int(d, f"{what}[{i}]", min_value=0, hint=hint, error=error))
  return tuple(out)


def as_bool(value, what: str, *, hint: str = "", error=UsageError) -> bool:
  """A flag: True/False (or a NumPy bool); anything else (1, "yes", None) is an error."""
  if isinstance(value, bool):
    return value
  if type(value).__name__ == "bool_" and type(value).__module__ == "numpy":
    return bool(value)
  fix = hint or "pass True or False."
  raise error(f"{what} must be a bool; got {_kind(value)}. Fix: {fix}")


def as_name(value, what: str, *, hint: str = "", error=UsageError) -> str:
  """A non-empty string name (mesh axes, chips, kernels)."""
  if isinstance(value, str) and value:
    return value
  fix = hint or "pass a non-empty string."
  raise error(f"{what} must be a non-empty string; got {_kind(value)}. Fix: {fix}")


def static_slice(s: slice, size: int, what) -> tuple[int, int, int]:
  """A static Python slice of an axis of `size` elements as (start, length, step), with NumPy's meaning
  for legal negative bounds (`x[-8:]`) but no clipping: a bound outside [-size, size] is an
  `OutOfBoundsError` (NumPy would silently shorten the slice; `x[200:208]` of 128 rows is empty there).
  Bounds and step must be integers (never truncated); the step must be positive (refs and TPU vectors
  have no reversed views). `what` (a string, or a callable giving it, only called for the message)
  names the index and its place. The index path is hot: plain in-range ints cost a few compares."""
  start, stop, step = s.start, s.stop, s.step
  if ((start is None or (type(start) is int and -size <= start <= size)) and
      (stop is None or (type(stop) is int and -size <= stop <= size)) and
      (step is None or (type(step) is int and step > 0))):
    s0, stop_, st = s.indices(size)
    return s0, (stop_ - s0 + st - 1) // st if stop_ > s0 else 0, st
  where = what() if callable(what) else what
  for name, v in (("start", start), ("stop", stop), ("step", step)):
    if v is not None and not is_integer(v):
      raise UsageError(f"{where}: slice {name} {_kind(v)} is not an integer. Fix: use integer bounds "
                       f"(floats are never truncated).")
  if step is not None and operator.index(step) <= 0:
    raise UsageError(f"{where}: slice step {operator.index(step)} is not positive; refs and kernel "
                     f"values support only forward slices. Fix: slice forward and reverse the result "
                     f"with jnp.flip.")
  for name, v in (("start", start), ("stop", stop)):
    if v is not None and not -size <= operator.index(v) <= size:
      raise OutOfBoundsError(
          f"{where}: slice {name} {operator.index(v)} is outside an axis of {size} elements "
          f"(bounds must lie in -{size}..{size}; NumPy would clip the slice silently). Fix: keep the "
          f"slice inside the block, e.g. [{max(0, size - 8)}:{size}] for its last 8 of {size}.")
  return static_slice(slice(*(None if v is None else operator.index(v) for v in (start, stop, step))),
                      size, where)


def fmt_index(idx) -> str:
  """An index as the user wrote it, for messages: `200:208, :`, `pl.ds(0, 8)`, `...`."""
  if not isinstance(idx, tuple):
    idx = (idx,)
  parts = []
  for i in idx:
    if type(i) is slice:
      parts.append(":".join(["" if v is None else str(v) for v in (i.start, i.stop)] +
                            ([] if i.step is None else [str(i.step)])))
    elif i is Ellipsis:
      parts.append("...")
    elif type(i).__name__ == "Slice" and hasattr(i, "stride"):   # pl.ds
      parts.append(f"pl.ds({i.start!r}, {i.size}" + (f", {i.stride})" if i.stride != 1 else ")"))
    else:
      parts.append(repr(i))
  return ", ".join(parts)


# Grids: Mosaic grid indices are int32, and palace walks every point of a launch in order (the
# list of points is built up front and each point runs the kernel body once in Python). More points
# than MAX_GRID_POINTS would take gigabytes and hours; such a launch is rejected with a fix.
INT32_MAX = 2**31 - 1
MAX_GRID_POINTS = 2**22


def as_grid(grid, what: str, error=UsageError) -> tuple:
  """A grid as a tuple of non-negative ints, each at most int32's maximum (Mosaic's grid index type),
  with at most MAX_GRID_POINTS points in all."""
  dims = as_dims(grid, what, hint="pass a tuple of non-negative integers, e.g. grid=(4, 8).",
                 error=error)
  for i, d in enumerate(dims):
    if d > INT32_MAX:
      raise error(f"{what}[{i}] = {d} exceeds the int32 grid index range of Mosaic (max {INT32_MAX}). "
                  f"Fix: use larger blocks so the grid has fewer steps, or split the axis in two.")
  points = 1
  for d in dims:
    points *= d
  if points > MAX_GRID_POINTS:
    raise ResourceError(
        f"{what} = {dims} has {points:,} grid points; palace runs at most {MAX_GRID_POINTS:,} "
        f"(2**22) per launch (each point runs the kernel body once). Fix: use larger blocks so the grid "
        f"has fewer steps, or time a smaller grid with the same block shapes and scale the result.")
  return dims


def as_choice(value, what: str, choices, *, hint: str = "", error=UsageError):
  """One of `choices` (compared with ==), or an error listing them."""
  try:
    if value in choices:
      return value
  except TypeError:   # an unhashable value tested against a set
    pass
  fix = hint or f"pass one of {', '.join(repr(c) for c in choices)}."
  raise error(f"{what} must be one of {', '.join(repr(c) for c in choices)}; got {_kind(value)}. Fix: {fix}")


def as_callable(value, what: str, *, hint: str = "", error=UsageError):
  """A callable (kernel bodies, index maps, shard_map functions)."""
  if callable(value):
    return value
  fix = hint or "pass a function."
  raise error(f"{what} must be callable; got {_kind(value)}. Fix: {fix}")


_FunctionType = types.FunctionType
_CALL_CHECKS: dict = {}   # (code object, nargs, keywords) -> None or the TypeError text (a memo)


def check_call(fn, nargs: int, kwargs, describe, error=UsageError) -> None:
  """Raise `error(describe(e))` (instead of a bare TypeError in the middle of a launch) when `fn`
  cannot be called with `nargs` positional arguments and the keywords `kwargs`. Functions whose
  signature Python cannot read (some builtins) are not checked. For a plain function without
  defaults or attributes the answer depends on its code object only and is memoised per code
  object: kernels call run_scoped and fori_loop with a closure made afresh on every grid step, whose
  signature inspect would otherwise read every time."""
  plain = type(fn) is _FunctionType and fn.__defaults__ is None and fn.__kwdefaults__ is None and \
      not fn.__dict__   # (no __wrapped__ / __signature__ that inspect would follow instead)
  if plain:
    key = (fn.__code__, nargs, tuple(kwargs))
    if key in _CALL_CHECKS:
      text = _CALL_CHECKS[key]
      if text is not None:
        raise error(describe(TypeError(text))) from None
      return
  import inspect
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):
    return
  try:
    sig.bind(*range(nargs), **dict.fromkeys(kwargs, 0))
    text = None
  except TypeError as e:
    text = str(e)
  if plain:
    if len(_CALL_CHECKS) > 4096:
      _CALL_CHECKS.clear()
    _CALL_CHECKS[key] = text
  if text is not None:
    raise error(describe(TypeError(text))) from None
