"""Host-side SPMD over the virtual pod (L5): `pl.make_mesh`, `pl.P`, `pl.shard_map`.

`shard_map(f, mesh, in_specs, out_specs)(*args)` runs `f` once per chip on its shards, each in its own
host thread. Every kernel launch inside `f` is collective: each chip's thread reaches it, and when all
have, one machine runs the whole pod (all chips' cores together, so remote DMAs and barriers work),
one report is recorded, and every thread continues with its own outputs. The chip index is the
row-major position in the mesh; mesh position i sits at torus position `mesh.device_ids[i]` of the
VirtualTPU. `make_mesh` lays a 1-D mesh over a 2-D/3-D torus along a ring of neighbouring chips (as
JAX's device meshes do), so ring collectives take one hop per step; other meshes are row-major.

Memory: each chip's shard of a sharded input is a view of the caller's array (one copy of the data);
a replicated input is copied once per extra replica (each chip owns its copy, as on hardware);
replicated outputs are taken from the first replica.
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

from palace._src import validate
from palace._src.launch import host as launch
from palace._src.launch.run import barrier_notes
from palace._src.errors import SyncError, UsageError
from palace._src.sim import workers
from palace._src.sim.ici import Topology
from palace._src.sim.machine import active_tpu, explicit_tpu
from palace._src.util import prod, tree_flatten, tree_unflatten


class PartitionSpec(tuple):
  """`P('x', None)`: dimension 0 split over mesh axis 'x', dimension 1 replicated."""

  def __new__(cls, *parts):
    seen = []
    for i, p in enumerate(parts):
      for ax in (p if isinstance(p, tuple) else () if p is None else (p,)):
        validate.as_name(ax, f"P{parts!r} entry {i}", hint="each entry is None, a mesh axis name, or a "
                         "tuple of axis names, e.g. P('x', None) or P(('x', 'y'),).")
        if ax in seen:
          raise UsageError(f"P{parts!r} uses mesh axis {ax!r} twice; an axis can split one dimension "
                           f"only. Fix: name each mesh axis at most once, e.g. P({ax!r}, None).")
        seen.append(ax)
    return super().__new__(cls, parts)

  def __repr__(self):
    return f"P{tuple(self)!r}"


P = PartitionSpec


@dataclasses.dataclass(frozen=True)
class Mesh:
  """A logical mesh of virtual chips: axis names and sizes (row-major chip numbering)."""
  shape_tuple: tuple
  axis_names: tuple
  device_ids: tuple = None   # torus position of each mesh position (row-major); None: identity
  placed: bool = True        # False: built before any pl.virtual_tpu; laid out on the pod at use

  def placed_on(self, tpu) -> "Mesh":
    """This mesh checked against (and, when built before any pl.virtual_tpu, laid out on) the pod of
    `tpu`: meshes can be built ahead, as in JAX, and are checked when a launch uses them."""
    size = self.size
    if size > tpu.num_chips or (size < tpu.num_chips and not self.placed):   # (placed: devices given)
      raise UsageError(f"make_mesh{self.shape_tuple}: the mesh has {size} chips but the virtual TPU "
                       f"has {tpu.num_chips}. Fix: use pl.virtual_tpu({tpu.chip.name!r}, num_chips={size})"
                       + (", or pass devices= (the chips of a smaller mesh)." if size < tpu.num_chips
                          else "."))
    if max(self.devices.flat) >= tpu.num_chips:
      raise UsageError(f"make_mesh{self.shape_tuple}: devices {self.device_ids} name a chip the virtual TPU "
                       f"of {tpu.num_chips} chips does not have. Fix: pass chips in 0..{tpu.num_chips - 1}.")
    if self.placed:
      return self
    if sum(1 for s in self.shape_tuple if s > 1) == 1:
      ids = tuple(Topology(tpu.chip, tpu.num_chips, tpu.topology).ring_order())
    else:
      ids = tuple(range(size))
    return Mesh(self.shape_tuple, self.axis_names, None if ids == tuple(range(size)) else ids)

  def __post_init__(self):
    hint = "pass distinct non-empty axis names, e.g. pl.make_mesh((2, 4), ('x', 'y'))."
    for i, n in enumerate(self.axis_names):
      validate.as_name(n, f"mesh axis_names[{i}]", hint=hint)
    dup = sorted({n for n in self.axis_names if self.axis_names.count(n) > 1})
    if dup:
      raise UsageError(f"mesh axis_names {self.axis_names} repeat {dup}; every mesh axis needs its own "
                       f"name. Fix: {hint}")
    validate.as_dims(self.shape_tuple, "mesh axis sizes", hint="pass positive chip counts per axis.")
    for i, n in enumerate(self.shape_tuple):
      if n < 1:
        raise UsageError(f"mesh axis {self.axis_names[i]!r} has size {n}. Fix: every mesh axis has at "
                         f"least one chip.")

  @property
  def shape(self) -> dict:
    return dict(zip(self.axis_names, self.shape_tuple))

  @property
  def size(self) -> int:
    n = 1
    for s in self.shape_tuple:
      n *= s
    return n

  @property
  def devices(self):
    ids = self.device_ids if self.device_ids is not None else range(self.size)
    return np.array(ids).reshape(self.shape_tuple)

  def coords(self, chip: int) -> dict:
    out = {}
    for name, s in reversed(list(zip(self.axis_names, self.shape_tuple))):
      out[name] = chip % s
      chip //= s
    return out


def make_mesh(axis_shapes, axis_names, *, devices=None, axis_types=None) -> Mesh:
  shape = validate.as_dims(axis_shapes, "make_mesh axis_shapes")
  names = tuple(axis_names)
  if len(shape) != len(names):
    raise UsageError(f"make_mesh: {len(shape)} axis sizes but {len(names)} axis names. Fix: give one "
                     f"name per axis size, e.g. pl.make_mesh((2, 4), ('x', 'y')).")
  size = prod(shape)
  if devices is not None:
    # the chips of the mesh, row-major: all of the virtual TPU's, or some of them (a smaller mesh, as
    # a JAX mesh over jax.devices()[:2]); checked against the TPU's chip count when it is used
    ids = tuple(validate.as_int(d, "make_mesh devices", min_value=0) for d in np.asarray(devices).reshape(-1))
    if len(ids) != size or len(set(ids)) != size:
      raise UsageError(f"make_mesh{shape}: devices {ids} must list each of the {size} chips once "
                       f"(distinct chip indices: a permutation of range({size}) for a mesh of every chip, "
                       f"or some of the virtual TPU's chips for a smaller mesh). Fix: pass {size} distinct "
                       f"chip indices, or omit devices.")
    mesh = Mesh(shape, names, None if ids == tuple(range(size)) else ids)
  else:
    mesh = Mesh(shape, names, None, placed=False)
  tpu = explicit_tpu()
  # inside pl.virtual_tpu: checked and laid out now; before it: when a shard_map uses it
  return mesh if tpu is None else mesh.placed_on(tpu)


def _dim_axes(spec, ndim, what: str = "operand"):
  if len(spec) > ndim:
    raise UsageError(f"{what}: PartitionSpec {spec} has {len(spec)} entries but the value has {ndim} "
                     f"dimension(s). Fix: give at most one entry per dimension (None for replicated ones).")
  parts = tuple(spec) + (None,) * (ndim - len(spec))
  out = []
  for p in parts[:ndim]:
    out.append(() if p is None else (p if isinstance(p, tuple) else (p,)))
  return out


def _first_replica(spec, mesh: Mesh, chip: int, ndim: int) -> bool:
  """Whether `chip` is the first chip holding its shard (coordinate 0 on every axis not in spec)."""
  used = set() if spec is None else {ax for axes in _dim_axes(spec, ndim) for ax in axes}
  return all(c == 0 for ax, c in mesh.coords(chip).items() if ax not in used)


def _shard(x, spec, mesh: Mesh, chip: int, what: str):
  """Chip `chip`'s shard: a read-only view of `x`, like an immutable JAX array. Replicas share it: a
  kernel writing its input writes a private copy (copy on write, launch.host.hbm_input)."""
  out = _shard_view(np.asarray(x), spec, mesh, chip, what).view()
  out.setflags(write=False)
  return out


def _shard_view(a, spec, mesh: Mesh, chip: int, what: str):
  if spec is None:
    return a
  coords = mesh.coords(chip)
  idx = []
  for d, axes in enumerate(_dim_axes(spec, a.ndim, what)):
    n, k = 1, 0
    for ax in axes:
      if ax not in mesh.shape:
        raise UsageError(f"{what}: PartitionSpec {spec} names axis {ax!r}; the mesh axes are "
                         f"{mesh.axis_names}. Fix: name only mesh axes in the PartitionSpec.")
      n *= mesh.shape[ax]
      k = k * mesh.shape[ax] + coords[ax]
    if a.shape[d] % n:
      raise UsageError(f"{what}: dimension {d} of size {a.shape[d]} does not split evenly over "
                       f"{n} chips ({spec}). Fix: make dimension {d} a multiple of {n}, or leave it "
                       f"unsharded (None in the spec).")
    step = a.shape[d] // n
    idx.append(slice(k * step, (k + 1) * step))
  return a[tuple(idx)]


def _unshard(shards, spec, mesh: Mesh, what: str):
  first = np.asarray(shards[0])
  if spec is None:
    return first
  axes_per_dim = _dim_axes(spec, first.ndim, what)
  out_shape = list(first.shape)
  for d, axes in enumerate(axes_per_dim):
    for ax in axes:
      out_shape[d] *= mesh.shape[ax]
  if out_shape == list(first.shape):
    return first
  out = np.empty(out_shape, first.dtype)
  for chip, sh in enumerate(shards):
    if not _first_replica(spec, mesh, chip, first.ndim):
      continue
    coords = mesh.coords(chip)
    idx = []
    for d, axes in enumerate(axes_per_dim):
      k = 0
      for ax in axes:
        k = k * mesh.shape[ax] + coords[ax]
      idx.append(slice(k * first.shape[d], (k + 1) * first.shape[d]))
    out[tuple(idx)] = sh
  return out


class _PeerFailed(BaseException):
  """Unwinds a chip's thread after another chip's failure (shard_map re-raises the original once)."""


class _Group:
  """Rendezvous of the chips' threads at each collective kernel launch."""

  def __init__(self, mesh: Mesh, tpu):
    self.mesh = mesh
    self.tpu = tpu
    self.n = mesh.size
    self.cv = threading.Condition()
    self.pending = {}
    self.generation = 0
    self.error = None
    self.finished = 0

  def collective_launch(self, chip: int, kname: str, build, grid_steps: int) -> None:
    with self.cv:
      if self.error is not None:
        raise _PeerFailed()
      gen = self.generation
      self.pending[chip] = (kname, build, grid_steps)
      if len(self.pending) + self.finished < self.n:
        while self.generation == gen and self.error is None:
          self.cv.wait()
        if self.error is not None:
          raise _PeerFailed()
        return
      if self.finished:
        self.error = SyncError(f"Chips made different kernel launches in shard_map: {self.finished} "
                               f"chip(s) returned while others launched '{kname}'. Fix: make every chip run "
                               f"the same launches in the same order (no launch under a "
                               f"chip-dependent condition).")
        self.cv.notify_all()
        raise self.error
      launches = [self.pending[c] for c in range(self.n)]
      self.pending = {}
    names = {k for k, _, _ in launches}
    try:
      if len(names) != 1:
        raise SyncError(f"Chips launched different kernels at the same point of shard_map: "
                        f"{sorted(names)}; every chip must launch the same kernels in the same order. "
                        f"Fix: make the launches independent of the chip index (branch inside the kernel).")
      with launch.launch_machine(self.tpu, kname, self.n, sum(g for _, _, g in launches)) as machine:
        if self.mesh.device_ids is not None:
          machine.topology.place(self.mesh.device_ids)
        machine.axes = [(name, size, "chip") for name, size in zip(self.mesh.axis_names,
                                                                    self.mesh.shape_tuple)]
        programs = []
        for c, (_, b, _) in enumerate(launches):
          programs += b(machine, c)
        try:
          machine.run(programs)
        except SyncError as e:
          barrier_notes(e, programs)
          raise
    except BaseException as e:  # noqa: BLE001  every chip's thread re-raises it
      with self.cv:
        self.error = e
        self.cv.notify_all()
      raise
    with self.cv:
      self.generation += 1
      self.cv.notify_all()

  def done(self) -> None:
    with self.cv:
      self.finished += 1
      if self.pending and len(self.pending) + self.finished == self.n and self.error is None:
        self.error = SyncError("Chips made different kernel launches in shard_map: some chips "
                               "returned while others wait in a launch. Fix: make every chip run the "
                               "same launches in the same order.")
      self.cv.notify_all()


