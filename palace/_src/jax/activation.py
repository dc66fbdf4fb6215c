"""Activation: how real JAX's TPU `pallas_call`s reach palace (one host callback per launch).

The hook, and why it is safe with jit's compilation cache:

* JAX's `pallas_call` reads `config.pallas_tpu_interpret_mode_context_manager` when it is traced and
  stores the value as the `interpret` parameter of the `pallas_call` primitive. That config option is
  part of jit's cache key and trace context. `virtual_tpu(...)` sets it to an `Engine` (a palace
  VirtualTPU plus options), exactly as `pltpu.force_tpu_interpret_mode` sets it to InterpretParams. A
  function traced inside the context therefore carries *this* engine in its jaxpr, and a function
  compiled outside (or under another engine) is a different cache entry: no stale lowering either way.
  Each `with` builds a new Engine, so entering the context again re-traces (one compile per context).
* palace registers a CPU-specific lowering for `pallas_call_p` (a registry entry, installed once when
  `palace.jax` is imported). It lowers a `pallas_call` whose `interpret` is an Engine to ONE
  `jax.pure_callback` that runs the whole launch on palace; every other `pallas_call` (no engine, GPU
  interpret params, JAX's own TPU interpret mode) is passed to JAX's own rule unchanged.
* The callback may run on an XLA thread, where no VirtualTPU is active: the launch runs on the
  engine's, handed down to palace's `run` (launch/run.py).

Process-wide switch: `PALACE_JAX=v5e` (optionally `PALACE_JAX=v5e:4` for 4 chips) makes importing
`palace.jax` install a global engine (`python -m palace._src.jax.run prog.py` and
`pytest -p palace.jax` import it for unmodified programs and test suites). Beside it,
`PALACE_JAX_EXACT_F32_DOTS=1` is a diagnostic that makes that engine compute NOT what the chip computes:
float32 dots at the default precision unrounded, as XLA:CPU does (VirtualTPU(exact_f32_dots=True); its
reports and the pytest header say so). benchmarks/jax_suite.py re-runs numeric failures under it to
tell a test whose reference ran exactly on the CPU from a kernel palace computes wrong.
`PALACE_JAX_SHARED_DOTS=1`, another diagnostic that is not the chip, sums every float dot by one rule
on both sides of a comparison: in palace's kernels and in XLA:CPU's code outside them (shared_dots.py;
VirtualTPU(shared_dots=True)). The runner re-runs what the first diagnostic leaves failing under it,
to tell a summation-order difference (which on the chip both sides share) from a wrong kernel.
`PALACE_JAX_HOST_MATH=1`, a third diagnostic that is not the chip (combinable with either), evaluates the
kernels' transcendentals (exp, log, tanh, erf_inv, ...) by XLA:CPU, as the test's reference outside them
is (lang/host_math.py; VirtualTPU(host_math=True)); the runner re-runs what the dot diagnostics leave
failing under it and the shared dots, to tell XLA:CPU's functions (on a TPU the kernel and its reference
share the chip's) from a wrong kernel.
`PALACE_JAX_DOT_NUMERICS=mxu` is no diagnostic: it sums the kernels' float dots in the chip's measured
order (VirtualTPU(dot_numerics="mxu"), lang/mxu.chip_product) instead of the host BLAS's.
"""
from __future__ import annotations

import contextlib
import os
import threading

from palace._src.errors import UsageError
from palace._src.jax import pinned
from palace._src.jax.callback import drain_at_exit, lower_on_palace, wait_for_dispatched
from palace._src.jax.hardware import install_tpu_info
from palace._src.launch.host import VirtualTPU

_installed: list = []  # the lowering registration happens once per process (a registry, not state)


class Engine:
  """What a traced `pallas_call` carries as its `interpret` parameter: the virtual TPU to run on.

  Hashes by identity (jit keys on it); truthy, as JAX's `value or interpret` expects."""

  def __init__(self, tpu: VirtualTPU):
    self.tpu = tpu
    self.errors: list = []  # exceptions raised inside callbacks, which XLA re-raises wrapped
    self.lock = threading.Lock()  # one launch at a time (shard_map's devices call back concurrently)

  def __bool__(self):
    return True

  def __hash__(self):
    return id(self)

  def __eq__(self, other):
    return self is other

  def __repr__(self):
    return f"palace.jax.Engine({self.tpu!r})"

  @contextlib.contextmanager
  def timing_only(self):
    """Scoped: the launches run while it is open are timed but not computed (the VirtualTPU's
    timing_only: the same modelled cycles, outputs of undefined contents). palace.jax.device_time
    opens it around a call whose results it discards; timing.py decides when that is sound."""
    with self.lock:   # never flipped under a launch that is running
      prev, self.tpu.timing_only = self.tpu.timing_only, True
    try:
      yield
    finally:
      with self.lock:
        self.tpu.timing_only = prev


