"""Registry entries of the jax.lax primitives: elementwise, comparisons, shapes, reductions, dot_general.

One entry per primitive (registry.py): the elementwise ones as one `unary(...)` / `binary(...)` line
each (the palace op, and the facts: pure index arithmetic, the fused scalar form), the others as a
`@rule(...)` function. Most are DATA in the schedule analysis: their results depend on their
operands' values, their cost only on shapes."""
from __future__ import annotations

import numpy as np

import palace._src.lang.numpy_ops as pjnp
from palace._src.jax import rules_sc, scalar_blocks as sb
from palace._src.jax.interpret import shape_of, source_line, traced, unsupported
from palace._src.jax.registry import DATA, Deciding, literal, rule
from palace._src import dtypes as dt
from palace._src.lang import host_math, int_rejects as int_rejects_lib, lax_ops, mxu, numpy_linalg
from palace._src.lang import tpu_primitives
from palace._src.errors import CompilerRejectError, UnsupportedError
from palace._src.lang.array import Array
from palace._src.lang.numpy_dtypes import astype_on_scalars
from palace._src.lang.numpy_elementwise import on_scalars, on_vectors, where_on_scalars
from palace._src.util import prod

def _dtype(x):
  return np.dtype(getattr(x, "dtype", None) or np.asarray(x).dtype)


def _aval_is_bool(var) -> bool:
  return np.dtype(var.aval.dtype) == np.bool_


def _all_scalar(eqn) -> bool:
  """Are all of `eqn`'s operands and results 0-d values of one dtype (index arithmetic)?"""
  avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
  return all(getattr(a, "shape", None) == () and getattr(a, "inner_aval", None) is None
             for a in avals) and len({np.dtype(a.dtype) for a in avals[:len(eqn.invars)]}) == 1


def _scalar_form(eqn, op):
  """`op` specialised to the equation's 0-d operands (numpy_elementwise.on_scalars: the same
  results and charges, less work per call) when it is a scalar equation, else None."""
  if not _all_scalar(eqn):
    return None
  return on_scalars(op, eqn.invars[0].aval.dtype, len(eqn.invars))


def _vector_form(eqn, op):
  """`op` specialised to the equation's operands (numpy_elementwise.on_vectors) when they are all
  values of one dtype and one block shape, as its result is (one of two may be 0-d), or two such
  values of the result's rank whose unit dims broadcast to it (JAX 0.12's `max x:f32[128,128]
  y:f32[128,1]`), else None."""
  from jax._src import core as jax_core  # noqa: PLC0415
  ins, outs = eqn.invars, eqn.outvars
  if len(outs) != 1 or any(type(v) is jax_core.Literal for v in ins):
    return None
  avals = [v.aval for v in (*ins, *outs)]
  shape = getattr(avals[-1], "shape", None)
  if not shape or any(getattr(a, "inner_aval", None) is not None or getattr(a, "shape", None) is None
                      for a in avals):
    return None
  shapes = [tuple(a.shape) for a in avals[:len(ins)]]
  in_shapes = None
  if any(s != shape for s in shapes) and not (len(ins) == 2 and sorted(shapes) == [(), shape]):
    # (a block with a 0-d operand is on_vectors' own case; other shapes must broadcast by unit dims)
    if len(ins) != 2 or any(len(s) != len(shape) or any(d not in (1, n) for d, n in zip(s, shape))
                            for s in shapes):
      return None
    in_shapes = tuple(shapes)
  dtypes = {np.dtype(a.dtype) for a in avals[:len(ins)]}
  return on_vectors(op, dtypes.pop(), shape, len(ins), in_shapes) if len(dtypes) == 1 else None


