"""palace as JAX's Pallas engine vs JAX's own TPU interpret mode, in one run (issue 17, acceptance 4).

Needs JAX (`.venv-jax`): `PYTHONPATH=$PWD .venv-jax/bin/python -m benchmarks.jax_engine [--quick]
[--only=NAME] [--floor] [--fixed] [--calls] [--gc] [--jax-dma=on_wait]` (`--only=basic:add` runs the kernels
whose name contains that text; `--fixed` only issue 35's fixed set, `FIXED`, which `python -m benchmarks`
runs; `--calls` counts instead the Python calls of one launch of each of them through palace's own API,
`own_calls`; `--gc` the full cyclic collections their reports cause over 1000 launches, `own_gc`);
`--floor` prints instead, per parity kernel, the time left when palace's launch costs nothing:
`floor_table`; JAX's side runs its DMAs eagerly, as palace's default does, unless `--jax-dma=on_wait`,
JAX's default: `JAX_DMA_MODE`).
Every parity kernel (tests/jax_parity/kernels, the multi-chip ones on 4 host devices) runs inside
`jax.jit` through `palace.jax.virtual_tpu` and through `pltpu.force_tpu_interpret_mode`; each side is
timed best-of-N on a warm cache (the jit compile is excluded on both sides; N >= 5, more until 0.25 s
of calls, at most 50: `_best`; a kernel whose schedule is data-independent is then replayed after its
first call, sim/replay.py, on the launch kept from the one before, launch/run.py `_Warm`, and a last
column times palace.jax with `replay=False`, every launch on the full machine). Prints per-kernel wall times, the ratio and its geomean, and the
per-launch overhead of palace's host callback (a trivial kernel through palace.jax vs the same kernel
through palace's own `pl.pallas_call`), split into the time inside palace.jax's host callback, palace's
launch on a ready plan in a loop of its own, and a jitted call of palace.jax's host callback doing
nothing (XLA's dispatch and callback alone; `jax.pure_callback`'s, which also device_puts its
operands, for comparison).
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4").strip()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "jax_parity"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.pallas import tpu as jpltpu  # noqa: E402

import jax_parity_harness as harness  # noqa: E402
import palace as pl  # noqa: E402
import palace.jax as pj  # noqa: E402
from palace._src.launch.run import run as run_plan  # noqa: E402

SKIP: set = set()        # parity files / cases left out (none: the multi-chip ones run as pod launches)
SKIP_CASES: set = set()


MIN_SECONDS = 0.25   # each side of a kernel is timed at least `reps` times and until this long
MAX_REPS = 50


def _best(fn, reps: int) -> float:
  """Best wall time of at least `reps` calls, more (up to MAX_REPS) until MIN_SECONDS have passed: on
  this shared VM a best-of-5 of a sub-millisecond launch still moved by 30% between runs; both sides of
  a ratio get the same rule (timeit's autorange idea)."""
  best, spent, n = math.inf, 0.0, 0
  while n < reps or (spent < MIN_SECONDS and n < MAX_REPS):
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    best, spent, n = min(best, dt), spent + dt, n + 1
  return best


# JAX interpret mode's DMA execution mode for the baseline: "eager" (a copy's data moves when it is
# started), palace's own default DMA policy (pl.virtual_tpu(dma_policy="eager")), so both sides do the
# same work; `--jax-dma=on_wait` times JAX's default instead (data moved at the wait), for reference
JAX_DMA_MODE = ["eager"]


def _jax_interpret_ctx(mod):
  st = contextlib.ExitStack()
  jpltpu.reset_tpu_interpret_mode_state()
  st.enter_context(jpltpu.force_tpu_interpret_mode(
      jpltpu.InterpretParams(dma_execution_mode=JAX_DMA_MODE[0])))
  if mod is not None and getattr(mod, "ABSTRACT_MESH", False):
    dev = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    st.enter_context(jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=dev)))
  return st


def _jitted(fn, args):
  """jax.jit(fn) if it traces (some cases end in NumPy on the host: then fn itself, on both sides)."""
  f = jax.jit(fn)
  try:
    jax.block_until_ready(f(*args))
    return f
  except jax.errors.TracerArrayConversionError:
    jax.block_until_ready(fn(*args))
    return fn


def _time_palace_jax(mod, build, reps, replay: bool) -> float:
  """palace.jax's best call of `build(mod)`; `replay=False`: every launch on the full machine, what a
  first launch costs (sim/replay.py)."""
  with pj.virtual_tpu("v5e", num_chips=getattr(mod, "NUM_DEVICES", 1), replay=replay):
    fn, args = build(mod)
    f = _jitted(fn, args)
    return _best(lambda: jax.block_until_ready(f(*args)), reps)


