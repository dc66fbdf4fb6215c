"""A local DMA wait's source window is not computed on the chip (palace.jax, session 33).

A DMA wait waits on its semaphore for the bytes of its destination: the source is part of the
descriptor only because `make_async_copy(src, dst, sem).wait()` names it (JAX's own printer shows a
`dma_wait` as its destination and semaphore alone). On the chip the source's address is then dead
code, and the compiler drops it with whatever only it needed: a kernel that rebuilds a copy's
descriptor to wait on it (the jax wheel's paged attention builds every page copy again, with the page
number read from SMEM, to wait on it) pays those loads and that index arithmetic once, at the start.
palace evaluates a kernel's jaxpr equation by equation and would charge them twice.

`wait_sources_dropped(jaxpr)` rewrites each local `dma_wait` (no device id, not a wait on the sending
side) whose source window has the shape and dtype of its destination window to name the destination
twice, and removes the equations that only fed the source: pure ones and ref reads, whose results
nothing else reads afterwards. A wait whose sides differ keeps its operands (palace's check rejects
it as `make_async_copy` does), as do a gather's (its index array sets its bytes) and a wait whose
source needed nothing of its own (then its messages name the source as written; a rewritten wait's
name its destination for both sides). Evidence: docs/validation.md "Where the model stands"; tests:
tests/jax_backend/test_wait_sources.py.
"""
from __future__ import annotations


def _window(x):
  """(shape, dtype) of a ref operand (a jaxpr variable, or a TransformedRef of one with only
  NDIndexer transforms), else None."""
  from jax._src.state import indexing  # noqa: PLC0415
  from jax._src.state import types as state_types  # noqa: PLC0415
  transforms = ()
  if isinstance(x, state_types.TransformedRef):
    x, transforms = x.ref, tuple(x.transforms)
  inner = getattr(getattr(x, "aval", None), "inner_aval", None)
  if inner is None:
    return None
  shape = tuple(inner.shape)
  for t in transforms:
    if not isinstance(t, indexing.NDIndexer) or tuple(t.int_indexer_shape):
      return None   # (a bitcast, reshape, ... or a gather's index array: its bytes are its own)
    shape = tuple(t.get_indexer_shape())
  return shape, inner.dtype


def _same(a, b) -> bool:
  """Do two ref operands name the same variables in the same structure (a rewritten wait's sides)?"""
  from jax._src import flattree as ft  # noqa: PLC0415
  fa, fb = ft.flatten(a), ft.flatten(b)
  return fa.tree == fb.tree and all(x is y for x, y in zip(fa.vals, fb.vals))


def _rewritten(eqn):
  """`eqn` (a dma_wait) naming its destination as its source too, or None when it must stay."""
  from jax._src import flattree as ft  # noqa: PLC0415
  p = eqn.params
  if p.get("is_wait_send"):
    return None
  src, dst, sem, src_sem, device_id = p["tree"].unflatten(list(eqn.invars))
  if device_id is not None or _same(src, dst):
    return None
  w = _window(dst)
  if w is None or _window(src) != w:
    return None
  flat = ft.flatten((dst, dst, sem, src_sem, device_id))
  return eqn.replace(invars=list(flat.vals), params={**p, "tree": flat.tree})


def _reads(eqns, outvars, literal) -> dict:
  """var -> how many equations (and outputs) read it."""
  n: dict = {}
  for e in eqns:
    for v in e.invars:
      if type(v) is not literal:
        n[v] = n.get(v, 0) + 1
  for v in outvars:
    if type(v) is not literal:
      n[v] = n.get(v, 0) + 1
  return n


def wait_sources_dropped(jaxpr):
  """`jaxpr` with its local DMA waits' source windows dropped (module docstring), or `jaxpr` itself."""
  from jax._src import core as jax_core  # noqa: PLC0415
  from palace._src.jax.registry import sub_jaxprs  # noqa: PLC0415
  from jax._src import flattree as ft  # noqa: PLC0415
  eqns = list(jaxpr.eqns)
  rewritten = {}   # equation index -> the source's variables
  for k, e in enumerate(eqns):
    if e.primitive.name == "dma_wait":
      new = _rewritten(e)
      if new is not None:
        rewritten[k] = [v for v in ft.flatten(e.params["tree"].unflatten(list(e.invars))[0]).vals]
        eqns[k] = new
  if not rewritten:
    return jaxpr
  literal = jax_core.Literal
  before = _reads(jaxpr.eqns, jaxpr.outvars, literal)
  reads = _reads(eqns, jaxpr.outvars, literal)
  keep = [True] * len(eqns)
  for k in range(len(eqns) - 1, -1, -1):   # (last first: a dropped equation frees its operands)
    e = eqns[k]
    if not e.outvars or any(reads.get(v, 0) for v in e.outvars) or \
        not any(before.get(v, 0) for v in e.outvars):
      continue   # (read, or never read: only what the waits' sources alone needed goes)
    if (e.effects and e.primitive.name != "get") or any(True for _ in sub_jaxprs(e)):
      continue
    keep[k] = False
    for v in e.invars:
      if type(v) is not literal:
        reads[v] -= 1
  dropped = {v for e, kept in zip(eqns, keep) if not kept for v in e.outvars}
  if not dropped:
    return jaxpr
  for k, src in rewritten.items():   # (a wait whose source dropped nothing keeps it: its messages name it)
    if not any(type(v) is not literal and v in dropped for v in src):
      eqns[k] = jaxpr.eqns[k]
  return jax_core.Jaxpr(jaxpr.constvars, jaxpr.invars, jaxpr.outvars,
                        [e for e, kept in zip(eqns, keep) if kept], debug_info=jaxpr.debug_info,
                        consts=jaxpr.consts or None)
