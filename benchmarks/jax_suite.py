"""JAX's own Pallas TPU test suite with palace as the engine: per file passed / failed / skipped / timed out,
and every failure grouped by its first error line.

    .venv-jax/bin/python -m benchmarks.jax_suite --jax PATH_TO_JAX_CHECKOUT [--only SUBSTR,...]
        [--per-test 60] [--per-file 1800] [--workers 2] [--out palace-out/jax_suite]

Nothing is fetched: PATH is a JAX source tree (its `tests/pallas/tpu_*.py` are run where they lie, with
the installed jax, 0.12). Each file runs in its own `pytest -p palace.jax` process with PALACE_JAX set to
the chip (and chip count) a TPU user would pick for it (`CHIPS` below: SparseCore tests on 7x, four
for the distributed ones, megacore on v5p, multi-device tests on 4 v5e chips, the rest on one v5e), XLA given that many host
devices, JAX's test utilities told the device is that TPU (the plugin: palace/_src/jax/pytest_plugin.py).
Per-test limit: pytest-timeout (`--timeout`; installed with `pip install pytest-timeout`); per-file
limit: the process is stopped and its remaining tests counted as not run. Results come from pytest's
JUnit XML; the table goes to stdout and `OUT/summary.md`, the raw per-test outcomes to `OUT/results.json`.

JAX's test-only helper modules that the wheel leaves out (`jax._src.hypothesis_test_util`, ...) are
taken from the checkout (`benchmarks/jax_suite_paths.py`); a file that still does not import with the
installed jax (a checkout newer or older than it) is counted "not collected", with the reason.
Tests that need a real compiler (Mosaic MLIR text, compile-only APIs) fail with palace's
UnsupportedError naming that reason, or are the test's own check of what a TPU compile gives (the
lowered or compiled program's text, XLA's cost analysis, the MLIR a debug=True call prints, the
compiler's wording of an over-capacity error palace raised too: `reads_compiler_output`); they are
counted apart ("needs a compiler") from failures. A test that reads a name the installed jax removed
(JAX's "was deprecated in JAX v..., and removed in JAX v..." AttributeError, e.g. pltpu.HOST) is
counted "needs another jax": written for another jax, it cannot run on a TPU with this one either;
so is a test whose kernel the installed jax itself refuses while tracing it (no palace frame: the
error comes before any engine sees the kernel, `jax_refuses_when_tracing`), and one whose
assertRaisesRegex expects a message no file of the installed jax or jaxlib holds
(`expects_message_jax_lacks`). The Hypothesis tests of JAX's `HypothesisShardedTestCase` classes run
split into the shards JAX's CI gives their file (`shard_count` in tests/pallas/BUILD), each shard a test
held to the per-test limit, folded back into one row (`fold_shards`; benchmarks/jax_suite_hypothesis.py).

Two more classes are set apart from "failed", each by evidence per test (`classify`):
- "reference on XLA:CPU": a numeric assertion (NumPy's array comparison) that passes when the test is
  re-run (once, all such tests of the file in one process) under PALACE_JAX_EXACT_F32_DOTS=1, the
  diagnostic under which palace multiplies DEFAULT-precision float32 dot operands unrounded, as XLA:CPU
  computes the test's reference, instead of rounded to bfloat16 as the chip does (lang/mxu.py). On a
  TPU the reference rounds as the kernel does; only the exact CPU reference makes them differ.
  `--no-recheck` skips the re-run (they then stay "failed").
- "dot order on XLA:CPU": a numeric failure still failing after that re-run that passes when re-run
  (once more, those tests of the file in one process) under PALACE_JAX_SHARED_DOTS=1, the diagnostic
  under which palace's kernels and XLA:CPU's dots outside them (the test's reference) sum every float
  dot by one rule, exact per 128 of K with the chunks added in float32 in order, and XLA:CPU rounds
  DEFAULT-precision float32 operands to bfloat16 as the chip's XLA does (palace/_src/jax/shared_dots.py).
  On a TPU the kernel and its reference run on the same MXU: a K-tiled kernel's accumulation and XLA's
  one dot agree there (JAX's test_stateful_matmul asserts bit equality on v5e; benchmarks/hw/
  probes_s22.py measures it); under palace they are summed in two orders (the host BLAS's and
  XLA:CPU's Eigen). Also skipped by `--no-recheck`.
- "math on XLA:CPU": a numeric failure the two re-runs leave failing that passes when re-run (once more)
  under PALACE_JAX_HOST_MATH=1 with PALACE_JAX_SHARED_DOTS=1: the kernel's transcendentals (exp, log,
  tanh, erf_inv, ...) evaluated by XLA:CPU, as the test's reference outside the kernel is
  (lang/host_math.py), with the dots shared as before. On a TPU the kernel and its reference share the
  chip's functions (benchmarks/hw/data/v5e-probes-s22-*.jsonl); XLA:CPU's differ in the last bits (its
  own exp, log, tanh; fused multiply-adds in its erf_inv). Also skipped by `--no-recheck`.
- "reference fails on XLA:CPU": XLA:CPU itself raised (a JaxRuntimeError, e.g. "Unsupported element
  type for DotThunk::Execute: BF16 x BF16 = F32") running code outside the kernel: no frame of the
  traceback is palace's or JAX's Pallas code, and no palace callback error is wrapped in it.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

# file stem -> PALACE_JAX value; the first matching substring wins, default v5e (SparseCore's
# distributed tests skip themselves on fewer than two devices)
CHIPS = (("sparsecore_pallas_distributed", "7x:4"), ("sparsecore", "7x"), ("megacore", "v5p"),
         ("core_map", "v5p"), ("distributed", "v5e:4"), ("async", "v5e:4"), ("collective", "v5e:4"),
         ("all_gather", "v5e:4"), ("", "v5e"))
# palace's own refusals of compiler-only queries, and tests that read the compiled program's text (the
# HLO or StableHLO of a TPU compile: memory-space colours, Mosaic custom calls, mesh axes), which an
# engine running the kernel on the host cannot give
NEEDS_COMPILER = re.compile(r"needs a real compiler|Mosaic MLIR|compile-only|not found in '(HloModule|module @)",
                            re.I)


# a test's own check of what only a TPU compile gives, read from the test's source in the traceback
# (the lines of its frame above the failing '>' line): the lowered or compiled program's text
# (`compiler_ir()`, `as_text()`, `pl.lower_as_mlir`), XLA's cost analysis of it, or the Mosaic MLIR a
# `debug=True` pallas_call prints on a TPU (read through `capture_stdout`)
_COMPILER_READS = re.compile(r"\.compiler_ir\(|\.as_text\(|\.cost_analysis\(|lower_as_mlir\(|"
                             r"capture_stdout\(\)(?s:.*)debug=True|debug=True(?s:.*)capture_stdout\(\)")
# the failure is raised by the test's own statement (its frame is the last location: a file of the
# suite, tests/pallas/...), as an assertion or a failed match (`re.search(...).group` on no match)
_OWN_CHECK = re.compile(r"^tests[/\\]pallas[/\\]\w+\.py:\d+: (AssertionError|AttributeError)\s*$", re.M)
# an error palace raised where the compiler raises its own (VMEM / SMEM over capacity), which the test
# matches by the compiler's wording (assertIn's "not found in", or assertRaisesRegex's "does not match"
# of the message of the error palace.jax raised where the compiler does, at lowering)
_COMPILER_WORDING = re.compile(r"AssertionError: .* (not found in ['\"](.*ResourceError(: \w+)?: )?|"
                               r"does not match \")(VMEM|SMEM) over capacity", re.S)


# a name the checkout's test uses that the installed jax removed (JAX's deprecation module raises it
# when the test reads the name, e.g. pltpu.HOST in a checkout older than jax 0.12): the test was written
# for another jax, and neither palace nor a TPU running the installed jax can run it
_REMOVED_API = re.compile(r"AttributeError: \S+ was deprecated in JAX v[\d.]+, and removed in JAX v[\d.]+")


_PALACE_FRAME = re.compile(r"(^|[/\\])palace[/\\]", re.M)
_LAST_LOCATION = re.compile(r"^(\S+\.py):\d+: \w+\s*$", re.M)


def jax_refuses_when_tracing(text: str) -> bool:
  """The installed jax itself raised while tracing the test's kernel (`_trace_kernel_to_jaxpr` in the
  traceback, the error raised inside jax, no frame of palace's): the same happens on a TPU with this
  jax, before any engine sees the kernel (a checkout written for another jax, e.g. an out-of-bounds
  `pl.ds` read that a newer jax lets `disable_bounds_checks` allow)."""
  text = text or ""
  if "in _trace_kernel_to_jaxpr" not in text or _PALACE_FRAME.search(text):
    return False
  last = _LAST_LOCATION.findall(text)
  return bool(last) and re.search(r"[/\\]jax[/\\]_src[/\\]", last[-1]) is not None


def reads_compiler_output(text: str) -> bool:
  """The failure is the test's own check of a compiler artifact (`_COMPILER_READS` in the test's source
  above the failing line, the failure raised by that check, not a numeric comparison), or of the
  compiler's wording of an over-capacity error palace raised too (`_COMPILER_WORDING`)."""
  text = text or ""
  if _COMPILER_WORDING.search(text):
    return True
  head, sep, _ = text.partition("\n>")
  return bool(sep and _OWN_CHECK.search(text) and not is_numeric_assertion(text) and
              _COMPILER_READS.search(head))