def time_case(fname, case, reps):
  return time_build(fname, lambda mod: getattr(mod, case)()[:2], reps)


def time_build(fname, build, reps):
  """(palace.jax, JAX interpret mode, palace's own path, palace.jax with replay=False) wall times of
  `build(module) -> (fn, args)`, built from the parity file `fname` loaded for real JAX and through
  palace.compat. palace.jax's best call is a replayed one wherever the kernel's schedule is
  data-independent (sim/replay.py; the same best-of rule on every side); the last column runs every
  launch on the full machine."""
  mod = harness.jax_module(fname)
  t_palace, t_full = (_time_palace_jax(mod, build, reps, replay) for replay in (True, False))
  with _jax_interpret_ctx(mod):
    fn, args = build(mod)
    g = _jitted(fn, args)
    t_jax = _best(lambda: jax.block_until_ready(g(*args)), reps)
  own = harness.palace_module(fname)
  with pl.virtual_tpu("v5e", num_chips=getattr(own, "NUM_DEVICES", 1)):
    fn, args = build(own)
    fn(*args)
    t_own = _best(lambda: fn(*args), reps)
  return t_palace, t_jax, t_own, t_full


# The same kernels at realistic sizes (more grid steps, so per-step costs dominate rather than the
# fixed cost of a launch): the parity files' own kernel builders and the wheel's public functions.
def _large_tiled_matmul(mod):   # k_basic's tiled matmul (matmul_f32_exact's kernel): 512^3, 64 steps
  x, y = mod._ints((512, 512), 3), mod._ints((512, 512), 4)
  return mod._matmul(x, y, 128, 128, 128, np.float32, np.float32), (x, y)


def _large_wheel_matmul(mod):   # the wheel's matmul: 512 x 1024 x 512, 128-blocks, 64 steps
  x, y = mod._ints((512, 1024), 50), mod._ints((1024, 512), 51)
  return (lambda a, b: mod.matmul.matmul(a, b, block_shape=(128, 128), block_k=256)), (x, y)


def _large_flash_attention(mod):   # the wheel's flash attention, causal, seq 1024: 128 grid steps
  q, k, v = (mod._normal(1, 2, 1024, 128, seed=s) for s in (54, 55, 56))
  return (lambda a, b, c: mod.flash_attention.flash_attention(a, b, c, causal=True, sm_scale=0.125)), \
      (q, k, v)


def _large_gmm(mod):   # megablox gmm: 2048 x 512 lhs over 4 groups of 512 x 512
  lhs, rhs = mod._ints((2048, 512), 60), mod._ints((4, 512, 512), 61)
  sizes = np.array([512, 768, 256, 512], np.int32)
  return (lambda a, b, c: mod.megablox.gmm(a, b, c, np.float32, (128, 128, 128))), (lhs, rhs, sizes)


def _case(name):
  return lambda mod: getattr(mod, name)()[:2]


def _bf16_tiled_matmul(block, size=1024):
  """k_basic's tiled matmul (f32 accumulator scratch, K innermost) on bf16 operands, size^3."""
  def build(mod):
    x = mod._ints((size, size), 70).astype(jax.numpy.bfloat16)
    y = mod._ints((size, size), 71).astype(jax.numpy.bfloat16)
    return mod._matmul(x, y, block, block, block, np.float32, np.float32), (x, y)
  return build


# Issue 35's fixed set: tiled matmuls at 128/256/512 blocks, elementwise, softmax, manual DMA, flash
# attention, paged attention; each through palace.jax and through palace's own API (`--fixed`).
FIXED = [("fixed:bf16_matmul_1024_blocks_128", "k_basic.py", _bf16_tiled_matmul(128)),
         ("fixed:bf16_matmul_1024_blocks_256", "k_basic.py", _bf16_tiled_matmul(256)),
         ("fixed:bf16_matmul_1024_blocks_512", "k_basic.py", _bf16_tiled_matmul(512)),
         ("fixed:elementwise_transcendental", "k_basic.py", _case("case_elementwise_transcendental")),
         ("fixed:softmax", "k_basic.py", _case("case_softmax")),
         ("fixed:manual_dma_double_buffer", "k_dma_remote.py", _case("case_dma_double_buffer")),
         ("fixed:flash_attention_causal_1024", "k_wheel.py", _large_flash_attention),
         ("fixed:paged_attention", "k_wheel.py", _case("case_wheel_paged_attention"))]