def _config():
  from jax._src import config  # noqa: PLC0415
  return config.pallas_tpu_interpret_mode_context_manager


def install() -> None:
  """Register palace's CPU lowering of `pallas_call_p` and `mpmd_map_p`, and of the pinned buffers a
  `pallas_call` may alias (pinned.py) (idempotent)."""
  if _installed:
    return
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax._src.pallas import pallas_call as jpc  # noqa: PLC0415
  # JAX's own (platform-independent) rules, as registered: every launch without an engine goes there
  jax_rule = mlir._lowerings[jpc.pallas_call_p].rule

  def rule(ctx, *in_nodes, interpret, **params):
    engine = interpret if isinstance(interpret, Engine) else _engine_for(interpret)
    if engine is not None:
      return lower_on_palace(ctx, in_nodes, engine, params)
    return jax_rule(ctx, *in_nodes, interpret=interpret, **params)

  from jax._src.pallas import mpmd  # noqa: PLC0415
  jax_mpmd_rule = mlir._lowerings[mpmd.mpmd_map_p].rule

  def mpmd_rule(ctx, *in_nodes, interpret, **params):
    # pl.kernel / core_map: JAX's CPU fallback would call its pallas_call rule directly (and run
    # JAX's HLO interpreter on an Engine), so the mesh launch is intercepted here
    engine = interpret if isinstance(interpret, Engine) else _engine_for(interpret)
    if engine is not None:
      return lower_on_palace(ctx, in_nodes, engine, params, kind="mpmd_map")
    return jax_mpmd_rule(ctx, *in_nodes, interpret=interpret, **params)

  mlir.register_lowering(jpc.pallas_call_p, rule, platform="cpu")
  mlir.register_lowering(mpmd.mpmd_map_p, mpmd_rule, platform="cpu")
  pinned.install(active_engine)   # JAX's pin / unpin around a kernel: the value itself
  install_tpu_info(active_engine)
  import atexit  # noqa: PLC0415
  atexit.register(drain_at_exit)   # after JAX's own exit handlers were registered: it runs first
  _installed.append(rule)


def _engine_for(interpret):
  """A `pallas_call` built *outside* the context (`f = pl.pallas_call(...)` at module level reads the
  config when it is built) but lowered inside it: it runs on the active engine too, if it is a TPU
  kernel (no interpret mode, or JAX's TPU InterpretParams). Sound with jit's cache, because the config
  is part of the key of the jit (and of the eager pallas_call's own jit) being lowered."""
  engine = active_engine()
  if engine is None:
    return None
  if not interpret:
    return engine
  from jax._src.pallas.mosaic.interpret.params import InterpretParams  # noqa: PLC0415
  return engine if isinstance(interpret, InterpretParams) else None


@contextlib.contextmanager
def virtual_tpu(chip="v5e", num_chips: int = 1, **options):
  """`with palace.jax.virtual_tpu("v5e") as tpu:` runs every TPU `pallas_call` traced inside on palace.

  Takes the options of `pl.virtual_tpu` (timing_only, detect_races, dma_policy, seed, ...). `tpu` is
  that VirtualTPU: `tpu.reports` gets one report per launch, named after the kernel. Functions jitted
  outside the context are re-traced inside it (and vice versa); see the module docstring."""
  install()
  tpu = VirtualTPU(chip, num_chips, **options)
  _install_shared_dots(tpu)
  engine = Engine(tpu)
  cfg = _config()
  prev = cfg.swap_local(engine)
  try:
    with tpu:
      yield tpu
      wait_for_dispatched()
      tpu.carried.check_settled()   # a semaphore result never waited (sim/carried.py)
  except Exception as e:
    # XLA wraps an exception raised in the callback in a JaxRuntimeError: raise palace's own error
    if engine.errors and not isinstance(e, type(engine.errors[-1])):
      raise engine.errors[-1] from e
    raise
  finally:
    cfg.set_local(prev)


