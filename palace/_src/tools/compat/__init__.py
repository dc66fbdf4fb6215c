"""JAX interop (L6 helper): run modules written for JAX Pallas on palace; JAX arrays in and out.

`load_module` / `run_pallas_file` need no JAX. `jax_callable` and JAX-array outputs need JAX installed.
"""
from palace._src.tools.compat.host import MissingNameError
from palace._src.tools.compat.interop import jax_callable

# The loader (and the shim it installs, which reads the public `palace` names) is not imported here:
# `palace/__init__` imports jax_callable from this package, so importing the shim from here would be
# the import cycle palace -> compat -> loader -> shim -> palace. `palace.compat` imports it.


def run_pallas_file(path, chip="v5e", num_chips: int = 1, argv=None, **tpu_kwargs):
  """Run a JAX Pallas script as `__main__` on a fresh `pl.virtual_tpu(chip, num_chips)`.

  Its `import jax ...` lines give palace (see load_module). Returns the VirtualTPU, whose `.reports`
  hold one report per kernel launch."""
  from palace._src.sim.machine import VirtualTPU
  from palace._src.tools.compat.loader import run_path
  tpu = VirtualTPU(chip, num_chips, **tpu_kwargs)
  with tpu:
    run_path(path, "__main__", argv)
  return tpu


__all__ = ["MissingNameError", "jax_callable", "run_pallas_file"]
