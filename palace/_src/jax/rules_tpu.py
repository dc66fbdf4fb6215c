"""Registry entries of Mosaic-TPU value primitives: elementwise packing (`pack_elementwise`,
`unpack_elementwise`) and `stochastic_round` (lang/packing.py). Each is DATA in the schedule
analysis (its results depend on its operands' values, its cost on their shapes only), and each
`rejects` what Mosaic refuses from the types alone while palace lowers the kernel."""
from __future__ import annotations

import numpy as np

from palace._src.jax.registry import DATA, rule
from palace._src.lang import packing


def _dtype(var) -> np.dtype:
  return np.dtype(var.aval.dtype)


def _pack_rejects(eqn, sparsecore: bool = False) -> None:
  packing.check_pack(_dtype(eqn.invars[0]), eqn.params["packed_dtype"], len(eqn.invars))


@rule("pack_elementwise", schedule=DATA, rejects=_pack_rejects)
def _pack_elementwise(eqn, *xs):
  return packing.pack_elementwise(xs, packed_dtype=eqn.params["packed_dtype"])


def _unpack_rejects(eqn, sparsecore: bool = False) -> None:
  p = eqn.params
  packing.check_unpack(_dtype(eqn.invars[0]), p["packed_dtype"], p["unpacked_dtype"], p["index"])


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
