"""Ring collectives over a virtual pod: all-gather (one-way and bidirectional), reduce-scatter, all-reduce.

Each collective is one `pl.kernel` per chip, launched with `pl.shard_map` over a 1-D mesh: the chips
move data with remote DMAs (`pltpu.make_async_remote_copy`) to their ring neighbours, agree on start
with the barrier semaphore (`CompilerParams(collective_id=...)`), and reduce on the TensorCore VPU.
`pl.make_mesh` lays a 1-D mesh along a ring of neighbouring chips, so every step is one ICI hop.

Each result is checked against NumPy and its modelled time is printed beside the ICI roofline of its
schedule (tpu-hardware.md section 6): bytes through the busiest link / one-way link bandwidth + hops on
the critical path x hop latency (~1 us). A ring all-gather of N shards of B bytes takes N-1 steps of
B bytes and one hop each; the bidirectional ring halves the steps (both directions of every link carry
(N-1)/2 shards); reduce-scatter moves the same bytes as all-gather; all-reduce = reduce-scatter +
all-gather = 2x. The rooflines assume one hop between ring neighbours, as on the layouts printed here
(an odd chip count on a line without wraparound pays extra hops for the step that closes the ring).
Run: python examples/collectives.py
"""
import functools
import math

import numpy as np

import palace as pl
from palace import lax
from palace import tpu as pltpu

AXIS = "x"


def _neighbours(n):
  me = lax.axis_index(AXIS)
  return me, lax.rem(me + 1, n), lax.rem(me + n - 1, n)


def _handshake(left, right):
  """Both ring neighbours have entered the kernel (their buffers and semaphores exist)."""
  barrier = pltpu.get_barrier_semaphore()
  pl.semaphore_signal(barrier, 1, device_id={AXIS: left})
  pl.semaphore_signal(barrier, 1, device_id={AXIS: right})
  pl.semaphore_wait(barrier, 2)


def _ring_all_gather_body(o_hbm, send_sem, recv_sem, n, rows):
  """o_hbm[me] holds my shard; after n-1 steps every block holds its chip's shard. At step s each chip
  forwards the block it received at step s-1 (its own first) to the right neighbour, into the same
  block. Output blocks are written once, so no flow control is needed."""
  me, right, left = _neighbours(n)
  _handshake(left, right)
  for s in range(n - 1):
    blk = o_hbm.at[pl.ds(lax.rem(me + n - s, n) * rows, rows)]
    copy = pltpu.make_async_remote_copy(blk, blk, send_sem, recv_sem, device_id={AXIS: right})
    copy.start()
    copy.wait_recv()   # block me-s-1 from the left neighbour (same size): forwarded at the next step
    copy.wait_send()


def ring_all_gather(x, mesh, *, check=None):
  """Unidirectional ring all-gather of the row shards of x (one per chip); every chip ends with x.
  Returns every chip's copy stacked (out_specs=P('x')); with `check` (the expected array) each chip
  compares its copy with it and one copy is returned (out_specs=P(): the result is replicated)."""
  n = mesh.shape[AXIS]
  rows = x.shape[0] // n

  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((n * rows,) + x.shape[1:], x.dtype),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.SemaphoreType.DMA] * 2,
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def ring_all_gather_kernel(x_hbm, o_hbm, send_sem, recv_sem):
      me = lax.axis_index(AXIS)
      pltpu.sync_copy(x_hbm, o_hbm.at[pl.ds(me * rows, rows)])
      _ring_all_gather_body(o_hbm, send_sem, recv_sem, n, rows)

    out = ring_all_gather_kernel(xs)
    if check is not None:   # in slices: 64 chips' threads compare at once without big temporaries
      for i in range(0, out.shape[0], rows):
        if not np.array_equal(out[i:i + rows], check[i:i + rows]):
          raise AssertionError(f"block {i // rows} of a chip's gathered array differs from the input")
    return out

  return pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(AXIS),
                      out_specs=pl.P(AXIS) if check is None else pl.P())(x)


