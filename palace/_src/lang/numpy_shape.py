"""`palace.numpy` shape ops (L4a): reshape, transpose, broadcast, concatenate, tile, repeat, roll, flip.

Leading-dim reshapes and transposes are free; anything touching the two minor dims is XLU work.
"""
from __future__ import annotations

import builtins

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.util import keep, prod
from palace._src.executor import OpClass
from palace._src.errors import ShapeError
from palace._src.lang.array import Array, dtype_of, ready_of
from palace._src.lang.numpy_base import (_default_dtype, _has_data, _is_arr, _norm_axes, _np, _out,
                                         _shape_arg, _shape_of)
from palace._src.lang.numpy_dtypes import asarray

_IMPORTED = frozenset(globals())  # names above are imports, not this module's API


def _shape_op(a, fn, out_shape, op_class=OpClass.CHEAP):
  ex = executor.maybe_current()
  if isinstance(a, Array):   # (a kernel value: its fields read here, no helper per operand)
    data = a._data
    data = None if data is None or (ex is not None and ex.timing_only) else fn(data)
    return _out(data, tuple(out_shape), a.dtype, a._ready if a._ready > 0 else 0, op_class, True)
  data = None if ex is not None and ex.timing_only else fn(_np(a))
  return _out(data, tuple(out_shape), _default_dtype(a), 0, op_class, False)


_RESHAPES: dict = {}   # (shape, requested shape, its element types, dtype, lane-replicated) -> (new
                       # shape, free, lanes): a memo of reshape's checks and costing for kernel values


def reshape(a, *shape, order="C"):
  if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
    shape = tuple(shape[0])
  key = hit = None
  if type(a) is Array:   # (a kernel reshapes the same shapes every grid step: `x[:, None]`, `m.reshape(...)`)
    key = (a.shape, shape, tuple(map(type, shape)), a.dtype, a._lanes)
    try:
      hit = _RESHAPES.get(key)
    except TypeError:   # (a runtime value in the shape: _reshape_plan's checks raise)
      key = None
  if hit is None:
    hit = _reshape_plan(a, shape)
    if key is not None:
      keep(_RESHAPES, key, hit)
  shape, free, lanes = hit
  out = _shape_op(a, lambda v: v.reshape(shape), shape, OpClass.FREE if free else OpClass.XLU)
  if lanes and type(out) is Array:
    out._lanes = True
  return out


def _reshape_plan(a, shape) -> tuple:
  """(new shape, free, lane-replicated) of reshaping `a` to `shape`, raising what a reshape refuses."""
  src = _shape_of(a)
  n = prod(src)
  shape = [validate.as_int(s, f"reshape shape[{i}]", min_value=-1, error=ShapeError)
           for i, s in enumerate(shape)]
  if -1 in shape:
    k = shape.index(-1)
    rest = prod([s for i, s in enumerate(shape) if i != k])
    shape[k] = n // builtins.max(rest, 1)
  if prod(shape) != n:
    raise ShapeError(f"Cannot reshape an array of shape {src} into shape {tuple(shape)}. Fix: pass a "
                     f"shape with the same number of elements ({prod(src)}).")
  # Merging/splitting leading dims is free, and so is folding leading dims into (or out of) the
  # second-minor dim when both second-minor sizes are whole numbers of (8 * packing)-row tiles: the
  # vregs stay as they are (apply_vector_layout's vector.shape_cast rule, "fold or unfold sublane dim,
  # but keeping a whole number of vregs"). Anything else touching the last two dims needs the XLU.
  # A 1-D value is lane-major, so giving it unit leading dims ((L,) -> (1, L)) or taking them off is
  # free too; and a lane-replicated value (Array._lanes: a reduction over lanes) gains or loses its
  # reduced unit minor dim ((N,) <-> (N, 1)) for free, keeping its layout.
  rows = 8 * dt.packing(dtype_of(a) if isinstance(a, Array) else _default_dtype(a))
  shape = tuple(shape)
  lanes = isinstance(a, Array) and a._lanes and src and shape and \
      (shape == src + (1,) or src == shape + (1,))
  free = lanes or (len(src) >= 2 and len(shape) >= 2 and src[-1] == shape[-1] and (
      src[-2] == shape[-2] or (src[-2] % rows == 0 and shape[-2] % rows == 0))) or \
      (src and shape and src[-1] == shape[-1] and (len(src) == 1 or len(shape) == 1) and
       prod(src[:-1]) == 1 and prod(shape[:-1]) == 1)
  return shape, bool(free), bool(lanes)


def transpose(a, axes=None):
  nd = len(_shape_of(a))
  axes = tuple(reversed(range(nd))) if axes is None else \
      tuple(validate.as_int(x, "transpose axes", error=ShapeError) % nd for x in axes)
  out_shape = tuple(_shape_of(a)[i] for i in axes)
  minor = nd >= 2 and axes[-2:] != (nd - 2, nd - 1)
  return _shape_op(a, lambda v: np.transpose(v, axes), out_shape, OpClass.XLU if minor else OpClass.FREE)


def swapaxes(a, axis1, axis2):
  nd = len(_shape_of(a))
  perm = list(range(nd))
  perm[axis1], perm[axis2] = perm[axis2], perm[axis1]
  return transpose(a, perm)


