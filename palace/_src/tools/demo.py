"""The guided tour behind `palace demo` (L5 tool; needs the `cli` extra), and the kernels it runs.

Each part runs a kernel on the virtual TPU, checks it against NumPy, prints its modelled time beside a
roofline figure and writes a Perfetto trace and a timeline PNG. A part whose capability is not built yet
(detected by the names it needs) is listed as "not built yet", never imitated.
"""
from __future__ import annotations

import functools
import time
import traceback
from pathlib import Path

import numpy as np

from palace._src import hw
from palace._src.tools.autotune import autotune, format_config
from palace._src.tools.console import fmt_us, progress, table
from palace._src.errors import ResourceError


# ------------------------------------------------------------------ kernels used by demo and tune
def matmul_kernel(x_ref, y_ref, z_ref, acc_ref):
  """The classic tiled matmul body: K innermost, f32 (or int32) accumulator scratch."""
  import palace as pl
  import palace.numpy as jnp

  @pl.when(pl.program_id(2) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=acc_ref.dtype)

  @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
  def _():
    z_ref[...] = acc_ref[...].astype(z_ref.dtype)


def _acc_dtype(dtype):
  return np.dtype(np.int32) if np.issubdtype(np.dtype(dtype), np.integer) else np.dtype(np.float32)


def make_matmul(m: int, k: int, n: int, dtype, *, bm: int, bk: int, bn: int):
  """`pallas_call` matmul (m, k) @ (k, n) with (bm, bk, bn) blocks; int8 inputs give an int32 output."""
  import palace as pl
  from palace import tpu as pltpu
  acc = _acc_dtype(dtype)
  out = acc if acc == np.int32 else np.dtype(dtype)
  return pl.pallas_call(
      matmul_kernel, out_shape=pl.ShapeDtypeStruct((m, n), out),
      grid=(m // bm, n // bn, k // bk),
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), acc)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
      name="matmul")


def make_pipeline_matmul(m: int, k: int, n: int, dtype, *, bm: int, bk: int, bn: int):
  """The same matmul as `pl.kernel` + `pltpu.emit_pipeline` over HBM refs."""
  import palace as pl
  from palace import tpu as pltpu
  acc = _acc_dtype(dtype)

  def body(x_hbm, y_hbm, z_hbm):
    def with_acc(acc_ref):
      pltpu.emit_pipeline(
          functools.partial(_pipeline_step, acc_ref=acc_ref), grid=(m // bm, n // bn, k // bk),
          in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                    pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
          out_specs=[pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))])(x_hbm, y_hbm, z_hbm)
    pl.run_scoped(with_acc, pltpu.VMEM((bm, bn), acc))

  return pl.kernel(body, out_type=pl.ShapeDtypeStruct((m, n), np.dtype(dtype)),
                   mesh=pltpu.TensorCoreMesh("core", num_cores=1), name="pipeline_matmul")


def _pipeline_step(x_ref, y_ref, z_ref, acc_ref):
  matmul_kernel(x_ref, y_ref, z_ref, acc_ref)


def roofline_reference(chip, m: int, k: int, n: int, dtype) -> tuple:
  """XLA-style lower bound: (time, bound) = max(2mnk / peak, bytes / HBM bandwidth), each operand once."""
  d = np.dtype(dtype)
  cls = {"bfloat16": "bf16", "float32": "f32", "int8": "int8"}.get(d.name, "bf16")
  out_itemsize = 4 if np.issubdtype(d, np.integer) else d.itemsize
  flops = 2 * m * n * k
  nbytes = (m * k + k * n) * d.itemsize + m * n * out_itemsize
  t_mxu = flops / chip.peak_flops_per_s(cls)
  t_hbm = nbytes / chip.hbm_bytes_per_s_per_device
  return max(t_mxu, t_hbm), ("compute" if t_mxu >= t_hbm else "memory"), flops


