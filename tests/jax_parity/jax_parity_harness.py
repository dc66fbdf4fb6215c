"""Run one kernel case in both import worlds: real JAX (TPU interpret mode) and palace (load_module)."""
from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import numpy as np

import palace as pl
import palace.compat

KERNELS = Path(__file__).parent / "kernels"


def case_names(fname: str) -> list[str]:
  src = (KERNELS / fname).read_text().splitlines()
  return [ln[4:ln.index("(")] for ln in src if ln.startswith("def case_")]


_jax_mods: dict = {}
_palace_mods: dict = {}


def jax_module(fname):
  if fname not in _jax_mods:
    spec = importlib.util.spec_from_file_location(f"jax_parity_{Path(fname).stem}", KERNELS / fname)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _jax_mods[fname] = mod
  return _jax_mods[fname]


def palace_module(fname):
  if fname not in _palace_mods:
    _palace_mods[fname] = palace.compat.load_module(KERNELS / fname)
  return _palace_mods[fname]


def run_jax(fname, case):
  import jax
  from jax.experimental.pallas import tpu as pltpu
  mod = jax_module(fname)
  pltpu.reset_tpu_interpret_mode_state()   # JAX's simulated memory/semaphores persist across calls
  params = pltpu.InterpretParams(dma_execution_mode="eager")
  with contextlib.ExitStack() as st:
    st.enter_context(pltpu.force_tpu_interpret_mode(params))
    if getattr(mod, "ABSTRACT_MESH", False):
      dev = jax.sharding.AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
      st.enter_context(jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=dev)))
    fn, args, tol = getattr(mod, case)()
    out = jax.block_until_ready(fn(*args))
  return jax.tree_util.tree_map(np.asarray, out), tol


def run_palace(fname, case, chip="v5e"):
  mod = palace_module(fname)
  with pl.virtual_tpu(chip, num_chips=getattr(mod, "NUM_DEVICES", 1)) as tpu:
    fn, args, tol = getattr(mod, case)()
    out = fn(*args)
  return out, tol, tpu


def flat(out):
  if isinstance(out, (list, tuple)):
    return [y for x in out for y in flat(x)]
  if isinstance(out, dict):
    return [y for k in sorted(out) for y in flat(out[k])]
  return [np.asarray(out)]


def compare(a, b, tol):
  fa, fb = flat(a), flat(b)
  assert len(fa) == len(fb), f"{len(fa)} JAX outputs vs {len(fb)} palace outputs"
  for i, (x, y) in enumerate(zip(fa, fb)):
    assert x.shape == y.shape and x.dtype == y.dtype, f"output {i}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
    if tol is None:
      np.testing.assert_array_equal(x, y, err_msg=f"output {i} not bit-identical")
    else:
      np.testing.assert_allclose(x.astype(np.float32), y.astype(np.float32), rtol=tol[0], atol=tol[1],
                                 err_msg=f"output {i}")
