"""SparseCore meshes (L5): `plsc.VectorSubcoreMesh`, `plsc.ScalarSubcoreMesh`, `get_sparse_core_info`.

Inside `pl.virtual_tpu(...)` a mesh is validated against that TPU when built (as JAX validates against
the device; on a chip without SparseCores, v5e, construction fails) and its default sizes are the
chip's. Built before any virtual TPU (module level, as JAX code does), sizes left out stay unset and
the mesh is checked, and its sizes filled in, when a kernel uses it (`check_for_chip`).
"""
from __future__ import annotations

import copy
import dataclasses

from palace._src import validate
from palace._src.errors import UsageError
from palace._src.hw import ChipSpec, SparseCoreSpec
from palace._src.sim.machine import active_tpu, explicit_tpu


def _spec(chip: ChipSpec | None = None) -> SparseCoreSpec:
  chip = chip or active_tpu().chip
  if chip.sparsecore is None:
    raise UsageError(f"The current TPU ({chip.name}) does not have SparseCores; SparseCore meshes need "
                     f"v5p, v6e or 7x. Fix: select one with pl.virtual_tpu(\"v5p\") (or v6e, 7x).")
  return chip.sparsecore


def get_sparse_core_info() -> SparseCoreSpec:
  return _spec()


def _count(value, what: str):
  return None if value is None else validate.as_int(value, what, min_value=1)


@dataclasses.dataclass(frozen=True)
class VectorSubcoreMesh:
  core_axis_name: str
  subcore_axis_name: str
  num_cores: int | None = None
  num_subcores: int | None = None

  def __post_init__(self):
    validate.as_name(self.core_axis_name, "VectorSubcoreMesh(core_axis_name)")
    validate.as_name(self.subcore_axis_name, "VectorSubcoreMesh(subcore_axis_name)")
    if self.core_axis_name == self.subcore_axis_name:
      raise UsageError(f"VectorSubcoreMesh(core_axis_name={self.core_axis_name!r}, subcore_axis_name="
                       f"{self.subcore_axis_name!r}) needs distinct core and subcore axis names. Fix: "
                       f"name them differently, e.g. 'core' and 'subcore'.")
    object.__setattr__(self, "num_cores", _count(self.num_cores, "VectorSubcoreMesh(num_cores)"))
    object.__setattr__(self, "num_subcores", _count(self.num_subcores,
                                                    "VectorSubcoreMesh(num_subcores)"))
    tpu = explicit_tpu()
    if tpu is not None:
      resolved = _resolve(self, tpu.chip)
      object.__setattr__(self, "num_cores", resolved.num_cores)
      object.__setattr__(self, "num_subcores", resolved.num_subcores)

  @property
  def shape(self):
    m = _resolve(self, active_tpu().chip) if self.num_cores is None or self.num_subcores is None \
        else self
    return {self.core_axis_name: m.num_cores, self.subcore_axis_name: m.num_subcores}


@dataclasses.dataclass(frozen=True)
class ScalarSubcoreMesh:
  axis_name: str
  num_cores: int | None = None

  def __post_init__(self):
    validate.as_name(self.axis_name, "ScalarSubcoreMesh(axis_name)")
    object.__setattr__(self, "num_cores", _count(self.num_cores, "ScalarSubcoreMesh(num_cores)"))
    tpu = explicit_tpu()
    if tpu is not None:
      object.__setattr__(self, "num_cores", _resolve(self, tpu.chip).num_cores)

  @property
  def shape(self):
    m = _resolve(self, active_tpu().chip) if self.num_cores is None else self
    return {self.axis_name: m.num_cores}


def _resolve(mesh, chip: ChipSpec):
  """`mesh` with its unset sizes set to `chip`'s, after checking it fits the chip."""
  spec = _spec(chip)
  nc = spec.num_cores if mesh.num_cores is None else mesh.num_cores
  if isinstance(mesh, VectorSubcoreMesh):
    ns = spec.num_subcores if mesh.num_subcores is None else mesh.num_subcores
    if nc > spec.num_cores or ns > spec.num_subcores:
      raise UsageError(f"VectorSubcoreMesh(num_cores={nc}, num_subcores={ns}) does not fit {chip.name}: "
                       f"it has {spec.num_cores} SparseCores x {spec.num_subcores} vector subcores. "
                       f"Fix: pass num_cores <= {spec.num_cores} and num_subcores <= {spec.num_subcores}.")
    return _with_sizes(mesh, num_cores=nc, num_subcores=ns)
  if nc > spec.num_cores:
    raise UsageError(f"ScalarSubcoreMesh(num_cores={nc}) does not fit {chip.name}: it has "
                     f"{spec.num_cores} SparseCores. Fix: pass num_cores <= {spec.num_cores}.")
  return _with_sizes(mesh, num_cores=nc)


def _with_sizes(mesh, **sizes):
  """A copy of the (frozen) mesh with sizes already checked (no second validation)."""
  out = copy.copy(mesh)
  for k, v in sizes.items():
    object.__setattr__(out, k, v)
  return out


def check_for_chip(mesh, chip: ChipSpec):
  """The mesh checked against the chip of the launch (it may differ from the one at construction, or
  there was none), with unset sizes filled in from that chip."""
  return _resolve(mesh, chip)
