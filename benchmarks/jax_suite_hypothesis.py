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
"""
import hypothesis as hp
import pytest

PHASES = (hp.Phase.explicit, hp.Phase.reuse, hp.Phase.generate, hp.Phase.target)


def without_shrinking(fn) -> int:
  """Drop the shrink and explain phases from the settings of the Hypothesis test behind `fn` (a test
  function, bound method or a wrapper of one, e.g. absl's parameterized copies, which carry copies of
  the settings attribute: each one on the `__wrapped__` chain is replaced). Returns how many were."""
  changed, seen = 0, set()
  fn = getattr(fn, "__func__", fn)
  while fn is not None and id(fn) not in seen:
    seen.add(id(fn))
    s = getattr(fn, "_hypothesis_internal_use_settings", None)
    if isinstance(s, hp.settings) and not set(s.phases) <= set(PHASES):
      fn._hypothesis_internal_use_settings = hp.settings(s, phases=[p for p in s.phases if p in PHASES])
      changed += 1
    fn = getattr(fn, "__wrapped__", None)
  return changed


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
  for item in items:
    without_shrinking(getattr(item, "obj", None))
