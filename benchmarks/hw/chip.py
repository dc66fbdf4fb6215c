"""Measure the timing suite (and the numerics and compiler-limit probes) on a real TPU.

Run on a machine with a TPU and JAX (not palace):

    python3 -m benchmarks.hw.chip --out DIR [--only SUBSTR] [--reps 5] [--no-probes]

Writes `DIR/v5e-timing-<date>.jsonl` (first line: the environment; then one line per case with
every launch's device time), `DIR/v5e-numerics-<date>.jsonl`, `DIR/v5e-limits-<date>.jsonl` and the
raw device events of each profile (`DIR/raw-events.jsonl.gz`, for re-analysis). The recorded files
are kept in `benchmarks/hw/data/` (CI has no TPU; tests read them).

Method (issue 36, "Measuring right"): every case is its own `jax.jit` function named after the case,
compiled and run once before the profile; then `--reps` calls, each blocked on, inside one
`jax.profiler.trace` per family. A case's device time is the duration of its XLA module on the
TPU's "XLA Modules" line (its one kernel plus XLA's argument handling, a few us; the kernel op's own
duration is recorded beside it). Wall clocks are not used: one jit call has a ~450 us host floor there.
Chaining launches inside one jit lets XLA keep buffers on chip; each case is one launch per call.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback

from benchmarks.hw.cases import all_cases


def _jit_name(case_name: str) -> str:
  return "hw_" + re.sub(r"[^0-9A-Za-z_]", "_", case_name)


def _compile(case, built=None, suffix: str = ""):
  """The case jitted under its own name (+ `suffix`), compiled and run twice; `built`: its (fn, args)
  when already built (benchmarks/hw/regions.py builds variants)."""
  import jax  # noqa: PLC0415
  fn, args = built or case.build()

  def wrapped(*a):
    return fn(*a)
  wrapped.__name__ = wrapped.__qualname__ = _jit_name(case.name) + suffix
  jf = jax.jit(wrapped)
  jax.block_until_ready(jf(*args))
  jax.block_until_ready(jf(*args))
  return jf, args


def _load_trace(trace_dir: str) -> dict:
  files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  files += glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
  if not files:
    raise RuntimeError(f"no trace file under {trace_dir}: {glob.glob(trace_dir + '/**', recursive=True)}")
  with gzip.open(sorted(files, key=os.path.getmtime)[-1], "rt") as f:
    return json.load(f)


def _device_events(trace: dict):
  """(events on TPU processes with their thread names, process names) of a perfetto/chrome trace."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  pnames, tnames = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      pnames[e["pid"]] = e["args"]["name"]
    if e.get("ph") == "M" and e.get("name") == "thread_name":
      tnames[(e["pid"], e["tid"])] = e["args"]["name"]
  tpu = {p for p, n in pnames.items() if "TPU" in n and "/device:" in n}
  if not tpu:   # unknown naming: keep every non-host process, the raw dump shows what it was
    tpu = {p for p, n in pnames.items() if not n.startswith("/host")}
  out = []
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in tpu:
      out.append({"name": e.get("name", ""), "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0)),
                  "pid": e["pid"], "thread": tnames.get((e["pid"], e.get("tid")), str(e.get("tid")))})
  return out, pnames, tnames


def attribute(events, jit_names: list[str], reps: int) -> dict[str, list[dict]]:
  """Per case (in the order they ran, `reps` calls each), its module runs: duration and ops inside.

  Calls are matched to the TPU's "XLA Modules" events by order, not by name: XLA reuses the compiled
  executable of an identical program under the first program's name (two cases that copy the same
  32 MiB contiguously ran as one module name), so names only confirm the match."""
  mods = sorted((e for e in events if "Module" in e["thread"] and e["name"].startswith("jit_hw_")),
                key=lambda e: e["ts"])
  if len(mods) != reps * len(jit_names):
    raise RuntimeError(f"{len(mods)} module events for {len(jit_names)} cases x {reps} calls")
  out = {}
  for i, name in enumerate(jit_names):
    runs = []
    for m in mods[i * reps:(i + 1) * reps]:
      ops = [e for e in events if e["pid"] == m["pid"] and "Module" not in e["thread"]
             and "Step" not in e["thread"] and m["ts"] <= e["ts"] <= m["ts"] + m["dur"] + 1e-3]
      runs.append({"module": m["name"].split("(")[0], "module_us": m["dur"],
                   "ops": [(o["name"], o["thread"], o["dur"]) for o in ops]})
    out[name] = runs
  return out


