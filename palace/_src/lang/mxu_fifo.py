"""Explicit MXU operations with a result FIFO (L4a): `pltpu.matmul_push_rhs`, `pltpu.matmul_lhs_fifo`,
`pltpu.matmul_pop_fifo` (JAX 0.12's jax/_src/pallas/mosaic/primitives.py gives their semantics).

Each MXU of a core (`mxu_index` < ChipSpec.num_mxus) has staging registers, loaded weights and a result
FIFO, kept per core and launch in the kernel's `KernelContext.mxu`:

- `matmul_push_rhs(rhs, staging_register, mxu_index, transpose)` stages a K x K right-hand side
  (K = ChipSpec.mxu_size; `transpose`: `rhs` is given as N x K). Pushing to a register whose RHS was
  not loaded yet is an error, as JAX's docstring forbids it.
- `matmul_lhs_fifo(lhs, mxu_index, load_staged_rhs)` first loads the staged RHS of register
  `load_staged_rhs` (None: keep the loaded one), then multiplies the M x K `lhs` (M a multiple of
  sublanes x the lhs dtype's packing) by it and enqueues the M x K result: float32 for float
  operands, int32 for integer ones. The LHS dtype is the matmul's; an RHS of another dtype is refused.
  Float32 operands multiply in float32 (precision HIGHEST): JAX's test_fifo checks them to 1e-3 against
  a float32 product, which rounding the operands to bf16 would miss a hundredfold.
- `matmul_pop_fifo(shape, dtype, mxu_index)` dequeues the oldest result, which must have that shape and
  dtype. Popping an empty FIFO is the error XLA's scheduler gives ('Cannot schedule FIFO pop
  instruction when the FIFO is empty').

The FIFO's capacity is not published. `ChipSpec.mxu_result_fifo_vregs` = (fits, overflows), in 8 x 128
result vregs, bounds it from what JAX's tests expect: a queue that reaches `overflows` is the 'FIFO is
full' error; a launch whose queue went past `fits` without reaching it raises UnsupportedError (palace
cannot say whether the chip accepts it). Chips without the FIFO (`()`: v4, 7x, where JAX's test expects
'MatmulLhsFifoOp not supported on TPU generations >= 7') refuse the ops. A kernel must end with empty
staging registers and FIFOs (JAX's docstrings); `check_end` raises otherwise.
"""
from __future__ import annotations

import collections

import numpy as np

from palace._src import dtypes as dt
from palace._src import executor
from palace._src.errors import ResourceError, ShapeError, SyncError, UnsupportedError, UsageError
from palace._src.lang import context
from palace._src.lang import mxu
from palace._src.lang.array import Array
from palace._src.lang.numpy_linalg import dot_general
from palace._src.util import user_frame_summary

_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)


class MxuState:
  """One core's explicit-MXU state: staged and loaded RHS per MXU, result FIFOs, the deepest queue."""
  __slots__ = ("staged", "loaded", "fifo", "deepest", "where_deepest")

  def __init__(self):
    self.staged = {}     # (mxu_index, register) -> (rhs Array, transpose, site)
    self.loaded = {}     # mxu_index -> (rhs Array, transpose)
    self.fifo = collections.defaultdict(collections.deque)   # mxu_index -> results, oldest first
    self.deepest = 0     # the most result vregs any FIFO held
    self.where_deepest = ""


def _setup(api: str, mxu_index) -> tuple:
  """(executor, chip, state) for an explicit-MXU op on `mxu_index`, or the chip's refusal."""
  ex = executor.current(f"pltpu.{api}()")
  chip = ex.chip
  if not chip.mxu_result_fifo_vregs:
    raise UnsupportedError(f"pltpu.{api} {ex.where()} ({user_frame_summary()}): TPU {chip.name} has no "
                           f"MXU result FIFO (ChipSpec.mxu_result_fifo_vregs; JAX's tests expect "
                           f"'MatmulLhsFifoOp not supported on TPU generations >= 7' on 7x, and run the "
                           f"ops on v5e and later only). Fix: use jnp.dot / lax.dot_general, or a v5e, "
                           f"v5p or v6e.")
  if type(mxu_index) is not int or not 0 <= mxu_index < chip.num_mxus:
    raise UsageError(f"pltpu.{api} {ex.where()}: mxu_index={mxu_index!r}; expected an int in [0, "
                     f"{chip.num_mxus}) (TPU {chip.name} has {chip.num_mxus} MXUs per core). Fix: pass "
                     f"one of those. ({user_frame_summary()})")
  kctx = context.current(f"pltpu.{api}()")
  if kctx.mxu is None:
    kctx.mxu = MxuState()
  return ex, chip, kctx.mxu


