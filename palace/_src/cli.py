"""The `palace` command: `palace demo`, `palace run`, `palace tune`, `palace chips` (needs the `cli` extra).

Built on click (commands, options, --help) and rich (tables, progress bars). A user mistake or a hardware
limit (any PalaceError) prints its message and exits with status 2, without a traceback.
"""
from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import click
import numpy as np

from palace._src import hw
from palace._src.autotune import autotune, block_candidates, format_config
from palace._src.errors import PalaceError, ResourceError, UsageError

DTYPES = ("bfloat16", "float32", "int8")


# ------------------------------------------------------------------ console helpers
def _console():
  from rich.console import Console
  return Console(highlight=False, soft_wrap=False, width=max(100, min(160, _term_width())))


def _term_width() -> int:
  try:
    return os.get_terminal_size().columns
  except OSError:
    return 120


def _progress(console):
  from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn)
  return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True)


def _table(title, columns, **kw):
  from rich.table import Table
  t = Table(title=title, title_justify="left", **kw)
  for c in columns:
    if isinstance(c, tuple):
      t.add_column(c[0], justify=c[1])
    else:
      t.add_column(c, justify="right")
  return t


def _us(s: float) -> str:
  return f"{s * 1e6:,.1f} us" if s < 1e-2 else f"{s * 1e3:,.3f} ms"


class _Group(click.Group):
  """Turns PalaceErrors into a one-line message and exit status 2."""

  def invoke(self, ctx):
    try:
      return super().invoke(ctx)
    except PalaceError as e:
      click.echo(f"palace: error: {type(e).__name__}: {e}", err=True)
      ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="palace", prog_name="palace")
def main():
  """palace: Pallas TPU kernels on a virtual TPU (v4, v5e, v5p, v6e, 7x).

  Runs Pallas kernels on the CPU with TPU-faithful results and errors, and models how long they would
  take on a TPU. Times are modelled, not measured.
  """


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


def _np_dtype(name: str):
  import palace.numpy as jnp
  if name not in DTYPES:
    raise UsageError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}.")
  return {"bfloat16": np.dtype(jnp.bfloat16), "float32": np.dtype(np.float32),
          "int8": np.dtype(np.int8)}[name]


# ------------------------------------------------------------------ palace chips
_CHIP_ROWS = (  # (figure, source field, formatter)
    ("clock", "clock_hz", lambda c: f"{c.clock_hz / 1e9:.2f} GHz"),
    ("TensorCores per device", "num_tensorcores_per_device",
     lambda c: f"{c.num_tensorcores_per_device}" + (" (megacore)" if c.megacore else "")),
    ("MXUs per TensorCore", "num_mxus", lambda c: f"{c.num_mxus} x {c.mxu_size}x{c.mxu_size}"),
    ("peak bf16 per device", "vmatmul_cadence_cycles",
     lambda c: f"{c.peak_flops_per_s('bf16') / 1e12:,.0f} TFLOP/s"),
    ("peak int8 per device", "vmatmul_cadence_cycles",
     lambda c: f"{c.peak_flops_per_s('int8') / 1e12:,.0f} TOP/s" if c.peak_flops_per_s("int8") else "-"),
    ("VMEM per TensorCore", "vmem_bytes", lambda c: f"{c.vmem_bytes >> 20} MiB"),
    ("default scoped VMEM", "default_scoped_vmem_bytes", lambda c: f"{c.default_scoped_vmem_bytes >> 20} MiB"),
    ("SMEM", "smem_bytes", lambda c: f"{c.smem_bytes / 2**20:g} MiB"),
    ("HBM per device", "hbm_bytes_per_device", lambda c: f"{c.hbm_bytes_per_device / 1e9:.1f} GB"),
    ("HBM bandwidth", "hbm_bytes_per_s_per_device", lambda c: f"{c.hbm_bytes_per_s_per_device / 1e9:,.0f} GB/s"),
    ("DMA HBM->VMEM per TC", "dma_bytes_per_s_per_tc", lambda c: f"{c.dma_bytes_per_s_per_tc / 1e9:,.0f} GB/s"),
    ("ICI per link, one way", "ici_link_bytes_per_s_one_way",
     lambda c: f"{c.ici_link_bytes_per_s_one_way / 1e9:.0f} GB/s ({c.ici_dims}D)"),
    ("SparseCores x subcores", "sparsecore",
     lambda c: f"{c.sparsecore.num_cores} x {c.sparsecore.num_subcores}" if c.sparsecore else "-"),
    ("grid-step overhead", "grid_step_overhead_cycles", lambda c: f"{c.grid_step_overhead_cycles} cycles"),
    ("launch overhead", "launch_overhead_s", lambda c: f"{c.launch_overhead_s * 1e6:.0f} us"),
)


