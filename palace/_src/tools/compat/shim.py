"""The `jax` package that modules loaded by `palace.compat.load_module` see (palace underneath).

`build_shim()` returns a fresh {dotted name: module} table for one load. Each shim module looks names
up in its own table, then in the palace modules behind it; a name found nowhere raises
`MissingNameError` (an UnsupportedError and an AttributeError) naming it, e.g. `jax.pmap`.
"""
from __future__ import annotations

import contextlib
import enum
import types
from typing import Any

import numpy as np

import palace
from palace import lax as _plax
from palace import numpy as _pjnp
from palace import tpu as _ptpu
from palace import tpu_sc as _psc
from palace._src import dtypes as dt
from palace._src import executor, validate
from palace._src.launch import spmd
from palace._src.tools.compat import host
from palace._src.core import CostEstimate
from palace._src.errors import UnsupportedError, UsageError
from palace._src.lang import primitives as prims


class ShimModule(types.ModuleType):
  """A module of the JAX shim: own names first, then the palace modules in `_palace_sources` (a name
  found there is kept as the module's own on first use)."""

  def __init__(self, name: str, sources=(), names=None, doc=""):
    super().__init__(name, doc or f"palace's stand-in for `{name}` (see palace.compat).")
    self._palace_sources = tuple(sources)
    self.__dict__.update(names or {})

  def __getattr__(self, attr: str):
    if attr.startswith("__") or attr == "_palace_sources":
      raise AttributeError(attr)
    for src in self._palace_sources:
      try:
        value = getattr(src, attr)
      except AttributeError:
        continue
      # kept as this module's own: later lookups (a kernel body's `jnp.dot`, once per grid step) are
      # plain attribute reads, not this method and a failed getattr per earlier source
      self.__dict__[attr] = value
      return value
    raise host.MissingNameError(
        f"`{self.__name__}.{attr}` is not provided by palace's JAX shim (palace.compat.load_module). "
        f"Fix: use the palace equivalent if there is one, or report the missing name.")

  def __dir__(self):
    out = set(self.__dict__)
    for src in self._palace_sources:
      out |= {n for n in dir(src) if not n.startswith("_")}
    return sorted(out)


# ------------------------------------------------------------------ jax.numpy extras (host only)
def _host_only(name, fn):
  def f(*args, **kwargs):
    if executor.maybe_current() is not None:
      raise UnsupportedError.feature(f"jnp.{name} inside a kernel",
                                     "palace provides it only on the host (outside kernels). Fix: call it "
                                     "outside the kernel body and pass the result in.")
    out = fn(*[_to_np(a) for a in args], **{k: _to_np(v) for k, v in kwargs.items()})
    return _narrow(out)
  f.__name__ = name
  return f


def _to_np(x):
  if isinstance(x, (list, tuple)):
    return type(x)(_to_np(v) for v in x)
  return x


def _narrow(out):
  if isinstance(out, np.ndarray):
    d = dt.canonicalize(out.dtype)
    return out.astype(d) if d != out.dtype else out
  if isinstance(out, (list, tuple)):
    return type(out)(_narrow(o) for o in out)
  return out


_NP_HOST = ("pad", "split", "array_split", "linspace", "take", "take_along_axis", "sort", "argsort",
            "unique", "triu", "tril", "meshgrid", "nonzero", "searchsorted", "diff", "cumprod", "log1p",
            "expm1", "log2", "log10", "exp2", "allclose", "array_equal", "isclose", "vstack", "hstack",
            "argwhere", "count_nonzero", "indices", "diag", "kron", "fill_diagonal", "nan_to_num",
            "flatnonzero", "packbits", "unpackbits", "bincount", "histogram", "percentile", "median",
            "var", "std", "cos", "arcsin", "arccos", "arctan2", "hypot", "logaddexp", "full_like",
            "atleast_1d", "atleast_2d", "interp", "append", "delete", "insert", "select", "piecewise",
            "ptp", "trace", "cross", "inner", "tensordot", "vdot", "cumulative_sum", "ceil_divide")


def _repeat(a, repeats, axis=None, *, total_repeat_length=None):
  """jnp.repeat; on the host `total_repeat_length` pads with the last element or truncates (as JAX)."""
  if total_repeat_length is None or executor.maybe_current() is not None:
    return _pjnp.repeat(a, repeats, axis=axis)
  a = np.asarray(a)
  if axis is None:
    a, axis = a.ravel(), 0
  out = np.repeat(a, np.asarray(repeats), axis=axis)
  n = validate.as_int(total_repeat_length, "jnp.repeat(total_repeat_length)", min_value=0)
  if out.shape[axis] >= n:
    return np.take(out, np.arange(n), axis=axis)
  last = np.take(out, [-1], axis=axis) if out.shape[axis] else np.zeros_like(np.take(a, [0], axis=axis))
  pad = np.repeat(last, n - out.shape[axis], axis=axis)
  return np.concatenate([out, pad], axis=axis)


