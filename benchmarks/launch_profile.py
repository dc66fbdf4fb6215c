"""Host work of one small launch, counted (not timed): Python bytecodes and Python-level calls per
launch of a one-step kernel, on palace's own `pl.pallas_call` and (when JAX is installed) through
`palace.jax` inside `jax.jit`, so two trees can be compared exactly on a busy machine. The sibling of
benchmarks/step_profile.py, which counts per grid step: a tiny kernel's time is this fixed cost.

Run from the repo root:  python -m benchmarks.launch_profile [--top=N]
(`.venv-jax/bin/python` adds the palace.jax row; `--top=N` lists the N functions that execute the most
bytecodes themselves, per launch, for each path.)
Compare another checkout:  PYTHONPATH=/path/to/other python benchmarks/launch_profile.py

The kernel is a one-step (8, 128) f32 copy (`o_ref[...] = x_ref[...]`, no grid), the kernel
jax_engine's per-launch row times. Counts come from sys.settrace opcode events and sys.setprofile call
events over all threads (the XLA host callback of a small jitted call runs on the calling thread), over
the third of three identical launches (the first ones warm the caches and jit); they are deterministic
for a given Python, NumPy and JAX version. C-level work (NumPy, XLA, the cyclic GC) is not counted.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import threading

import numpy as np

import palace as pl


def _copy_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...]


_X = np.ones((8, 128), np.float32)


def own_path(stack):
  stack.enter_context(pl.virtual_tpu("v5e"))
  call = pl.pallas_call(_copy_kernel, out_shape=pl.ShapeDtypeStruct(_X.shape, _X.dtype))
  return lambda: call(_X)


def jax_path(stack):
  import jax  # noqa: PLC0415
  from jax.experimental import pallas as jpl  # noqa: PLC0415

  import palace.jax as pj  # noqa: PLC0415
  stack.enter_context(pj.virtual_tpu("v5e"))
  f = jax.jit(jpl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(_X.shape, _X.dtype)))
  return lambda: jax.block_until_ready(f(_X))


def count(run, top: int = 0):
  """(bytecodes, Python calls, [(bytecodes, function)] of the `top` busiest functions) of one call
  of `run` (all threads)."""
  ops = collections.Counter()

  def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
      ops[frame.f_code] += 1
    return trace

  calls = [0]

  def profile(frame, event, arg):
    if event == "call":
      calls[0] += 1

  def traced(install, fn):
    install_all = getattr(threading, install + "_all_threads", None)   # Python >= 3.12
    (install_all or getattr(threading, install))(fn)
    getattr(sys, install)(fn)
    try:
      run()
    finally:
      getattr(sys, install)(None)
      (install_all or getattr(threading, install))(None)

  run()
  run()
  traced("settrace", trace)
  ops.clear()   # (the first traced call only instruments the frames)
  traced("settrace", trace)
  traced("setprofile", profile)
  busiest = [(n, f"{c.co_qualname} ({_short(c.co_filename)}:{c.co_firstlineno})")
             for c, n in ops.most_common(top)]
  return sum(ops.values()), calls[0], busiest


def _short(path: str) -> str:
  for mark in ("/palace/", "/site-packages/", "/lib/python"):
    if mark in path:
      return path[path.index(mark) + 1:]
  return path


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  top = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--top=")), 0)
  paths = [("palace's own pl.pallas_call", own_path)]
  try:
    import jax  # noqa: F401, PLC0415
    paths.append(("palace.jax (jax.jit + pallas_call)", jax_path))
  except ImportError:
    print("(JAX is not installed: palace's own path only)")
  for name, make in paths:
    with contextlib.ExitStack() as stack:
      ops, calls, busiest = count(make(stack), top)
    print(f"one-step launch, {name:36s} {ops:8d} bytecodes {calls:6d} Python calls")
    for n, where in busiest:
      print(f"    {n:7d}  {where}")


if __name__ == "__main__":
  main()