def matmul_push_rhs(rhs, staging_register: int, mxu_index: int, *, transpose: bool = False) -> None:
  ex, chip, st = _setup("matmul_push_rhs", mxu_index)
  k = chip.mxu_size
  if dt.bits(rhs.dtype) < 8:
    raise UnsupportedError(f"pltpu.matmul_push_rhs of a {rhs.dtype} RHS {ex.where()}: sub-byte explicit "
                           f"matmuls (a 2K x K RHS) are not modelled by palace. Fix: use int8, or "
                           f"jnp.dot. ({user_frame_summary()})")
  if tuple(rhs.shape) != (k, k):
    raise ShapeError(f"pltpu.matmul_push_rhs {ex.where()}: the RHS is {rhs.dtype}{list(rhs.shape)}; "
                     f"expected {k} x {k} (the MXU column size of TPU {chip.name}). Fix: push one "
                     f"{k} x {k} tile at a time. ({user_frame_summary()})")
  if type(staging_register) is not int or staging_register < 0:
    raise UsageError(f"pltpu.matmul_push_rhs {ex.where()}: staging_register={staging_register!r}; "
                     f"expected a non-negative int. Fix: pass e.g. 0. ({user_frame_summary()})")
  key = (mxu_index, staging_register)
  if key in st.staged:
    raise SyncError(f"pltpu.matmul_push_rhs {ex.where()} ({user_frame_summary()}): staging register "
                    f"{staging_register} of MXU {mxu_index} still holds the RHS pushed at "
                    f"{st.staged[key][2]}, never loaded; pushing twice to one register is not allowed. "
                    f"Fix: load it first (matmul_lhs_fifo(..., load_staged_rhs={staging_register})).")
  st.staged[key] = (rhs if isinstance(rhs, Array) else Array(np.asarray(rhs), rhs.shape, rhs.dtype, 0),
                    bool(transpose), user_frame_summary())
  ex.scalar_op()


