"""Tools written against the public API (L7): the CLI, the demo, autotuning, schedule exploration, PNGs, the JAX shim."""
