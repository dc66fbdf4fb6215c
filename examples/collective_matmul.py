"""Collective matmul: all_gather(x) @ y with the all-gather hidden behind the MXU, three ways.

x (M, K) is sharded by rows over N chips, y (K, N*n) by columns; chip c computes
all_gather(x) @ y[:, c*n:(c+1)*n], a (M, n) column block of x @ y. Chip c starts with x block c and,
around a ring of ICI neighbours, receives block c-1, c-2, ... one per step.

  1. blocking:   ring all-gather of x into VMEM, then the N block matmuls;
  2. overlapped: at step s the TensorCore starts the remote copy of the block it holds to its right
                 neighbour, multiplies that block while the copy flies, then waits for the block
                 from its left neighbour (double-buffered landing slots; a credit semaphore tells the
                 left neighbour when a slot is free again);
  3. SparseCore: an MPMD kernel. A SparseCore vector subcore forwards the blocks around the ring
                 (HBM to HBM remote DMAs) and signals the TensorCore's semaphore (`core_index=0`)
                 each time a block lands; the TensorCore only loads landed blocks and multiplies.

Each result is checked against NumPy on the same chips. The modelled times and the communication the
overlap hides (ICI time concurrent with MXU work) are printed, and a Perfetto trace of variant 3 is
written, where ICI transfers run concurrently with the MXU. Run: python examples/collective_matmul.py
"""
import functools
import os
import sys
import tempfile

import numpy as np

import palace as pl
import palace.numpy as jnp
from palace import lax
from palace import tpu as pltpu
from palace import tpu_sc as plsc

AXIS = "x"
CHIP = "v5p"   # has SparseCores; 8 chips form a 2x2x2 torus, a ring of one-hop neighbours


def _ring(n):
  me = lax.axis_index(AXIS)
  return me, lax.rem(me + 1, n), lax.rem(me + n - 1, n)


def _handshake(left, right):
  barrier = pltpu.get_barrier_semaphore()
  pl.semaphore_signal(barrier, 1, device_id={AXIS: left})
  pl.semaphore_signal(barrier, 1, device_id={AXIS: right})
  pl.semaphore_wait(barrier, 2)


def _params(vmem_bytes):
  return pltpu.CompilerParams(collective_id=0, vmem_limit_bytes=vmem_bytes)


def _matmul_block(x_blk, y_vmem, o_vmem, out_sems, o_hbm, row, m, writes):
  """Block `row` of o_hbm = x_blk @ y on the MXU, written back asynchronously (double-buffered)."""
  slot = len(writes) % 2
  if len(writes) >= 2:
    writes[-2].wait()
  o_vmem[slot] = jnp.dot(x_blk, y_vmem[...], preferred_element_type=jnp.float32)
  w = pltpu.make_async_copy(o_vmem.at[slot], o_hbm.at[pl.ds(row * m, m)], out_sems.at[slot])
  w.start()
  writes.append(w)


