"""Modules loaded by palace.compat.load_module behave like imported ones (dataclasses with postponed
annotations, relative and sibling imports through the same shim, their own __future__ flags), and meshes
can be built before entering pl.virtual_tpu, as in JAX, and are checked when a launch uses them."""
import sys
import textwrap

import numpy as np
import pytest

import palace as pl
import palace.compat
import palace.numpy as pjnp
from palace import UsageError, lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(textwrap.dedent(text))
  return path


DATACLASS_MOD = '''
    from __future__ import annotations
    import dataclasses
    import jax.numpy as jnp

    @dataclasses.dataclass(frozen=True)
    class Config:
      block: int = 128
      name: str = "c"
      dtype: object = jnp.float32
'''


def test_dataclass_with_postponed_annotations(tmp_path):
  mod = palace.compat.load_module(_write(tmp_path / "cfg_mod.py", DATACLASS_MOD))
  c = mod.Config()
  assert (c.block, c.name) == (128, "c")
  assert mod.Config.__annotations__["block"] == "int"   # the module's own future flag


def test_module_without_future_import_keeps_real_annotations(tmp_path):
  mod = palace.compat.load_module(_write(tmp_path / "ann_mod.py", '''
      import dataclasses
      @dataclasses.dataclass
      class C:
        x: int = 1
  '''))
  assert mod.C.__annotations__["x"] is int   # not stringified by palace's own __future__ import


def test_load_leaves_sys_modules_alone(tmp_path):
  before = set(sys.modules)
  palace.compat.load_module(_write(tmp_path / "cfg_mod2.py", DATACLASS_MOD))
  assert "cfg_mod2" not in sys.modules
  assert not {m for m in set(sys.modules) - before if m.startswith(("jax", "cfg_mod"))}


def _check_shimmed(jnp_mod):
  assert jnp_mod.zeros is pjnp.zeros or jnp_mod.__name__ == "jax.numpy"
  assert getattr(jnp_mod, "__file__", None) is None   # a shim module, not the real jax.numpy


def test_relative_and_absolute_sibling_imports_in_a_package(tmp_path):
  pkg = tmp_path / "mykern"
  _write(pkg / "__init__.py", "from . import helpers\n")
  _write(pkg / "helpers.py", '''
      import jax.numpy as jnp
      def double(x):
        return jnp.asarray(x) * 2
  ''')
  _write(pkg / "sub" / "__init__.py", "")
  _write(pkg / "sub" / "deep.py", '''
      from .. import helpers
      from ..helpers import double
      import mykern.helpers as absolute
      import jax.numpy as jnp
  ''')
  _write(pkg / "main.py", '''
      from __future__ import annotations
      from . import helpers
      from .sub import deep
      from mykern.sub.deep import double
      import jax.numpy as jnp
  ''')
  mod = palace.compat.load_module(pkg / "main.py")
  assert mod.__name__ == "mykern.main" and mod.__package__ == "mykern"
  for m in (mod.jnp, mod.helpers.jnp, mod.deep.jnp, mod.deep.absolute.jnp):
    _check_shimmed(m)
  assert mod.deep.helpers is mod.helpers and mod.deep.absolute is mod.helpers
  assert mod.double is mod.helpers.double
  np.testing.assert_array_equal(mod.double(np.arange(3)), 2 * np.arange(3))
  assert "mykern" not in sys.modules and "mykern.helpers" not in sys.modules


def test_sibling_module_of_a_plain_file(tmp_path):
  _write(tmp_path / "sib_helpers.py", "import jax.numpy as jnp\nK = 3\n")
  mod = palace.compat.load_module(_write(tmp_path / "sib_main.py", '''
      import sib_helpers
      from sib_helpers import K
  '''))
  _check_shimmed(mod.sib_helpers.jnp)
  assert mod.K == 3 and "sib_helpers" not in sys.modules


def test_module_level_meshes_built_before_virtual_tpu(tmp_path):
  mod = palace.compat.load_module(_write(tmp_path / "mesh_mod.py", '''
      import jax
      from jax.experimental import pallas as pl
      from jax.experimental.pallas import tpu as pltpu
      from jax.experimental.pallas import tpu_sc as plsc
      TC = pltpu.TensorCoreMesh("core", num_cores=1)
      SC = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")
      SCALAR = plsc.ScalarSubcoreMesh(axis_name="c")
      MESH = jax.make_mesh((2,), ("x",))
  '''))
  assert mod.SC.num_cores is None and mod.MESH.size == 2
  with pl.virtual_tpu("v5p"):
    info = plsc.get_sparse_core_info()
    assert mod.SC.shape == {"c": info.num_cores, "s": info.num_subcores}
    assert mod.SCALAR.shape == {"c": info.num_cores}


def test_sparsecore_mesh_before_virtual_tpu_runs_a_kernel():
  mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=2)
  x = np.arange(2 * 8, dtype=np.int32).reshape(2, 8)

  def body(x_hbm, o_hbm, buf):
    i = lax.axis_index("s")
    pltpu.sync_copy(x_hbm.at[i], buf)
    pltpu.sync_copy(buf, o_hbm.at[i])

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((2, 8), np.int32), mesh=mesh,
                scratch_types=[pltpu.VMEM((8,), pjnp.int32)])
  with pl.virtual_tpu("v5p"):
    out = k(x)
  np.testing.assert_array_equal(out, x)


def test_sparsecore_mesh_before_virtual_tpu_is_checked_at_use():
  mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1, num_subcores=2)

  def body(o_hbm):
    pass

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((8,), np.int32), mesh=mesh)
  with pl.virtual_tpu("v5e"):
    with pytest.raises(UsageError, match="does not have SparseCores"):
      k()
  big = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=64)
  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct((8,), np.int32), mesh=big)
  with pl.virtual_tpu("v5p"):
    with pytest.raises(UsageError, match="num_cores=64.*does not fit v5p"):
      k()


def test_sparsecore_mesh_inside_virtual_tpu_is_checked_at_construction():
  with pl.virtual_tpu("v5e"):
    with pytest.raises(UsageError, match="does not have SparseCores"):
      plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s")


def test_make_mesh_before_virtual_tpu_is_laid_out_and_checked_at_use():
  mesh = pl.make_mesh((4,), ("x",))
  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(32, 128)

  def per_chip(xs):
    return xs * 2

  with pl.virtual_tpu("v5e", num_chips=4):
    out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
    inside = pl.make_mesh((4,), ("x",))
  np.testing.assert_array_equal(out, 2 * x)
  assert mesh.placed is False and mesh.placed_on(pl.virtual_tpu("v5e", num_chips=4)) == inside
  with pl.virtual_tpu("v5e", num_chips=2):
    with pytest.raises(UsageError, match="4 chips"):
      pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P("x"), out_specs=pl.P("x"))(x)
