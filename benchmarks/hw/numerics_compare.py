"""Compare recorded TPU numerics probes with palace (the palace side of benchmarks/hw/numerics.py).

`compare(load(path))` recomputes every recorded probe on palace.jax's virtual v5e and compares it with
the chip's output; `BOUNDS` is the one table of what palace promises per probe (bit-identical, within an
ulp bound, within a dot/sum rounding bound, or a rejection the chip also makes), each with its reason
(docs/numerics.md has the rules behind it). `classify` turns a comparison into "identical", "within
bound" or "outside bound".
"""
from __future__ import annotations

import json
import sys

import numpy as np

from benchmarks.hw.numerics import PROBES, _first_line, decode, run_probe

U24 = 2.0 ** -24   # float32 unit roundoff

# probe -> (kind, bound, reason). kinds: "identical" (bit for bit); "ulp" (max ulp of the output dtype
# over elements where neither side is NaN, NaN where the chip has NaN); "dot" (|chip - palace| <=
# bound x K x u x sum_k |a_k b_k| of the operands the MXU reads, u = 2^-24: both are float32
# accumulations of the same exact products in some order); "sum" (likewise, over the reduced
# values); "both errors" (the chip rejects it, palace raises too); "gap" (a known difference, not
# asserted: the reason says why).
_DOT_REASON = "chip = bf16-rounded operands (DEFAULT) or f32 (HIGHEST), exact products, f32 sums in an order we cannot see"
BOUNDS: dict[str, tuple[str, float, str]] = {}
for _n in ("dot_f32_none_128x256x128", "dot_f32_none_8x128x128", "dot_f32_default_8x128x128",
           "dot_f32_highest_128x256x128", "dot_f32_highest_8x128x128", "dot_general_f32_default_8x128x128",
           "dot_general_nt_f32_default_8x128x128", "dot_general_f32_highest_8x128x128",
           "dot_general_nt_f32_highest_8x128x128", "dot_f32_ctx_highest_128x256x128",
           "dot_bf16_f32acc_128x256x128", "dot_f32_bf16_mixed_128x256x128"):
  BOUNDS[_n] = ("dot", 1.0, _DOT_REASON)
for _n in ("dot_f32_high_128x256x128", "dot_f32_high_8x128x128", "dot_general_f32_high_8x128x128",
           "dot_general_nt_f32_high_8x128x128"):
  BOUNDS[_n] = ("both errors", 0, "Mosaic: 'Unsupported dot precision: HIGH'")
for _n in ("dot_bf16_bf16out_128x256x128", "dot_bf16_default_out_128x256x128"):
  BOUNDS[_n] = ("both errors", 0, "Mosaic verifier: 'Expected matmul acc to be 32-bit'")
BOUNDS["dot_f32_bf16_mixed_highest_128x256x128"] = ("both errors", 0, "Mosaic: 'Bad rhs type' (f32 x bf16 at HIGHEST)")
for _n in ("dot_int8_int32_128x256x128", "cast_f32_bf16", "cast_f32_int32", "cast_int32_f32", "cast_f32_f8e4m3fn",
           "cast_f32_f8e4m3fn_f32", "cast_f32_f8e5m2", "cast_f32_f8e5m2_f32", "cast_bf16_f32", "int_div_rem",
           "int_div_edge", "mul_add_f32", "tanh_bf16", "add_mul_bf16", "sum_bf16_bf16out_64x1024"):
  BOUNDS[_n] = ("identical", 0, "exact integer arithmetic / the chip's conversion rules / no FMA")