def blocking(x, y, mesh):
  """Variant 1: gather every x block into VMEM (ring of remote copies), then multiply."""
  n_chips = mesh.shape[AXIS]
  m, k, n = x.shape[0] // n_chips, x.shape[1], y.shape[1] // n_chips

  def per_chip(xs, ys):
    @functools.partial(
        pl.kernel, out_type=pl.ShapeDtypeStruct((n_chips * m, n), jnp.float32),
        mesh=pltpu.TensorCoreMesh("core", 1),
        scratch_types=[pltpu.VMEM((n_chips, m, k), x.dtype), pltpu.VMEM((k, n), y.dtype),
                       pltpu.VMEM((2, m, n), jnp.float32), pltpu.SemaphoreType.DMA,
                       pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA((2,))],
        compiler_params=_params(_vmem_need(n_chips, m, k, n, x.dtype)))
    def blocking_kernel(x_hbm, y_hbm, o_hbm, x_all, y_vmem, o_vmem, send_sem, recv_sem, out_sems):
      me, right, left = _ring(n_chips)
      load_y = pltpu.make_async_copy(y_hbm, y_vmem, out_sems.at[0])
      load_y.start()
      pltpu.sync_copy(x_hbm, x_all.at[me])
      _handshake(left, right)
      for s in range(n_chips - 1):
        blk = x_all.at[lax.rem(me + n_chips - s, n_chips)]
        copy = pltpu.make_async_remote_copy(blk, blk, send_sem, recv_sem, device_id={AXIS: right})
        copy.start()
        copy.wait_recv()
        copy.wait_send()
      load_y.wait()
      writes = []
      for b in range(n_chips):
        _matmul_block(x_all[b], y_vmem, o_vmem, out_sems, o_hbm, b, m, writes)
      for w in writes[-2:]:
        w.wait()

    return blocking_kernel(xs, ys)

  return pl.shard_map(per_chip, mesh=mesh, in_specs=(pl.P(AXIS), pl.P(None, AXIS)),
                      out_specs=pl.P(None, AXIS))(x, y)


def overlapped(x, y, mesh):
  """Variant 2: the TensorCore sends the block it holds while the MXU multiplies it."""
  n_chips = mesh.shape[AXIS]
  m, k, n = x.shape[0] // n_chips, x.shape[1], y.shape[1] // n_chips

  def per_chip(xs, ys):
    @functools.partial(
        pl.kernel, out_type=pl.ShapeDtypeStruct((n_chips * m, n), jnp.float32),
        mesh=pltpu.TensorCoreMesh("core", 1),
        scratch_types=[pltpu.VMEM((2, m, k), x.dtype), pltpu.VMEM((k, n), y.dtype),
                       pltpu.VMEM((2, m, n), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                       pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,)),
                       pltpu.SemaphoreType.REGULAR],
        compiler_params=_params(_vmem_need(2, m, k, n, x.dtype)))
    def overlapped_kernel(x_hbm, y_hbm, o_hbm, x_slots, y_vmem, o_vmem, send_sem, recv_sem, out_sems,
                          credit):
      me, right, left = _ring(n_chips)
      load_y = pltpu.make_async_copy(y_hbm, y_vmem, out_sems.at[1])
      load_y.start()
      pltpu.sync_copy(x_hbm, x_slots.at[0])
      _handshake(left, right)
      load_y.wait()
      writes = []
      for s in range(n_chips):
        cur, nxt = s % 2, (s + 1) % 2
        last = s == n_chips - 1
        if not last:
          copy = pltpu.make_async_remote_copy(x_slots.at[cur], x_slots.at[nxt], send_sem.at[cur],
                                              recv_sem.at[nxt], device_id={AXIS: right})
          if s >= 1:
            pl.semaphore_wait(credit, 1)   # the right neighbour is done with its slot `nxt`
          copy.start()
        row = lax.rem(me + n_chips - s, n_chips)
        _matmul_block(x_slots[cur], y_vmem, o_vmem, out_sems, o_hbm, row, m, writes)
        if not last:
          copy.wait_send()
          if s <= n_chips - 3:
            pl.semaphore_signal(credit, 1, device_id={AXIS: left})  # my slot `cur` is free again
          copy.wait_recv()                 # block me-s-1 from the left neighbour, into slot `nxt`
      for w in writes[-2:]:
        w.wait()

    return overlapped_kernel(xs, ys)

  return pl.shard_map(per_chip, mesh=mesh, in_specs=(pl.P(AXIS), pl.P(None, AXIS)),
                      out_specs=pl.P(None, AXIS))(x, y)