LARGE = [("large:tiled_matmul_512", "k_basic.py", _large_tiled_matmul),
         ("large:wheel_matmul_512x1024x512", "k_wheel.py", _large_wheel_matmul),
         ("large:wheel_flash_attention_causal_1024", "k_wheel.py", _large_flash_attention),
         ("large:wheel_megablox_gmm_2048", "k_wheel.py", _large_gmm)]


def callback_overhead(reps):
  """Fixed per-launch costs on a one-step copy kernel: through palace.jax, through palace's own
  `pl.pallas_call`, through JAX's interpret mode, and a jitted `x + 1` (jit dispatch alone)."""
  from jax.experimental import pallas as jpl
  x = np.ones((8, 128), np.float32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  def timed(fn):
    jax.block_until_ready(fn(x))
    return _best(lambda: jax.block_until_ready(fn(x)), reps)
  with pj.virtual_tpu("v5e"):
    t_jax_path = timed(jax.jit(jpl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))))
  with pl.virtual_tpu("v5e"):
    g = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))
    t_own = _best(lambda: g(x), reps)
    plan, arrays = g.plan(x)   # the launch alone, on a plan made once (what palace.jax runs per call)
    t_run = _best(lambda: run_plan(plan, arrays), reps)
  with _jax_interpret_ctx(None):
    t_interp = timed(jax.jit(jpl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))))
  t_jit = timed(jax.jit(lambda a: a + 1))
  sds = jax.ShapeDtypeStruct(x.shape, x.dtype)   # a host callback that does nothing: JAX's own floor
  t_cb = timed(jax.jit(lambda a: jax.pure_callback(np.asarray, sds, a)))
  t_emit = timed(jax.jit(_noop_palace_callback()))
  t_host = _time_in_host(jpl, kernel, x, reps)
  return t_jax_path, t_own, t_interp, t_jit, t_run, t_cb, t_emit, t_host


def _noop_palace_callback():
  """fn(a) -> a through the host callback palace.jax emits (`callback._emit_callback`: XLA's buffer
  callback, operands viewed or copied as palace.jax's are), doing nothing else on the host."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax.extend.core import Primitive  # noqa: PLC0415

  from palace._src.jax import callback as palace_callback  # noqa: PLC0415
  prim = Primitive("palace_benchmark_noop_callback")
  prim.def_abstract_eval(lambda a: jax_core.ShapedArray(a.shape, a.dtype))
  mlir.register_lowering(prim, lambda ctx, a: palace_callback._emit_callback(ctx, lambda v: [v], [a]))
  return prim.bind


def _time_in_host(jpl, kernel, x, reps) -> float:
  """Best time palace.jax spends inside its host callback per launch of the one-step kernel (the
  callback's host function timed around, in a fresh lowering)."""
  from palace._src.jax import callback as palace_callback  # noqa: PLC0415
  inside = []
  emit = palace_callback._emit_callback

  def timed_emit(ctx, host, in_nodes, **kw):
    def timed_host(*arrays, **out):
      t0 = time.perf_counter()
      try:
        return host(*arrays, **out)
      finally:
        inside.append(time.perf_counter() - t0)
    return emit(ctx, timed_host, in_nodes, **kw)
  palace_callback._emit_callback = timed_emit
  try:
    with pj.virtual_tpu("v5e"):
      f = jax.jit(jpl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)))
      jax.block_until_ready(f(x))
      _best(lambda: jax.block_until_ready(f(x)), reps)
  finally:
    palace_callback._emit_callback = emit
  return min(inside)


def own_calls(fname, build) -> int:
  """Python calls (sys.setprofile call events of the launching thread: BLAS helpers run as the OS
  schedules them) of the third launch of `build(module)` through palace's own API: deterministic for
  a Python version, so two trees compare exactly on a busy machine (`PYTHONPATH=<tree> python -m
  benchmarks.jax_engine --calls`)."""
  own = harness.palace_module(fname)
  calls = [0]

  def profile(frame, event, arg):
    if event == "call":
      calls[0] += 1
  with pl.virtual_tpu("v5e", num_chips=getattr(own, "NUM_DEVICES", 1)):
    fn, args = build(own)
    fn(*args)
    fn(*args)
    sys.setprofile(profile)
    try:
      fn(*args)
    finally:
      sys.setprofile(None)
  return calls[0]


