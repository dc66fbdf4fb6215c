"""JAX's Pallas TPU tutorials, run unmodified on palace.jax (needs JAX for running; reading needs nothing).

The tutorials are not part of palace: they are read from a JAX checkout given by the user
(`PALACE_JAX_DOCS=<dir containing docs/pallas>`, e.g. a `git clone` of jax-ml/jax or an unpacked
`git archive`). For each tutorial this module

1. extracts the code cells of its notebook (`.ipynb`: the code cells with their published outputs; a
   notebook written as one markdown cell contributes its ```python fences, each followed by an
   optional plain ``` fence of published output),
2. turns them into a script with ONE added line, `import palace.jax; palace.jax.activate(CHIP, ...)`
   (`script`), translating the only non-Python syntax they use, IPython's `%timeit EXPR`, into
   `palace.jax.timeit_line(lambda: EXPR)`,
3. runs the cells in order in one namespace, as a notebook does (`run`: each cell's stdout plus the
   repr of a final expression, each error recorded and the next cell run), in a fresh process per
   tutorial (`run_isolated`: the chip, the host device count and the process-wide engine differ per
   tutorial), and compares what each cell printed with the published output, line by line after
   whitespace normalisation. Lines that report a measured time (`TIMING_LINE`) are not compared:
   they are modelled times now.

The notebooks were published with older JAX versions; `--api-fixes` (off by default) ports the few
lines that no longer run on jax 0.12 (`API_FIXES`, `API_CONFIG`, each applied edit listed per cell),
so the kernels behind them are exercised too.

`python -m palace._src.tools.tutorials [--docs DIR] [--json FILE] [--scripts DIR] [--api-fixes]
[NAME ...]` runs them and prints one line per tutorial (docs/jax.md, "Tutorials").
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Tutorial:
  """Where a tutorial's notebook is (relative to the checkout) and the virtual TPU it runs on: the
  generation and device count its published outputs were produced on (JAX's notebooks say so)."""
  name: str
  notebook: str
  chip: str
  num_chips: int = 1


TUTORIALS = {t.name: t for t in (
    Tutorial("quickstart", "docs/pallas/quickstart.ipynb", "v5e"),
    Tutorial("pipelining", "docs/pallas/tpu/pipelining.ipynb", "v5e"),
    Tutorial("matmul", "docs/pallas/tpu/matmul.ipynb", "v5e"),
    Tutorial("sparse", "docs/pallas/tpu/sparse.ipynb", "v5e"),
    Tutorial("distributed", "docs/pallas/tpu/distributed.ipynb", "v4", 4),
    Tutorial("core_map", "docs/pallas/tpu/core_map.ipynb", "v5p", 4),
    Tutorial("sparsecore", "docs/pallas/tpu/sparsecore.ipynb", "7x"),
    Tutorial("tpu_quickstart", "docs/pallas/tpu/quickstart.ipynb", "v5e"),
)}

# Opt-in (`--api-fixes`): the smallest source edits that port a tutorial line written for an older JAX
# to jax 0.12, each (tutorial, regex, replacement, why). Off by default: the tutorials run unmodified.
API_FIXES = (
    ("core_map", re.escape("len(tc_mesh.devices)"), "tc_mesh.num_cores",
     "jax 0.12's TensorCoreMesh has num_cores, no devices"),
    ("distributed", re.escape("pltpu.TPUMemorySpace.VMEM"), "pltpu.VMEM",
     "pltpu.TPUMemorySpace is gone in jax 0.12"),
    ("distributed", r"\b(input_arr|pallas_result|xla_result)\[", r"jax.device_get(\1)[",
     "jax 0.12's make_mesh axes are Explicit: a strided x[0, ::128] of a sharded array is refused, "
     "so the printed samples are taken on the host"),
    ("sparse", re.escape("str(mask_block)"), "np.array2string(np.asarray(mask_block))",
     "jax 0.12 prints an array of 1 MiB or more as Array(shape=..., dtype=...), so sparsify_mask's "
     "str-keyed dedup of 512x512 mask blocks gave every block the first block's mask; NumPy's "
     "summarised text keys them as the JAX of the notebook did"),
)

# and, with the same option, the JAX default the published notebooks were run with: they predate JAX
# 0.5's flip of jax_threefry_partitionable, so their jax.random values (printed inputs) differ otherwise
API_CONFIG = (("jax_threefry_partitionable", False),)

# a published output line that reports a measured time (or a figure derived from one)
TIMING_LINE = re.compile(r"\btime\b|FLOP/s|utilization|\bms\b|µs|per loop|\bns\b", re.IGNORECASE)


@dataclasses.dataclass
class Cell:
  index: int            # position among the tutorial's code cells (0-based)
  source: str
  published: str | None  # the notebook's recorded text output (stdout + displayed value), if any


def docs_dir(explicit=None) -> Path | None:
  """The JAX checkout to read (argument, else PALACE_JAX_DOCS), or None when none is given."""
  value = explicit or os.environ.get("PALACE_JAX_DOCS", "").strip()
  if not value:
    return None
  path = Path(value).expanduser()
  if not (path / "docs" / "pallas").is_dir():
    from palace._src.errors import UsageError  # noqa: PLC0415
    raise UsageError(f"PALACE_JAX_DOCS={value!r} has no docs/pallas folder; expected the root of a "
                     f"JAX checkout. Fix: point it at a JAX source tree (e.g. `git clone "
                     f"https://github.com/jax-ml/jax`).")
  return path


def _text(value) -> str:
  return "".join(value) if isinstance(value, list) else (value or "")


def _fenced(markdown: str):
  """(code, published output or None) for each ```python fence of a markdown cell."""
  fence = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
  found = [(m.group(1).strip(), m.group(2), m.start(), m.end()) for m in fence.finditer(markdown)]
  for i, (lang, body, _, end) in enumerate(found):
    if lang != "python":
      continue
    out = None
    if i + 1 < len(found) and found[i + 1][0] == "" and markdown[end:found[i + 1][2]].strip() == "":
      out = found[i + 1][1]
    yield body, out


def cells(tutorial: Tutorial, root: Path) -> list[Cell]:
  """The code cells of a tutorial's notebook, with their published outputs."""
  nb = json.loads((root / tutorial.notebook).read_text())
  out: list[Cell] = []
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  if code:
    for c in code:
      published = []
      for o in c.get("outputs", ()):
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
          published.append(_text(o.get("text")))
        elif o.get("output_type") == "execute_result":
          published.append(_text(o.get("data", {}).get("text/plain")) + "\n")
      out.append(Cell(len(out), _text(c["source"]), "".join(published) if published else None))
  else:
    for c in nb["cells"]:
      for body, published in _fenced(_text(c["source"])):
        out.append(Cell(len(out), body, published))
  return out


_MAGIC = re.compile(r"^(\s*)%timeit\s+(.*)$")


def python_source(source: str) -> str:
  """A cell's source as Python: `%timeit EXPR` -> `palace.jax.timeit_line(lambda: (EXPR))`."""
  lines = []
  for line in source.splitlines():
    m = _MAGIC.match(line)
    lines.append(f"{m.group(1)}palace.jax.timeit_line(lambda: ({m.group(2).strip()}))" if m else line)
  return "\n".join(lines) + "\n"


def activation_line(tutorial: Tutorial) -> str:
  extra = f", num_chips={tutorial.num_chips}" if tutorial.num_chips > 1 else ""
  return f'import palace.jax; palace.jax.activate("{tutorial.chip}"{extra})'


def script(tutorial: Tutorial, root: Path) -> str:
  """The tutorial as a script: its code cells, one added activation line at the top."""
  parts = [f"# {tutorial.notebook} from the JAX checkout at {root}, run on palace "
           f"(palace._src.tools.tutorials)", activation_line(tutorial)]
  for c in cells(tutorial, root):
    parts.append(f"\n# %% code cell {c.index}\n{python_source(c.source)}")
  return "\n".join(parts) + "\n"


def _run_cell(source: str, namespace: dict) -> None:
  """Execute like a notebook cell: a final expression statement is displayed (its repr printed)."""
  tree = ast.parse(source)
  last = tree.body[-1] if tree.body else None
  display = isinstance(last, ast.Expr) and not source.rstrip().endswith(";")
  body = ast.Module(tree.body[:-1] if display else tree.body, type_ignores=[])
  exec(compile(body, "<cell>", "exec"), namespace)
  if display:
    value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
    if value is not None:
      print(repr(value))


def _normal(text: str) -> list[str]:
  return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def compare(printed: str, published: str) -> dict:
  """Line-by-line comparison, timing lines excluded: {matched, compared, timing_lines, diff}."""
  ours, theirs = _normal(printed), _normal(published)
  keep = lambda lines: [l for l in lines if not TIMING_LINE.search(l)]
  a, b = keep(ours), keep(theirs)
  return {"matched": a == b, "compared": len(b), "timing_lines": len(theirs) - len(b),
          "lines_matched": sum(x == y for x, y in zip(a, b)),
          "diff": [] if a == b else [f"published: {x!r}  palace: {y!r}"
                                     for x, y in zip(b + [""] * len(a), a + [""] * len(b)) if x != y][:5]}


# a float comparison the tutorial makes exactly (assert_array_equal, or assert_allclose's default
# rtol=1e-7) against a reference XLA computed on the host CPU (a different summation order than
# palace's kernel and than a TPU): also accepted within rounding, max|a - b| <= tol * max|b|, and
# recorded as such (`rounding_asserts`) so it is never mistaken for an exact match
ROUNDING_TOL = {2: 1e-2, 4: 1e-5, 8: 1e-12}   # by itemsize: bf16/f16, f32, f64


def _within_rounding(actual, desired) -> str | None:
  import numpy as np  # noqa: PLC0415
  try:
    a, d = np.asarray(actual), np.asarray(desired)
  except Exception:  # noqa: BLE001
    return None
  kinds = [x.dtype for x in (a, d) if x.dtype.kind == "f" or "float" in x.dtype.name]
  if not kinds or a.shape != d.shape:
    return None
  tol = max(ROUNDING_TOL.get(k.itemsize, 1e-5) for k in kinds)
  a64, d64 = a.astype(np.float64), d.astype(np.float64)
  scale = float(np.max(np.abs(d64))) if d64.size else 0.0
  err = float(np.max(np.abs(a64 - d64))) if d64.size else 0.0
  if err <= tol * scale:
    return f"max|diff| {err:.3g} = {err / scale if scale else 0:.2g} x max|reference| (tolerance {tol:g})"
  return None


@contextlib.contextmanager
def _rounding_asserts(notes: list):
  """np.testing's exact float asserts, as called by the tutorial: accepted within rounding, noted."""
  import numpy as np  # noqa: PLC0415
  saved = {n: getattr(np.testing, n) for n in ("assert_allclose", "assert_array_equal")}

  def wrap(name, original):
    def checked(actual, desired, *args, **kwargs):
      try:
        return original(actual, desired, *args, **kwargs)
      except AssertionError:
        if sys._getframe(1).f_globals.get("__name__") != "__main__":
          raise
        why = _within_rounding(actual, desired)
        if why is None:
          raise
        notes.append(f"{name} holds within rounding only: {why}")
    return checked

  for n, f in saved.items():
    setattr(np.testing, n, wrap(n, f))
  try:
    yield
  finally:
    for n, f in saved.items():
      setattr(np.testing, n, f)


def _original_error(e: BaseException, errors_before: int = 0) -> BaseException:
  """palace's own error for one raised inside a launch's callback during this cell (XLA re-raises
  it wrapped, as a JaxRuntimeError or a ValueError naming the host callback)."""
  from palace._src.errors import PalaceError  # noqa: PLC0415
  from palace._src.jax.activation import active_engine  # noqa: PLC0415
  engine = active_engine()
  if engine is not None and len(engine.errors) > errors_before and not isinstance(e, PalaceError):
    cause = engine.errors[-1]
    del engine.errors[errors_before:]
    return cause
  return e


def _apply_fixes(name: str, source: str, applied: list) -> str:
  for tutorial, pattern, replacement, why in API_FIXES:
    if tutorial == name and re.search(pattern, source):
      source = re.sub(pattern, replacement, source)
      applied.append(f"{pattern!r} -> {replacement!r} ({why})")
  return source


def run(name: str, root: Path, api_fixes: bool = False) -> dict:
  """Run one tutorial in this process (activates palace process-wide); one result dict per cell.
  With api_fixes, the API_FIXES edits for this tutorial are applied (and listed per cell)."""
  tutorial = TUTORIALS[name]
  import palace.jax  # noqa: PLC0415
  tpu = palace.jax.activate(tutorial.chip, tutorial.num_chips)
  from palace._src.jax.activation import active_engine  # noqa: PLC0415
  engine = active_engine()
  if api_fixes:
    import jax  # noqa: PLC0415
    for option, value in API_CONFIG:
      jax.config.update(option, value)
  namespace = {"__name__": "__main__", "palace": palace}
  results = []
  for c in cells(tutorial, root):
    buf = io.StringIO()
    start = len(tpu.reports)
    entry = {"cell": c.index, "ok": True, "error": None, "launches": 0, "rounding_asserts": [],
             "api_fixes": []}
    t0 = time.perf_counter()
    errors_before = len(engine.errors)
    try:
      with contextlib.redirect_stdout(buf), _rounding_asserts(entry["rounding_asserts"]):
        source = python_source(c.source)
        _run_cell(_apply_fixes(name, source, entry["api_fixes"]) if api_fixes else source, namespace)
    except Exception as e:  # noqa: BLE001  (a notebook records the error and goes on)
      entry["ok"] = False
      frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<cell>"]
      where = f" (cell line {frames[-1].lineno})" if frames else ""
      cause = _original_error(e, errors_before)
      message = str(cause).strip()
      entry["error"] = f"{type(cause).__name__}{where}: {message.splitlines()[0] if message else ''}"[:400]
      entry["traceback"] = "".join(traceback.format_exception(cause)[-6:])[-3000:]
    entry["launches"] = len(tpu.reports) - start
    entry["wall_s"] = round(time.perf_counter() - t0, 2)
    print(f"palace: {name} cell {c.index}: {'ok' if entry['ok'] else entry['error'][:120]} "
          f"({entry['wall_s']} s host time)", file=sys.__stderr__, flush=True)
    entry["stdout"] = buf.getvalue()
    if c.published is not None:
      entry["published"] = c.published
      entry.update(compare(buf.getvalue(), c.published))
      entry["matched"] = entry["matched"] and entry["ok"] and entry["compared"] > 0
    results.append(entry)
  return {"name": name, "chip": tutorial.chip, "num_chips": tutorial.num_chips, "cells": results}


def summary(result: dict) -> dict:
  cells_ = result["cells"]
  published = [c for c in cells_ if "published" in c]
  with_output = [c for c in published if c["compared"]]   # a deterministic published output
  return {"cells": len(cells_), "ran": sum(c["ok"] for c in cells_),
          "with_output": len(with_output), "matched": sum(c["matched"] for c in with_output),
          "timing_cells": [c["cell"] for c in published if not c["compared"]],
          "lines": sum(c["compared"] for c in with_output),
          "lines_matched": sum(c["lines_matched"] for c in with_output),
          "launches": sum(c["launches"] for c in cells_),
          "rounding": [(c["cell"], n) for c in cells_ for n in c["rounding_asserts"]],
          "failed": [(c["cell"], c["error"]) for c in cells_ if not c["ok"]],
          "mismatched": [(c["cell"], c["diff"]) for c in with_output if not c["matched"]]}


def run_isolated(name: str, root: Path, timeout_s: float | None = None, verbose=False,
                 api_fixes: bool = False) -> dict:
  """Run one tutorial in a fresh Python process (the host device count is fixed per process)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PALACE_JAX="")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count="
                      f"{max(TUTORIALS[name].num_chips, 1)}").strip()
  proc = subprocess.run([sys.executable, "-m", "palace._src.tools.tutorials", "--one", name,
                         "--docs", str(root), *(["--api-fixes"] if api_fixes else [])], env=env, stdout=subprocess.PIPE,
                        stderr=None if verbose else subprocess.PIPE, text=True, timeout=timeout_s)
  tail = proc.stdout.strip().splitlines()
  if proc.returncode != 0 or not tail:
    raise RuntimeError(f"tutorial {name!r}: the runner process failed (exit {proc.returncode}):\n"
                       f"{(proc.stderr or '')[-3000:]}")
  return json.loads(tail[-1])


def main(argv=None) -> int:
  import argparse  # noqa: PLC0415
  p = argparse.ArgumentParser(prog="python -m palace._src.tools.tutorials",
                              description="Run JAX's Pallas TPU tutorials on palace.jax.")
  p.add_argument("names", nargs="*", help=f"tutorials (default: all): {', '.join(TUTORIALS)}")
  p.add_argument("--docs", help="JAX checkout (default: $PALACE_JAX_DOCS)")
  p.add_argument("--json", help="write every cell's result here")
  p.add_argument("--scripts", help="also write each tutorial as a script into this folder")
  p.add_argument("--api-fixes", action="store_true",
                  help="port the few lines written for an older JAX (API_FIXES) before running")
  p.add_argument("--one", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  root = docs_dir(args.docs)
  if root is None:
    print("palace: no JAX checkout: set PALACE_JAX_DOCS=<dir with docs/pallas> or pass --docs",
          file=sys.stderr)
    return 2
  if args.one:
    result = run(args.one, root, api_fixes=args.api_fixes)
    sys.stdout.flush()
    print("\n" + json.dumps(result), file=sys.__stdout__)
    return 0
  names = args.names or list(TUTORIALS)
  unknown = [n for n in names if n not in TUTORIALS]
  if unknown:
    print(f"palace: unknown tutorial(s) {unknown}; expected some of {list(TUTORIALS)}", file=sys.stderr)
    return 2
  results = {}
  for name in names:
    if args.scripts:
      Path(args.scripts).mkdir(parents=True, exist_ok=True)
      (Path(args.scripts) / f"{name}.py").write_text(script(TUTORIALS[name], root))
    results[name] = run_isolated(name, root, verbose=True, api_fixes=args.api_fixes)
    s = summary(results[name])
    print(f"{name:15s} cells {s['ran']}/{s['cells']} ran, outputs {s['matched']}/{s['with_output']} "
          f"cells ({s['lines_matched']}/{s['lines']} lines) matched, {s['launches']} launches"
          + (f", timing-only outputs in cells {s['timing_cells']}" if s["timing_cells"] else ""))
    for cell, note in s["rounding"]:
      print(f"    cell {cell}: {note}")
    for cell, error in s["failed"]:
      print(f"    cell {cell}: {error}")
    for cell, diff in s["mismatched"]:
      print(f"    cell {cell} output differs: {diff[:2]}")
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
