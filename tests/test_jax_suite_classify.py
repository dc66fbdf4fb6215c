"""benchmarks/jax_suite.py sorts each failure of JAX's suite by evidence: the test's reference failing on
XLA:CPU (from the traceback), a numeric failure that passes when re-run under the exact-f32-dots
diagnostic (reference on XLA:CPU), or palace's own failure. Synthetic JUnit files and tracebacks; the
re-run's pytest is replaced by one that writes the JUnit file a re-run would."""
import collections
import json
import os

import pytest

from benchmarks import jax_suite as js

SITE = "/venv/lib/python3.12/site-packages"
DOT_THUNK = ("jax.errors.JaxRuntimeError: UNIMPLEMENTED: Unsupported element type for DotThunk::Execute: "
             "BF16 x BF16 = F32")

# XLA:CPU failing on the test's reference: materialized in assertAllClose, no palace or Pallas frame
REFERENCE_FAILS = f"""self = <tpu_fusible_matmul_test.FusibleMatmulTest testMethod=test_matmul_out_transpose3>

>     self.assertAllClose(
          jax.jit(impl_fused)(x, y),
          jax.jit(ref)(x, y),
      )

tests/pallas/tpu_fusible_matmul_test.py:1037: 
{SITE}/jax/_src/test_util.py:1361: in assertAllClose
    desired = np.asarray(desired)
{SITE}/jax/_src/array.py:448: in __array__
    return np.asarray(self._value, dtype=dtype, **kwds)
>         npy_value, did_copy = self._to_np_array_did_copy()
E         {DOT_THUNK}

{SITE}/jax/_src/array.py:696: JaxRuntimeError"""

# the same error type raised through palace's callback (a palace error XLA wrapped): palace's
PALACE_WRAPPED = f"""tests/pallas/tpu_x_test.py:50: 
{SITE}/jax/_src/array.py:696: in _value
E   jax.errors.JaxRuntimeError: INTERNAL: Error when calling buffer callback: Traceback (most recent call last):
E     File "/work/palace/_src/jax/callback.py", line 80, in run
E   palace._src.errors.OutOfBoundsError: index 9 of args[0]

{SITE}/jax/_src/array.py:696: JaxRuntimeError"""

# an XLA error raised while the kernel call was lowered or run (a Pallas or palace frame)
KERNEL_FRAME = f"""tests/pallas/tpu_x_test.py:50: 
{SITE}/jax/_src/pallas/pallas_call.py:1200: in _pallas_call_impl
    return ...
/work/wt/palace/_src/jax/launch.py:10: in plan
E   jax.errors.JaxRuntimeError: INVALID_ARGUMENT: something

{SITE}/jax/_src/pallas/pallas_call.py:1200: JaxRuntimeError"""

NUMERIC = """>       np.testing.assert_allclose(a, b, atol=5e-05)
E       AssertionError: 
E       Not equal to tolerance rtol=1e-06, atol=5e-05
E       
E       Mismatched elements: 4 / 131072 (0.00305%)

tests/pallas/tpu_x_test.py:655: AssertionError"""

EXACT_EQUAL = """E       AssertionError: 
E       Arrays are not equal
E       Mismatched elements: 55 / 4194304 (0.00131%)"""

NOT_RAISED = """E   AssertionError: MosaicError not raised"""


def test_xla_cpu_failing_on_the_reference_is_recognised_from_the_traceback():
  assert js.xla_cpu_error(REFERENCE_FAILS) == DOT_THUNK
  assert js.classify("jax.errors.JaxRuntimeError: UNIMPLEMENTED\n" + REFERENCE_FAILS) == \
      "reference fails on XLA:CPU"


@pytest.mark.parametrize("text", [PALACE_WRAPPED, KERNEL_FRAME, NUMERIC, NOT_RAISED],
                         ids=["palace_callback", "kernel_frame", "numeric", "not_raised"])
def test_failures_in_palace_or_the_kernel_call_stay_failed(text):
  assert js.xla_cpu_error(text) is None
  assert js.classify(text) == "failed"