@main.command()
@click.option("--sources/--no-sources", default=True, show_default=True,
              help="Add a column with where each figure comes from.")
def chips(sources):
  """List the chip presets with their key figures (and the sources of those figures)."""
  from rich.text import Text
  console = _console()
  presets = list(hw.CHIPS.values())
  t = _table("TPU presets (device = what JAX calls a device; TC = TensorCore)",
             [("figure", "left")] + [c.name for c in presets])
  src = _table("Sources of the figures (tags: see docs/timing-model.md and tpu-hardware.md)",
               [("figure", "left"), ("source", "left")])
  for label, field, fmt in _CHIP_ROWS:
    t.add_row(label, *[fmt(c) for c in presets])
    srcs = []
    for c in presets:
      v = c.sources.get(field, "")
      if v and v not in srcs:
        srcs.append(v)
    src.add_row(label, Text("; ".join(srcs) or "-"))  # Text: "[tpu_info]" is a tag, not rich markup
  console.print(t)
  if sources:
    console.print(src)


# ------------------------------------------------------------------ palace run
@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--chip", default="v5e", show_default=True, help="Chip preset (v4, v5e, v5p, v6e, 7x).")
@click.option("--num-chips", default=1, show_default=True, help="Chips in the virtual system.")
@click.option("--timing-only", is_flag=True, help="Skip the arithmetic (results are garbage, times are not).")
@click.option("--trace", type=click.Path(dir_okay=False), help="Write the last launch's Perfetto trace here.")
@click.option("--trace-dir", type=click.Path(file_okay=False),
              help="Write one Perfetto trace per launch into this folder.")
@click.option("--timeline", type=click.Path(dir_okay=False), help="Write the last launch's timeline PNG.")
@click.option("--max-reports", default=10, show_default=True, help="Print at most this many full reports.")
def run(file, script_args, chip, num_chips, timing_only, trace, trace_dir, timeline, max_reports):
  """Run FILE.py on a virtual TPU and print the report of every kernel launch.

  The script runs as `__main__` inside `pl.virtual_tpu(CHIP)`; kernels it launches outside any
  `pl.virtual_tpu(...)` of its own run on that TPU and are reported here. Extra arguments after FILE
  are passed to the script.
  """
  import palace as pl
  from rich.markup import escape
  console = _console()
  tpu = pl.virtual_tpu(chip, num_chips, timing_only=timing_only)
  path = str(Path(file).resolve())
  old_argv, old_path = sys.argv, list(sys.path)
  sys.argv = [path, *script_args]
  sys.path.insert(0, str(Path(path).parent))
  status = 0
  try:
    with tpu:
      runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except PalaceError as e:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    where = f" (at {Path(file).name}:{frames[-1].lineno})" if frames else ""
    click.echo(f"palace: error{where}: {type(e).__name__}: {e}", err=True)
    status = 2
  finally:
    sys.argv, sys.path[:] = old_argv, old_path
  reports = tpu.reports
  if not reports and status == 0:
    console.print(f"[yellow]{escape(file)} launched no kernel on palace run's virtual TPU[/] (kernels inside the "
                  f"script's own `pl.virtual_tpu(...)` blocks are reported by the script).")
  elif reports:
    _print_launches(console, reports, max_reports)
    if trace:
      console.print(f"trace of the last launch: {reports[-1].to_perfetto(trace)}")
    if trace_dir:
      Path(trace_dir).mkdir(parents=True, exist_ok=True)
      for i, r in enumerate(reports):
        r.to_perfetto(Path(trace_dir) / f"{i:03d}_{r.kernel_name}.trace.json")
      console.print(f"{len(reports)} trace(s) in {trace_dir}/")
    if timeline:
      from palace._src.plots import timeline_png
      console.print(f"timeline of the last launch: {timeline_png(reports[-1], timeline)}")
  if status:
    sys.exit(status)


