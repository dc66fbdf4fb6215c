"""JAX parity suite: needs JAX 0.12 (Python >= 3.12); every JAX-dependent module skips without it.

Four virtual CPU devices for the multi-device kernels; set before anything imports jax."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=4").strip()
