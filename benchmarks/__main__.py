"""`python -m benchmarks`: every benchmark in turn (simulation speed, calibration, scale, race cost).

Each prints its own figures with the baselines measured in the same run. Missing optional modules are
reported and skipped.

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
import subprocess
import sys
import time

MODULES = ["benchmarks.speed", "benchmarks.calibrate", "benchmarks.allgather_64", "benchmarks.race_cost"]


def main(argv):
  names = argv or MODULES
  failed = 0
  for name in names:
    name = name if name.startswith("benchmarks.") else f"benchmarks.{name}"
    print(f"\n=== {name} ===", flush=True)
    try:
      found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
      found = False
    if not found:
      print(f"(skipped: no module named {name!r})")
      continue
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", name]).returncode
    failed += rc != 0
    print(f"({name} took {time.perf_counter() - t0:.1f} s{'' if rc == 0 else f', exit {rc}'})", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
