"""Run tokamax's real gmm_v2 (PyPI tokamax) on palace.jax's virtual TPU.

Needs JAX 0.12.0.1 and tokamax (PyPI, 0.0.17 measured) in a venv of their own (tokamax pulls qwix,
xprof, ...; pin jax with a constraints file), palace on the path; not part of the test suite or CI
(docs/validation.md, "tokamax's own gmm_v2"):

  python3.12 -m venv .venv-tk && .venv-tk/bin/pip install -c <(echo jax==0.12.0.1) jax==0.12.0.1 tokamax
  JAX_PLATFORMS=cpu PYTHONPATH=$PWD .venv-tk/bin/python -m benchmarks.tokamax_gmm check
  JAX_PLATFORMS=cpu PYTHONPATH=$PWD .venv-tk/bin/python -m benchmarks.tokamax_gmm time \
      [--only M:G:K:N] [--chips 7x,v6e,v5p] [--lhs-buffers pr|tokamax] [--tile-m 128,256]

(The 262144 x 7168 points hold about 19 GB: the JAX operands and the copies XLA hands the callback.)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import palace.jax  # noqa: E402
try:
  from tokamax._src.ops.gmm_v2 import gmm_v2 as G  # noqa: E402
except ImportError:
  sys.exit("benchmarks.tokamax_gmm needs tokamax (pip install tokamax next to jax==0.12.0.1; see the "
           "module docstring)")

POINTS = [  # (m, groups, k, n): published t128/t256 for (7x, v6e, v5p)
    ((65536, 128, 3072, 2048), {"7x": 1.31, "v6e": 1.30, "v5p": 1.02}),
    ((65536, 128, 3072, 512), {"7x": 1.59, "v6e": 1.29, "v5p": 1.05}),
    ((262144, 256, 7168, 1024), {"7x": 1.22, "v6e": 1.06, "v5p": 1.02}),
    ((16384, 128, 3072, 2048), {"7x": 1.00, "v6e": 1.00, "v5p": 0.56}),
]

CHOSEN = {}   # (chip, shape, tile_m) -> (TileSizes, vmem_limit)


def vmem_estimate(tm, tn, tk, lhs_buffer_count=2):
  """tokamax calculate_tiling's _gmm_vmem_estimate for bf16 lhs/rhs/out, f32 acc, no quant/bias/act."""
  return lhs_buffer_count * tm * tk * 2 + 3 * tk * tn * 2 + tm * tn * 4 + 2 * tm * tn * 2


def forced_tile_fn(tile_m: int, lhs_buffers: str, key):
  """A tokamax TileFn: tile_k / tile_n from tokamax's own calculate_tiling (called with the real
  dims/configs and vmem limit), tile_m forced (bucket_base = tile_m: one bucket, a fixed tile height).
  lhs_buffers: 'pr' = 2 (the kernel at the PR's commit 5bd37bf had no lhs_buffer_count: LHS
  double-buffered); 'tokamax' = 0.0.17's rule (3 when its estimate at tile_m fits, else 2)."""
  def fn(dims, lhs_cfgs, rhs_cfgs, vmem_limit_bytes, fuse_act=None):
    base = G.calculate_tiling(dims, lhs_cfgs, rhs_cfgs, vmem_limit_bytes, fuse_act)
    tk, tn = base.tile_k, base.tile_n
    if vmem_estimate(tile_m, tn, tk) > vmem_limit_bytes:
      raise ValueError(f"forced tile_m={tile_m} does not fit with tk={tk} tn={tn}")
    if lhs_buffers == "pr":
      nbuf = 2
    else:
      nbuf = 3 if vmem_estimate(tile_m, tn, tk, 3) <= vmem_limit_bytes else 2
    tiles = G.TileSizes(tile_m=tile_m, tile_k=tk, tile_n=tn, bucket_base=tile_m,
                        lhs_buffer_count=nbuf)
    CHOSEN[key] = (tiles, vmem_limit_bytes, base)
    return tiles
  return fn


