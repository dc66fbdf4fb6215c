"""Integer ops the TPU compiler (Mosaic) rejects (L4a): one table for vectors, one for scalars, and the
one error both raise (`refusal`).

These are compiler rules, not chip figures: applied on every chip, on the TensorCore (a SparseCore
subcore has its own lowering: JAX's SparseCore tests add int8 and uint8 vectors, so callers skip them
there). The language's elementwise ops (numpy_elementwise._elementwise) ask `refusal` when they run;
palace.jax asks it from an equation's types while lowering the kernel (rules_lax.py), as Mosaic rejects
such a kernel when it compiles it, whether or not the op would run.

Vectors (`VECTOR_INT_REJECTS`): measured on a TPU v5e with the compiler `hw.COMPILER` names (JAX
0.10.2, libtpu 0.0.42.1: benchmarks/hw/data/v5e-limits-2026-12-05*.jsonl and the timing suite's int8
add; the probe names are in the evidence). MLIR integers are signless: where the op has no sign (add, subtract, negate,
multiply) uint8 is the very op measured on int8; where it has one, the unsigned twin (arith.maxui,
shrui, divui, unsigned comparisons) is inferred from the signed one, and minimum (arith.minsi) from
maximum. Measured to compile, so accepted: 8-bit and / cast / where, 8-bit `x != 0` / `x == 0`
against a scalar zero (the mask cast, numpy_elementwise._mask_cast: JAX's own tests), 16-bit add /
multiply / compare / where. Unmeasured ops (8-bit abs, shifts left, xor, ...) run. 4-bit add,
subtract, negate, multiply and division are inferred: the rule the 8-bit message states admits i16 and
i32 only, and JAX's own TPU test (tpu_pallas_test::test_vector_integer_addition) expects int4 and
uint4 additions to be rejected with it.

Scalars (`SCALAR_INT_OPS`, 0-d values: SMEM reads, the scalar unit): Mosaic's canonicalization admits
an integer scalar op whose operands and result share one type only on i32 (and i1, bools), and an
addition only on i32, for every other width a "Not implemented" error. Not measured on the v5e: JAX's
own TPU tests expect these errors for every 4-, 8- and 16-bit type, signed or not, with no libtpu
guard (tpu_pallas_test: PallasScalarIOpsTest, PallasCallPoisonTest::test_scalar_integer_addition).
"""
from __future__ import annotations

import numpy as np

from palace._src import dtypes as dt
from palace._src.errors import CompilerRejectError

_I4, _U4, _I8, _I16, _U8, _U16 = (dt.int4, dt.uint4, *(np.dtype(d) for d in (np.int8, np.int16, np.uint8,
                                                                              np.uint16)))
_WIDTH = ("Not implemented: Only vector<i16> and vector<i32> are supported, but got 'i8'. Please cast your "
          "input.")
_CMP = "Target does not support this comparison ... vector<8x128x4xi8>"


def _evidence(probe: str, op: str, quote: str, inferred: str = "") -> str:
  """The text an error quotes as its evidence: the probe, the MLIR op and the compiler's message."""
  if inferred:
    return f"inferred, not measured: {inferred}; a TPU v5e (probe {probe}, arith.{op}): '{quote}'"
  return f"measured on a TPU v5e (probe {probe}, arith.{op}): '{quote}'"


def _legalize(probe: str, op: str, bits: int, inferred: str = "") -> str:
  return _evidence(probe, op, f"failed to legalize operation 'arith.{op}' ... vector<8x128x{32 // bits}"
                   f"xi{bits}>", inferred)


def _unsigned(bits: int, op: str, signed: str) -> str:
  return f"uint{bits} lowers to arith.{op} where int{bits} lowers to arith.{signed}"


def _four_bit(probe: str, op: str) -> str:
  return _evidence(probe, op, _WIDTH, "a 4-bit integer is neither i16 nor i32, the widths the 8-bit "
                   "message admits (JAX's tpu_pallas_test expects it for int4 / uint4 additions)")