def sparsecore_driven(x, y, mesh):
  """Variant 3: a SparseCore subcore moves the blocks; the TensorCore waits for its signals."""
  n_chips = mesh.shape[AXIS]
  m, k, n = x.shape[0] // n_chips, x.shape[1], y.shape[1] // n_chips
  xdt, ydt = x.dtype, y.dtype
  out_type = (pl.ShapeDtypeStruct((n_chips * m, n), jnp.float32),
              pl.ShapeDtypeStruct((n_chips * m, k), xdt))   # the gathered x (an HBM staging area)
  scratch = [pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.REGULAR]

  def tc_body(x_hbm, y_hbm, o_hbm, xg_hbm, send_sem, recv_sem, landed):
    me = lax.axis_index(AXIS)

    def body(x_slots, y_vmem, o_vmem, load_sems, out_sems):
      load_y = pltpu.make_async_copy(y_hbm, y_vmem, out_sems.at[1])
      load_y.start()

      def load(s):
        src = x_hbm if s == 0 else xg_hbm.at[pl.ds(lax.rem(me + n_chips - s, n_chips) * m, m)]
        return pltpu.make_async_copy(src, x_slots.at[s % 2], load_sems.at[s % 2])

      loads = [load(0)]
      loads[0].start()
      load_y.wait()
      writes = []
      for s in range(n_chips):
        loads[s].wait()
        if s + 1 < n_chips:
          pl.semaphore_wait(landed, 1)   # the SparseCore says block me-s-1 has landed
          loads.append(load(s + 1))
          loads[-1].start()
        row = lax.rem(me + n_chips - s, n_chips)
        _matmul_block(x_slots[s % 2], y_vmem, o_vmem, out_sems, o_hbm, row, m, writes)
      for w in writes[-2:]:
        w.wait()

    pl.run_scoped(body, pltpu.VMEM((2, m, k), xdt), pltpu.VMEM((k, n), ydt),
                  pltpu.VMEM((2, m, n), jnp.float32), pltpu.SemaphoreType.DMA((2,)),
                  pltpu.SemaphoreType.DMA((2,)))

  def sc_body(x_hbm, y_hbm, o_hbm, xg_hbm, send_sem, recv_sem, landed):
    me, right, left = _ring(n_chips)
    _handshake(left, right)   # with the neighbours' SparseCore subcores: they are running this kernel
    for s in range(n_chips - 1):
      row = lax.rem(me + n_chips - s, n_chips) * m
      src = x_hbm if s == 0 else xg_hbm.at[pl.ds(row, m)]
      copy = pltpu.make_async_remote_copy(src, xg_hbm.at[pl.ds(row, m)], send_sem, recv_sem,
                                          device_id={AXIS: right})
      copy.start()
      copy.wait_recv()                           # block me-s-1 has landed here
      pl.semaphore_signal(landed, 1, core_index=0)   # tell this chip's TensorCore
      copy.wait_send()

  def per_chip(xs, ys):
    tc_mesh = pltpu.TensorCoreMesh("core", 1)
    sc_mesh = plsc.VectorSubcoreMesh(core_axis_name="sc", subcore_axis_name="sub", num_cores=1,
                                     num_subcores=1)
    k_ = pl.kernel([tc_body, sc_body], out_type=out_type, mesh=[tc_mesh, sc_mesh],
                   scratch_types=scratch, compiler_params=_params(_vmem_need(2, m, k, n, xdt)))
    return k_(xs, ys)[0]

  return pl.shard_map(per_chip, mesh=mesh, in_specs=(pl.P(AXIS), pl.P(None, AXIS)),
                      out_specs=pl.P(None, AXIS))(x, y)


def _vmem_need(x_blocks, m, k, n, dtype):
  need = x_blocks * m * k * np.dtype(dtype).itemsize + k * n * np.dtype(dtype).itemsize + 2 * m * n * 4
  return max(16 << 20, int(need * 1.25) + (1 << 20))


# ---------------------------------------------------------------------- timing analysis
def _union(intervals):
  out = []
  for s, e in sorted(intervals):
    if out and s <= out[-1][1]:
      out[-1][1] = max(out[-1][1], e)
    else:
      out.append([s, e])
  return out


def _overlap(a, b):
  total = 0.0
  for s, e in a:
    for s2, e2 in b:
      lo, hi = max(s, s2), min(e, e2)
      if hi > lo:
        total += hi - lo
  return total


