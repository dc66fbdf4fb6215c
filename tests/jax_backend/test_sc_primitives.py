"""JAX's SparseCore vector-subcore primitives on palace (rules_sc.py), each against a NumPy reference:
load_gather / store_scatter / addupdate_scatter, load_expanded, parallel_loop, subcore_barrier,
scan_count, pack / unpack, the mask all-reduces, masked cummin, indexed DMAs of a view with its
leading dimensions indexed away and of plsc.Indices, and scratch in `VMEM @ mesh`."""
import collections
import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax._src.pallas.mosaic import sc_primitives
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import palace
import palace.jax as pj

L = 16   # 7x's SparseCore lanes


def _run(body, out_type, *args, scratch=(), mesh_subcores=1):
  """body run on vector subcore(s) of one SparseCore of a 7x, operands copied to VMEM and back."""
  with pj.virtual_tpu("7x") as tpu:
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=mesh_subcores)

    @jax.jit
    def f(*xs):
      outs = out_type if isinstance(out_type, tuple) else (out_type,)

      @pl.kernel(out_type=out_type, mesh=mesh, scratch_types=[
          *(pltpu.VMEM(x.shape, x.dtype) for x in xs), *(pltpu.VMEM(o.shape, o.dtype) for o in outs),
          *scratch],
          compiler_params=pltpu.CompilerParams(needs_layout_passes=False))
      def k(*refs):
        n = len(xs)
        hbm_in, hbm_out = refs[:n], refs[n:n + len(outs)]
        v_in, v_out = refs[n + len(outs):2 * n + len(outs)], refs[2 * n + len(outs):2 * n + 2 * len(outs)]
        for h, v in zip(hbm_in, v_in):
          pltpu.sync_copy(h, v)
        body(*v_in, *v_out, *refs[2 * n + 2 * len(outs):])
        for v, h in zip(v_out, hbm_out):
          pltpu.sync_copy(v, h)
      return k(*xs)

    out = jax.tree.map(np.asarray, f(*args))
  assert len(tpu.reports) == 1
  return out


