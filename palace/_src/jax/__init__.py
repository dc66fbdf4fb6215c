"""palace as real JAX's TPU Pallas engine (needs JAX; imported only by `palace.jax`). See docs/jax.md.

Importing it registers palace's CPU lowering of `pallas_call_p` (a registry entry, inert until an
engine is active) and honours the process-wide switch PALACE_JAX=<chip>[:<num_chips>]."""
from palace._src.jax import (rules_control, rules_lax, rules_pipeline, rules_random,  # noqa: F401
                             rules_sc, rules_state, rules_tpu)  # (each registers its rules)
from palace._src.jax import device_view
from palace._src.jax.activation import activate_from_env, install

install()
process_tpu = activate_from_env()  # the VirtualTPU of PALACE_JAX, or None
if process_tpu is not None:
  device_view.install(process_tpu)
