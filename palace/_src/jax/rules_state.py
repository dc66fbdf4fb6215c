"""Interpreter rules for refs (get/swap/addupdate and Pallas' masked load/store, with their indexer,
bitcast and reshape transforms) and the Pallas / Mosaic-TPU primitives (program ids, semaphores, DMAs,
barrier semaphores, roll, bitcast, PRNG, debug prints)."""
from __future__ import annotations

import numpy as np

from palace._src.jax.interpret import grid_axes, result_unused, rule, unsupported
from palace._src.lang import lax_ops
from palace._src.lang import primitives as prims
from palace._src.lang import tpu_primitives as tpu
from palace._src.lang.array import concrete_int
from palace._src.lang.refs import Ref, ds


def _jax_types():
  from jax._src.state import indexing, types  # noqa: PLC0415
  return indexing, types


def _index_tuple(eqn, indexer):
  indexing, _ = _jax_types()
  out = []
  for i in indexer.indices:
    if isinstance(i, indexing.Slice):
      if not isinstance(i.stride, (int, np.integer)):
        raise unsupported(eqn, "a slice of dynamic stride")
      # a dynamic size (pl.BoundedSlice blocks: JAX's emit_pipeline DMAs a window of runtime size)
      # is known when the kernel runs, as it is to a TPU's DMA engine
      size = i.size if isinstance(i.size, (int, np.integer)) else concrete_int(i.size, "slice size")
      out.append(ds(i.start, int(size), int(i.stride)))
    elif isinstance(i, _jax_types()[1].TransformedRef):
      out.append(view(eqn, i.ref, i.transforms))   # an index ref (SparseCore gather / scatter DMAs)
    else:
      out.append(i)
  return tuple(out)


def view(eqn, ref, transforms, last_index: bool = False):
  """Apply JAX ref transforms to a palace Ref. With last_index, a trailing indexer is returned
  separately (so the read/write itself indexes, as `ref[idx]` does), else it becomes a view."""
  indexing, types = _jax_types()
  transforms = list(transforms or ())
  idx = ...
  if last_index and transforms and isinstance(transforms[-1], indexing.NDIndexer):
    idx = _index_tuple(eqn, transforms.pop())
  for t in transforms:
    if isinstance(t, indexing.NDIndexer):
      ref = ref.at[_index_tuple(eqn, t)]
    elif isinstance(t, types.BitcastTransform) or type(t).__name__ == "RefBitcaster":
      ref = ref.bitcast(np.dtype(t.dtype))
    elif isinstance(t, types.ReshapeTransform) or type(t).__name__ == "RefReshaper":
      ref = ref.reshape(*t.shape)
    else:
      raise unsupported(eqn, f"the ref transform {type(t).__name__}")
  return (ref, idx) if last_index else ref


def _check_ref(eqn, ref):
  if not isinstance(ref, Ref):
    raise unsupported(eqn, f"an operand of type {type(ref).__name__} where a ref belongs")


def _dropped(eqn) -> bool:
  from jax._src import core as jax_core  # noqa: PLC0415
  return isinstance(eqn.outvars[0], jax_core.DropVar) or result_unused(eqn)


@rule("get")
def _get(eqn, ref, *flat):
  from jax._src import tree_util  # noqa: PLC0415
  _check_ref(eqn, ref)
  r, idx = view(eqn, ref, tree_util.tree_unflatten(eqn.params["tree"], flat), last_index=True)
  return r[idx]


@rule("swap")
def _swap(eqn, ref, val, *flat):
  from jax._src import tree_util  # noqa: PLC0415
  _check_ref(eqn, ref)
  r, idx = view(eqn, ref, tree_util.tree_unflatten(eqn.params["tree"], flat), last_index=True)
  old = None if _dropped(eqn) else r[idx]
  r[idx] = val
  return old


@rule("addupdate")
def _addupdate(eqn, ref, val, *flat):
  from jax._src import tree_util  # noqa: PLC0415
  _check_ref(eqn, ref)
  r, idx = view(eqn, ref, tree_util.tree_unflatten(eqn.params["tree"], flat), last_index=True)
  r[idx] = r[idx] + val


@rule("masked_load")
def _masked_load(eqn, *flat):
  ref, transforms, mask, other = eqn.params["args_tree"].unflatten(flat)
  _check_ref(eqn, ref)
  r, idx = view(eqn, ref, transforms, last_index=True)
  val = tpu.load(r.at[idx] if idx is not ... else r, mask=mask)
  if other is None or mask is None:
    return val
  return lax_ops.select(mask, val, other)   # masked-off lanes read `other`


@rule("masked_swap")
def _masked_swap(eqn, *flat):
  ref, transforms, val, mask = eqn.params["args_tree"].unflatten(flat)
  _check_ref(eqn, ref)
  r, idx = view(eqn, ref, transforms, last_index=True)
  target = r.at[idx] if idx is not ... else r
  old = None if _dropped(eqn) else target[...]
  tpu.store(target, val, mask=mask)
  return old


