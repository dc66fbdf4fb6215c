"""pl.kernel call forms, out_type, scratch, and host mutable refs (new_ref / empty_ref / freeze)."""
import functools

import numpy as np
import pytest

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu

MESH = pltpu.TensorCoreMesh("core", num_cores=1)
SHAPE = (16, 128)


def _double_body(x_hbm, o_hbm):
  def run(buf):
    pltpu.sync_copy(x_hbm, buf)
    buf[...] = buf[...] * 2
    pltpu.sync_copy(buf, o_hbm)
  pl.run_scoped(run, pltpu.VMEM(x_hbm.shape, x_hbm.dtype))


def _x(rng, shape=SHAPE):
  return rng.standard_normal(shape).astype(np.float32)


def test_direct_form(rng):
  x = _x(rng)
  f = pl.kernel(_double_body, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  np.testing.assert_array_equal(f(x), x * 2)


def test_decorator_and_partial_forms(rng):
  x = _x(rng)

  @pl.kernel(out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def deco(x_hbm, o_hbm):
    _double_body(x_hbm, o_hbm)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def part(x_hbm, o_hbm):
    _double_body(x_hbm, o_hbm)

  np.testing.assert_array_equal(deco(x), x * 2)
  np.testing.assert_array_equal(part(x), x * 2)


def test_inputs_and_outputs_are_hbm_refs(rng):
  seen = {}

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def k(x_hbm, o_hbm):
    seen["spaces"] = (x_hbm.memory_space, o_hbm.memory_space)
    pltpu.sync_copy(x_hbm, o_hbm)

  x = _x(rng)
  np.testing.assert_array_equal(k(x), x)
  assert seen["spaces"] == (pl.ANY, pl.ANY)


def test_hbm_ref_has_no_vector_access(rng):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def k(x_hbm, o_hbm):
    o_hbm[...] = x_hbm[...]

  with pytest.raises(pl.MemorySpaceError, match=r"args\[0\].*cannot be referenced directly"):
    k(_x(rng))


def test_out_type_dict_is_one_argument_and_inputs_keep_their_structure(rng):
  x, y = _x(rng), _x(rng)

  @functools.partial(pl.kernel, mesh=MESH,
                     out_type={"a": pl.ShapeDtypeStruct(SHAPE, jnp.float32),
                               "b": (pl.ShapeDtypeStruct(SHAPE, jnp.float32),)})
  def k(ins, outs):
    _double_body(ins["x"], outs["a"])
    pltpu.sync_copy(ins["y"][0], outs["b"][0])

  out = k({"x": x, "y": [y]})
  assert set(out) == {"a", "b"} and isinstance(out["b"], tuple)
  np.testing.assert_array_equal(out["a"], x * 2)
  np.testing.assert_array_equal(out["b"][0], y)


def test_out_type_sequence_is_splatted(rng):
  x = _x(rng)

  @functools.partial(pl.kernel, mesh=MESH, out_type=[pl.ShapeDtypeStruct(SHAPE, jnp.float32),
                                                     (pl.ShapeDtypeStruct(SHAPE, jnp.float32),) * 2])
  def k(x_hbm, a_hbm, bc):
    _double_body(x_hbm, a_hbm)
    pltpu.sync_copy(x_hbm, bc[0])
    pltpu.sync_copy(x_hbm, bc[1])

  a, (b, c) = k(x)
  np.testing.assert_array_equal(a, x * 2)
  np.testing.assert_array_equal(b, x)
  np.testing.assert_array_equal(c, x)


@pytest.mark.parametrize("space", ["vmem", "smem"])
def test_out_type_memory_ref(rng, space):
  shape = SHAPE if space == "vmem" else (8,)
  x = _x(rng, shape)
  out_type = pltpu.VMEM(shape, jnp.float32) if space == "vmem" else pltpu.SMEM(shape, jnp.float32)
  seen = {}

  @functools.partial(pl.kernel, out_type=out_type, mesh=MESH)
  def k(x_hbm, o_ref):
    seen["space"] = o_ref.memory_space
    pltpu.sync_copy(x_hbm, o_ref)
    if space == "vmem":
      o_ref[...] = o_ref[...] + 1
    else:
      for i in range(shape[0]):
        o_ref[i] = o_ref[i] + 1

  np.testing.assert_array_equal(k(x), x + 1)
  assert seen["space"] == (pltpu.VMEM if space == "vmem" else pltpu.SMEM)


def test_dict_scratch_types_become_kwargs(rng):
  x = _x(rng)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH,
                     scratch_types={"buf": pltpu.VMEM(SHAPE, jnp.float32), "sem": pltpu.SemaphoreType.DMA})
  def k(x_hbm, o_hbm, *, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start()
    pltpu.make_async_copy(x_hbm, buf, sem).wait()
    buf[...] = buf[...] + 3
    pltpu.async_copy(buf, o_hbm, sem).wait()

  np.testing.assert_array_equal(k(x), x + 3)


def test_list_scratch_types(rng):
  x = _x(rng)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH,
                     scratch_types=[pltpu.VMEM(SHAPE, jnp.float32), pltpu.SemaphoreType.DMA((2,))])
  def k(x_hbm, o_hbm, buf, sems):
    pltpu.async_copy(x_hbm, buf, sems.at[1]).wait()
    pltpu.async_copy(buf, o_hbm, sems.at[0]).wait()

  np.testing.assert_array_equal(k(x), x)


def test_body_must_return_none(rng):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def k(x_hbm, o_hbm):
    pltpu.sync_copy(x_hbm, o_hbm)
    return 1

  with pytest.raises(pl.UsageError, match=r"Kernel 'k' returned int; pl.kernel bodies must return None"):
    k(_x(rng))


def test_program_id_is_not_valid_in_kernel_body(rng):
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def k(x_hbm, o_hbm):
    pl.program_id(0)

  with pytest.raises(pl.UsageError, match=r"pl.kernel bodies have no grid"):
    k(_x(rng))


# ------------------------------------------------------------------ host mutable refs
def test_new_ref_host_read_write_and_views(rng):
  x = _x(rng)
  r = pl.new_ref(x)
  x[0, 0] = 99.0  # new_ref copies its initial value
  assert r.shape == SHAPE and r.dtype == np.float32 and r.memory_space == pl.ANY
  np.testing.assert_array_equal(r[1], x[1])
  r[2:4] = np.zeros((2, 128), np.float32)
  r.at[4:8][1, 5] = 7.0
  assert r[5, 5] == 7.0
  np.testing.assert_array_equal(r.at[2:4][...], np.zeros((2, 128), np.float32))
  v = pl.freeze(r)
  assert v[0, 0] != 99.0 and v[5, 5] == 7.0
  with pytest.raises(pl.UsageError, match=r"has been frozen or freed"):
    r[...]


def test_empty_ref_reads_nan_until_written():
  r = pl.empty_ref(pl.ShapeDtypeStruct((8, 128), jnp.float32))
  assert np.isnan(r[...]).all()
  r[...] = np.ones((8, 128), np.float32)
  np.testing.assert_array_equal(pl.freeze(r), np.ones((8, 128), np.float32))


def _add_one_in_place(ref_hbm):
  def run(buf):
    pltpu.sync_copy(ref_hbm, buf)
    buf[...] = buf[...] + 1
    pltpu.sync_copy(buf, ref_hbm)
  pl.run_scoped(run, pltpu.VMEM(ref_hbm.shape, ref_hbm.dtype))


def test_passed_ref_is_mutated_in_place_with_no_output(rng):
  x = _x(rng)
  r = pl.new_ref(x)
  buf_before = r.buf.storage
  f = pl.kernel(_add_one_in_place, out_type=(), mesh=MESH)
  assert f(r) == ()
  assert r.buf.storage is buf_before  # no copy
  np.testing.assert_array_equal(r[...], x + 1)


def test_new_ref_updated_by_two_kernel_calls_in_a_row(rng):
  x = _x(rng)
  r = pl.new_ref(x)
  f = pl.kernel(_add_one_in_place, out_type=(), mesh=MESH)
  f(r)
  np.testing.assert_array_equal(r[...], x + 1)
  f(r)
  np.testing.assert_array_equal(pl.freeze(r), (x + 1) + 1)


def test_ref_view_passed_to_kernel(rng):
  x = _x(rng)
  r = pl.new_ref(x)
  pl.kernel(_add_one_in_place, out_type=(), mesh=MESH)(r.at[0:8])
  ref = x.copy()
  ref[0:8] += 1
  np.testing.assert_array_equal(pl.freeze(r), ref)


def test_ref_and_array_inputs_with_outputs(rng):
  x, y = _x(rng), _x(rng)
  acc = pl.new_ref(np.zeros(SHAPE, np.float32))

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH,
                     scratch_types=[pltpu.VMEM(SHAPE, jnp.float32)] * 2)
  def k(x_hbm, acc_hbm, o_hbm, a, b):
    pltpu.sync_copy((x_hbm, acc_hbm), (a, b))
    b[...] = b[...] + a[...]
    pltpu.sync_copy(b, acc_hbm)
    pltpu.sync_copy(a, o_hbm)

  np.testing.assert_array_equal(k(x, acc), x)
  k(y, acc)
  np.testing.assert_allclose(pl.freeze(acc), x + y, rtol=1e-6)


