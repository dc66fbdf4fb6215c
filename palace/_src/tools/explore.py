"""Schedule exploration (L5): run a kernel-calling function under many DMA/core schedules, compare outputs.

`pl.explore_schedules(fn, *args, seeds=range(8), chip="v5e")` calls `fn(*args)` once per schedule: the
`eager` and `on_wait` DMA policies, then the seeded `random` policy (each DMA's data moves at its start or
at its wait by a coin flip, and the next core to run is picked at random among the runnable ones) for
every seed. A race-free kernel gives bit-identical outputs under all of them; the report lists every
schedule whose outputs differ from the first one (max abs difference, first differing index) or that
raised.

Example:
  >>> rep = pl.explore_schedules(lambda x: my_call(x), x, seeds=range(16), chip="v5p")
  >>> assert rep.ok, rep
"""
from __future__ import annotations

import dataclasses

import numpy as np

from palace._src import dtypes as dt
from palace._src import validate
from palace._src.errors import UsageError
from palace._src.sim.machine import DMA_POLICIES, VirtualTPU
from palace._src import validate
from palace._src.util import tree_flatten


@dataclasses.dataclass(frozen=True)
class Divergence:
  """One schedule whose result differs from the reference schedule's."""
  schedule: str             # "on_wait", "random seed=3", ...
  output: int               # index of the output leaf
  max_abs_diff: float       # NaN when shapes/dtypes differ or NaNs appear on one side only
  first_index: tuple        # first differing element (row-major)
  error: str | None = None  # the schedule raised instead of returning

  def __str__(self):
    if self.error is not None:
      return f"{self.schedule}: raised {self.error}"
    return (f"{self.schedule}: output {self.output} differs, max |diff| {self.max_abs_diff:.6g}, first at "
            f"index {self.first_index}")


@dataclasses.dataclass(frozen=True)
class ScheduleReport:
  """What `explore_schedules` found: `ok` is True when every schedule agreed with the reference."""
  schedules: tuple          # labels of the schedules run, the reference first
  divergences: tuple        # Divergence per differing (schedule, output)
  outputs: object           # the reference schedule's result

  @property
  def ok(self) -> bool:
    return not self.divergences

  @property
  def differing_schedules(self) -> tuple:
    return tuple(dict.fromkeys(d.schedule for d in self.divergences))

  def __str__(self):
    head = f"{len(self.schedules)} schedules ({self.schedules[0]} is the reference): "
    if self.ok:
      return head + "all outputs identical."
    return head + f"{len(self.differing_schedules)} differ.\n  " + "\n  ".join(map(str, self.divergences))


def _compare(ref_leaves, leaves, label):
  out = []
  if len(ref_leaves) != len(leaves):
    return [Divergence(label, 0, float("nan"), (), f"{len(leaves)} outputs instead of {len(ref_leaves)}")]
  for i, (a, b) in enumerate(zip(ref_leaves, leaves)):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
      out.append(Divergence(label, i, float("nan"), (),
                            f"output {i} is {b.dtype}{list(b.shape)} instead of {a.dtype}{list(a.shape)}"))
      continue
    if a.tobytes() == b.tobytes():
      continue
    if a.dtype.kind == "c" or dt.is_float(a.dtype):
      fa, fb = a.astype(np.float64), b.astype(np.float64)
      same = (fa == fb) | (np.isnan(fa) & np.isnan(fb))
      with np.errstate(invalid="ignore"):
        diff = np.abs(fa - fb)
    else:
      fa, fb = a.astype(np.int64), b.astype(np.int64)
      same = fa == fb
      diff = np.abs(fa - fb).astype(np.float64)
    bad = ~same
    first = tuple(int(j) for j in np.argwhere(bad)[0]) if bad.any() else ()
    finite = diff[bad & np.isfinite(diff)]
    mx = float(finite.max()) if finite.size else float("nan")
    out.append(Divergence(label, i, mx, first))
  return out


def explore_schedules(fn, *args, seeds=range(8), chip="v5e", num_chips: int = 1,
                      policies=("eager", "on_wait"), detect_races: bool = False, **tpu_kwargs):
  """Run `fn(*args)` (which launches kernels) under the `policies` and the `random` policy with each
  of `seeds`, each in a fresh `pl.virtual_tpu(chip, num_chips, ...)`; return a ScheduleReport of the
  schedules whose outputs differ from the first one. Outputs are compared bit for bit (NaNs equal)."""
  for p in policies:
    if p not in DMA_POLICIES:
      raise UsageError(f"explore_schedules policies={policies!r}: {p!r} is not one of {DMA_POLICIES}. "
                       f"Fix: pass policies from {DMA_POLICIES}.")
  validate.as_callable(fn, "explore_schedules(fn)", hint="pass the function to run, e.g. "
                       "pl.explore_schedules(lambda: f(x)).")
  seeds = [validate.as_int(s, f"explore_schedules seeds[{i}]") for i, s in enumerate(seeds)]
  runs = [(p, 0, p) for p in policies] + [("random", s, f"random seed={s}") for s in seeds]
  if not runs:
    raise UsageError("explore_schedules needs at least one policy or seed to run. Fix: pass "
                     "policies=('eager', 'on_wait') or seeds=(0, 1).")
  ref = None
  labels, divergences = [], []
  for policy, seed, label in runs:
    labels.append(label)
    try:
      with VirtualTPU(chip, num_chips, dma_policy=policy, seed=seed, trace=False,
                      detect_races=detect_races, **tpu_kwargs):
        result = fn(*args)
    except Exception as e:  # noqa: BLE001  a schedule-dependent error is a finding
      if ref is None and not divergences and label == runs[0][2]:
        raise
      divergences.append(Divergence(label, 0, float("nan"), (), f"{type(e).__name__}: {e}"))
      continue
    leaves = [np.asarray(x) for x in tree_flatten(result)[0]]
    if ref is None:
      ref = (result, leaves)
      continue
    divergences += _compare(ref[1], leaves, label)
  return ScheduleReport(tuple(labels), tuple(divergences), None if ref is None else ref[0])