def test_load_gather_store_scatter_and_addupdate_scatter_with_masks():
  x = (np.arange(L) * 3 + 1).astype(np.int32)
  idx = np.random.default_rng(1).permutation(L).astype(np.int32)
  mask = x % 2 == 0

  def body(x_ref, i_ref, g_ref, s_ref, a_ref):
    m = x_ref[...] % 2 == 0
    g_ref[...] = plsc.load_gather(x_ref, [i_ref[...]], mask=m)
    s_ref[...] = jnp.full((L,), -1, jnp.int32)
    plsc.store_scatter(s_ref, [i_ref[...]], x_ref[...], mask=m)
    a_ref[...] = jnp.ones((L,), jnp.int32)
    plsc.addupdate_scatter(a_ref, [i_ref[...] // 2], x_ref[...])   # (repeated indices accumulate)

  spec = jax.ShapeDtypeStruct((L,), jnp.int32)
  g, s, a = _run(body, (spec, spec, spec), x, idx)
  np.testing.assert_array_equal(g[mask], x[idx][mask])
  expected_s = np.full(L, -1, np.int32)
  expected_s[idx[mask]] = x[mask]
  np.testing.assert_array_equal(s, expected_s)
  expected_a = np.ones(L, np.int32)
  np.add.at(expected_a, idx // 2, x)
  np.testing.assert_array_equal(a, expected_a)


def test_load_gather_2d():
  x = np.arange(L * L, dtype=np.int32).reshape(L, L)
  i0, i1 = (np.random.default_rng(s).permutation(L).astype(np.int32) for s in (2, 3))

  def body(x_ref, a_ref, b_ref, o_ref):
    o_ref[...] = plsc.load_gather(x_ref, [a_ref[...], b_ref[...]])

  out = _run(body, jax.ShapeDtypeStruct((L,), jnp.int32), x, i0, i1)
  np.testing.assert_array_equal(out, x[i0, i1])


def test_load_expanded_fills_the_true_lanes_in_order():
  x = np.arange(100, 100 + L, dtype=np.int32)
  mask = (np.arange(L) % 3) != 1

  def body(x_ref, o_ref):
    o_ref[...] = plsc.load_expanded(x_ref.at[...], mask=(lax.iota(jnp.int32, L) % 3) != 1)

  out = _run(body, jax.ShapeDtypeStruct((L,), jnp.int32), x)
  np.testing.assert_array_equal(out[mask], x[:mask.sum()])


def test_parallel_loop_with_a_carry():
  x = np.arange(4 * L, dtype=np.int32)

  def body(x_ref, o_ref):
    @plsc.parallel_loop(0, 4 * L, step=L, carry=jnp.int32(5))
    def total(i, c):
      o_ref[pl.ds(i, L)] = x_ref[pl.ds(i, L)] + c
      return c + 1
    o_ref[pl.ds(0, L)] = o_ref[pl.ds(0, L)] + total * 0 + (total - 9)   # total is 5 + 4 = 9

  out = _run(body, jax.ShapeDtypeStruct((4 * L,), jnp.int32), x)
  np.testing.assert_array_equal(out, x + np.repeat(5 + np.arange(4), L))


def test_subcore_barrier_releases_every_subcore_at_the_last_arrival():
  """JAX's test_barrier: subcore s writes its row 2s+1 times, then after the barrier every subcore
  reads its neighbour's row; the neighbour's own post-barrier write must come after that read."""
  n = 16
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((n, L), jnp.uint32), mesh=mesh,
               scratch_types=[pltpu.VMEM((n, L), jnp.uint32)])
    def k(o_ref, vmem):
      s = lax.axis_index("s")

      @pl.loop(0, 2 * s + 1)
      def _(i):
        vmem[s] = jnp.full(L, i, dtype=jnp.uint32)
        pltpu.sync_copy(vmem.at[s], o_ref.at[s])
      plsc.subcore_barrier()
      pltpu.sync_copy(o_ref.at[(s + 1) % n], vmem.at[s])
      pltpu.sync_copy(vmem.at[s], o_ref.at[s])

    out = np.asarray(k())
  np.testing.assert_array_equal(out[:, 0], 2 * np.roll(np.arange(n), -1))


def test_scan_count_against_a_counter():
  x = np.array([3, 1, 3, 3, 2, 1, 0, 0, 5, 3, 2, 7, 7, 1, 3, 9], np.int32)
  mask = np.ones(L, bool)
  mask[[2, 7]] = False

  def body(x_ref, c_ref, m_ref):
    keep = (lax.iota(jnp.int32, L) != 2) & (lax.iota(jnp.int32, L) != 7)
    counts, last = plsc.scan_count(x_ref[...], keep)
    c_ref[...] = counts
    m_ref[...] = last.astype(jnp.int32)

  spec = jax.ShapeDtypeStruct((L,), jnp.int32)
  counts, last = _run(body, (spec, spec), x)
  seen, total = collections.Counter(), collections.Counter(x[mask].tolist())
  exp_counts, exp_last = [], []
  for v, m in zip(x.tolist(), mask):
    seen[v] += m
    exp_counts.append(seen[v] if m else 0)
    exp_last.append(bool(m) and seen[v] == total[v])
  np.testing.assert_array_equal(counts, exp_counts)
  np.testing.assert_array_equal(last, np.array(exp_last, np.int32))


@pytest.mark.parametrize("fmt", list(plsc.PackFormat))
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_pack_layout_and_unpack_round_trip(fmt, dtype):
  a = (np.arange(L) + 0.25).astype(dtype) if dtype == np.float32 else np.arange(L, dtype=dtype) * 70000
  b = -a
  packed = jnp.bfloat16 if dtype == np.float32 else jnp.int16
  shape = (L, 2) if fmt is plsc.PackFormat.COMPRESSED else (2 * L,)

  def body(a_ref, b_ref, p_ref, oa_ref, ob_ref):
    ab = plsc.pack(a_ref[...], b_ref[...], format=fmt)
    p_ref[...] = ab
    oa_ref[...], ob_ref[...] = plsc.unpack(ab, format=fmt)

  spec = jax.ShapeDtypeStruct((L,), dtype)
  p, oa, ob = _run(body, (jax.ShapeDtypeStruct(shape, packed), spec, spec), a, b)
  narrow = np.stack([a, b]).astype(packed)   # bf16: round to nearest even; int16: the low 16 bits
  expected = narrow.reshape(L, 2) if fmt is plsc.PackFormat.COMPRESSED else narrow.T.reshape(-1)
  np.testing.assert_array_equal(p, expected)
  np.testing.assert_array_equal(oa, narrow[0].astype(dtype))
  np.testing.assert_array_equal(ob, narrow[1].astype(dtype))


def test_mask_all_reduces_and_masked_cummin():
  x = np.array([5, 9, 2, 7, 1, 8, 3, 3, 6, 0, 4, 9, 2, 5, 7, 1], np.int32)

  def body(x_ref, ffs_ref, pop_ref, min_ref):
    v = x_ref[...]
    ffs_ref[...] = plsc.all_reduce_ffs(v == 7)
    pop_ref[...] = plsc.all_reduce_population_count(v > 4)
    min_ref[...] = sc_primitives.cummin(v, mask=v > 1)   # (not re-exported by plsc in 0.12)

  spec = jax.ShapeDtypeStruct((L,), jnp.int32)
  ffs, pop, mins = _run(body, (spec, spec, spec), x)
  np.testing.assert_array_equal(ffs, np.full(L, 3))
  np.testing.assert_array_equal(pop, np.full(L, (x > 4).sum()))
  m = x > 1
  run = np.minimum.accumulate(np.where(m, x, np.iinfo(np.int32).max))
  np.testing.assert_array_equal(mins, np.where(np.cumsum(m) > 0, run, x))


def test_indexed_dmas_of_a_view_and_of_plsc_indices():
  """x.at[1, 2].at[idx] gathers along the view's first remaining dimension; plsc.Indices skips the
  entries equal to its ignored_value (their destination rows keep what they held)."""
  x = np.arange(4 * 4 * L, dtype=np.int32).reshape(4, 4, L)
  idx = np.random.default_rng(4).permutation(L).astype(np.int32)
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @jax.jit
    def f(x, idx):
      @pl.kernel(out_type=(jax.ShapeDtypeStruct((L,), jnp.int32),) * 2, mesh=mesh,
                 scratch_types=[pltpu.VMEM((L,), jnp.int32), pltpu.VMEM((L,), jnp.int32)])
      def k(x_hbm, i_hbm, o1, o2, i_vmem, buf):
        pltpu.sync_copy(i_hbm, i_vmem)
        pltpu.sync_copy(x_hbm.at[1, 2].at[i_vmem], buf)
        pltpu.sync_copy(buf, o1)
        buf[...] = jnp.full((L,), -7, jnp.int32)
        pltpu.sync_copy(x_hbm.at[3, 0].at[plsc.Indices(i_vmem, ignored_value=4)], buf)
        pltpu.sync_copy(buf, o2)
      return k(x, idx)

    o1, o2 = map(np.asarray, f(x, idx))
  np.testing.assert_array_equal(o1, x[1, 2, idx])
  np.testing.assert_array_equal(o2, np.where(idx == 4, -7, x[3, 0, idx]))


def test_scratch_in_vmem_at_a_vector_subcore_mesh():
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @pl.kernel(out_type=jax.ShapeDtypeStruct((L,), jnp.int32), mesh=mesh,
               scratch_types=[pltpu.VMEM((L,), jnp.int32) @ mesh])
    def k(o_ref, scratch):
      scratch[...] = jnp.full((L,), 2, jnp.int32)
      plsc.addupdate_scatter(scratch, [lax.iota(jnp.int32, L) // 4], jnp.ones(L, jnp.int32))
      pltpu.sync_copy(scratch, o_ref)

    out = np.asarray(k())
  np.testing.assert_array_equal(out, np.array([6, 6, 6, 6] + [2] * (L - 4)))


def test_take_along_axis_0_int8_add_empty_ref_and_opt_level_on_a_subcore():
  """A SparseCore gathers along any axis (a TensorCore along its two minor dims only) and adds 8-bit
  integer vectors (the TensorCore's Mosaic refuses to); jax.empty_ref in a loop body is scratch
  for the rest of that body; CompilerParams(opt_level=jax.experimental.mosaic.OptLevel.O3) runs."""
  x = np.arange(2 * 4 * L, dtype=np.int32).reshape(2, 4, L)
  idx = np.random.default_rng(5).integers(0, 2, x.shape).astype(np.int32)
  b = (np.arange(4 * L) % 100).astype(np.int8)
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @jax.jit
    def f(x, idx, b):
      @pl.kernel(out_type=(jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype),
                           jax.ShapeDtypeStruct((L,), jnp.float32)), mesh=mesh,
                 compiler_params=pltpu.CompilerParams(opt_level=jax.experimental.mosaic.OptLevel.O3),
                 scratch_types=[pltpu.VMEM(x.shape, x.dtype), pltpu.VMEM(x.shape, jnp.int32),
                                pltpu.VMEM(b.shape, b.dtype), pltpu.VMEM((L,), jnp.float32)])
      def k(x_hbm, i_hbm, b_hbm, o_hbm, ob_hbm, e_hbm, xv, iv, bv, ev):
        pltpu.sync_copy(x_hbm, xv)
        pltpu.sync_copy(i_hbm, iv)
        pltpu.sync_copy(b_hbm, bv)
        xv[...] = jnp.take_along_axis(xv[...], iv[...], axis=0, mode="promise_in_bounds")
        bv[...] = bv[...] + bv[...]
        ev[...] = jnp.zeros((L,), jnp.float32)

        @pl.loop(0, 3)
        def _(i):
          tmp = jax.empty_ref(jax.ShapeDtypeStruct((L,), jnp.float32), memory_space=pltpu.VMEM)
          tmp[...] = ev[...] + 1.0
          ev[...] = tmp[...] * 2.0
        pltpu.sync_copy(xv, o_hbm)
        pltpu.sync_copy(bv, ob_hbm)
        pltpu.sync_copy(ev, e_hbm)
      return k(x, idx, b)

    o, ob, e = map(np.asarray, f(x, idx, b))
  np.testing.assert_array_equal(o, np.take_along_axis(x, idx, axis=0))
  np.testing.assert_array_equal(ob, b + b)   # (wraps, as int8 does)
  np.testing.assert_array_equal(e, np.full(L, 14.0, np.float32))   # ((0+1)*2+1)*2+1)*2


def test_select_ref_picks_the_dma_source_at_run_time():
  xs = [np.full((8, L), k, np.int32) for k in range(3)]
  with pj.virtual_tpu("7x"):
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)

    @jax.jit
    def f(*xs):
      @pl.kernel(out_type=jax.ShapeDtypeStruct((24, L), jnp.int32), mesh=mesh,
                 scratch_types=[pltpu.SemaphoreType.DMA((2,))])
      def k(a, b, c, o, sem):
        @pl.loop(0, 3)
        def _(i):
          pltpu.async_copy(pl.select_ref(2 - i, a, b, c), o.at[pl.ds(8 * i, 8)],
                           pl.select_ref(i % 2, sem.at[0], sem.at[1])).wait()
      return k(*xs)

    out = np.asarray(f(*xs))
  np.testing.assert_array_equal(out, np.concatenate(xs[::-1]))


def _lowering_error(body, **kernel_kw):
  """The error jax.jit(...).lower raises for a vector-subcore kernel made of `body` (nothing runs)."""
  with pj.virtual_tpu("7x") as tpu:
    mesh = plsc.VectorSubcoreMesh(core_axis_name="c", subcore_axis_name="s", num_cores=1,
                                  num_subcores=1)
    k = pl.kernel(body, mesh=mesh, **kernel_kw)
    with pytest.raises(Exception) as info:
      jax.jit(k).lower(jnp.zeros((L,), jnp.int32), jnp.zeros((L,), jnp.int32)).compile()
  assert not tpu.reports
  return info.value


@pytest.mark.parametrize("case,error,match", [
    ("scalar load from VMEM", NotImplementedError, r"Fix: To load a scalar from VMEM"),
    ("scalar store to VMEM", NotImplementedError, r"Trying to swap a scalar in VMEM"),
    ("vector load from HBM", NotImplementedError, r"Get does not support loading from HBM"),
    ("column write", NotImplementedError, r"Integer indexing of refs that follows a non-trivial slice"),
    ("gather HBM to HBM", NotImplementedError, r"Scatter/gather DMA from HBM to HBM is not supported"),
    ("indices in HBM", NotImplementedError, r"indices of a scatter/gather DMA must be in VMEM, got HBM"),
    ("both sides indexed", ValueError, r"only the source ref can be indexed"),
])
def test_mosaic_sparsecore_refusals_are_raised_while_lowering(case, error, match):
  """What JAX's SparseCore lowering refuses is refused while palace.jax lowers the kernel (in the
  caller's thread, with its type; at run time XLA would wrap it in a JaxRuntimeError)."""
  def body(x_hbm, i_hbm, o_hbm, v, v2, idx):
    pltpu.sync_copy(i_hbm, idx)
    if case == "scalar load from VMEM":
      v[...] = lax.broadcast(v[0], (L,))
    elif case == "scalar store to VMEM":
      v[0] = 1
    elif case == "vector load from HBM":
      v[...] = x_hbm[...]
    elif case == "column write":
      v2[:L, 1] = v[...]
    elif case == "gather HBM to HBM":
      pltpu.sync_copy(x_hbm.at[idx], o_hbm)
    elif case == "indices in HBM":
      pltpu.sync_copy(x_hbm.at[i_hbm], v)
    else:
      pltpu.sync_copy(x_hbm.at[idx], v.at[idx])

  e = _lowering_error(body, out_type=jax.ShapeDtypeStruct((L,), jnp.int32),
                      scratch_types=[pltpu.VMEM((L,), jnp.int32), pltpu.VMEM((L, 4), jnp.int32),
                                     pltpu.VMEM((L,), jnp.int32)])
  assert isinstance(e, error) and isinstance(e, palace.UnsupportedError if error is NotImplementedError
                                              else palace.UsageError), e
  assert re.search(match, str(e)), e
