"""The recorded TPU v5e timings beside palace's model of the same kernels.

    python -m benchmarks.hw [--data PATH] [--only SUBSTR|FAMILY] [--chip v5e] [--jobs N]
                            [--set FIELD=VALUE ...]

Needs JAX 0.12 (run with `.venv-jax/bin/python`): every case of `benchmarks/hw/cases.py` is built
exactly as on the chip and run once under `palace.jax` with `timing_only` (no data computed), and its
modelled device time is printed beside the measured one (`benchmarks/hw/data/v5e-timing-*.jsonl`, the
newest unless --data), with the per-family median and worst |error|. `--set` models them with chip-spec
fields overridden (the candidate rules of `palace._src.hw.ChipSpec`, docs/validation.md "Session 29").
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import statistics

from benchmarks.hw.cases import all_cases, data_values
from benchmarks.hw.chip import is_kernel_op

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


def newest(kind: str = "timing") -> str:
  files = sorted(glob.glob(os.path.join(DATA_DIR, f"v5e-{kind}-*.jsonl")))
  if not files:
    raise FileNotFoundError(f"no recorded {kind} data in {DATA_DIR}")
  return files[-1]


def timing_files() -> list[str]:
  return sorted(glob.glob(os.path.join(DATA_DIR, "v5e-timing-*.jsonl")))


def load(path: str | None = None):
  """(environments, {case name: record}) of the recorded timing runs: one file, or every file in
  benchmarks/hw/data (then a case measured in several runs gets the median of all its launches, and
  `module_us` lists them all). Records with an error (the chip refused the kernel) are kept."""
  envs, recs = [], {}
  for p in [path] if path else timing_files():
    with open(p) as f:
      for line in f:
        r = json.loads(line)
        if r.get("kind") == "environment":
          envs.append({**r, "file": os.path.basename(p)})
          continue
        if r.get("module_us"):
          r = {**r, "kernel_us": kernel_times(r)}
        if r["name"] in recs and r.get("module_us"):
          old = recs[r["name"]]
          times = (old.get("module_us") or []) + r["module_us"]
          kernel = (old.get("kernel_us") or []) + r["kernel_us"]
          r = {**r, "module_us": times, "median_us": statistics.median(times), "kernel_us": kernel}
        elif r["name"] in recs and not r.get("module_us"):
          continue
        if r.get("kernel_us"):
          r["measured_us"] = statistics.median(r["kernel_us"])
        recs[r["name"]] = r
  return envs, recs


def kernel_op(ops: list) -> tuple:
  """The kernel's own op among a module's (name, thread, us) ops: the one named after the case's
  jitted function (`hw_...`), else the longest op that is not one of XLA's (chip.is_kernel_op)."""
  own = [o for o in ops if o[0].startswith("hw_")]
  pool = own or [o for o in ops if is_kernel_op(o[0])] or ops
  return max(pool, key=lambda o: o[2])


def kernel_times(rec: dict) -> list:
  """The kernel's device time in each recorded launch, in us: the module's time less that of the XLA
  ops beside the kernel in the same module (layout copies of its operands, a wrapper's metadata ops;
  taken from the first launch, their time is the same in every launch). palace models the kernel, not
  XLA's ops (palace.jax's DeviceTime), so this is what the model is compared with."""
  ops = rec.get("ops_first_run") or []
  other = sum(o[2] for o in ops) - kernel_op(ops)[2] if len(ops) > 1 else 0.0
  return [m - other for m in rec["module_us"]]


@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  family: str
  measured_us: float
  modelled_us: float

  @property
  def error(self) -> float:
    return self.modelled_us / self.measured_us - 1.0


def device_time(case, chip: str = "v5e"):
  """palace.jax's DeviceTime of one case's single launch (timing only) on `chip` (a name or ChipSpec)."""
  import jax  # noqa: PLC0415
  import palace.jax as pj  # noqa: PLC0415
  with data_values("zeros"):   # (timing only: no vector data is computed, values change nothing)
    fn, args = case.build()
  with pj.virtual_tpu(chip):
    dt = pj.device_time(jax.jit(fn), *args, timing_only=True)
  if dt.launches != 1:
    raise RuntimeError(f"{case.name}: {dt.launches} launches, expected 1")
  return dt


def model_case(case, chip: str = "v5e") -> float:
  """palace's modelled device time of one case, in us."""
  return device_time(case, chip).device_time_s * 1e6


def chip_with(chip: str, sets: list[str]):
  """The chip spec `chip` with `field=value` overrides (`--set`: the candidate rules of hw.ChipSpec, or
  any other field, evaluated against the recorded suite without changing palace)."""
  from palace._src import hw  # noqa: PLC0415
  spec = hw.get_chip(chip)
  if not sets:
    return spec
  fields = {f.name: f for f in dataclasses.fields(spec)}
  kw = {}
  for item in sets:
    name, sep, text = item.partition("=")
    if not sep or name not in fields:
      raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD a ChipSpec field "
                       f"(e.g. dma_wait_latency_cycles=280)")
    kw[name] = _parse_value(getattr(spec, name), "None" in str(fields[name].type), text, item)
  return dataclasses.replace(spec, **kw)


def _parse_value(current, optional: bool, text: str, item: str):
  """`text` as a value for a field holding `current` (bool, int or float; `optional`: None allowed)."""
  word = text.lower()
  if isinstance(current, bool):
    if word in ("true", "1", "false", "0"):
      return word in ("true", "1")
  elif word == "none":
    if optional:
      return None
  else:
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if math.isfinite(value):
      if isinstance(current, float):
        return value
      if value.is_integer():
        return int(value)
      if current is None:   # (an optional number unset: any finite number)
        return value
  kind = type(current).__name__ if current is not None else "a number"
  raise ValueError(f"--set {item!r}: expected {kind}{' or none' if optional else ''}, got {text!r}")


def _model_names(args) -> dict:
  names, chip, sets = args
  spec = chip_with(chip, sets)
  by_name = {c.name: c for c in all_cases()}
  return {n: model_case(by_name[n], spec) for n in names}


def compare(path: str | None = None, only: str | None = None, chip: str = "v5e", jobs: int = 1,
            sets: tuple = ()) -> list[Row]:
  """Measured vs modelled rows of the recorded cases (`only`: a family or a substring of the name) on
  `chip` with the `sets` overrides (chip_with); `jobs` processes model the cases (the rows are the same
  for any number)."""
  _, recs = load(path)
  picked = []
  for c in all_cases():
    if only is not None and only not in c.name and only != c.family:
      continue
    r = recs.get(c.name)
    if r is None or r.get("measured_us") is None:
      continue
    picked.append(c)
  names = [c.name for c in picked]
  if jobs > 1 and len(names) > 1:
    import multiprocessing  # noqa: PLC0415
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
      modelled = {}
      for part in pool.map(_model_names, [(names[k::jobs], chip, sets) for k in range(jobs)]):
        modelled.update(part)
  else:
    modelled = _model_names((names, chip, sets))
  return [Row(c.name, c.family, recs[c.name]["measured_us"], modelled[c.name]) for c in picked]


def family_stats(rows: list[Row]) -> dict[str, tuple[int, float, float]]:
  """family -> (points, median |error|, worst |error|)."""
  fams: dict[str, list[float]] = {}
  for r in rows:
    fams.setdefault(r.family, []).append(abs(r.error))
  return {f: (len(e), statistics.median(e), max(e)) for f, e in fams.items()}