def bidirectional_all_gather(x, mesh):
  """All-gather over both directions of the ring: shards at distance 1..ceil((n-1)/2) travel right,
  1..floor((n-1)/2) left; with n even the farthest shard (distance n/2) is split in two halves, one
  each way, so both directions carry (n-1)/2 shards."""
  n = mesh.shape[AXIS]
  rows = x.shape[0] // n
  steps = n // 2
  half = rows // 2

  def per_chip(xs):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((n * rows,) + x.shape[1:], x.dtype),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.SemaphoreType.DMA] * 4,
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def bidirectional_all_gather_kernel(x_hbm, o_hbm, send_r, recv_r, send_l, recv_l):
      me, right, left = _neighbours(n)
      pltpu.sync_copy(x_hbm, o_hbm.at[pl.ds(me * rows, rows)])
      _handshake(left, right)
      for s in range(steps):
        split = n % 2 == 0 and s == steps - 1   # the shard at distance n/2: half each way
        r_block = lax.rem(me + n - s, n) * rows  # received from the left at step s-1 (mine first)
        l_block = lax.rem(me + s, n) * rows
        r_blk = o_hbm.at[pl.ds(r_block, half if split else rows)]
        l_blk = o_hbm.at[pl.ds(l_block + half, rows - half) if split else pl.ds(l_block, rows)]
        copies = [pltpu.make_async_remote_copy(r_blk, r_blk, send_r, recv_r, device_id={AXIS: right}),
                  pltpu.make_async_remote_copy(l_blk, l_blk, send_l, recv_l, device_id={AXIS: left})]
        for c in copies:
          c.start()
        for c in copies:
          c.wait_recv()   # the same-sized blocks from both neighbours
        for c in copies:
          c.wait_send()

    return bidirectional_all_gather_kernel(xs)

  return pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(AXIS), out_specs=pl.P(AXIS))(x)


def _ring_reduce_scatter_body(x_hbm, out_vmem, send_buf, recv_buf, xblk, send_sem, recv_sem, load_sem,
                              credit, n, rows):
  """Ring reduce-scatter into out_vmem (block `me` of the sum over chips). At step s each chip adds its
  own block me-s-1 to the partial sum received from the left (none at step 0) and sends the result to
  the right neighbour's landing buffer; after n-1 steps the partial sum of block me arrives, complete
  but for my own term. Landing buffers are double-buffered: a chip tells its left neighbour (credit)
  when a landing slot is free again."""
  me, right, left = _neighbours(n)
  _handshake(left, right)

  def block(b):
    return x_hbm.at[pl.ds(lax.rem(b + n, n) * rows, rows)]

  def landing(slot):  # describes the copy into slot `slot` of the right neighbour (and of me)
    return pltpu.make_async_remote_copy(send_buf.at[slot], recv_buf.at[slot], send_sem.at[slot],
                                        recv_sem.at[slot], device_id={AXIS: right})

  sends = []
  for s in range(n):
    load = pltpu.make_async_copy(block(me - s - 1), xblk, load_sem)
    load.start()
    if len(sends) == 2:
      sends.pop(0).wait_send()          # send_buf[s % 2] is free again
    load.wait()
    if s == 0:
      total = xblk[...]
    else:
      landing((s - 1) % 2).wait_recv()  # the left neighbour's partial sum of the same block
      total = recv_buf[(s - 1) % 2] + xblk[...]
      if s <= n - 3:
        pl.semaphore_signal(credit, 1, device_id={AXIS: left})   # its landing slot is free again
    if s == n - 1:
      out_vmem[...] = total
      break
    send_buf[s % 2] = total
    if s >= 2:
      pl.semaphore_wait(credit, 1)      # the right neighbour consumed its landing slot s % 2
    copy = landing(s % 2)
    copy.start()
    sends.append(copy)
  for c in sends:
    c.wait_send()


def _reduce_scatter_scratch(rows, cols, dtype):
  return [pltpu.VMEM((2, rows, cols), dtype), pltpu.VMEM((2, rows, cols), dtype),
          pltpu.VMEM((rows, cols), dtype), pltpu.SemaphoreType.DMA((2,)),
          pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR]


def reduce_scatter(xs, mesh):
  """xs[c] is chip c's (n*rows, cols) array; chip c ends with block c of xs.sum(0)."""
  n = mesh.shape[AXIS]
  rows, cols = xs.shape[1] // n, xs.shape[2]

  def per_chip(x):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((rows, cols), xs.dtype),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.VMEM((rows, cols), xs.dtype)]
                       + _reduce_scatter_scratch(rows, cols, xs.dtype),
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def reduce_scatter_kernel(x_hbm, o_hbm, out_vmem, *scratch):
      _ring_reduce_scatter_body(x_hbm, out_vmem, *scratch, n, rows)
      pltpu.sync_copy(out_vmem, o_hbm)

    return reduce_scatter_kernel(x[0])

  return pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(AXIS), out_specs=pl.P(AXIS))(xs)


