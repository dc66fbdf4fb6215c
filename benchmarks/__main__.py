"""`python -m benchmarks`: every benchmark in turn (simulation speed, calibration, scale, race cost).

Each prints its own figures with the baselines measured in the same run. Missing optional modules are
reported and skipped.
"""
import importlib
import sys
import time

MODULES = ["benchmarks.speed", "benchmarks.calibrate", "benchmarks.allgather_64", "benchmarks.race_cost"]


def main(argv):
  names = argv or MODULES
  for name in names:
    name = name if name.startswith("benchmarks.") else f"benchmarks.{name}"
    print(f"\n=== {name} ===", flush=True)
    try:
      mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
      print(f"(skipped: {e})")
      continue
    t0 = time.perf_counter()
    mod.main()
    print(f"({name} took {time.perf_counter() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