def moveaxis(a, source, destination):
  nd = len(_shape_of(a))
  perm = [i for i in range(nd) if i != source % nd]
  perm.insert(destination % nd, source % nd)
  return transpose(a, perm)


def broadcast_to(a, shape):
  shape = _shape_arg(shape)
  try:
    np.broadcast_shapes(_shape_of(a), shape)
  except ValueError:
    raise ShapeError(f"Cannot broadcast shape {_shape_of(a)} to {shape}. Fix: each trailing dim of "
                     f"the value must equal the target's or be 1; reshape it first.") from None
  if not isinstance(a, Array):
    a = asarray(a)
  src = np.shape(a)
  lanes = getattr(a, "_lanes", False)   # (host data, outside a kernel: a NumPy array)
  # across lanes ((..., 1) -> (..., L)): a lane-replicated value needs one VPU op, any other column a
  # lane broadcast on the XLU (measured on a v5e: docs/timing-model.md)
  cls = OpClass.LANE_BROADCAST if src and src[-1] == 1 and shape and shape[-1] > 1 and \
      not lanes else OpClass.BROADCAST
  out = _shape_op(a, lambda v: np.broadcast_to(v, shape), shape, cls)  # values are immutable
  if lanes and src and shape and shape[-1] == src[-1] and type(out) is Array:
    out._lanes = True
  return out


def expand_dims(a, axis):
  s = list(_shape_of(a))
  axes = (axis,) if isinstance(axis, int) else tuple(axis)
  for ax in sorted(x % (len(s) + len(axes)) for x in axes):
    s.insert(ax, 1)
  return _shape_op(a, lambda v: v.reshape(s), s, OpClass.FREE)


def squeeze(a, axis=None):
  s = _shape_of(a)
  axes = tuple(i for i, n in enumerate(s) if n == 1) if axis is None else _norm_axes(axis, len(s))
  out = [n for i, n in enumerate(s) if i not in axes]
  return _shape_op(a, lambda v: v.reshape(out), out, OpClass.FREE)


def ravel(a):
  return reshape(a, -1)


def concatenate(arrays, axis=0):
  arrays = list(arrays)
  rt = dt.result_type(*[dtype_of(a) for a in arrays])
  shapes = [_shape_of(a) for a in arrays]
  nd = len(shapes[0])
  ax = axis % nd
  for s in shapes:
    if len(s) != nd or _any_mismatch(s, shapes[0], ax):
      raise ShapeError(f"jnp.concatenate: shapes {shapes} differ outside axis {axis}. Fix: make every "
                     f"other dimension equal.")
  out_shape = list(shapes[0])
  out_shape[ax] = builtins.sum(s[ax] for s in shapes)
  data = None
  ex = executor.maybe_current()
  if not (ex is not None and ex.timing_only) and _has_data(*arrays):
    data = np.concatenate([_np(a, rt) for a in arrays], axis=ax)
  return _out(data, tuple(out_shape), rt, ready_of(*arrays), OpClass.CHEAP, _is_arr(*arrays))


def _any_mismatch(s, ref, ax):
  return builtins.any(a != b for i, (a, b) in enumerate(zip(s, ref)) if i != ax)


def stack(arrays, axis=0):
  return concatenate([expand_dims(a, axis) for a in arrays], axis=axis)


def tile(a, reps):
  reps = _shape_arg(reps)
  s = _shape_of(a)
  full_reps = (1,) * (len(s) - len(reps)) + reps if len(reps) < len(s) else reps
  s2 = (1,) * (len(full_reps) - len(s)) + tuple(s)
  out = tuple([x * r for x, r in zip(s2, full_reps)])
  return _shape_op(a, lambda v: _tiled(v, s2, full_reps, out), out, OpClass.CHEAP)


def _tiled(v: np.ndarray, shape, reps, out_shape) -> np.ndarray:
  """`np.tile(v, reps)` (`shape`: v's shape with unit dims in front to the rank of `reps`, given in
  full): one broadcasting copy into the result viewed as (reps[0], shape[0], reps[1], shape[1], ...),
  without np.tile's Python layers (a repeat per axis; jnp.tile runs on many kernels' grid steps)."""
  pairs, ones = [], []
  for r, n in zip(reps, shape):
    pairs += (r, n)
    ones += (1, n)
  out = np.empty(out_shape, v.dtype)
  out.reshape(pairs)[...] = v.reshape(ones)
  return out


def repeat(a, repeats, axis=None):
  repeats = validate.as_int(repeats, "jnp.repeat repeats", min_value=0, error=ShapeError)
  s = list(_shape_of(a))
  if axis is None:
    out = [prod(s) * repeats]
  else:
    out = list(s)
    out[axis % len(s)] *= repeats
  return _shape_op(a, lambda v: np.repeat(v, repeats, axis=axis), out, OpClass.XLU)


def roll(a, shift, axis=None):
  shift_v = int(shift._data) if isinstance(shift, Array) else \
      validate.as_int(shift, "jnp.roll shift", error=ShapeError)
  nd = len(_shape_of(a))
  cls = OpClass.XLU if axis is not None and axis % builtins.max(nd, 1) >= nd - 2 else OpClass.CHEAP
  return _shape_op(a, lambda v: np.roll(v, shift_v, axis=axis), _shape_of(a), cls)


def flip(a, axis=None):
  return _shape_op(a, lambda v: np.flip(v, axis=axis), _shape_of(a), OpClass.XLU)


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _IMPORTED)
