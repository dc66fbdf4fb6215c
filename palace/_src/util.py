"""Small helpers with no palace imports (L0): integer math, pytrees, source locations."""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any, Callable

_PALACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def keep(memo: dict, key, value, limit: int = 1024):
  """`memo[key] = value` in a memo of a pure function (a kernel asks the same questions every grid
  step), started over once it holds more than `limit` entries (a long-lived process meeting ever new
  keys); returns `value`."""
  if len(memo) > limit:
    memo.clear()
  memo[key] = value
  return value


def prod(xs) -> int:
  """The product of a shape's sizes as a Python int (NumPy integers included)."""
  return math.prod(map(int, xs))


def describe_dims(dims) -> str:
  """A view's dims (ints for indexed-away dims, (start, size, stride) for the others) as its index text,
  '[8:16, 0:128]' (the form of messages, traces and reports)."""
  return "[" + ", ".join([str(d) if isinstance(d, int) else
                          f"{d[0]}:{d[0] + d[1] * d[2]}" + (f":{d[2]}" if d[2] != 1 else "")
                          for d in dims]) + "]"


def align_to(x: int, a: int) -> int:
  return cdiv(x, a) * a


def next_power_of_2(x: int) -> int:
  return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


# ---- pytrees: tuples, lists, dicts (sorted keys), namedtuples, None and registered classes are nodes;
# all else leaves. Registered classes: `register_pytree_node` / `register_dataclass` (palace's own
# registry, which the jax shim's tree_util feeds) and, when real JAX is imported, every class registered
# with `jax.tree_util` (asked one level at a time). Like JAX's, the registry is per process: a type's
# pytree structure is a property of the type, not state of a run.
_NODES: dict = {}   # type -> (flatten(x) -> (children, aux), unflatten(aux, children) -> x)
_NOT_JAX_NODE = ("builtins", "numpy", "jax", "jaxlib", "palace", "ml_dtypes")


def register_pytree_node(cls, flatten, unflatten) -> type:
  """`cls` is a pytree node: `flatten(x) -> (children, aux)`, `unflatten(aux, children) -> x`."""
  _NODES[cls] = (flatten, unflatten)
  return cls


def register_dataclass(cls, data_fields=None, meta_fields=None, drop_fields=()) -> type:
  """A dataclass as a pytree node, as `jax.tree_util.register_dataclass`: `data_fields` are children,
  `meta_fields` static; both default to the dataclass fields (static ones via
  `field(metadata={"static": True})`), without `drop_fields`."""
  if (data_fields is None) != (meta_fields is None):
    raise TypeError("register_dataclass: pass both data_fields and meta_fields, or neither.")
  if data_fields is None:
    if not dataclasses.is_dataclass(cls):
      raise TypeError(f"register_dataclass({cls.__name__}): data_fields and meta_fields are required "
                      f"for a class that is not a dataclass.")
    fields = [f for f in dataclasses.fields(cls) if f.name not in drop_fields]
    data_fields = [f.name for f in fields if not f.metadata.get("static", False)]
    meta_fields = [f.name for f in fields if f.metadata.get("static", False)]
  data, meta = tuple(data_fields), tuple(meta_fields)

  def flatten(x):
    return [getattr(x, f) for f in data], tuple(getattr(x, f) for f in meta)

  def unflatten(aux, children):
    return cls(**dict(zip(data, children)), **dict(zip(meta, aux)))

  return register_pytree_node(cls, flatten, unflatten)


def _jax_node(x):
  """(children, JAX treedef) when real JAX is imported and registers type(x) as a node, else None."""
  mod = type(x).__module__ or ""
  if mod.partition(".")[0] in _NOT_JAX_NODE:
    return None
  jax = sys.modules.get("jax")
  tu = getattr(jax, "tree_util", None) if jax is not None else None
  if tu is None:
    return None
  children, td = tu.tree_flatten(x, is_leaf=lambda y: y is not x)   # one level: x's children
  if len(children) == 1 and children[0] is x:
    return None
  return children, td


class TreeDef:
  __slots__ = ("kind", "meta", "children")

  def __init__(self, kind, meta, children):
    self.kind, self.meta, self.children = kind, meta, children

  @property
  def num_leaves(self) -> int:
    if self.kind == "leaf":
      return 1
    return sum(c.num_leaves for c in self.children)

  def __eq__(self, other):
    return (isinstance(other, TreeDef) and self.kind == other.kind and self.meta == other.meta
            and self.children == other.children)

  def __repr__(self):
    if self.kind == "leaf":
      return "*"
    if self.kind == "none":
      return "None"
    if self.kind in ("custom", "jax"):
      return f"{self.meta[0].__name__}({', '.join(map(repr, self.children))})"
    return f"{self.kind}{self.meta or ''}({', '.join(map(repr, self.children))})"


