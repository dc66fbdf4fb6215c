"""SparseCore meshes (L5): `plsc.VectorSubcoreMesh`, `plsc.ScalarSubcoreMesh`, `get_sparse_core_info`.

Meshes validate against the active virtual TPU when built (as JAX validates against the device):
on a chip without SparseCores (v5e) construction fails.
"""
from __future__ import annotations

import dataclasses

from palace._src.errors import UsageError
from palace._src.hw import ChipSpec, SparseCoreSpec
from palace._src.sim.machine import active_tpu


def _spec(chip: ChipSpec | None = None) -> SparseCoreSpec:
  chip = chip or active_tpu().chip
  if chip.sparsecore is None:
    raise UsageError(f"The current TPU ({chip.name}) does not have SparseCores; SparseCore meshes need "
                     f"v5p, v6e or 7x (select one with pl.virtual_tpu(...)).")
  return chip.sparsecore


def get_sparse_core_info() -> SparseCoreSpec:
  return _spec()


@dataclasses.dataclass(frozen=True)
class VectorSubcoreMesh:
  core_axis_name: str
  subcore_axis_name: str
  num_cores: int | None = None
  num_subcores: int | None = None

  def __post_init__(self):
    spec = _spec()
    nc = spec.num_cores if self.num_cores is None else int(self.num_cores)
    ns = spec.num_subcores if self.num_subcores is None else int(self.num_subcores)
    if not 1 <= nc <= spec.num_cores or not 1 <= ns <= spec.num_subcores:
      raise UsageError(f"VectorSubcoreMesh(num_cores={nc}, num_subcores={ns}): this chip has "
                       f"{spec.num_cores} SparseCores x {spec.num_subcores} vector subcores.")
    if self.core_axis_name == self.subcore_axis_name:
      raise UsageError("VectorSubcoreMesh needs distinct core and subcore axis names.")
    object.__setattr__(self, "num_cores", nc)
    object.__setattr__(self, "num_subcores", ns)

  @property
  def shape(self):
    return {self.core_axis_name: self.num_cores, self.subcore_axis_name: self.num_subcores}


@dataclasses.dataclass(frozen=True)
class ScalarSubcoreMesh:
  axis_name: str
  num_cores: int | None = None

  def __post_init__(self):
    spec = _spec()
    nc = spec.num_cores if self.num_cores is None else int(self.num_cores)
    if not 1 <= nc <= spec.num_cores:
      raise UsageError(f"ScalarSubcoreMesh(num_cores={nc}): this chip has {spec.num_cores} "
                       f"SparseCores.")
    object.__setattr__(self, "num_cores", nc)

  @property
  def shape(self):
    return {self.axis_name: self.num_cores}


def check_for_chip(mesh, chip: ChipSpec) -> None:
  """Re-validate a mesh against the chip of the launch (it may differ from the one at construction)."""
  spec = _spec(chip)
  nc = mesh.num_cores
  if nc > spec.num_cores or (isinstance(mesh, VectorSubcoreMesh) and mesh.num_subcores > spec.num_subcores):
    raise UsageError(f"{mesh} does not fit {chip.name}: {spec.num_cores} SparseCores x "
                     f"{spec.num_subcores} subcores.")
