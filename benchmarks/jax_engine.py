"""palace as JAX's Pallas engine vs JAX's own TPU interpret mode, in one run (issue 17, acceptance 4).

Needs JAX (`.venv-jax`): `PYTHONPATH=$PWD .venv-jax/bin/python -m benchmarks.jax_engine [--quick] [--only=NAME]`
(`--only=basic:add` runs the kernels whose name contains that text).
Every parity kernel (tests/jax_parity/kernels, the multi-chip ones on 4 host devices) runs inside `jax.jit` through
`palace.jax.virtual_tpu` and through `pltpu.force_tpu_interpret_mode`; each side is timed best-of-N on
a warm cache (the jit compile is excluded on both sides). Prints per-kernel wall times, the ratio and
its geomean, and the per-launch overhead of palace's host callback (a trivial kernel through palace.jax
vs the same kernel through palace's own `pl.pallas_call`).
"""
from __future__ import annotations

import contextlib
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

SKIP: set = set()        # parity files / cases left out (none: the multi-chip ones run as pod launches)
SKIP_CASES: set = set()


def _best(fn, reps: int) -> float:
  best = math.inf
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def _jax_interpret_ctx(mod):
  st = contextlib.ExitStack()
  jpltpu.reset_tpu_interpret_mode_state()
  st.enter_context(jpltpu.force_tpu_interpret_mode(jpltpu.InterpretParams(dma_execution_mode="eager")))
  if getattr(mod, "ABSTRACT_MESH", False):
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


def time_case(fname, case, reps):
  mod = harness.jax_module(fname)
  with pj.virtual_tpu("v5e", num_chips=getattr(mod, "NUM_DEVICES", 1)):
    fn, args, _ = getattr(mod, case)()
    f = _jitted(fn, args)
    t_palace = _best(lambda: jax.block_until_ready(f(*args)), reps)
  with _jax_interpret_ctx(mod):
    fn, args, _ = getattr(mod, case)()
    g = _jitted(fn, args)
    t_jax = _best(lambda: jax.block_until_ready(g(*args)), reps)
  return t_palace, t_jax, time_own(fname, case, reps)


def time_own(fname, case, reps):
  """The same case through palace's own path (palace.compat.load_module: no JAX in the loop)."""
  mod = harness.palace_module(fname)
  with pl.virtual_tpu("v5e", num_chips=getattr(mod, "NUM_DEVICES", 1)):
    fn, args, _ = getattr(mod, case)()
    fn(*args)
    return _best(lambda: fn(*args), reps)


def callback_overhead(reps):
  """Per-launch cost of the JAX path: a one-step copy kernel via palace.jax vs palace directly."""
  from jax.experimental import pallas as jpl
  x = np.ones((8, 128), np.float32)

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]
  with pj.virtual_tpu("v5e"):
    f = jax.jit(jpl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    jax.block_until_ready(f(x))
    t_jax_path = _best(lambda: jax.block_until_ready(f(x)), reps)
  with pl.virtual_tpu("v5e"):
    g = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype))
    t_own = _best(lambda: g(x), reps)
  return t_jax_path, t_own


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  try:
    import threadpoolctl  # noqa: F401, PLC0415
  except ImportError:
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
      print("warning: threadpoolctl is not installed, so palace cannot run block-sized products on one "
            "BLAS thread; inside XLA's callback OpenBLAS then fights XLA's threads (up to 25x slower "
            "matmul kernels). pip install threadpoolctl, or set OPENBLAS_NUM_THREADS=1.")
  reps = 2 if "--quick" in argv else 5
  only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]   # substrings of kernel names
  rows, ratios = [], []
  for fname in sorted(p.name for p in harness.KERNELS.glob("k_*.py")):
    if fname in SKIP:
      continue
    for case in harness.case_names(fname):
      if case in SKIP_CASES or (only and not any(o in f"{fname[2:-3]}:{case[5:]}" for o in only)):
        continue
      tp, tj, to = time_case(fname, case, reps)
      rows.append((f"{fname[2:-3]}:{case[5:]}", tp, tj, to))
      ratios.append(tj / tp)
  print(f"{'kernel':48s} {'palace.jax':>11s} {'JAX interp':>11s} {'ratio':>7s} {'palace own':>11s} "
        f"{'own ratio':>9s}")
  for name, tp, tj, to in rows:
    print(f"{name:48s} {tp * 1e3:9.2f}ms {tj * 1e3:9.2f}ms {tj / tp:6.1f}x {to * 1e3:9.2f}ms "
          f"{tj / to:8.1f}x")
  geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
  print(f"geomean speed-up over JAX's TPU interpret mode: {geo:.1f}x over {len(ratios)} kernels "
        f"(target >= 30x); palace's own path: "
        f"{math.exp(sum(math.log(tj / to) for _, _, tj, to in rows) / len(rows)):.1f}x")
  t_cb, t_own = callback_overhead(reps * 4)
  print(f"per-launch: one-step copy kernel through palace.jax {t_cb * 1e6:.0f} us, through palace's own "
        f"pl.pallas_call {t_own * 1e6:.0f} us: callback + interpreter overhead {(t_cb - t_own) * 1e6:.0f} us")


if __name__ == "__main__":
  main()