def balanced_sizes(m, g):
  assert m % g == 0
  return np.full((g,), m // g, np.int32)


def reference(lhs, rhs, sizes):
  lhs32, rhs32 = np.asarray(lhs, np.float32), np.asarray(rhs, np.float32)
  out = np.zeros((lhs.shape[0], rhs.shape[2]), np.float32)
  off = 0
  for gi, s in enumerate(sizes):
    out[off:off + s] = lhs32[off:off + s] @ rhs32[gi]
    off += s
  return out


def run(chip, m, g, k, n, tile_m, *, timing_only, lhs_buffers="pr", data=True, sizes=None,
        vmem_limit_bytes=None, arrays=None):
  key = (chip, (m, g, k, n), tile_m)
  tile_fn = forced_tile_fn(tile_m, lhs_buffers, key)
  sizes = balanced_sizes(m, g) if sizes is None else np.asarray(sizes, np.int32)
  if arrays is not None:
    lhs, rhs = arrays
  elif data:
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((m, k), np.float32), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n), np.float32), jnp.bfloat16)
  else:
    lhs = jnp.zeros((m, k), jnp.bfloat16)
    rhs = jnp.zeros((g, k, n), jnp.bfloat16)
  gs = jnp.asarray(sizes)
  t0 = time.perf_counter()
  with palace.jax.virtual_tpu(chip, timing_only=timing_only) as tpu:
    out = G.gmm_v2(lhs, rhs, gs, tile_info=tile_fn, vmem_limit_bytes=vmem_limit_bytes)
    out = np.asarray(out.block_until_ready()) if not timing_only else None
  wall = time.perf_counter() - t0
  res = dict(out=out, sizes=sizes, reports=list(tpu.reports), wall=wall, tiles=CHOSEN.get(key))
  if not timing_only:
    res.update(lhs=lhs, rhs=rhs)
  del lhs, rhs, out
  return res


def check(args):
  cases = [("v5p", 1024, 4, 512, 256, None, None), ("7x", 1024, 4, 512, 256, None, None),
           ("v6e", 1024, 4, 512, 256, None, None),
           # ragged groups (not tile-aligned, one empty group): the BoundedSlice / partial-row path
           ("v5p", 1024, 4, 512, 256, [100, 0, 500, 424], None),
           ("7x", 1024, 4, 512, 256, [37, 300, 611, 76], None),
           # a small VMEM limit: tokamax splits N, then K (several k steps: the accumulator path)
           ("v5p", 1024, 4, 2048, 512, [300, 200, 12, 512], 4 * 2**20)]
  ok = True
  for chip, m, g, k, n, sizes, limit in cases:
    for tm in (128, 256):
      r = run(chip, m, g, k, n, tm, timing_only=False, sizes=sizes, vmem_limit_bytes=limit)
      ref = reference(r["lhs"], r["rhs"], r["sizes"])
      got = r["out"].astype(np.float32)
      err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
      # against the f32 reference rounded to bf16 (the kernel's output dtype), in bf16 ulps of |ref|
      ref16 = ref.astype(jnp.bfloat16).astype(np.float32)
      ulp = np.maximum(np.abs(ref16), 1e-30) * 2.0**-7
      ulps = np.max(np.abs(got - ref16) / ulp)
      print(f"  max |out - bf16(ref)| = {ulps:.2f} bf16 ulps; exact bf16 matches "
            f"{np.mean(got == ref16) * 100:.1f}%")
      good = err < 1e-2 and got.shape == ref.shape and ulps <= 2
      ok &= good
      t = sum(x.device_time_s for x in r["reports"])
      tiles = r["tiles"][0]
      print(f"{chip:4s} m={m} g={g} k={k} n={n} sizes={list(r['sizes'])} tile_m={tm}: max|err|/max|ref|="
            f"{err:.2e} {'OK' if good else 'WRONG'}; launches={len(r['reports'])} device {t * 1e6:.2f} us; "
            f"tk={tiles.tile_k} tn={tiles.tile_n} lhs_buf={tiles.lhs_buffer_count}; wall {r['wall']:.1f} s",
            flush=True)
  print("ALL OK" if ok else "SOME WRONG")
  return 0 if ok else 1


def detail(rep):
  """One line of a report's figures: cycles, HBM bytes, DMA counts/bytes by direction, unit busy cycles."""
  busy = {k: int(v) for k, v in sorted(rep.unit_busy_cycles.items())}
  return (f"    cycles={rep.device_cycles} flops={rep.flops:.4g} hbm_bytes={rep.hbm_bytes:.4g} "
          f"dma_count={rep.dma_count} grid_steps={rep.grid_steps} "
          f"vmem_peak={rep.vmem_peak_bytes / 2**20:.2f}MiB "
          f"bound={rep.bound}\n    dma_count_by_dir={rep.dma_count_by_direction} "
          f"dma_bytes_by_dir={ {k: f'{v:.4g}' for k, v in rep.dma_bytes_by_direction.items()} }\n"
          f"    unit_busy_cycles={busy}")


