"""`palace.numpy`: the jnp subset kernels use (L4a), one namespace over the topic modules.

Inside a kernel the results are `Array`s and every op is charged to the virtual core through the
executor (`vector_op` / `matmul` / `scalar_op`). On the host (no kernel running) the same functions
return plain NumPy arrays with JAX's dtype defaults (int32 / float32), so they can build kernel inputs.

Topics: `numpy_dtypes` (scalar types, conversions), `numpy_elementwise`, `numpy_creation`,
`numpy_reductions`, `numpy_shape`; matmuls live in `numpy_linalg`, value indexing in `numpy_indexing`;
shared helpers in `numpy_base`. This module binds the Array operators and methods.
"""
from __future__ import annotations

from palace._src.lang import numpy_creation, numpy_dtypes, numpy_elementwise, numpy_reductions, numpy_shape
from palace._src.lang.array import Array
from palace._src.lang.numpy_creation import *  # noqa: F401,F403
from palace._src.lang.numpy_dtypes import *  # noqa: F401,F403
from palace._src.lang.numpy_elementwise import *  # noqa: F401,F403
from palace._src.lang.numpy_reductions import *  # noqa: F401,F403
from palace._src.lang.numpy_shape import *  # noqa: F401,F403
from palace._src.lang.numpy_elementwise import abs, round  # noqa: F401,A004
from palace._src.lang.numpy_indexing import take_along_axis  # noqa: F401
from palace._src.lang.numpy_reductions import all, any, max, min, sum  # noqa: F401,A004


def _bind_methods():
  def rev(f):
    return lambda self, other: f(other, self)

  ops = {"__add__": add, "__sub__": subtract, "__mul__": multiply, "__truediv__": true_divide,
         "__floordiv__": floor_divide, "__mod__": remainder, "__pow__": power, "__and__": bitwise_and,
         "__or__": bitwise_or, "__xor__": bitwise_xor, "__lshift__": left_shift,
         "__rshift__": right_shift, "__lt__": less, "__le__": less_equal, "__gt__": greater,
         "__ge__": greater_equal, "__eq__": equal, "__ne__": not_equal}
  for name, f in ops.items():
    setattr(Array, name, f)
    if name not in ("__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
      setattr(Array, "__r" + name[2:], rev(f))
  Array.__neg__ = negative
  Array.__pos__ = positive
  Array.__abs__ = abs
  Array.__invert__ = invert
  Array.astype = astype
  Array.T = property(lambda self: transpose(self))
  Array.reshape = reshape
  Array.transpose = lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 else (axes or None))
  Array.swapaxes = swapaxes
  Array.squeeze = squeeze
  Array.ravel = ravel
  Array.flatten = ravel
  for red in (sum, prod, max, min, mean, argmax, argmin, any, all):
    setattr(Array, red.__name__, red)


_bind_methods()


_bind_methods()

__all__ = sorted({*numpy_creation.__all__, *numpy_dtypes.__all__, *numpy_elementwise.__all__,
                  *numpy_reductions.__all__, *numpy_shape.__all__, "take_along_axis"})
