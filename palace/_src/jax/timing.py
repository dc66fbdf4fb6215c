"""`palace.jax.device_time(fn, *args)`: the modelled device time of one call of a JAX function."""
from __future__ import annotations

import dataclasses

from palace._src.jax.activation import active_engine, virtual_tpu


@dataclasses.dataclass(frozen=True)
class DeviceTime:
  """Modelled time of the kernels one call launched: the sum over launches, and each launch's report.

  `device_time_s` counts the kernels on the chip; `total_time_s` adds each launch's host dispatch
  overhead, comparable to a `timeit` of a jitted call that only runs those kernels. The JAX (XLA)
  work between kernels is not modelled."""
  reports: tuple

  @property
  def device_cycles(self) -> int:
    return sum(r.device_cycles for r in self.reports)

  @property
  def device_time_s(self) -> float:
    return sum(r.device_time_s for r in self.reports)

  @property
  def total_time_s(self) -> float:
    return sum(r.total_time_s for r in self.reports)

  @property
  def launches(self) -> int:
    return len(self.reports)


def device_time(fn, *args, chip="v5e", **kwargs) -> DeviceTime:
  """Run `fn(*args, **kwargs)` once (blocking) and return the modelled time of its TPU kernels.

  Inside an active `palace.jax.virtual_tpu` (or PALACE_JAX) it runs there; otherwise on a fresh
  `virtual_tpu(chip)`."""
  import jax  # noqa: PLC0415
  engine = active_engine()
  if engine is not None:
    start = len(engine.tpu.reports)
    jax.block_until_ready(fn(*args, **kwargs))
    return DeviceTime(tuple(engine.tpu.reports[start:]))
  with virtual_tpu(chip) as tpu:
    jax.block_until_ready(fn(*args, **kwargs))
  return DeviceTime(tuple(tpu.reports))
