"""Loads are zero-copy views of VMEM; a value must still never change after it was read."""
import functools

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import tpu as pltpu


def _run(body, *args, policy="eager"):
  out = pl.ShapeDtypeStruct((4, 8, 128), np.float32)
  k = pl.kernel(body, out_type=out, mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA])
  with pl.virtual_tpu("v5e", dma_policy=policy):
    return k(*args)


def test_value_survives_stores_dma_and_sync_copy_into_its_buffer():
  x = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)

  def body(x_hbm, o_hbm, buf, sem):
    buf[...] = jnp.ones((8, 128), jnp.float32)
    before = buf[...]                     # a view of buf
    row = buf[2]                          # a view of one row
    buf[...] = jnp.zeros((8, 128), jnp.float32) + 7.0   # vector store into the viewed buffer
    after_store = buf[...]
    pltpu.sync_copy(x_hbm, buf)           # DMA into the viewed buffer
    buf[1] = buf[0] * 0 - 1.0             # partial store
    buf[...] = before + row               # the old values, not the new ones
    pltpu.sync_copy(buf, o_hbm.at[0])
    buf[...] = after_store
    pltpu.sync_copy(buf, o_hbm.at[1])
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    v = buf[...]
    pltpu.sync_copy(buf, o_hbm.at[2])
    buf[...] = v * 2                      # read-modify-write of the same buffer
    pltpu.sync_copy(buf, o_hbm.at[3])

  for policy in ("eager", "on_wait", "random"):
    out = _run(body, x, policy=policy)
    np.testing.assert_array_equal(out[0], np.full((8, 128), 2.0, np.float32))
    np.testing.assert_array_equal(out[1], np.full((8, 128), 7.0, np.float32))
    np.testing.assert_array_equal(out[2], x)
    np.testing.assert_array_equal(out[3], 2 * x)


def test_accumulator_pattern_reads_the_old_value():
  def kernel(x_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
      acc_ref[...] = jnp.zeros_like(acc_ref)
    old = acc_ref[...]
    acc_ref[...] += x_ref[...]
    o_ref[...] = old                      # the value before this step's update

  x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct((4 * 8, 128), np.float32), grid=(4,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                     scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)])
  out = f(x).reshape(4, 8, 128)
  blocks = x.reshape(4, 8, 128)
  expected = np.concatenate([np.zeros((1, 8, 128), np.float32), np.cumsum(blocks, axis=0)[:-1]])
  np.testing.assert_array_equal(out, expected)


def test_output_blocks_never_written_back_read_as_uninitialised():
  # grid covers only the first 3 of 5 row blocks (the last one ragged); the rest must read NaN / int min
  def kernel(x_ref, o_ref, i_ref):
    o_ref[...] = x_ref[...] + 1.0
    i_ref[...] = jnp.full(i_ref.shape, 7, jnp.int32)

  x = np.zeros((36, 128), np.float32)
  f = pl.pallas_call(kernel, grid=(3,),
                     out_shape=(pl.ShapeDtypeStruct((36, 128), np.float32),
                                pl.ShapeDtypeStruct((36, 128), np.int32)),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))] * 2)
  out, ints = f(x)
  np.testing.assert_array_equal(out[:24], 1.0)
  assert np.isnan(out[24:]).all()
  np.testing.assert_array_equal(ints[:24], 7)
  np.testing.assert_array_equal(ints[24:], np.iinfo(np.int32).min)


def test_one_value_stored_into_two_buffers_keeps_them_independent():
  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((3, 8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 1),
                     scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((8, 128), jnp.float32)])
  def k(o_hbm, a, b):
    v = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) * 1.0
    a[...] = v
    b[...] = v
    a[0] = a[0] * 0 - 5.0            # a partial write to a changes neither b nor v
    pltpu.sync_copy(a, o_hbm.at[0])
    pltpu.sync_copy(b, o_hbm.at[1])
    b[...] = v + 0.0
    pltpu.sync_copy(b, o_hbm.at[2])

  out = k()
  ref = np.arange(8 * 128, dtype=np.float32).reshape(8, 128)
  changed = ref.copy()
  changed[0] = -5.0
  np.testing.assert_array_equal(out[0], changed)
  np.testing.assert_array_equal(out[1], ref)
  np.testing.assert_array_equal(out[2], ref)


def test_borrowed_dma_blocks_never_write_through_to_hbm(monkeypatch):
  """A whole-buffer HBM->VMEM copy may view HBM instead of copying: writes to the VMEM buffer, and
  writes to the HBM source while the buffer still views it, must both behave like real copies."""
  from palace._src.sim import memory
  monkeypatch.setattr(memory, "BORROW_MIN_BYTES", 0)  # borrow even these small blocks
  x = np.arange(2 * 8 * 128, dtype=np.float32).reshape(2, 8, 128)
  x_before = x.copy()

  @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((3, 8, 128), np.float32),
                     mesh=pltpu.TensorCoreMesh("core", 1),
                     scratch_types=[pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((8, 128), jnp.float32)])
  def k(x_hbm, o_hbm, a, b):
    pltpu.sync_copy(x_hbm.at[0], a)          # a views x[0] (no copy)
    v = a[...]
    a[1] = a[1] * 0.0                        # write to a: a takes its own copy first
    pltpu.sync_copy(a, o_hbm.at[0])
    pltpu.sync_copy(x_hbm.at[1], b)          # b views x[1]
    pltpu.sync_copy(o_hbm.at[0], x_hbm.at[1])  # write the HBM source while b views it
    pltpu.sync_copy(b, o_hbm.at[1])          # b still holds the old x[1]
    b[...] = v                               # v is still the old x[0]
    pltpu.sync_copy(b, o_hbm.at[2])

  ref_in = pl.new_ref(x)
  out = k(ref_in)
  changed = x_before[0].copy()
  changed[1] = 0.0
  np.testing.assert_array_equal(out[0], changed)
  np.testing.assert_array_equal(out[1], x_before[1])
  np.testing.assert_array_equal(out[2], x_before[0])
  after = pl.freeze(ref_in)
  np.testing.assert_array_equal(after[0], x_before[0])     # never written through a borrowed view
  np.testing.assert_array_equal(after[1], changed)         # the explicit HBM write landed


