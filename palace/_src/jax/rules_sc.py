"""Registry entries of the SparseCore vector-subcore primitives (jax/_src/pallas/mosaic/sc_primitives.py):
gathers and scatters of a ref by index vectors, the expanding load, the subcore barrier, parallel
loops, sorts, masked scans, occurrence counts, packing, mask all-reduces and fetch_and_add. Each maps
onto palace's `plsc` op of the same meaning (lang/sc_primitives.py), so its cost, bounds checks and
race detection are palace's.

Three of JAX's SparseCore primitives share their names with others: `gather` (lax.gather; its entry
in rules_lax.py passes SparseCore's, which has a `tree` parameter, to `gather` here), `swap` (the
state primitive; rules_state.py passes SparseCore's, which has an `add` parameter, to its `_sc_swap`)
and `load`, which has no other entry."""
from __future__ import annotations

from palace._src.core import MemorySpace
from palace._src.errors import UnsupportedError
from palace._src.jax.avals import memory_space
from palace._src.jax.interpret import program, run_program, source_line, unsupported
from palace._src.jax.registry import DATA, rule
from palace._src.jax.ref_operands import _Leaf, _operand, _ref_operand, _unflatten, _value
from palace._src.jax.rules_state import DMA
from palace._src.lang import indexed as indexing_check
from palace._src.lang.numpy_reductions import sparsecore_cumsum_rank_error
from palace._src.lang import primitives as prims
from palace._src.lang import sc_primitives as sc
from palace._src.lang.array import concrete_int


def _tree_operands(eqn):
  """The equation's flat operands unflattened by its `tree` parameter, compiled (_Leaf / literals)."""
  return _unflatten(eqn, eqn.params["tree"])


def _target(eqn, ref, transforms):
  """fn(flat) -> the palace Ref view of a tree's (ref, transforms)."""
  return _ref_operand(eqn, ref, tuple(transforms or ()))


# ------------------------------------------------------------------ ref accesses
def gather(eqn):
  """plsc.load_gather (SparseCore's `gather`: operands (ref, transforms, indices, mask))."""
  ref, transforms, indices, mask = _tree_operands(eqn)
  target = _target(eqn, ref, transforms)
  indices = list(indices)
  return lambda *flat: sc.load_gather(target(flat), [_value(i, flat) for i in indices],
                                      mask=_value(mask, flat))


@rule("scatter", compiles=True)
def _scatter(eqn):
  """plsc.store_scatter / addupdate_scatter (operands (ref, transforms, indices, value, mask))."""
  if "tree" not in eqn.params:
    raise unsupported(eqn, "lax.scatter (a scatter into a value)",
                      "scatter into a ref: plsc.store_scatter on a SparseCore, or DMAs on a TensorCore.")
  ref, transforms, indices, x, mask = _tree_operands(eqn)
  target = _target(eqn, ref, transforms)
  indices = list(indices)
  op = sc.addupdate_scatter if eqn.params["add"] else sc.store_scatter

  def scatter(*flat):
    op(target(flat), [_value(i, flat) for i in indices], _value(x, flat), mask=_value(mask, flat))
    return []
  return scatter


@rule("load", compiles=True)
def _load(eqn):
  """SparseCore's `load` (ref, *transforms[, mask]): plsc.load_expanded with a mask, else a load."""
  has_mask = bool(eqn.params["has_mask"])
  stop = -1 if has_mask else None
  target = _ref_operand(eqn, _Leaf(0), _unflatten(eqn, eqn.params["tree"], 1, stop))
  mask = _operand(eqn, len(eqn.invars) - 1) if has_mask else None

  def load(*flat):
    r = target(flat)
    return r[...] if mask is None else sc.load_expanded(r, mask=_value(mask, flat))
  return load


@rule("sc_fetch_and_add")
def _fetch_and_add(eqn, x_ref, value, *rest):
  """plsc.fetch_and_add (x_ref, value, *indices, subcore_id)."""
  *indices, subcore_id = rest
  target = x_ref.at[tuple(indices)] if indices else x_ref
  return sc.fetch_and_add(target, value, subcore_id=subcore_id)


# ------------------------------------------------------------------ synchronisation and loops
@rule("barrier")   # (schedule: never replayed, it synchronises subcores)
def _barrier(eqn):
  """plsc.subcore_barrier."""
  sc.subcore_barrier()
  return []