def comm_compute_overlap_s(report):
  """(ICI busy time, MXU busy time, ICI time concurrent with MXU work) of the chip that hides the
  least communication, in seconds. ICI intervals are the chip's outgoing transfers (first byte to
  landing); MXU intervals are its TensorCores' matmuls."""
  per_chip = {}
  for tid, unit, _, start, end, _ in report.events:
    if unit in ("ici", "mxu"):
      per_chip.setdefault(tid[0], {"ici": [], "mxu": []})[unit].append((start, end))
  rows = []
  for d in per_chip.values():
    ici, mxu = _union(d["ici"]), _union(d["mxu"])
    rows.append((sum(e - s for s, e in ici), sum(e - s for s, e in mxu), _overlap(ici, mxu)))
  clock = report.chip.clock_hz
  ici, mxu, hidden = min(rows, key=lambda r: r[2])
  return ici / clock, mxu / clock, hidden / clock


def run(n_chips=8, m=256, k=512, n=4096, dtype=jnp.bfloat16, trace_path=None, verbose=True,
        timing_only=False, seed=0):
  """Run the three variants; check each against NumPy (unless timing_only); return
  {variant: Report}."""
  rng = np.random.default_rng(seed)
  x = rng.integers(-4, 5, size=(n_chips * m, k)).astype(dtype)
  y = rng.integers(-4, 5, size=(k, n_chips * n)).astype(dtype)
  want = None if timing_only else x.astype(np.float32) @ y.astype(np.float32)
  reports = {}
  for name, fn in (("blocking", blocking), ("overlapped", overlapped), ("sparsecore", sparsecore_driven)):
    with pl.virtual_tpu(CHIP, num_chips=n_chips, timing_only=timing_only,
                        trace=trace_path is not None or name != "blocking") as tpu:
      out = fn(x, y, pl.make_mesh((n_chips,), (AXIS,)))
    if want is not None:
      np.testing.assert_array_equal(out, want, err_msg=name)
    reports[name] = tpu.reports[-1]
  if verbose:
    _print(reports, n_chips, m, k, n, dtype)
  if trace_path is not None:
    reports["sparsecore"].to_perfetto(trace_path)
    if verbose:
      print(f"Perfetto trace of the SparseCore-driven variant: {trace_path} (open in ui.perfetto.dev)")
  return reports


def _print(reports, n_chips, m, k, n, dtype):
  chip = reports["blocking"].chip
  item = np.dtype(dtype).itemsize
  step_comm = m * k * item / chip.ici_link_bytes_per_s_one_way + chip.ici_hop_latency_ns * 1e-9
  print(f"{CHIP}, {n_chips} chips: x ({n_chips * m}, {k}) by rows, y ({k}, {n_chips * n}) by columns, "
        f"{np.dtype(dtype).name}; per step: {m * k * item // 1024} KiB over one ICI hop "
        f"(>= {step_comm * 1e6:.2f} us), a ({m}, {k}) @ ({k}, {n}) matmul")
  t_block = reports["blocking"].device_time_s
  for name, r in reports.items():
    line = f"  {name:<11} {r.device_time_s * 1e6:9.2f} us"
    if name != "blocking":
      ici, mxu, hidden = comm_compute_overlap_s(r)
      line += (f"   saves {(t_block - r.device_time_s) * 1e6:7.2f} us; ICI {ici * 1e6:.2f} us, "
               f"MXU {mxu * 1e6:.2f} us, ICI hidden under MXU {hidden * 1e6:.2f} us")
    print(line)


def main(quick: bool = False, trace_path=None):
  if quick:
    return run(n_chips=4, m=16, k=128, n=256, trace_path=trace_path)
  return run(trace_path=trace_path or os.path.join(tempfile.gettempdir(), "collective_matmul.perfetto.json"))


if __name__ == "__main__":
  main(quick="--quick" in sys.argv)