def _vector_literal_form(eqn, op):
  """A binary equation of a block and a 0-d literal of its dtype (x * 7, x + 1.0): `op`'s vector form
  with the literal as a constant palace scalar (ready at time 0), inside a kernel; the literal's NumPy
  value on the host. None for other equations."""
  from jax._src import core as jax_core  # noqa: PLC0415
  x, y = eqn.invars
  k = 0 if type(y) is jax_core.Literal else 1 if type(x) is jax_core.Literal else None
  if k is None or type(eqn.invars[k]) is jax_core.Literal:
    return None
  var, lit, out = eqn.invars[k], eqn.invars[1 - k], eqn.outvars[0].aval
  shape, dtype = getattr(var.aval, "shape", None), np.dtype(var.aval.dtype)
  if not shape or getattr(var.aval, "inner_aval", None) is not None or lit.aval.shape or \
      np.dtype(lit.aval.dtype) != dtype or getattr(out, "shape", None) != shape:
    return None
  fast = on_vectors(op, dtype, shape, 2)
  if fast is None:
    return None
  const = Array(literal(lit), (), dtype, 0)
  value = const._data
  if k == 0:
    return lambda a, _: fast(a, const) if type(a) is Array else op(a, value)
  return lambda _, b: fast(const, b) if type(b) is Array else op(value, b)


def _unary(fn, bool_fn=None):
  def make(eqn):
    op = bool_fn if bool_fn is not None and _aval_is_bool(eqn.invars[0]) else fn
    return _scalar_form(eqn, op) or _vector_form(eqn, op) or op
  return make


def _binary(fn, bool_fn=None, int_literal: bool = False):
  """`int_literal`: the palace op takes a weak Python int for an int32 scalar literal (JAX typed both
  operands int32, so the result is the same, and palace's int32-scalar fast path applies)."""
  def make(eqn):
    from jax._src import core as jax_core  # noqa: PLC0415
    x, y = eqn.invars
    op = bool_fn if bool_fn is not None and _aval_is_bool(x) else fn
    if int_literal and type(y) is jax_core.Literal and not y.aval.shape and \
        np.dtype(y.aval.dtype) == np.int32 and np.dtype(x.aval.dtype) == np.int32 and op is fn:
      lit, fast = int(y.val), _scalar_form(eqn, op)
      if fast is None:
        return _vector_literal_form(eqn, op) or (lambda a, _: op(a, lit))
      # in a kernel, the literal as a constant palace scalar (the same result as the weak int); on
      # the host (index maps) the weak int, as before
      const = Array(np.int32(lit), (), np.dtype(np.int32), 0)
      return lambda a, _: fast(a, const) if type(a) is Array else op(a, lit)
    return _with_literal(eqn, op)
  return make


def _scalar_literals(eqn, op):
  """`op` for an equation whose operands are all 0-d, some of them literals: inside a kernel the
  literals are passed as constant palace scalars (ready at time 0), so the op takes palace's
  same-dtype path (and its scalar form) instead of promoting a NumPy scalar; on the host (index
  maps) they stay NumPy."""
  from jax._src import core as jax_core  # noqa: PLC0415
  ins = eqn.invars
  consts = [Array(literal(v), (), np.dtype(v.aval.dtype), 0) if type(v) is jax_core.Literal else None
            for v in ins]
  live = [k for k, c in enumerate(consts) if c is None]   # operands that are palace values in a kernel
  if any(v.aval.shape for v in ins) or not live or len(live) == len(ins):
    return op
  k = live[0]
  if len(ins) == 2:
    const = consts[1 - k]
    value = const._data
    if k == 1:
      return lambda _, b: op(const if type(b) is Array else value, b)
    return lambda a, _: op(a, const if type(a) is Array else value)

  def with_consts(*args):
    if type(args[k]) is not Array:
      return op(*args)
    return op(*[a if c is None else c for a, c in zip(args, consts)])
  return with_consts


def _with_literal(eqn, op):
  """`op`, or for a scalar op with a literal of its partner's dtype, `_scalar_literals`' form."""
  x, y = eqn.invars
  vector_literal = _vector_literal_form(eqn, op)
  if vector_literal is not None:
    return vector_literal
  op = _scalar_form(eqn, op) or _vector_form(eqn, op) or op
  if np.dtype(x.aval.dtype) == np.dtype(y.aval.dtype):
    return _scalar_literals(eqn, op)
  return op


