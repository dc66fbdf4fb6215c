"""Which TPU kernels shipped inside the jax wheel run unmodified on palace, and do they match JAX?

Each kernel module of `jax/experimental/pallas/ops/tpu/` is loaded twice: by JAX itself (run under its
TPU interpret mode, `force_tpu_interpret_mode(InterpretParams(dma_execution_mode="eager"))`) and by
`palace.compat.load_module` (run on a virtual TPU). Both get the same small NumPy inputs; the outputs
are compared. Needs JAX 0.12 (Python >= 3.12):

    .venv-jax/bin/python benchmarks/compat_report.py [--write docs/compat.md] [--only NAME ...]

Prints a Markdown table; --write replaces the table between the markers in docs/compat.md.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import numpy as np  # noqa: E402

import palace as pl  # noqa: E402
import palace.compat  # noqa: E402

OPS = "jax.experimental.pallas.ops.tpu"
R = np.random.default_rng(0)


def _normal(*shape, dtype=np.float32):
  return R.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------ cases: (mod, jax) -> output
def matmul(m, jax):
  x, y = _normal(256, 512), _normal(512, 256)
  return m.matmul(x, y, block_shape=(128, 128), block_k=256)


def all_gather(m, jax):
  mesh = jax.make_mesh((4,), ("x",))
  x = np.arange(4 * 16 * 128, dtype=np.float32).reshape(64, 128)
  xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
  return m.all_gather(xs, mesh=mesh, axis_name="x")


def flash_attention(m, jax):
  q, k, v = _normal(1, 2, 256, 128), _normal(1, 2, 256, 128), _normal(1, 2, 256, 128)
  return m.flash_attention(q, k, v, causal=True, sm_scale=0.125)


def paged_attention(m, jax):
  batch, heads, kv_heads, d, page, pages, per_seq = 2, 4, 2, 128, 16, 8, 4
  q = _normal(batch, heads, d)
  kp, vp = _normal(kv_heads, pages, page, d), _normal(kv_heads, pages, page, d)
  lengths = np.array([37, 64], np.int32)
  idx = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
  return m.paged_attention(q, kp, vp, lengths, idx, pages_per_compute_block=2)


def ragged_paged_attention(m, jax):
  heads, kv_heads, d, page, pages, per_seq = 4, 2, 128, 16, 16, 4
  q = _normal(32, heads, d)
  kv = _normal(pages, page, 2 * kv_heads, d)
  kv_lens = np.array([40, 20, 0, 0], np.int32)
  page_indices = np.arange(16, dtype=np.int32).reshape(4, per_seq)
  cu_q_lens = np.array([0, 24, 32, 32, 32], np.int32)
  return m.ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, np.array([2], np.int32),
                                  sm_scale=0.1, num_kv_pages_per_block=2, num_queries_per_block=8)


def ragged_paged_attention_ref(m, jax):
  """The module's own pure-JAX reference on the same inputs (JAX's interpreter cannot run the kernel)."""
  heads, kv_heads, d, page, pages, per_seq = 4, 2, 128, 16, 16, 4
  q = _normal(32, heads, d)
  kv = _normal(pages, page, 2 * kv_heads, d)
  kv_lens = np.array([40, 20, 0, 0], np.int32)
  page_indices = np.arange(16, dtype=np.int32).reshape(4, per_seq)
  cu_q_lens = np.array([0, 24, 32, 32, 32], np.int32)
  out = m.ref_ragged_paged_attention(q, kv, kv_lens, page_indices, cu_q_lens, np.array([2], np.int32),
                                     sm_scale=0.1)
  return np.asarray(out)[:32]


def megablox_gmm(m, jax):
  lhs, rhs = _normal(512, 256), _normal(3, 256, 128)
  sizes = np.array([128, 256, 128], np.int32)
  return m.gmm(lhs, rhs, sizes, np.float32, (128, 128, 128))


def splash_attention(m, jax):
  heads, seq, d = 2, 256, 128
  mask = m.MultiHeadMask([m.CausalMask((seq, seq)) for _ in range(heads)])
  bs = m.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128,
                    block_kv_dkv=128, block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
  kernel = m.make_splash_mha_single_device(mask, block_sizes=bs)
  q, k, v = _normal(heads, seq, d), _normal(heads, seq, d), _normal(heads, seq, d)
  return kernel(q, k, v)


REFERENCES = {"ragged_paged_attention": ragged_paged_attention_ref}

CASES = [  # name, module, case, chips, tolerance (rtol, atol) or None for bit-identical
    ("matmul", f"{OPS}.matmul", matmul, 1, (1e-5, 1e-4)),
    ("all_gather", f"{OPS}.all_gather", all_gather, 4, None),
    ("flash_attention", f"{OPS}.flash_attention", flash_attention, 1, (1e-5, 1e-5)),
    ("paged_attention", f"{OPS}.paged_attention", paged_attention, 1, (1e-5, 1e-5)),
    ("ragged_paged_attention", f"{OPS}.ragged_paged_attention", ragged_paged_attention, 1, (1e-5, 1e-5)),
    ("megablox gmm", f"{OPS}.megablox", megablox_gmm, 1, (1e-5, 1e-4)),
    ("splash_attention", f"{OPS}.splash_attention", splash_attention, 1, (1e-5, 1e-5)),
]


def _reason(e: BaseException) -> str:
  tb = traceback.extract_tb(e.__traceback__)
  where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                if "/ops/tpu/" in f.filename), "")
  msg = re.sub(r"\s+", " ", str(e)).strip().replace("|", "\\|")
  if "CpuCallback error" in msg or "calling buffer callback" in msg:
    # XLA wraps errors raised in palace.jax's host callback; keep the last line (the real error)
    msg = str(e).strip().splitlines()[-1]
  if len(msg) > 300:
    msg = msg[:297] + "..."
  return f"`{type(e).__name__}` at {where}: {msg}" if where else f"`{type(e).__name__}`: {msg}"


def run_jax(modname, case):
  import jax
  from jax.experimental.pallas import tpu as pltpu
  pltpu.reset_tpu_interpret_mode_state()
  mod = importlib.import_module(modname)
  with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(dma_execution_mode="eager")):
    out = jax.block_until_ready(case(mod, jax))
  return jax.tree_util.tree_map(np.asarray, out)


def run_palace(modname, case, chips):
  mod = palace.compat.load_module(modname)
  with pl.virtual_tpu("v5e", num_chips=chips) as tpu:
    out = case(mod, mod.__palace_compat__.modules["jax"])
  return out, tpu


def _leaves(x):
  if isinstance(x, (list, tuple)):
    return [y for v in x for y in _leaves(v)]
  return [np.asarray(x)]


def check(name, modname, case, chips, tol):
  global R
  row = dict(kernel=name, module=modname.replace(OPS + ".", ""))
  R = np.random.default_rng(0)
  try:
    want = run_jax(modname, case)
    row["jax"] = "ok"
  except Exception as e:  # noqa: BLE001
    want, row["jax"] = None, "fails: " + _reason(e)
    if name in REFERENCES:
      import jax
      R = np.random.default_rng(0)
      want = REFERENCES[name](importlib.import_module(modname), jax)
      row["jax"] += " (palace compared with the module's pure-JAX reference instead)"
  R = np.random.default_rng(0)
  t = time.perf_counter()
  try:
    got, tpu = run_palace(modname, case, chips)
    row["palace"] = "runs"
    row["launches"] = len(tpu.reports)
    row["device_us"] = sum(r.device_time_s for r in tpu.reports) * 1e6 if tpu.reports else 0.0
  except Exception as e:  # noqa: BLE001
    got, row["palace"] = None, "fails"
    row["reason"] = _reason(e)
  row["wall_s"] = time.perf_counter() - t
  if got is not None and want is not None:
    a, b = _leaves(want), _leaves(got)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
      row["match"] = f"no (structure {[x.shape for x in a]} vs {[y.shape for y in b]})"
    else:
      err = max(float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
                for x, y in zip(a, b))
      exact = all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))
      ok = exact or (tol is not None and all(np.allclose(x.astype(np.float32), y.astype(np.float32),
                                                         rtol=tol[0], atol=tol[1]) for x, y in zip(a, b)))
      row["match"] = "bit-identical" if exact else (f"yes (max abs diff {err:.2e})" if ok else
                                                    f"NO (max abs diff {err:.2e})")
  return row


def table(rows) -> str:
  out = ["| kernel | module | JAX interpret | palace | matches JAX | launches | modelled device time (v5e) | "
         "reason it does not run yet |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    dev = f"{r['device_us']:.1f} us" if "device_us" in r else "-"
    out.append(f"| {r['kernel']} | `{r['module']}` | {r['jax']} | {r['palace']} | {r.get('match', '-')} | "
               f"{r.get('launches', '-')} | {dev} | {r.get('reason', '')} |")
  return "\n".join(out)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--write", help="Markdown file whose table (between the markers) is replaced.")
  ap.add_argument("--only", nargs="*", help="Kernel names to check.")
  args = ap.parse_args()
  try:
    import jax  # noqa: F401
  except ImportError:
    sys.exit("compat_report needs JAX 0.12 (Python >= 3.12): run it with .venv-jax/bin/python.")
  rows = []
  for name, mod, case, chips, tol in CASES:
    if args.only and name not in args.only:
      continue
    rows.append(check(name, mod, case, chips, tol))
    print(f"{name}: palace {rows[-1]['palace']}, match {rows[-1].get('match', '-')}", file=sys.stderr)
  md = table(rows)
  print(md)
  if args.write:
    p = Path(args.write)
    text = p.read_text()
    a, b = "<!-- compat-table:begin -->", "<!-- compat-table:end -->"
    p.write_text(text[:text.index(a) + len(a)] + "\n" + md + "\n" + text[text.index(b):])


if __name__ == "__main__":
  main()
