"""`python -m benchmarks`: every benchmark in turn (simulation speed, palace's tiled matmul against
NumPy, the same-run ratio against JAX's TPU interpret mode on issue 35's fixed kernel set through both
front ends, calibration, scale, race cost).

Each prints its own figures with the baselines measured in the same run, in the environment it was
started in (the default one: no OPENBLAS_NUM_THREADS unless the user set it). Missing optional modules
are reported and skipped. The JAX comparison needs JAX: it runs under this interpreter when it has JAX,
else under the checkout's `.venv-jax/bin/python` when there is one, else it is skipped with a note.

Each benchmark runs in a fresh interpreter (`python -m benchmarks.NAME`), so that no figure depends on
which benchmarks ran before it. Decision of session 6: in one process, the 64-chip all-gather's wall
time depended on what the earlier benchmarks left in the heap. A tree that keeps 1.1 GiB of finished
machines alive until the cyclic GC runs hands that already-touched memory to the all-gather. A tree
that releases each machine when its launch ends returns the memory to the OS. The all-gather then
touches 4 GiB of fresh pages, and on this VM that costs 0.5 to 11 s of kernel time (NumPy asks for
transparent huge pages, and compaction is slow and variable). The figure measured the process's
history, not the simulator.
"""
import importlib.util
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = ["benchmarks.speed", "benchmarks.matmul_vs_numpy", "benchmarks.jax_engine --fixed",
           "benchmarks.calibrate", "benchmarks.allgather_64", "benchmarks.race_cost"]
NEEDS_JAX = {"benchmarks.jax_engine"}


def _python_for(name):
  """The interpreter to run `name` with, or None (JAX wanted and none has it)."""
  if name not in NEEDS_JAX or importlib.util.find_spec("jax") is not None:
    return sys.executable
  other = ROOT / ".venv-jax" / "bin" / "python"
  return str(other) if other.exists() else None


def main(argv):
  names = argv or MODULES
  failed = 0
  for entry in names:
    name, *args = entry.split()
    name = name if name.startswith("benchmarks.") else f"benchmarks.{name}"
    print(f"\n=== {' '.join([name, *args])} ===", flush=True)
    python = _python_for(name)
    if python is None:
      print(f"(skipped: {name} needs JAX; neither this interpreter nor .venv-jax has it)")
      continue
    try:
      found = python != sys.executable or importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
      found = False
    if not found:
      print(f"(skipped: no module named {name!r})")
      continue
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    t0 = time.perf_counter()
    rc = subprocess.run([python, "-m", name, *args], cwd=ROOT, env=env).returncode
    failed += rc != 0
    print(f"({name} took {time.perf_counter() - t0:.1f} s{'' if rc == 0 else f', exit {rc}'})", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