def _inexact(var) -> bool:
  return np.issubdtype(np.dtype(var.aval.dtype), np.inexact)


_UNSIGNED = {dt.int4: dt.uint4, dt.int8: dt.uint8, dt.int16: dt.uint16, dt.int32: dt.uint32}


def _maybe_zero(v) -> bool:
  """Is the operand `v` 0-d and, as far as its type tells, zero (a literal 0, or a 0-d variable)?"""
  from jax._src import core as jax_core  # noqa: PLC0415
  if getattr(v.aval, "shape", None) != ():
    return False
  return type(v) is not jax_core.Literal or literal(v) == 0


def int_rejects(name: str, unsigned: bool = False):
  """The `rejects` of an entry whose palace op is `name` (int_rejects.py: the integer vector and scalar
  forms the TPU compiler rejects), decided from the equation's types on a TensorCore; `unsigned`: the
  op works on its operands' bits as the unsigned type of their width (a logical shift)."""
  def rejects(eqn, sparsecore: bool = False) -> None:
    dtype = np.dtype(eqn.invars[0].aval.dtype)
    dtype = _UNSIGNED.get(dtype, dtype) if unsigned else dtype
    shape = tuple(getattr(eqn.outvars[0].aval, "shape", ()))
    if sparsecore or not int_rejects_lib.rejected(name, dtype, bool(shape)):
      return
    if name in ("equal", "not_equal") and shape and any(_maybe_zero(v) for v in eqn.invars):
      return   # a vector compared with a scalar zero is a mask cast, which compiles (decided when it runs)
    raise int_rejects_lib.refusal(name, dtype, shape, f"at kernel line {source_line(eqn)}")
  return rejects


def _rejects_of(fn, facts: dict) -> dict:
  """`facts` with the integer `rejects` of the palace op `fn`, where it has forms the compiler rejects."""
  if "rejects" not in facts and (getattr(fn, "rejects", None) or getattr(fn, "scalar_rejects", None)):
    facts = {**facts, "rejects": int_rejects(fn.__name__)}
  return facts


def unary(name, fn, bool_fn=None, **facts):
  """The entry of an elementwise primitive of one operand: `fn` (the palace op; `bool_fn` for bool
  operands), in its scalar or block form where the equation's avals allow (`_unary`), refused at
  lowering where the TPU compiler rejects its integer form (`int_rejects`)."""
  rule(name, compiles=True, schedule=DATA, **_rejects_of(fn, facts))(_unary(fn, bool_fn))


def binary(name, fn, bool_fn=None, int_literal: bool = False, **facts):
  """The entry of an elementwise primitive of two operands (`_binary`; `int_rejects` as `unary`)."""
  rule(name, compiles=True, schedule=DATA, **_rejects_of(fn, facts))(_binary(fn, bool_fn, int_literal))


def _identity(x):
  return x


# the fused scalar forms (scalar_blocks.py) of int32/uint32 arithmetic, comparisons and bitwise ops
def _ints(build, arity: int = 2):
  return sb.same_dtype(sb.INTS, build, arity)


def _compare(op: str):
  return sb.same_dtype(sb.DTYPES, sb.plain(op), result="bool")


def _bitwise(op: str):
  return sb.same_dtype(sb.DTYPES, sb.plain(op))


unary("neg", pjnp.negative, pure_index=True, scalar=_ints(sb.negate, arity=1))
unary("abs", pjnp.abs, pure_index=True)
unary("sign", pjnp.sign, pure_index=True)
unary("not", pjnp.invert, pjnp.logical_not, pure_index=True,
      scalar=sb.same_dtype(sb.DTYPES, sb.invert, arity=1))
