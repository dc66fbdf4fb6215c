"""The `palace` command: `palace demo`, `palace run`, `palace tune`, `palace chips` (needs the `cli` extra).

Built on click (commands, options, --help) and rich (tables, progress bars). A user mistake or a hardware
limit (any PalaceError) prints its message and exits with status 2, without a traceback.
"""
from __future__ import annotations

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
from palace._src.tools.autotune import autotune, block_candidates, format_config
from palace._src.errors import PalaceError, UsageError
from palace._src.tools.console import fmt_us, make_console, progress, table

DTYPES = ("bfloat16", "float32", "int8")


class _Group(click.Group):
  """Lists the commands tour-first; turns PalaceErrors into a message and exit status 2."""

  def list_commands(self, ctx):
    order = ("demo", "run", "tune", "chips")
    return sorted(self.commands, key=lambda n: (order.index(n) if n in order else len(order), n))

  def invoke(self, ctx):
    try:
      return super().invoke(ctx)
    except PalaceError as e:
      click.echo(f"palace: error: {type(e).__name__}: {e}", err=True)
      ctx.exit(2)
    except ImportError as e:   # an optional module of the `cli` extra (matplotlib for the PNGs)
      if (e.name or "").split(".")[0] not in ("click", "rich", "matplotlib"):
        raise
      click.echo(f"palace: error: this needs {e.name!r}, part of the 'cli' extra. Fix: pip install "
                 f"'palace[cli]'", err=True)
      ctx.exit(2)

  def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
    """click's main, except that a usage mistake (a bad number, an unknown option or command, an
    unwritable output path) is one line on stderr and exit status 2, like a PalaceError."""
    try:
      rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
    except click.exceptions.UsageError as e:
      cmd = e.ctx.command_path if e.ctx is not None else "palace"
      click.echo(f"palace: error: {e.format_message()} (see '{cmd} -h')", err=True)
      sys.exit(2)
    except click.exceptions.ClickException as e:
      click.echo(f"palace: error: {e.format_message()}", err=True)
      sys.exit(2 if e.exit_code == 1 else e.exit_code)
    except click.exceptions.Abort:
      click.echo("palace: aborted", err=True)
      sys.exit(1)
    if not standalone_mode:
      return rv
    sys.exit(rv if isinstance(rv, int) else 0)


def _out_file(ctx, param, value):
  """An output path option: checked by opening it for appending before anything runs (a missing
  folder, a folder given as the file, no permission: one line and exit 2, not a traceback at the end)."""
  if value is None:
    return None
  path = Path(value)
  if path.is_dir():
    raise click.BadParameter(f"{value!r} is a folder; pass a file path, e.g. {path / 'out.json'}")
  existed = path.exists()
  try:
    with open(path, "a"):
      pass
  except OSError as e:
    raise click.BadParameter(f"cannot write {value!r} ({e.strerror}); pass a path in a folder that "
                             f"exists and that you can write to") from None
  if not existed:
    path.unlink()
  return value


def _out_dir(ctx, param, value):
  """An output folder option: created now (with its parents), so an unwritable one fails up front."""
  if value is None:
    return None
  try:
    Path(value).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise click.BadParameter(f"cannot create the folder {value!r} ({e.strerror}); pass a folder you can "
                             f"write to") from None
  return value


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="palace", prog_name="palace")
def main():
  """palace: Pallas TPU kernels on a virtual TPU (v4, v5e, v5p, v6e, 7x).

  Runs Pallas kernels on the CPU with TPU-faithful results and errors, and models how long they would
  take on a TPU. Times are modelled, not measured.
  """


