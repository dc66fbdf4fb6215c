"""Mutable refs on the host (L5: they own HBM buffers, sim/memory.py): `pl.new_ref`, `pl.empty_ref`, `pl.freeze`, `pl.free_ref`.

A host ref owns an HBM buffer. Passing it to `pl.kernel` hands that very buffer to the kernel, which
mutates it in place (no copy, no output). `freeze` returns the final value and invalidates the ref.
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src import validate
from palace._src.core import MemoryRef, MemorySpace, ShapeDtypeStruct
from palace._src.errors import UsageError
from palace._src.launch.host import check_hbm_sizes
from palace._src.lang.refs import Ref
from palace._src.sim.memory import Buffer
from palace._src.util import prod


def _check_hbm(api: str, shape, dtype) -> None:
  """A host ref is an HBM buffer of one device of the active chip: checked before host memory is
  allocated for it, like pallas_call outputs."""
  name = ref_name(shape, dtype)
  check_hbm_sizes(api, [(name, prod(shape) * np.dtype(dtype).itemsize)], None)


def _host_array(x) -> np.ndarray:
  a = np.asarray(x)
  d = dt.canonicalize(a.dtype)
  dt.check_kernel_dtype(d, "pl.new_ref value")
  _check_hbm("pl.new_ref", a.shape, d)
  return a.astype(d) if d != a.dtype else a.copy()


def ref_name(shape, dtype) -> str:
  """A host ref's buffer name in messages: ref(float32[8, 128])."""
  return f"ref({np.dtype(dtype)}{list(shape)})"


def owning_ref(a: np.ndarray) -> Ref:
  """A host ref owning `a` (an HBM buffer the ref's kernel updates in place; `a` is not copied)."""
  return Ref(Buffer(a, a.shape, a.dtype, MemorySpace.ANY, ref_name(a.shape, a.dtype)))


def new_ref(init_val, *, memory_space=None, kind=None, pin=False) -> Ref:
  """A mutable HBM buffer initialised with a copy of `init_val`."""
  if memory_space not in (None, MemorySpace.ANY, MemorySpace.HBM):
    raise UsageError(f"pl.new_ref(memory_space={memory_space}) on the host: only HBM/ANY refs can be "
                     f"created outside a kernel. Fix: drop memory_space (HBM), or allocate VMEM/SMEM inside the "
                     f"kernel with pl.run_scoped.")
  return owning_ref(_host_array(init_val))


def empty_ref(ty, memory_space=None, pin=False) -> Ref:
  """An uninitialised mutable HBM buffer of a ShapeDtypeStruct's shape and dtype (floats read NaN)."""
  if not isinstance(ty, (ShapeDtypeStruct, MemoryRef)) and not hasattr(ty, "shape"):
    raise UsageError(f"pl.empty_ref expects a ShapeDtypeStruct; got {ty!r}. Fix: pass "
                     f"pl.ShapeDtypeStruct(shape, dtype).")
  d = dt.check_kernel_dtype(dt.canonicalize(ty.dtype), "pl.empty_ref")
  shape = validate.as_dims(ty.shape, "pl.empty_ref shape")
  _check_hbm("pl.empty_ref", shape, d)
  fill = np.nan if dt.is_float(d) else 0
  return owning_ref(np.full(shape, fill, d))


def freeze(ref: Ref) -> np.ndarray:
  """The final value of a host ref; the ref becomes invalid."""
  if not isinstance(ref, Ref) or ref.buf.storage is None:
    raise UsageError(f"pl.freeze expects a live mutable ref; got {ref!r}. Fix: pass a ref from "
                     f"pl.new_ref / pl.empty_ref that was not frozen or freed yet.")
  if ref._mapped:
    raise UsageError(f"pl.freeze of {ref.origin()}: a bitcast or reshape view of a host ref cannot be "
                     f"frozen. Fix: freeze the ref pl.new_ref returned, then bitcast or reshape the array.")
  value = ref.buf.storage if ref._full else ref.buf.storage[ref._np_index].copy()
  ref.buf.storage = None
  return value


def free_ref(ref: Ref) -> None:
  ref.buf.storage = None