def _print_launches(console, reports, max_reports):
  t = _table(f"{len(reports)} launch(es)", ["#", ("kernel", "left"), ("chip", "left"), "device time",
                                            "TFLOP/s", "% peak", "HBM GB/s", ("bound", "left"),
                                            "VMEM peak", "steps"])
  for i, r in enumerate(reports):
    t.add_row(str(i), r.kernel_name, r.chip.name + (f" x{r.num_chips}" if r.num_chips > 1 else ""),
              _us(r.device_time_s), f"{r.flops_per_s / 1e12:,.2f}", f"{100 * r.peak_fraction:.1f}",
              f"{r.hbm_bytes_per_s / 1e9:,.1f}", r.bound, f"{r.vmem_peak_bytes / 2**20:.2f} MiB",
              f"{r.grid_steps:,}")
  console.print(t)
  for r in reports[:max_reports]:
    console.print(str(r), markup=False)
  if len(reports) > max_reports:
    console.print(f"... {len(reports) - max_reports} more report(s) not shown (--max-reports).")


# ------------------------------------------------------------------ palace tune
@main.group(cls=_Group)
def tune():
  """Model-driven block-size search (timing-only runs on a virtual TPU)."""


def _int_list(ctx, param, value):
  if value is None:
    return None
  try:
    return [int(v) for v in value.split(",") if v.strip()]
  except ValueError:
    raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


@tune.command("matmul")
@click.option("--m", "m", default=4096, show_default=True, help="Rows of x and of the output.")
@click.option("--n", "n", default=4096, show_default=True, help="Columns of y and of the output.")
@click.option("--k", "k", default=4096, show_default=True, help="Contraction size.")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(DTYPES))
@click.option("--chip", default="v5e", show_default=True, help="Chip preset (v4, v5e, v5p, v6e, 7x).")
@click.option("--bm", callback=_int_list, help="Candidate bm values, e.g. 256,512 (default: the powers "
              "of two from max(128, m/16) to 2048 that divide m).")
