"""palace.jax on meshes of several axes (4 host CPU devices as a 2x2 mesh): device id forms and
shard_maps over some of the axes.

- Device ids of remote copies and signals map as JAX's TPU lowering maps them
  (jax/_src/pallas/primitives.py: device_id_to_logical): DeviceIdType.LOGICAL (a device's row-major
  position in the mesh), MESH tuples (one coordinate per mesh axis), MESH dicts of the axes that
  change, including a joint key ('x', 'y'). Each form gives JAX's interpret mode's result, and the
  modelled cycles of palace's own pl.shard_map running the same kernel source.
- A kernel inside a jax.shard_map over only some mesh axes is refused, as JAX 0.12's TPU lowering
  refuses it (pinned here through JAX's own TPU lowering, which runs without a TPU); the form JAX's
  error asks for, a nested shard_map over the remaining axes, runs as one pod launch equal to
  palace's own pl.shard_map on the whole mesh.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import palace as ppl
import palace.jax as pj
from palace import lax as plax
from palace import tpu as ptpu

X = np.arange(32 * 128, dtype=np.float32).reshape(32, 128)
JAX = (pl, pltpu, lax, jax.ShapeDtypeStruct)
PALACE = (ppl, ptpu, plax, ppl.ShapeDtypeStruct)


def _mesh():
  return jax.make_mesh((2, 2), ("x", "y"))


def _shift_kernel(api, form):
  """Each device tells the previous one (row-major over the 2x2 mesh) that its output exists, waits
  for the next one, then copies its block into the next one's output: out block k = in block k - 1."""
  pl_, pltpu_, lax_, _ = api

  def dev(k):
    if form == "logical":
      return {"device_id": k, "device_id_type": pl_.DeviceIdType.LOGICAL}
    if form == "tuple":   # lax.div / lax.rem: one op each in both worlds (jnp's // is several)
      return {"device_id": (lax_.div(k, 2), lax_.rem(k, 2))}
    return {"device_id": {("x", "y"): k}}

  def kernel(x_ref, o_ref, send, recv):
    me = lax_.axis_index("x") * 2 + lax_.axis_index("y")
    barrier = pltpu_.get_barrier_semaphore()
    pl_.semaphore_signal(barrier, 1, **dev(lax_.rem(me + 3, 4)))   # to the one writing into me
    pl_.semaphore_wait(barrier, 1)
    copy = pltpu_.make_async_remote_copy(x_ref, o_ref, send, recv, **dev(lax_.rem(me + 1, 4)))
    copy.start()
    copy.wait()
  return kernel


def _call(api, kernel, shape):
  pl_, pltpu_, _, sds = api
  return pl_.pallas_call(kernel, out_shape=sds(shape, jnp.float32),
                         in_specs=[pl_.BlockSpec(memory_space=pl_.ANY)],
                         out_specs=pl_.BlockSpec(memory_space=pl_.ANY),
                         scratch_shapes=[pltpu_.SemaphoreType.DMA, pltpu_.SemaphoreType.DMA],
                         compiler_params=pltpu_.CompilerParams(collective_id=0))


def _over_the_mesh(kernel):
  """The jitted shard_map of `kernel` over the whole 2x2 mesh, and X sharded over it."""
  mesh = _mesh()
  f = jax.jit(jax.shard_map(lambda a: _call(JAX, kernel, a.shape)(a), mesh=mesh,
                            in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False))
  return f, jax.device_put(X, jax.sharding.NamedSharding(mesh, P(("x", "y"))))


def _jax_shift(form):
  return _over_the_mesh(_shift_kernel(JAX, form))


def _own(kernel, spec):
  """palace's own pl.shard_map over the 2x2 mesh: (result, its one report)."""
  with ppl.virtual_tpu("v5e", num_chips=4) as tpu:
    mesh = ppl.make_mesh((2, 2), ("x", "y"))
    out = ppl.shard_map(lambda a: _call(PALACE, kernel, a.shape)(a), mesh=mesh, in_specs=spec,
                        out_specs=spec)(X)
  (report,) = tpu.reports
  return np.asarray(out), report


