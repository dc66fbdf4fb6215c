"""`palace.jax.activate(chip)`: the one line that makes an unmodified JAX notebook or script run its TPU
kernels on palace, with modelled times where it measures time.

It installs a process-wide engine (as PALACE_JAX does) and, for the notebook's own code only, two host
shims:

* **Modelled timers.** `timeit.timeit` / `timeit.repeat` of a callable run it once, blocking, and return
  the modelled time of the kernels it launched (`DeviceTime.total_time_s`: device time plus each
  launch's dispatch overhead, what a `timeit` of a jitted call measures on a TPU) times `number`. The
  timed call's result is discarded, so it runs without data (`palace.jax.device_time`: timing-only,
  the same modelled cycles) unless something of it outlives the call (mutable refs, io callbacks,
  donation, kernels fed by earlier kernels' outputs: then with data; timing.py says why). A
  timed statement that launched no palace kernel (pure XLA work, e.g. `jnp.matmul`) raises
  UnsupportedError: palace models TPU kernels, not XLA's own ops, and a host CPU wall time would be
  a wrong answer to "how long on a TPU". String statements are still timed by the real timeit.
  IPython's `%timeit EXPR` (not Python) is translated by the tutorial converter into `timeit_line`.
* **Device view.** The devices answer as the virtual chip's to the notebook's own code and its libraries
  (`device_kind` "TPU v5 lite" for v5e, `platform` "tpu", `coords`, `core_on_chip`, `jax.devices("tpu")`,
  `jax.default_backend()`), so `assert "TPU" in jax.devices()[0].device_kind` holds and prints show the
  chip; JAX's internals (make_mesh's device order, lowering choices) still see the host "cpu" devices
  they run on (palace/_src/jax/device_view.py).
"""
from __future__ import annotations

import timeit as _timeit_module

from palace._src.errors import UnsupportedError
from palace._src.jax import device_view, timing
from palace._src.jax.activation import activate_global

_real = {"timeit": _timeit_module.timeit, "repeat": _timeit_module.repeat}
_state: dict = {}   # the shims installed by `activate` (one process-wide activation, like PALACE_JAX)


def _modelled_seconds(stmt) -> float:
  reason = timing.needs_data(stmt)
  t = None if reason == timing.NO_KERNEL else timing.run_timed(stmt, (), {}, "v5e", reason is None)
  if t is None or not t.launches:
    raise UnsupportedError(
        "palace.jax: timing a statement that launched no TPU kernel is not supported: palace models "
        "the time of Pallas kernels, not of XLA's own operations (the statement "
        + ("was traced, not run" if t is None else "ran, on the host CPU") + "). "
        "Fix: time a function that calls a pallas_call / pl.kernel, or read tpu.reports.")
  return t.total_time_s


def timeit(stmt="pass", setup="pass", timer=None, number=1000000, globals=None):
  """`timeit.timeit` with modelled TPU time for a callable `stmt` (run once, times `number`)."""
  if not callable(stmt):
    return _real["timeit"](stmt, setup, timer or _timeit_module.default_timer, number, globals)
  if callable(setup):
    setup()
  return _modelled_seconds(stmt) * number


def repeat(stmt="pass", setup="pass", timer=None, repeat=5, number=1000000, globals=None):
  """`timeit.repeat` with modelled TPU time: the model is deterministic, so every repeat is equal."""
  if not callable(stmt):
    return _real["repeat"](stmt, setup, timer or _timeit_module.default_timer, repeat, number, globals)
  t = timeit(stmt, setup, number=number)
  return [t] * repeat


def _fmt(seconds: float) -> str:
  for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
    if seconds >= scale:
      return f"{seconds / scale:.3g} {unit}"
  return f"{seconds / 1e-9:.3g} ns"


def timeit_line(fn) -> float:
  """What `%timeit EXPR` becomes: prints IPython's summary line with the modelled time of one call."""
  seconds = _modelled_seconds(fn)
  print(f"{_fmt(seconds)} per loop (modelled by palace, deterministic: one run)")
  return seconds


def activate(chip="v5e", num_chips: int = 1, *, modelled_timers: bool = True,
             device_kind: bool = True, **options):
  """Run every TPU kernel of this process on a virtual `chip` (options of `pl.virtual_tpu`).

  The process-wide counterpart of `with palace.jax.virtual_tpu(...)` for unmodified notebooks and
  scripts; see the module docstring for the timer and device-view shims. Returns the VirtualTPU
  (`.reports`: one report per launch). Calling it again replaces the previous activation."""
  tpu = activate_global(chip, num_chips, **options)
  if modelled_timers:
    _timeit_module.timeit, _timeit_module.repeat = timeit, repeat
  else:
    _timeit_module.timeit, _timeit_module.repeat = _real["timeit"], _real["repeat"]
  if device_kind:
    device_view.install(tpu)
  else:
    device_view.uninstall()
  _state["tpu"] = tpu
  return tpu
