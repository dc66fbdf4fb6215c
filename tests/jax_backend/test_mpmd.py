"""MPMD `pl.kernel` through real JAX (jax/launch.py plan_mpmd_map): a SparseCore kernel with a scalar
subcore body and a vector subcore body runs each on its own mesh's cores, by palace's MPMD launch
(launch/run.py). Semaphores tied to one mesh (`pltpu.SemaphoreType.REGULAR(()) @ mesh`) live on that
mesh's cores; the other body signals them there, a device id naming the target mesh's axes
(`{'subcore': s}` from the scalar subcore). Results are compared with NumPy; one report per launch.
What palace does not cover is refused while lowering, naming it."""
import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc
from jax.sharding import PartitionSpec as P

import palace as ppl
import palace.jax as pj

CORES, SUBCORES, N = 2, 4, 16


def _meshes():
  scs = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=CORES)
  vec = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=CORES,
                               num_subcores=SUBCORES)
  return scs, vec


def _exchange(x, scs, vec, *, wait_in_vec_body=False, name_subcore=True):
  """The scalar subcore of each SparseCore copies its rows of `x` into shared VMEM and signals each
  vector subcore; subcore s reads row s, writes 3 * row + s back in place and signals the scalar
  subcore, which waits for all of them and copies the shared rows out."""
  def go_scs(x_hbm, o_hbm, *, shared, to_vec, to_scs):
    c = jax.lax.axis_index("core")
    pltpu.sync_copy(x_hbm.at[c], shared)
    for s in range(SUBCORES):
      pl.semaphore_signal(to_vec, device_id={"subcore": s} if name_subcore else None)
    pl.semaphore_wait(to_scs, SUBCORES)
    pltpu.sync_copy(shared, o_hbm.at[c])

  def go_vec(x_hbm, o_hbm, *, shared, to_vec, to_scs):
    s = jax.lax.axis_index("subcore")
    row = jax.empty_ref(jax.core.ShapedArray((N,), jnp.int32), memory_space=pltpu.VMEM)
    pl.semaphore_wait(to_scs if wait_in_vec_body else to_vec, 1)
    pltpu.sync_copy(shared.at[s], row)
    row[...] = row[...] * 3 + s
    pltpu.sync_copy(row, shared.at[s])
    pl.semaphore_signal(to_scs)

  return pl.kernel(
      body=[go_scs, go_vec], mesh=[scs, vec],
      out_type=jax.ShapeDtypeStruct((CORES, SUBCORES, N), jnp.int32),
      scratch_types=dict(shared=pltpu.VMEM_SHARED((SUBCORES, N), jnp.int32),
                         to_vec=pltpu.SemaphoreType.REGULAR(()) @ vec,
                         to_scs=pltpu.SemaphoreType.REGULAR(()) @ scs))(x)


def _x():
  return (np.arange(CORES * SUBCORES * N) % 13).reshape(CORES, SUBCORES, N).astype(np.int32)


def test_scalar_and_vector_subcores_exchange_signals_and_data():
  x = _x()
  with pj.virtual_tpu("7x") as tpu:
    scs, vec = _meshes()
    out = np.asarray(jax.jit(lambda x: _exchange(x, scs, vec))(x))
  np.testing.assert_array_equal(out, x * 3 + np.arange(SUBCORES)[None, :, None])
  assert len(tpu.reports) == 1
  report = tpu.reports[0]
  assert report.kernel_name == "go_scs_go_vec" and report.device_cycles > 0


@pytest.mark.parametrize("kw, message", [
    ({"wait_in_vec_body": True},   # a core waits on its own mesh's semaphores only
     r"pl.semaphore_wait on scratch\[1\], a semaphore tied to ScalarSubcoreMesh\(core=2\), from a "
     r"core of another mesh \(on chip 0 SparseCore \d+ vector subcore \d+ in kernel 'go_scs_go_vec'"),
    ({"name_subcore": False},      # the scalar subcore has no subcore axis to default to
     r"addresses VectorSubcoreMesh\(core=2, subcore=4\), whose axes \['subcore'\] this core's mesh "
     r"does not have"),
])
def test_misuse_of_the_other_meshs_semaphore_is_an_error(kw, message):
  with pj.virtual_tpu("7x"):
    scs, vec = _meshes()
    with pytest.raises(Exception, match=message):
      jax.block_until_ready(jax.jit(lambda x: _exchange(x, scs, vec, **kw))(_x()))