unary("floor", pjnp.floor)
unary("ceil", pjnp.ceil)
unary("exp", pjnp.exp)
unary("log", pjnp.log)
unary("log2", pjnp.log2)
unary("exp2", pjnp.exp2)     # exp2, log1p, expm1: palace's own, as the chip computes them or
unary("log1p", pjnp.log1p)   # refuses them (expm1: no Mosaic lowering; docs/numerics.md)
unary("expm1", pjnp.expm1)
unary("tanh", pjnp.tanh)
unary("logistic", pjnp.logistic)
unary("sqrt", pjnp.sqrt)
unary("rsqrt", pjnp.rsqrt)
unary("sin", pjnp.sin)
unary("cos", pjnp.cos)
unary("tan", pjnp.tan)
unary("atan", pjnp.arctan)
unary("sinh", pjnp.sinh)
unary("cosh", pjnp.cosh)
unary("erf", pjnp.erf)
unary("is_finite", pjnp.isfinite)
unary("square", pjnp.square)
unary("copy", _identity)
unary("copy_p", _identity)
unary("optimization_barrier", _identity)
unary("stop_gradient", _identity)
binary("add", pjnp.add, int_literal=True, pure_index=True, scalar=_ints(sb.arith("+")))
binary("sub", pjnp.subtract, int_literal=True, pure_index=True, scalar=_ints(sb.arith("-")))
binary("mul", pjnp.multiply, int_literal=True, pure_index=True, scalar=_ints(sb.arith("*")))
binary("max", pjnp.maximum, int_literal=True, pure_index=True, scalar=_ints(sb.maximum))
binary("min", pjnp.minimum, int_literal=True, pure_index=True, scalar=_ints(sb.minimum))
binary("eq", pjnp.equal, int_literal=True, pure_index=True, scalar=_compare("=="))
binary("ne", pjnp.not_equal, int_literal=True, pure_index=True, scalar=_compare("!="))
binary("lt", pjnp.less, int_literal=True, pure_index=True, scalar=_compare("<"))
binary("le", pjnp.less_equal, int_literal=True, pure_index=True, scalar=_compare("<="))
binary("gt", pjnp.greater, int_literal=True, pure_index=True, scalar=_compare(">"))
binary("ge", pjnp.greater_equal, int_literal=True, pure_index=True, scalar=_compare(">="))
binary("and", pjnp.bitwise_and, pjnp.logical_and, int_literal=True, pure_index=True, scalar=_bitwise("&"))
binary("or", pjnp.bitwise_or, pjnp.logical_or, int_literal=True, pure_index=True, scalar=_bitwise("|"))
binary("xor", pjnp.bitwise_xor, pjnp.logical_xor, int_literal=True, pure_index=True, scalar=_bitwise("^"))
binary("shift_left", pjnp.left_shift, int_literal=True, pure_index=True)
binary("shift_right_arithmetic", pjnp.right_shift, int_literal=True, pure_index=True)
binary("shift_right_logical", lax_ops.shift_right_logical, pure_index=True,
       rejects=int_rejects("right_shift", unsigned=True))
binary("pow", pjnp.power)
binary("add_any", pjnp.add)
binary("atan2", pjnp.arctan2)


@rule("div", compiles=True, schedule=DATA, pure_index=True, scalar=_ints(sb.divide),
      rejects=int_rejects("div"))
def _div(eqn):
  return _with_literal(eqn, pjnp.true_divide if _inexact(eqn.invars[0]) else lax_ops.div)


@rule("rem", compiles=True, schedule=DATA, pure_index=True, scalar=_ints(sb.remainder),
      rejects=int_rejects("rem"))
def _rem(eqn):
  # palace's lax.rem for every dtype: fmod for floats, exact as XLA's rem (x - trunc(x / y) * y
  # rounds, and gives NaN for a finite x over an infinite y, where rem gives x)
  return _with_literal(eqn, lax_ops.rem)