def _result_vregs(shape) -> int:
  return -(-shape[0] // 8) * -(-shape[1] // 128)


def matmul_lhs_fifo(lhs, mxu_index: int, *, load_staged_rhs: int | None = None) -> None:
  ex, chip, st = _setup("matmul_lhs_fifo", mxu_index)
  if load_staged_rhs is not None:
    staged = st.staged.pop((mxu_index, load_staged_rhs), None)
    if staged is None:
      raise SyncError(f"pltpu.matmul_lhs_fifo {ex.where()} ({user_frame_summary()}): "
                      f"load_staged_rhs={load_staged_rhs}, but staging register {load_staged_rhs} of "
                      f"MXU {mxu_index} is empty. Fix: matmul_push_rhs into it first.")
    st.loaded[mxu_index] = staged[:2]
  if mxu_index not in st.loaded:
    raise SyncError(f"pltpu.matmul_lhs_fifo {ex.where()} ({user_frame_summary()}): MXU {mxu_index} has "
                    f"no RHS loaded. Fix: pass load_staged_rhs=<register> after a matmul_push_rhs.")
  rhs, transpose = st.loaded[mxu_index]
  k, d = chip.mxu_size, np.dtype(lhs.dtype)
  rows = chip.sublanes * dt.packing(d)
  if lhs.ndim != 2 or lhs.shape[1] != k or lhs.shape[0] % rows:
    raise ShapeError(f"pltpu.matmul_lhs_fifo {ex.where()}: the LHS is {d}{list(lhs.shape)}; expected "
                     f"M x {k} with M a multiple of {rows} ({chip.sublanes} sublanes x the {d} "
                     f"packing). Fix: slice the LHS so. ({user_frame_summary()})")
  if np.dtype(rhs.dtype) != d:
    raise UnsupportedError(f"pltpu.matmul_lhs_fifo {ex.where()}: a {d} LHS with a {rhs.dtype} RHS; the "
                           f"LHS dtype is the matmul's, and how the MXU reads an RHS of another dtype "
                           f"is not modelled. Fix: push the RHS as {d}. ({user_frame_summary()})")
  out = _I32 if dt.is_int(d) else _F32
  prec = mxu.HIGHEST if d == _F32 else None
  result = dot_general(lhs, rhs, (((1,), (1 if transpose else 0,)), ((), ())), precision=prec,
                       preferred_element_type=out)
  q = st.fifo[mxu_index]
  q.append(result)
  depth = sum(_result_vregs(r.shape) for r in q)
  fits, overflows = chip.mxu_result_fifo_vregs
  if depth >= overflows:
    raise ResourceError(f"pltpu.matmul_lhs_fifo {ex.where()} ({user_frame_summary()}): Cannot schedule "
                        f"FIFO push instruction when the FIFO is full: MXU {mxu_index}'s result FIFO "
                        f"would hold {len(q)} results, {depth} vregs; JAX's tests expect {overflows} to "
                        f"overflow on TPU {chip.name} (ChipSpec.mxu_result_fifo_vregs). Fix: pop "
                        f"results (matmul_pop_fifo) between pushes.")
  if depth > st.deepest:
    st.deepest, st.where_deepest = depth, f"{ex.where()} ({user_frame_summary()})"


def matmul_pop_fifo(shape, dtype, mxu_index: int):
  ex, chip, st = _setup("matmul_pop_fifo", mxu_index)
  q = st.fifo[mxu_index]
  d = np.dtype(dtype)
  if not q:
    raise SyncError(f"pltpu.matmul_pop_fifo {ex.where()} ({user_frame_summary()}): Cannot schedule FIFO "
                    f"pop instruction when the FIFO is empty: MXU {mxu_index}'s result FIFO holds no "
                    f"result. Fix: pop once per matmul_lhs_fifo.")
  head = q[0]
  if tuple(shape) != tuple(head.shape) or d != head.dtype:
    raise UnsupportedError(f"pltpu.matmul_pop_fifo {ex.where()}: popping {d}{list(shape)} when the oldest "
                           f"result of MXU {mxu_index} is {head.dtype}{list(head.shape)}; palace models "
                           f"pops of whole results. Fix: pop with the shape and dtype of each "
                           f"matmul_lhs_fifo's result. ({user_frame_summary()})")
  _check_depth(chip, st)
  return q.popleft()


def _check_depth(chip, st) -> None:
  fits, overflows = chip.mxu_result_fifo_vregs
  if st.deepest > fits:
    raise UnsupportedError(f"pltpu.matmul_lhs_fifo {st.where_deepest}: a result FIFO held {st.deepest} "
                           f"vregs; TPU {chip.name}'s capacity is not published, and JAX's tests only "
                           f"show that {fits} fit and {overflows} overflow (ChipSpec."
                           f"mxu_result_fifo_vregs), so palace cannot say whether the chip accepts "
                           f"this. Fix: pop each result before the next push.")


def kctx_chip():
  return executor.current("the end of a kernel").chip


def check_end(kctx) -> None:
  """At the end of a kernel body on a core: nothing may be left staged or queued."""
  st = kctx.mxu
  if st is None:
    return
  _check_depth(kctx_chip(), st)
  if st.staged:
    (m, r), (_, _, site) = next(iter(st.staged.items()))
    raise SyncError(f"pltpu.matmul_push_rhs at {site}: the kernel ended with staging register {r} of MXU "
                    f"{m} holding an RHS never loaded; a kernel must not leave data in the staging "
                    f"registers. Fix: load it (matmul_lhs_fifo(..., load_staged_rhs={r})) or do not "
                    f"push it.")
  left = {m: len(q) for m, q in st.fifo.items() if q}
  if left:
    m, n = next(iter(left.items()))
    raise SyncError(f"the kernel ended with {n} result(s) in MXU {m}'s result FIFO never popped; a kernel "
                    f"must not leave data in the FIFO. Fix: matmul_pop_fifo once per matmul_lhs_fifo.")