def shard_count(checkout: str, stem: str) -> int:
  """The `shard_count` JAX's CI gives the test target `stem` in the checkout's tests/pallas/BUILD (its
  "tpu" entry where it is per backend), 1 where none is given. The runner's plugin splits the examples
  of a HypothesisShardedTestCase's tests across that many shard tests, as JAX's CI does
  (benchmarks/jax_suite_hypothesis.py); other tests are not affected."""
  try:
    with open(os.path.join(checkout, "tests", "pallas", "BUILD")) as f:
      text = f.read()
  except OSError:
    return 1
  target = re.search(r'\n\s*name = "%s",(.*?)\n\)' % re.escape(stem), text, re.S)
  if not target:
    return 1
  count = re.search(r'\n\s*shard_count = (\d+|\{[^}]*\})', target.group(1))
  if not count:
    return 1
  value = count.group(1)
  if value.isdigit():
    return int(value)
  tpu = re.search(r'"tpu":\s*(\d+)', value)
  return int(tpu.group(1)) if tpu else 1


_SHARD = re.compile(r"^(.*)__shard_(\d+)_of_(\d+)$")
# the outcome a folded test takes from its shards: the first kind in this order that any shard has
_FOLD_ORDER = ("not collected", "failed", "timeout", "reference fails on XLA:CPU", "math on XLA:CPU",
               "dot order on XLA:CPU", "reference on XLA:CPU", "needs another jax", "needs a compiler",
               "passed", "skipped")


