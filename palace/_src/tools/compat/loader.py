"""Load a module written for JAX Pallas with its `jax` imports resolved to palace, for it alone.

How the isolation works: the module's source is compiled and executed in a fresh module object whose
`__builtins__` is a copy of the builtins with its own `__import__`. That function answers `jax` and
`jax.*` from a per-load table of shim modules (see shim.py) and passes every other import to the real
`__import__`. Nothing is written to `sys.modules`, so other modules (and later imports of `jax`)
still get the real JAX if it is installed. Kernels that ship inside the jax wheel import their siblings
as `jax.experimental.pallas.ops.tpu.<...>`: those are loaded from the wheel's source files through the
same importer (the files are found without importing JAX).
"""
from __future__ import annotations

import builtins
import importlib.util
import os
import sys
import types
from pathlib import Path

from palace._src.tools.compat import shim
from palace._src.errors import UnsupportedError, UsageError

_OPS = "jax.experimental.pallas.ops"


class World:
  """One load: the shim table plus every jax-wheel source module loaded through it."""

  def __init__(self, jax_root: Path | None):
    self.modules: dict = shim.build_shim()
    self.jax_root = jax_root
    b = dict(builtins.__dict__)
    b["__import__"] = self.import_
    self.builtins = b

  # -------------------------------------------------------------- import
  def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
    if level:
      pkg = (globals or {}).get("__package__") or ""
      if not pkg.startswith("jax"):
        return builtins.__import__(name, globals, locals, fromlist, level)
      name = importlib.util.resolve_name("." * level + name, pkg) if name else \
          importlib.util.resolve_name("." * level, pkg)
    if name != "jax" and not name.startswith("jax."):
      return builtins.__import__(name, globals, locals, fromlist, 0)
    mod = self.get(name)
    if fromlist:
      for f in fromlist:
        if f != "*" and f not in mod.__dict__ and name.startswith(_OPS):
          self.get(f"{name}.{f}")
      return mod
    return self.get("jax")

  def get(self, name: str):
    if name in self.modules:
      return self.modules[name]
    parent, _, child = name.rpartition(".")
    if name == _OPS or name.startswith(_OPS + "."):
      pmod = self.get(parent)
      mod = self._load_wheel_module(name)
      setattr(pmod, child, mod)
      return mod
    raise UnsupportedError(f"`import {name}`: palace's JAX shim (palace.compat.load_module) does not "
                           f"provide the module `{name}`.")

  def _load_wheel_module(self, name: str):
    root = self.jax_root or _installed_jax_root()
    if root is None:
      raise UnsupportedError(f"`import {name}`: the kernels shipped in the jax wheel are loaded from its "
                             f"source files, and no jax installation was found; pass the file path to "
                             f"palace.compat.load_module instead.")
    rel = Path(*name.split("."))
    pkg_init = root / rel / "__init__.py"
    if name == _OPS or name == _OPS + ".tpu":  # the ops packages' __init__ files are empty shells
      return self.new_module(name, None, package=True, path=root / rel)
    if pkg_init.is_file():
      return self.exec_file(name, pkg_init, package=True)
    f = root / rel.with_suffix(".py")
    if f.is_file():
      return self.exec_file(name, f)
    raise UnsupportedError(f"`import {name}`: no such module in the jax sources at {root}.")

  # -------------------------------------------------------------- modules
  def new_module(self, name, file, package=False, path=None):
    mod = types.ModuleType(name)
    mod.__builtins__ = self.builtins
    if file is not None:
      mod.__file__ = str(file)
    if package:
      mod.__path__ = [str(path or Path(file).parent)]
      mod.__package__ = name
    else:
      mod.__package__ = name.rpartition(".")[0]
    mod.__palace_compat__ = self   # the World: .modules["jax"] is the shim this module sees
    self.modules[name] = mod
    return mod

  def exec_file(self, name, file, package=False, run_name=None):
    src = Path(file).read_text()
    mod = self.new_module(name, file, package)
    if run_name is not None:
      mod.__name__ = run_name
    code = compile(src, str(file), "exec")
    try:
      exec(code, mod.__dict__)  # noqa: S102  (loading the user's module is the point)
    except BaseException:
      self.modules.pop(name, None)
      raise
    return mod