def own_gc(fname, build, launches: int = 1000) -> tuple:
  """(full cyclic collections per 100 launches, growth of the collector's oldest generation per
  launch) over `launches` launches of `build(module)` through palace's own API in one virtual_tpu,
  after three launches and a full collection, the collector left to its thresholds as in a test
  process: what the reports a process keeps cost its collector (docs/host-speed.md, session 26)."""
  own = harness.palace_module(fname)
  with pl.virtual_tpu("v5e", num_chips=getattr(own, "NUM_DEVICES", 1)):
    fn, args = build(own)
    for _ in range(3):
      fn(*args)
    gc.collect()
    oldest, full = len(gc.get_objects(2)), gc.get_stats()[2]["collections"]
    for _ in range(launches):
      fn(*args)
    full = gc.get_stats()[2]["collections"] - full
    oldest = len(gc.get_objects(2)) - oldest
  return 100 * full / launches, oldest / launches


def _table(title, rows, show_rows=True, target="target >= 30x"):
  """Print one table (or only its summary); returns the geomean ratios over JAX interpret mode
  (palace.jax, palace's own path)."""
  if show_rows:
    print(f"{title:48s} {'palace.jax':>11s} {'JAX interp':>11s} {'ratio':>7s} {'palace own':>11s} "
          f"{'own ratio':>9s} {'no replay':>11s} {'ratio':>7s}")
  else:
    print(title)
  for name, tp, tj, to, tf in rows if show_rows else ():
    print(f"{name:48s} {tp * 1e3:9.2f}ms {tj * 1e3:9.2f}ms {tj / tp:6.1f}x {to * 1e3:9.2f}ms "
          f"{tj / to:8.1f}x {tf * 1e3:9.2f}ms {tj / tf:6.1f}x")
  geo = math.exp(sum(math.log(tj / tp) for _, tp, tj, _, _ in rows) / len(rows))
  own = math.exp(sum(math.log(tj / to) for _, _, tj, to, _ in rows) / len(rows))
  full = math.exp(sum(math.log(tj / tf) for _, _, tj, _, tf in rows) / len(rows))
  print(f"geomean speed-up over JAX's TPU interpret mode: palace.jax {geo:.1f}x, palace's own path "
        f"{own:.1f}x, palace.jax with replay=False {full:.1f}x over {len(rows)} kernels ({target})\n")
  return geo, own


def _zero_outputs(params, args, tpu=None, cache=None, out=None):
  """A stand-in for palace's launch (palace._src.jax.launch.run_*): the kernel's outputs, zeros (in
  `out`'s arrays where given, as palace computes them there)."""
  out = out or [None] * len(params["out_avals"])
  return [np.zeros(a.shape, a.dtype) if o is None else (o.fill(0) or o)
          for a, o in zip(params["out_avals"], out)]