BOUNDS.update({
    "exp_f32": ("ulp", 96, "the chip's exp is ~exp2(x*log2(e)) with the product rounded: 88 ulp at x~76"),
    "log_f32": ("ulp", 4096, "the chip's log loses relative accuracy near 1 (3938 ulp at 1.28)"),
    "log2_f32": ("ulp", 4608, "as log: 4473 ulp near 1"),
    "tanh_f32": ("ulp", 1024, "974 ulp near 0.014 (the chip's tanh approximation)"),
    "sigmoid_f32": ("ulp", 192, "180 ulp at 5e-36 (1/(1+exp(-x)) with the chip's reciprocal)"),
    "sin_f32": ("ulp", 4, "3 ulp"), "cos_f32": ("ulp", 4, "3 ulp"),
    "sqrt_f32": ("ulp", 2, "2 ulp: the chip's sqrt is not correctly rounded"),
    "rsqrt_f32": ("ulp", 2, "2 ulp"),
    "reciprocal_f32": ("ulp", 192, "180 ulp for |1/x| near 1e-36 (reciprocal of huge x)"),
    "pl_reciprocal_f32": ("ulp", 192, "as reciprocal_f32"),
    "pl_reciprocal_approx_f32": ("ulp", 192, "the EUP approximation: 189 ulp (rel 1.6e-5)"),
    "erf_f32": ("ulp", 8, "6 ulp"),
    "square_plus_fma_f32": ("ulp", 0, "no FMA: identical but for NaN bits (-inf + inf)"),
    "pow_f32": ("ulp", 128, "117 ulp (exp2(y*log2(x)) on the chip)"),
    "div_f32": ("ulp", 2, "2 ulp: the chip's divide is reciprocal-and-multiply"),
    "exp_bf16": ("ulp", 1, "1 bf16 ulp on 2 of 10240 values (f32 exp error crosses a bf16 rounding)"),
    "silu_bf16": ("ulp", 4, "3 bf16 ulp: the chip computes sigmoid in f32 differently"),
    "gelu_tanh_bf16": ("ulp", 0, "identical but for NaN bits"),
    "softmax_f32_16x1024": ("ulp", 96, "exp's 92 ulp at tiny results"),
    "softmax_manual_f32_16x1024": ("ulp", 96, "exp's 92 ulp at tiny results"),
    "max_min_f32_32x1024": ("ulp", 0, "values identical; the chip orders -0 < +0 in max/min (2 zero-sign gaps)"),
    "sum_f32_256x1024": ("sum", 1.0, "f32 sums in the chip's order (lane tree); palace in NumPy's order"),
    "sum_bf16_f32acc_64x1024": ("sum", 1.0, "as sum_f32"),
    "exp2_f32": ("ulp", 64, "52 ulp at 3e-27 (the chip's exp2 approximation); palace computes exp2 itself "
                 "(np.exp2, not exp(x*ln2)), so 2^-126 is the smallest normal on both and denormal "
                 "results flush to 0 on both"),
    "log1p_f32": ("ulp", 4096, "4005 ulp near x = 0.28 (the chip's log inaccuracy, as log_f32); palace "
                  "computes log1p itself (np.log1p, not log(1 + x), which loses tiny x: the chip gives "
                  "5.85e-8 for x = 5.85e-8) with denormal inputs read as signed zero, as the chip reads them"),
    "denormal_f32": ("gap", 0, "Mosaic folds x*1+0 to x (keeps denormals and -0); palace.jax computes it "
                     "under XLA CPU's flush-to-zero"),
    "expm1_f32": ("both errors", 0, "no expm1 in the Pallas TPU lowering (chip, JAX 0.10.2: 'Unimplemented "
                  "primitive in Pallas TPU lowering for tc: expm1'; JAX 0.12 has no rule either)"),
    "cumsum_f32_64x128": ("both errors", 0, "no cumsum lowering on the chip (JAX 0.10.2 and 0.12)"),
    "cumsum_f32_axis0_64x128": ("both errors", 0, "as cumsum_f32_64x128"),
})

def _ordered(a: np.ndarray) -> np.ndarray:
  """Float bit patterns mapped to integers that are monotonic in the value (+0 and -0 both 0)."""
  width = a.dtype.itemsize
  bits = a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]).astype(np.int64)
  sign = np.int64(1) << (8 * width - 1)
  mag = bits & (sign - 1)
  return np.where(bits & sign, -mag, mag)


