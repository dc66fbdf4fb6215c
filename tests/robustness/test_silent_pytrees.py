"""Registered pytree classes are nodes when palace flattens operands (pallas_call scalar prefetch and
inputs, pl.kernel inputs, outputs): a registered dataclass of arrays arrives in the kernel as the same
dataclass of refs, not as one opaque object."""
import dataclasses
import textwrap

import numpy as np
import pytest

import palace as pl
import palace.compat
from palace import tpu as pltpu
from palace._src import util

SHAPE = (8, 128)


@dataclasses.dataclass
class Prefetch:
  rows: object
  scale: object
  name: str = dataclasses.field(default="p", metadata={"static": True})


util.register_dataclass(Prefetch)


class Pair:
  def __init__(self, a, b):
    self.a, self.b = a, b


util.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda aux, kids: Pair(*kids))


def test_util_flatten_honours_registrations():
  leaves, td = util.tree_flatten({"p": Prefetch(1, 2, "q"), "x": Pair(3, [4, 5])})
  assert leaves == [1, 2, 3, 4, 5]
  back = util.tree_unflatten(td, [10, 20, 30, 40, 50])
  assert isinstance(back["p"], Prefetch) and (back["p"].rows, back["p"].scale, back["p"].name) == (10, 20, "q")
  assert isinstance(back["x"], Pair) and back["x"].b == [40, 50]


def test_registered_dataclass_of_scalar_prefetch_arrays():
  rows = np.array([1, 0], np.int32)
  scale = np.array([3], np.int32)
  x = np.arange(2 * 8 * 128, dtype=np.float32).reshape(16, 128)

  def kernel(pre, x_ref, o_ref):
    assert isinstance(pre, Prefetch) and pre.name == "p"
    o_ref[...] = x_ref[...] * pre.scale[0].astype(np.float32)

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((16, 128), np.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(2,),
                         in_specs=[pl.BlockSpec(SHAPE, lambda i, pre: (pre.rows[i], 0))],
                         out_specs=pl.BlockSpec(SHAPE, lambda i, pre: (i, 0))))
  with pl.virtual_tpu("v5e"):
    out = f(Prefetch(rows, scale), x)
  np.testing.assert_array_equal(out, 3 * np.concatenate([x[8:], x[:8]]))


def test_registered_node_as_kernel_input_and_output_structure():
  x = np.ones(SHAPE, np.float32)

  def body(pair, o_ref):
    assert isinstance(pair, Pair)
    pltpu.sync_copy(pair.b, o_ref)

  k = pl.kernel(body, out_type=pl.ShapeDtypeStruct(SHAPE, np.float32),
                mesh=pltpu.TensorCoreMesh("core", 1))
  with pl.virtual_tpu("v5e"):
    out = k(Pair(x, 2 * x))
  np.testing.assert_array_equal(out, 2 * x)


def test_shim_tree_util_registration_reaches_pallas_call(tmp_path):
  src = tmp_path / "prefetch_mod.py"
  src.write_text(textwrap.dedent('''
      import dataclasses
      import jax
      import jax.numpy as jnp
      from jax.experimental import pallas as pl
      from jax.experimental.pallas import tpu as pltpu

      @jax.tree_util.register_dataclass
      @dataclasses.dataclass
      class Meta:
        offsets: jax.Array
        tag: str = jax.tree.static(default="m")

      def kernel(meta, x_ref, o_ref):
        assert isinstance(meta, Meta), type(meta)
        o_ref[...] = x_ref[...] + meta.offsets[0].astype(jnp.float32)

      def run(x, off):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(1,),
                in_specs=[pl.BlockSpec(x.shape, lambda i, m: (0, 0))],
                out_specs=pl.BlockSpec(x.shape, lambda i, m: (0, 0))))(Meta(off), x)
  '''))
  mod = palace.compat.load_module(str(src))
  x = np.zeros(SHAPE, np.float32)
  with pl.virtual_tpu("v5e"):
    out = mod.run(x, np.array([5], np.int32))
  np.testing.assert_array_equal(out, x + 5)


def test_class_registered_with_real_jax_is_a_node():
  jax = pytest.importorskip("jax")

  @jax.tree_util.register_dataclass
  @dataclasses.dataclass
  class Offsets:
    rows: object
    tag: str = dataclasses.field(default="t", metadata={"static": True})

  leaves, td = util.tree_flatten([Offsets(np.int32(1))])
  assert len(leaves) == 1 and leaves[0] == 1
  back = util.tree_unflatten(td, [7])
  assert isinstance(back[0], Offsets) and back[0].rows == 7 and back[0].tag == "t"

  x = np.arange(2 * 8 * 128, dtype=np.float32).reshape(16, 128)

  def kernel(off, x_ref, o_ref):
    assert isinstance(off, Offsets)
    o_ref[...] = x_ref[...]

  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(SHAPE, np.float32),
                     grid_spec=pltpu.PrefetchScalarGridSpec(
                         num_scalar_prefetch=1, grid=(1,),
                         in_specs=[pl.BlockSpec(SHAPE, lambda i, off: (off.rows[0], 0))],
                         out_specs=pl.BlockSpec(SHAPE, lambda i, off: (0, 0))))
  with pl.virtual_tpu("v5e"):
    out = f(Offsets(np.array([1], np.int32)), x)
  np.testing.assert_array_equal(np.asarray(out), x[8:])