# ------------------------------------------------------------------ the demo's parts
# v5e, bf16 m = k = n = 4096, wall time incl. ~105 us host dispatch (tpu-hardware.md section 7).
_PUBLISHED_V5E_4096 = {(128, 128, 128): 11.7715e-3, (512, 1024, 1024): 0.88909e-3, "xla": 0.82729e-3}


class _Part:
  """One stop of the tour: status is 'ran', 'not built yet' or 'failed'."""

  def __init__(self, name, api):
    self.name, self.api = name, api
    self.status, self.detail, self.files, self.reports = "ran", "", [], []


def _missing(part, what):
  part.status, part.detail = "not built yet", f"needs {what}"
  return part


def _save(ctx, part, report, stem):
  """Trace + timeline of `report` into the output folder; registers it for the roofline."""
  out = ctx["out"]
  part.files.append(report.to_perfetto(out / f"{stem}.trace.json"))
  from palace._src.tools.pngs import timeline_png
  part.files.append(timeline_png(report, out / f"{stem}.timeline.png"))
  ctx["points"].append((stem, report))


def _rel_err(got, want) -> float:
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want) / (np.abs(want) + 1)))


def _part_matmul(ctx):
  import palace as pl
  import palace.numpy as jnp
  console, spec, quick = ctx["console"], ctx["chip"], ctx["quick"]
  part = _Part("pallas_call matmul + block-size sweep", "pl.pallas_call, BlockSpec, VMEM scratch")
  bf16 = np.dtype(jnp.bfloat16)
  m = 512 if quick else 1024
  blocks = dict(bm=256, bk=512, bn=512) if quick else dict(bm=512, bk=1024, bn=1024)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((m, m)).astype(bf16)
  y = rng.standard_normal((m, m)).astype(bf16)
  with pl.virtual_tpu(spec) as tpu:
    z = make_matmul(m, m, m, bf16, **blocks)(x, y)
  err = _rel_err(z, x.astype(np.float32) @ y.astype(np.float32))
  r = tpu.reports[-1]
  console.print(f"bf16 matmul {m}^3 with {format_config(blocks)}: max rel. error vs NumPy {err:.1e}, "
                f"modelled {fmt_us(r.device_time_s)} ({100 * r.peak_fraction:.0f}% of peak, {r.bound}-bound)")
  if err > 2e-2:
    raise AssertionError(f"matmul result differs from NumPy (max rel. error {err:.2e})")
  _save(ctx, part, r, "matmul")
  ctx["matmul_ref"] = (m, blocks, r)
  # the sweep: timing-only runs at a size where the block choice matters
  s = 1024 if quick else 4096
  cfgs = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (256, 1024, 1024), (512, 1024, 1024),
          (1024, 1024, 512), (1024, 1024, 1024)]
  if quick:
    cfgs = [(128, 128, 128), (256, 256, 256), (512, 1024, 1024), (1024, 1024, 1024)]
  cfgs = [dict(bm=a, bk=b, bn=c) for a, b, c in cfgs]
  xs = np.zeros((s, s), bf16)
  with progress(console) as prog:
    task = prog.add_task(f"sweep {s}^3", total=len(cfgs))
    res = autotune(lambda c: make_matmul(s, s, s, bf16, **c), cfgs, (xs, xs), chip=spec,
                   progress=lambda d, n, tr: prog.update(task, completed=d))
  ref_t, ref_bound, flops = roofline_reference(spec, s, s, s, bf16)
  published = _PUBLISHED_V5E_4096 if (spec.name == "v5e" and s == 4096) else {}
  t = table(f"bf16 matmul {s}x{s}x{s} on {spec.name}: block-size sweep (timing-only runs)",
             ["bm", "bk", "bn", "steps", "device time", "TFLOP/s", "% peak", ("bound", "left"),
              "+ dispatch"] + (["real v5e"] if published else []))
  best = res.best
  for tr in res.trials:
    c = tr.config
    key = (c["bm"], c["bk"], c["bn"])
    pub = [fmt_us(published[key]) if key in published else ""] if published else []
    if not tr.ok:
      why = "over VMEM" if isinstance(tr.error, ResourceError) else "tiling"
      t.add_row(*map(str, key), "", why, "", "", "rejected", "", *pub, style="dim")
      continue
    rr = tr.report
    t.add_row(*map(str, key), f"{rr.grid_steps:,}", fmt_us(rr.device_time_s),
              f"{flops / rr.device_time_s / 1e12:,.1f}", f"{100 * rr.peak_fraction:.1f}",
              rr.bound + (" *" if tr is best else ""), fmt_us(rr.total_time_s), *pub,
              style="bold" if tr is best else None)
  t.add_row("XLA-style", "roofline", "", "", fmt_us(ref_t), f"{flops / ref_t / 1e12:,.1f}",
            f"{100 * flops / ref_t / spec.peak_flops_per_s('bf16'):.1f}", ref_bound,
            fmt_us(ref_t + spec.launch_overhead_s), *([fmt_us(published["xla"])] if published else []),
            style="cyan")
  console.print(t)
  console.print(f"roofline reference = max(2mnk / peak = {fmt_us(flops / spec.peak_flops_per_s('bf16'))}, "
                f"bytes / HBM BW = {fmt_us(3 * s * s * 2 / spec.hbm_bytes_per_s_per_device)}); "
                f"'+ dispatch' adds the modelled host launch overhead of {fmt_us(spec.launch_overhead_s)}"
                + ("; 'real v5e': published wall times incl. dispatch (tpu-hardware.md section 7)"
                   if published else "") + "; * = fastest.")
  ctx["points"].append((f"matmul {s}^3 best", best.report))
  worst = max((tr for tr in res.trials if tr.ok), key=lambda tr: tr.time_s)
  ctx["points"].append((f"matmul {s}^3 {format_config(worst.config)}", worst.report))
  part.reports = [r, best.report]
  part.detail = (f"best {format_config(best.config)}: {fmt_us(best.time_s)} "
                 f"({100 * best.report.peak_fraction:.0f}% of peak)")
  return part


