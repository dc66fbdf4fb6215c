"""What the TPU compiler accepts as `pltpu.CompilerParams(internal_scratch_in_bytes=...)`.

JAX's `tpu_pallas_test.py::test_set_internal_scratch_size` asks for 512 bytes and expects the
compiler's refusal "Requested internal scratch size 512 needs to be at least ..."; palace knew only
the default (XLA's chip info). Run on a TPU (one call, a few seconds):

    python3 -m benchmarks.hw.scratch_limit --out DIR

A (128, 128) f32 copy kernel is compiled and run with each requested size; each attempt's outcome
(ran, or the first line of the compiler's error) goes to `DIR/v5e-scratch-limit-<date>.jsonl` with the
environment record. Public Pallas API only (JAX 0.10.2 and 0.12 share it); nothing here imports palace.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

SIZES = (0, 512, 4096, 8192, 16384, 32768, 65536, 73728, 73729, 73984, 81920, 131072, 1 << 20)


def probe(size: int) -> dict:
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from jax.experimental import pallas as pl  # noqa: PLC0415
  from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415

  def kernel(x_ref, y_ref):
    y_ref[...] = x_ref[...]

  x = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                        compiler_params=pltpu.CompilerParams(internal_scratch_in_bytes=size))
  try:
    y = np.asarray(jax.jit(call)(x))
  except Exception as e:  # noqa: BLE001  (the compiler's refusal is the measurement)
    text = str(e)
    line = next((ln for ln in text.splitlines() if "scratch" in ln.lower()), text.splitlines()[0] if text else "")
    return {"kind": "scratch", "requested_bytes": size, "ran": False, "error_type": type(e).__name__,
            "error": line[:400]}
  return {"kind": "scratch", "requested_bytes": size, "ran": True, "correct": bool((y == x).all())}


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  import jax  # noqa: PLC0415
  import jaxlib  # noqa: PLC0415
  dev = jax.devices()[0]
  env = {"kind": "environment", "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
         "device_kind": dev.device_kind, "platform": dev.platform,
         "date": datetime.date.today().isoformat()}
  try:
    from importlib.metadata import version  # noqa: PLC0415
    env["libtpu_version"] = version("libtpu")
  except Exception:  # noqa: BLE001
    env["libtpu_version"] = None
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"v5e-scratch-limit-{env['date']}.jsonl")
  with open(path, "w") as f:
    f.write(json.dumps(env) + "\n")
    for size in SIZES:
      rec = probe(size)
      print(json.dumps(rec), flush=True)
      f.write(json.dumps(rec) + "\n")
  print("->", path)


if __name__ == "__main__":
  main()
