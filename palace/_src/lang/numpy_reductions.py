"""`palace.numpy` reductions (L4a): sum, prod, max, min, mean, argmax, argmin, any, all, cumsum.

Cost class by reduced axis: the last (lane) axis goes through the XLU, the second-minor (sublane) axis
stays on the VPU, leading axes are plain elementwise work.
"""
from __future__ import annotations

import contextlib
import warnings

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.executor import OpClass
from palace._src.errors import ShapeError, UnsupportedError
from palace._src.hw import vreg_tiles
from palace._src.lang.array import Array, dtype_of, ready_of
from palace._src.lang.numpy_base import (_F32, _compute_dtype, _default_dtype, _dtype_arg, _has_data, _is_arr,
                                         _norm_axes, _np, _out, _shape_of)
from palace._src.lang.numpy_shape import ravel
from palace._src.util import keep, user_frame_summary

_IMPORTED = frozenset(globals())  # names above are imports, not this module's API


def _charge(ex, cls, shape, axes, dtype, ready) -> int:
  """Charge a reduction of an operand of `shape` over `axes` to the core; its result's ready cycle. Rows
  wider than one vreg (128 lanes) are first folded to one vreg per 8 rows with elementwise VPU ops; the
  vregs along reduced leading and sublane axes are then accumulated into one vreg per output tile (those
  axes cut to 1 and to 8 rows), a dependent chain of VPU ops per output tile (measured on a v5e, session
  37: docs/timing-model.md 1.4); then a lane reduction is done once per 8 rows on the XLU, a sublane one
  within each vreg on the VPU."""
  nd = len(shape)
  # the lane tiles of a wide row first (no chain: measured, a (8, 2048) row max costs the chip 7.5
  # cycles more than a (8, 512) one), then the leading and sublane axes (this module's `min` is jnp.min)
  if cls is OpClass.REDUCE_LANE and shape[-1] > 128:
    ready = ex.vector_op(OpClass.CHEAP, shape[:-1] + (shape[-1] - 128,), dtype, ready)
    shape = shape[:-1] + (128,)
  folded = tuple(d if i not in axes else 1 if i < nd - 2 else d if d < (8 if i == nd - 2 else 128)
                 else (8 if i == nd - 2 else 128) for i, d in enumerate(shape))
  into = vreg_tiles(folded)   # (32-bit tiles: arithmetic is counted in them)
  folds = vreg_tiles(shape) - into
  if folds > 0:
    ready = ex.vector_op(OpClass.CHEAP, (folds * 8, 128), dtype, ready, folds // into)
  if cls is OpClass.CHEAP:
    return ready
  return ex.vector_op(cls, folded, dtype, ready)


def _reduce_class(axes, ndim):
  if ndim >= 1 and (ndim - 1) in axes:
    return OpClass.REDUCE_LANE
  if ndim >= 2 and (ndim - 2) in axes:
    return OpClass.REDUCE_SUBLANE
  return OpClass.CHEAP


# keyword arguments of JAX's reductions that palace takes, per reduction (JAX's own set; `out` is
# unsupported in JAX as well)
_KEYWORDS = {"sum": ("where", "initial", "promote_integers"),
             "prod": ("where", "initial", "promote_integers"),
             "max": ("where", "initial"), "min": ("where", "initial"), "mean": ("where",),
             "any": ("where",), "all": ("where",), "argmax": (), "argmin": ()}


def _reduction(npfn, name, result="same"):
  allowed = _KEYWORDS[name]

  def op(a, axis=None, keepdims=False, dtype=None, **kw):
    extra = [k for k in kw if k not in allowed]
    if extra:
      ex = executor.maybe_current()
      raise UnsupportedError(f"jnp.{name} got keyword(s) {', '.join(sorted(extra))}"
                             f"{' ' + ex.where() if ex else ''} ({user_frame_summary()}); palace's jnp.{name} takes axis, keepdims, "
                             f"dtype{''.join(', ' + k for k in allowed)}. Fix: drop them (`out` is not "
                             f"supported by JAX either) or compute the masked form with jnp.where.")
    where, initial = kw.get("where"), kw.get("initial")
    key = plan = None
    if not kw and dtype is None and type(a) is Array and type(keepdims) is bool:
      # (a kernel's every-step form, palace.jax's tuple axes included: its analysis kept, `_PLANS`)
      if axis is None or type(axis) is int:
        key = (op, a.shape, a.dtype, axis, keepdims)
      elif type(axis) is tuple:
        key = (op, a.shape, a.dtype, axis, tuple(map(type, axis)), keepdims)
      if key is not None:
        try:
          plan = _PLANS.get(key)
        except TypeError:   # (an unhashable axis: the analysis raises its error)
          key = None
    if plan is None:
      plan = _analysis(name, result, a, axis, keepdims, dtype, kw)
      if key is not None:
        keep(_PLANS, key, plan)
    shape, axes, in_d, out_d, out_shape, cls = plan
    data = None
    ex = executor.maybe_current()
    if not (ex is not None and ex.timing_only and out_shape) and _has_data(a, where, initial):
      v = _np(a, _compute_dtype(out_d) if result == "same" else None)
      extra_args = {}
      if where is not None:   # JAX's mask: elements where it is False take no part
        extra_args["where"] = np.broadcast_to(_np(where, dt.bool_), shape)
      if initial is not None:
        extra_args["initial"] = _np(initial, v.dtype).item()
      if result == "index" and len(axes) != 1:
        raise ShapeError(f"jnp.{name} takes a single axis; got axis={axis}. Fix: pass one int axis (or "
                         f"reshape to merge the axes first).")
      ax = axes[0] if result == "index" else axes
      # (kernels run under np.errstate(all="ignore"), set once per core by the machine)
      if ex is not None and where is None:
        data = _reduce(npfn, v, ax, keepdims, extra_args, name, ex)
      else:
        with contextlib.nullcontext() if ex is not None else np.errstate(all="ignore"), \
            warnings.catch_warnings() if where is not None else contextlib.nullcontext():
          if where is not None:   # an empty mask makes a NaN mean, silently as in JAX
            warnings.simplefilter("ignore", RuntimeWarning)
          data = _reduce(npfn, v, ax, keepdims, extra_args, name, ex)
      data = np.asarray(data).astype(out_d, copy=False)
    ready = ready_of(a, where, initial)
    if ex is None or not shape:
      return _out(data, out_shape, out_d, ready, cls, _is_arr(a, where, initial))
    # inside a kernel the work is the operand's vregs' (a (128, 128) block's 16), whatever the result's
    # shape; the XLU leaves each row's lane reduction in every lane (Array._lanes)
    if ex.timing_only and out_shape:
      data = None
    return Array(data, out_shape, out_d, _charge(ex, cls, shape, axes, in_d, ready),
                 cls is OpClass.REDUCE_LANE and bool(out_shape))

  op.__name__ = name
  return op


# (reduction, operand shape, operand dtype, axis, [its entries' types,] keepdims) -> `_analysis`, for
# int, None or tuple axes and no other arguments (the key holds the axis's value and types: 1 == True
# == 1.0; an error is never kept: `_analysis` raises before `keep`)
_PLANS: dict = {}


def _analysis(name: str, result: str, a, axis, keepdims, dtype, kw) -> tuple:
  """(operand shape, reduced axes, operand dtype, result dtype, result shape, cost class) of a reduction
  `name` of `a`: a pure function of the arguments' static parts."""
  shape = _shape_of(a)
  axes = _norm_axes(axis, len(shape))
  in_d = dtype_of(a) if isinstance(a, Array) else _default_dtype(a)
  if result == "index":
    out_d = dt.int32
  elif result == "bool":
    out_d = dt.bool_
  elif dtype is not None:
    out_d = _dtype_arg(dtype, f"jnp.{name}")
  elif name in ("sum", "prod") and (in_d == dt.bool_ or dt.is_int(in_d)) and \
      kw.get("promote_integers", True):
    out_d = _promoted_int(in_d)   # JAX promote_integers: narrow ints (and bool) sum in 32 bits
  elif name == "mean" and not dt.is_float(in_d):
    out_d = _F32
  else:
    out_d = in_d
  out_shape = tuple([(1 if i in axes else s) for i, s in enumerate(shape)]) if keepdims else \
      tuple([s for i, s in enumerate(shape) if i not in axes])
  return tuple(shape), axes, in_d, out_d, out_shape, _reduce_class(axes, len(shape))


# the ufuncs' reduce is what np.sum / np.prod / np.max / np.min call (same result), without their
# Python-level argument wrapper
sum = _reduction(np.add.reduce, "sum")  # noqa: A001
prod = _reduction(np.multiply.reduce, "prod")
max = amax = _reduction(np.maximum.reduce, "max")  # noqa: A001
min = amin = _reduction(np.minimum.reduce, "min")  # noqa: A001
mean = _reduction(np.mean, "mean")
argmax = _reduction(np.argmax, "argmax", "index")
argmin = _reduction(np.argmin, "argmin", "index")
any = _reduction(np.any, "any", "bool")  # noqa: A001
all = _reduction(np.all, "all", "bool")  # noqa: A001


def _reduce(npfn, v, axis, keepdims: bool, extra_args: dict, name: str, ex):
  """`npfn(v, axis=, keepdims=, **extra_args)`, a ValueError raised as palace's ShapeError."""
  try:
    return npfn(v, axis=axis, keepdims=keepdims, **extra_args)
  except ValueError as e:   # e.g. max with a where mask and no initial (JAX raises ValueError too)
    raise ShapeError(f"jnp.{name}{' ' + ex.where() if ex else ''}: {e}. Fix: pass initial= with "
                     f"where= for max / min (there is no identity). ({user_frame_summary()})") from None


def _promoted_int(d: np.dtype) -> np.dtype:
  return dt.uint32 if d.kind == "u" or d == dt.uint4 else dt.int32


def sparsecore_cumsum_rank_error(shape, where: str) -> UnsupportedError:
  """A cumsum of rank > 1 on a SparseCore vector subcore, which Mosaic does not lower (raised when
  palace runs one, and while palace.jax lowers a JAX kernel with one)."""
  return UnsupportedError(
      f"jnp.cumsum {where}: x of shape {tuple(shape)} must be rank 1 on a SparseCore (Mosaic's "
      f"SparseCore lowering: 'cumsum: x must be rank 1'). Fix: cumsum each row as its own rank-1 "
      f"vector.")


def cumsum(a, axis=None, dtype=None):
  """`jnp.cumsum` (axis=None scans the flattened array); narrow ints accumulate in 32 bits like JAX."""
  ex = executor.maybe_current()
  if ex is not None and ex.sparsecore is None and isinstance(a, Array):
    raise UnsupportedError(
        f"jnp.cumsum {ex.where()} ({user_frame_summary()}): the TPU compiler has no cumulative sum on "
        f"a TensorCore (Mosaic, measured on a TPU v5e: 'Unimplemented primitive in Pallas TPU lowering "
        f"for tc: cumsum'). Fix: build the prefix sum from adds of shifted copies (pltpu.roll with a "
        f"mask, log2(n) steps), a matmul with a triangular ones matrix, or a pl.loop over rows; "
        f"SparseCore kernels have plsc.cumsum.")
  if ex is not None and ex.sparsecore is not None and isinstance(a, Array) and len(a.shape) != 1:
    raise sparsecore_cumsum_rank_error(a.shape, f"{ex.where()} ({user_frame_summary()})")
  if axis is None:
    a = ravel(a)
    axis = 0
  in_d = dtype_of(a) if isinstance(a, Array) else _default_dtype(a)
  if dtype is not None:
    out_d = _dtype_arg(dtype, "jnp.cumsum")
  elif dt.is_int(in_d) or in_d == dt.bool_:
    out_d = _promoted_int(in_d)
  else:
    out_d = in_d
  data = None
  if _has_data(a):
    data = np.cumsum(_np(a, _compute_dtype(out_d)), axis=axis).astype(out_d, copy=False)
  return _out(data, _shape_of(a), out_d, ready_of(a), OpClass.REDUCE_LANE, _is_arr(a))


__all__ = sorted(n for n in globals() if not n.startswith("_") and n not in _IMPORTED)