def diff_stats(chip: np.ndarray, sim: np.ndarray) -> dict:
  """Bit identity, max ulp difference, max relative error, count of differing elements."""
  if chip.shape != sim.shape or chip.dtype != sim.dtype:
    return {"identical": False, "max_ulp": None, "max_rel": None, "n_diff": None, "n": int(chip.size),
            "note": f"shape/dtype {chip.shape} {chip.dtype} vs {sim.shape} {sim.dtype}"}
  width = chip.dtype.itemsize
  ubits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
  identical_mask = chip.view(ubits) == sim.view(ubits)
  n_diff = int((~identical_mask).sum())
  out = {"identical": n_diff == 0, "n_diff": n_diff, "n": int(chip.size), "note": ""}
  if np.issubdtype(chip.dtype, np.integer) or chip.dtype == np.bool_:
    c, s = chip.astype(np.int64), sim.astype(np.int64)
    d = np.abs(c - s)
    out["max_ulp"] = int(d.max()) if d.size else 0
    out["max_rel"] = float((d / np.maximum(np.abs(c), 1)).max()) if d.size else 0.0
    return out
  with np.errstate(invalid="ignore"):
    c64, s64 = chip.astype(np.float64), sim.astype(np.float64)
  cn, sn = np.isnan(c64), np.isnan(s64)
  nan_mismatch = int((cn != sn).sum())
  both = ~cn & ~sn
  ulp = np.abs(_ordered(chip) - _ordered(sim))[both]
  out["max_ulp"] = float("inf") if nan_mismatch else (int(ulp.max()) if ulp.size else 0)
  with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
    cf, sf = c64[both], s64[both]
    same = cf == sf  # incl. equal infinities
    tiny = float(np.finfo(np.float32).tiny) if width >= 4 else 6.1e-5
    rel = np.where(same, 0.0, np.abs(cf - sf) / np.maximum(np.abs(cf), tiny))
    rel = np.where(np.isnan(rel), np.inf, rel)
  out["max_rel"] = float("inf") if nan_mismatch else (float(rel.max()) if rel.size else 0.0)
  notes = []
  if nan_mismatch:
    notes.append(f"{nan_mismatch} NaN mismatches")
  nan_bits = int((cn & sn & ~identical_mask).sum())
  if nan_bits:
    notes.append(f"{nan_bits} NaNs with other bits")
  zero_sign = int((both & (c64 == 0) & (s64 == 0) & ~identical_mask).sum())
  if zero_sign:
    notes.append(f"{zero_sign} zero-sign differences")
  if n_diff and ulp.size:
    i = int(np.argmax(np.abs(_ordered(chip) - _ordered(sim)) * both))
    flat_c, flat_s = chip.ravel(), sim.ravel()
    notes.append(f"worst at {i}: chip {flat_c[i]!r} palace {flat_s[i]!r}")
  out["note"] = "; ".join(notes)
  return out


def compare(records, dot_numerics: str = "blas") -> list[dict]:
  """Recomputes every record on palace's virtual v5e (VirtualTPU(dot_numerics=...)) and compares with
  its recorded output."""
  import palace.jax  # noqa: PLC0415  (only on the palace side; the chip has no palace)

  by_name = {p.name: p for p in PROBES}
  results = []
  for rec in records:
    name = rec["name"]
    res = {"name": name, "what": rec.get("what", ""), "chip_error": rec.get("error"), "palace_error": None,
           "status": None, "identical": None, "max_ulp": None, "max_rel": None, "n_diff": None, "n": None,
           "note": ""}
    results.append(res)
    p = by_name.get(name)
    if p is None:
      res["status"] = "unknown probe"
      continue
    dtypes = rec.get("dtypes") or {}
    if rec.get("inputs"):
      inputs = {k: decode(v, dtypes.get(k)) for k, v in rec["inputs"].items()}
    else:
      inputs = p.inputs()
    sim = None
    try:
      with palace.jax.virtual_tpu("v5e", dot_numerics=dot_numerics):
        sim = run_probe(p, inputs, interpret=False)
    except Exception as e:  # noqa: BLE001
      res["palace_error"] = _first_line(e)
    if rec.get("error") is not None or rec.get("output") is None:
      res["status"] = "both errors" if res["palace_error"] else "chip error, palace runs"
      continue
    if res["palace_error"]:
      res["status"] = "palace error"
      continue
    chip = decode(rec["output"], dtypes.get("output"))
    res.update(diff_stats(chip, sim))
    res["status"] = "identical" if res["identical"] else "differs"
    if BOUNDS.get(name, ("",))[0] in ("dot", "sum") and not res["identical"]:
      res["scaled"] = scaled_error(name, rec, chip, sim)
  for res in results:
    res["outcome"] = classify(res)
  return results


