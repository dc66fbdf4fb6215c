"""benchmarks/jax_suite_hypothesis.py: the suite runner's Hypothesis tests run their generated examples
and report the first failing one, without shrinking or explaining it (the verdict is unchanged)."""
import functools
import json

import pytest

hp = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

from benchmarks import jax_suite as js  # noqa: E402
from benchmarks import jax_suite_hypothesis as jh  # noqa: E402

pytest_plugins = ["pytester"]

DETERMINISTIC = dict(database=None, derandomize=True, deadline=None, max_examples=5)


def _failing_test(calls):
  @hp.given(st.integers(0, 1000), st.lists(st.integers(), min_size=3))
  @hp.settings(**DETERMINISTIC)
  def test(x, xs):
    calls.append((x, tuple(xs)))
    assert False, "always fails"
  return test


def _parameterized_copy(test):
  """As absl's parameterized.product makes each case: a functools.wraps wrapper (which copies the
  Hypothesis attributes, settings included, onto itself) around the shared Hypothesis test."""
  @functools.wraps(test)
  def case():
    return test()
  return case


def test_a_failing_example_is_not_shrunk_or_explained():
  shrunk, plain = [], []
  with pytest.raises(AssertionError, match="always fails"):
    _failing_test(shrunk)()
  case = _parameterized_copy(_failing_test(plain))
  assert jh.without_shrinking(case) == 2   # the copy's settings and the Hypothesis test's own
  with pytest.raises(AssertionError, match="always fails"):
    case()
  # Hypothesis's defaults shrink the failure over many more calls; without: the failing example
  # and Hypothesis's one replay of it
  assert len(shrunk) > 4
  assert plain == [plain[0], plain[0]]
  assert set(case.__wrapped__._hypothesis_internal_use_settings.phases) == set(jh.PHASES)


def test_a_passing_test_runs_the_same_examples():
  def run(strip):
    seen = []

    @hp.given(st.integers(0, 10**6))
    @hp.settings(**DETERMINISTIC)
    def test(x):
      seen.append(x)
    if strip:
      assert jh.without_shrinking(test) == 1
      assert jh.without_shrinking(test) == 0   # (idempotent)
    test()
    return seen
  assert run(True) == run(False) and len(run(True)) == 5


def test_other_objects_are_left_alone():
  def plain():
    pass
  assert jh.without_shrinking(plain) == 0
  assert jh.without_shrinking(None) == 0


def test_no_example_starts_past_the_time_limit():
  """pytest-timeout's alarm stops one example; Hypothesis would run it again (and, with shrinking,
  more): past the limit each further example fails at once with the timeout."""
  calls = []

  @hp.given(st.integers(0, 1000))
  @hp.settings(**DETERMINISTIC)
  def test(x):
    calls.append(x)
    if len(calls) == 2:   # the alarm lands in the second example
      jh._limit[0] = (0.0, 60)
      pytest.fail("Timeout (>60s) from pytest-timeout.")
  jh.without_shrinking(test)

  class Settings:
    timeout = 3600
  jh.pytest_timeout_set_timer(None, Settings)
  try:
    with pytest.raises(BaseException, match="Timeout") as e:
      test()
  finally:
    jh.pytest_timeout_cancel_timer(None)
  assert len(calls) == 2 and jh._limit[0] is None
  assert "no further Hypothesis example started" in str(e.value) + "".join(
      str(x) for x in getattr(e.value, "exceptions", ()))


def test_a_test_past_its_limit_is_reported_as_a_timeout(pytester):
  """In pytest with pytest-timeout: the alarm lands in the second example, the replay is refused and
  the test's failure is pytest-timeout's (the runner counts it a timeout), after ~one limit."""
  pytest.importorskip("pytest_timeout")
  pytester.makepyfile(test_slow="""
    import time
    import hypothesis as hp, hypothesis.strategies as st

    @hp.given(st.integers(0, 1000))
    @hp.settings(database=None, derandomize=True, deadline=None, max_examples=5)
    def test_slow(x):
      with open("examples.txt", "a") as f:
        f.write("x\\n")
      time.sleep(0.7)
  """)
  result = pytester.runpytest_inprocess("-p", "benchmarks.jax_suite_hypothesis", "--timeout=1",
                                        "--timeout-method=signal", "--junitxml=out.xml")
  result.assert_outcomes(failed=1)
  result.stdout.fnmatch_lines(["*Timeout (>1.0s) from pytest-timeout*"])
  assert len((pytester.path / "examples.txt").read_text().split()) == 2
  assert '<property name="cpu_s" value="' in (pytester.path / "out.xml").read_text()   # (its CPU seconds)


