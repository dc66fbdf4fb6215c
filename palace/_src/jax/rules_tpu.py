"""Registry entries of Mosaic-TPU value primitives: elementwise packing (`pack_elementwise`,
`unpack_elementwise`) and `stochastic_round` (lang/packing.py). Each is DATA in the schedule
analysis (its results depend on its operands' values, its cost on their shapes only), and each
`rejects` what Mosaic refuses from the types alone while palace lowers the kernel. The explicit MXU
with a result FIFO (`matmul_push_rhs`, `matmul_lhs_fifo`, `matmul_pop_fifo`, lang/mxu_fifo.py) keeps
per-core state, so a kernel using it is never replayed (no `schedule`)."""
from __future__ import annotations

import numpy as np

from palace._src.jax.registry import DATA, rule
from palace._src.lang import mxu_fifo, packing


def _dtype(var) -> np.dtype:
  return np.dtype(var.aval.dtype)


def _pack_rejects(eqn, sparsecore: bool = False) -> None:
  packing.check_pack(_dtype(eqn.invars[0]), eqn.params["packed_dtype"], len(eqn.invars),
                     tuple(eqn.invars[0].aval.shape))


@rule("pack_elementwise", schedule=DATA, rejects=_pack_rejects)
def _pack_elementwise(eqn, *xs):
  return packing.pack_elementwise(xs, packed_dtype=eqn.params["packed_dtype"])


def _unpack_rejects(eqn, sparsecore: bool = False) -> None:
  p = eqn.params
  packing.check_unpack(_dtype(eqn.invars[0]), p["packed_dtype"], p["unpacked_dtype"], p["index"],
                       tuple(eqn.invars[0].aval.shape))


@rule("unpack_elementwise", schedule=DATA, rejects=_unpack_rejects)
def _unpack_elementwise(eqn, x):
  p = eqn.params
  return packing.unpack_elementwise(x, index=p["index"], packed_dtype=p["packed_dtype"],
                                    unpacked_dtype=p["unpacked_dtype"])


def _round_rejects(eqn, sparsecore: bool = False) -> None:
  x, bits = (v.aval for v in eqn.invars)
  packing.check_round(x.dtype, bits.dtype, x.shape, bits.shape, eqn.params["target_dtype"])


@rule("stochastic_round", schedule=DATA, rejects=_round_rejects)
def _stochastic_round(eqn, x, bits):
  return packing.stochastic_round(x, bits, target_dtype=eqn.params["target_dtype"])


@rule("matmul_push_rhs")
def _matmul_push_rhs(eqn, rhs):
  p = eqn.params
  mxu_fifo.matmul_push_rhs(rhs, p["staging_register"], p["mxu_index"], transpose=p["transpose"])
  return []


@rule("matmul_lhs_fifo")
def _matmul_lhs_fifo(eqn, lhs):
  p = eqn.params
  mxu_fifo.matmul_lhs_fifo(lhs, p["mxu_index"], load_staged_rhs=p["load_staged_rhs"])
  return []


@rule("matmul_pop_fifo")
def _matmul_pop_fifo(eqn):
  p = eqn.params
  return mxu_fifo.matmul_pop_fifo(p["shape"], p["dtype"], p["mxu_index"])