class CallGroups:
  """The rendezvous of every call of one pod launch site (palace.jax: XLA runs the N device callbacks
  of a call concurrently, and a chip's k-th callback belongs to the site's k-th call): one `_Group`
  per call, gone when its last chip left. So a call that failed keeps its error to itself and the
  next call starts clean, and a chip failing before it reached the launch releases its peers."""

  def __init__(self, mesh: Mesh, tpu):
    self.mesh, self.tpu = mesh, tpu
    self.lock = threading.Lock()
    self.calls = [0] * mesh.size
    self.open = {}   # call number -> [its _Group, chips that left it]

  def enter(self, chip: int) -> tuple:
    """(call number, group) of `chip`'s next call."""
    with self.lock:
      k = self.calls[chip]
      self.calls[chip] = k + 1
      entry = self.open.get(k)
      if entry is None:
        entry = self.open[k] = [_Group(self.mesh, self.tpu), 0]
      return k, entry[0]

  def leave(self, k: int, error=None) -> None:
    """A chip's callback of call `k` ends (`error`: what it raised, which its waiting peers then see)."""
    with self.lock:
      entry = self.open[k]
      entry[1] += 1
      if entry[1] == self.mesh.size:
        del self.open[k]
    group = entry[0]
    if error is not None:
      with group.cv:
        if group.error is None:
          group.error = error
        group.cv.notify_all()