def test_numeric_assertions_are_numpy_comparisons():
  assert js.is_numeric_assertion(NUMERIC) and js.is_numeric_assertion(EXACT_EQUAL)
  assert not js.is_numeric_assertion(NOT_RAISED) and not js.is_numeric_assertion(REFERENCE_FAILS)


def test_node_ids_of_class_and_module_level_tests():
  path = "/jax/tests/pallas/tpu_x_test.py"
  assert js.node_id(path, "FooTest::test_a3") == f"{path}::FooTest::test_a3"
  assert js.node_id(path, "tpu_x_test::test_b[1-2]") == f"{path}::test_b[1-2]"


def _case(cls, name, tag=None, message="", text=""):
  body = "" if tag is None else (f'<{tag} message="{message}"/>' if tag == "skipped" else
                                 f'<{tag} message="{message}"><![CDATA[{text}]]></{tag}>')
  return (f'<testcase classname="tests.pallas.tpu_x_test.{cls}" name="{name}" file="tests/pallas/'
          f'tpu_x_test.py" time="0.5">{body}</testcase>')


def _junit(path, cases):
  with open(path, "w") as f:
    f.write('<?xml version="1.0"?><testsuites><testsuite name="pytest">' + "".join(cases)
            + "</testsuite></testsuites>")


FIRST_RUN = [
    _case("T", "test_ok"),
    _case("T", "test_skip", "skipped", "no"),
    _case("T", "test_f32", "failure", "AssertionError", NUMERIC),          # passes under the diagnostic
    _case("T", "test_bf16", "failure", "AssertionError", EXACT_EQUAL),     # fails again under it
    _case("T", "test_tanh", "failure", "AssertionError", EXACT_EQUAL),     # passes under host math only
    _case("T", "test_ref", "failure", "JaxRuntimeError", REFERENCE_FAILS),
    _case("T", "test_poison", "failure", "AssertionError: MosaicError not raised", NOT_RAISED),  # no re-run
    _case("T", "test_mlir", "failure", "AssertionError", "AssertionError: 'tpu_custom_call' not found "
          "in 'module @jit_f'"),
]


@pytest.fixture
def fake_pytest(monkeypatch):
  """Replace the runner's pytest: the first run writes FIRST_RUN; a re-run (node ids) writes what the
  diagnostic gives: under exact f32 dots test_f32 passes and test_bf16 and test_tanh fail again, under
  shared dots test_bf16 passes and test_tanh fails again, under host math (with shared dots) test_tanh
  passes. Records each call's targets and env."""
  calls = []

  def run(targets, xml, env, checkout, per_test, per_file, timeout_plugin, keyword=None):
    calls.append((list(targets), env.get(js.EXACT_F32_DOTS), env.get(js.SHARED_DOTS), env.get(js.HOST_MATH)))
    names = [name.split("::")[-1] for name in targets]
    if len(targets) == 1 and targets[0].endswith(".py"):
      _junit(xml, FIRST_RUN)
    elif env.get(js.HOST_MATH) == "1":
      _junit(xml, [_case("T", name) for name in names])
    elif env.get(js.SHARED_DOTS) == "1":
      _junit(xml, [_case("T", name) if name == "test_bf16" else
                   _case("T", name, "failure", "AssertionError", EXACT_EQUAL) for name in names])
    else:
      _junit(xml, [_case("T", name) if name == "test_f32" else
                   _case("T", name, "failure", "AssertionError", EXACT_EQUAL) for name in names])
    return False, ""
  monkeypatch.setattr(js, "_pytest", run)
  monkeypatch.setenv(js.EXACT_F32_DOTS, "1")   # a caller's shell: the first run must not inherit it
  monkeypatch.setenv(js.SHARED_DOTS, "1")
  monkeypatch.setenv(js.HOST_MATH, "1")
  return calls


