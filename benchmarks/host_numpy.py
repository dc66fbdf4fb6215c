"""Host-level costs of a kernel's NumPy work: fresh memory (palace's C-allocator tuning,
hostmem.tune_allocator, on and off) and jnp.where's select on unpredictable masks.

Run from the repo root:  python -m benchmarks.host_numpy [--reps=N]

Each row runs in two fresh interpreters, one with palace's default (glibc malloc's mmap and trim
thresholds raised when the first virtual TPU is made) and one with PALACE_MALLOC_TUNING=0, and prints
the minor page faults per repetition and the best wall time of each, and their ratio:
  * `numpy ops`: one grid step's worth of NumPy on a (128, 256) float32 block, as a kernel body makes it
    (compare, exp, tanh, multiply, sqrt/abs, add, where: each result a fresh array), after a virtual TPU
    was entered;
  * `kernel`: palace's own `pl.pallas_call` of that body over a (512, 256) array in (128, 256) blocks
    (the parity kernel `basic:elementwise_transcendental`, 4 steps), best of N launches;
  * `launches`: 8 different small kernels launched once each in a fresh process (what a test suite or a
    program's first calls see), total time.
Page faults are counted by the kernel (`getrusage`), so they are exact; times are this machine's.
Last, in this process: np.where against palace's select (numpy_base._select, what jnp.where computes
its data with) on a (128, 256) float32 block, with a different random mask per call (a mask repeated
call after call trains the CPU's branch predictor and hides np.where's cost) and with a uniform mask.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, time
import numpy as np
import palace as pl
import palace.numpy as jnp

reps = int(sys.argv[1])
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
out = {}

def body(x):
  return jnp.where(x > 0, jnp.exp(-x) * jnp.tanh(x), jnp.sqrt(jnp.abs(x)) + 1.0)

def timed(fn, n):
  fn()
  f0, best = faults(), float("inf")
  for _ in range(n):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return (faults() - f0) / n, best

with pl.virtual_tpu("v5e"):
  x = np.random.default_rng(0).standard_normal((128, 256)).astype(np.float32)
  def numpy_ops():
    c = x > 0
    a = np.exp(-x) * np.tanh(x)
    b = np.sqrt(np.abs(x)) + np.float32(1)
    return np.where(c, a, b)
  out["numpy ops"] = timed(numpy_ops, reps)

  big = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
  spec = pl.BlockSpec((128, 256), lambda i: (i, 0))
  def kernel(x_ref, o_ref):
    o_ref[...] = body(x_ref[...])
  call = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(big.shape, big.dtype), grid=(4,),
                        in_specs=[spec], out_specs=spec)
  np.testing.assert_allclose(call(big), np.where(big > 0, np.exp(-big) * np.tanh(big),
                                                 np.sqrt(np.abs(big)) + 1), rtol=1e-6)
  out["kernel"] = timed(lambda: call(big), reps)

with pl.virtual_tpu("v5e"):
  f0, t0 = faults(), time.perf_counter()
  for k in range(8):
    n = 128 * (k + 1)
    a = np.random.default_rng(k).standard_normal((n, 256)).astype(np.float32)
    def kern(x_ref, o_ref, k=k):
      v = x_ref[...]
      o_ref[...] = jnp.exp(v * (k + 1)) + jnp.maximum(v, 0.0)
    s = pl.BlockSpec((128, 256), lambda i: (i, 0))
    pl.pallas_call(kern, out_shape=pl.ShapeDtypeStruct(a.shape, a.dtype), grid=(k + 1,),
                   in_specs=[s], out_specs=s)(a)
  out["launches"] = (faults() - f0, time.perf_counter() - t0)
print(json.dumps(out))
"""


def _run(tuning: bool, reps: int) -> dict:
  env = dict(os.environ)
  for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"):
    env.pop(v, None)
  env["PALACE_MALLOC_TUNING"] = "1" if tuning else "0"
  env.setdefault("OPENBLAS_NUM_THREADS", "1")
  res = subprocess.run([sys.executable, "-c", _CHILD, str(reps)], env=env, capture_output=True,
                       text=True, check=True)
  return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  reps = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--reps=")), 50)
  off, on = _run(False, reps), _run(True, reps)
  heads = ("faults off", "faults on", "time off", "time on", "speed-up")
  print(f"{'':12s} " + " ".join(f"{h:>10s}" for h in heads))
  for name in on:
    (f_off, t_off), (f_on, t_on) = off[name], on[name]
    print(f"{name:12s} {f_off:10.1f} {f_on:10.1f} {t_off * 1e3:8.3f}ms {t_on * 1e3:8.3f}ms "
          f"{t_off / t_on:9.2f}x")
  print("(numpy ops, kernel: per repetition, best of", reps, "; launches: 8 first launches in all)")
  _selects(reps)


def _selects(reps: int) -> None:
  import time  # noqa: PLC0415

  import numpy as np  # noqa: PLC0415

  from palace._src.lang.numpy_base import _select  # noqa: PLC0415
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal((128, 256)).astype(np.float32) for _ in range(reps)]
  ys = [x + 1 for x in xs]
  masks = {"random masks": [x > 0 for x in xs], "uniform mask": [np.ones(x.shape, bool) for x in xs]}

  def best(fn, cs):
    t = float("inf")
    for c, x, y in zip(cs, xs, ys):
      t0 = time.perf_counter()
      fn(c, x, y)
      t = min(t, time.perf_counter() - t0)
    return t

  for name, cs in masks.items():
    t_where, t_select = best(np.where, cs), best(_select, cs)
    print(f"select, {name}: np.where {t_where * 1e6:.1f} us, palace's select {t_select * 1e6:.1f} us "
          f"({t_where / t_select:.2f}x)")


if __name__ == "__main__":
  main()
