"""pytest plugin of `benchmarks.jax_suite`: Hypothesis tests run the examples JAX's CI runs, and a failure
is reported as found, neither shrunk nor explained.

JAX's Hypothesis tests load the "deterministic" profile (`jax._src.hypothesis_test_util.setup_hypothesis`:
derandomized, a few examples per test, no deadline) with Hypothesis's default phases. Those include
*shrink* (re-running ever smaller variants of a failing example) and *explain* (re-running them again
under a line tracer, to say which lines only failing examples ran). On a kernel whose every example is a
compile and a launch of thousands of grid steps, a failing test then runs ~20x the examples it runs when
it passes, mostly traced (`test_splash_attention0`: 6 examples generated in 18 s, then 15 shrinks in 16
s and 98 explained examples in 57 s). The verdict is the same without them: this plugin leaves out
those two phases, so every test runs its generated examples (the same ones, in the same order) and a
failure is the first failing example, replayed once by Hypothesis as usual. Test bodies, strategies and
example counts are untouched.

A test that runs past pytest-timeout's limit (`--timeout`) is stopped by the alarm inside one example,
which Hypothesis takes for a failing example and runs once more; on a slow kernel that doubled the
time over the limit (JAX's gmm tests: 120 and 179 s at a 60 s limit). Past the limit, no further
example of the test starts: each raises pytest-timeout's failure at once. (Hypothesis then reports
its own inconsistency error, as the refused replay drew no data; the failure of a test that ran past
its limit is reported as pytest-timeout's, that error below it, so the runner counts it a timeout.)

Sharded like JAX's CI. JAX's slow Hypothesis tests live in `HypothesisShardedTestCase` classes, whose
examples JAX's CI splits across the test target's shards (`shard_count` in tests/pallas/BUILD; each
example goes to one shard by a hash of its arguments, `hypothesis_test_util.hypothesis_inner_test_shard`),
so that no shard runs them all (`PaddedPipelineEmitterTest`: 200 examples a test, 5 shards). Under
JAX_SUITE_SHARDS=N (the runner sets the file's shard count) each such test becomes N tests,
`<test>__shard_<k>_of_<N>`, shard k running the examples JAX's shard k runs, with JAX's own
shard-aware wrapper; together they run every example once, and each is held to the per-test limit as a
bazel shard is. The runner folds them back into one test (`benchmarks.jax_suite.fold_shards`).

Each test's CPU seconds go into its JUnit record (property "cpu_s"), and the runner's exact-f32-dots
re-run can name a test's failing example for Hypothesis to replay alone (JAX_SUITE_REPRODUCE).
"""
import functools
import json
import os
import sys
import time

import hypothesis as hp
import pytest

from benchmarks.jax_suite import REPRODUCE   # the failing examples an exact-f32-dots re-run replays

PHASES = (hp.Phase.explicit, hp.Phase.reuse, hp.Phase.generate, hp.Phase.target)


def _chain(fn):
  """`fn` (a test function or bound method) and the functions it wraps (`__wrapped__`), outermost first.
  A Hypothesis test's attributes are on the innermost one that has them, and copied onto wrappers made
  with functools.wraps (absl's parameterized cases): Hypothesis reads its own."""
  seen = set()
  fn = getattr(fn, "__func__", fn)
  while fn is not None and id(fn) not in seen:
    seen.add(id(fn))
    yield fn
    fn = getattr(fn, "__wrapped__", None)


def without_shrinking(fn) -> int:
  """Drop the shrink and explain phases from the settings of the Hypothesis test behind `fn` (each
  copy of the settings attribute on its `_chain` is replaced; returns how many were), and make its
  body refuse to start an example past the running test's time limit."""
  changed = 0
  for f in _chain(fn):
    s = getattr(f, "_hypothesis_internal_use_settings", None)
    if isinstance(s, hp.settings) and not set(s.phases) <= set(PHASES):
      f._hypothesis_internal_use_settings = hp.settings(s, phases=[p for p in s.phases if p in PHASES])
      changed += 1
    handle = getattr(f, "hypothesis", None)
    inner = getattr(handle, "inner_test", None)
    if inner is not None and not getattr(inner, "_stops_at_the_limit", False):
      handle.inner_test = _stopped_past_the_limit(inner)
  return changed


# the running test's pytest-timeout limit: (deadline on time.monotonic, seconds), None between tests
# (this plugin's process-wide record of the one test pytest runs at a time, like pytest-timeout's alarm)
_limit = [None]