def test_a_file_is_classified_by_evidence(tmp_path, fake_pytest):
  path = str(tmp_path / "jax" / "tests" / "pallas" / "tpu_x_test.py")
  res = js.run_file(path, str(tmp_path), 60, 600, True)
  outcomes = {t["name"].split("::")[1]: t["outcome"] for t in res["tests"]}
  assert outcomes == {"test_ok": "passed", "test_skip": "skipped", "test_f32": "reference on XLA:CPU",
                      "test_bf16": "dot order on XLA:CPU", "test_tanh": "math on XLA:CPU",
                      "test_ref": "reference fails on XLA:CPU", "test_poison": "failed",
                      "test_mlir": "needs a compiler"}
  (first, *first_env), (again, *again_env), (third, *third_env), (fourth, *fourth_env) = fake_pytest
  assert first == [path] and first_env == [None, None, None]           # the chip's numerics first
  assert again == [f"{path}::T::test_f32", f"{path}::T::test_bf16", f"{path}::T::test_tanh"]
  assert again_env == ["1", None, None]
  # each re-run takes only what is left failing
  assert third == [f"{path}::T::test_bf16", f"{path}::T::test_tanh"] and third_env == [None, "1", None]
  assert fourth == [f"{path}::T::test_tanh"] and fourth_env == [None, "1", "1"]
  assert res["exact_f32_recheck"] == {"ran": 3, "passed": 1, "timed_out": False}
  assert res["shared_dots_recheck"] == {"ran": 2, "passed": 1, "timed_out": False}
  assert res["host_math_recheck"] == {"ran": 1, "passed": 1, "timed_out": False}
  evidence = {t["name"].split("::")[1]: t.get("evidence") for t in res["tests"]}
  assert "PALACE_JAX_EXACT_F32_DOTS=1" in evidence["test_f32"] and evidence["test_ref"] == DOT_THUNK
  assert "PALACE_JAX_SHARED_DOTS=1" in evidence["test_bf16"]
  assert "PALACE_JAX_HOST_MATH=1 and PALACE_JAX_SHARED_DOTS=1" in evidence["test_tanh"]
  assert all("numeric" not in t for t in res["tests"])
  rerun = {t["name"].split("::")[1]: t.get("exact_f32_rerun") for t in res["tests"]}
  assert rerun["test_bf16"] == "Mismatched elements: 55 / 4194304 (0.00131%)" and rerun["test_f32"] is None

  table = js.summarize([res])
  header = table.splitlines()[0]
  assert ("| reference on XLA:CPU | dot order on XLA:CPU | math on XLA:CPU | reference fails on XLA:CPU |"
          in header)
  assert "| needs a compiler | needs another jax |" in header
  assert "| **1** | **1** | **1** | **1** | **1** | **1** | **1** | **0** | **1** | **0** | **0** |" in table
  # passed of run: passed / (passed + failed + timeout); the reference classes are not run failures
  assert ("passed 1 of 2 run, excluding needs-a-compiler, needs-another-jax, reference-on-CPU, "
          "dot-order and math-on-CPU (50.0%)") in table
  assert "under the diagnostic PALACE_JAX_EXACT_F32_DOTS=1" in table and "NOT as the chip" in table
  assert "dot order on XLA:CPU: 1 numeric failures left" in table
  assert "PALACE_JAX_SHARED_DOTS=1 (2 re-run" in table
  assert ("math on XLA:CPU: 1 numeric failures left" in table and
          "PALACE_JAX_HOST_MATH=1 and PALACE_JAX_SHARED_DOTS=1 (1 re-run" in table)
  groups = table.split("failures by first error line:")[1]
  assert "MosaicError not raised" in groups and "DotThunk" not in groups


def test_without_the_recheck_numeric_failures_stay_failed(tmp_path, fake_pytest):
  path = str(tmp_path / "jax" / "tests" / "pallas" / "tpu_x_test.py")
  res = js.run_file(path, str(tmp_path), 60, 600, True, recheck=False)
  c = collections.Counter(t["outcome"] for t in res["tests"])
  assert c["failed"] == 4 and c["reference on XLA:CPU"] == c["dot order on XLA:CPU"] == 0
  assert c["math on XLA:CPU"] == 0
  assert len(fake_pytest) == 1
  assert "no exact-f32-dots re-run" in js.summarize([res])
  assert os.path.exists(tmp_path / "tpu_x_test.xml")