def _np_dtype(name: str):
  import palace.numpy as jnp
  if name not in DTYPES:
    raise UsageError(f"--dtype {name!r}: expected one of {', '.join(DTYPES)}. Fix: pass one of those.")
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
    ("default scoped VMEM", "default_scoped_vmem_bytes",
     lambda c: f"{c.default_scoped_vmem_bytes >> 20} MiB"),
    ("SMEM", "smem_bytes", lambda c: f"{c.smem_bytes / 2**20:g} MiB"),
    ("HBM per device", "hbm_bytes_per_device", lambda c: f"{c.hbm_bytes_per_device / 1e9:.1f} GB"),
    ("HBM bandwidth", "hbm_bytes_per_s_per_device",
     lambda c: f"{c.hbm_bytes_per_s_per_device / 1e9:,.0f} GB/s"),
    ("DMA HBM->VMEM per TC", "dma_bytes_per_s_per_tc",
     lambda c: f"{c.dma_bytes_per_s_per_tc / 1e9:,.0f} GB/s"),
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
  console = make_console()
  presets = list(hw.CHIPS.values())
  t = table("TPU presets (device = what JAX calls a device; TC = TensorCore)",
             [("figure", "left")] + [c.name for c in presets])
  src = table("Sources of the figures (tags: see docs/timing-model.md and tpu-hardware.md)",
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
@click.option("--num-chips", default=1, show_default=True, type=click.IntRange(min=1),
              help="Chips in the virtual system.")
@click.option("--timing-only", is_flag=True, help="Skip the arithmetic (results are garbage, times are not).")
@click.option("--trace", type=click.Path(dir_okay=False), callback=_out_file,
              help="Write the last launch's Perfetto trace here.")
@click.option("--trace-dir", type=click.Path(file_okay=False), callback=_out_dir,
              help="Write one Perfetto trace per launch into this folder.")
@click.option("--timeline", type=click.Path(dir_okay=False), callback=_out_file,
              help="Write the last launch's timeline PNG.")
@click.option("--max-reports", default=10, show_default=True, type=click.IntRange(min=0), help="Print at most this many full reports.")
@click.option("--jax", "real_jax", is_flag=True,
              help="FILE is a JAX program: run it with the real JAX (installed) and its TPU kernels on "
                   "palace (palace.jax.virtual_tpu).")
@click.option("--compat", "jax_source", is_flag=True,
              help="FILE is written for JAX Pallas but runs without JAX: its `import jax...` lines get "
                   "palace's shim (palace.compat).")
def run(file, script_args, chip, num_chips, timing_only, trace, trace_dir, timeline, max_reports,
        jax_source=False, real_jax=False):
  """Run FILE.py on a virtual TPU and print the report of every kernel launch.

  The script runs as `__main__` inside `pl.virtual_tpu(CHIP)` (with --jax: inside
  `palace.jax.virtual_tpu(CHIP)`, so the real JAX's TPU pallas_call / pl.kernel / core_map run on
  palace); kernels it launches outside any virtual TPU of its own run on that TPU and are reported
  here. Extra arguments after FILE are passed to the script.
  """
  import palace as pl
  from rich.markup import escape
  console = make_console()
  if real_jax and jax_source:
    raise click.UsageError("--jax (the real JAX) and --compat (palace's JAX shim) exclude each "
                           "other. Fix: pass one of them.")
  if real_jax:
    tpu = _jax_tpu(chip, num_chips, timing_only)
  else:
    tpu = pl.virtual_tpu(chip, num_chips, timing_only=timing_only)
  path = str(Path(file).resolve())
  old_argv, old_path = sys.argv, list(sys.path)
  sys.argv = [path, *script_args]
  sys.path.insert(0, str(Path(path).parent))
  status = 0
  try:
    with tpu:
      if jax_source:
        from palace._src.tools.compat.loader import run_path
        run_path(path, "__main__", script_args)
      else:
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
    console.print(f"[yellow]{escape(file)} launched no kernel.[/]")
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
      from palace._src.tools.pngs import timeline_png
      console.print(f"timeline of the last launch: {timeline_png(reports[-1], timeline)}")
  if status:
    sys.exit(status)


def _jax_tpu(chip, num_chips, timing_only):
  """`palace.jax.virtual_tpu(...)` as a context manager; one line and exit 2 when JAX is missing."""
  import importlib.util
  if importlib.util.find_spec("jax") is None:
    click.echo("palace: error: --jax runs FILE with the real JAX, which is not installed here. Fix: "
               "pip install 'jax==0.12.0.1' (Python >= 3.12), or use --compat for palace's JAX shim.",
               err=True)
    sys.exit(2)
  if num_chips > 1 and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # jax.shard_map over num_chips host CPU devices: set before the script's `import jax` (if JAX was
    # imported already, the device count it has stays)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={num_chips}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import palace.jax as pjax

  class _Context:
    """`with tpu:` enters palace.jax.virtual_tpu; `.reports` is its VirtualTPU's."""
    def __enter__(self):
      self._cm = pjax.virtual_tpu(chip, num_chips, timing_only=timing_only)
      self._tpu = self._cm.__enter__()
      return self._tpu

    def __exit__(self, *exc):
      return self._cm.__exit__(*exc)

    @property
    def reports(self):
      return self._tpu.reports

  return _Context()


def _print_launches(console, reports, max_reports):
  t = table(f"{len(reports)} launch(es)", ["#", ("kernel", "left"), ("chip", "left"), "device time",
                                            "TFLOP/s", "% peak", "HBM GB/s", ("bound", "left"),
                                            "VMEM peak", "steps"])
  for i, r in enumerate(reports):
    t.add_row(str(i), r.kernel_name, r.chip.name + (f" x{r.num_chips}" if r.num_chips > 1 else ""),
              fmt_us(r.device_time_s), f"{r.flops_per_s / 1e12:,.2f}", f"{100 * r.peak_fraction:.1f}",
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
    out = [int(v) for v in value.split(",") if v.strip()]
  except ValueError:
    raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
  if not out or min(out) < 1:
    raise click.BadParameter(f"expected comma-separated positive integers (block sizes), got {value!r}")
  return out


@tune.command("matmul")
@click.option("--m", "m", default=4096, show_default=True, type=click.IntRange(min=1), help="Rows of x and of the output.")
@click.option("--n", "n", default=4096, show_default=True, type=click.IntRange(min=1), help="Columns of y and of the output.")
@click.option("--k", "k", default=4096, show_default=True, type=click.IntRange(min=1), help="Contraction size.")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(DTYPES))
@click.option("--chip", default="v5e", show_default=True, help="Chip preset (v4, v5e, v5p, v6e, 7x).")
@click.option("--bm", callback=_int_list, help="Candidate bm values, e.g. 256,512 (default: the powers "
              "of two from max(128, m/16) to 2048 that divide m).")
@click.option("--bk", callback=_int_list, help="Candidate bk values (default as for bm).")
@click.option("--bn", callback=_int_list, help="Candidate bn values (default as for bm).")
@click.option("--top", default=15, show_default=True, type=click.IntRange(min=1), help="Rows of the ranking to show.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), callback=_out_file, help="Write the full ranking as JSON.")
def tune_matmul(m, n, k, dtype, chip, bm, bk, bn, top, json_path):
  """Rank (bm, bk, bn) for the tiled pallas_call matmul by modelled time; reject configs that do not fit.

  Example: palace tune matmul --m 4096 --n 4096 --k 4096 --dtype bfloat16 --chip v5e
  """
  from palace._src.tools.demo import make_matmul, roofline_reference
  console = make_console()
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
  with progress(console) as prog:
    task = prog.add_task("evaluating", total=total)

    def tick(done, total, trial):
      prog.update(task, completed=done, description=f"{format_config(trial.config):<26}")

    res = autotune(lambda c: make_matmul(m, k, n, d, **c), cands, (x, y), chip=spec, progress=tick)
  ref_t, ref_bound, flops = roofline_reference(spec, m, k, n, d)
  _print_ranking(console, res, top, ref_t, ref_bound, flops)
  console.print(f"best: [bold]{format_config(res.best_config)}[/] at {fmt_us(res.best.time_s)} "
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
  t = table(f"{len(kept)} of {len(res.trials)} configurations fit on {res.chip} (best {min(top, len(kept))} "
             f"shown)", ["rank", "bm", "bk", "bn", "grid steps", "device time", "TFLOP/s", "% of peak",
                         "vs best", ("bound", "left")])
  for rank, tr in enumerate(kept[:top], 1):
    r = tr.report
    c = tr.config
    t.add_row(str(rank), str(c["bm"]), str(c["bk"]), str(c["bn"]), f"{r.grid_steps:,}", fmt_us(r.device_time_s),
              f"{flops / r.device_time_s / 1e12:,.1f}", f"{100 * r.peak_fraction:.1f}",
              f"{tr.time_s / kept[0].time_s:.2f}x", r.bound)
  t.add_row("-", "", "", "", "", fmt_us(ref_t), f"{flops / ref_t / 1e12:,.1f}", "", "",
            f"{ref_bound} (XLA-style roofline reference)", style="dim")
  console.print(t)
  if res.rejected:
    from rich.text import Text
    rj = table(f"{len(res.rejected)} rejected", [("config", "left"), ("reason", "left")])
    for tr in res.rejected[:top]:
      rj.add_row(format_config(tr.config), Text(tr.short_reason))
    if len(res.rejected) > top:
      rj.add_row("...", f"{len(res.rejected) - top} more")
    console.print(rj)


# ------------------------------------------------------------------ palace demo
@main.command()
@click.option("--quick", is_flag=True, help="Smaller shapes and sweep (a few seconds; used by the tests).")
@click.option("--out", "out_dir", default="palace-out", show_default=True, type=click.Path(file_okay=False),
              callback=_out_dir, help="Folder for the Perfetto traces and PNG plots.")
@click.option("--chip", default="v5e", show_default=True, help="Chip for the TensorCore parts.")
def demo(quick, out_dir, chip):
  """A guided tour of palace on the virtual TPU, part by part.

  pallas_call matmul + block-size sweep beside the roofline; pl.kernel + emit_pipeline; a scalar-prefetch
  ragged gather; a SparseCore gather; the collective matmul on 8 chips. Parts whose capability is not
  built yet are listed as such. Writes Perfetto traces (open in ui.perfetto.dev) and PNG plots.
  """
  from palace._src.tools.demo import run_demo
  failed = run_demo(make_console(), Path(out_dir), quick=quick, chip=chip)
  if failed:
    sys.exit(1)