def test_mpmd_ring_across_chips():
  """Four 7x chips in a jax.shard_map: each chip's scalar subcores send their shared rows to the next
  chip's (a remote copy), then signal the vector subcores there, which add their own rows."""
  d = 4
  x = (np.arange(d * CORES * SUBCORES * N) % 17).reshape(d * CORES, SUBCORES, N).astype(np.int32)
  mesh = jax.make_mesh((d,), ("x",))
  with pj.virtual_tpu("7x", num_chips=d) as tpu:
    scs, vec = _meshes()

    def go_scs(x_hbm, o_hbm, *, send, recv, to_vec, sems):
      c, me = jax.lax.axis_index("core"), jax.lax.axis_index("x")
      pltpu.sync_copy(x_hbm.at[c], send)
      pltpu.async_remote_copy(send, recv, sems.at[0], sems.at[1], device_id={"x": (me + 1) % d}).wait()
      for s in range(SUBCORES):
        pl.semaphore_signal(to_vec, device_id={"subcore": s})

    def go_vec(x_hbm, o_hbm, *, send, recv, to_vec, sems):
      c, s = jax.lax.axis_index("core"), jax.lax.axis_index("subcore")
      a = jax.empty_ref(jax.core.ShapedArray((N,), jnp.int32), memory_space=pltpu.VMEM)
      b = jax.empty_ref(jax.core.ShapedArray((N,), jnp.int32), memory_space=pltpu.VMEM)
      pltpu.sync_copy(x_hbm.at[c, s], a)
      pl.semaphore_wait(to_vec, 1)
      pltpu.sync_copy(recv.at[s], b)
      a[...] = a[...] + b[...]
      pltpu.sync_copy(a, o_hbm.at[c, s])

    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    def f(x):
      return pl.kernel(
          body=[go_scs, go_vec], mesh=[scs, vec], out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
          scratch_types=dict(send=pltpu.VMEM_SHARED((SUBCORES, N), jnp.int32),
                             recv=pltpu.VMEM_SHARED((SUBCORES, N), jnp.int32),
                             to_vec=pltpu.SemaphoreType.REGULAR(()) @ vec,
                             sems=pltpu.SemaphoreType.DMA((2,)) @ scs))(x)

    out = np.asarray(jax.jit(f)(jax.device_put(x, jax.sharding.NamedSharding(mesh, P("x")))))
  per_chip = x.reshape(d, CORES, SUBCORES, N)
  np.testing.assert_array_equal(out.reshape(per_chip.shape), per_chip + np.roll(per_chip, 1, axis=0))
  assert len(tpu.reports) == 1 and tpu.reports[0].device_cycles > 0


def test_a_tensorcore_body_beside_sparsecore_bodies_is_refused_at_lowering():
  """(JAX traces it only without refs: the meshes' default memory spaces differ.)"""
  with pj.virtual_tpu("7x"):
    tc = pltpu.TensorCoreMesh(axis_name="tc", num_cores=1)
    scs, _ = _meshes()

    def sc_body():
      pass

    def tc_body():
      pass

    k = pl.kernel(body=[sc_body, tc_body], mesh=[scs, tc], out_type=())
    with pytest.raises(ppl.UnsupportedError, match=r"'sc_body_tc_body' with a TensorCoreMesh body beside "
                                                   r"SparseCore bodies .*'mpmd_map does not support TC "
                                                   r"kernels yet'.*\(kernel defined at test_mpmd.py:\d+\)"):
      jax.jit(k).lower().compile()


def test_a_semaphore_of_an_external_mesh_is_refused_at_lowering():
  with pj.virtual_tpu("7x"):
    scs, vec = _meshes()

    def body(o_hbm, sem):
      pl.semaphore_signal(sem)

    k = pl.kernel(body, mesh=scs, out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
                  scratch_types=[pltpu.SemaphoreType.REGULAR(()) @ vec])
    with pytest.raises(ppl.UnsupportedError, match=r"'body' with external meshes .*VectorSubcoreMesh.*"
                                                   r"\(kernel defined at test_mpmd.py:\d+\)"):
      jax.jit(k).lower().compile()
