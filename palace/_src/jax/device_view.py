"""What a program's own code sees of its devices when palace.jax runs it process-wide (L5).

Real kernel libraries and test suites look at the device before they launch anything: its kind
(`jax.devices()[0].device_kind`, parsed for the TPU generation), its place in the pod (`Device.coords`,
`core_on_chip`), its platform (`d.platform == "tpu"`, `jax.devices("tpu")`, `jax.default_backend()`).
On the host CPU devices palace.jax runs on they answer "cpu" and refuse ("Unsupported tpu_version=-1"),
although every kernel they would launch runs on the virtual chip. `install(tpu)` makes these queries
answer as the virtual chip would, **for callers outside JAX and palace** (the program, its libraries,
JAX's test utilities `jax._src.test_util`): JAX's own internals keep seeing the CPU devices they really
run on, so what XLA compiles and runs is unchanged, and no kernel or result is touched.

Installed by the process-wide activations (PALACE_JAX, `palace.jax.activate`); not by the
`with virtual_tpu(...)` context, whose scope is a block of code, not the process. `uninstall()` undoes it.
"""
from __future__ import annotations

import sys

# palace chip name -> the device_kind string a JAX TPU device of that generation reports
DEVICE_KINDS = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite",
                "7x": "TPU7x"}

_INSIDE = ("jax", "jaxlib", "palace")   # packages (a module named `jax_triton` or `jaxtyping` is outside)
_INSIDE_PREFIXES = tuple(p + "." for p in _INSIDE)
# JAX modules that ask on the program's behalf: a test suite's device selection helpers, and the TPU
# hardware queries behind pltpu.get_tpu_info / is_tpu_device (JAX's own table of the chip)
_OUTSIDE_OF_JAX = ("jax._src.test_util", "jax.test_util", "jax._src.tpu_info")
_state: dict = {}   # what install() replaced (the process-wide activation holds one view at a time)


def _outside(depth: int = 2) -> bool:
  """Is the code `depth` frames up (the reader of a device attribute) the program's own?"""
  name = sys._getframe(depth).f_globals.get("__name__", "") or ""
  if name.startswith(_OUTSIDE_OF_JAX):
    return True
  return not (name in _INSIDE or name.startswith(_INSIDE_PREFIXES))


def _view(attr: str, virtual, original):
  """A property answering `virtual(device)` to outside readers, the original attribute (or
  AttributeError, where the CPU device has none) to JAX and palace."""
  def get(self):
    if _outside(2):
      return virtual(self)
    if original is None:
      raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")
    return original.__get__(self)
  return property(get)


def _wrap_devices(fn, tpu_devices, backend_at: int):
  """`fn` (jax.devices, whose `backend` is its argument 0, or jax.local_devices, whose is argument 1
  after `process_index`) answering "tpu" with `tpu_devices()` to outside readers; every call passed
  on unchanged otherwise."""
  def devices(*args, **kwargs):
    backend = kwargs.get("backend", args[backend_at] if len(args) > backend_at else None)
    if backend == "tpu" and _outside(2):
      return tpu_devices()
    return fn(*args, **kwargs)
  devices.__wrapped__ = fn
  return devices


def install(tpu) -> None:
  """Show the process's (CPU) devices as `tpu`'s chips to code outside JAX and palace."""
  import jax  # noqa: PLC0415
  uninstall()
  kind = DEVICE_KINDS.get(tpu.chip.name, f"TPU {tpu.chip.name}")
  n = tpu.num_chips
  dev_type = type(jax.devices()[0])
  saved = {a: dev_type.__dict__.get(a) for a in ("device_kind", "platform", "coords", "core_on_chip")}
  _state["type"], _state["attrs"] = dev_type, saved
  dev_type.device_kind = _view("device_kind", lambda d: kind, saved["device_kind"])
  dev_type.platform = _view("platform", lambda d: "tpu", saved["platform"])
  dev_type.coords = _view("coords", lambda d: tpu.chip_coords(d.id % n), saved["coords"])
  dev_type.core_on_chip = _view("core_on_chip", lambda d: 0, saved["core_on_chip"])
  _state["jax"] = {a: getattr(jax, a) for a in ("devices", "local_devices", "default_backend")}
  jax.devices = _wrap_devices(_state["jax"]["devices"], lambda: _state["jax"]["devices"]("cpu"), 0)
  jax.local_devices = _wrap_devices(_state["jax"]["local_devices"],
                                    lambda: _state["jax"]["local_devices"](backend="cpu"), 1)
  real_backend = _state["jax"]["default_backend"]
  jax.default_backend = lambda: "tpu" if _outside(2) else real_backend()


def uninstall() -> None:
  """Undo `install` (a no-op when nothing is installed)."""
  if "type" not in _state:
    return
  import jax  # noqa: PLC0415
  dev_type = _state.pop("type")
  for attr, original in _state.pop("attrs").items():
    if original is None:
      delattr(dev_type, attr)
    else:
      setattr(dev_type, attr, original)
  for attr, fn in _state.pop("jax").items():
    setattr(jax, attr, fn)