def consistency(args):
  """timing_only=True against timing_only=False (with data) on the same moderate shapes."""
  for chip, m, g, k, n in (("v5p", 4096, 8, 1024, 512), ("7x", 4096, 32, 1024, 512),
                           ("v6e", 8192, 16, 2048, 1024)):
    for tm in (128, 256):
      a = run(chip, m, g, k, n, tm, timing_only=False)
      b = run(chip, m, g, k, n, tm, timing_only=True, data=False)
      ra, rb = a["reports"][0], b["reports"][0]
      print(f"{chip} ({m},{g},{k},{n}) tile_m={tm}: with data {ra.device_cycles} cycles, timing_only "
            f"{rb.device_cycles} cycles ({'SAME' if ra.device_cycles == rb.device_cycles else 'DIFFERENT'}); "
            f"dma {ra.dma_count} vs {rb.dma_count}, hbm {ra.hbm_bytes} vs {rb.hbm_bytes}; "
            f"wall {a['wall']:.1f} / {b['wall']:.1f} s", flush=True)
      print(detail(ra))
      print(detail(rb))


def time_points(args):
  chips = args.chips.split(",")
  tms = [int(x) for x in args.tile_m.split(",")]
  rows = []
  for (m, g, k, n), pub in POINTS:
    if args.only and f"{m}:{g}:{k}:{n}" not in args.only.split(","):
      continue
    # one set of (undefined-content) operands per shape, reused: a 262144 x 7168 bf16 LHS and the
    # 256 x 7168 x 1024 RHS are 3.5 GiB each, and XLA hands the callback a copy of each
    arrays = None
    arrays = (jnp.zeros((m, k), jnp.bfloat16), jnp.zeros((g, k, n), jnp.bfloat16))
    for chip in chips:
      ts = {}
      for tm in tms:
        r = run(chip, m, g, k, n, tm, timing_only=True, lhs_buffers=args.lhs_buffers, data=False,
                arrays=arrays)
        t = sum(x.device_time_s for x in r["reports"])
        ts[tm] = t
        tiles, limit, base = r["tiles"]
        print(f"{chip:4s} ({m},{g},{k},{n}) tile_m={tm}: {len(r['reports'])} launch(es), device "
              f"{t * 1e6:.1f} us, wall {r['wall']:.1f} s; tiles tk={tiles.tile_k} tn={tiles.tile_n} "
              f"lhs_buf={tiles.lhs_buffer_count} vmem_limit={limit} ({limit / 2**20:.1f} MiB); "
              f"tokamax default would be tile_m={base.tile_m} bucket_base={base.bucket_base} "
              f"lhs_buf={base.lhs_buffer_count}", flush=True)
        if args.verbose:
          for rep in r["reports"]:
            print(rep, flush=True)
            print(detail(rep), flush=True)
      if len(tms) == 2:
        ratio = ts[tms[0]] / ts[tms[1]]
        rows.append((chip, (m, g, k, n), ts[tms[0]], ts[tms[1]], ratio, pub[chip]))
        print(f"  RATIO {chip} ({m},{g},{k},{n}): {ratio:.3f} published {pub[chip]:.2f} "
              f"diff {ratio - pub[chip]:+.3f}", flush=True)
  print("\n| chip | (m, g, k, n) | t128 us | t256 us | ratio | published | diff |")
  print("|---|---|---|---|---|---|---|")
  for chip, shp, a, b, ratio, pub in rows:
    print(f"| {chip} | {shp} | {a * 1e6:.1f} | {b * 1e6:.1f} | {ratio:.3f} | {pub:.2f} | "
          f"{ratio - pub:+.3f} |")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("mode", choices=["check", "time", "consistency"])
  p.add_argument("--only", default="")
  p.add_argument("--chips", default="7x,v6e,v5p")
  p.add_argument("--tile-m", default="128,256")
  p.add_argument("--lhs-buffers", default="pr", choices=["pr", "tokamax"])
  p.add_argument("--verbose", action="store_true")
  args = p.parse_args()
  print(f"jax {jax.__version__}, tokamax {__import__('importlib.metadata').metadata.version('tokamax')}",
        flush=True)
  if args.mode == "check":
    sys.exit(check(args))
  if args.mode == "consistency":
    return consistency(args)
  time_points(args)


if __name__ == "__main__":
  main()