def _part_pipeline(ctx):
  import palace as pl
  import palace.numpy as jnp
  from palace import tpu as pltpu
  part = _Part("pl.kernel + emit_pipeline matmul", "pl.kernel, pltpu.emit_pipeline, pl.run_scoped")
  if not hasattr(pltpu, "emit_pipeline"):
    return _missing(part, "pltpu.emit_pipeline")
  m, blocks, ref = ctx["matmul_ref"]
  bf16 = np.dtype(jnp.bfloat16)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((m, m)).astype(bf16)
  y = rng.standard_normal((m, m)).astype(bf16)
  with pl.virtual_tpu(ctx["chip"]) as tpu:
    z = make_pipeline_matmul(m, m, m, bf16, **blocks)(x, y)
  err = _rel_err(z, x.astype(np.float32) @ y.astype(np.float32))
  if err > 2e-2:
    raise AssertionError(f"emit_pipeline matmul differs from NumPy (max rel. error {err:.2e})")
  r = tpu.reports[-1]
  _save(ctx, part, r, "pipeline_matmul")
  part.reports = [r]
  part.detail = (f"{fmt_us(r.device_time_s)} vs {fmt_us(ref.device_time_s)} for pallas_call "
                 f"(same blocks); max rel. error {err:.1e}")
  ctx["console"].print(f"pl.kernel + emit_pipeline matmul {m}^3: {part.detail}")
  return part


def ragged_gather_kernel(starts_ref, lens_ref, table_ref, o_ref):
  """Copy lens[g] rows starting at row starts[g] (any row, not block-aligned) into output block g;
  rows past lens[g] are zero. starts/lens are scalar-prefetch operands read from SMEM."""
  import palace as pl
  import palace.lax as lax
  import palace.numpy as jnp
  g = pl.program_id(0)
  n = lens_ref[g]
  rows = lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
  o_ref[...] = jnp.where(rows < n, table_ref[...], jnp.zeros_like(o_ref))