def test_same_ref_passed_twice_is_an_error(rng):
  r = pl.new_ref(_x(rng))

  def body(a, b):
    pass

  with pytest.raises(pl.UsageError, match=r"same ref is passed twice"):
    pl.kernel(body, out_type=(), mesh=MESH)(r, r)


def test_closed_over_and_passed_ref_is_an_error(rng):
  r = pl.new_ref(_x(rng))

  def body(a):
    pltpu.sync_copy(r, a)

  with pytest.raises(pl.UsageError, match=r"closes over .* and also receives it as an input"):
    pl.kernel(body, out_type=(), mesh=MESH)(r)


def test_closing_over_a_ref_works(rng):
  x = _x(rng)
  r = pl.new_ref(x)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH)
  def k(o_hbm):
    _add_one_in_place(r)
    pltpu.sync_copy(r, o_hbm)

  np.testing.assert_array_equal(k(), x + 1)
  np.testing.assert_array_equal(r[...], x + 1)


def test_closing_over_scalars_works(rng):
  x = _x(rng)
  scale = 3.0
  offset = np.float32(0.5)

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct(SHAPE, jnp.float32), mesh=MESH,
                     scratch_types=[pltpu.VMEM(SHAPE, jnp.float32)])
  def k(x_hbm, o_hbm, buf):
    pltpu.sync_copy(x_hbm, buf)
    buf[...] = buf[...] * scale + offset
    pltpu.sync_copy(buf, o_hbm)

  np.testing.assert_allclose(k(x), x * 3 + 0.5, rtol=1e-6)


