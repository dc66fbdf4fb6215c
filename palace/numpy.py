"""`import palace.numpy as jnp`: the jnp subset for kernels (re-exports only)."""
from palace._src.lang.numpy_ops import *  # noqa: F401,F403
from palace._src.lang.numpy_linalg import dot, dot_general, einsum, matmul, outer  # noqa: F401
from palace._src.lang.numpy_ops import (abs, all, any, max, min, round, sum)  # noqa: F401,A004
from palace._src.errors import numpy_getattr as __getattr__  # noqa: F401 (unknown names: MissingApiError)
