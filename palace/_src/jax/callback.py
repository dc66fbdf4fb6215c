"""The lowering of one palace-run `pallas_call`: a single host callback for the whole launch.

Before emitting it, the kernel's jaxpr (and its index maps) are checked for primitives the interpreter
does not cover, so an UnsupportedError is raised while lowering, in the caller's thread, naming the
primitive and the kernel line. Errors raised later inside the callback (out-of-bounds, races, ...) reach
the caller wrapped by XLA in a JaxRuntimeError; the Engine keeps the original and `virtual_tpu`'s exit
re-raises it, so `pytest.raises(pl.OutOfBoundsError)` around the `with` block works.
"""
from __future__ import annotations

import numpy as np

from palace._src.errors import UnsupportedError


def lower_on_palace(ctx, in_nodes, engine, params, kind: str = "pallas_call"):
  """Lower one launch (`pallas_call` or `mpmd_map`, i.e. pl.kernel / core_map) to one host callback."""
  import jax  # noqa: PLC0415
  from jax._src import core as jax_core  # noqa: PLC0415
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from palace._src.jax.interpret import check_covered  # noqa: PLC0415
  from palace._src.jax import launch  # noqa: PLC0415

  if any(not isinstance(a, jax_core.ShapedArray) for a in ctx.avals_in):
    raise UnsupportedError(f"palace.jax: a {kind} operand that is not an array (a closed-over ref "
                           f"or a hi-type) is not supported yet.")
  if kind == "pallas_call":
    launch.check_launch(params)
    check_covered(params["jaxpr"])
    for bm in params["grid_mapping"].block_mappings:
      check_covered(bm.index_map_jaxpr)
    run = launch.run_pallas_call
  else:
    launch.check_mpmd(params)
    for j in params["jaxprs"]:
      check_covered(j)
    run = launch.run_mpmd_map
  out_avals = params["out_avals"]
  result_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]

  def host(*arrays):
    try:
      outs = engine.run(run, params, [np.asarray(a) for a in arrays])
    except BaseException as e:  # noqa: BLE001  kept for virtual_tpu's exit, then XLA wraps it
      engine.errors.append(e)
      raise
    return [np.asarray(o, dtype=a.dtype).reshape(a.shape) for o, a in zip(outs, out_avals)]

  def body(*args):
    return jax.pure_callback(host, result_shapes, *args)

  return mlir.lower_fun(body, multiple_results=True)(ctx, *in_nodes)
