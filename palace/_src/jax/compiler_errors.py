"""palace's refusals of what the TPU compiler rejects, as the error type JAX raises for them (L5).

On a TPU, a kernel the TPU compiler (Mosaic) rejects reaches JAX's caller as JAX's Mosaic error
(`jax._src.pallas.mosaic.error_handling.MosaicError`, which JAX makes of XLA's compile error), and test
suites catch that type. palace refuses the same kernels with its own `CompilerRejectError` (an
`UnsupportedError`, so a `NotImplementedError`), which palace.jax raises while it lowers the kernel (a
registry entry's `rejects`, run by `interpret.check_covered`). `as_jax_error` gives such an error the
class `CompilerRejectError` of this module, which subclasses both palace's class and JAX's
MosaicError, with the same message and notes: `except MosaicError`, `except pl.UnsupportedError` and
`except NotImplementedError` all catch it. JAX itself is not changed (the class only derives from
JAX's). An error found while a kernel runs cannot be given this type: it crosses XLA's host-callback
boundary, which turns every exception into its own `JaxRuntimeError` (docs/jax.md, "Errors: at
lowering or at run time"). Refusals that reach JAX's caller as XLA's compile error with a status
(VMEM over capacity: RESOURCE_EXHAUSTED; an internal scratch below the chip's minimum: INVALID_ARGUMENT)
are raised at lowering as palace's class and `JaxRuntimeError` both (`_jax_runtime_class`).
"""
from __future__ import annotations

import functools

from palace._src import errors


@functools.cache
def jax_class() -> type:
  """palace's CompilerRejectError as JAX's MosaicError too (made once, when first needed)."""
  from jax._src.pallas.mosaic import error_handling  # noqa: PLC0415

  class CompilerRejectError(errors.CompilerRejectError, error_handling.MosaicError):
    """A kernel the TPU compiler rejects (palace's CompilerRejectError), raised by palace.jax at
    lowering as JAX raises Mosaic's rejections: also a `MosaicError`."""

  CompilerRejectError.__module__, CompilerRejectError.__qualname__ = __name__, "CompilerRejectError"
  return CompilerRejectError


# absl status codes of the TPU compiler's refusals, as JaxRuntimeError carries them
_INVALID_ARGUMENT, _RESOURCE_EXHAUSTED = 3, 8


@functools.cache
def _jax_runtime_class(base: type, code: int) -> type:
  """palace's error class `base` as JAX's JaxRuntimeError too, with absl status `code`: a kernel palace
  refuses while palace.jax lowers it, as the TPU compiler's refusal reaches JAX's caller when it
  compiles (`jax.errors.JaxRuntimeError`; palace's message is its own)."""
  import jax  # noqa: PLC0415

  def __init__(self, message: str):
    base.__init__(self, message)
    jax.errors.JaxRuntimeError.__init__(self, message, code)

  cls = type(base.__name__, (base, jax.errors.JaxRuntimeError), {
      "__init__": __init__, "__module__": __name__, "__qualname__": base.__name__,
      "__doc__": f"palace's {base.__name__}, refused at lowering by palace.jax as the TPU compiler "
                 f"refuses it: also a `JaxRuntimeError` (absl status {code})."})
  return cls


def jax_resource_class() -> type:
  """palace's ResourceError as JAX's JaxRuntimeError too: a kernel over the chip's VMEM
  (RESOURCE_EXHAUSTED)."""
  return _jax_runtime_class(errors.ResourceError, _RESOURCE_EXHAUSTED)


def jax_usage_class() -> type:
  """palace's UsageError as JAX's JaxRuntimeError too: a compiler parameter the TPU compiler refuses
  (INVALID_ARGUMENT: `internal_scratch_in_bytes` below the chip's minimum, hw.check_internal_scratch)."""
  return _jax_runtime_class(errors.UsageError, _INVALID_ARGUMENT)


def _as_runtime_error(e: BaseException, cls: type) -> BaseException:
  out = cls(str(e.args[0]) if e.args else str(e))
  out.__dict__.update(e.__dict__)
  return out


def as_jax_resource_error(e: BaseException) -> BaseException:
  """A palace ResourceError raised at lowering as `jax_resource_class()` (message and notes kept)."""
  return _as_runtime_error(e, jax_resource_class())


def as_jax_usage_error(e: BaseException) -> BaseException:
  """A palace UsageError raised at lowering as `jax_usage_class()` (message and notes kept)."""
  return _as_runtime_error(e, jax_usage_class())


def as_jax_error(e: BaseException) -> BaseException:
  """`e` as JAX would raise it: a palace CompilerRejectError becomes the same error of `jax_class()`
  (message, notes, traceback and palace's annotations kept); any other error is `e` itself."""
  if not isinstance(e, errors.CompilerRejectError):
    return e
  cls = jax_class()
  if isinstance(e, cls):
    return e
  out = cls(*e.args)
  out.__dict__.update(e.__dict__)   # palace.jax's annotations and the notes (__notes__)
  return out.with_traceback(e.__traceback__)
