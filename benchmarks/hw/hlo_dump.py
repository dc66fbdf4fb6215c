"""The chip's compiled HLO of some cases (session 34): where XLA places a kernel's operands.

    python3 -m benchmarks.hw.hlo_dump --out DIR --only NAME,NAME,...

Run on the chip (real JAX + libtpu, not palace): for each case of benchmarks.hw.cases, its jitted
function is compiled for the TPU and the optimized module's text written to `DIR/hlo-<name>.txt`
(layouts, with `S(1)` marking a buffer XLA put in VMEM), with the environment line first. Nothing is
run or timed. Read here with grep: `gather_bf16_rows1_*`'s kernel op costs the chip 38 cycles a step
(`gather_rows1`, docs/validation.md "Session 30"), as if its copies never went to HBM.
"""
from __future__ import annotations

import argparse
import json
import os


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
  stamp = json.dumps(environment())
  for name in a.only.split(","):
    fn, args = by_name[name].build()
    text = jax.jit(fn).lower(*args).compile().as_text()
    with open(os.path.join(a.out, f"hlo-{name}.txt"), "w") as f:
      f.write(stamp + "\n" + text)
    print(name, len(text), "S(1)" in text, flush=True)


if __name__ == "__main__":
  main()