# ------------------------------------------------------------------ grid and hints
def _grid_axis(eqn) -> int:
  axis = int(eqn.params["axis"])
  axes = grid_axes.get()
  return axis if axes is None else axes[axis]


@rule("program_id")
def _program_id(eqn):
  return prims.program_id(_grid_axis(eqn))


@rule("num_programs")
def _num_programs(eqn):
  return np.int32(prims.num_programs(_grid_axis(eqn)))


@rule("multiple_of")
def _multiple_of(eqn, x):
  return prims.multiple_of(x, eqn.params["values"])


@rule("axis_index")
def _axis_index(eqn):
  return prims.axis_index(eqn.params["axis_name"])


# ------------------------------------------------------------------ semaphores
def _sem(eqn, ref, transforms):
  _check_ref(eqn, ref)
  return view(eqn, ref, transforms)


def _device_id(eqn, device_id, device_id_type):
  if device_id is None:
    return None
  kind = str(getattr(device_id_type, "value", device_id_type) or "mesh").lower()
  if kind != "mesh" and not isinstance(device_id, dict):
    raise unsupported(eqn, f"device_id_type={device_id_type}", "Use DeviceIdType.MESH device ids.")
  return device_id


@rule("semaphore_signal")
def _sem_signal(eqn, *flat):
  ref, transforms, inc, device_id, core_index = eqn.params["args_tree"].unflatten(flat)
  prims.semaphore_signal(_sem(eqn, ref, transforms), inc,
                         device_id=_device_id(eqn, device_id, eqn.params.get("device_id_type")),
                         core_index=core_index)
  return []


@rule("semaphore_wait")
def _sem_wait(eqn, *flat):
  ref, transforms, value, decrement = eqn.params["args_tree"].unflatten(flat)
  prims.semaphore_wait(_sem(eqn, ref, transforms), value, decrement=bool(decrement))
  return []


@rule("semaphore_read")
def _sem_read(eqn, *flat):
  ref, transforms = eqn.params["args_tree"].unflatten(flat)
  return prims.semaphore_read(_sem(eqn, ref, transforms))


@rule("get_barrier_semaphore")
def _barrier_sem(eqn):
  return tpu.get_barrier_semaphore()


# ------------------------------------------------------------------ DMAs
def _dma_ref(eqn, x):
  _, types = _jax_types()
  if isinstance(x, types.TransformedRef):
    _check_ref(eqn, x.ref)
    return view(eqn, x.ref, x.transforms)
  if x is not None:
    _check_ref(eqn, x)
  return x


def _descriptor(eqn, flat):
  src, dst, dst_sem, src_sem, device_id = (_dma_ref(eqn, x) if i < 4 else x for i, x in
                                           enumerate(eqn.params["tree"].unflatten(flat)))
  dev = _device_id(eqn, device_id, eqn.params.get("device_id_type"))
  return tpu.AsyncCopyDescriptor(src, dst, dst_sem, src_sem, device_id=dev, is_remote=dev is not None)


@rule("dma_start")
def _dma_start(eqn, *flat):
  _descriptor(eqn, flat).start(int(eqn.params.get("priority", 0)), add=bool(eqn.params.get("add")))
  return []


@rule("dma_wait")
def _dma_wait(eqn, *flat):
  d = _descriptor(eqn, flat)
  # JAX binds a wait on the source side with src/dst (and their semaphores) swapped: the waited
  # semaphore is always the third operand, and the bytes are those of the (swapped) destination.
  if d.is_remote and eqn.params.get("is_wait_send"):
    d.sem, d.src_sem = d.src_sem, d.sem
    d.src_ref, d.dst_ref = d.dst_ref, d.src_ref
    d.wait_send()
  else:
    d.wait_recv()
  return []


# ------------------------------------------------------------------ vector helpers
@rule("roll")
def _roll(eqn, x, shift):
  p = eqn.params
  return tpu.roll(x, shift, int(p["axis"]), stride=p.get("stride"), stride_axis=p.get("stride_axis"))


@rule("bitcast")
def _bitcast(eqn, x):
  return tpu.bitcast(x, np.dtype(eqn.params["ty"]), int(eqn.params.get("dim", -2)))


@rule("prng_seed")
def _prng_seed(eqn, *seeds):
  tpu.prng_seed(*seeds)
  return []


@rule("prng_random_bits")
def _prng_bits(eqn):
  return tpu.prng_random_bits(tuple(eqn.params["shape"]))


@rule("debug_print")
def _debug_print(eqn, *args):
  """pl.debug_print on TPU: `{}` placeholders are filled with the values, else they follow the text
  (palace's debug_print does the same); the text goes to the VirtualTPU's debug output."""
  p = eqn.params
  if p.get("static_args") or (p.get("in_tree") is not None and p["in_tree"].unflatten(args)[1]):
    raise unsupported(eqn, "keyword or static format arguments", "Pass the values positionally.")
  prims.debug_print(p["fmt"], *args)
  return []