def _jax_interpret(f, x):
  pltpu.reset_tpu_interpret_mode_state()
  with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(dma_execution_mode="eager")):
    return np.asarray(f(x))


@pytest.mark.filterwarnings("ignore:.*(DeviceIdType|device_id_type) is deprecated:DeprecationWarning")
@pytest.mark.parametrize("form", ["logical", "tuple", "joint"])
def test_device_id_forms_map_as_jax_tpu_lowering_and_match_palace_own_shard_map(form):
  f, x = _jax_shift(form)
  f.trace(x).lower(lowering_platforms=("tpu",))   # a program JAX's TPU lowering takes
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    got = np.asarray(f(x))
  want = np.roll(X.reshape(4, 8, 128), 1, axis=0).reshape(32, 128)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, _jax_interpret(*_jax_shift(form)))
  own, report = _own(_shift_kernel(PALACE, form), ppl.P(("x", "y")))   # the same kernel source
  np.testing.assert_array_equal(own, want)
  (mine,) = tpu.reports
  assert (mine.kernel_name, mine.num_chips, mine.ici_bytes) == (report.kernel_name, 4, 4 * 8 * 128 * 4)
  assert mine.device_cycles == report.device_cycles


def test_a_mesh_device_id_needs_one_coordinate_per_mesh_axis_as_in_jax_tpu_lowering():
  def kernel(x_ref, o_ref, send, recv):
    me = lax.axis_index("x") * 2 + lax.axis_index("y")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=lax.rem(me + 1, 4))
    copy.start()
    copy.wait()
  f, x = _over_the_mesh(kernel)
  with pytest.raises(ValueError, match=r"Number of device ids must match the number of mesh axes, "
                                       r"but got 1 ids for a 2D mesh"):
    f.trace(x).lower(lowering_platforms=("tpu",))    # JAX's own TPU lowering
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    with pytest.raises(ppl.UsageError, match=r"device_id of dma_start at kernel line "
                                             r"test_multichip.py:\d+ \(.*kernel\) has 1 "
                                             r"coordinate\(s\) for the 2-D mesh \('x', 'y'\).*Fix: "
                                             r"pass one coordinate per mesh axis"):
      f(x)
  assert not tpu.reports


def _exchange_kernel(api):
  """Swap blocks along mesh axis 'x' (a dict device id: 'y' stays the device's own)."""
  pl_, pltpu_, lax_, _ = api

  def kernel(x_ref, o_ref, send, recv):
    other = 1 - lax_.axis_index("x")
    barrier = pltpu_.get_barrier_semaphore()
    pl_.semaphore_signal(barrier, 1, device_id={"x": other})
    pl_.semaphore_wait(barrier, 1)
    copy = pltpu_.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": other})
    copy.start()
    copy.wait()
  return kernel


def _local_kernel(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1.0


def _named(f, name):
  f.__name__ = name
  return f


def _local_mesh_kernel(x):
  @pl.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
             mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1))
  def copy_kernel(x_hbm, o_hbm):
    pltpu.sync_copy(x_hbm, o_hbm)
  return copy_kernel(x)


_MOSAIC = (NotImplementedError, r"Mosaic kernels cannot be automatically partitioned. Please wrap "
                                r"the call in a shard_map")
# what -> (the shard_map body, JAX's own TPU lowering error: type, message; None: not lowered here,
# pl.kernel's TPU lowering reads the TPU generation, which host CPU devices have none of)
_PARTIAL = {
    # a dict device id fills in the other mesh axes with axis_index, unbound for the automatic 'y'
    "pallas_call 'exchange'": (
        lambda a: _call(JAX, _named(_exchange_kernel(JAX), "exchange"), a.shape)(a),
        (NameError, r"Found an unbound axis name: y")),
    "pallas_call '_local_kernel'": (
        lambda a: pl.pallas_call(_local_kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype))(a),
        _MOSAIC),
    "pl.kernel 'copy_kernel'": (_local_mesh_kernel, None),
}