def test_kernel_writing_its_input_block_leaves_the_input_array_alone(monkeypatch):
  from palace._src.sim import memory
  monkeypatch.setattr(memory, "BORROW_MIN_BYTES", 0)

  def kernel(x_ref, o_ref):
    x_ref[...] = x_ref[...] + 1.0            # legal on TPU: the block is a VMEM copy
    o_ref[...] = x_ref[...] * 2.0

  x = np.ones((64, 128), np.float32)
  f = pl.pallas_call(kernel, out_shape=pl.ShapeDtypeStruct(x.shape, x.dtype), grid=(8,),
                     in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                     out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))
  out = f(x)
  np.testing.assert_array_equal(out, 4.0)
  np.testing.assert_array_equal(x, 1.0)


def _borrow_kernel(body, n_out, n_scratch):
  blk = pl.ShapeDtypeStruct((128, 128), np.float32)   # 64 KiB: whole-buffer DMAs borrow, not copy
  return pl.kernel(body, out_type=tuple([blk] * n_out), mesh=pltpu.TensorCoreMesh("core", 1),
                   scratch_types=[pltpu.VMEM((128, 128), jnp.float32)] * n_scratch)


def test_buffers_borrowing_each_other_in_turn(rng):
  # a <- b then b <- a: each borrowed the other's storage once (the links form a cycle)
  x = rng.standard_normal((128, 128), dtype=np.float32)

  def body(x_hbm, o1, o2, a, b, tmp):
    pltpu.sync_copy(x_hbm, b)
    pltpu.sync_copy(b, a)
    pltpu.sync_copy(a, b)
    v = a[...] + b[...]
    b[...] = v                       # writes through the cycle
    tmp[...] = a[...]
    pltpu.sync_copy(tmp, o1)
    pltpu.sync_copy(b, o2)

  with pl.virtual_tpu("v5e"):
    o1, o2 = _borrow_kernel(body, 2, 3)(x)
  np.testing.assert_array_equal(o1, x)
  np.testing.assert_array_equal(o2, 2 * x)


def test_borrowed_chain_survives_the_middle_buffer_moving_on(rng):
  # y borrows z's storage, x borrows y's (so views z's memory); y then borrows w, and z is rewritten:
  # x and a value read from it before must keep z's old contents
  z0, w0, z1 = (rng.standard_normal((128, 128), dtype=np.float32) for _ in range(3))

  def body(z_in, w_in, z1_in, o1, o2, z_hbm, y, xb, tmp):
    pltpu.sync_copy(z_in, z_hbm)
    pltpu.sync_copy(z_hbm, y)
    pltpu.sync_copy(y, xb)
    early = xb[...]
    pltpu.sync_copy(w_in, y)         # y moves on
    late = xb[...]
    pltpu.sync_copy(z1_in, z_hbm)    # the memory xb views is rewritten
    tmp[...] = early + late
    pltpu.sync_copy(tmp, o1)
    pltpu.sync_copy(xb, o2)

  k = pl.kernel(body, out_type=tuple([pl.ShapeDtypeStruct((128, 128), np.float32)] * 3),
                mesh=pltpu.TensorCoreMesh("core", 1),
                scratch_types=[pltpu.VMEM((128, 128), jnp.float32)] * 3)
  with pl.virtual_tpu("v5e"):
    o1, o2, z_final = k(z0, w0, z1)
  np.testing.assert_array_equal(o1, 2 * z0)
  np.testing.assert_array_equal(o2, z0)
  np.testing.assert_array_equal(z_final, z1)


def test_buffer_owners_and_a_write_through_a_stale_borrow_chain():
  """Buffer.owners is the one memory test of the borrowing bookkeeping: a borrower's owners are the
  lenders whose storage its own views, and a write to a buffer detaches a borrower whose chain has
  gone stale (its lender moved on) by the same test, `owners((writer,))`."""
  from palace._src.core import MemorySpace
  from palace._src.sim.memory import Buffer

  def buf(name, data):
    return Buffer(data, data.shape, data.dtype, MemorySpace.VMEM, name)
  a, d = buf("a", np.arange(8.0)), buf("d", np.full(8, -1.0))
  b, c = buf("b", np.zeros(8)), buf("c", np.zeros(8))
  b.borrow(a, a.storage)
  c.borrow(b, b.storage)   # (c now views a's memory through b: it watches b and a)
  assert c.owners() == [b, a] and c.owners() is c.owners()   # (kept while nothing changed)
  b.borrow(d, d.storage)   # b moves on: c's chain through b is stale
  assert c.owners() == [a] and b.owners() == [d]
  assert c.owners((d,)) == [] and b.owners((a, c)) == []
  a.detach_readers()   # what a write to a does first
  assert c.borrowed is None and not np.shares_memory(c.storage, a.storage)
  np.testing.assert_array_equal(c.storage, np.arange(8.0))
  assert b.borrowed is d and np.shares_memory(b.storage, d.storage)   # (it views d: left alone)
