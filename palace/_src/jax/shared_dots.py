"""The shared-dots diagnostic on XLA:CPU's side: dots OUTSIDE palace's kernels by palace's rule.

Under `PALACE_JAX_SHARED_DOTS=1` (VirtualTPU(shared_dots=True)) palace computes every float dot in a
kernel by `mxu.shared_product` (exact sums per 128 of K, chunks added in float32 in order). A JAX test
compares such a kernel with a reference that XLA:CPU computes outside it, in its own summation order
and, at DEFAULT precision, with float32 operands unrounded. On a TPU the reference is XLA:TPU's, on
the same MXU as the kernel: float32 operands rounded to bfloat16 at DEFAULT (docs/numerics.md) and the
same passes over K (benchmarks/hw/probes_s22.py measures both). This module makes XLA:CPU's
`dot_general` follow the kernel's rule instead: a CPU lowering that, while the active engine has the
diagnostic on, computes float dots on the host with `mxu.shared_product`, float32 operands rounded to
bfloat16 at DEFAULT precision as XLA:TPU does. Integer dots, and every dot while no such engine is
active, keep JAX's own CPU lowering. A diagnostic, NOT what the chip computes: a test that passes only
under it differs from its reference by summation order (or by the reference's own rounding), which
on the chip both sides share (docs/jax.md, "Diagnostic: shared dots").
"""
from __future__ import annotations

import math

import numpy as np

from palace._src import dtypes as dt
from palace._src.lang import mxu

_installed: list = []   # the lowering is registered once per process (a registry, not state)


def _precision(precision) -> str:
  """mxu.DEFAULT or HIGHEST for a dot_general's `precision` parameter, jax_default_matmul_precision
  filling in None as JAX's lowering does; None for what XLA:TPU computes otherwise (HIGH: bf16_3x)."""
  import jax  # noqa: PLC0415
  names = precision if isinstance(precision, tuple) else (precision, precision)
  out = set()
  for p in names:
    if p is None:
      p = jax.config.jax_default_matmul_precision
    name = str(getattr(p, "name", p) or "default").lower()
    out.add(mxu.HIGHEST if name in ("highest", "float32") else
            mxu.DEFAULT if name in ("default", "bfloat16", "fastest", "none") else None)
  return out.pop() if len(out) == 1 else None


def host_dot(lhs: np.ndarray, rhs: np.ndarray, dimension_numbers, precision: str, out_dtype) -> np.ndarray:
  """`lax.dot_general(lhs, rhs)` by the shared rule: float32 operands rounded to bfloat16 at DEFAULT
  (bf16 ones widened exactly), then `mxu.shared_product`, cast to `out_dtype`."""
  (lc, rc), (lb, rb) = dimension_numbers
  lf = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
  rf = [i for i in range(rhs.ndim) if i not in rc and i not in rb]

  def values(x):
    x = dt.bf16_to_f32(x) if x.dtype == dt.bfloat16 else np.asarray(x, np.float32)
    if precision == mxu.DEFAULT:
      return mxu.round_to_bf16_as_f32(np.ascontiguousarray(x), np.empty(x.shape, np.float32))
    return x

  bsz = math.prod(lhs.shape[i] for i in lb)
  m, n = math.prod(lhs.shape[i] for i in lf), math.prod(rhs.shape[i] for i in rf)
  k = math.prod(lhs.shape[i] for i in lc)
  a = np.transpose(values(lhs), [*lb, *lf, *lc]).reshape(bsz, m, k)
  b = np.transpose(values(rhs), [*rb, *rc, *rf]).reshape(bsz, k, n)
  out = mxu.shared_product(a, b)
  shape = [lhs.shape[i] for i in lb] + [lhs.shape[i] for i in lf] + [rhs.shape[i] for i in rf]
  return out.reshape(shape).astype(out_dtype)


def install(active_engine) -> None:
  """Register the CPU lowering of `dot_general_p` that defers to JAX's own unless `active_engine()`'s
  VirtualTPU has shared_dots (idempotent; palace.jax's activation calls it only for the diagnostic)."""
  if _installed:
    return
  import jax  # noqa: PLC0415
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax._src.lax import lax as lax_internal  # noqa: PLC0415
  prim = lax_internal.dot_general_p
  entry = mlir._platform_specific_lowerings["cpu"].get(prim) or mlir._lowerings[prim]
  jax_rule = entry.rule

  def rule(ctx, lhs, rhs, *, dimension_numbers, precision, preferred_element_type, **params):
    engine = active_engine()
    (al, ar), (ao,) = ctx.avals_in, ctx.avals_out
    prec = _precision(precision)
    if (engine is None or not engine.tpu.shared_dots or prec is None
        or not all(dt.is_float(np.dtype(a.dtype)) and np.dtype(a.dtype).itemsize <= 4 for a in (al, ar, ao))):
      return jax_rule(ctx, lhs, rhs, dimension_numbers=dimension_numbers, precision=precision,
                      preferred_element_type=preferred_element_type, **params)
    out = jax.ShapeDtypeStruct(ao.shape, ao.dtype)

    def on_host(a, b):
      return host_dot(np.asarray(a), np.asarray(b), dimension_numbers, prec, np.dtype(ao.dtype))

    return mlir.lower_fun(lambda a, b: jax.pure_callback(on_host, out, a, b),
                          multiple_results=False)(ctx, lhs, rhs)

  mlir.register_lowering(prim, rule, platform="cpu")
  _installed.append(rule)