@pytest.mark.parametrize("what", list(_PARTIAL))
def test_a_kernel_in_a_shard_map_over_some_mesh_axes_is_refused_as_jax_tpu_lowering_refuses_it(what):
  body, tpu_error = _PARTIAL[what]
  mesh = _mesh()
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"},
                            check_vma=False))
  x = jax.device_put(X, jax.sharding.NamedSharding(mesh, P("x")))
  # JAX 0.12 itself: its TPU lowering refuses every Mosaic kernel there (a communicating one even
  # before that check), and its interpret mode cannot emit its host callbacks there
  if tpu_error is not None:
    with pytest.raises(tpu_error[0], match=tpu_error[1]):
      f.trace(x).lower(lowering_platforms=("tpu",))
  with pytest.raises(NotImplementedError, match=r"callbacks are only supported in spmd computations "
                                                r"when all mesh axes are partitioned manually"):
    _jax_interpret(f, x)
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    with pytest.raises(ppl.UnsupportedError, match=rf"{what} inside a jax.shard_map over only some "
                                                   r"mesh axes \(manual \['x'\], automatic \['y'\] of "
                                                   r"the mesh \['x', 'y'\]\).*Fix: wrap the call in a "
                                                   r"jax.shard_map over the remaining axes "
                                                   r"\(axis_names=\{'y'\}"):
      f(x)
  assert not tpu.reports


def test_the_nested_shard_map_jax_asks_for_is_one_pod_launch_equal_to_palace_own_shard_map():
  """shard_map over 'x', inside it one over the remaining axis 'y' (operands replicated over it):
  every device runs the kernel; the devices of one 'y' column exchange their 'x' blocks. Inside it
  every axis is manual, so all four devices meet in one pod launch, numbered row-major over the
  whole mesh, as palace's own pl.shard_map over the 2x2 mesh with the same specs runs it."""
  mesh = _mesh()
  kernel = _exchange_kernel(JAX)

  def inner(a):
    return _call(JAX, kernel, a.shape)(a)

  def outer(a):
    return jax.shard_map(inner, in_specs=P(), out_specs=P(), axis_names={"y"}, check_vma=False)(a)
  f = jax.jit(jax.shard_map(outer, mesh=mesh, in_specs=P("x"), out_specs=P("x"), axis_names={"x"},
                            check_vma=False))
  x = jax.device_put(X, jax.sharding.NamedSharding(mesh, P("x")))
  f.trace(x).lower(lowering_platforms=("tpu",))   # JAX's TPU lowering takes this form
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    got = np.asarray(f(x))
  want = np.concatenate([X[16:], X[:16]])
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, _jax_interpret(f, x))
  own, report = _own(_exchange_kernel(PALACE), ppl.P("x"))
  np.testing.assert_array_equal(own, want)
  (mine,) = tpu.reports
  assert (mine.num_chips, mine.ici_bytes) == (4, 4 * 16 * 128 * 4)
  assert mine.device_cycles == report.device_cycles
  assert mine.unit_busy_cycles == report.unit_busy_cycles


@pytest.mark.filterwarnings("ignore:.*(DeviceIdType|device_id_type) is deprecated:DeprecationWarning")
def test_logical_ids_and_chips_are_positions_in_the_mesh_whatever_its_device_order():
  """A LOGICAL id, like palace's chip index, is a device's row-major position in the mesh (its
  partition id), not its jax device id: a mesh over the devices in another order gives the same
  result and modelled time."""
  results = []
  for order in ([0, 1, 2, 3], [3, 1, 2, 0]):
    mesh = jax.sharding.Mesh(np.array(jax.devices())[order].reshape(2, 2), ("x", "y"))
    kernel = _shift_kernel(JAX, "logical")
    f = jax.jit(jax.shard_map(lambda a, k=kernel: _call(JAX, k, a.shape)(a), mesh=mesh,
                              in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False))
    x = jax.device_put(X, jax.sharding.NamedSharding(mesh, P(("x", "y"))))
    with pj.virtual_tpu("v5e", num_chips=4) as tpu:
      got = np.asarray(f(x))
    np.testing.assert_array_equal(got, _jax_interpret(f, x))
    results.append((got, tpu.reports[0].device_cycles))
  np.testing.assert_array_equal(results[0][0], np.roll(X.reshape(4, 8, 128), 1, axis=0).reshape(32, 128))
  np.testing.assert_array_equal(results[0][0], results[1][0])
  assert results[0][1] == results[1][1]