def test_an_earlier_runs_outcomes_are_reused_and_only_rechecked(tmp_path, fake_pytest):
  earlier = tmp_path / "earlier"
  earlier.mkdir()
  _junit(str(earlier / "tpu_x_test.xml"), FIRST_RUN)
  out = tmp_path / "out"
  out.mkdir()
  path = str(tmp_path / "jax" / "tests" / "pallas" / "tpu_x_test.py")
  res = js.run_file(path, str(out), 60, 600, True, reuse=str(earlier))
  # no first run: only the re-runs, under each diagnostic
  assert [envs for _, *envs in fake_pytest] == [["1", None, None], [None, "1", None], [None, "1", "1"]]
  assert collections.Counter(t["outcome"] for t in res["tests"])["reference on XLA:CPU"] == 1
  assert "reused" in res["tail"] and (out / "tpu_x_test.xml").exists()


def test_each_tests_cpu_seconds_are_read_and_summed(tmp_path, monkeypatch):
  """The runner's plugin gives each test a "cpu_s" JUnit property; the table shows the file's sum and
  its slowest test's wall and CPU seconds (a busy machine stretches the wall time only)."""
  cases = [_case("T", "test_a").replace(">", '><properties><property name="cpu_s" value="2.5"/>'
                                        "</properties>", 1),
           _case("T", "test_b").replace('time="0.5"', 'time="70.0"').replace(
               ">", '><properties><property name="cpu_s" value="12.25"/></properties>', 1),
           _case("T", "test_c", "skipped", "no")]

  def run(targets, xml, *args, **kwargs):
    _junit(xml, cases)
    return False, ""
  monkeypatch.setattr(js, "_pytest", run)
  path = str(tmp_path / "jax" / "tests" / "pallas" / "tpu_x_test.py")
  res = js.run_file(path, str(tmp_path), 60, 600, True, recheck=False)
  cpu = {t["name"].split("::")[1]: t.get("cpu_s") for t in res["tests"]}
  assert cpu == {"test_a": 2.5, "test_b": 12.25, "test_c": None}
  table = js.summarize([res])
  assert "| tests' cpu s | slowest test s (cpu s) |" in table.splitlines()[0]
  assert table.splitlines()[2].endswith("| 15 | 70 (12) |")


BLOB = "AXicY2BgAAAAAgAB"
HYPOTHESIS_NUMERIC = NUMERIC + (f"\nE     You can reproduce this test case by temporarily adding "
                                f"@reproduce_failure('6.170.27', b'{BLOB}') as a decorator on your test function")
DID_NOT_REPRODUCE = ("hypothesis.errors.DidNotReproduce: Expected the test to raise an error, but it completed "
                     "successfully.")


def test_a_hypothesis_failure_is_rechecked_on_its_failing_example(tmp_path, monkeypatch):
  """The re-run of a Hypothesis test replays its failing example only (the blob JAX's profile prints,
  handed to the plugin in JAX_SUITE_REPRODUCE); Hypothesis's DidNotReproduce (the example passed under
  the diagnostic) makes it "reference on XLA:CPU"."""
  seen = {}

  def run(targets, xml, env, *args, **kwargs):
    if len(targets) == 1 and targets[0].endswith(".py"):
      _junit(xml, [_case("T", "test_h0", "failure", "AssertionError", HYPOTHESIS_NUMERIC),
                   _case("T", "test_h1", "failure", "AssertionError", HYPOTHESIS_NUMERIC)])
    else:
      with open(env[js.REPRODUCE]) as f:
        seen.update(json.load(f))
      _junit(xml, [_case("T", "test_h0", "failure", "DidNotReproduce", DID_NOT_REPRODUCE),
                   _case("T", "test_h1", "failure", "AssertionError", HYPOTHESIS_NUMERIC)])
    return False, ""
  monkeypatch.setattr(js, "_pytest", run)
  path = str(tmp_path / "jax" / "tests" / "pallas" / "tpu_x_test.py")
  res = js.run_file(path, str(tmp_path), 60, 600, True)
  assert seen == {"T::test_h0": ["6.170.27", BLOB], "T::test_h1": ["6.170.27", BLOB]}
  outcomes = {t["name"].split("::")[1]: t["outcome"] for t in res["tests"]}
  assert outcomes == {"test_h0": "reference on XLA:CPU", "test_h1": "failed"}
  assert all("hypothesis_blob" not in t for t in res["tests"])


