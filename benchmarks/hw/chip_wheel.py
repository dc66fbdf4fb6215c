"""The jax wheel's kernels as the chip ran them.

The recorded timings (benchmarks/hw/data) were measured with JAX 0.10.2 on the chip, while palace.jax
models with JAX 0.12. Most of the wheel's TPU kernels are the same file in both, but two changed in
ways the chip's time sees:
- splash attention (`splash_attention/splash_attention_kernel.py`): 0.10.2 keeps m, l and the output
  accumulator as three extra pallas_call *outputs* with constant index maps, zeroed at the end of
  every q row; 0.12 makes them VMEM scratch;
- paged attention (`paged_attention/paged_attention_kernel.py`): 0.10.2 waits for every page copy on
  its own and casts the loaded K / V pages to f32 before the dots; 0.12 waits once for all of a
  block's pages and dots the bf16 pages.
Modelling the 0.12 kernel against the 0.10.2 measurement compares two kernels, so the comparison
(`benchmarks.hw`, `test_hw_measured.py`) models the file the chip ran: `wheel_module` loads it from the
0.10.2 wheel (downloaded from PyPI by scripts/test.sh into `.cache/`, never committed: palace does not
copy JAX's code), under a private module name, its own imports resolving to the running JAX (its
sibling modules, the masks and quantization helpers, are unchanged between the two versions; only
type annotations differ). On the chip (JAX 0.10.2 itself) and for the unchanged kernels it is the
plain import.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import zipfile

CHIP_JAX = "0.10.2"   # the JAX every recorded timing ran with (test_hw_measured checks the data)
OPS = "jax.experimental.pallas.ops.tpu"
# the wheel's kernel modules whose 0.10.2 file differs from 0.12's in what the chip executes
CHANGED = ("splash_attention.splash_attention_kernel", "paged_attention.paged_attention_kernel")
WHEEL_DIR = os.environ.get("PALACE_CHIP_WHEEL_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", ".cache", "chip-wheel")
WHEEL = f"jax-{CHIP_JAX}-py3-none-any.whl"
FETCH = (f"python -m benchmarks.hw.chip_wheel (scripts/test.sh runs it: pip download jax=={CHIP_JAX} "
         "--no-deps)")


class ChipWheelMissing(RuntimeError):
  """The JAX wheel the chip ran is not on this machine."""


def wheel_module(name: str):
  """The module `OPS.name` as the chip ran it (JAX CHIP_JAX): the running JAX's own when it is that
  version or the file did not change, else the CHIP_JAX wheel's file loaded under a private name."""
  import jax  # noqa: PLC0415
  if jax.__version__ == CHIP_JAX or name not in CHANGED:
    return importlib.import_module(f"{OPS}.{name}")
  private = f"benchmarks.hw._jax_{CHIP_JAX.replace('.', '_')}.{name}"
  if private in sys.modules:
    return sys.modules[private]
  wheel = os.path.join(WHEEL_DIR, WHEEL)
  if not os.path.exists(wheel):
    raise ChipWheelMissing(f"{wheel} is missing: the recorded timings ran JAX {CHIP_JAX}'s {name}, "
                           f"which differs from JAX {jax.__version__}'s; fetch it with {FETCH}")
  member = "jax/experimental/pallas/ops/tpu/" + name.replace(".", "/") + ".py"
  with zipfile.ZipFile(wheel) as z:
    source = z.read(member).decode()
  spec = importlib.util.spec_from_loader(private, loader=None, origin=f"{wheel}!{member}")
  module = importlib.util.module_from_spec(spec)
  module.__file__ = f"{wheel}!{member}"
  sys.modules[private] = module
  try:
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
  except BaseException:
    del sys.modules[private]
    raise
  return module


def fetch() -> str:
  """The CHIP_JAX wheel's path, downloaded into WHEEL_DIR from the package index when it is not there."""
  wheel = os.path.join(WHEEL_DIR, WHEEL)
  if not os.path.exists(wheel):
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"jax=={CHIP_JAX}", "--no-deps",
                    "-d", WHEEL_DIR], check=True)
  return wheel


if __name__ == "__main__":
  print(fetch())