@rule("round", schedule=DATA)
def _round(eqn, x):
  method = int(getattr(eqn.params.get("rounding_method"), "value", eqn.params.get("rounding_method", 0)))
  if method == 1:  # TO_NEAREST_EVEN, NumPy's rounding
    return pjnp.round(x)
  # AWAY_FROM_ZERO: sign(x) * floor(|x| + 0.5)
  return pjnp.multiply(pjnp.sign(x), pjnp.floor(pjnp.add(pjnp.abs(x), np.asarray(0.5, _dtype(x)))))


def _integer_pow_rejects(eqn, sparsecore: bool = False) -> None:
  if int(eqn.params["y"]) not in (0, 1):   # (a product of the operand with itself)
    int_rejects("multiply")(eqn, sparsecore)


@rule("integer_pow", schedule=DATA, rejects=_integer_pow_rejects)
def _integer_pow(eqn, x):
  y = int(eqn.params["y"])
  if y == 2:
    return pjnp.square(x)
  if y == 1:
    return x
  if y < 0:
    return pjnp.reciprocal(_integer_pow_pos(x, -y))
  return _integer_pow_pos(x, y) if y else pjnp.ones_like(x)


def _integer_pow_pos(x, y):
  acc = None
  base = x
  while y:
    if y & 1:
      acc = base if acc is None else pjnp.multiply(acc, base)
    y >>= 1
    if y:
      base = pjnp.multiply(base, base)
  return acc


@rule("population_count", schedule=DATA)
def _population_count(eqn, x):
  return lax_ops.population_count(x)


@rule("clz", schedule=DATA, rejects=int_rejects("clz"))
def _clz(eqn, x):
  return lax_ops.clz(x)


@rule("nextafter", schedule=DATA)
def _nextafter(eqn, x, y):
  return lax_ops.nextafter(x, y)


@rule("reduce_precision", schedule=DATA)
def _reduce_precision(eqn, x):
  p = eqn.params
  return lax_ops.reduce_precision(x, p["exponent_bits"], p["mantissa_bits"])


@rule("reciprocal", schedule=DATA)
def _reciprocal(eqn, x):
  return pjnp.reciprocal(x)


@rule("select_n", compiles=True, schedule=DATA, pure_index=True, scalar=sb.select)
def _select_n(eqn):
  n = len(eqn.invars) - 1
  if n == 1:
    return lambda which, case: case
  if n == 2 and _aval_is_bool(eqn.invars[0]):
    if all(not v.aval.shape for v in eqn.invars) and \
        np.dtype(eqn.invars[1].aval.dtype) == np.dtype(eqn.invars[2].aval.dtype):
      select = _scalar_literals(eqn, lambda which, c0, c1, fast=where_on_scalars(
          eqn.invars[1].aval.dtype): fast(which, c1, c0))   # (lax_ops.select is jnp.where)
      return select
    return lambda which, c0, c1: lax_ops.select(which, c1, c0)
  dtype = np.dtype(eqn.invars[0].aval.dtype)
  if n == 2:
    zero = np.asarray(0, dtype)
    return lambda which, c0, c1: lax_ops.select(pjnp.not_equal(which, zero), c1, c0)
  index = [np.asarray(i, dtype) for i in range(n)]

  def select_n(which, *cases):
    out = cases[-1]
    for i in range(n - 2, -1, -1):
      out = lax_ops.select(pjnp.equal(which, index[i]), cases[i], out)
    return out
  return select_n


@rule("clamp", schedule=DATA, pure_index=True, scalar=sb.clamp, rejects=int_rejects("maximum"))
def _clamp(eqn, lo, x, hi):   # (lowered as a maximum, then a minimum)
  return pjnp.minimum(pjnp.maximum(x, lo), hi)


@rule("convert_element_type", compiles=True, schedule=DATA, pure_index=True, scalar=sb.convert)
def _convert(eqn):
  new_dtype = eqn.params["new_dtype"]
  x = eqn.invars[0].aval
  if not x.shape and getattr(x, "inner_aval", None) is None:   # lax_ops.convert_element_type is astype
    return astype_on_scalars(x.dtype, new_dtype)
  return lambda x: lax_ops.convert_element_type(x, new_dtype)