def load(path: str) -> list[dict]:
  """The probe records of a data file (its first line, the environment record, is skipped)."""
  with open(path) as f:
    return [r for r in (json.loads(line) for line in f if line.strip()) if "name" in r]


def _fmt(v):
  if v is None:
    return "-"
  if isinstance(v, float):
    if v == float("inf"):
      return "inf"
    return f"{v:.3g}"
  return str(v)


def report(results, out=sys.stdout):
  w = max(len(r["name"]) for r in results) if results else 10
  print(f"{'probe':{w}s}  {'status':24s} {'outcome':14s} {'max_ulp':>8s} {'max_rel':>9s} {'n_diff':>12s}  note", file=out)
  for r in results:
    nd = "-" if r["n_diff"] is None else f"{r['n_diff']}/{r['n']}"
    note = r["note"]
    if r["chip_error"]:
      note = f"chip: {r['chip_error'][:120]}"
      if r["palace_error"]:
        note += f" | palace: {r['palace_error'][:120]}"
    elif r["palace_error"]:
      note = f"palace: {r['palace_error'][:160]}"
    ulp, rel = _fmt(r["max_ulp"]), _fmt(r["max_rel"])
    print(f"{r['name']:{w}s}  {r['status']:24s} {r.get('outcome') or '':14s} {ulp:>8s} {rel:>9s} {nd:>12s}  "
          f"{note}", file=out)
  counts = {}
  for r in results:
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  print("status: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), file=out)
  outside = [r["name"] for r in results if r.get("outcome") == "outside bound"]
  n = {k: sum(r.get("outcome") == k for r in results) for k in ("identical", "within bound", "outside bound")}
  print(f"summary: {n['identical']} identical, {n['within bound']} within bound, {n['outside bound']} outside "
        f"bound ({len(results)} probes){': ' + ', '.join(outside) if outside else ''}", file=out)


def _operands(name, rec):
  """The matmul operands as the MXU reads them (float64), for a dot probe's bound."""
  import ml_dtypes  # noqa: PLC0415
  dtypes = rec.get("dtypes") or {}
  a = decode(rec["inputs"]["a"], dtypes.get("a")).astype(np.float32)
  b = decode(rec["inputs"]["b"], dtypes.get("b")).astype(np.float32)
  if "_nt_" in name:
    b = b.T
  if "highest" not in name:
    a = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    b = b.astype(ml_dtypes.bfloat16).astype(np.float32)
  return a.astype(np.float64), b.astype(np.float64)


def scaled_error(name, rec, chip, sim) -> float:
  """max |chip - palace| / (K u sum|terms|): a dot's or a sum's difference in units of the float32
  summation error bound of its terms (1.0 = any summation order's worst case)."""
  if BOUNDS[name][0] == "dot":
    a, b = _operands(name, rec)
    k = a.shape[1]
    scale = np.abs(a) @ np.abs(b)
  else:
    x = decode(rec["inputs"]["x"], (rec.get("dtypes") or {}).get("x")).astype(np.float64)
    scale = np.concatenate([np.abs(x).sum(-1, keepdims=True).ravel(), np.abs(x).sum(0, keepdims=True).ravel()])
    k = max(x.shape)
  d = np.abs(chip.astype(np.float64).ravel() - sim.astype(np.float64).ravel()) / (k * U24 * scale.ravel())
  return float(np.nanmax(d))


def classify(res: dict, rec: dict | None = None, chip=None, sim=None) -> str:
  """"identical", "within bound" or "outside bound" for one compare() result."""
  kind, bound, _ = BOUNDS.get(res["name"], ("gap", 0, ""))
  if res["status"] == "identical":
    return "identical"
  if kind == "both errors":
    return "within bound" if res["status"] == "both errors" else "outside bound"
  if res["status"] != "differs":
    return "outside bound"
  if kind == "ulp":
    return "within bound" if res["max_ulp"] is not None and res["max_ulp"] <= bound else "outside bound"
  if kind in ("dot", "sum") and res.get("scaled") is not None:
    return "within bound" if res["scaled"] <= bound else "outside bound"
  return "outside bound"