def fold_shards(tests: list) -> list:
  """The shard tests `<test>__shard_<k>_of_<N>` (benchmarks/jax_suite_hypothesis.py) folded into one
  test each, in the place of its first shard: its outcome the worst of its shards' (`_FOLD_ORDER`), its
  seconds and CPU seconds the slowest shard's (each shard is held to the per-test limit, as each of
  JAX's CI shards is), the sums and the shard count beside them; the failing shard's first line and
  evidence."""
  groups = {}   # test name -> [its record] or [its shards' records], in first-seen order
  for t in tests:
    m = _SHARD.match(t["name"])
    groups.setdefault(m.group(1) if m else t["name"], []).append(t)
  out = []
  for name, records in groups.items():
    if not _SHARD.match(records[0]["name"]):
      out.extend(records)
      continue
    worst = min(records, key=lambda s: _FOLD_ORDER.index(s["outcome"]) if s["outcome"] in _FOLD_ORDER
                else 0)
    folded = dict(worst, name=name, seconds=max(s["seconds"] for s in records), shards=len(records),
                  seconds_all_shards=round(sum(s["seconds"] for s in records), 2))
    if any("cpu_s" in s for s in records):
      folded["cpu_s"] = max(s.get("cpu_s", 0.0) for s in records)
    out.append(folded)
  return out


def chip_for(stem: str) -> str:
  return next(chip for key, chip in CHIPS if key in stem)


EXACT_F32_DOTS = "PALACE_JAX_EXACT_F32_DOTS"
SHARED_DOTS = "PALACE_JAX_SHARED_DOTS"
HOST_MATH = "PALACE_JAX_HOST_MATH"
# the re-runs of numeric failures, in order: (record key, diagnostic variables, class, evidence); each
# takes the numeric failures the ones before it left "failed"
RECHECKS = (("exact_f32_recheck", (EXACT_F32_DOTS,), "reference on XLA:CPU",
             f"passes when re-run with {EXACT_F32_DOTS}=1 (float32 dots exact, as XLA:CPU)"),
            ("shared_dots_recheck", (SHARED_DOTS,), "dot order on XLA:CPU",
             f"passes when re-run with {SHARED_DOTS}=1 (the kernel's and XLA:CPU's dots summed by one "
             f"rule, float32 operands rounded to bfloat16 on both sides as on the chip)"),
            ("host_math_recheck", (HOST_MATH, SHARED_DOTS), "math on XLA:CPU",
             f"passes when re-run with {HOST_MATH}=1 and {SHARED_DOTS}=1 (the kernel's transcendentals "
             f"XLA:CPU's, as the reference's are, and the dots shared as in the re-run before)"))