def make_ragged_gather(rows: int, width: int, groups: int, block: int, dtype):
  import palace as pl
  from palace import tpu as pltpu
  gs = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2, grid=(groups,),
      in_specs=[pl.BlockSpec((pl.Element(block), width), lambda g, starts, lens: (starts[g], 0))],
      out_specs=pl.BlockSpec((block, width), lambda g, starts, lens: (g, 0)))
  return pl.pallas_call(ragged_gather_kernel, out_shape=pl.ShapeDtypeStruct((groups * block, width), dtype),
                        grid_spec=gs, name="ragged_gather")


def _part_ragged(ctx):
  import palace as pl
  part = _Part("scalar-prefetch ragged gather", "PrefetchScalarGridSpec, pl.Element, SMEM index maps")
  rows, width, groups, block = (1024, 128, 16, 16) if ctx["quick"] else (8192, 512, 64, 32)
  rng = np.random.default_rng(2)
  table = rng.standard_normal((rows, width)).astype(np.float32)
  starts = rng.integers(0, rows - block, groups).astype(np.int32)
  lens = rng.integers(1, block + 1, groups).astype(np.int32)
  with pl.virtual_tpu(ctx["chip"]) as tpu:
    out = make_ragged_gather(rows, width, groups, block, np.float32)(starts, lens, table)
  want = np.zeros_like(out)
  for g in range(groups):
    want[g * block:g * block + lens[g]] = table[starts[g]:starts[g] + lens[g]]
  if not np.array_equal(out, want):
    raise AssertionError("ragged gather result differs from NumPy")
  r = tpu.reports[-1]
  _save(ctx, part, r, "ragged_gather")
  part.reports = [r]
  ideal = r.hbm_bytes / ctx["chip"].hbm_bytes_per_s_per_device
  part.detail = (f"{groups} groups of <= {block} rows x {width} f32: {fmt_us(r.device_time_s)} "
                 f"(HBM roofline {fmt_us(ideal)}, {r.bound}-bound); exact vs NumPy")
  ctx["console"].print(f"ragged gather: {part.detail}")
  return part


def _part_sparsecore(ctx):
  import palace as pl
  import palace.lax as lax
  from palace import tpu as pltpu
  from palace import tpu_sc as plsc
  part = _Part("SparseCore gather", "plsc.VectorSubcoreMesh, pl.kernel, indexed async_copy")
  if not hasattr(plsc, "VectorSubcoreMesh"):
    return _missing(part, "palace.tpu_sc.VectorSubcoreMesh")
  chip = ctx["chip"] if ctx["chip"].sparsecore is not None else hw.get_chip("v5p")
  sc = chip.sparsecore
  workers = sc.num_cores * sc.num_subcores
  per, width, rows = 8, 128, 4096
  n = workers * per
  rng = np.random.default_rng(3)
  table = rng.standard_normal((rows, width)).astype(np.float32)
  idx = rng.integers(0, rows, n).astype(np.int32)

  def gather(idx_hbm, table_hbm, out_hbm, idx_vmem, rows_vmem, sem):
    w = lax.axis_index(("core", "subcore"))
    pltpu.sync_copy(idx_hbm.at[pl.ds(w * per, per)], idx_vmem)
    pltpu.async_copy(table_hbm.at[idx_vmem], rows_vmem, sem).wait()
    pltpu.sync_copy(rows_vmem, out_hbm.at[pl.ds(w * per, per)])

  with pl.virtual_tpu(chip) as tpu:  # meshes check the chip's SparseCores when they are built
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore",
                                  num_cores=sc.num_cores, num_subcores=sc.num_subcores)
    call = pl.kernel(gather, out_type=pl.ShapeDtypeStruct((n, width), np.float32), mesh=mesh,
                     scratch_types=[pltpu.VMEM((per,), np.int32), pltpu.VMEM((per, width), np.float32),
                                    pltpu.SemaphoreType.DMA], name="sc_gather")
    out = call(idx, table)
  if not np.array_equal(out, table[idx]):
    raise AssertionError("SparseCore gather result differs from NumPy")
  r = tpu.reports[-1]
  _save(ctx, part, r, "sc_gather")
  part.reports = [r]
  part.detail = f"{n} rows by {workers} vector subcores on {chip.name}: {fmt_us(r.device_time_s)}; exact"
  ctx["console"].print(f"SparseCore gather: {part.detail}")
  return part