@rule("bitcast_convert_type", schedule=DATA)
def _bitcast_convert(eqn, x):
  new = np.dtype(eqn.params["new_dtype"])
  if new.itemsize != _dtype(x).itemsize:
    raise unsupported(eqn, f"a width change {_dtype(x)} -> {new}",
                      "bitcast between dtypes of the same width (they keep the shape), the only ones "
                      "covered.")
  return tpu_primitives.bitcast(x, new)


@rule("iota", schedule=DATA)
def _iota(eqn):
  p = eqn.params
  return lax_ops.broadcasted_iota(p["dtype"], tuple(p["shape"]), int(p["dimension"]))


@rule("broadcast_in_dim", schedule=DATA)
def _broadcast_in_dim(eqn, x, *dyn):
  if dyn:
    raise unsupported(eqn, "dynamic shapes")
  p = eqn.params
  shape, dims, xshape = tuple(p["shape"]), tuple(p["broadcast_dimensions"]), shape_of(x)
  # the forms jnp code produces, costed as palace's own ops for them: a scalar fill (jnp.full),
  # inserting unit dims (keepdims=True: a reshape) and a same-rank broadcast (jnp.broadcast_to)
  if not xshape:
    return pjnp.full(shape, x, _dtype(x))
  if dims == tuple(range(len(shape) - len(xshape), len(shape))) and len(xshape) == len(shape):
    return pjnp.broadcast_to(x, shape)
  if prod(shape) == prod(xshape) and dims == tuple(sorted(dims)):
    return pjnp.reshape(x, shape)
  return lax_ops.broadcast_in_dim(x, shape, dims)


@rule("reshape", schedule=DATA)
def _reshape(eqn, x, *dyn):
  p = eqn.params
  if dyn or p.get("dimensions") not in (None, ()):
    raise unsupported(eqn, "dimensions (a transposing reshape) or dynamic shapes")
  return pjnp.reshape(x, tuple(p["new_sizes"]))


@rule("squeeze", schedule=DATA)
def _squeeze(eqn, x):
  dims = tuple(eqn.params["dimensions"])
  return pjnp.squeeze(x, axis=dims) if dims else x


@rule("expand_dims", schedule=DATA)
def _expand_dims(eqn, x):
  return pjnp.expand_dims(x, tuple(eqn.params["dimensions"]))


@rule("transpose", schedule=DATA)
def _transpose(eqn, x):
  return pjnp.transpose(x, tuple(eqn.params["permutation"]))


def _reduction(fn):
  def apply(eqn, x):
    axes = tuple(int(a) for a in eqn.params["axes"])
    return fn(x, axis=axes) if axes else x
  return apply


rule("reduce_sum", schedule=DATA)(_reduction(pjnp.sum))
rule("reduce_max", schedule=DATA)(_reduction(pjnp.max))
rule("reduce_min", schedule=DATA)(_reduction(pjnp.min))
rule("reduce_prod", schedule=DATA)(_reduction(pjnp.prod))
rule("reduce_and", schedule=DATA)(_reduction(pjnp.all))
rule("reduce_or", schedule=DATA)(_reduction(pjnp.any))


def _arg(fn):
  def apply(eqn, x):
    axes = tuple(eqn.params["axes"])
    if len(axes) != 1:
      raise unsupported(eqn, f"axes={axes}")
    return lax_ops.convert_element_type(fn(x, axis=int(axes[0])), eqn.params["index_dtype"])
  return apply


rule("argmax", schedule=DATA)(_arg(pjnp.argmax))
rule("argmin", schedule=DATA)(_arg(pjnp.argmin))