def all_reduce(xs, mesh):
  """xs[c] is chip c's array; every chip ends with xs.sum(0): reduce-scatter, then ring all-gather."""
  n = mesh.shape[AXIS]
  rows, cols = xs.shape[1] // n, xs.shape[2]

  def per_chip(x):
    @functools.partial(pl.kernel, out_type=pl.ShapeDtypeStruct((n * rows, cols), xs.dtype),
                       mesh=pltpu.TensorCoreMesh("core", 1),
                       scratch_types=[pltpu.VMEM((rows, cols), xs.dtype)]
                       + _reduce_scatter_scratch(rows, cols, xs.dtype) + [pltpu.SemaphoreType.DMA] * 2,
                       compiler_params=pltpu.CompilerParams(collective_id=0))
    def all_reduce_kernel(x_hbm, o_hbm, out_vmem, *scratch):
      *rs, send_sem, recv_sem = scratch
      _ring_reduce_scatter_body(x_hbm, out_vmem, *rs, n, rows)
      pltpu.sync_copy(out_vmem, o_hbm.at[pl.ds(lax.axis_index(AXIS) * rows, rows)])
      _ring_all_gather_body(o_hbm, send_sem, recv_sem, n, rows)

    return all_reduce_kernel(x[0])

  out = pl.shard_map(per_chip, mesh=mesh, in_specs=pl.P(AXIS), out_specs=pl.P(AXIS))(xs)
  return out.reshape(n, n * rows, cols)


# ---------------------------------------------------------------------- rooflines (tpu-hardware.md 6)
def roofline_s(chip, kind: str, n: int, shard_bytes: int) -> float:
  """ICI roofline of each schedule: bytes through the busiest link / one-way link bandwidth + hops on
  the critical path x hop latency. `shard_bytes`: one chip's block (the all-gather input, or one
  block of the reduce-scatter input)."""
  w, lat = chip.ici_link_bytes_per_s_one_way, chip.ici_hop_latency_ns * 1e-9
  if n == 1:
    return 0.0
  if kind == "bidirectional all-gather" and n > 2:
    return (n - 1) * shard_bytes / 2 / w + math.ceil((n - 1) / 2) * lat
  one_way = (n - 1) * (shard_bytes / w + lat)
  return 2 * one_way if kind == "all-reduce" else one_way


def run_all(chip="v5e", chip_counts=(2, 4, 8), rows=512, cols=512, verbose=True):
  """Run every collective for every chip count; check against NumPy; return rows of
  (collective, chips, modelled s, roofline s)."""
  rng = np.random.default_rng(0)
  results = []
  for n in chip_counts:
    x = rng.integers(-8, 8, size=(n * rows, cols)).astype(np.float32)
    xs = rng.integers(-8, 8, size=(n, n * rows, cols)).astype(np.float32)
    shard_bytes = rows * cols * 4
    runs = [("ring all-gather", lambda m: ring_all_gather(x, m), np.asarray(x)),
            ("bidirectional all-gather", lambda m: bidirectional_all_gather(x, m), np.asarray(x)),
            ("reduce-scatter", lambda m: reduce_scatter(xs, m), xs.sum(0)),
            ("all-reduce", lambda m: all_reduce(xs, m), np.broadcast_to(xs.sum(0), xs.shape))]
    for name, fn, want in runs:
      with pl.virtual_tpu(chip, num_chips=n, trace=False) as tpu:
        out = fn(pl.make_mesh((n,), (AXIS,)))
      if name.endswith("all-gather"):
        want = np.concatenate([want] * n)    # every chip's copy, stacked by out_specs=P('x')
      np.testing.assert_array_equal(out, want, err_msg=f"{name} on {n} chips")
      t = tpu.reports[-1].device_time_s
      roof = roofline_s(tpu.chip, name, n, shard_bytes)
      results.append((name, n, t, roof))
      if verbose:
        print(f"  {name:<26} {n:>2} chips  modelled {t * 1e6:9.2f} us   roofline {roof * 1e6:9.2f} us"
              f"   ({t / roof:5.2f}x)")
  return results


def main(quick: bool = False):
  if quick:
    return run_all(chip_counts=(2, 4), rows=16, cols=128)
  print(f"v5e, {512 * 512 * 4 // 1024} KiB per chip shard (f32 (512, 512)); one-way link "
        f"{pl.virtual_tpu('v5e').chip.ici_link_bytes_per_s_one_way / 1e9:.0f} GB/s, ~1 us per hop")
  return run_all()


if __name__ == "__main__":
  main()