def _part_collective(ctx):
  import palace as pl
  part = _Part("collective matmul on 8 chips", "pl.shard_map, remote DMA over ICI")
  missing = [n for n in ("shard_map", "make_mesh", "P") if not hasattr(pl, n)]
  if missing:
    return _missing(part, ", ".join(f"pl.{n}" for n in missing))
  return _collective_matmul(ctx, part)


def make_collective_matmul(mesh, m: int, k: int, n: int, dtype, *, overlap: bool, axis: str = "x"):
  """out = all_gather(x) @ y with x sharded by rows and y and out by columns over `axis` of `mesh`.

  Each chip keeps the gathered x in VMEM. Blocking: a ring all-gather, then the matmuls. Overlapped: at
  ring step s a chip forwards the chunk it holds to its right neighbour (async remote DMA over ICI)
  while the MXU multiplies that same chunk, then waits for the chunk arriving from its left.
  """
  import palace as pl
  import palace.lax as lax
  import palace.numpy as jnp
  from palace import tpu as pltpu
  chips = mesh.shape[axis]
  mc, nc = m // chips, n // chips

  def per_chip(xs, ys):
    @functools.partial(
        pl.kernel, out_type=pl.ShapeDtypeStruct((m, nc), dtype), mesh=pltpu.TensorCoreMesh("core", 1),
        scratch_types=[pltpu.VMEM((m, k), dtype), pltpu.VMEM((k, nc), dtype), pltpu.VMEM((mc, nc), dtype),
                       pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        name="collective_matmul_overlapped" if overlap else "collective_matmul_blocking")
    def kernel(x_hbm, y_hbm, o_hbm, xg, yv, ov, send_sem, recv_sem):
      me = lax.axis_index(axis)
      right, left = lax.rem(me + 1, chips), lax.rem(me + chips - 1, chips)
      barrier = pltpu.get_barrier_semaphore()  # neighbours are in the kernel (their VMEM exists)
      pl.semaphore_signal(barrier, 1, device_id={axis: left})
      pl.semaphore_signal(barrier, 1, device_id={axis: right})
      pl.semaphore_wait(barrier, 2)
      pltpu.sync_copy(x_hbm, xg.at[pl.ds(me * mc, mc)])
      pltpu.sync_copy(y_hbm, yv)

      def forward(step):
        rows = pl.ds(lax.rem(me + chips - step, chips) * mc, mc)
        return pltpu.make_async_remote_copy(xg.at[rows], xg.at[rows], send_sem, recv_sem,
                                            device_id={axis: right})

      def multiply(step):
        rows = pl.ds(lax.rem(me + chips - step, chips) * mc, mc)
        ov[...] = jnp.dot(xg[rows, :], yv[...], preferred_element_type=jnp.float32).astype(ov.dtype)
        pltpu.sync_copy(ov, o_hbm.at[rows])

      if not overlap:
        for step in range(chips - 1):
          copy = forward(step)
          copy.start()
          copy.wait()
      for step in range(chips):
        copy = forward(step) if overlap and step < chips - 1 else None
        if copy is not None:
          copy.start()
        multiply(step)
        if copy is not None:
          copy.wait()

    return kernel(xs, ys)

  return pl.shard_map(per_chip, mesh=mesh, in_specs=(pl.P(axis, None), pl.P(None, axis)),
                      out_specs=pl.P(None, axis))


def make_sc_collective_matmul(mesh, m: int, k: int, n: int, dtype, *, axis: str = "x"):
  """The same product, with a SparseCore vector subcore doing the communication (an MPMD kernel).

  The subcore forwards x blocks around the ring (HBM to HBM remote DMAs into a gathered-x staging output)
  and signals its TensorCore (`core_index=0`) each time a block lands; the TensorCore only loads landed
  blocks and multiplies, so the ICI transfers run while the MXU works.
  """
  import palace as pl
  import palace.lax as lax
  import palace.numpy as jnp
  from palace import tpu as pltpu
  from palace import tpu_sc as plsc
  chips = mesh.shape[axis]
  mc, nc = m // chips, n // chips

  def rows(step, me):
    return pl.ds(lax.rem(me + chips - step, chips) * mc, mc)

  def tc_body(x_hbm, y_hbm, o_hbm, xg_hbm, send_sem, recv_sem, landed):
    me = lax.axis_index(axis)

    def body(xv, yv, ov, load_sems, write_sems):
      pltpu.sync_copy(y_hbm, yv)

      def load(step):   # double-buffered: block step+1 loads while block step is multiplied
        src = x_hbm if step == 0 else xg_hbm.at[rows(step, me)]
        return pltpu.make_async_copy(src, xv.at[step % 2], load_sems.at[step % 2])

      loads, writes = [load(0)], []
      loads[0].start()
      for step in range(chips):
        slot = step % 2
        loads[step].wait()
        if step + 1 < chips:
          pl.semaphore_wait(landed, 1)       # the SparseCore says the next block has landed
          loads.append(load(step + 1))
          loads[-1].start()
        if step >= 2:
          writes[step - 2].wait()            # the output slot is free again
        ov[slot] = jnp.dot(xv[slot], yv[...], preferred_element_type=jnp.float32).astype(ov.dtype)
        writes.append(pltpu.make_async_copy(ov.at[slot], o_hbm.at[rows(step, me)], write_sems.at[slot]))
        writes[-1].start()
      for w in writes[-2:]:
        w.wait()

    pl.run_scoped(body, pltpu.VMEM((2, mc, k), dtype), pltpu.VMEM((k, nc), dtype),
                  pltpu.VMEM((2, mc, nc), dtype), pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,)))

  def sc_body(x_hbm, y_hbm, o_hbm, xg_hbm, send_sem, recv_sem, landed):
    me = lax.axis_index(axis)
    right, left = lax.rem(me + 1, chips), lax.rem(me + chips - 1, chips)
    barrier = pltpu.get_barrier_semaphore()   # the neighbours' subcores are running this kernel
    pl.semaphore_signal(barrier, 1, device_id={axis: left})
    pl.semaphore_signal(barrier, 1, device_id={axis: right})
    pl.semaphore_wait(barrier, 2)
    for step in range(chips - 1):
      src = x_hbm if step == 0 else xg_hbm.at[rows(step, me)]
      copy = pltpu.make_async_remote_copy(src, xg_hbm.at[rows(step, me)], send_sem, recv_sem,
                                          device_id={axis: right})
      copy.start()
      copy.wait_recv()                            # the block from the left neighbour is here
      pl.semaphore_signal(landed, 1, core_index=0)
      copy.wait_send()

  def per_chip(xs, ys):
    sc_mesh = plsc.VectorSubcoreMesh(core_axis_name="sc", subcore_axis_name="sub", num_cores=1,
                                     num_subcores=1)
    k_ = pl.kernel([tc_body, sc_body], mesh=[pltpu.TensorCoreMesh("core", 1), sc_mesh],
                   out_type=(pl.ShapeDtypeStruct((m, nc), dtype), pl.ShapeDtypeStruct((m, k), dtype)),
                   scratch_types=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA,
                                  pltpu.SemaphoreType.REGULAR],
                   compiler_params=pltpu.CompilerParams(collective_id=0),
                   name="collective_matmul_sparsecore")
    return k_(xs, ys)[0]

  return pl.shard_map(per_chip, mesh=mesh, in_specs=(pl.P(axis, None), pl.P(None, axis)),
                      out_specs=pl.P(None, axis))