def _dot_rejects(eqn, sparsecore: bool = False) -> str:
  """The dot's precision; raises what Mosaic rejects (mxu.py), named at the JAX kernel's line."""
  p = eqn.params
  lhs, rhs = (np.dtype(v.aval.dtype) for v in eqn.invars)
  where = f"kernel line {source_line(eqn)}"
  prec = mxu.precision_of(p.get("precision"), "lax.dot_general", where)
  mxu.check(lhs, rhs, np.dtype(eqn.outvars[0].aval.dtype), prec, "lax.dot_general", where)
  return prec


@rule("dot_general", compiles=True, schedule=DATA, rejects=_dot_rejects)
def _dot_general(eqn):
  p = eqn.params
  dims, pet, prec = p["dimension_numbers"], p.get("preferred_element_type"), _dot_rejects(eqn)
  return lambda lhs, rhs: numpy_linalg.dot_general(lhs, rhs, dims, precision=prec,
                                                   preferred_element_type=pet)


@rule("concatenate", schedule=DATA)
def _concatenate(eqn, *xs):
  return pjnp.concatenate(list(xs), axis=int(eqn.params["dimension"]))


@rule("stack", schedule=DATA)
def _stack(eqn, *xs):
  """lax's stack (jnp.stack in a kernel, JAX 0.12 keeps it one primitive): each operand given a new axis
  at `axis`, then concatenated along it."""
  return pjnp.stack(list(xs), axis=int(eqn.params["axis"]))


@rule("split", schedule=DATA)
def _split(eqn, x):
  """lax.split (jnp.split / jnp.array_split in a kernel): consecutive slices of `sizes` along `axis`,
  each as the slice rule's (Mosaic lowers one strided slice per piece)."""
  axis, start, pieces = int(eqn.params["axis"]), 0, []
  for size in eqn.params["sizes"]:
    pieces.append(x[(slice(None),) * axis + (slice(start, start + int(size)),)])
    start += int(size)
  return pieces


@rule("unstack", schedule=DATA)
def _unstack(eqn, x):
  """lax's unstack (jnp.unstack, and JAX's threefry on key data): the size-1 slices along `axis`, that
  axis dropped (Mosaic lowers one slice and one reshape per piece)."""
  axis = int(eqn.params["axis"])
  lead = (slice(None),) * axis
  return [x[(*lead, i)] for i in range(x.shape[axis])]


@traced
def _erf_inv_chip(eqn):
  """Mosaic's own erf_inv: the polynomial of jax/_src/pallas/utils.py (jax.random.normal in a kernel)."""
  from jax._src.pallas import utils as pallas_utils  # noqa: PLC0415
  return pallas_utils.erf_inv_lowering_helper


@rule("erf_inv", compiles=True, schedule=DATA)
def _erf_inv(eqn):
  """Mosaic's polynomial (charged op by op); under the host-math diagnostic its value is XLA:CPU's
  erf_inv (lang/host_math.py)."""
  chip = _erf_inv_chip(eqn)
  return lambda x: host_math.result("erf_inv", x, chip(x))


@rule("slice", schedule=DATA)
def _slice(eqn, x):
  p = eqn.params
  strides = p.get("strides") or (1,) * len(p["start_indices"])
  return x[tuple(slice(int(a), int(b), int(s)) for a, b, s in
                 zip(p["start_indices"], p["limit_indices"], strides))]


def _dynamic_slice_rejects(eqn, sparsecore: bool = False) -> None:
  """JAX 0.12's Mosaic lowering has no rule for `dynamic_slice` / `dynamic_update_slice` of a value, on
  a TensorCore or a SparseCore (jax/_src/pallas/mosaic/lowering.py raises 'Unimplemented primitive in
  Pallas TPU lowering for tc: dynamic_slice'; JAX's test_lane_dynamic_slice expects the refusal). A
  kernel slices the ref instead, which lowers to a memref slice."""
  name = eqn.primitive.name
  kind = "sc" if sparsecore else "tc"
  raise CompilerRejectError(
      f"lax.{name} of a {eqn.invars[0].aval.str_short()} value at kernel line {source_line(eqn)}: the "
      f"TPU compiler has no {name} of values (JAX 0.12's Mosaic lowering: 'Unimplemented primitive in "
      f"Pallas TPU lowering for {kind}: {name}'). Fix: index the ref instead (x_ref[pl.ds(start, size)] "
      f"to read, x_ref[pl.ds(start, size)] = v to write), or use a static slice of the value.")