def floor_table(reps, wanted) -> None:
  """`--floor`: what is left of each kernel's palace.jax time when palace's launch costs nothing. The
  same jitted program runs with palace's launch replaced by returning zero outputs (`_zero_outputs`:
  XLA's dispatch, operand transfers and host callback remain), so JAX interpret mode / floor is the
  ratio palace.jax could reach with a free engine, and the last line the ratio with the engine's share
  (palace.jax - floor) 1.3, 1.5, 1.7 and 2 times faster (docs/jax.md, "What 30x needs")."""
  from palace._src.jax import launch as jax_launch  # noqa: PLC0415
  rows = []
  print(f"{'kernel':48s} {'JAX interp':>11s} {'palace.jax':>11s} {'floor':>9s} {'ratio':>7s} {'ceiling':>8s}")
  for fname in sorted(p.name for p in harness.KERNELS.glob("k_*.py")):
    mod = harness.jax_module(fname)
    for case in harness.case_names(fname):
      name = f"{fname[2:-3]}:{case[5:]}"
      if not wanted(name):
        continue
      tp, tj, _, _ = time_case(fname, case, reps)   # (palace.jax as a user gets it: replayed where it can be)
      saved = jax_launch.run_pallas_call, jax_launch.run_mpmd_map
      jax_launch.run_pallas_call = jax_launch.run_mpmd_map = _zero_outputs
      try:
        with pj.virtual_tpu("v5e", num_chips=getattr(mod, "NUM_DEVICES", 1)):
          fn, args = getattr(mod, case)()[:2]
          f = _jitted(fn, args)
          tf = _best(lambda: jax.block_until_ready(f(*args)), reps)  # noqa: B023
      finally:
        jax_launch.run_pallas_call, jax_launch.run_mpmd_map = saved
      rows.append((tp, tj, tf))
      print(f"{name:48s} {tj * 1e3:9.2f}ms {tp * 1e3:9.2f}ms {tf * 1e3:7.2f}ms {tj / tp:6.1f}x "
            f"{tj / tf:7.1f}x")
  geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
  faster = ", ".join(f"{f}x {geo([tj / (tf + (tp - tf) / f) for tp, tj, tf in rows]):.1f}x"
                     for f in (1.3, 1.5, 1.7, 2))
  print(f"geomean over {len(rows)} kernels: palace.jax {geo([tj / tp for tp, tj, _ in rows]):.1f}x, with a "
        f"free engine (floor) {geo([tj / tf for _, tj, tf in rows]):.1f}x; with the engine (palace.jax - "
        f"floor) that many times faster: {faster}")


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  try:
    import threadpoolctl  # noqa: F401, PLC0415
  except ImportError:
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
      print("warning: threadpoolctl is not installed, so palace cannot run block-sized products on one "
            "BLAS thread; inside XLA's callback OpenBLAS then fights XLA's threads (up to 25x slower "
            "matmul kernels). pip install threadpoolctl, or set OPENBLAS_NUM_THREADS=1.")
  from benchmarks.matmul_vs_numpy import environment  # noqa: PLC0415
  print(environment())
  reps = 2 if "--quick" in argv else 5
  JAX_DMA_MODE[:] = [a.split("=", 1)[1] for a in argv if a.startswith("--jax-dma=")] or ["eager"]
  only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]   # substrings of kernel names
  wanted = lambda name: not only or any(o in name for o in only)  # noqa: E731
  if "--floor" in argv:
    floor_table(reps, wanted)
    return
  if "--calls" in argv:   # counted, not timed: issue 35's fixed set through palace's own API
    for name, fname, build in FIXED:
      if wanted(name):
        print(f"{name:48s} {own_calls(fname, build):9,d} Python calls per launch (palace's own API)")
    return
  if "--gc" in argv:   # counted: the cyclic GC's work left by the fixed set's reports
    for name, fname, build in FIXED:
      if wanted(name):
        per_100, oldest = own_gc(fname, build)
        print(f"{name:48s} {per_100:5.1f} full collections per 100 launches, {oldest:6.1f} objects a "
              f"launch in the oldest generation (palace's own API, 1000 launches)")
    return
  if "--fixed" in argv:   # issue 35's fixed set only, through both front ends
    _table("issue 35's fixed set (default BLAS threads unless the environment says otherwise)",
           [(name, *time_build(fname, build, reps)) for name, fname, build in FIXED if wanted(name)],
           target="issue 35's target >= 50x through both front ends")
    return
  rows = []
  for fname in sorted(p.name for p in harness.KERNELS.glob("k_*.py")):
    if fname in SKIP:
      continue
    for case in harness.case_names(fname):
      name = f"{fname[2:-3]}:{case[5:]}"
      if case in SKIP_CASES or not wanted(name):
        continue
      rows.append((name, *time_case(fname, case, reps)))
  large = [] if "--no-large" in argv else \
      [(name, *time_build(fname, build, reps)) for name, fname, build in LARGE if wanted(name)]
  if rows:
    _table("parity kernels (as in tests/jax_parity)", rows)
  if large:
    _table("the same kernels at realistic sizes", large)
  if rows and large:
    _table("all of the above", rows + large, show_rows=False)
  t_cb, t_own, t_interp, t_jit, t_run, t_floor, t_emit, t_host = callback_overhead(reps * 4)
  print(f"per launch (one-step copy kernel): palace.jax {t_cb * 1e6:.0f} us, palace's own "
        f"pl.pallas_call {t_own * 1e6:.0f} us (palace.jax's callback + interpreter overhead: "
        f"{(t_cb - t_own) * 1e6:.0f} us), JAX interpret mode {t_interp * 1e6:.0f} us; jax.jit dispatch "
        f"of x + 1: {t_jit * 1e6:.0f} us")
  print(f"  of which: inside palace.jax's host callback {t_host * 1e6:.0f} us (palace's launch on a ready "
        f"plan in a loop of its own, launch.run.run: {t_run * 1e6:.0f} us); a jitted call of palace.jax's "
        f"host callback doing nothing (XLA's dispatch and callback) {t_emit * 1e6:.0f} us (through "
        f"jax.pure_callback, which also device_puts its operands: {t_floor * 1e6:.0f} us); 1/30 of JAX "
        f"interpret mode's launch: {t_interp / 30 * 1e6:.0f} us")


if __name__ == "__main__":
  main()