def test_closing_over_a_non_scalar_array_is_an_error(rng):
  table = np.ones((8, 128), np.float32)

  def body(o_hbm, buf):
    buf[...] = jnp.zeros((8, 128), jnp.float32) + table
    pltpu.sync_copy(buf, o_hbm)

  with pytest.raises(pl.UsageError, match=r"captures a non-scalar array constant of shape \(8, 128\).*"
                                          r"only close over scalars and refs"):
    pl.kernel(body, out_type=pl.ShapeDtypeStruct((8, 128), jnp.float32), mesh=MESH,
              scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])()


_GLOBAL_TABLE = np.ones((8, 128), np.float32)


def test_using_a_global_non_scalar_array_is_an_error(rng):
  def body(o_hbm, buf):
    buf[...] = jnp.zeros((8, 128), jnp.float32) + _GLOBAL_TABLE
    pltpu.sync_copy(buf, o_hbm)

  with pytest.raises(pl.UsageError, match=r"NumPy array of shape \(8, 128\): kernels cannot close over "
                                          r"array constants"):
    pl.kernel(body, out_type=pl.ShapeDtypeStruct((8, 128), jnp.float32), mesh=MESH,
              scratch_types=[pltpu.VMEM((8, 128), jnp.float32)])()


def test_frozen_ref_cannot_be_passed(rng):
  r = pl.new_ref(_x(rng))
  pl.freeze(r)
  with pytest.raises(pl.UsageError, match=r"frozen or freed"):
    pl.kernel(_add_one_in_place, out_type=(), mesh=MESH)(r)


def test_new_ref_dtype_and_memory_space_rules():
  r = pl.new_ref(np.arange(4.0))                       # float64 narrows to float32, as JAX without x64
  assert r.dtype == np.float32
  r.addupdate(np.ones(4, np.float32))
  np.testing.assert_array_equal(pl.freeze(r), np.arange(4.0, dtype=np.float32) + 1)
  with pytest.raises(pl.UsageError, match=r"memory_space=vmem\) on the host: only HBM/ANY refs"):
    pl.new_ref(np.zeros(4, np.float32), memory_space=pltpu.VMEM)
  with pytest.raises(pl.UsageError, match=r"pl.empty_ref expects a ShapeDtypeStruct"):
    pl.empty_ref(3)


def test_inputs_constrained_to_smem_or_vmem_are_staged_there(rng):
  """pltpu.with_memory_space_constraint(x, SMEM / VMEM) on a pl.kernel argument: the body's ref lives
  there (scalar reads from SMEM, vector math on VMEM), copied in by one DMA before the body; ANY and
  HBM leave the operand as it is."""
  def body(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * s_ref[1].astype(jnp.float32)
  x, s = _x(rng), np.array([5, 3], np.int32)
  f = pl.kernel(body, out_type=pltpu.VMEM(SHAPE, jnp.float32), mesh=MESH)
  with pl.virtual_tpu("v5e") as tpu:
    out = f(pltpu.with_memory_space_constraint(s, pltpu.SMEM),
            pltpu.with_memory_space_constraint(x, pltpu.VMEM))
  np.testing.assert_array_equal(out, x * 3)
  assert tpu.reports[-1].dma_count_by_direction == {"hbm->smem": 1, "hbm->vmem": 1, "vmem->hbm": 1}
  assert pltpu.with_memory_space_constraint(x, pl.ANY) is x
  assert pltpu.with_memory_space_constraint(x, pltpu.HBM) is x


def test_memory_space_constraint_errors_name_the_fix(rng):
  x = _x(rng)
  with pytest.raises(pl.UsageError, match="expected pltpu.ANY, pltpu.HBM, pltpu.VMEM or pltpu.SMEM"):
    pltpu.with_memory_space_constraint(x, pltpu.SEMAPHORE)
  with pytest.raises(pl.UsageError, match="refs made on the host live in HBM"):
    pltpu.with_memory_space_constraint(pl.new_ref(x), pltpu.SMEM)
  f = pl.pallas_call(lambda x_ref, o_ref: None, out_shape=pl.ShapeDtypeStruct(SHAPE, jnp.float32))
  with pytest.raises(pl.UnsupportedError,
                     match=r"args\[0\] has a memory space constraint.*BlockSpec\(memory_space"):
    f(pltpu.with_memory_space_constraint(x, pltpu.VMEM))
