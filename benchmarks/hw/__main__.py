"""python -m benchmarks.hw: measured (recorded on a TPU v5e) vs modelled, per case and per family."""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

from benchmarks.hw import model


def main(argv=None):
  ap = argparse.ArgumentParser(description=model.__doc__.splitlines()[0])
  ap.add_argument("--data", default=None)
  ap.add_argument("--only", default=None)
  ap.add_argument("--chip", default="v5e")
  ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                  help="override a chip-spec field (a candidate rule), e.g. dma_wait_latency_cycles=280")
  ap.add_argument("--jobs", type=int, default=1, help="processes modelling the cases")
  ap.add_argument("--save", default=None, metavar="JSON",
                  help="also write every row (name, family, measured us, modelled us) to this file")
  a = ap.parse_args(argv)
  try:
    model.chip_with(a.chip, a.set)
  except ValueError as e:
    ap.error(str(e))
  t0 = time.process_time()
  envs, _ = model.load(a.data)
  for env in envs:
    print(f"measured: {env.get('device_kind')}, jax {env.get('jax_version')}, libtpu "
          f"{env.get('libtpu_version')}, {env.get('date')} ({env['file']})")
  if a.set:
    print("chip-spec overrides: " + ", ".join(a.set))
  rows = model.compare(a.data, a.only, a.chip, a.jobs, tuple(a.set))
  print(f"{'case':58s} {'measured us':>12s} {'modelled us':>12s} {'error':>8s}")
  for r in rows:
    print(f"{r.name:58s} {r.measured_us:12.1f} {r.modelled_us:12.1f} {r.error * 100:+7.1f}%")
  print(f"\n{'family':18s} {'points':>6s} {'median |err|':>13s} {'worst |err|':>12s}")
  for fam, (n, med, worst) in model.family_stats(rows).items():
    print(f"{fam:18s} {n:6d} {med * 100:12.1f}% {worst * 100:11.1f}%")
  errs = [abs(r.error) for r in rows]
  if errs:
    within = " / ".join(str(sum(e <= t for e in errs)) for t in (0.05, 0.10, 0.15))
    print(f"{'all':18s} {len(errs):6d} {statistics.median(errs) * 100:12.1f}% {max(errs) * 100:11.1f}%"
          f"   within 5 / 10 / 15%: {within}")
  if a.save:
    with open(a.save, "w") as f:
      json.dump([[r.name, r.family, r.measured_us, r.modelled_us] for r in rows], f)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)   # (--jobs: the worker processes' CPU)
  print(f"({time.process_time() - t0 + kids.ru_utime + kids.ru_stime:.0f} s CPU)")


if __name__ == "__main__":
  main()
