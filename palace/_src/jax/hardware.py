"""Hardware queries for the active virtual chip: `pltpu.get_tpu_info()` (and everything JAX derives from
it, e.g. emit_pipeline's tiling or `create_tensorcore_mesh`) answers as JAX would on that TPU.

JAX looks a device kind it does not know up in `jax._src.tpu_info.registry`; the host CPU devices'
kind is "cpu", so palace registers an entry for it that answers for the active engine's chip and, with
no engine active, raises JAX's own error. `get_tpu_info` is cached per trace context, which includes
the engine, so each context gets its own answer.

A TPU device also reports `num_cores` (its TensorCores), which `pltpu.TensorCoreMesh(axis_name=...)`
reads as its default size; the host CPU devices have no such attribute, so palace gives their type one
that answers for the active engine's chip and, with no engine active, raises AttributeError as before.
Inside a `jax.shard_map` JAX reads that size from the mesh's abstract device instead, which it builds
from the first device keeping `num_cores` for TPU devices only (`jax._src.mesh.abstract_device_from`),
so it was None there and `lax.axis_size` raised a bare TypeError (JAX's
test_multi_device_core_local_kernel). A CPU device's abstract device answers `num_cores` as the device
does, when asked (a mesh caches its abstract device, and one process may run several virtual chips
in turn); it compares and hashes as JAX's own CPU abstract device, so no cache or sharding check sees
a difference."""
from __future__ import annotations

# palace chip name -> JAX ChipVersion member name
_CHIP_VERSIONS = {"v4": "TPU_V4", "v5e": "TPU_V5E", "v5p": "TPU_V5P", "v6e": "TPU_V6E", "7x": "TPU_7X"}


def tpu_info_for(chip):
  """JAX's TpuInfo (per TensorCore) for a palace ChipSpec."""
  from jax._src import tpu_info  # noqa: PLC0415
  from palace._src.errors import UnsupportedError  # noqa: PLC0415
  name = _CHIP_VERSIONS.get(chip.name)
  if name is None:
    raise UnsupportedError(f"palace.jax: no JAX chip version for palace chip {chip.name!r}. Fix: use "
                           f"one of {sorted(_CHIP_VERSIONS)}.")
  return tpu_info._get_tpu_info_impl(getattr(tpu_info.ChipVersion, name),
                                     int(chip.num_tensorcores_per_device))


def install_tpu_info(active_engine) -> None:
  from jax._src import tpu_info  # noqa: PLC0415

  def cpu_device_info():
    engine = active_engine()
    if engine is None:
      raise ValueError("Unsupported TPU device kind: cpu. If you are not running on a TPU device, "
                       "you need to wrap your code in a `jax.sharding.use_abstract_mesh` context "
                       "manager whose `AbstractMesh` argument specifies the exact TPU version you "
                       "intend to target (or in `palace.jax.virtual_tpu(...)`).")
    return tpu_info_for(engine.tpu.chip)

  tpu_info.registry.setdefault("cpu", cpu_device_info)
  _install_num_cores(active_engine)


def _install_num_cores(active_engine) -> None:
  import jax  # noqa: PLC0415
  device_type = type(jax.devices("cpu")[0])
  if "num_cores" in device_type.__dict__:
    return

  def num_cores(self):
    engine = active_engine()
    if engine is None or self.platform != "cpu":
      raise AttributeError(f"{type(self).__name__!r} object has no attribute 'num_cores' (a host CPU "
                           f"device; inside palace.jax.virtual_tpu(...) it reports the chip's "
                           f"TensorCores)")
    return int(engine.tpu.chip.num_tensorcores_per_device)

  device_type.num_cores = property(num_cores)
  _install_abstract_device(active_engine)


def _install_abstract_device(active_engine) -> None:
  from jax._src import mesh  # noqa: PLC0415
  jax_from = mesh.abstract_device_from
  if getattr(jax_from, "_palace", False):
    return

  class CpuAbstractDevice(mesh.AbstractDevice):
    """JAX's abstract device of a host CPU device, whose `num_cores` is the active chip's."""
    __slots__ = ()

    @property
    def num_cores(self):
      engine = active_engine()
      return None if engine is None else int(engine.tpu.chip.num_tensorcores_per_device)

    def __eq__(self, other):
      if not isinstance(other, mesh.AbstractDevice):
        return NotImplemented
      return (self.device_kind, self.platform) == (other.device_kind, other.platform) and \
          (isinstance(other, CpuAbstractDevice) or other.num_cores is None)

    def __hash__(self):
      return hash((self.device_kind, None, self.platform))

    def __reduce__(self):   # (pickled as JAX's own, which it equals)
      return mesh.AbstractDevice, (self.device_kind, None, self.platform)

  def abstract_device_from(d):
    a = jax_from(d)
    if a is None or type(a) is not mesh.AbstractDevice or a.platform != "cpu" or a.num_cores is not None:
      return a
    cpu = object.__new__(CpuAbstractDevice)
    object.__setattr__(cpu, "device_kind", a.device_kind)
    object.__setattr__(cpu, "platform", a.platform)
    return cpu
  abstract_device_from._palace = True
  abstract_device_from.__wrapped__ = jax_from
  mesh.abstract_device_from = abstract_device_from
