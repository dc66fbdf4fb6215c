"""`palace.jax.device_time(fn, *args)`: the modelled device time of one call of a JAX function.

A timed call's results are discarded, so by default it runs on a timing-only machine (no block math,
no payloads; the same modelled cycles as with data, `Engine.timing_only`): a timing cell at 8192^3
costs seconds, not minutes. Unless something of the call outlives it, which then has to be right;
the call is traced first (`jax.make_jaxpr`, as `jax.jit` would) and runs WITH data when
(`needs_data` gives the reason):

* its jaxpr has effects: writes to JAX mutable refs (`jax.new_ref`) a kernel or the function updates
  in place, `io_callback`s and debug prints (which would see undefined values), ordered effects;
* it donates buffers (`donate_argnums`: the donated inputs are consumed, the outputs are the call's
  only result, and a caller may keep them through the aliasing);
* a later launch of the call could take its control flow or its DMA addresses from an earlier
  launch's output (a scalar-prefetch, dynamic-grid or SMEM operand, or any `pl.kernel` / `core_map`,
  after another launch or inside a loop): those values are undefined on a timing-only machine, and
  so would be the modelled time;
* a kernel prints (`pl.debug_print`, `jax.debug.print`): it would print undefined values;
* it cannot be traced (not a JAX function of its closure).

Within one launch, timing-only control flow sees SMEM data (scalar prefetch moves) but reads vector
data as zeros: a kernel that branches on vector values (`lax.cond` on a VMEM load) is timed on that
path. `device_time(..., timing_only=False)` always runs with data.
"""
from __future__ import annotations

import contextlib
import dataclasses

from palace._src.core import MemorySpace
from palace._src.errors import UsageError
from palace._src.jax.activation import active_engine, virtual_tpu
from palace._src.jax.callback import wait_for_dispatched
from palace._src.jax.registry import sub_jaxprs
from palace._src.jax.avals import memory_space

_LAUNCHES = ("pallas_call", "mpmd_map")
_PRINTS = ("debug_print", "debug_callback")
NO_KERNEL = "it launches no kernel"


@dataclasses.dataclass(frozen=True)
class DeviceTime:
  """Modelled time of the kernels one call launched: the sum over launches, and each launch's report.

  `device_time_s` counts the kernels on the chip; `total_time_s` adds each launch's host dispatch
  overhead, comparable to a `timeit` of a jitted call that only runs those kernels. The JAX (XLA)
  work between kernels is not modelled. `with_data` says whether the call ran with data (see the
  module docstring: `needs_data`)."""
  reports: tuple
  with_data: bool = True

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


def _launches(jaxpr, repeated: bool, out: list) -> list:
  """(eqn, inside a loop) for every kernel launch of `jaxpr` and its sub-jaxprs, in program order."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in _LAUNCHES:
      out.append((eqn, repeated))
      continue
    loop = repeated or eqn.primitive.name in ("while", "scan")
    for sub in sub_jaxprs(eqn):
      _launches(sub, loop, out)
  return out


def _scalar_operands(eqn) -> bool:
  """Whether a launch's control flow or DMA addresses may come from its operands' values."""
  if eqn.primitive.name != "pallas_call":
    return True   # pl.kernel / core_map: any operand may be copied into SMEM and steer the kernel
  gm = eqn.params["grid_mapping"]
  if gm.num_index_operands or gm.num_dynamic_grid_bounds:
    return True
  return any(memory_space(getattr(bm.transformed_block_aval, "memory_space", None), None,
                          bm.origin) is MemorySpace.SMEM for bm in gm.block_mappings)


def _prints(jaxpr) -> bool:
  """Whether a kernel jaxpr prints (pl.debug_print, jax.debug.print): it would print undefined values."""
  return any(eqn.primitive.name in _PRINTS or any(_prints(s) for s in sub_jaxprs(eqn))
             for eqn in jaxpr.eqns)


def _donates(jaxpr) -> bool:
  return any(any(eqn.params.get("donated_invars", ())) or any(_donates(s) for s in sub_jaxprs(eqn))
             for eqn in jaxpr.eqns)


def needs_data(fn, *args, **kwargs) -> str | None:
  """Why `fn(*args, **kwargs)` must run with data to leave nothing wrong behind, or None (it
  launches kernels and only its discarded result would hold undefined values)."""
  import jax  # noqa: PLC0415
  try:
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
  except Exception as e:  # noqa: BLE001  any failure to trace: run it as it is
    return f"it could not be traced ({type(e).__name__})"
  jaxpr = closed.jaxpr
  if closed.effects:
    return "it has effects (" + ", ".join(sorted(type(e).__name__ for e in closed.effects)) + ")"
  if _donates(jaxpr):
    return "it donates buffers"
  launches = _launches(jaxpr, False, [])
  if not launches:
    return NO_KERNEL
  if any(_prints(eqn_jaxpr) for eqn, _ in launches for eqn_jaxpr in sub_jaxprs(eqn)):
    return "a kernel prints (debug_print)"
  if any(_scalar_operands(eqn) and (repeated or k) for k, (eqn, repeated) in enumerate(launches)):
    return "a later launch may take its control flow from an earlier launch's output"
  return None


def device_time(fn, *args, chip="v5e", timing_only=None, **kwargs) -> DeviceTime:
  """Run `fn(*args, **kwargs)` once (blocking) and return the modelled time of its TPU kernels.

  Inside an active `palace.jax.virtual_tpu` (or PALACE_JAX) it runs there; otherwise on a fresh
  `virtual_tpu(chip)`. `timing_only=None` (default): without data unless something of the call
  outlives it (module docstring); True / False force either (True on a call `needs_data` refuses
  raises UsageError)."""
  reason = None if timing_only is False else needs_data(fn, *args, **kwargs)
  if timing_only is True and reason is not None:
    raise UsageError(f"palace.jax.device_time(timing_only=True): the call must run with data, "
                     f"because {reason}. Fix: pass timing_only=None (decides) or False.")
  return run_timed(fn, args, kwargs, chip, without_data=timing_only is not False and reason is None)


def run_timed(fn, args, kwargs, chip, without_data: bool) -> DeviceTime:
  """`device_time` once the data question is answered (`needs_data`)."""
  import jax  # noqa: PLC0415
  engine = active_engine()
  with contextlib.ExitStack() as stack:
    if engine is None:
      stack.enter_context(virtual_tpu(chip))
      engine = active_engine()
    start = len(engine.tpu.reports)
    if without_data and not engine.tpu.timing_only:
      wait_for_dispatched()
      stack.enter_context(engine.timing_only())
    jax.block_until_ready(fn(*args, **kwargs))
    if without_data:
      wait_for_dispatched()
    reports = tuple(engine.tpu.reports[start:])
  return DeviceTime(reports, with_data=not (without_data or engine.tpu.timing_only))
