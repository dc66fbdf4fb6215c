"""JAX interop (L6 helper): run modules written for JAX Pallas on palace; JAX arrays in and out.

`load_module` / `run_pallas_file` (loader.py) need no JAX. `jax_callable` and JAX-array outputs need
JAX installed.
"""
from palace._src.tools.compat.host import MissingNameError
from palace._src.tools.compat.interop import jax_callable

# The loader (and the shim it installs, which reads the public `palace` names) is not imported here,
# not even inside a function: `palace/__init__` imports jax_callable from this package, so that would
# be the import cycle palace -> compat -> loader -> shim -> palace. `palace.compat` imports it.

__all__ = ["MissingNameError", "jax_callable"]
