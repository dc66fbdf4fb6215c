"""`import palace.jax`: run the TPU Pallas kernels of real JAX programs on palace (re-exports only).

Needs JAX 0.12 installed; see docs/jax.md. `with palace.jax.virtual_tpu("v5e") as tpu:` activates
palace for the kernels traced inside; PALACE_JAX=v5e activates it process-wide (`process_tpu`), e.g.
`PALACE_JAX=v5e pytest -p palace.jax tests/` or `PALACE_JAX=v5e python -m palace._src.jax.run prog.py`.
"""
from palace._src.jax import process_tpu  # noqa: F401
from palace._src.jax.activation import Engine, active_engine, virtual_tpu  # noqa: F401
from palace._src.jax.notebook import activate, timeit_line  # noqa: F401
from palace._src.jax.pytest_plugin import pytest_configure, pytest_report_header  # noqa: F401
from palace._src.jax.timing import DeviceTime, device_time  # noqa: F401