# a test's own check of what a TPU compile gives (the compiled program's text, the Mosaic MLIR a
# debug=True call prints), read from the test's source above the failing line
COMPILED_TEXT = """    def test_x(self):
      compiled = vadd.lower(x, y).compile().as_text()
      pattern = r'"used_scoped_memory_configs":(\\d+)'
>     vmem_usage = int(re.search(pattern, compiled).group(1))
E     AttributeError: 'NoneType' object has no attribute 'group'

tests/pallas/tpu_pallas_test.py:131: AttributeError"""

DEBUG_MLIR = """    def test_trace(self):
      with jtu.capture_stdout() as get_output:
        _ = self.pallas_call(kernel, out_shape=s, debug=True)()
      debug_string = get_output()
>     self.assertEqual(debug_string.count('tpu.trace_start'), 1)
E     AssertionError: 0 != 1

tests/pallas/tpu_pallas_test.py:3661: AssertionError"""

# palace's own VMEM refusal, which the test matches by the compiler's words
OOM_WORDING = """>     self.assertIn('input window allocation for operator input 0', error_message)
E     AssertionError: 'input window allocation for operator input 0' not found in 'INTERNAL: Error when \
calling buffer callback: Traceback (most recent call last):\\n  File "x.py", line 1\\nResourceError: VMEM over \
capacity for kernel 'kernel' on chip 0 core 0 (v5e): 128.00 MiB of pipelined blocks requested'

tests/pallas/tpu_pallas_test.py:2631: AssertionError"""

# palace.jax's VMEM refusal at lowering (where the compiler refuses), matched by the compiler's words
OOM_WORDING_RAISED = """E   AssertionError: "(Ran out of memory)|(exceed memory)" does not match "VMEM over capacity for \
kernel 'body' on chip 0 core 0 (v5e): 20.00 MiB of pipelined blocks requested"

tests/pallas/tpu_pallas_test.py:2727: AssertionError"""

OOM_WORDING_AT_LOWERING = """>     self.assertIn('input window allocation for operator input 0', error_message)
E     AssertionError: 'input window allocation for operator input 0' not found in "VMEM over capacity \
for kernel 'kernel' on chip 0 core 0 (v5e): 128.00 MiB of pipelined blocks requested"

tests/pallas/tpu_pallas_test.py:2631: AssertionError"""

# the same reads, but the failure is the kernel's result (numeric) or raised inside the kernel call
COMPILED_THEN_NUMERIC = """    def test_x(self):
      compiled = f.lower(x).compile().as_text()
      z = f(x)
>     np.testing.assert_allclose(z, x + y)
E     AssertionError: 
E     Not equal to tolerance rtol=1e-07, atol=0
E     Mismatched elements: 4 / 131072 (0.00305%)

tests/pallas/tpu_pallas_test.py:135: AssertionError"""

COMPILED_THEN_PALACE_ERROR = """    def test_x(self):
      compiled = f.lower(x).compile().as_text()
>     z = f(x)
E     jax.errors.JaxRuntimeError: INTERNAL: Error when calling buffer callback
E   palace._src.errors.OutOfBoundsError: index 9 of args[0]

/venv/lib/python3.12/site-packages/jax/_src/interpreters/pxla.py:413: JaxRuntimeError"""


@pytest.mark.parametrize("text", [COMPILED_TEXT, DEBUG_MLIR, OOM_WORDING, OOM_WORDING_RAISED,
                                  OOM_WORDING_AT_LOWERING],
                         ids=["compiled_text", "debug_mlir", "oom_wording", "oom_wording_raised",
                              "oom_wording_at_lowering"])