def _jnp_names() -> dict:
  names = {"repeat": _repeat}
  for n in _NP_HOST:
    if not hasattr(_pjnp, n) and hasattr(np, n):
      names[n] = _host_only(n, getattr(np, n))
  # dtype predicates and promotion are palace.numpy's (JAX's rules for every TPU dtype: bfloat16 and
  # fp8 are floating, int4 an integer; tests/jax_parity/test_dtype_parity.py compares them with JAX)
  names.update(
      issubdtype=_pjnp.issubdtype, promote_types=_pjnp.promote_types, result_type=_pjnp.result_type,
      finfo=_pjnp.finfo, iinfo=_pjnp.iinfo, generic=np.generic, bool_=dt.bool_,
      floating=np.floating, integer=np.integer, signedinteger=np.signedinteger,
      unsignedinteger=np.unsignedinteger, inexact=np.inexact, number=np.number,
      shape=np.shape, ndim=np.ndim, size=np.size, array=_pjnp.asarray, ndarray=host.Array,
      int64=np.int64, float64=np.float64, uint64=np.uint64, complex64=np.complex64,
      float8_e4m3b11fnuz=dt.float8_e4m3b11fnuz if hasattr(dt, "float8_e4m3b11fnuz") else None,
  )
  return {k: v for k, v in names.items() if v is not None}


# ------------------------------------------------------------------ jax.lax extras
class Precision(enum.Enum):
  DEFAULT = 0
  HIGH = 1
  HIGHEST = 2

  def __str__(self):
    return self.name


def _axis_size(axis_name):
  mesh = _spmd_mesh() if executor.maybe_current() is None else None
  if mesh is None:
    return prims.axis_size(axis_name)
  names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
  n = 1
  for a in names:
    if a not in mesh.shape:
      raise UsageError(f"lax.axis_size({axis_name!r}): unknown axis {a!r}; the shard_map mesh has "
                       f"axes {mesh.axis_names}. Fix: name one of those axes.")
    n *= mesh.shape[a]
  return n


def _spmd_mesh():
  from palace._src.launch import host as launch
  ctx = launch.spmd_context()
  return None if ctx is None else ctx[0].mesh


def _axis_index(axis_name):
  mesh = _spmd_mesh() if executor.maybe_current() is None else None
  if mesh is not None:
    from palace._src.launch import host as launch
    coords = mesh.coords(launch.spmd_context()[1])
    names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
    lin = 0
    for a in names:
      lin = lin * mesh.shape[a] + coords[a]
    return np.int32(lin)
  return prims.axis_index(axis_name)


def _lax_names() -> dict:
  def dot(a, b, precision=None, preferred_element_type=None):
    return _pjnp.dot(a, b, precision=precision, preferred_element_type=preferred_element_type)

  def clamp(lo, x, hi):
    return _pjnp.minimum(_pjnp.maximum(x, lo), hi)

  def integer_pow(x, y):
    out = x
    for _ in range(validate.as_int(
        y, "lax.integer_pow exponent", min_value=1,
        hint="pass an integer >= 1 (for y < 1 write 1 / x**n or jnp.ones_like(x)).") - 1):
      out = out * x
    return out

  return dict(dot=dot, clamp=clamp, integer_pow=integer_pow, Precision=Precision,
              axis_size=_axis_size, axis_index=_axis_index, stop_gradient=lambda x: x,
              optimization_barrier=lambda x: x, pow=_pjnp.power, sign=_pjnp.sign,
              floor=_pjnp.floor, ceil=_pjnp.ceil, round=_pjnp.round, is_finite=_pjnp.isfinite,
              transpose=lambda x, permutation: _pjnp.transpose(x, permutation),
              reshape=lambda x, new_sizes, dimensions=None: _pjnp.reshape(x, tuple(new_sizes)),
              squeeze=lambda x, dimensions: _pjnp.squeeze(x, tuple(dimensions)),
              expand_dims=lambda x, dimensions: _pjnp.expand_dims(x, tuple(dimensions)),
              concatenate=lambda operands, dimension: _pjnp.concatenate(operands, dimension),
              cumsum=lambda x, axis=0, reverse=False: _pjnp.cumsum(x, axis=axis),
              argmax=lambda x, axis, index_dtype: _pjnp.argmax(x, axis=axis),
              argmin=lambda x, axis, index_dtype: _pjnp.argmin(x, axis=axis),
              population_count=None)


# ------------------------------------------------------------------ jax.sharding
class NamedSharding:
  """`jax.sharding.NamedSharding(mesh, spec)`: recorded, not applied (palace shards in shard_map)."""

  def __init__(self, mesh, spec, *, memory_kind=None):
    self.mesh, self.spec, self.memory_kind = mesh, spec, memory_kind

  def __repr__(self):
    return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"


@contextlib.contextmanager
def _use_mesh(mesh):
  yield mesh


class AbstractDevice:
  def __init__(self, device_kind="TPU v5 lite", num_cores=None, platform="tpu"):
    self.device_kind, self.num_cores, self.platform = device_kind, num_cores, platform