@click.option("--bk", callback=_int_list, help="Candidate bk values (default as for bm).")
@click.option("--bn", callback=_int_list, help="Candidate bn values (default as for bm).")
@click.option("--top", default=15, show_default=True, help="Rows of the ranking to show.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the full ranking as JSON.")
def tune_matmul(m, n, k, dtype, chip, bm, bk, bn, top, json_path):
  """Rank (bm, bk, bn) for the tiled pallas_call matmul by modelled time; reject configs that do not fit.

  Example: palace tune matmul --m 4096 --n 4096 --k 4096 --dtype bfloat16 --chip v5e
  """
  console = _console()
  d = _np_dtype(dtype)
  spec = hw.get_chip(chip)
  cands = {"bm": bm or block_candidates(m, lo=max(128, m // 16)),
           "bk": bk or block_candidates(k, lo=max(128, k // 16)),
           "bn": bn or block_candidates(n, lo=max(128, n // 16))}
  x, y = np.zeros((m, k), d), np.zeros((k, n), d)
  total = len(cands["bm"]) * len(cands["bk"]) * len(cands["bn"])
  console.print(f"tuning matmul {dtype}[{m},{k}] @ {dtype}[{k},{n}] on {spec.name}: {total} configurations "
                f"(timing-only runs)")
  t0 = time.perf_counter()
  with _progress(console) as prog:
    task = prog.add_task("evaluating", total=total)

    def tick(done, total, trial):
      prog.update(task, completed=done, description=f"{format_config(trial.config):<26}")

    res = autotune(lambda c: make_matmul(m, k, n, d, **c), cands, (x, y), chip=spec, progress=tick)
  ref_t, ref_bound, flops = roofline_reference(spec, m, k, n, d)
  _print_ranking(console, res, top, ref_t, ref_bound, flops)
  console.print(f"best: [bold]{format_config(res.best_config)}[/] at {_us(res.best.time_s)} "
                f"({ref_t / res.best.time_s * 100:.1f}% of the roofline reference); "
                f"{time.perf_counter() - t0:.1f} s of tuning")
  if json_path:
    rows = [{"config": t.config, "device_time_s": t.time_s if t.ok else None,
             "bound": t.report.bound if t.ok else None, "rejected": t.reason or None} for t in res.ranking]
    Path(json_path).write_text(json.dumps({"chip": res.chip, "m": m, "k": k, "n": n, "dtype": dtype,
                                           "roofline_s": ref_t, "ranking": rows}, indent=1))
    console.print(f"ranking written to {json_path}")


def _print_ranking(console, res, top, ref_t, ref_bound, flops):
  kept = [t for t in res.ranking if t.ok]
  t = _table(f"{len(kept)} of {len(res.trials)} configurations fit on {res.chip} (best {min(top, len(kept))} "
             f"shown)", ["rank", "bm", "bk", "bn", "grid steps", "device time", "TFLOP/s", "% of peak",
                         "vs best", ("bound", "left")])
  for rank, tr in enumerate(kept[:top], 1):
    r = tr.report
    c = tr.config
    t.add_row(str(rank), str(c["bm"]), str(c["bk"]), str(c["bn"]), f"{r.grid_steps:,}", _us(r.device_time_s),
              f"{flops / r.device_time_s / 1e12:,.1f}", f"{100 * r.peak_fraction:.1f}",
              f"{tr.time_s / kept[0].time_s:.2f}x", r.bound)
  t.add_row("-", "", "", "", "", _us(ref_t), f"{flops / ref_t / 1e12:,.1f}", "", "",
            f"{ref_bound} (XLA-style roofline reference)", style="dim")
  console.print(t)
  if res.rejected:
    from rich.text import Text
    rj = _table(f"{len(res.rejected)} rejected", [("config", "left"), ("reason", "left")])
    for tr in res.rejected[:top]:
      rj.add_row(format_config(tr.config), Text(tr.reason[:120]))
    if len(res.rejected) > top:
      rj.add_row("...", f"{len(res.rejected) - top} more")
    console.print(rj)


# ------------------------------------------------------------------ palace demo
@main.command()
@click.option("--quick", is_flag=True, help="Smaller shapes and sweep (a few seconds; used by the tests).")
@click.option("--out", "out_dir", default="palace-out", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the Perfetto traces and PNG plots.")
@click.option("--chip", default="v5e", show_default=True, help="Chip for the TensorCore parts.")
def demo(quick, out_dir, chip):
  """A guided tour of palace on the virtual TPU, part by part.

  pallas_call matmul + block-size sweep beside the roofline; pl.kernel + emit_pipeline; a scalar-prefetch
  ragged gather; a SparseCore gather; the collective matmul on 8 chips. Parts whose capability is not
  built yet are listed as such. Writes Perfetto traces (open in ui.perfetto.dev) and PNG plots.
  """
  failed = run_demo(_console(), Path(out_dir), quick=quick, chip=chip)
  if failed:
    sys.exit(1)


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
  from palace._src.plots import timeline_png
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
                f"modelled {_us(r.device_time_s)} ({100 * r.peak_fraction:.0f}% of peak, {r.bound}-bound)")
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
  with _progress(console) as prog:
    task = prog.add_task(f"sweep {s}^3", total=len(cfgs))
    res = autotune(lambda c: make_matmul(s, s, s, bf16, **c), cfgs, (xs, xs), chip=spec,
                   progress=lambda d, n, tr: prog.update(task, completed=d))
  ref_t, ref_bound, flops = roofline_reference(spec, s, s, s, bf16)
  published = _PUBLISHED_V5E_4096 if (spec.name == "v5e" and s == 4096) else {}
  t = _table(f"bf16 matmul {s}x{s}x{s} on {spec.name}: block-size sweep (timing-only runs)",
             ["bm", "bk", "bn", "grid steps", "device time", "TFLOP/s", "% of peak", ("bound", "left"),
              "+ dispatch"] + (["published v5e"] if published else []))
  best = res.best
  for tr in res.trials:
    c = tr.config
    key = (c["bm"], c["bk"], c["bn"])
    pub = [_us(published[key]) if key in published else ""] if published else []
    if not tr.ok:
      why = "over VMEM" if isinstance(tr.error, ResourceError) else "tiling"
      t.add_row(*map(str, key), "", "", "", "", f"rejected: {why}", "", *pub, style="dim")
      continue
    rr = tr.report
    t.add_row(*map(str, key), f"{rr.grid_steps:,}", _us(rr.device_time_s),
              f"{flops / rr.device_time_s / 1e12:,.1f}", f"{100 * rr.peak_fraction:.1f}",
              rr.bound + (" (best)" if tr is best else ""), _us(rr.total_time_s), *pub,
              style="bold" if tr is best else None)
  t.add_row("XLA-style", "roofline", "", "", _us(ref_t), f"{flops / ref_t / 1e12:,.1f}",
            f"{100 * flops / ref_t / spec.peak_flops_per_s('bf16'):.1f}", ref_bound,
            _us(ref_t + spec.launch_overhead_s), *([_us(published["xla"])] if published else []),
            style="cyan")
  console.print(t)
  console.print(f"roofline reference = max(2mnk / peak = {_us(flops / spec.peak_flops_per_s('bf16'))}, "
                f"bytes / HBM BW = {_us(3 * s * s * 2 / spec.hbm_bytes_per_s_per_device)}); "
                f"'+ dispatch' adds the modelled host launch overhead of {_us(spec.launch_overhead_s)}.")
  ctx["points"].append((f"matmul {s}^3 best", best.report))
  worst = max((tr for tr in res.trials if tr.ok), key=lambda tr: tr.time_s)
  ctx["points"].append((f"matmul {s}^3 {format_config(worst.config)}", worst.report))
  part.reports = [r, best.report]
  part.detail = (f"best {format_config(best.config)}: {_us(best.time_s)} "
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
  part.detail = (f"{_us(r.device_time_s)} vs {_us(ref.device_time_s)} for pallas_call "
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
  part.detail = (f"{groups} groups of <= {block} rows x {width} f32: {_us(r.device_time_s)} "
                 f"(HBM roofline {_us(ideal)}, {r.bound}-bound); exact vs NumPy")
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
  part.detail = f"{n} rows by {workers} vector subcores on {chip.name}: {_us(r.device_time_s)}; exact"
  ctx["console"].print(f"SparseCore gather: {part.detail}")
  return part


def _part_collective(ctx):
  import palace as pl
  part = _Part("collective matmul on 8 chips", "pl.shard_map, remote DMA over ICI")
  missing = [n for n in ("shard_map", "make_mesh", "P") if not hasattr(pl, n)]
  if missing:
    return _missing(part, ", ".join(f"pl.{n}" for n in missing))
  return _collective_matmul(ctx, part)


def _collective_matmul(ctx, part):
  part.status, part.detail = "not built yet", "pl.shard_map exists; the demo part is not written yet"
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
  console.print(f"{spec.name}: {spec.clock_hz / 1e9:.2f} GHz, {spec.num_tensorcores_per_device} TensorCore(s), "
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
    except (PalaceError, AssertionError, NotImplementedError) as e:
      part = _Part(name, "")
      part.status, part.detail = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
      console.print(f"[red]{name} failed:[/] {escape(part.detail)}")
    if part.status == "not built yet":
      console.print(f"[yellow]{part.name}: not built yet[/] ({escape(part.detail)})")
    parts.append(part)
  console.rule("summary", style="dim")
  files = []
  if ctx["points"]:
    from palace._src.plots import roofline_png
    files.append(roofline_png([r for _, r in ctx["points"]], out / "roofline.png",
                              labels=[lab for lab, _ in ctx["points"]]))
  t = _table("the tour", [("part", "left"), ("status", "left"), ("what it shows", "left"),
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
