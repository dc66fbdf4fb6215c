"""Model-driven autotuning (L5): rank kernel configurations by their modelled time on a virtual TPU.

Every configuration runs once under `pl.virtual_tpu(chip, timing_only=True, trace=False)`: the kernel
executes its control flow, DMAs and semaphores but skips the arithmetic, so a sweep over large shapes is
cheap. Configurations that break a hardware limit (VMEM capacity, block tiling) are kept in the result with
the error that rejected them, so the ranking also says why a candidate is not on it.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any, Callable, Iterable

from palace._src import validate
from palace._src.errors import BlockSpecError, PalaceError, ResourceError, UsageError
from palace._src.sim.machine import VirtualTPU

#: Errors that mean "this configuration does not fit the hardware", not "the kernel is wrong".
REJECT = (ResourceError, BlockSpecError)


def format_config(config) -> str:
  """`bm=512 bk=1024 bn=1024` for a dict, repr otherwise."""
  if isinstance(config, dict):
    return " ".join(f"{k}={v}" for k, v in config.items())
  return repr(config)


@dataclasses.dataclass(frozen=True)
class Trial:
  """One evaluated configuration: its last launch report, or the error that rejected it."""
  index: int
  config: Any
  report: Any = None          # sim.report.Report of the config's last launch
  error: PalaceError | None = None

  @property
  def ok(self) -> bool:
    return self.error is None

  @property
  def time_s(self) -> float:
    """Modelled device time of all launches of this config (inf when rejected)."""
    return self.report.device_time_s if self.ok else math.inf

  @property
  def reason(self) -> str:
    """Why the config was rejected: error class and the first line of its message ('' when kept)."""
    if self.ok:
      return ""
    return f"{type(self.error).__name__}: {str(self.error).splitlines()[0]}"


  @property
  def short_reason(self) -> str:
    """`reason` in a few words: for VMEM, the requested and available bytes."""
    if self.ok:
      return ""
    msg = str(self.error).splitlines()[0]
    req = re.search(r"([\d.]+ [KMG]?i?B) requested", msg)
    lim = re.search(r"limit leaves ([\d.]+ [KMG]?i?B)", msg)
    if req and lim:
      return f"{type(self.error).__name__}: VMEM {req.group(1)} requested, {lim.group(1)} available"
    return f"{type(self.error).__name__}: {msg[:100]}"


@dataclasses.dataclass
class AutotuneResult:
  """Trials in evaluation order; `ranking` sorts the kept ones by modelled time, rejected ones last."""
  chip: str
  trials: list

  @property
  def ranking(self) -> list:
    kept = sorted((t for t in self.trials if t.ok), key=lambda t: (t.time_s, t.index))
    return kept + self.rejected

  @property
  def rejected(self) -> list:
    return [t for t in self.trials if not t.ok]

  @property
  def best(self) -> Trial:
    """The fastest kept trial; raises UsageError when every configuration was rejected."""
    for t in self.ranking:
      if t.ok:
        return t
    reasons = "; ".join(f"{format_config(t.config)}: {t.reason}" for t in self.trials[:3])
    raise UsageError(f"autotune on {self.chip}: all {len(self.trials)} configurations were rejected "
                     f"({reasons}{'; ...' if len(self.trials) > 3 else ''}). Fix: try smaller blocks (or a "
                     f"chip with more VMEM) so that some configuration fits.")

  @property
  def best_config(self):
    return self.best.config

  def __str__(self) -> str:
    kept = [t for t in self.ranking if t.ok]
    lines = [f"autotune on {self.chip}: {len(kept)} of {len(self.trials)} configurations fit"]
    best = kept[0].time_s if kept else math.inf
    for rank, t in enumerate(self.ranking, 1):
      if t.ok:
        lines.append(f"  {rank:>3}. {format_config(t.config):<32} {t.time_s * 1e6:>12,.1f} us "
                     f"({t.time_s / best:5.2f}x)  {t.report.bound}")
      else:
        lines.append(f"    -  {format_config(t.config):<32} rejected: {t.short_reason}")
    return "\n".join(lines)


def _expand(configs) -> list:
  hint = ("pass a list of configurations ([{'bm': 256}, {'bm': 512}]) or a dict of lists whose product "
          "is taken ({'bm': [256, 512], 'bn': [512, 1024]}).")
  if isinstance(configs, dict):  # {"bm": [..], "bn": [..]} -> cartesian product, in key order
    keys = list(configs)
    for k in keys:
      if isinstance(configs[k], (str, bytes)) or not hasattr(configs[k], "__iter__"):
        raise UsageError(f"autotune configs[{k!r}] = {configs[k]!r} is not a list of values. Fix: {hint}")
    return [dict(zip(keys, vals)) for vals in itertools.product(*(list(configs[k]) for k in keys))]
  if isinstance(configs, (str, bytes)) or not hasattr(configs, "__iter__"):
    raise UsageError(f"autotune configs = {configs!r} ({type(configs).__name__}) is not a collection of "
                     f"configurations. Fix: {hint}")
  return list(configs)


def autotune(make_call: Callable, configs: Iterable | dict, args=(), *, chip="v5e", num_chips: int = 1,
             reject: tuple = REJECT, progress: Callable | None = None) -> AutotuneResult:
  """Rank `configs` by the modelled time of `make_call(config)(*args)` on a virtual TPU.

  Args:
    make_call: `config -> callable`; typically builds a `pl.pallas_call` from block sizes in `config`.
    configs: an iterable of configurations (any value, usually dicts), or a dict of lists whose
      cartesian product is taken (`{"bm": [256, 512], "bn": [512, 1024]}`).
    args: operands passed to each call (NumPy arrays; their contents are not read in timing-only runs,
      except scalar-prefetch operands that index maps read).
    chip: chip preset name or `ChipSpec` (`"v4"`, `"v5e"`, `"v5p"`, `"v6e"`, `"7x"`).
    num_chips: chips of the virtual system.
    reject: error classes that mean "does not fit the hardware"; such configs are recorded with the
      reason. Any other error propagates: it points at a bug in the kernel, not at the config.
    progress: optional `progress(done, total, trial)` callback, called after each configuration.

  Returns:
    An `AutotuneResult` with `.ranking`, `.best`, `.best_config` and `.rejected`.

  Example:
    >>> res = pl.autotune(lambda c: make_matmul(**c), {"bm": [256, 512], "bk": [512, 1024],
    ...                                               "bn": [512, 1024]}, (x, y), chip="v5e")
    >>> res.best_config
    {'bm': 512, 'bk': 1024, 'bn': 1024}
  """
  validate.as_callable(make_call, "autotune(make_call)", hint="pass a function config -> callable, "
                       "e.g. lambda c: make_matmul(**c).")
  cfgs = _expand(configs)
  if not cfgs:
    raise UsageError("autotune got no configurations to evaluate. Fix: pass at least one configuration.")
  args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
  trials = []
  chip_name = None
  for i, cfg in enumerate(cfgs):
    tpu = VirtualTPU(chip, num_chips, timing_only=True, trace=False)
    chip_name = tpu.chip.name
    try:
      with tpu:
        fn = make_call(cfg)
        validate.as_callable(fn, f"autotune: make_call({format_config(cfg)})", hint=(
            "make_call(config) must return the function to time, e.g. a pl.pallas_call(...) built "
            "from the config."))
        fn(*args)
    except reject as e:
      trial = Trial(i, cfg, None, e)
    else:
      if not tpu.reports:
        raise UsageError(f"autotune: config {format_config(cfg)} launched no kernel; make_call(config) "
                         f"must return a callable that runs pl.pallas_call or pl.kernel. Fix: return the "
                         f"launch itself, e.g. lambda: pl.pallas_call(kernel, ...)(x).")
      trial = Trial(i, cfg, _combined(tpu.reports))
    trials.append(trial)
    if progress is not None:
      progress(i + 1, len(cfgs), trial)
  return AutotuneResult(chip_name, trials)


def _combined(reports):
  """The report when one launch ran; several launches: the last report with the summed device time."""
  if len(reports) == 1:
    return reports[0]
  last = reports[-1]
  return dataclasses.replace(last, device_cycles=sum(r.device_cycles for r in reports),
                             flops=sum(r.flops for r in reports),
                             hbm_bytes=sum(r.hbm_bytes for r in reports),
                             unit_busy_cycles={u: sum(r.unit_busy_cycles.get(u, 0) for r in reports)
                                               for u in last.unit_busy_cycles})


def block_candidates(dim: int, lo: int = 128, hi: int = 2048) -> list:
  """Powers of two in [lo, hi] that divide `dim` (or [dim] when none does)."""
  out = []
  b = lo
  while b <= min(dim, hi):
    if dim % b == 0:
      out.append(b)
    b *= 2
  return out or [dim]