@rule("dynamic_slice", schedule=Deciding(1), rejects=_dynamic_slice_rejects)
def _dynamic_slice(eqn, x, *idx):
  # the primitive only clamps: jax.lax.dynamic_slice already wrapped negative starts in the jaxpr
  return lax_ops.dynamic_slice(x, list(idx), tuple(eqn.params["slice_sizes"]), allow_negative_indices=False)


@rule("dynamic_update_slice", schedule=Deciding(2), rejects=_dynamic_slice_rejects)
def _dynamic_update_slice(eqn, x, update, *idx):
  return lax_ops.dynamic_update_slice(x, update, list(idx), allow_negative_indices=False)


@rule("rev", schedule=DATA)
def _rev(eqn, x):
  return pjnp.flip(x, tuple(eqn.params["dimensions"]))


@rule("cumsum", schedule=DATA)
def _cumsum(eqn, x):
  if eqn.params.get("reverse"):
    raise unsupported(eqn, "reverse=True")
  return pjnp.cumsum(x, axis=int(eqn.params["axis"]))


@rule("tile", schedule=DATA)
def _tile(eqn, x):
  return pjnp.tile(x, tuple(int(r) for r in eqn.params["reps"]))


@rule("gather", compiles=True)   # (schedule: not classified yet)
def _gather(eqn):
  """The one gather Mosaic lowers on a TensorCore: take_along_axis along one axis (every other axis
  batched, unit slices, indices of the result's shape plus a trailing 1), as `jnp.take_along_axis`.
  Any other gather fails as Mosaic's lowering does (measured on a TPU v5e: rows taken by an index
  vector, 'Only take_along_axis-like gathers supported'). SparseCore's plsc.load_gather, a primitive
  also named "gather" (with a `tree` parameter), is rules_sc.gather's."""
  if "tree" in eqn.params:
    return rules_sc.gather(eqn)
  from jax import lax  # noqa: PLC0415
  dn, out = eqn.params["dimension_numbers"], eqn.outvars[0].aval
  rank, idx_shape = len(out.shape), tuple(eqn.invars[1].aval.shape)
  ok = (len(eqn.invars[0].aval.shape) == rank and idx_shape == tuple(out.shape) + (1,)
        and tuple(eqn.params["slice_sizes"]) == (1,) * rank and not dn.offset_dims
        and len(dn.collapsed_slice_dims) == 1 and tuple(dn.collapsed_slice_dims) == tuple(dn.start_index_map)
        and tuple(dn.operand_batching_dims) == tuple(dn.start_indices_batching_dims)
        and len(dn.operand_batching_dims) == rank - 1
        and eqn.params["mode"] in (lax.GatherScatterMode.FILL_OR_DROP,
                                   lax.GatherScatterMode.PROMISE_IN_BOUNDS))
  if not ok:
    raise UnsupportedError(
        f"palace.jax: a gather that is not take_along_axis-like (kernel line {source_line(eqn)}) does "
        f"not compile on a TPU TensorCore (Mosaic, measured on a TPU v5e: 'Only take_along_axis-like "
        f"gathers supported'). Fix: gather rows with DMAs from a ref (pltpu.make_async_copy of "
        f"x_ref.at[i]), or use jnp.take_along_axis with indices of the value's shape.")
  shape, axis = tuple(out.shape), int(dn.collapsed_slice_dims[0])
  return lambda x, indices: pjnp.take_along_axis(x, pjnp.reshape(indices, shape), axis)
