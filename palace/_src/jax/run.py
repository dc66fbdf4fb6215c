"""`python -m palace._src.jax.run FILE.py [args]`: run an unmodified JAX program with its TPU kernels on
palace (PALACE_JAX picks the chip, default v5e); prints one line per launch at the end."""
from __future__ import annotations

import os
import runpy
import sys


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv:
    print(__doc__.strip(), file=sys.stderr)
    return 2
  os.environ.setdefault("PALACE_JAX", "v5e")
  import palace._src.jax as engine  # noqa: PLC0415  (activates PALACE_JAX)
  sys.argv = argv
  try:
    runpy.run_path(argv[0], run_name="__main__")
  finally:
    for r in engine.process_tpu.reports:
      print(f"palace: {r.kernel_name}: {r.device_cycles} cycles ({r.device_time_s * 1e6:.2f} us)"
            + (" [DIAGNOSTIC exact_f32_dots: not the chip's numerics]" if r.exact_f32_dots else "")
            + (" [DIAGNOSTIC shared_dots: not the chip's numerics]" if r.shared_dots else "")
            + (" [DIAGNOSTIC host_math: not the chip's numerics]" if r.host_math else ""),
            file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
