"""`palace.jax.activate(chip)`: the one line a notebook gets. Process-wide, so each case runs in its own
Python process (the other tests of this worker must not see its engine)."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = '''
import timeit
import numpy as np
import palace.jax
tpu = palace.jax.activate("v5e")
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax._src import mesh as jax_mesh
import palace

def double_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2

f = jax.jit(lambda x: pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                     grid=(4,), in_specs=[pl.BlockSpec((64, 128), lambda i: (i, 0))],
                                     out_specs=pl.BlockSpec((64, 128), lambda i: (i, 0)))(x))
x = jnp.ones((256, 128), jnp.float32)
np.testing.assert_array_equal(f(x), 2 * np.ones((256, 128), np.float32))
one = palace.jax.device_time(f, x).total_time_s
assert one > 0
assert timeit.timeit(lambda: jax.block_until_ready(f(x)), number=10) == 10 * one
assert timeit.repeat(lambda: f(x), number=3, repeat=2) == [3 * one, 3 * one]
assert timeit.timeit("1 + 1", number=10) < 1          # a string statement: the real timeit
try:
  timeit.timeit(lambda: jax.block_until_ready(jnp.matmul(x, x.T)), number=5)
except palace.UnsupportedError as e:
  assert "launched no TPU kernel" in str(e), e
else:
  raise AssertionError("timing pure XLA work must raise")
d = jax.devices()[0]
assert d.device_kind == "TPU v5 lite", d.device_kind            # as the notebook sees it
assert jax_mesh.abstract_device_from(d).device_kind == "cpu"    # as JAX's internals see it
assert d.num_cores == 1 and pltpu.TensorCoreMesh(axis_name="c").num_cores == 1
assert tpu.reports and all(r.kernel_name == "double_kernel" for r in tpu.reports)
print("notebook shims ok")
'''


def test_activate_models_timeit_and_answers_device_kind_for_the_notebook_only():
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM)], cwd=ROOT, capture_output=True,
                        text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                        "JAX_PLATFORMS": "cpu", "PALACE_JAX": ""}, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "notebook shims ok" in proc.stdout


def test_timeit_line_prints_the_modelled_time():
  program = PROGRAM.replace('print("notebook shims ok")',
                            'print(palace.jax.timeit_line(lambda: f(x)) == one)')
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=ROOT, capture_output=True,
                        text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                        "JAX_PLATFORMS": "cpu", "PALACE_JAX": ""}, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line, result = proc.stdout.strip().splitlines()[-2:]
  assert result == "True" and line.endswith("per loop (modelled by palace, deterministic: one run)")
  assert line.split()[1] in ("s", "ms", "µs", "ns")
