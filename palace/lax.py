"""`from palace import lax`: the lax subset for kernels (re-exports only)."""
from palace._src.lang.lax_ops import *  # noqa: F401,F403
from palace._src.lang.lax_ops import abs, max, min  # noqa: F401,A004
from palace._src.errors import lax_getattr as __getattr__  # noqa: F401 (unknown names: MissingApiError)
