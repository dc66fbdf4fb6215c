"""Host side of a launch (L5): operands to HBM buffers, outputs back to NumPy, one report per launch."""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.core import Buffer, CompilerParams, MemoryRef, MemorySpace, ShapeDtypeStruct
from palace._src.errors import ShapeError, UsageError
from palace._src.lang.array import Array
from palace._src.lang.refs import Ref
from palace._src.sim.machine import active_tpu

_INT_FILL = {np.dtype(np.int32): np.iinfo(np.int32).min, np.dtype(np.int16): np.iinfo(np.int16).min,
             np.dtype(np.int8): np.iinfo(np.int8).min}


def check_params(params, api: str) -> CompilerParams:
  if params is None:
    return CompilerParams()
  if isinstance(params, dict):
    if set(params) == {"mosaic"} or set(params) == {"mosaic_tpu"}:
      return CompilerParams(**next(iter(params.values())))
    raise UsageError(f"{api}: compiler_params={params!r}; pass a pltpu.CompilerParams(...).")
  if not isinstance(params, CompilerParams):
    raise UsageError(f"{api}: compiler_params must be a pltpu.CompilerParams for TPU; got "
                     f"{type(params).__name__}.")
  return params


def to_host_array(x, name: str) -> np.ndarray:
  """A kernel operand as a NumPy array with a TPU dtype (64-bit narrowed as JAX does without x64)."""
  if isinstance(x, Array):
    raise UsageError(f"{name} is a palace.Array from inside a kernel; kernel values cannot leave it.")
  if isinstance(x, Ref):
    raise UsageError(f"{name} is a mutable ref: pass refs to pl.kernel (mutated in place) or close "
                     f"over them; pallas_call takes arrays (use input_output_aliases to update in place).")
  if hasattr(x, "__jax_array__") or type(x).__module__.startswith("jax"):
    x = np.asarray(x)
  a = np.asarray(x)
  d = dt.canonicalize(a.dtype)
  if d != a.dtype:
    a = a.astype(d)
  dt.check_kernel_dtype(a.dtype, name)
  return a


def hbm_input(a: np.ndarray, name: str, chip: int = 0) -> Buffer:
  return Buffer(a, a.shape, a.dtype, MemorySpace.ANY, name, None, chip)


def uninitialized(shape, dtype) -> np.ndarray:
  if dt.is_float(dtype):
    return np.full(shape, np.nan, dtype)
  return np.full(shape, _INT_FILL.get(np.dtype(dtype), 0), dtype)


def out_struct(o, name: str):
  """(shape, dtype, memory space) of an out_shape / out_type entry."""
  if isinstance(o, MemoryRef):
    dt.check_kernel_dtype(o.dtype, name)
    return o.shape, o.dtype, o.memory_space
  if isinstance(o, ShapeDtypeStruct) or (hasattr(o, "shape") and hasattr(o, "dtype")):
    d = dt.canonicalize(o.dtype)
    if np.dtype(o.dtype) != d:
      raise ShapeError(f"{name} has dtype {np.dtype(o.dtype)}; TPUs have no 64-bit types, use {d}.")
    dt.check_kernel_dtype(d, name)
    return tuple(o.shape), d, MemorySpace.ANY
  raise UsageError(f"{name} = {o!r}: expected a pl.ShapeDtypeStruct or a memory type like "
                   f"pltpu.VMEM(shape, dtype).")


def new_launch(name: str, params: CompilerParams):
  tpu = active_tpu()
  machine = tpu.new_machine(name)
  return tpu, machine


def finish_launch(tpu, machine):
  report = machine.finish()
  tpu.reports.append(report)
  return report