def _sharding_names() -> dict:
  return dict(PartitionSpec=spmd.PartitionSpec, NamedSharding=NamedSharding, Mesh=spmd.Mesh,
              AbstractDevice=AbstractDevice, use_mesh=_use_mesh, use_abstract_mesh=_use_mesh,
              set_mesh=_use_mesh, AxisType=enum.Enum("AxisType", "Auto Explicit Manual"),
              SingleDeviceSharding=lambda device, memory_kind=None: None)


# ------------------------------------------------------------------ jax.experimental.pallas extras
def _estimate_cost(fun, *args, **kwargs) -> CostEstimate:
  """`pl.estimate_cost`: palace models time itself; the estimate is only a placeholder of zeros."""
  return CostEstimate(flops=0, transcendentals=0, bytes_accessed=0)


def _pallas_names() -> dict:
  return dict(estimate_cost=_estimate_cost)


# ------------------------------------------------------------------ the table
def _dtypes_names() -> dict:
  def itemsize_bits(d):
    d = np.dtype(d)
    return 4 if d.name in ("int4", "uint4") else d.itemsize * 8

  return dict(itemsize_bits=itemsize_bits, bfloat16=dt.bfloat16, float0=np.dtype([("f", np.void, 0)]),
              canonicalize_dtype=lambda d, allow_extended_dtype=False: dt.canonicalize(np.dtype(d)),
              issubdtype=_pjnp.issubdtype, finfo=_pjnp.finfo, iinfo=_pjnp.iinfo,
              result_type=_pjnp.result_type, promote_types=_pjnp.promote_types,
              is_weakly_typed=lambda x: isinstance(x, (int, float)))


def _jax_names(mods: dict) -> dict:
  return dict(
      ShapeDtypeStruct=host.ShapeDtypeStruct, Array=host.Array, jit=host.jit, vmap=host.vmap,
      custom_vjp=host.custom_vjp, custom_jvp=host.custom_jvp, named_scope=host.named_scope,
      ensure_compile_time_eval=host.ensure_compile_time_eval,
      default_matmul_precision=host.default_matmul_precision,
      block_until_ready=host.block_until_ready, device_put=host.device_put,
      devices=host.devices, local_devices=host.local_devices, device_count=host.device_count,
      local_device_count=host.local_device_count, default_backend=host.default_backend,
      new_ref=palace.new_ref, empty_ref=palace.empty_ref, freeze=palace.freeze,
      free_ref=palace.free_ref, Ref=palace.Ref, shard_map=palace.shard_map, make_mesh=palace.make_mesh,
      __version__="0.12.0.1+palace", ArrayLike=Any,
      **{k.split(".")[-1]: m for k, m in mods.items() if k.count(".") == 1})


def build_shim() -> dict:
  """A fresh {dotted name: ShimModule} table (one per load_module call)."""
  mods: dict = {}

  def add(name, sources=(), names=None):
    mods[name] = ShimModule(name, sources, names)
    return mods[name]

  add("jax.numpy", [_pjnp], _jnp_names())
  add("jax.lax", [_plax], {k: v for k, v in _lax_names().items() if v is not None})
  add("jax.nn", (), dict(host.NN))
  add("jax.random", (), dict(host.RANDOM))
  add("jax.tree_util", (), dict(host.TREE))
  add("jax.tree", (), dict(map=host.tree_map, flatten=host.tree_flatten, unflatten=host.tree_unflatten,
                           leaves=host.tree_leaves, structure=host.TREE["tree_structure"],
                           static=host.static_field))
  add("jax.sharding", (), _sharding_names())
  add("jax.typing", (), dict(DTypeLike=Any, ArrayLike=Any))
  add("jax.debug", (), dict(print=host.debug_print, callback=lambda f, *a, **k: f(*a, **k)))
  add("jax.dtypes", (), _dtypes_names())
  add("jax.ad_checkpoint", (), dict(checkpoint_name=lambda x, name: x))
  add("jax.ref", (), dict(new_ref=palace.new_ref, empty_ref=palace.empty_ref, freeze=palace.freeze,
                          free_ref=palace.free_ref))
  exp = add("jax.experimental", (), {})
  tpu = add("jax.experimental.pallas.tpu", [_ptpu], {})
  tpu_sc = add("jax.experimental.pallas.tpu_sc", [_psc], {})
  pallas = add("jax.experimental.pallas", [palace], dict(_pallas_names(), tpu=tpu, tpu_sc=tpu_sc))
  smap = add("jax.experimental.shard_map", (), dict(shard_map=palace.shard_map))
  exp.pallas, exp.shard_map = pallas, smap
  src = add("jax._src", (), {})
  src.shard_map = add("jax._src.shard_map", (), dict(shard_map=palace.shard_map))
  src.dtypes = add("jax._src.dtypes", (), _dtypes_names())
  src.util = add("jax._src.util", (), dict(safe_zip=zip, safe_map=map, cache=_cache))
  jax = add("jax", (), _jax_names(mods))
  jax._src = src
  return mods


def _cache(max_size=4096, trace_context_in_key=True):
  import functools
  return functools.lru_cache(max_size)
