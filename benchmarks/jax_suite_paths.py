"""pytest plugin of `benchmarks.jax_suite`: JAX's test-only helper modules from the checkout under test.

The jax wheel leaves out the helpers only JAX's own tests import (`jax._src.hypothesis_test_util`,
`jax._src.pallas.pallas_test_util`, `jax._src.internal_test_util`). A test file that imports one would
not even be collected. This plugin appends the checkout's `jax/_src` (and `jax/_src/pallas`) to the
installed packages' search paths: modules the wheel has still come from the wheel; only the missing
test helpers come from the checkout (JAX_SUITE_CHECKOUT, set by the runner).
"""
import os


def pytest_configure(config):
  root = os.environ.get("JAX_SUITE_CHECKOUT")
  if not root:
    return
  import jax._src  # noqa: PLC0415
  import jax._src.pallas  # noqa: PLC0415
  for pkg, sub in ((jax._src, ("jax", "_src")), (jax._src.pallas, ("jax", "_src", "pallas"))):
    path = os.path.join(root, *sub)
    if os.path.isdir(path) and path not in pkg.__path__:
      pkg.__path__.append(path)
