"""Inside a kernel on the chip: per-grid-step region timestamps and Mosaic's compiled code (session 31).

The module times of `benchmarks.hw.chip` say what a launch costs, not where in a grid step the time
goes, so eight sessions of probes had to infer a step's parts from launch totals. libtpu can say more:
with `--xla_enable_custom_call_region_trace=true` (and `--xla_xprof_register_llo_debug_info=true`) the
`jax.named_scope` regions inside a Pallas kernel, which Pallas lowers to `tpu.trace_start` /
`tpu.trace_stop`, reach the profile as device events, and `--xla_mosaic_dump_to=DIR` writes the
kernel as Mosaic compiled it (its passes down to the bundles: where the pipeline's DMA starts and waits
sit in a step). Both are the chip's own word, at the price of perturbing it: the trace markers are
instructions with ordering edges, so a scoped kernel is timed beside its plain twin and the recorded
data (what it costs is itself a measurement).

Run on the chip (JAX, not palace), the flags set here before JAX starts:

    python3 -m benchmarks.hw.regions --out DIR --only NAME,NAME,... [--reps 3]

For each case (by exact name, from benchmarks.hw.cases) two jit functions run under the profiler: the
case as it is (`plain`) and the case with every `pallas_call` kernel body wrapped in
`jax.named_scope("pbody")` (`scoped`: one region per grid step). Writes `DIR/regions-<date><tag>.jsonl.gz`
(the environment, then per case and variant the module times and every device event of its first
profiled launch: name, thread, start and duration in us) and `DIR/mosaic-dump.tar.gz` (the dump
folder as written). No TPU here: the files are read by `benchmarks.hw.regions_read` (docs/validation.md
"Session 31").
"""
from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import sys
import tarfile
import tempfile
import time

FLAGS = ("--xla_enable_custom_call_region_trace=true", "--xla_xprof_register_llo_debug_info=true")
SCOPE = "pbody"


def _set_flags(dump_dir: str) -> None:
  """libtpu's flags for region traces and the Mosaic dump (before JAX is imported)."""
  if "jax" in sys.modules:
    raise RuntimeError("benchmarks.hw.regions must set LIBTPU_INIT_ARGS before JAX is imported")
  args = os.environ.get("LIBTPU_INIT_ARGS", "").split()
  args += [*FLAGS, f"--xla_mosaic_dump_to={dump_dir}"]
  os.environ["LIBTPU_INIT_ARGS"] = " ".join(args)


@functools.cache
def _scoping_patch():
  """`pl.pallas_call` made to wrap each kernel body in named_scope(SCOPE); returns (patched, original)."""
  import jax  # noqa: PLC0415
  from jax.experimental import pallas as pl  # noqa: PLC0415
  original = pl.pallas_call

  def pallas_call(kernel, *args, **kwargs):
    @functools.wraps(kernel)
    def scoped(*refs, **kw):
      with jax.named_scope(SCOPE):
        return kernel(*refs, **kw)
    return original(scoped, *args, **kwargs)
  return pallas_call, original


def _build(case, scoped: bool):
  from jax.experimental import pallas as pl  # noqa: PLC0415
  patched, original = _scoping_patch()
  pl.pallas_call = patched if scoped else original
  try:
    return case.build()
  finally:
    pl.pallas_call = original


def _compiled(case, variant: str):
  from benchmarks.hw.chip import _compile  # noqa: PLC0415
  return _compile(case, _build(case, variant == "scoped"), f"_{variant}")


def _profile(jf, args, reps: int) -> dict:
  """Module times of `reps` launches and every device event of the first one."""
  import jax  # noqa: PLC0415
  from benchmarks.hw.chip import _device_events, _load_trace  # noqa: PLC0415
  tdir = tempfile.mkdtemp(prefix="regions-")
  with jax.profiler.trace(tdir, create_perfetto_trace=True):
    for _ in range(reps):
      jax.block_until_ready(jf(*args))
  events, pnames, _ = _device_events(_load_trace(tdir))
  mods = sorted((e for e in events if "Module" in e["thread"]), key=lambda e: e["ts"])
  first = mods[0] if mods else None
  inside = [] if first is None else [
      [e["name"], e["thread"], round(e["ts"] - first["ts"], 4), round(e["dur"], 4)]
      for e in sorted(events, key=lambda e: e["ts"])
      if e["pid"] == first["pid"] and first["ts"] - 1e-3 <= e["ts"] <= first["ts"] + first["dur"] + 1e-3]
  return {"module_us": [m["dur"] for m in mods], "modules": sorted({m["name"] for m in mods}),
          "threads": sorted({e["thread"] for e in events}), "events_first_launch": inside}