def case_record(case, runs) -> dict:
  mod = [r["module_us"] for r in runs]
  shared = sorted({r["module"] for r in runs} - {"jit_" + _jit_name(case.name)})
  return {"kind": "case", "name": case.name, "family": case.family, "note": case.note,
          "module_us": mod, "median_us": statistics.median(mod) if mod else None,
          "kernel_op_us": [sum(d for (n, t, d) in r["ops"] if is_kernel_op(n)) for r in runs],
          "ran_as": shared or None, "ops_first_run": runs[0]["ops"] if runs else None}


def measure_timing(out_dir: str, only: str | None, reps: int, stamp: dict, tag: str = "") -> str:
  import jax  # noqa: PLC0415
  keys = None if only is None else only.split(",")
  cases = [c for c in all_cases() if keys is None or any(k in c.name or k == c.family for k in keys)]
  families = sorted({c.family for c in cases}, key=[c.family for c in cases].index)
  path = os.path.join(out_dir, f"v5e-timing-{stamp['date']}{tag}.jsonl")
  raw = gzip.open(os.path.join(out_dir, f"v5e-timing-{stamp['date']}{tag}-raw-events.jsonl.gz"), "wt")
  with open(path, "w") as out:
    out.write(json.dumps({"kind": "environment", **stamp, "reps": reps}) + "\n")
    for fam in families:
      t0 = time.time()
      ready = []
      for c in [c for c in cases if c.family == fam]:
        try:
          ready.append((c, *_compile(c)))
        except Exception as e:  # noqa: BLE001 - a case that fails is recorded, the rest go on
          rec = {"kind": "case", "name": c.name, "family": c.family, "error": _first_lines(e)}
          out.write(json.dumps(rec) + "\n")
          print(f"FAILED {c.name}: {_first_lines(e)}", flush=True)
      if not ready:
        continue
      tdir = tempfile.mkdtemp(prefix=f"trace-{fam}-")
      try:
        with jax.profiler.trace(tdir, create_perfetto_trace=True):
          for c, jf, args in ready:
            for _ in range(reps):
              jax.block_until_ready(jf(*args))
            time.sleep(0.002)
        events, pnames, tnames = _device_events(_load_trace(tdir))
      except Exception as e:  # noqa: BLE001
        print(f"PROFILE FAILED for {fam}: {traceback.format_exc()}", flush=True)
        for c, _, _ in ready:
          out.write(json.dumps({"kind": "case", "name": c.name, "family": fam,
                                "error": "profile: " + _first_lines(e)}) + "\n")
        continue
      print(f"   trace: processes {sorted(set(pnames.values()))[:8]}, device threads "
            f"{sorted({e['thread'] for e in events})[:12]}", flush=True)
      raw.write(json.dumps({"family": fam, "cases": [c.name for c, _, _ in ready], "pnames": {str(k): v for k, v in pnames.items()},
                            "threads": sorted({e["thread"] for e in events}), "events": events}) + "\n")
      runs = attribute(events, [_jit_name(c.name) for c, _, _ in ready], reps)
      for c, _, _ in ready:
        rec = case_record(c, runs[_jit_name(c.name)])
        out.write(json.dumps(rec) + "\n")
        print(f"{c.name:55s} {rec['median_us']}", flush=True)
      out.flush()
      print(f"-- family {fam}: {len(ready)} cases in {time.time() - t0:.1f}s", flush=True)
      del ready
  raw.close()
  return path