def ici_hidden_s(report) -> float:
  """ICI busy time that runs concurrently with MXU work, for the chip that hides the least (seconds)."""
  per_chip = {}
  for tid, unit, _, start, end, _ in report.events:
    if unit in ("ici", "mxu"):
      per_chip.setdefault(tid[0], {"ici": [], "mxu": []})[unit].append((start, end))
  hidden = []
  for d in per_chip.values():
    hidden.append(sum(max(0, min(e, e2) - max(s, s2)) for s, e in _merged(d["ici"]) for s2, e2 in
                      _merged(d["mxu"])))
  return (min(hidden) if hidden else 0) / report.chip.clock_hz


def _merged(intervals):
  out = []
  for s, e in sorted(intervals):
    if out and s <= out[-1][1]:
      out[-1][1] = max(out[-1][1], e)
    else:
      out.append([s, e])
  return out


def _collective_matmul(ctx, part):
  import palace as pl
  import palace.numpy as jnp
  chips = 8
  chip = ctx["chip"]
  # the SparseCore-driven variant needs a generation with SparseCores (v5e has none: v5p then)
  sc_chip = chip if chip.sparsecore is not None else hw.get_chip("v5p")
  bf16 = np.dtype(jnp.bfloat16)
  m, k, n = (chips * 64, 256, chips * 256) if ctx["quick"] else (chips * 128, 512, chips * 2048)
  rng = np.random.default_rng(4)
  x = rng.integers(-4, 5, size=(m, k)).astype(bf16)   # small integers: exact products and sums
  y = rng.integers(-4, 5, size=(k, n)).astype(bf16)
  want = (x.astype(np.float32) @ y.astype(np.float32)).astype(bf16)
  variants = [("blocking", chip, "all-gather, then matmul"),
              ("overlapped", chip, "TensorCore forwards block s while multiplying it")]
  if sc_chip is not chip:
    variants.append(("overlapped", sc_chip, "the same on the SparseCore generation"))
  variants.append(("sparsecore", sc_chip, "a SparseCore subcore forwards, the TensorCore multiplies"))
  runs = []
  for name, on, what in variants:
    with pl.virtual_tpu(on, num_chips=chips) as tpu:
      mesh = pl.make_mesh((chips,), ("x",))
      if name == "sparsecore":
        fn = make_sc_collective_matmul(mesh, m, k, n, bf16)
      else:
        fn = make_collective_matmul(mesh, m, k, n, bf16, overlap=name == "overlapped")
      z = fn(x, y)
    if not np.array_equal(np.asarray(z), want):
      raise AssertionError(f"collective matmul ({name} on {on.name}) differs from NumPy (max rel. error "
                           f"{_rel_err(z, want):.2e})")
    runs.append((name, on, what, tpu.reports[-1]))
  for name, on, _, r in runs:
    _save(ctx, part, r, f"collective_matmul_{name}" + ("" if on is chip else f"_{on.name}"))
  part.reports = [r for *_, r in runs]
  chunk = m // chips * k * bf16.itemsize
  ici = (chips - 1) * (chunk / chip.ici_link_bytes_per_s_one_way + chip.ici_hop_latency_ns * 1e-9)
  mxu = 2 * m * k * (n // chips) / chip.peak_flops_per_s("bf16")
  times = {(name, on.name): r.device_time_s for name, on, _, r in runs}
  part.detail = (f"{chips} chips, bf16 [{m},{k}] @ [{k},{n}]: " + ", ".join(
      f"{name} {fmt_us(t)} on {c}" for (name, c), t in times.items()) + "; results exact vs NumPy")
  t = table(f"all-gather + matmul on {chips} virtual chips (ring over ICI)",
            [("variant", "left"), ("chip", "left"), "device time", "ICI hidden under MXU", "ICI traffic",
             ("bound", "left")])
  for name, on, what, r in runs:
    t.add_row(f"{name}: {what}", on.name, fmt_us(r.device_time_s), fmt_us(ici_hidden_s(r)),
              f"{r.ici_bytes / 2**20:,.2f} MiB", r.bound)
  t.add_row(f"ICI roofline on {chip.name}: (N-1) x (chunk / link BW + hop latency)", "", fmt_us(ici), "", "",
            "", style="cyan")
  t.add_row(f"MXU roofline per {chip.name} chip: 2 m k n/N / peak", "", fmt_us(mxu), "", "", "", style="cyan")
  ctx["console"].print(t)
  return part


_PARTS = (_part_matmul, _part_pipeline, _part_ragged, _part_sparsecore, _part_collective)


def run_demo(console, out: Path, *, quick: bool = False, chip="v5e") -> int:
  """Run every part of the tour; returns the number of parts that failed."""
  import palace as pl
  from rich.markup import escape
  t0 = time.perf_counter()
  spec = hw.get_chip(chip)
  out.mkdir(parents=True, exist_ok=True)
  console.rule(f"[bold]palace demo[/] {'(quick) ' if quick else ''}on a virtual TPU {spec.name}")
  console.print(f"{spec.name}: {spec.clock_hz / 1e9:.2f} GHz, "
                f"{spec.num_tensorcores_per_device} TensorCore(s), "
                f"{spec.num_mxus} MXUs of {spec.mxu_size}x{spec.mxu_size}, "
                f"{spec.peak_flops_per_s('bf16') / 1e12:.0f} TFLOP/s bf16, "
                f"{spec.hbm_bytes_per_s_per_device / 1e9:.0f} GB/s HBM, {spec.vmem_bytes >> 20} MiB VMEM "
                f"({spec.default_scoped_vmem_bytes >> 20} MiB scoped by default). Times are modelled.")
  ctx = {"console": console, "chip": spec, "quick": quick, "out": out, "points": []}
  parts = []
  for fn in _PARTS:
    name = fn.__name__.removeprefix("_part_")
    console.rule(name.replace("_", " "), style="dim")
    try:
      part = fn(ctx)
    except Exception as e:  # noqa: BLE001  a broken part is reported, the tour goes on, exit status 1
      part = _Part(name, "")
      msg = (str(e).splitlines() or [""])[0][:160]
      where = traceback.extract_tb(e.__traceback__)[-1]
      part.status = "failed"
      part.detail = f"{type(e).__name__}: {msg} ({Path(where.filename).name}:{where.lineno})"
      console.print(f"[red]{name} failed:[/] {escape(part.detail)}")
    if part.status == "not built yet":
      console.print(f"[yellow]{part.name}: not built yet[/] ({escape(part.detail)})")
    parts.append(part)
  console.rule("summary", style="dim")
  files = []
  if ctx["points"]:
    from palace._src.tools.pngs import roofline_png
    files.append(roofline_png([r for _, r in ctx["points"]], out / "roofline.png",
                              labels=[lab for lab, _ in ctx["points"]]))
  t = table("the tour", [("part", "left"), ("status", "left"), ("what it shows", "left"),
                          ("result", "left")])
  colors = {"ran": "green", "not built yet": "yellow", "failed": "red"}
  for p in parts:
    t.add_row(p.name, f"[{colors[p.status]}]{p.status}[/]", escape(p.api), escape(p.detail))
    files += p.files
  console.print(t)
  console.print(f"outputs in [bold]{out.resolve()}[/]: Perfetto traces (open in https://ui.perfetto.dev) "
                f"and PNG plots:")
  for f in files:
    console.print(f"  {f}", markup=False)
  console.print(f"demo finished in {time.perf_counter() - t0:.1f} s of wall time "
                f"(palace {pl.__version__}).")
  return sum(p.status == "failed" for p in parts)
