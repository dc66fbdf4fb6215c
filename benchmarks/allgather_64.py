"""Scale of the virtual pod: a 64-chip ring all-gather of 1 MiB per chip (issue 6).

Runs examples/collectives.py's ring all-gather on 64 v5e chips (an 8x8 torus; the 1-D mesh is laid out
along a ring of neighbours), checks every chip's gathered copy against the input, and prints the host
wall time, the peak RSS, and the modelled time beside the ICI roofline. The gathered outputs are
inherently N x N MiB (every chip holds every shard: 4 GiB at 64 chips); `--scaling` runs 8..64 chips in
fresh processes and shows that the simulator holds about one copy of that data (RSS / data held ~ 1).

Run from the repo root: python -m benchmarks.allgather_64 [--chips N] [--shard-kib K] [--scaling]
"""
import argparse
import pathlib
import resource
import runpy
import subprocess
import sys
import time

import numpy as np

import palace as pl

EX = runpy.run_path(str(pathlib.Path(__file__).parents[1] / "examples" / "collectives.py"))


def run(chips=64, shard_kib=1024, chip="v5e", check=True):
  rows = shard_kib * 1024 // (128 * 4)
  x = np.arange(chips * rows * 128, dtype=np.float32).reshape(chips * rows, 128)
  t0, c0 = time.perf_counter(), _cpu_s()
  with pl.virtual_tpu(chip, num_chips=chips, trace=False) as tpu:
    mesh = pl.make_mesh((chips,), ("x",))
    EX["ring_all_gather"](x, mesh, check=x if check else None)
  wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
  r = tpu.reports[-1]
  roof = EX["roofline_s"](tpu.chip, "ring all-gather", chips, rows * 128 * 4)
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  held = chips * (chips + 1) * rows * 128 * 4   # every chip's shard and gathered copy
  return {"chips": chips, "wall_s": wall, "cpu_s": cpu, "rss_bytes": rss, "held_bytes": held,
          "modelled_s": r.device_time_s, "roofline_s": roof, "dmas": r.dma_count, "ici_bytes": r.ici_bytes}


def _cpu_s():
  u = resource.getrusage(resource.RUSAGE_SELF)
  return u.ru_utime + u.ru_stime


def _print(res):
  mib = 1 << 20
  print(f"{res['chips']} chips x {res['held_bytes'] // res['chips'] // (res['chips'] + 1) // 1024} KiB: "
        f"wall {res['wall_s']:.2f} s (CPU {res['cpu_s']:.2f} s), peak RSS {res['rss_bytes'] / mib:.0f} MiB "
        f"(chips hold {res['held_bytes'] / mib:.0f} MiB), {res['dmas']} DMAs, "
        f"ICI {res['ici_bytes'] / mib:.0f} MiB; modelled {res['modelled_s'] * 1e3:.3f} ms vs roofline "
        f"{res['roofline_s'] * 1e3:.3f} ms ({res['modelled_s'] / res['roofline_s']:.3f}x)")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--chips", type=int, default=64)
  ap.add_argument("--shard-kib", type=int, default=1024)
  ap.add_argument("--no-check", action="store_true")
  ap.add_argument("--scaling", action="store_true", help="8, 16, 32, 64 chips in fresh processes")
  args = ap.parse_args(argv)
  if args.scaling:
    for n in (8, 16, 32, 64):
      out = subprocess.run([sys.executable, "-m", "benchmarks.allgather_64", "--chips", str(n),
                            "--shard-kib", str(args.shard_kib)], capture_output=True, text=True, check=True)
      print(out.stdout.strip())
    return
  res = run(args.chips, args.shard_kib, check=not args.no_check)
  _print(res)
  return res


if __name__ == "__main__":
  main()
