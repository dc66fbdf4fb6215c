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
lowering or at run time").
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
