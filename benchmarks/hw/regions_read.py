"""Read the chip's in-kernel timelines (`benchmarks.hw.regions`) and set palace's beside them.

    python -m benchmarks.hw.regions_read [--data FILE] [--case NAME] [--model] [--set FIELD=VALUE ...]

With region tracing on, libtpu records an instant event on the device's "Tensor Core" line each time
the kernel passes certain bundles (named `bundle.<address>`; the addresses are the kernel program's
and their meaning is not recorded, but the order they repeat in is each grid step's), and one 'pbody'
event per grid step on "XLA TraceMe" when the body is scoped. So a launch's grid steps can be told
apart on the chip: their lengths, and per step the time between successive markers ("segments"), the
longest of which are where the step waits for its DMAs. This prints, per case: the kernel's cycles,
the step lengths (between successive passes of the loop's first marker), their mean, the first ones
in order, and each segment's median by the step's position in a period of grid steps (an output block
kept `period` steps repeats every `period`); with `--model` (needs JAX: .venv-jax) palace's own grid
steps (the report's 'grid step' events) for the same kernel, today's model and with `--set`
overrides. Cycles are the chip's at 1.5 GHz.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import statistics

from benchmarks.hw import model
from benchmarks.hw.cases import all_cases

DATA = os.path.join(os.path.dirname(__file__), "data")
CLOCK_HZ = 1.5e9   # v5e's TensorCore clock (palace hw.py): the trace's microseconds as cycles
_BUNDLE0 = 1 << 27  # bundle events are named bundle.<2^27 + address>


@dataclasses.dataclass
class ChipSteps:
  """One recorded launch of a case as the chip ran it."""
  name: str
  variant: str
  kernel_cycles: float
  markers: list          # (marker, cycle) in order, cycles from the module's start
  head: str              # the marker that starts each grid step (the loop's first)
  steps: list            # per grid step: [(from marker, to marker, cycles)]
  bodies: list           # cycles of each 'pbody' region (scoped variants), in order

  @property
  def step_cycles(self) -> list:
    return [sum(c for _, _, c in s) for s in self.steps]


def marker_name(event_name: str) -> str:
  return str(int(event_name.split(".", 1)[1]) - _BUNDLE0) if event_name.startswith("bundle.") else event_name


def _head(markers) -> str:
  """The loop's first marker: of the markers passed once per grid step (the most frequent count), the
  one that follows the kernel's prologue first."""
  counts = collections.Counter(m for m, _ in markers)
  per_step = max(counts.values())
  repeated = {m for m, c in counts.items() if c >= per_step - 2}
  return next(m for m, _ in markers if m in repeated)


def load(path: str | None = None) -> list[ChipSteps]:
  """Every recorded case launch of the region files (`path`, or all of DATA's regions-*.jsonl.gz)."""
  paths = [path] if path else sorted(glob.glob(os.path.join(DATA, "regions-*.jsonl.gz")))
  out = []
  for p in paths:
    with gzip.open(p, "rt") as f:
      for line in f:
        rec = json.loads(line)
        if rec.get("kind") != "case" or "error" in rec:
          continue
        ev = rec["events_first_launch"]
        op = model.kernel_op([(e[0], e[1], e[3]) for e in ev if e[1] == "XLA Ops"])   # the kernel's
        markers = [(marker_name(e[0]), e[2] * CLOCK_HZ / 1e6) for e in ev if e[1] == "Tensor Core"]
        bodies = [e[3] * CLOCK_HZ / 1e6 for e in ev if e[1] == "XLA TraceMe"]
        head = _head(markers) if markers else ""
        steps, cur = [], None
        for (m, t), (n, u) in zip(markers, markers[1:]):
          if m == head:
            cur = []
            steps.append(cur)
          if cur is not None:
            cur.append((m, n, u - t))
        out.append(ChipSteps(rec["name"], rec["variant"], op[2] * CLOCK_HZ / 1e6, markers, head,
                             steps[:-1], bodies))
  return out


def by_position(cs: ChipSteps, period: int) -> dict[int, dict[str, float]]:
  """Median cycles of each segment ('a>b') per step position modulo `period` (the first step,
  which holds the prologue's waits, left out)."""
  acc = collections.defaultdict(lambda: collections.defaultdict(list))
  for i, s in enumerate(cs.steps[1:], start=1):
    for a, b, c in s:
      acc[i % period][f"{a}>{b}"].append(c)
  return {p: {k: statistics.median(v) for k, v in segs.items()} for p, segs in sorted(acc.items())}


def modelled_steps(name: str, sets=()) -> tuple[float, list]:
  """palace.jax's device cycles and grid-step lengths of case `name` on v5e with `sets` overrides."""
  case = next(c for c in all_cases() if c.name == name)
  report = model.device_time(case, model.chip_with("v5e", list(sets))).reports[0]
  starts = sorted(e[3] for e in report.events if e[2] == "grid step") + [report.device_cycles]
  return report.device_cycles, [b - a for a, b in zip(starts, starts[1:])]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--data", default=None)
  ap.add_argument("--case", action="append", default=[], help="a case name (repeatable; default all)")
  ap.add_argument("--period", type=int, default=8)
  ap.add_argument("--first", type=int, default=16, help="step lengths printed in order")
  ap.add_argument("--model", action="store_true", help="palace's grid steps beside the chip's (JAX)")
  ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
  a = ap.parse_args(argv)
  for cs in load(a.data):
    if cs.variant != "plain" or (a.case and cs.name not in a.case):
      continue
    st = cs.step_cycles
    print(f"{cs.name}: kernel {cs.kernel_cycles:,.0f} cycles; {len(st)} intervals between passes of "
          f"marker {cs.head} (grid steps), mean {statistics.mean(st):.1f}; first {[round(x) for x in st[:a.first]]}")
    for p, segs in by_position(cs, a.period).items():
      print(f"   position {p}: " + "  ".join(f"{k} {v:.0f}" for k, v in segs.items()))
    if a.model:
      for label, sets in [("palace today", [])] + ([("palace " + " ".join(a.set), a.set)] if a.set else []):
        total, steps = modelled_steps(cs.name, sets)
        per = (f"mean {statistics.mean(steps):.1f}; first {[round(x) for x in steps[:a.first]]}" if steps
               else "no grid steps (the chip's intervals are the kernel's own markers)")
        print(f"   {label}: {total:,.0f} cycles ({total / cs.kernel_cycles - 1:+.1%}), {per}")


if __name__ == "__main__":
  main()