def test_checks_of_compiler_output_need_a_compiler(text):
  assert js.reads_compiler_output(text)
  assert js.classify(text) == "needs a compiler"


@pytest.mark.parametrize("text", [COMPILED_THEN_NUMERIC, COMPILED_THEN_PALACE_ERROR, NUMERIC, NOT_RAISED],
                         ids=["numeric_after_compile", "palace_error_after_compile", "numeric",
                              "not_raised"])
def test_kernel_failures_beside_compiler_reads_stay_failed(text):
  assert not js.reads_compiler_output(text)
  assert js.classify(text) == "failed"


REMOVED_API = """>     pltpu.HOST,
E     AttributeError: pltpu.HOST was deprecated in JAX v0.8.0, and removed in JAX v0.10.0. Use pl.HOST instead.

tests/pallas/tpu_sparsecore_pallas_test.py:512: AttributeError"""


def test_a_name_the_installed_jax_removed_needs_another_jax():
  assert js.classify(REMOVED_API) == "needs another jax"
  assert js.classify(REMOVED_API.replace("was deprecated in JAX v0.8.0, and removed in JAX v0.10.0",
                                         "has no attribute 'HOST'")) == "failed"
  table = js.summarize([{"file": "tpu_x_test", "chip": "7x", "seconds": 1.0, "file_timed_out": False,
                         "tests": [{"name": "A::t", "outcome": "needs another jax", "first_line": "",
                                    "seconds": 0.1},
                                   {"name": "A::u", "outcome": "passed", "first_line": "", "seconds": 0.2}]}])
  assert "| needs another jax |" in table and "passed 1 of 1 run" in table


TRACE_REFUSED = f"""tests/pallas/tpu_ops_test.py:732: in test_disable_bounds_check
    output = run(x)
{SITE}/jax/_src/pallas/pallas_call.py:815: in _trace_kernel_to_jaxpr
    closed_jaxpr, out_avals = pe.trace_to_jaxpr(
tests/pallas/tpu_ops_test.py:724: in kernel
    tgt[:] = src[tuple(pl.ds(d) for d in tgt.shape)]
>               raise ValueError(
E               ValueError: Out of bound slice: start=0, size=16, stride=1, dim=8.

{SITE}/jax/_src/state/indexing.py:113: ValueError"""


def test_a_kernel_the_installed_jax_refuses_when_tracing_needs_another_jax():
  assert js.jax_refuses_when_tracing(TRACE_REFUSED)
  assert js.classify(TRACE_REFUSED) == "needs another jax"
  # a palace frame (palace's rule ran while tracing), or the test's own assertion: palace's failure
  with_palace = TRACE_REFUSED.replace("tests/pallas/tpu_ops_test.py:724: in kernel",
                                      "/work/palace/_src/jax/rules_lax.py:9: in rule")
  assert js.classify(with_palace) == "failed"
  own = TRACE_REFUSED.replace(f"{SITE}/jax/_src/state/indexing.py:113: ValueError",
                              "tests/pallas/tpu_ops_test.py:733: AssertionError")
  assert js.classify(own) == "failed"