def reparse(raw_path: str, timing_path: str) -> None:
  """Rebuild a timing file's case records from its raw device events (same attribution rules)."""
  with open(timing_path) as f:
    lines = [json.loads(ln) for ln in f]
  env = next(r for r in lines if r.get("kind") == "environment")
  failed = {r["name"]: r for r in lines if r.get("kind") == "case" and "error" in r}
  by_name = {c.name: c for c in all_cases()}
  out = [env]
  with gzip.open(raw_path, "rt") as f:
    for line in f:
      fam = json.loads(line)
      names = fam.get("cases") or [c.name for c in all_cases()
                                    if c.family == fam["family"] and c.name not in failed]
      out += [r for r in failed.values() if r["family"] == fam["family"]]
      runs = attribute(fam["events"], [_jit_name(n) for n in names], env["reps"])
      out += [case_record(by_name[n], runs[_jit_name(n)]) for n in names]
  with open(timing_path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in out)


def is_kernel_op(name: str) -> bool:
  n = name.lower()
  return not any(w in n for w in ("copy", "bitcast", "broadcast", "iota", "constant", "convert",
                                  "fusion", "reshape", "transpose", "slice", "tuple", "parameter"))


def _first_lines(e: BaseException, n: int = 3) -> str:
  lines = [ln for ln in f"{type(e).__name__}: {e}".splitlines() if ln.strip()]
  return "\n".join(lines[:n])[:600]


def environment() -> dict:
  import jax  # noqa: PLC0415
  import jaxlib  # noqa: PLC0415
  dev = jax.devices()[0]
  env = {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
         "device_kind": dev.device_kind, "platform": dev.platform, "num_devices": len(jax.devices()),
         "date": datetime.date.today().isoformat(), "python": sys.version.split()[0]}
  try:
    import importlib.metadata as md  # noqa: PLC0415
    env["libtpu_version"] = next((md.version(p) for p in ("libtpu", "libtpu-nightly")
                                  if _has_dist(md, p)), None)
  except Exception:  # noqa: BLE001
    pass
  return env


def _has_dist(md, name):
  try:
    md.version(name)
    return True
  except md.PackageNotFoundError:
    return False


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out")
  ap.add_argument("--only", default=None, help="case-name substrings or families, comma-separated")
  ap.add_argument("--tag", default="", help="appended to the data file names (a second run that day)")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--no-probes", action="store_true")
  ap.add_argument("--no-timing", action="store_true")
  ap.add_argument("--reparse", nargs=2, metavar=("RAW", "TIMING"),
                  help="rebuild TIMING's case records from RAW device events (no TPU needed)")
  a = ap.parse_args(argv)
  if a.reparse:
    reparse(*a.reparse)
    return
  os.makedirs(a.out, exist_ok=True)
  stamp = environment()
  print(json.dumps(stamp), flush=True)
  t0 = time.time()
  if not a.no_timing:
    print("timing ->", measure_timing(a.out, a.only, a.reps, stamp, a.tag), f"{time.time() - t0:.0f}s", flush=True)
  if not a.no_probes:
    for mod in ("numerics", "limits"):
      t1 = time.time()
      try:
        m = __import__(f"benchmarks.hw.{mod}", fromlist=["chip_probes"])
        p = os.path.join(a.out, f"v5e-{mod}-{stamp['date']}.jsonl")
        m.chip_probes(p)
        with open(p) as f:
          lines = f.readlines()
        with open(p, "w") as f:
          f.write(json.dumps({"kind": "environment", **stamp}) + "\n")
          f.writelines(lines)
        print(f"{mod} -> {p} ({len(lines)} records, {time.time() - t1:.0f}s)", flush=True)
      except Exception:  # noqa: BLE001
        print(f"{mod} probes FAILED:\n{traceback.format_exc()}", flush=True)
  print(f"total {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
  main()