def peer_error(group: _Group, chip: int) -> SyncError:
  """What a chip raises when another chip's failure ended their collective launch."""
  e = group.error
  return SyncError(f"Chip {chip} stopped because the collective launch failed on another chip: "
                   f"{type(e).__name__}: {e} Fix: see that chip's error (this chip only waited for it).")


def shard_map(f, *, mesh: Mesh, in_specs, out_specs, check_rep=True, check_vma=True, axis_names=None):
  """Run `f` once per virtual chip on its shards; kernels launched inside run as one SPMD launch."""
  validate.as_callable(f, "shard_map(f)")
  if not isinstance(mesh, Mesh):
    raise UsageError(f"shard_map(mesh=...) must be a mesh from pl.make_mesh; got {mesh!r} "
                     f"({type(mesh).__name__}). Fix: mesh = pl.make_mesh((n,), ('x',)) inside "
                     f"pl.virtual_tpu(chip, num_chips=n).")

  if not isinstance(mesh, Mesh):
    raise UsageError(f"shard_map(mesh={mesh!r}): expected a mesh. Fix: pass a mesh from "
                     f"pl.make_mesh(axis_shapes, axis_names).")
  built = mesh

  def run(*args):
    tpu = active_tpu()
    if built.size > tpu.num_chips or (built.size < tpu.num_chips and not built.placed):
      raise UsageError(f"shard_map over a mesh of {built.size} chips on a virtual TPU with "
                       f"{tpu.num_chips}. Fix: create both with the same chip count"
                       + (", or pass make_mesh(..., devices=) the chips of the smaller mesh."
                          if built.size < tpu.num_chips else "."))
    mesh = built.placed_on(tpu)
    specs = in_specs if isinstance(in_specs, (list, tuple)) and not isinstance(in_specs, P) \
        else (in_specs,) * len(args)
    if len(specs) != len(args):
      raise UsageError(f"shard_map: {len(specs)} in_specs for {len(args)} arguments. Fix: give one "
                       f"PartitionSpec per argument (or one P for all of them).")
    shards = [[_shard(a, s, mesh, c, f"args[{i}]") for i, (a, s) in enumerate(zip(args, specs))]
              for c in range(mesh.size)]
    group = _Group(mesh, tpu)
    results = [None] * mesh.size

    def chip_main(c):   # on a worker thread (sim/workers.py): what it sets here is reset at the end
      with launch.on_tpu(tpu):
        spmd_token = launch.set_spmd_context((group, c))
        try:
          results[c] = f(*shards[c])
        except _PeerFailed:
          pass
        except BaseException as e:  # noqa: BLE001
          with group.cv:
            if group.error is None:
              group.error = e
            group.cv.notify_all()
        finally:
          group.done()
          launch.reset_spmd_context(spmd_token)

    running = [workers.run_soon(functools.partial(chip_main, c)) for c in range(mesh.size)]
    for done in running:
      done.wait()
    if group.error is not None:
      raise group.error
    if results[0] is None and (isinstance(out_specs, P) or out_specs not in (None, (), [])):
      raise UsageError(f"shard_map function {getattr(f, '__name__', f)!r} returned None but out_specs="
                       f"{out_specs!r} describes outputs. Fix: return the per-chip results, or pass "
                       f"out_specs=() for a function without outputs.")
    leaves0, td = tree_flatten(results[0])
    per_chip = [tree_flatten(r)[0] for r in results]
    ospecs = out_specs if isinstance(out_specs, (list, tuple)) and not isinstance(out_specs, P) \
        else (out_specs,) * len(leaves0)
    if len(ospecs) != len(leaves0):
      raise UsageError(f"shard_map: {len(ospecs)} out_specs for {len(leaves0)} outputs. Fix: give "
                       f"one PartitionSpec per output the function returns (or one P for all).")
    outs = [_unshard([pc[i] for pc in per_chip], s, mesh, f"outputs[{i}]")
            for i, s in enumerate(ospecs)]
    return tree_unflatten(td, outs)

  return run