def test_a_named_failing_example_is_replayed_alone(pytester, monkeypatch):
  """JAX_SUITE_REPRODUCE (the runner's exact-f32-dots re-run) names a test's failing example: only that
  example runs, for that parameterized case only; it passing is Hypothesis's DidNotReproduce."""
  pytest.importorskip("absl.testing.parameterized")   # (as JAX's tests parameterize)
  pytester.makepyfile(test_h="""
    import hypothesis as hp, hypothesis.strategies as st
    from absl.testing import parameterized

    class T(parameterized.TestCase):
      @parameterized.parameters(0, 1)
      @hp.given(st.integers(0, 1000))
      @hp.settings(database=None, derandomize=True, deadline=None, max_examples=5, print_blob=True)
      def test_h(self, case, x):
        with open("examples.txt", "a") as f:
          f.write(f"{case}:{x}\\n")
        assert x < 0 or case == 0
  """)
  first = pytester.runpytest_inprocess("-p", "benchmarks.jax_suite_hypothesis")
  first.assert_outcomes(passed=1, failed=1)
  blob = next(ln for ln in first.stdout.lines if "@reproduce_failure(" in ln)
  version, data = blob.split("@reproduce_failure('")[1].split("')")[0].split("', b'")
  (pytester.path / "examples.txt").unlink()
  (pytester.path / "repro.json").write_text(json.dumps({"T::test_h1": [version, data]}))
  monkeypatch.setenv(js.REPRODUCE, str(pytester.path / "repro.json"))
  again = pytester.runpytest_inprocess("-p", "benchmarks.jax_suite_hypothesis", "-k", "test_h1")
  again.assert_outcomes(failed=1)   # the example fails again: Hypothesis reports it
  assert len((pytester.path / "examples.txt").read_text().split()) == 1
  assert "DidNotReproduce" not in again.stdout.str()


SHARDED = """
    import sys, unittest
    import hypothesis as hp, hypothesis.strategies as st

    htu = sys.modules["jax._src.hypothesis_test_util"]   # the test's stand-in for JAX's module

    class T(htu.HypothesisShardedTestCase):
      @hp.given(st.integers(0, 1000))
      @hp.settings(database=None, derandomize=True, deadline=None, max_examples=20,
                   suppress_health_check=[hp.HealthCheck.differing_executors])   # as JAX's profile
      def test_h(self, x):
        with open("examples.txt", "a") as f:
          f.write(f"{type(self).__name__}:{self._thread_shard_index}/{self._thread_total_shards}:{x}\\n")

      def test_plain(self):
        pass

    class U(T):   # a subclass after its base, as JAX's *PrimitiveTest classes
      pass
"""


def _stand_in_htu():
  """What the plugin uses of JAX's jax._src.hypothesis_test_util: the class, and a shard-aware wrapper
  that runs an example only on its shard (JAX's hashes the example's repr; this one takes x mod n)."""
  import types  # noqa: PLC0415
  import unittest  # noqa: PLC0415

  class HypothesisShardedTestCase(unittest.TestCase):
    _thread_shard_index = 0
    _thread_total_shards = 1

  def _shard_aware_hypothesis_inner_test(inner):
    @functools.wraps(inner)
    def run(*args, **kwargs):
      self = kwargs.get("self", args[0] if args else None)
      x = kwargs["x"] if "x" in kwargs else args[-1]
      if x % self._thread_total_shards != self._thread_shard_index:
        return None
      return inner(*args, **kwargs)
    return run
  return types.SimpleNamespace(HypothesisShardedTestCase=HypothesisShardedTestCase,
                               _shard_aware_hypothesis_inner_test=_shard_aware_hypothesis_inner_test)


@pytest.mark.parametrize("shards", [1, 3])
def test_a_sharded_hypothesis_test_runs_each_example_once_across_its_shards(pytester, monkeypatch, shards):
  """JAX_SUITE_SHARDS=N (the file's shard_count in JAX's BUILD) splits each Hypothesis test of a
  HypothesisShardedTestCase into N tests, `<test>__shard_<k>_of_<N>`, which together run every example
  the unsharded test runs, each once, on the shard JAX's wrapper picks; other tests stay one test."""
  import sys  # noqa: PLC0415
  monkeypatch.setitem(sys.modules, "jax._src.hypothesis_test_util", _stand_in_htu())
  monkeypatch.setenv(jh.SHARDS, str(shards))
  pytester.makepyfile(test_s=SHARDED)
  result = pytester.runpytest_inprocess("-p", "benchmarks.jax_suite_hypothesis", "-v")
  result.assert_outcomes(passed=2 * (shards + 1))
  if shards > 1:
    result.stdout.fnmatch_lines(["*T::test_h__shard_0_of_3 PASSED*", "*U::test_h__shard_2_of_3 PASSED*"])
  runs = [ln.split(":") for ln in (pytester.path / "examples.txt").read_text().split()]
  for cls in ("T", "U"):
    xs = [int(x) for c, where, x in runs if c == cls]
    assert len(xs) == len(set(xs)) and len(set(xs)) >= 10   # each example once
    assert all(where == f"{int(x) % shards}/{shards}" for c, where, x in runs if c == cls and shards > 1)
  if shards == 1:
    return
  # the same examples as the unsharded run
  (pytester.path / "examples.txt").unlink()
  monkeypatch.setenv(jh.SHARDS, "1")
  pytester.runpytest_inprocess("-p", "benchmarks.jax_suite_hypothesis").assert_outcomes(passed=4)
  plain = sorted(ln.rsplit(":", 1)[1] for ln in (pytester.path / "examples.txt").read_text().split())
  assert sorted(x for _, _, x in runs) == plain
