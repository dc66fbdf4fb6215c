"""palace as real JAX's Pallas engine: needs JAX 0.12 (Python >= 3.12, .venv-jax). Without JAX (palace's
own venv) nothing here is collected. Four virtual CPU devices, as in the parity suite; set before
anything imports jax."""
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4").strip()

try:
  import jax  # noqa: F401
except ImportError:
  collect_ignore_glob = ["test_*.py"]
else:
  sys.path.insert(0, str(Path(__file__).parent.parent / "jax_parity"))  # the parity kernels' harness