MAX_TAR_BYTES = 15 * 2**20   # (a file back from the device: at most 16 MiB)
KEEP = ("final", "llo", "bundle", "post", "sched", "asm")


def _tar(path: str, root: str, files: list) -> None:
  """The dump folder as a tar.gz; over MAX_TAR_BYTES, only the files whose names say they are the
  late passes (KEEP), then only as many of those as fit."""
  def write(subset):
    with tarfile.open(path, "w:gz") as tar:
      for p in subset:
        tar.add(p, arcname=os.path.join("mosaic-dump", os.path.relpath(p, root)))
    return os.path.getsize(path)
  if write(files) <= MAX_TAR_BYTES:
    return
  late = [p for p in files if any(k in os.path.basename(p).lower() for k in KEEP)] or files
  while late and write(late) > MAX_TAR_BYTES:
    late = late[: len(late) * 2 // 3]
  print(f"mosaic dump cut to {len(late)} files to fit", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--only", required=True, help="exact case names, comma-separated")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--tag", default="", help="appended to the data file's name")
  a = ap.parse_args(argv)
  os.makedirs(a.out, exist_ok=True)
  dump = tempfile.mkdtemp(prefix="mosaic-dump-")
  _set_flags(dump)
  from benchmarks.hw.cases import all_cases  # noqa: PLC0415
  from benchmarks.hw.cases_issue import issue_region_cases  # noqa: PLC0415
  from benchmarks.hw.cases_paged import page_region_cases  # noqa: PLC0415
  from benchmarks.hw.cases_start import start_body_region_cases, start_form_region_cases  # noqa: PLC0415
  from benchmarks.hw.chip import _first_lines, environment  # noqa: PLC0415
  stamp = environment()
  stamp["libtpu_init_args"] = os.environ["LIBTPU_INIT_ARGS"].replace(dump, "DUMP")
  print(json.dumps(stamp), flush=True)
  by_name = {c.name: c for c in all_cases() + issue_region_cases() + page_region_cases()
             + start_form_region_cases() + start_body_region_cases()}
  # (isr_*, pgr_*, sfr_*, sbr_*: regions only)
  names = a.only.split(",")
  missing = [n for n in names if n not in by_name]
  if missing:
    raise SystemExit(f"unknown case names: {missing}")
  path = os.path.join(a.out, f"regions-{stamp['date']}{a.tag}.jsonl.gz")
  t0 = time.time()
  with gzip.open(path, "wt") as out:
    out.write(json.dumps({"kind": "environment", **stamp, "reps": a.reps}) + "\n")
    for name in names:
      case = by_name[name]
      for variant in ("plain", "scoped"):
        rec = {"kind": "case", "name": name, "family": case.family, "variant": variant}
        try:
          rec.update(_profile(*_compiled(case, variant), a.reps))
          n_scope = sum(1 for e in rec["events_first_launch"] if SCOPE in e[0])
          print(f"{name:45s} {variant:7s} module {rec['module_us']} us, {len(rec['events_first_launch'])} "
                f"events ({n_scope} '{SCOPE}'), threads {rec['threads']}", flush=True)
        except Exception as e:  # noqa: BLE001 - a case that fails is recorded, the rest go on
          rec["error"] = _first_lines(e)
          print(f"FAILED {name} {variant}: {rec['error']}", flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()
  files = sorted(os.path.join(r, f) for r, _, fs in os.walk(dump) for f in fs)
  print(f"mosaic dump: {len(files)} files, {sum(os.path.getsize(f) for f in files) / 2**20:.1f} MiB; "
        f"first {[os.path.relpath(f, dump) for f in files[:6]]}", flush=True)
  with open(os.path.join(a.out, "mosaic-dump-list.txt"), "w") as f:
    f.writelines(f"{os.path.getsize(p)} {os.path.relpath(p, dump)}\n" for p in files)
  _tar(os.path.join(a.out, "mosaic-dump.tar.gz"), dump, files)
  print(f"-> {path}, {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
  main()