@rule("parallel_loop", compiles=True)
def _parallel_loop(eqn):
  """plsc.parallel_loop (operands (lower, upper, step, consts, carries); the body's invars are the
  consts, the index and the carries): run in order, as palace's plsc.parallel_loop (iterations are
  declared independent, so any order gives the kernel's defined results)."""
  lower, upper, step, consts, carries = _tree_operands(eqn)
  jaxpr = eqn.params["jaxpr"]
  prog, closed = program(jaxpr), jaxpr.consts
  consts, carries = list(consts), list(carries)

  def parallel_loop(*flat):
    cs = [_value(c, flat) for c in consts]
    st = concrete_int(_value(step, flat), "parallel_loop step")
    if st < 1:
      raise UnsupportedError(f"plsc.parallel_loop with step {st} at {source_line(eqn)}: palace runs "
                             f"loops with a positive step. Fix: count upwards.")
    body = prims.loop(_value(lower, flat), _value(upper, flat), step=st,
                      init_carry=tuple(_value(c, flat) for c in carries))
    return list(body(lambda i, c: tuple(run_program(prog, closed, [*cs, i, *c]))))
  return parallel_loop


# ------------------------------------------------------------------ vector ops
@rule("masked_sort", schedule=DATA)
def _masked_sort(eqn, keys, values, *mask):
  """plsc.sort_key_val: keys and values sorted by key, masked-off entries last; with a mask, the
  sorted mask too."""
  out = sc.sort_key_val(keys, values, mask=mask[0] if mask else None,
                        descending=bool(eqn.params["descending"]))
  return list(out)


@rule("sort", schedule=DATA)
def _sort(eqn, keys, *values):
  """lax.sort: by one key on a SparseCore vector subcore (Mosaic's one sort lowering); refused on a
  TensorCore, as Mosaic refuses it (palace's sc_primitives.sort)."""
  if int(eqn.params["num_keys"]) != 1:
    raise UnsupportedError(f"palace.jax: lax.sort with num_keys={eqn.params['num_keys']} at "
                           f"{source_line(eqn)}: Mosaic sorts by one key only. Fix: sort by one key.")
  return sc.sort(keys, *values)


@rule("masked_cumsum", schedule=DATA)
def _masked_cumsum(eqn, x, mask):
  """plsc.cumsum(x, mask=): the running sum of the unmasked lanes."""
  return sc.cumsum(x, mask=mask)


@rule("masked_cummax", schedule=DATA)
def _masked_cummax(eqn, x, mask):
  """plsc.cummax(x, mask=): the running maximum of the unmasked lanes."""
  return sc.cummax(x, mask=mask)


@rule("masked_cummin", schedule=DATA)
def _masked_cummin(eqn, x, mask):
  """plsc.cummin(x, mask=): the running minimum of the unmasked lanes."""
  return sc.cummin(x, mask=mask)


@rule("scan_count", schedule=DATA)
def _scan_count(eqn, x, mask):
  """plsc.scan_count: running occurrence counts and the last-occurrence mask."""
  return list(sc.scan_count(x, mask))


@rule("pack", schedule=DATA)
def _pack(eqn, a, b):
  p = eqn.params
  return sc.pack(a, b, format=p["format"], preferred_element_type=p["preferred_element_type"])


@rule("unpack", schedule=DATA)
def _unpack(eqn, ab):
  p = eqn.params
  return list(sc.unpack(ab, format=p["format"], preferred_element_type=p["preferred_element_type"]))


@rule("all_reduce_population_count", schedule=DATA)
def _population_count(eqn, x):
  return sc.all_reduce_population_count(x, reduce=int(eqn.params["reduce"]))


@rule("all_reduce_ffs", schedule=DATA)
def _ffs(eqn, x):
  return sc.all_reduce_ffs(x, reduce=int(eqn.params["reduce"]))


# ------------------------------------------------------------------ Mosaic's compile-time refusals
def check_vector_subcore_kernel(jaxpr) -> None:
  """Raise, while palace.jax lowers a SparseCore vector-subcore kernel, what JAX's SparseCore lowering
  refuses at compile time (jax/_src/pallas/mosaic/sc_lowering.py, sc_primitives.py), so the caller
  gets the error (and its type) before anything runs: ref reads and writes of HBM / VMEM_SHARED,
  scalars outside SMEM, arrays in SMEM, an integer index after a slice that is not trivial, a cumsum
  of rank > 1, and the indexed-DMA rules (the last two are lang's rules, which palace also applies
  when it runs such an op)."""
  from jax._src.pallas.mosaic import core as tc  # noqa: PLC0415
  from jax._src.state import types as st  # noqa: PLC0415
  for eqn, outer in _equations(jaxpr, ()):
    name = eqn.primitive.name
    if name in ("get", "swap") and "add" not in eqn.params:
      _check_access(eqn, outer, tc, st)
    elif name == "dma_start":
      _check_indexed_dma(eqn, outer, st)
    elif name == "cumsum" and len(eqn.invars[0].aval.shape) != 1:
      raise sparsecore_cumsum_rank_error(eqn.invars[0].aval.shape,
                                         f"at kernel line {source_line(eqn, outer)}")


def _equations(jaxpr, outer):
  from palace._src.jax.registry import sub_jaxprs  # noqa: PLC0415
  for eqn in jaxpr.eqns:
    yield eqn, outer
    for sub in sub_jaxprs(eqn):
      yield from _equations(sub, (*outer, eqn))


