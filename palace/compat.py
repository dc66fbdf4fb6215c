"""`palace.compat`: run modules written for JAX Pallas on palace (re-exports only).

    mod = palace.compat.load_module("kernels.py")     # its `import jax...` lines resolve to palace
    tpu = palace.compat.run_pallas_file("script.py", chip="v5e")
"""
from palace._src.tools.compat import MissingNameError, jax_callable  # noqa: F401
from palace._src.tools.compat.loader import load_module, run_pallas_file, run_path  # noqa: F401