def _swap_kernel(api):
  """Two devices: each tells the other its output exists, then copies its block into the other's."""
  pl_, pltpu_, lax_, _ = api

  def kernel(x_ref, o_ref, send, recv):
    other = 1 - lax_.axis_index("x")
    pl_.semaphore_signal(pltpu_.get_barrier_semaphore(), 1, device_id=(other,))
    pl_.semaphore_wait(pltpu_.get_barrier_semaphore(), 1)
    copy = pltpu_.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(other,))
    copy.start()
    copy.wait()
  return kernel


@pytest.mark.parametrize("devices", [[0, 1], [2, 3]])
def test_a_mesh_over_some_of_the_devices_runs_on_those_chips_as_palace_own_mesh_of_them(devices):
  """A jax.sharding.Mesh over jax.devices()[:2] (JAX's distributed tests) on a 4-chip virtual TPU:
  a pod launch of 2 chips placed at those devices, as palace's make_mesh(devices=...) places it (before
  session 20 palace required the mesh to cover every chip)."""
  mesh = jax.sharding.Mesh(np.array(jax.devices())[devices], ("x",))
  x16 = X[:16]
  f = jax.jit(jax.shard_map(lambda a: _call(JAX, _swap_kernel(JAX), a.shape)(a), mesh=mesh,
                            in_specs=P("x"), out_specs=P("x"), check_vma=False))
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    got = np.asarray(f(jax.device_put(x16, jax.sharding.NamedSharding(mesh, P("x")))))
  np.testing.assert_array_equal(got, np.concatenate([x16[8:], x16[:8]]))
  (mine,) = tpu.reports
  with ppl.virtual_tpu("v5e", num_chips=4) as own_tpu:
    own_mesh = ppl.make_mesh((2,), ("x",), devices=devices)
    own = ppl.shard_map(lambda a: _call(PALACE, _swap_kernel(PALACE), a.shape)(a), mesh=own_mesh,
                        in_specs=ppl.P("x"), out_specs=ppl.P("x"))(x16)
  np.testing.assert_array_equal(np.asarray(own), got)
  (report,) = own_tpu.reports
  assert (mine.num_chips, mine.device_cycles) == (2, report.device_cycles)


def test_a_smaller_mesh_without_its_devices_is_still_refused():
  with ppl.virtual_tpu("v5e", num_chips=4), pytest.raises(
      ppl.UsageError, match=r"make_mesh\(2,\): the mesh has 2 chips but the virtual TPU has 4\. Fix: use "
                            r"pl.virtual_tpu\('v5e', num_chips=2\), or pass devices="):
    ppl.make_mesh((2,), ("x",))


@pytest.mark.parametrize("key,jax_error,jax_says,error,palace_says", [
    (("x", "core"), NotImplementedError, r"\('x', 'core'\) mixes JAX mesh and Pallas mesh grid axes",
     ppl.UnsupportedError,
     r"joins the axes \('x', 'core'\), which mix shard_map mesh axes \('x', 'y'\) with kernel mesh axes"),
    (("a", "b"), ValueError, r"Unrecognized axes in device_id",
     ppl.UsageError, r"joins the axes \('a', 'b'\), which are not shard_map mesh axes \('x', 'y'\)"),
])
def test_a_joint_device_id_key_names_mesh_axes_only_as_in_jax_tpu_lowering(key, jax_error, jax_says,
                                                                              error, palace_says):
  def kernel(x_ref, o_ref, send, recv):
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={key: 0})
    copy.start()
    copy.wait()
  f, x = _over_the_mesh(kernel)
  with pytest.raises(jax_error, match=jax_says):
    f.trace(x).lower(lowering_platforms=("tpu",))    # JAX's own TPU lowering
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    with pytest.raises(error, match=palace_says):
      f(x)
  assert not tpu.reports