def _space(aval) -> MemorySpace:
  """palace's memory space of a ref aval in a SparseCore kernel (unannotated refs are in HBM)."""
  return memory_space(getattr(aval, "memory_space", None), MemorySpace.HBM, "a ref")


def _check_access(eqn, outer, tc, st) -> None:
  from jax._src import tree_util  # noqa: PLC0415
  from jax._src.state import indexing  # noqa: PLC0415
  get = eqn.primitive.name == "get"
  lead = 1 if get else 2
  transforms = tree_util.tree_unflatten(eqn.params["tree"], [v.aval for v in eqn.invars[lead:]])
  tref = st.transform_type(transforms, eqn.invars[0].aval)
  space = _space(tref)
  where = f"kernel line {source_line(eqn, outer)}"
  verb, doing = ("Get", "loading from") if get else ("Swap", "storing to")
  if space in (MemorySpace.HBM, MemorySpace.ANY, MemorySpace.VMEM_SHARED):
    shown = "HBM" if space is MemorySpace.ANY else space.name
    raise UnsupportedError(f"{verb} does not support {doing} {shown} on a SparseCore vector subcore "
                           f"({where}; Mosaic). Fix: copy the data to VMEM with pltpu.async_copy / "
                           f"sync_copy and access it there.")
  indexer = transforms[-1] if transforms and isinstance(transforms[-1], indexing.NDIndexer) else None
  if indexer is not None:
    sizes = [(i.size, False) if isinstance(i, indexing.Slice) else (1, True) for i in indexer.indices]
    if not any(getattr(i, "shape", ()) for i in indexer.indices):   # (not a gather by an index vector)
      first = next((k for k, (size, _) in enumerate(sizes) if size != 1), len(sizes))
      if any(squeezed for _, squeezed in sizes[first:]):
        raise UnsupportedError(f"Integer indexing of refs that follows a non-trivial slice is not "
                               f"supported on SC ({where}; Mosaic). Fix: index the leading dims with "
                               f"integers and slice the trailing ones, or transpose the ref's layout.")
  value = eqn.outvars[0].aval if get else eqn.invars[1].aval
  if (len(value.shape) == 0) != (space is MemorySpace.SMEM):
    if space is MemorySpace.SMEM:
      raise UnsupportedError(f"{verb} of an array of shape {tuple(value.shape)} in SMEM on a SparseCore "
                             f"vector subcore ({where}; Mosaic: scalars only in SMEM). Fix: keep "
                             f"arrays in VMEM.")
    raise UnsupportedError(
        f"{verb} of a scalar in {space.name} on a SparseCore vector subcore ({where}; Mosaic: "
        + ("Get only supports loading scalars from SMEM). Fix: To load a scalar from VMEM, load an "
           "array first and then extract an element, e.g. v = ref[pl.ds(idx, lanes)]; v[0]."
           if get else f"Swap only supports scalars in SMEM: Trying to swap a scalar in {space.name}). "
                       "Fix: store a vector (e.g. jnp.full of the lanes), or keep scalars in SMEM."))


def _indexed_side(x, side: str, st, where: str):
  """(memory space, indexed?, origin) of one side of a DMA, from its avals; checks the indexer."""
  from jax._src.pallas.mosaic import sc_core  # noqa: PLC0415
  from jax._src.state import indexing  # noqa: PLC0415
  base, transforms = (x.ref, list(x.transforms)) if isinstance(x, st.TransformedRef) else (x, [])
  indexed = False
  for k, t in enumerate(transforms):
    if not isinstance(t, indexing.NDIndexer) or not t.indices:
      continue
    first = t.indices[0]
    source = first.values if isinstance(first, sc_core.Indices) else first
    if isinstance(source, st.TransformedRef):
      shape, space = tuple(source.shape), _space(st.transform_type(source.transforms, source.ref))
    elif isinstance(source, st.AbstractRef):
      shape, space = tuple(source.shape), _space(source)
    elif getattr(source, "shape", ()):
      shape, space = tuple(source.shape), None
    else:
      continue
    origin = f"the DMA's {'source' if side == 'src' else 'destination'} at {where}"
    indexing_check.check_index_source(shape, space, origin)
    if k != len(transforms) - 1:
      raise indexing_check.transform_after_indexer(origin)
    indexed = True
  return _space(base), indexed


def _check_indexed_dma(eqn, outer, st) -> None:
  where = f"kernel line {source_line(eqn, outer)}"
  ops = DMA.decode(eqn, lambda k, v: v.aval)
  (s_space, s_idx), (d_space, d_idx) = (_indexed_side(ops[n], n, st, where) for n in ("src", "dst"))
  if s_idx or d_idx:
    indexing_check.check_indexed_copy(s_space, d_space, s_idx, d_idx, "the source", "the destination",
                                      where)
