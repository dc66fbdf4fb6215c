"""The chip's compiled HLO of some cases (session 34): where XLA places a kernel's operands.

    python3 -m benchmarks.hw.hlo_dump --out DIR --only NAME,NAME,...

Run on the chip (real JAX + libtpu, not palace): for each case of benchmarks.hw.cases, its jitted
function is compiled for the TPU and the optimized module's text written as `hlo/hlo-<name>.txt`
(layouts, with `S(1)` marking a buffer XLA put in VMEM), with the environment line first, into one
archive, `DIR/v5e-hlo-<date>.tar.gz` (the device tool brings back few files of a folder; session 34's
is benchmarks/hw/data/v5e-hlo-2026-12-07.tar.gz). Nothing is run or timed. Read here with grep: `gather_bf16_rows1_*`'s kernel op costs the chip 38 cycles a step
(`gather_rows1`, docs/validation.md "Session 30"), as if its copies never went to HBM.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import tarfile


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--only", required=True, help="comma-separated case names")
  a = ap.parse_args(argv)
  import jax  # noqa: PLC0415
  from benchmarks.hw.cases import all_cases  # noqa: PLC0415
  from benchmarks.hw.chip import environment  # noqa: PLC0415
  os.makedirs(a.out, exist_ok=True)
  by_name = {c.name: c for c in all_cases()}
  env = environment()
  stamp = json.dumps(env)
  path = os.path.join(a.out, f"v5e-hlo-{env['date']}.tar.gz")
  with tarfile.open(path, "w:gz") as tar:
    for name in a.only.split(","):
      fn, args = by_name[name].build()
      text = jax.jit(fn).lower(*args).compile().as_text()
      data = (stamp + "\n" + text).encode()
      info = tarfile.TarInfo(f"hlo/hlo-{name}.txt")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
      print(name, len(text), "S(1)" in text, flush=True)
  print("->", path)


if __name__ == "__main__":
  main()