# NumPy's array comparisons (np.testing, and jtu.assertAllClose / assertArraysEqual, which use them)
_NUMERIC = re.compile(r"Not equal to tolerance|Arrays are not (almost )?equal|Mismatched elements|"
                      r"Mismatch at ind")
_XLA_ERROR = re.compile(r"^E\s+((jax\.errors\.|jaxlib\.[\w.]+\.)?(JaxRuntimeError|XlaRuntimeError): .*)$",
                        re.M)
_FRAME = re.compile(r"^(\S+\.py):\d+: ", re.M)
# frames that are the kernel call: palace's (any install) or JAX's Pallas front end and lowering
_KERNEL_FRAME = re.compile(r"(^|[/\\])palace[/\\]|[/\\]jax[/\\]_src[/\\]pallas[/\\]")

_WRAPPED = ("Error when calling buffer callback", "CpuCallback error calling callback",
            "JaxStackTraceBeforeTransformation")
_EXC_LINE = re.compile(r"^(E\s+)?([\w.]+(Error|Exception|Exit)): ")


def _first_line(text: str) -> str:
  """The failure's first error line; for an error XLA wrapped around palace's callback (or JAX around a
  lowering), the innermost exception's line instead, which names the cause."""
  lines = (text or "").splitlines()
  if any(w in (text or "") for w in _WRAPPED):
    inner = [ln.strip() for ln in lines if _EXC_LINE.match(ln.strip()) and
             not any(w in ln for w in _WRAPPED)]
    if inner:
      lines = [re.sub(r"^E\s+", "", inner[-1])]
  for line in lines:
    line = line.strip()
    if line and not line.startswith(("Traceback", "File ", "self =", "def ", "@")):
      line = re.sub(r" ?\(kernel line [^()]*(\([^()]*\))?[^()]*\)", "", line)
      return re.sub(r"0x[0-9a-f]+|\d+\.\d+|\(\d+(, \d+)*\)", "#", line)[:160]
  return "(no message)"


def is_numeric_assertion(text: str) -> bool:
  """A failure that is NumPy's array comparison (values differ), the kind the exact-f32-dots re-run
  may explain."""
  return bool(_NUMERIC.search(text or ""))


def xla_cpu_error(text: str) -> str | None:
  """The error line when XLA:CPU itself failed running code outside the kernel (the test's reference):
  an XLA runtime error that wraps no palace callback error, raised where no traceback frame is palace's
  or JAX's Pallas code (the kernel call). None otherwise."""
  text = text or ""
  errors = _XLA_ERROR.findall(text)
  if not errors or any(w in text for w in _WRAPPED):
    return None
  if any(_KERNEL_FRAME.search(f) for f in _FRAME.findall(text)):
    return None
  return errors[-1][0]


# a test's expectation of an error message: assertRaisesRegex's pattern in the failing statement (the
# '>' line and its continuation lines), and a failure that is that assertion (nothing raised, or another
# message raised)
_EXPECTS = re.compile(r"assertRaisesRegex\(\s*[\w.]+,\s*r?(['\"])(.*?)(?<!\\)\1", re.S)
_EXPECT_FAILED = re.compile(r"^E\s+AssertionError: (Exception not raised|\".*\" does not match )", re.M)
INSTALLED = ("jax", "jaxlib")   # the packages whose files `_installed_has` reads
_INSTALLED_TEXT: dict = {}


def _literal_runs(pattern: str) -> list:
  """The runs of a regular expression that match only themselves ("a\\.b" -> ["a.b"])."""
  runs, run, i = [], "", 0
  while i < len(pattern):
    c = pattern[i]
    if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
      run += pattern[i + 1]
      i += 2
      continue
    if c == "\\" or c in ".^$*+?{}[]|()":
      runs.append(run[:-1] if c in "?*{" else run)   # a quantifier may drop the character before it
      run = ""
      i += 2 if c == "\\" else 1
      continue
    run += c
    i += 1
  return runs + [run]