_MODULE = '''
import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

P = jax.sharding.PartitionSpec


def kernel(x_ref, o_ref, send, recv):
  me = lax.axis_index("x") * 2 + lax.axis_index("y")
  barrier = pltpu.get_barrier_semaphore()
  pl.semaphore_signal(barrier, 1, device_id=lax.rem(me + 3, 4), device_id_type=pl.DeviceIdType.LOGICAL)
  pl.semaphore_wait(barrier, 1)
  copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=lax.rem(me + 1, 4),
                                      device_id_type=pl.DeviceIdType.LOGICAL)
  copy.start()
  copy.wait()


def shift(x):
  mesh = jax.make_mesh((2, 2), ("x", "y"))
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                        out_specs=pl.BlockSpec(memory_space=pl.ANY),
                        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
                        compiler_params=pltpu.CompilerParams(collective_id=0))
  x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(("x", "y"))))
  return jax.shard_map(call, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y")),
                       check_vma=False)(x)
'''


@pytest.mark.filterwarnings("ignore:.*(DeviceIdType|device_id_type) is deprecated:DeprecationWarning")
def test_a_jax_module_with_logical_ids_runs_alike_through_palace_jax_and_palace_compat(tmp_path):
  """The same file, imported with the real JAX (kernels on palace.jax) and through palace.compat
  (JAX's names answered by palace, palace's own pl.shard_map and pl.DeviceIdType)."""
  import importlib.util
  import palace.compat
  path = tmp_path / "logical_shift.py"
  path.write_text(_MODULE)
  spec = importlib.util.spec_from_file_location("logical_shift", path)
  real = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(real)
  with pj.virtual_tpu("v5e", num_chips=4) as tpu:
    got = np.asarray(jax.jit(real.shift)(X))
  with ppl.virtual_tpu("v5e", num_chips=4) as own:
    want = np.asarray(palace.compat.load_module(path).shift(X))
  np.testing.assert_array_equal(got, np.roll(X.reshape(4, 8, 128), 1, axis=0).reshape(32, 128))
  np.testing.assert_array_equal(got, want)
  assert tpu.reports[0].device_cycles == own.reports[0].device_cycles


@pytest.mark.parametrize("chip,cores", [("v5e", 1), ("v5p", 2)])
def test_a_default_size_tensorcore_mesh_inside_a_shard_map_has_the_chips_cores(chip, cores):
  """Inside a jax.shard_map JAX sizes `TensorCoreMesh(axis_name=...)` from the mesh's abstract device,
  which keeps `num_cores` for TPU devices only: on the CPU devices it was None and `lax.axis_size`
  raised a bare TypeError (JAX's test_multi_device_core_local_kernel). Each core copies its own
  slice, so a wrong core count leaves part of the output unwritten."""
  x = np.arange(4 * cores * 8 * 128, dtype=np.int32).reshape(4, cores, 8, 128)

  def body(a):
    x_ref, y_ref = jax.new_ref(a), jax.new_ref(jnp.zeros_like(a))

    @pl.core_map(pltpu.TensorCoreMesh(axis_name="core"))
    def _():
      for c in range(lax.axis_size("core")):
        @pl.when(lax.axis_index("core") == c)
        def _():
          pltpu.sync_copy(x_ref.at[:, c], y_ref.at[:, c])
    return jax.freeze(y_ref)

  with pj.virtual_tpu(chip, num_chips=4):
    mesh = jax.make_mesh((4,), ("x",))
    y = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))(jax.device_put(x, jax.NamedSharding(mesh, P("x"))))
    assert pltpu.TensorCoreMesh(axis_name="core").num_cores == cores
  np.testing.assert_array_equal(np.asarray(y), x)
