"""Modelled-timing fingerprint: every launch of the examples, the tutorial scripts and the calibration
kernels, as exact integers, so two versions of the code can be compared bit for bit.

Run from the repo root:
  python -m benchmarks.fingerprint --out before.json      # on the old tree
  python -m benchmarks.fingerprint --compare before.json  # on the new one: exit 1 on any difference

Per launch it records the kernel name, chip, device cycles, per-unit busy cycles, FLOPs, HBM and ICI
bytes, DMA counts and bytes by direction, grid steps and VMEM peak. Trace events are not compared
(their labels and lanes may legitimately change); their count and the sum of their durations are.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "docs" / "examples").glob("*.py"))


def _launch_record(r) -> dict:
  events = list(r.events or ())
  dur = sum(int(e[4]) - int(e[3]) for e in events)   # (lane, unit, name, start, end, args)
  return {"kernel": r.kernel_name, "chip": r.chip.name, "num_chips": r.num_chips,
          "device_cycles": int(r.device_cycles), "unit_busy_cycles": {k: int(v) for k, v in
                                                                     sorted(r.unit_busy_cycles.items())},
          "flops": int(r.flops), "hbm_bytes": int(r.hbm_bytes), "ici_bytes": int(r.ici_bytes),
          "dma_bytes": {str(k): int(v) for k, v in sorted(r.dma_bytes_by_direction.items())},
          "dma_count": {str(k): int(v) for k, v in sorted(r.dma_count_by_direction.items())},
          "grid_steps": int(r.grid_steps), "vmem_peak_bytes": int(r.vmem_peak_bytes),
          "events": len(events), "event_time": dur}


def collect() -> dict:
  from palace._src.sim import machine
  seen: list = []
  real = machine.VirtualTPU.record

  def record(self, report):
    if getattr(self, "_parent", None) is None:   # count each launch once (nested contexts re-record)
      seen.append(_launch_record(report))
    return real(self, report)

  machine.VirtualTPU.record = record
  out: dict = {}
  try:
    for path in SCRIPTS:
      seen.clear()
      old_argv, old_path = sys.argv, list(sys.path)
      sys.argv, sys.path[:0] = [str(path)], [str(path.parent)]
      try:
        with contextlib.redirect_stdout(io.StringIO()):
          runpy.run_path(str(path), run_name="__main__")
      finally:
        sys.argv, sys.path[:] = old_argv, old_path
      out[str(path.relative_to(ROOT))] = list(seen)
    from benchmarks import calibrate
    for m, bm, bk, bn, _ in calibrate.TABLE:
      if m * m // (bm * bn) * (m // bk) > 70_000:
        continue   # the 262,144-step configuration: --quick in calibrate too
      for chip in ("v4", "v5e", "v5p", "v6e", "7x"):
        seen.clear()
        calibrate.run_config(chip, m, bm, bk, bn)
        out[f"calibrate {chip} {m} {bm}x{bk}x{bn}"] = list(seen)
  finally:
    machine.VirtualTPU.record = real
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", help="write the fingerprint to this JSON file")
  ap.add_argument("--compare", help="compare with a fingerprint written before; exit 1 on a difference")
  args = ap.parse_args(argv)
  return write_or_compare(collect(), args.out, args.compare)


def write_or_compare(fp: dict, out: str | None, compare: str | None) -> int:
  """Write fingerprint `fp` ({source: [launch records]}) to `out` and/or compare it with the one in
  `compare`, printing every differing field; 1 on a difference (also benchmarks.jax_fingerprint's)."""
  n = sum(len(v) for v in fp.values())
  if out:
    pathlib.Path(out).write_text(json.dumps(fp, indent=1, sort_keys=True))
    print(f"{n} launches from {len(fp)} sources written to {out}")
  if compare:
    old = json.loads(pathlib.Path(compare).read_text())
    bad = [k for k in sorted(set(old) | set(fp)) if old.get(k) != fp.get(k)]
    for k in bad:
      print(f"DIFFERS: {k}")
      a_list, b_list = old.get(k, []), fp.get(k, [])
      if len(a_list) != len(b_list):
        print(f"  {len(a_list)} launches -> {len(b_list)}")
      for a, b in zip(a_list, b_list):
        for field in a:
          if a[field] != b.get(field):
            print(f"  {a['kernel']}: {field}: {a[field]} -> {b.get(field)}")
    print(f"{n} launches from {len(fp)} sources: {'identical' if not bad else f'{len(bad)} sources differ'}")
    return 1 if bad else 0
  return 0

if __name__ == "__main__":
  sys.exit(main())