def _installed_has(fragment: str) -> bool:
  """Whether any file of the installed jax or jaxlib (Python sources and binaries) holds `fragment`
  (the search stops at the first file that does; the answer is kept per fragment)."""
  if fragment not in _INSTALLED_TEXT:
    _INSTALLED_TEXT[fragment] = any(fragment.encode() in data for data in _installed_files())
  return _INSTALLED_TEXT[fragment]


def _installed_files():
  """The bytes of each file of the `INSTALLED` packages, one at a time (unreadable ones skipped)."""
  import importlib.util  # noqa: PLC0415
  for pkg in INSTALLED:
    spec = importlib.util.find_spec(pkg)
    for root in (spec.submodule_search_locations or []) if spec else []:
      for folder, _, names in os.walk(root):
        for name in names:
          try:
            with open(os.path.join(folder, name), "rb") as f:
              yield f.read()
          except OSError:
            continue


def expects_message_jax_lacks(text: str) -> bool:
  """The failure is the test's assertRaisesRegex (nothing raised, or another message), and the longest
  literal run of its pattern is in no file of the installed jax or jaxlib: no code of this jax raises
  what the test expects, so the test fails with it on a TPU too (written for another jax, e.g.
  `test_empty_core_map_raises_error`'s "Attempted to lower core_map without discharging.")."""
  text = text or ""
  statement = re.search(r"^>.*?(?=^E )", text, re.M | re.S)
  expect = statement and _EXPECTS.search(statement.group(0))
  if not expect or not _EXPECT_FAILED.search(text):
    return False
  fragment = max(_literal_runs(expect.group(2)), key=len)
  return len(fragment) >= 12 and not _installed_has(fragment)


def classify(text: str) -> str:
  """The outcome of one failed test from its failure text, before any re-run: "not collected" and
  "timeout" as the runner saw them, then "needs a compiler", "needs another jax" (the test reads a name
  the installed jax removed, or that jax refuses its kernel while tracing it), "reference fails on
  XLA:CPU", "failed"."""
  if NEEDS_COMPILER.search(text) or reads_compiler_output(text):
    return "needs a compiler"
  if _REMOVED_API.search(text) or jax_refuses_when_tracing(text) or expects_message_jax_lacks(text):
    return "needs another jax"
  if xla_cpu_error(text):
    return "reference fails on XLA:CPU"
  return "failed"


def node_id(path: str, name: str) -> str:
  """pytest's id of test `name` ("Class::test", or "<file stem>::test" for a module-level test, as
  read_junit names them) in the file `path`."""
  cls, _, test = name.partition("::")
  return f"{path}::{test}" if cls == os.path.basename(path)[:-3] else f"{path}::{name}"


def _pytest(targets: list, xml: str, env: dict, checkout: str, per_test: int, per_file: int,
            timeout_plugin: bool, keyword: str | None = None) -> tuple:
  """Run pytest on `targets` (a file or node ids; `-k keyword`) into the JUnit file `xml`: (timed out,
  output tail)."""
  cmd = [sys.executable, "-m", "pytest", "-p", "palace.jax", "-p", "benchmarks.jax_suite_paths",
         "-p", "benchmarks.jax_suite_hypothesis", "-q",
         "-p", "no:cacheprovider",
         f"--junitxml={xml}", "-o", "junit_family=xunit1", *targets, *(["-k", keyword] if keyword else [])]
  if timeout_plugin:
    cmd += [f"--timeout={per_test}"]
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=per_file, cwd=checkout)
    return False, (proc.stdout + proc.stderr)[-2000:]
  except subprocess.TimeoutExpired as e:
    return True, str(e.stdout or "")[-2000:]


def read_junit(xml: str) -> list:
  """[(name "Class::test", outcome, seconds, failure text)] of a pytest JUnit file (xunit1)."""
  cases = []
  for case in ET.parse(xml).getroot().iter("testcase"):
    name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
    outcome, msg = "passed", ""
    for child in case:
      if child.tag in ("failure", "error"):
        msg = (child.get("message") or "") + "\n" + (child.text or "")
        if "collection failure" in msg or "ERROR collecting" in msg or not case.get("classname"):
          outcome = "not collected"   # the file does not import with this jax (a version mismatch)
          msg = next((ln for ln in (child.text or "").splitlines() if ln.startswith("E ")), msg)[2:]
        elif "Timeout" in msg:
          outcome = "timeout"
        else:
          outcome = classify(msg)
      elif child.tag == "skipped":
        outcome = "skipped"
    cases.append((name, outcome, float(case.get("time") or 0), msg))
  return cases