def _stopped_past_the_limit(inner):
  """The Hypothesis test body `inner`, refusing to start an example past the running test's limit."""
  @functools.wraps(inner)
  def example(*args, **kwargs):
    limit = _limit[0]
    if limit is not None and time.monotonic() >= limit[0]:
      pytest.fail(f"Timeout (>{limit[1]}s) from pytest-timeout; no further Hypothesis example started "
                  f"(benchmarks/jax_suite_hypothesis.py).")
    return inner(*args, **kwargs)
  example._stops_at_the_limit = True
  return example


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
  _limit[0] = (time.monotonic() + settings.timeout, settings.timeout)   # (pytest-timeout sets its alarm next)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report, limit = outcome.get_result(), _limit[0]
  if (call.when == "call" and report.failed and limit is not None and time.monotonic() >= limit[0]
      and "Timeout" not in str(report.longrepr)):
    report.longrepr = (f"Timeout (>{limit[1]}s) from pytest-timeout: the test ran past its limit; "
                       f"Hypothesis then raised:\n{report.longrepr}")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_cancel_timer(item):
  _limit[0] = None


def _reproduce(item) -> tuple | None:
  """(Hypothesis version, blob) of the failing example JAX_SUITE_REPRODUCE names for `item`, or None."""
  path = os.environ.get(REPRODUCE)
  if not path:
    return None
  with open(path) as f:
    blob = json.load(f).get(item.nodeid.split("::", 1)[-1])
  return (blob[0], blob[1].encode()) if blob else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  """Each test's CPU seconds (the process's, all threads: XLA's compiles and palace's callbacks too) as
  the JUnit property "cpu_s": on a machine shared with other work the wall time alone does not tell a
  slow test from a busy machine. Where JAX_SUITE_REPRODUCE names this test, Hypothesis runs only that
  failing example, as `@reproduce_failure` would (set for this call only: parameterized cases share
  one Hypothesis test); it raises DidNotReproduce when the example passes."""
  t0 = time.process_time()
  blob = _reproduce(item)
  fns = [f for f in _chain(getattr(item, "obj", None)) if blob
         and hasattr(f, "_hypothesis_internal_use_reproduce_failure")]
  saved = [f._hypothesis_internal_use_reproduce_failure for f in fns]
  for f in fns:
    f._hypothesis_internal_use_reproduce_failure = blob
  try:
    yield
  finally:
    for f, old in zip(fns, saved):
      f._hypothesis_internal_use_reproduce_failure = old
    item.user_properties.append(("cpu_s", round(time.process_time() - t0, 2)))


SHARDS = "JAX_SUITE_SHARDS"
_SHARD_NAME = "{}__shard_{}_of_{}"


_HTU = "jax._src.hypothesis_test_util"   # JAX's module (from the checkout: benchmarks/jax_suite_paths.py)


def _shard(cls, n: int, htu) -> int:
  """Split each Hypothesis test of the HypothesisShardedTestCase `cls` into `n` shard tests (module
  docstring), the examples chosen by JAX's own shard-aware wrapper from `htu`; returns how many tests
  were split. The original name is set to None on `cls`, which unittest's loader passes over (not
  callable); a class seen before (a subclass after its base) keeps its shards."""
  from hypothesis.internal import detection  # noqa: PLC0415
  split = 0
  for name in dir(cls):
    fn = getattr(cls, name, None)
    if (not name.startswith("test") or fn is None or getattr(fn, "_jax_suite_shard", None) is not None
        or not detection.is_hypothesis_test(fn)):
      continue
    handle = fn.hypothesis
    if not getattr(handle.inner_test, "_jax_suite_sharded", False):
      handle.inner_test = htu._shard_aware_hypothesis_inner_test(handle.inner_test)
      handle.inner_test._jax_suite_sharded = True
    for k in range(n):
      setattr(cls, _SHARD_NAME.format(name, k, n), _shard_test(fn, k, n))
    setattr(cls, name, None)
    split += 1
  return split


def _shard_test(fn, k: int, n: int):
  @functools.wraps(fn)
  def shard(self, *args, **kwargs):
    self._thread_shard_index, self._thread_total_shards = k, n   # what JAX's threaded loader sets
    return fn(self, *args, **kwargs)
  shard._jax_suite_shard = (k, n)
  return shard


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
  n = int(os.environ.get(SHARDS, "1") or 1)
  htu = sys.modules.get(_HTU)   # imported by the test module that defines such a class
  if n > 1 and htu is not None and isinstance(obj, type) and issubclass(obj, htu.HypothesisShardedTestCase):
    _shard(obj, n, htu)
  return None   # pytest collects the class as usual, now with its shard tests


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
  for item in items:
    without_shrinking(getattr(item, "obj", None))
