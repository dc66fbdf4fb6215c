"""The kernel language (L4a): values, refs, jnp/lax ops and Pallas primitives. Never imports sim/."""
