"""palace.compat without JAX: load_module isolation, the host shim, run_pallas_file (runs everywhere)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import palace as pl
import palace.compat as pc

HERE = Path(__file__).parent / "fixtures"
MOD = HERE / "jax_style_module.py"


def _shim():
  return pc.load_module(MOD)


def test_load_module_runs_a_jax_pallas_module():
  m = _shim()
  x = np.arange(16 * 128, dtype=np.float32).reshape(16, 128)
  with pl.virtual_tpu("v5e") as tpu:
    out = m.double(x, block=8)
  np.testing.assert_array_equal(out, 2 * x)
  assert len(tpu.reports) == 1 and m.CALLS == [8]
  assert m.pl is not None and m.jnp.float32 == np.float32


def test_isolation_nothing_global_changes():
  before = {k for k in sys.modules if k == "jax" or k.startswith("jax.")}
  builtins_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
  m = _shim()
  after = {k for k in sys.modules if k == "jax" or k.startswith("jax.")}
  assert before == after                       # no shim module registered globally
  assert m.jax.__name__ == "jax" and type(m.jax).__module__.startswith("palace")
  import builtins
  assert builtins.__import__ is builtins_import
  if importlib.util.find_spec("jax") is None:   # other modules still see the real (absent) jax
    with pytest.raises(ImportError):
      import jax  # noqa: F401
  assert _shim().jax is not m.jax              # each load is a fresh world


def test_isolation_other_modules_see_real_jax_in_a_fresh_process():
  code = (f"import palace.compat as pc, sys, importlib.util as u\n"
          f"m = pc.load_module({str(MOD)!r})\n"
          "assert 'jax' not in sys.modules\n"
          "if u.find_spec('jax') is not None:\n"
          "  import jax\n"
          "  assert jax is not m.jax and hasattr(jax, 'grad') and not hasattr(m.jax, 'grad')\n"
          "print('ok')\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "ok"


def test_missing_names_are_clear_errors():
  m = _shim()
  with pytest.raises(pc.MissingNameError, match=r"`jax\.pmap` is not provided by palace's JAX shim"):
    m.jax.pmap
  with pytest.raises(pl.UnsupportedError, match="jax.experimental.pallas.tpu.no_such_thing"):
    m.pltpu.no_such_thing
  assert not hasattr(m.jax, "grad")            # also an AttributeError, so hasattr/getattr work
  assert getattr(m.jax.lax, "psum_scatter_xyz", None) is None


def test_unknown_jax_module_import_is_unsupported(tmp_path):
  f = tmp_path / "uses_pmap.py"
  f.write_text("import jax.experimental.mesh_utils\n")
  with pytest.raises(pl.UnsupportedError, match="jax.experimental.mesh_utils"):
    pc.load_module(f)


def test_jit_static_args_and_hashability():
  jax = _shim().jax

  @jax.jit
  def f(x, y):
    return x + y
  assert f(1, 2) == 3
  g = jax.jit(lambda x, n: x * n, static_argnums=(1,))
  assert g(2, 3) == 6
  with pytest.raises(pl.UsageError, match="not hashable"):
    g(2, [3])
  h = jax.jit(lambda x: x, static_argnames="x")
  with pytest.raises(pl.UsageError, match="not hashable"):
    h(x={"a": 1})
  out = jax.jit(lambda x: x)(np.ones(3, np.float64))
  assert out.dtype == np.float32               # 64-bit narrowed as JAX without x64
  with pytest.raises(pl.UnsupportedError):
    f.lower(1, 2)


def test_custom_vjp_is_forward_only():
  m = _shim()
  assert m.square(3.0) == 9.0
  assert m.square.fwd is not None and "forward only" in m.jax.custom_vjp.__doc__


def test_nn_on_host_and_in_kernel():
  m = _shim()
  nn = m.jax.nn
  x = np.linspace(-3, 3, 8 * 128, dtype=np.float32).reshape(8, 128)
  np.testing.assert_array_equal(nn.relu(x), np.maximum(x, 0))
  np.testing.assert_allclose(nn.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-6)
  np.testing.assert_allclose(nn.silu(x), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
  s = nn.softmax(x, axis=-1)
  np.testing.assert_allclose(s.sum(-1), 1, rtol=1e-5)
  np.testing.assert_allclose(nn.log_softmax(x), np.log(s), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(nn.gelu(x, approximate=False), x * 0.5 * (1 + np.vectorize(
      __import__("math").erf)(x / np.sqrt(2))), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(nn.gelu(x), 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
                             rtol=1e-5, atol=1e-6)
  assert nn.one_hot(np.array([0, 2]), 3).tolist() == [[1, 0, 0], [0, 0, 1]]
  with pl.virtual_tpu("v5e"):
    out = m.pl.pallas_call(m.relu_kernel, out_shape=m.jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  np.testing.assert_array_equal(out, np.maximum(x, 0))


def test_random_is_deterministic():
  r = _shim().jax.random
  k = r.key(0)
  assert k.dtype == np.uint32 and k.shape == (2,)
  a, b = r.split(k)
  assert not np.array_equal(a, b) and np.array_equal(r.split(k)[0], a)
  n = r.normal(a, (4, 128))
  assert n.dtype == np.float32 and np.array_equal(n, r.normal(a, (4, 128)))
  u = r.uniform(b, (1000,), minval=2.0, maxval=3.0)
  assert 2.0 <= u.min() and u.max() < 3.0
  bits = r.bits(a, (8,))
  assert bits.dtype == np.uint32
  assert r.PRNGKey(5).tolist() == r.key(5).tolist()
  assert not np.array_equal(r.fold_in(k, 1), r.fold_in(k, 2))
  assert r.randint(a, (10,), 0, 5).max() < 5


def test_refs_tree_util_debug_and_scopes(capsys):
  m = _shim()
  jax = m.jax
  ref = jax.new_ref(np.ones((8, 128), np.float32))
  assert isinstance(ref, pl.Ref)
  np.testing.assert_array_equal(jax.freeze(ref), 1.0)
  e = jax.empty_ref(jax.ShapeDtypeStruct((8, 128), np.float32))
  assert np.isnan(jax.freeze(e)).all()
  tu = jax.tree_util
  leaves, td = tu.tree_flatten({"a": (1, 2), "b": [3]})
  assert leaves == [1, 2, 3] and tu.tree_unflatten(td, [4, 5, 6]) == {"a": (4, 5), "b": [6]}
  assert tu.tree_map(lambda v: v * 10, [1, (2,)]) == [10, (20,)] and tu.tree_leaves([1, [2]]) == [1, 2]
  assert jax.tree.leaves((1, 2)) == [1, 2]
  jax.debug.print("x={x} y={}", 7, x=3)
  assert "x=3 y=7" in capsys.readouterr().out
  np.testing.assert_array_equal(m.scoped_names(), [1.0, 1.0])
  assert isinstance(np.zeros(3), jax.Array) and not isinstance([1], jax.Array)
  assert jax.block_until_ready(5) == 5
  assert jax.ShapeDtypeStruct.like(np.zeros((2, 3), np.int32)).shape == (2, 3)
  import ml_dtypes
  assert m.jnp.bfloat16 == ml_dtypes.bfloat16
  with pl.virtual_tpu("v5p", num_chips=2):
    ds = jax.devices()
    assert [d.device_kind for d in ds] == ["TPU v5", "TPU v5"] and jax.device_count() == 2


def test_sharding_shard_map_make_mesh():
  jax = _shim().jax
  P = jax.sharding.PartitionSpec
  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(32, 128)
  with pl.virtual_tpu("v5e", num_chips=4):
    mesh = jax.make_mesh((4,), ("x",))
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("x")))

    def local(s):
      assert jax.lax.axis_size("x") == 4
      return s + jax.lax.axis_index("x")
    out = jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(xs)
  np.testing.assert_array_equal(out, x + np.repeat(np.arange(4), 8)[:, None])


def test_vmap_and_host_numpy_fallbacks():
  jax = _shim().jax
  jnp = jax.numpy
  f = jax.vmap(lambda a, b: a * b, in_axes=(0, None))
  np.testing.assert_array_equal(f(np.ones((3, 2)), np.float32(2)), np.full((3, 2), 2.0))
  assert jnp.pad(np.ones((2,), np.float32), 1).tolist() == [0, 1, 1, 0]
  assert jnp.repeat(np.arange(3), np.array([1, 2, 0]), total_repeat_length=5).tolist() == [0, 1, 1, 1, 1]


def test_run_pallas_file_and_run_path():
  tpu = pc.run_pallas_file(HERE / "jax_script.py", chip="v6e", argv=["--flag"])
  assert len(tpu.reports) == 1 and tpu.chip.name == "v6e"
  g = pc.run_path(HERE / "jax_script.py", argv=["a"])
  assert g["RESULT"] == ("ok", ["a"]) and g["__name__"] == "__main__"


def test_load_module_errors():
  with pytest.raises(pl.UsageError, match="no such file"):
    pc.load_module("/nonexistent/k.py")
  with pytest.raises(pl.UsageError):
    pc.load_module("jax.numpy")


def test_cli_run_compat_flag():
  pytest.importorskip("click")
  pytest.importorskip("rich")
  from click.testing import CliRunner

  from palace._src.tools.cli import main
  r = CliRunner().invoke(main, ["run", "--compat", "--chip", "v6e", str(HERE / "jax_script.py"), "x"])
  assert r.exit_code == 0, r.output
  assert "jax_script ok __main__" in r.output and "add_one" in r.output