def activate_from_env(environ=None):
  """PALACE_JAX=<chip>[:<num_chips>]: install a process-wide engine; returns its VirtualTPU or None.
  PALACE_JAX_EXACT_F32_DOTS=1 gives that engine the exact-f32-dots diagnostic (module docstring),
  PALACE_JAX_SHARED_DOTS=1 the shared-dots one, PALACE_JAX_HOST_MATH=1 the host-math one;
  PALACE_JAX_DOT_NUMERICS=mxu|blas its VirtualTPU's `dot_numerics` (the chip's summation order, or
  the host BLAS's: lang/mxu.follows_chip)."""
  environ = os.environ if environ is None else environ
  spec = environ.get("PALACE_JAX", "").strip()
  if not spec or spec == "0":
    return None
  exact = environ.get("PALACE_JAX_EXACT_F32_DOTS", "").strip()
  if exact not in ("", "0", "1"):
    raise UsageError(f"PALACE_JAX_EXACT_F32_DOTS={exact!r}: expected 1 (the diagnostic on: float32 dots "
                     f"at the default precision computed exactly, not as the chip computes them) or 0 "
                     f"(off, the chip's rounding). Fix: set it to 1 or 0, or unset it.")
  shared = environ.get("PALACE_JAX_SHARED_DOTS", "").strip()
  if shared not in ("", "0", "1"):
    raise UsageError(f"PALACE_JAX_SHARED_DOTS={shared!r}: expected 1 (the diagnostic on: float dots in "
                     f"kernels and in XLA:CPU's code outside them summed by one rule, not in the chip's "
                     f"order) or 0 (off). Fix: set it to 1 or 0, or unset it.")
  host_math = environ.get("PALACE_JAX_HOST_MATH", "").strip()
  if host_math not in ("", "0", "1"):
    raise UsageError(f"PALACE_JAX_HOST_MATH={host_math!r}: expected 1 (the diagnostic on: the kernels' "
                     f"transcendentals computed as XLA:CPU computes them, not as the chip does) or 0 "
                     f"(off). Fix: set it to 1 or 0, or unset it.")
  numerics = environ.get("PALACE_JAX_DOT_NUMERICS", "").strip() or "blas"
  if numerics not in ("blas", "mxu"):
    raise UsageError(f"PALACE_JAX_DOT_NUMERICS={numerics!r}: expected mxu (float dots in kernels summed "
                     f"in the order the chip's MXU sums them, about ten times the host CPU) or blas (the "
                     f"host BLAS's order, the default). Fix: set it to mxu or blas, or unset it.")
  chip, _, n = spec.partition(":")
  try:
    num_chips = int(n) if n else 1
  except ValueError:
    raise UsageError(f"PALACE_JAX={spec!r}: expected <chip>[:<num_chips>]. Fix: set it to a chip "
                     f"name and an optional integer chip count, e.g. 'v5e' or 'v5p:4'.") from None
  if exact == "1":
    import sys  # noqa: PLC0415
    print("palace.jax: DIAGNOSTIC PALACE_JAX_EXACT_F32_DOTS=1: float32 dots at the default precision are "
          "computed exactly, NOT as the chip computes them (it rounds their operands to bfloat16)",
          file=sys.stderr)
  if shared == "1":
    import sys  # noqa: PLC0415
    print("palace.jax: DIAGNOSTIC PALACE_JAX_SHARED_DOTS=1: float dots in kernels and in XLA:CPU's code "
          "outside them are summed by one rule (exact per 128 of K, chunks added in float32), NOT in "
          "the chip's order", file=sys.stderr)
  if host_math == "1":
    import sys  # noqa: PLC0415
    print("palace.jax: DIAGNOSTIC PALACE_JAX_HOST_MATH=1: the kernels' transcendentals (exp, log, tanh, "
          "erf_inv, ...) are computed as XLA:CPU computes them, NOT as the chip does", file=sys.stderr)
  return activate_global(chip, num_chips, exact_f32_dots=exact == "1", shared_dots=shared == "1",
                         host_math=host_math == "1", dot_numerics=numerics)


def activate_global(chip="v5e", num_chips: int = 1, **options):
  """Install a process-wide engine on a new VirtualTPU(chip, num_chips, **options); returns it."""
  install()
  tpu = VirtualTPU(chip, num_chips, **options)
  _install_shared_dots(tpu)
  _config().set_global(Engine(tpu))
  return tpu


def _install_shared_dots(tpu) -> None:
  """The shared-dots diagnostic's lowering of XLA:CPU's dots (shared_dots.py), registered the first
  time an engine has it on (it defers to JAX's own lowering while the active engine has it off)."""
  if tpu.shared_dots:
    from palace._src.jax import shared_dots  # noqa: PLC0415
    shared_dots.install(active_engine)


def active_engine():
  """The Engine in effect here (context or process-wide), or None."""
  v = _config().value
  return v if isinstance(v, Engine) else None