_LEAF = TreeDef("leaf", None, ())


def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None):
  leaves: list = []
  return leaves, _flatten(tree, is_leaf, leaves)


# (module-level recursion: a nested function that calls itself is a reference cycle, garbage for the
# cyclic GC at every call, and the pipelines flatten their operands at every step)
def _flatten(x, is_leaf, leaves: list) -> TreeDef:
  if is_leaf is not None and is_leaf(x):
    leaves.append(x)
    return _LEAF
  if x is None:
    return TreeDef("none", None, ())
  if isinstance(x, tuple) and hasattr(x, "_fields"):
    return TreeDef("namedtuple", type(x), tuple([_flatten(c, is_leaf, leaves) for c in x]))
  if isinstance(x, (tuple, list)):
    return TreeDef(type(x).__name__, None, tuple([_flatten(c, is_leaf, leaves) for c in x]))
  if isinstance(x, dict):
    keys = tuple(sorted(x))
    return TreeDef("dict", keys, tuple([_flatten(x[k], is_leaf, leaves) for k in keys]))
  node = _NODES.get(type(x))
  if node is not None:
    children, aux = node[0](x)
    return TreeDef("custom", (type(x), aux), tuple([_flatten(c, is_leaf, leaves) for c in children]))
  if "jax" in sys.modules:
    jax_node = _jax_node(x)
    if jax_node is not None:
      return TreeDef("jax", (type(x), jax_node[1]),
                     tuple([_flatten(c, is_leaf, leaves) for c in jax_node[0]]))
  leaves.append(x)
  return _LEAF


def tree_unflatten(treedef: TreeDef, leaves) -> Any:
  return _unflatten(treedef, iter(leaves))


def _unflatten(td: TreeDef, it) -> Any:
  if td.kind == "leaf":
    return next(it)
  if td.kind == "none":
    return None
  kids = [_unflatten(c, it) for c in td.children]
  if td.kind == "tuple":
    return tuple(kids)
  if td.kind == "list":
    return kids
  if td.kind == "namedtuple":
    return td.meta(*kids)
  if td.kind == "custom":
    return _NODES[td.meta[0]][1](td.meta[1], kids)
  if td.kind == "jax":
    return sys.modules["jax"].tree_util.tree_unflatten(td.meta[1], kids)
  return dict(zip(td.meta, kids))


def tree_map(f, tree, *rest, is_leaf=None):
  leaves, td = tree_flatten(tree, is_leaf)
  others = [tree_flatten(r, is_leaf)[0] for r in rest]
  return tree_unflatten(td, [f(x, *xs) for x, *xs in zip(leaves, *others)])


def tree_leaves(tree, is_leaf=None) -> list:
  return tree_flatten(tree, is_leaf)[0]


# ---- source locations: the first frame outside the palace package is the user's line. ----
def user_frame_summary(skip_palace: bool = True) -> str:
  f = sys._getframe(1)
  while f is not None:
    fn = f.f_code.co_filename
    if not (skip_palace and os.path.abspath(fn).startswith(_PALACE_DIR + os.sep)):
      if "pytest" not in fn and "pluggy" not in fn:
        return f"{os.path.basename(fn)}:{f.f_lineno}"
    f = f.f_back
  return "<unknown>"


_IS_PALACE_CODE: dict = {}


def user_site() -> tuple[str, int]:
  """(filename, line) of the innermost frame outside palace; cheap enough to call per DMA start."""
  f = sys._getframe(1)
  cache = _IS_PALACE_CODE
  while f is not None:
    code = f.f_code
    inside = cache.get(code)
    if inside is None:
      inside = cache[code] = code.co_filename.startswith(_PALACE_DIR)
    if not inside:
      return code.co_filename, f.f_lineno
    f = f.f_back
  return "<unknown>", 0


def fmt_site(site: tuple[str, int] | None) -> str:
  if not site:
    return "<unknown>"
  return f"{os.path.basename(site[0])}:{site[1]}"


def fmt_bytes(n: float) -> str:
  n = float(n)
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{int(n)} B"