_SUB_8 = _evidence("int8_neg_op", "subi", _WIDTH)
_DIV_8 = _evidence("int8_div", "subi", _WIDTH)


def _compare(name: str, dtype) -> str:
  """int8 `a > b` measured (probes int8_compare_op, int8_where_op); other predicates and uint8 inferred."""
  if dtype == _U8:
    return _evidence("int8_compare_op", "cmpi", _CMP, "uint8 is arith.cmpi with an unsigned predicate")
  if name == "greater":
    return _evidence("int8_compare_op", "cmpi", _CMP)
  return _evidence("int8_compare_op", "cmpi", _CMP, f"{name} is arith.cmpi with another predicate than "
                   f"the measured a > b")


def _with_4_bit(table: dict, probe: str, op: str) -> dict:
  return {**table, _I4: _four_bit(probe, op), _U4: _four_bit(probe, op)}


# {palace op name: {operand dtype: evidence}}: integer vector ops the TPU compiler rejects
VECTOR_INT_REJECTS = {
    "add": _with_4_bit({_I8: _evidence("int8_add_op", "addi", _WIDTH),
                        _U8: _evidence("uint8_add_op", "addi", _WIDTH)}, "int8_add_op", "addi"),
    "subtract": _with_4_bit({_I8: _SUB_8, _U8: _SUB_8}, "int8_neg_op", "subi"),
    "negative": _with_4_bit({_I8: _SUB_8, _U8: _SUB_8}, "int8_neg_op", "subi"),
    "multiply": _with_4_bit({_I8: _evidence("int8_mul_op", "muli", _WIDTH),
                             _U8: _evidence("int8_mul_op", "muli", _WIDTH + " (uint8: the same signless op)")},
                            "int8_mul_op", "muli"),
    "maximum": {_I8: _legalize("int8_max_op", "maxsi", 8), _I16: _legalize("int16_max_op", "maxsi", 16),
                _U8: _legalize("int8_max_op", "maxsi", 8, _unsigned(8, "maxui", "maxsi")),
                _U16: _legalize("int16_max_op", "maxsi", 16, _unsigned(16, "maxui", "maxsi"))},
    "minimum": {d: _legalize(f"int{b}_max_op", "maxsi", b, f"jnp.minimum lowers to arith.min"
                             f"{'u' if d.kind == 'u' else 's'}i, legalized beside maxsi")
                for d, b in ((_I8, 8), (_U8, 8), (_I16, 16), (_U16, 16))},
    "right_shift": {_I8: _legalize("int8_shift_op", "shrsi", 8), _I16: _legalize("int16_shift_op", "shrsi", 16),
                    _U8: _legalize("int8_shift_op", "shrsi", 8, _unsigned(8, "shrui", "shrsi")),
                    _U16: _legalize("int16_shift_op", "shrsi", 16, _unsigned(16, "shrui", "shrsi"))},
    "floor_divide": _with_4_bit({_I8: _DIV_8, _U8: _DIV_8, _I16: _legalize("int16_div", "divsi", 16),
                                 _U16: _legalize("int16_div", "divsi", 16, _unsigned(16, "divui", "divsi"))},
                                "int8_div", "subi"),
    "remainder": _with_4_bit({_I8: _DIV_8, _U8: _DIV_8, _I16: _legalize("int16_rem_op", "remsi", 16),
                              _U16: _legalize("int16_rem_op", "remsi", 16, _unsigned(16, "remui", "remsi"))},
                             "int8_div", "subi"),
    **{name: {d: _compare(name, d) for d in (_I8, _U8)}
       for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")},
}
VECTOR_INT_REJECTS["div"] = VECTOR_INT_REJECTS["floor_divide"]   # lax.div / lax.rem (lax_ops)
VECTOR_INT_REJECTS["rem"] = VECTOR_INT_REJECTS["remainder"]

# {palace op name: (the MLIR op Mosaic lowers a signed scalar of it to, the unsigned one)}: integer
# scalar ops whose operands and result share one type (None: no such op for that signedness, e.g. the
# sign of an unsigned scalar is a comparison and a cast; the abs of one is the value itself)
SCALAR_INT_OPS = {
    "add": ("arith.addi", "arith.addi"), "subtract": ("arith.subi", "arith.subi"),
    "negative": ("arith.subi", "arith.subi"), "multiply": ("arith.muli", "arith.muli"),
    "square": ("arith.muli", "arith.muli"), "power": ("arith.muli", "arith.muli"),
    "maximum": ("arith.maxsi", "arith.maxui"), "minimum": ("arith.minsi", "arith.minui"),
    "bitwise_and": ("arith.andi", "arith.andi"), "bitwise_or": ("arith.ori", "arith.ori"),
    "bitwise_xor": ("arith.xori", "arith.xori"), "invert": ("arith.xori", "arith.xori"),
    "left_shift": ("arith.shli", "arith.shli"), "right_shift": ("arith.shrsi", "arith.shrui"),
    "floor_divide": ("arith.divsi", "arith.divui"), "remainder": ("arith.remsi", "arith.remui"),
    "div": ("arith.divsi", "arith.divui"), "rem": ("arith.remsi", "arith.remui"),
    "abs": ("math.absi", None), "sign": ("arith.subi", None), "clz": ("math.ctlz", "math.ctlz"),
}
_SCALAR_WHY = ("Mosaic's canonicalization of scalar integer ops; not measured on the v5e: JAX's own TPU "
               "tests expect this error for 4-, 8- and 16-bit scalars")


def scalar_mlir_op(name: str, dtype) -> str | None:
  """The MLIR op the TPU compiler rejects for a 0-d `name` on `dtype` operands, or None where it
  compiles (32-bit integers, bools, floats, ops that are not integer arithmetic)."""
  ops = SCALAR_INT_OPS.get(name)
  if ops is None or dtype == dt.bool_ or not dt.is_int(dtype) or dt.bits(dtype) == 32:
    return None
  return ops[0] if dt.is_signed_int(dtype) else ops[1]


def rejected(name: str, dtype, vector: bool) -> bool:
  """Does the TPU compiler reject `name` on `dtype` operands (vectors, or 0-d values)?"""
  dtype = np.dtype(dtype)
  if vector:
    table = VECTOR_INT_REJECTS.get(name)
    return table is not None and dtype in table
  return scalar_mlir_op(name, dtype) is not None


def refusal(name: str, dtype, shape, where: str) -> CompilerRejectError | None:
  """The error of `name` on `dtype` operands with result shape `shape` where the TPU compiler rejects
  it (None where it compiles); `where`: the grid point or kernel line and the user's frame."""
  dtype, shape = np.dtype(dtype), tuple(shape)
  api = "lax" if name in ("div", "rem", "clz") else "jnp"
  bits = dt.bits(dtype)
  fix = (f"Fix: cast the operands to int32 first (x.astype(jnp.int32)) and the result back to {dtype} "
         f"if needed.")
  if shape:
    why = VECTOR_INT_REJECTS.get(name, {}).get(dtype)
    if why is None:
      return None
    return CompilerRejectError(
        f"{api}.{name} of {dtype} vectors of shape {shape} {where}: the TPU compiler has no {bits}-bit "
        f"integer {name} on vectors (Mosaic, {why}). {fix}")
  op = scalar_mlir_op(name, dtype)
  if op is None:
    return None
  quote = (f"Not implemented: Only i32 addition is supported, but got i{bits}. Please cast your input "
           f"to i32." if op == "arith.addi" else "Not implemented: Only i1 and i32 scalars are supported.")
  return CompilerRejectError(
      f"{api}.{name} of {dtype} scalars {where}: the TPU compiler has no {bits}-bit integer {name} on "
      f"scalars; expected int32 (or bool) operands (Mosaic rejects {op} on i{bits}: '{quote}'; "
      f"{_SCALAR_WHY}). {fix}")