# Hypothesis's failure report (JAX's profile prints it): the failing example, replayable
_REPRODUCE_BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']*)'\)")
# the replayed failing example passed (Hypothesis's DidNotReproduce)
_DID_NOT_REPRODUCE = "Expected the test to raise an error, but it completed successfully"
# the re-run's {test id after the file's "::": [Hypothesis version, blob]} file, read by the plugin
# benchmarks/jax_suite_hypothesis.py
REPRODUCE = "JAX_SUITE_REPRODUCE"


def read_cpu(xml: str) -> dict:
  """{name "Class::test": CPU seconds of its call} from the "cpu_s" property the runner's plugin
  (benchmarks/jax_suite_hypothesis.py) gives each test, where present."""
  cpu = {}
  for case in ET.parse(xml).getroot().iter("testcase"):
    for prop in case.iter("property"):
      if prop.get("name") == "cpu_s":
        cpu[f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"] = float(prop.get("value"))
  return cpu


def recheck_numeric(path: str, tests: list, env: dict, checkout: str, xml: str, per_test: int,
                    per_file: int, timeout_plugin: bool, keyword: str | None = None,
                    which: tuple = RECHECKS[0]) -> dict:
  """Re-run the numeric failures among `tests` that are still "failed" (those `keyword` selects) once
  under the diagnostic of `which` (an entry of RECHECKS); each that passes gets its class. A Hypothesis
  test replays its failing example only (benchmarks/jax_suite_hypothesis.py). Returns {"ran",
  "passed", "timed_out"} for the record ("ran": the tests the re-run reported)."""
  key, variables, outcome, evidence = which
  again = [t for t in tests if t["outcome"] == "failed" and t.get("numeric")]
  if not again:
    return {"ran": 0, "passed": 0, "timed_out": False}
  blobs = {node_id(path, t["name"]).split("::", 1)[1]: t["hypothesis_blob"] for t in again
           if t.get("hypothesis_blob")}
  env = dict(env, **{variable: "1" for variable in variables})
  if blobs:
    env[REPRODUCE] = xml[:-4] + ".reproduce.json"
    with open(env[REPRODUCE], "w") as f:
      json.dump(blobs, f)
  timed_out, _ = _pytest([node_id(path, t["name"]) for t in again], xml, env,
                         checkout, per_test, per_file, timeout_plugin, keyword)
  rerun = {name: (outcome, msg) for name, outcome, _, msg in (read_junit(xml) if os.path.exists(xml) else ())}
  passed = {name for name, (outcome, msg) in rerun.items()
            if outcome == "passed" or _DID_NOT_REPRODUCE in msg}
  for t in again:
    if t["name"] in passed:
      t["outcome"] = outcome
      t["evidence"] = evidence
    elif t["name"] in rerun:   # still failing: what the re-run saw (e.g. fewer mismatched elements)
      msg = rerun[t["name"]][1]
      t[key.replace("_recheck", "_rerun")] = next((re.sub(r"^E\s+", "", ln).strip() for ln in msg.splitlines()
                                   if "Mismatch" in ln), _first_line(msg) if msg else rerun[t["name"]][0])
  names = {t["name"] for t in again}
  return {"ran": len(names & set(rerun)), "passed": len(passed & names), "timed_out": timed_out}


def run_file(path: str, out_dir: str, per_test: int, per_file: int, timeout_plugin: bool,
             recheck: bool = True, keyword: str | None = None, reuse: str | None = None) -> dict:
  """Run one test file (or, with `reuse`, take its JUnit file from that earlier run's folder instead:
  only the classification and the re-run are done) and classify its outcomes."""
  stem = os.path.basename(path)[:-3]
  chip = chip_for(stem)
  n = int(chip.split(":")[1]) if ":" in chip else 1
  xml = os.path.join(out_dir, f"{stem}.xml")
  checkout = os.path.dirname(os.path.dirname(os.path.dirname(path)))
  env = dict(os.environ, PALACE_JAX=chip, JAX_PLATFORMS="cpu", JAX_SUITE_CHECKOUT=checkout,
             JAX_SUITE_SHARDS=str(shard_count(checkout, stem)),
             PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
  # the first run is the chip's numerics, whatever the caller's shell has
  for _, variables, _, _ in RECHECKS:
    for variable in variables:
      env.pop(variable, None)
  flags = env.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={max(n, 1)}".strip()
  t0 = time.time()
  earlier = reuse and os.path.join(reuse, f"{stem}.xml")
  if earlier and os.path.exists(earlier):
    if os.path.abspath(earlier) != os.path.abspath(xml):
      shutil.copyfile(earlier, xml)
    timed_out, tail = False, f"(the first run's outcomes reused from {earlier})"
  else:
    timed_out, tail = _pytest([path], xml, env, checkout, per_test, per_file, timeout_plugin, keyword)
  res = {"file": stem, "chip": chip, "seconds": 0.0, "file_timed_out": timed_out, "tests": [], "tail": tail}
  if os.path.exists(xml):
    cpu = read_cpu(xml)
    for name, outcome, seconds, msg in read_junit(xml):
      t = {"name": name, "outcome": outcome, "seconds": seconds,
           "first_line": _first_line(msg) if msg else ""}
      if name in cpu:
        t["cpu_s"] = cpu[name]
      if outcome == "failed" and is_numeric_assertion(msg):
        t["numeric"] = True
        blob = _REPRODUCE_BLOB.search(msg)
        if blob:
          t["hypothesis_blob"] = [blob.group(1), blob.group(2)]
      elif outcome == "reference fails on XLA:CPU":
        t["evidence"] = xla_cpu_error(msg)
      res["tests"].append(t)
  if recheck:
    for which in RECHECKS:
      res[which[0]] = recheck_numeric(path, res["tests"], env, checkout,
                                      os.path.join(out_dir, f"{stem}.{which[0].replace('_recheck', '')}.xml"),
                                      per_test, per_file, timeout_plugin, keyword, which)
  for t in res["tests"]:
    t.pop("numeric", None)
    t.pop("hypothesis_blob", None)
  res["tests"] = fold_shards(res["tests"])
  res["seconds"] = round(time.time() - t0, 1)
  return res


KINDS = ("passed", "failed", "reference on XLA:CPU", "dot order on XLA:CPU", "math on XLA:CPU",
         "reference fails on XLA:CPU", "needs a compiler", "needs another jax", "skipped", "timeout",
         "not collected")


def _recheck_line(results: list, total: dict, which: tuple, left: str, meaning: str) -> str:
  """The summary's line of one re-run (an entry of RECHECKS): its class's count, the diagnostics, how
  many tests it re-ran, and what the diagnostics compute."""
  key, variables, outcome, _ = which
  runs = [r[key] for r in results if key in r]
  return (f"\n{outcome}: {total[outcome]} numeric failures{left} that pass when re-run under the "
          f"diagnostic{'s' if len(variables) > 1 else ''} {' and '.join(f'{v}=1' for v in variables)} "
          f"({sum(c['ran'] for c in runs)} re-run"
          + ("; a re-run ran past its file limit" if any(c["timed_out"] for c in runs) else "")
          + f"), {meaning}")


def summarize(results: list[dict]) -> str:
  kinds = KINDS
  lines = ["| file | chip | " + " | ".join(kinds)
           + " | file over its limit | s | tests' cpu s | slowest test s (cpu s) |",
           "|---|---|" + "---|" * (len(kinds) + 4)]
  total = collections.Counter()
  groups = collections.Counter()
  for r in sorted(results, key=lambda r: r["file"]):
    c = collections.Counter(t["outcome"] for t in r["tests"])
    total.update(c)
    for t in r["tests"]:
      if t["outcome"] in ("failed", "timeout"):
        groups[t["first_line"]] += 1
      elif t["outcome"] == "not collected":
        groups["(not collected) " + t["first_line"]] += 1
    # (CPU seconds: each test's call, from the plugin's "cpu_s"; a busy machine stretches the wall
    # time, not these)
    slow = max(r["tests"], key=lambda t: t["seconds"], default=None)
    cpu = sum(t.get("cpu_s", 0.0) for t in r["tests"])
    slow_cpu = f"{slow['cpu_s']:.0f}" if slow and "cpu_s" in slow else "?"
    lines.append(f"| {r['file']} | {r['chip']} | " + " | ".join(str(c[k]) for k in kinds)
                 + f" | {'yes' if r['file_timed_out'] else ''} | {r['seconds']:.0f} | {cpu:.0f} | "
                 + (f"{slow['seconds']:.0f} ({slow_cpu})" if slow else "") + " |")
  ran = total["passed"] + total["failed"] + total["timeout"]
  rechecked = any("exact_f32_recheck" in r for r in results)
  lines.append("| **all** | | " + " | ".join(f"**{total[k]}**" for k in kinds) + " | | | | |")
  lines.append(f"\npassed {total['passed']} of {ran} run, excluding needs-a-compiler, needs-another-jax, "
               f"reference-on-CPU, dot-order and math-on-CPU "
               f"({100.0 * total['passed'] / max(ran, 1):.1f}%)")
  if rechecked:
    lines.append(_recheck_line(results, total, RECHECKS[0], "",
                               "which computes float32 dots exactly as XLA:CPU does, NOT as the chip computes "
                               "them; reference fails on XLA:CPU: XLA:CPU raised running code outside the "
                               "kernel"))
    lines.append(_recheck_line(results, total, RECHECKS[1], " left",
                               "under which the kernel's dots and XLA:CPU's outside it are summed by one rule "
                               "and rounded as on the chip, NOT in the chip's order"))
    lines.append(_recheck_line(results, total, RECHECKS[2], " left",
                               "under which the kernel's transcendentals are XLA:CPU's, as its reference's "
                               "are, NOT the chip's"))
  else:
    lines.append(f"\n(no exact-f32-dots re-run: numeric failures stay \"failed\")")
  lines.append("\nfailures by first error line:")
  for line, count in groups.most_common():
    lines.append(f"{count:6d}  {line}")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--jax", required=True, help="a JAX source tree (holds tests/pallas/tpu_*.py)")
  ap.add_argument("--only", default=None, help="comma-separated substrings of file names")
  ap.add_argument("--per-test", type=int, default=60)
  ap.add_argument("--per-file", type=int, default=1800)
  ap.add_argument("--workers", type=int, default=2, help="files run at once")
  ap.add_argument("--out", default="palace-out/jax_suite")
  ap.add_argument("--interpret", action="store_true", help="also the interpret-mode test files")
  ap.add_argument("-k", dest="keyword", default=None, help="pytest's -k: only the tests it selects")
  ap.add_argument("--reuse", default=None, metavar="DIR",
                  help="take each file's first-run JUnit file from DIR (an earlier run's --out) instead "
                       "of running it: only classify and re-run")
  ap.add_argument("--no-recheck", action="store_true",
                  help=f"do not re-run numeric failures under {EXACT_F32_DOTS}=1, {SHARED_DOTS}=1 or "
                       f"{HOST_MATH}=1 (they stay 'failed')")
  a = ap.parse_args(argv)
  tests_dir = os.path.join(os.path.abspath(a.jax), "tests", "pallas")
  if not os.path.isdir(tests_dir):
    print(f"jax_suite: {tests_dir} does not exist. Fix: pass --jax a JAX source checkout "
          f"(git clone https://github.com/jax-ml/jax).", file=sys.stderr)
    return 2
  files = sorted(os.path.join(tests_dir, f) for f in os.listdir(tests_dir)
                 if f.startswith("tpu_") and f.endswith(".py"))
  if not a.interpret:   # JAX's interpret-mode duplicates of the TPU tests: not palace's to run
    files = [f for f in files if "interpret" not in os.path.basename(f)]
  if a.only:
    keys = a.only.split(",")
    files = [f for f in files if any(k in os.path.basename(f) for k in keys)]
  os.makedirs(a.out, exist_ok=True)
  try:
    import pytest_timeout  # noqa: F401, PLC0415
    plugin = True
  except ImportError:
    plugin = False
    print("jax_suite: pytest-timeout is not installed; only the per-file limit applies "
          "(pip install pytest-timeout)", file=sys.stderr)
  results = []
  with concurrent.futures.ThreadPoolExecutor(a.workers) as pool:
    futs = {pool.submit(run_file, f, os.path.abspath(a.out), a.per_test, a.per_file, plugin,
                        not a.no_recheck, a.keyword, a.reuse and os.path.abspath(a.reuse)): f
            for f in files}
    for fut in concurrent.futures.as_completed(futs):
      r = fut.result()
      results.append(r)
      c = collections.Counter(t["outcome"] for t in r["tests"])
      print(f"{r['file']:45s} {r['chip']:6s} {dict(c)} {r['seconds']:.0f}s"
            f"{' FILE TIMED OUT' if r['file_timed_out'] else ''}", flush=True)
  table = summarize(results)
  print(table)
  with open(os.path.join(a.out, "summary.md"), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(a.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