EXPECTS_OTHER_JAX = """self = <tpu_pallas_state_test.CoreMapTest testMethod=test_empty_core_map_raises_error>

    def test_empty_core_map_raises_error(self):
      x = jnp.arange(8 * 128, dtype=jnp.int32).reshape((8, 128))
>     with self.assertRaisesRegex(Exception,
        "Attempted to lower core_map without discharging."):
E       AssertionError: Exception not raised

tests/pallas/tpu_pallas_state_test.py:308: AssertionError"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
  """A stand-in for the installed jax: a package whose files hold one message (a source and a binary)."""
  pkg = tmp_path / "fakejax"
  pkg.mkdir()
  (pkg / "__init__.py").write_text('raise ValueError("Invalid shape for `swap`: whatever")\n')
  (pkg / "lib.so").write_bytes(b"\x00\x7fELF Mosaic failed to compile the kernel\x00")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(js, "INSTALLED", ("fakejax",))
  monkeypatch.setattr(js, "_INSTALLED_TEXT", {})


def test_an_error_message_no_installed_file_has_needs_another_jax(installed):
  """A test whose assertRaisesRegex expects a message no file of the installed jax holds (its pattern's
  longest literal run) fails the same way on a TPU with this jax: written for another jax."""
  assert js._literal_runs(r"lower core_map\. without (x|y)") == ["lower core_map. without ", "x", "y", ""]
  assert js.expects_message_jax_lacks(EXPECTS_OTHER_JAX)
  assert js.classify(EXPECTS_OTHER_JAX) == "needs another jax"
  # a message the installed jax raises (a source's or a binary's): palace's failure to raise it
  for message in ("Invalid shape for `swap`", r"Mosaic failed to compile the kernel\.?"):
    text = EXPECTS_OTHER_JAX.replace("Attempted to lower core_map without discharging.", message)
    assert js.classify(text) == "failed", message
  # another message raised (assertRaisesRegex's "does not match"): the same rule
  other = EXPECTS_OTHER_JAX.replace("E       AssertionError: Exception not raised",
                                    'E       AssertionError: "Attempted to lower" does not match "boom"')
  assert js.classify(other) == "needs another jax"
  # a numeric failure, or a short pattern (too little to tell): failed
  assert js.classify(EXPECTS_OTHER_JAX.replace("Exception not raised", "Not equal to tolerance")) == "failed"
  assert js.classify(EXPECTS_OTHER_JAX.replace("Attempted to lower core_map without discharging.",
                                               "no such")) == "failed"


def test_shard_counts_come_from_jaxs_build_file(tmp_path):
  (tmp_path / "tests" / "pallas").mkdir(parents=True)
  (tmp_path / "tests" / "pallas" / "BUILD").write_text('''
jax_multiplatform_test(
    name = "tpu_a_test",
    srcs = ["tpu_a_test.py"],
    minimal_shard_count = 2,
    shard_count = 5,
)

jax_multiplatform_test(
    name = "tpu_b_test",
    srcs = ["tpu_b_test.py"],
)

jax_multiplatform_test(
    name = "tpu_c_test",
    shard_count = {
        "cpu": 8,
        "tpu": 4,
    },
)
''')
  assert [js.shard_count(str(tmp_path), s) for s in ("tpu_a_test", "tpu_b_test", "tpu_c_test", "tpu_d_test")] \
      == [5, 1, 4, 1]
  assert js.shard_count(str(tmp_path / "nowhere"), "tpu_a_test") == 1


def test_shards_fold_into_one_test_each():
  """A sharded test's shards (benchmarks/jax_suite_hypothesis.py) are one test in the table: the worst
  outcome, the slowest shard's seconds (the limit applies per shard), the sum beside them."""
  tests = [{"name": "A::t_plain", "outcome": "passed", "seconds": 1.0},
           *({"name": f"A::t_h__shard_{k}_of_3", "outcome": o, "seconds": s, "cpu_s": s, "first_line": f"l{k}"}
             for k, (o, s) in enumerate((("passed", 20.0), ("failed", 25.0), ("timeout", 61.0)))),
           *({"name": f"A::t_g__shard_{k}_of_2", "outcome": "passed", "seconds": 10.0 + k} for k in range(2)),
           {"name": "A::t_last", "outcome": "skipped", "seconds": 0.0}]
  folded = js.fold_shards(tests)
  assert [t["name"] for t in folded] == ["A::t_plain", "A::t_h", "A::t_g", "A::t_last"]
  h, g = folded[1], folded[2]
  assert (h["outcome"], h["seconds"], h["cpu_s"], h["shards"], h["seconds_all_shards"], h["first_line"]) \
      == ("failed", 61.0, 61.0, 3, 106.0, "l1")
  assert (g["outcome"], g["seconds"], g["shards"]) == ("passed", 11.0, 2)
