"""Pinned buffers (`jax._src.state.primitives.pin` / `unpin`) around a palace-run `pallas_call`.

`pin(x)` gives a value of JAX's hi-type `AbstractLinVal` (x's buffer kept in place, in HBM or VMEM, for
a `pallas_call` that aliases it as input and output); `unpin` gives the array back. JAX lowers them to
the custom calls "Pin" / "Unpin" on a memref-typed value, which only the TPU compiler implements
(XLA:CPU: "No registered implementation for untyped custom call to Pin for Host"). Neither changes a
value: on the chip the buffer stays where it is and the kernel updates it in place. While a palace
engine is active (the lowering's own switch, as for `pallas_call`), `install` lowers both as the value
itself on the CPU and a pinned value as its array type; `unpinned` gives the array aval a palace launch
takes for a pinned operand or result. Without an engine, JAX's own lowerings apply unchanged.
"""
from __future__ import annotations

_installed: list = []


def unpinned(aval):
  """The array aval of a pinned value (`AbstractLinVal`), any other aval unchanged."""
  from jax._src.state import types as state_types  # noqa: PLC0415
  return aval.inner_aval if isinstance(aval, state_types.AbstractLinVal) else aval


def install(active_engine) -> None:
  """Register the CPU lowerings of `pin_p` / `unpin_p` and the IR type of a pinned value that, while
  `active_engine()` is not None, keep the value and its array type (idempotent)."""
  if _installed:
    return
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax._src.state import primitives as state_prims, types as state_types  # noqa: PLC0415
  jax_type = mlir.ir_type_handlers[state_types.AbstractLinVal]
  jax_pin = mlir._lowerings[state_prims.pin_p].rule
  jax_unpin = mlir._lowerings[state_prims.unpin_p].rule

  def ir_type(aval):
    return jax_type(aval) if active_engine() is None else mlir._array_ir_types(aval.inner_aval)

  def pin(ctx, x, *, to):
    return jax_pin(ctx, x, to=to) if active_engine() is None else [x]

  def unpin(ctx, x):
    return jax_unpin(ctx, x) if active_engine() is None else [x]

  mlir.ir_type_handlers[state_types.AbstractLinVal] = ir_type
  mlir.register_lowering(state_prims.pin_p, pin, platform="cpu")
  mlir.register_lowering(state_prims.unpin_p, unpin, platform="cpu")
  _installed.append(pin)