def _installed_jax_root() -> Path | None:
  """The directory holding the installed `jax` package, found without importing it."""
  try:
    spec = importlib.util.find_spec("jax")
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.origin:
    return None
  return Path(spec.origin).parent.parent


def _root_of(path: Path) -> Path | None:
  parts = path.resolve().parts
  for i in range(len(parts) - 4):
    if parts[i:i + 4] == ("jax", "experimental", "pallas", "ops"):
      return Path(*parts[:i])
  return None


def _resolve(path_or_name) -> tuple[Path, str, Path | None]:
  """(file, module name, jax source root) for a path or a dotted module name."""
  if not isinstance(path_or_name, (str, os.PathLike)) or not os.fspath(path_or_name):
    raise UsageError(f"palace.compat.load_module({path_or_name!r}): expected a path to a .py file or a "
                     f"dotted module name under {_OPS}. Fix: pass e.g. 'my_kernels.py'.")
  s = os.fspath(path_or_name)
  p = Path(s)
  if p.is_dir():
    raise UsageError(f"palace.compat.load_module({s!r}) is a directory. Fix: pass one of its .py files "
                     f"(sibling modules it imports are found through it).")
  if s.endswith(".py") or os.sep in s or p.is_file():
    if not p.is_file():
      raise UsageError(f"palace.compat.load_module({s!r}): no such file. Fix: check the path (relative "
                       f"paths start at the current directory, {os.getcwd()}).")
    return p.resolve(), p.stem, _root_of(p)
  if s == "jax" or s.startswith("jax."):
    if not s.startswith(_OPS + "."):
      raise UsageError(f"palace.compat.load_module({s!r}): only kernel modules under {_OPS} can be "
                       f"loaded by name from the jax wheel.")
    root = _installed_jax_root()
    if root is None:
      raise UsageError(f"palace.compat.load_module({s!r}): jax is not installed, so its kernel files "
                       f"cannot be found; pass a file path.")
    rel = Path(*s.split("."))
    f = root / rel.with_suffix(".py")
    if not f.is_file():
      f = root / rel / "__init__.py"
    if not f.is_file():
      raise UsageError(f"palace.compat.load_module({s!r}): no such module in {root}.")
    return f, s, root
  try:
    spec = importlib.util.find_spec(s)
  except (ImportError, ValueError) as e:
    raise UsageError(f"palace.compat.load_module({s!r}): {e}") from None
  if spec is None or not spec.origin or not spec.origin.endswith(".py"):
    raise UsageError(f"palace.compat.load_module({s!r}): no Python source file found for it.")
  return Path(spec.origin), s, _root_of(Path(spec.origin))


def load_module(path_or_name):
  """Import a module written for JAX Pallas with its jax imports resolved to palace.

  `path_or_name` is a `.py` file, a dotted module name findable on `sys.path`, or the name of a kernel
  module inside the jax wheel (`"jax.experimental.pallas.ops.tpu.matmul"`, needs jax installed only
  for its source files). The import of `jax`, `jax.numpy`, `jax.lax`, `jax.experimental.pallas`,
  `...pallas.tpu` and `...pallas.tpu_sc` inside that module (and inside jax-wheel modules it imports)
  gives palace; nothing global changes. Each call loads a fresh copy.

  Example:
    >>> mm = palace.compat.load_module("my_kernels.py")
    >>> with pl.virtual_tpu("v5e"):
    ...   out = mm.matmul(x, y, block_shape=(128, 128))
  """
  f, name, root = _resolve(path_or_name)
  world = World(root)
  package = f.name == "__init__.py"
  return world.exec_file(name, f, package=package)


def run_path(path, run_name: str = "__main__", argv=None):
  """Execute a JAX Pallas script with palace behind its jax imports (as `python FILE` would).

  Returns the module's globals. The script's directory is put first on sys.path and sys.argv is set
  to [path, *argv] while it runs."""
  p = Path(path).resolve()
  if not p.is_file():
    raise UsageError(f"palace.compat.run_path({path!r}): no such file.")
  world = World(_root_of(p))
  old_argv, old_path = sys.argv, list(sys.path)
  sys.argv = [str(p), *(argv or ())]
  sys.path.insert(0, str(p.parent))
  try:
    mod = world.exec_file(p.stem, p, run_name=run_name)
  finally:
    sys.argv, sys.path[:] = old_argv, old_path
  return mod.__dict__
