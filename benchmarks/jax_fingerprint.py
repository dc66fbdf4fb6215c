"""Modelled-timing fingerprint of palace.jax: every launch of the parity kernels (tests/jax_parity) and
of JAX's Pallas tutorials run through palace.jax, as exact integers (benchmarks/fingerprint.py's
record per launch), so two versions of palace.jax can be compared bit for bit.

Needs JAX (`.venv-jax`); the tutorials need a JAX checkout (PALACE_JAX_DOCS, as
scripts/jax_tutorials.sh; without it only the parity kernels are recorded). Run from the repo root:
  PYTHONPATH=$PWD .venv-jax/bin/python -m benchmarks.jax_fingerprint --out before.json
  PYTHONPATH=$PWD .venv-jax/bin/python -m benchmarks.jax_fingerprint --compare before.json  # exit 1 on a difference

Each parity case is jitted inside `palace.jax.virtual_tpu` and called twice (the second call of a
replayable kernel is replayed, sim/replay.py); every report of both calls is recorded. The tutorials
are the light ones (`TUTORIALS`; the heavy ones take minutes and many GB), each in a fresh process, plain
and with `--api-fixes` where that runs more kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4").strip()

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "jax_parity"))

TUTORIALS = (("quickstart", False), ("tpu_quickstart", False), ("pipelining", False),
             ("distributed", False), ("distributed", True), ("core_map", False), ("core_map", True))


def _records(reports) -> list:
  from benchmarks.fingerprint import _launch_record
  return [_launch_record(r) for r in reports]


def parity() -> dict:
  import jax
  import jax_parity_harness as harness
  import palace.jax as pj
  out = {}
  for fname in sorted(p.name for p in harness.KERNELS.glob("k_*.py")):
    mod = harness.jax_module(fname)
    for case in harness.case_names(fname):
      with pj.virtual_tpu("v5e", num_chips=getattr(mod, "NUM_DEVICES", 1)) as tpu:
        fn, args = getattr(mod, case)()[:2]
        try:
          f = jax.jit(fn)
          jax.block_until_ready(f(*args))
        except jax.errors.TracerArrayConversionError:
          f = fn
          jax.block_until_ready(f(*args))
        jax.block_until_ready(f(*args))
      out[f"parity {fname}:{case}"] = _records(tpu.reports)
  return out


def tutorial(name: str, api_fixes: bool) -> list:
  """In this process (a fresh one per tutorial): its launches' records."""
  from palace._src.jax.activation import active_engine
  from palace._src.tools import tutorials as T
  T.run(name, T.docs_dir(), api_fixes=api_fixes)
  return _records(active_engine().tpu.reports)


def tutorials() -> dict:
  from palace._src.tools import tutorials as T
  root = T.docs_dir()
  out = {}
  if root is None:
    print("no PALACE_JAX_DOCS: tutorials not recorded", file=sys.stderr)
    return out
  for name, fixes in TUTORIALS:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PALACE_JAX="", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count="
                        f"{max(T.TUTORIALS[name].num_chips, 1)}")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.jax_fingerprint", "--one", name,
                           *(["--api-fixes"] if fixes else [])], env=env, cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail = proc.stdout.strip().splitlines()
    if proc.returncode or not tail:
      raise RuntimeError(f"tutorial {name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    out[f"tutorial {name}{' --api-fixes' if fixes else ''}"] = json.loads(tail[-1])
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", help="write the fingerprint to this JSON file")
  ap.add_argument("--compare", help="compare with a fingerprint written before; exit 1 on a difference")
  ap.add_argument("--one", help=argparse.SUPPRESS)
  ap.add_argument("--api-fixes", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.one:
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
      recs = tutorial(args.one, args.api_fixes)
    print(json.dumps(recs))
    return 0
  from benchmarks.fingerprint import write_or_compare
  return write_or_compare({**parity(), **tutorials()}, args.out, args.compare)


if __name__ == "__main__":
  sys.exit(main())
