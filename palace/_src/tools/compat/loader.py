"""Load a module written for JAX Pallas with its `jax` imports resolved to palace, for it alone.

How the isolation works: the module's source is compiled and executed in a fresh module object whose
`__builtins__` is a copy of the builtins with its own `__import__`. That function answers `jax` and
`jax.*` from a per-load table of shim modules (see shim.py) and passes every other import to the real
`__import__`. Nothing is written to `sys.modules`, so other modules (and later imports of `jax`)
still get the real JAX if it is installed. Kernels that ship inside the jax wheel import their siblings
as `jax.experimental.pallas.ops.tpu.<...>`: those are loaded from the wheel's source files through the
same importer (the files are found without importing JAX).

Loaded modules behave like imported ones: the user's own modules (the loaded file's package, or its
directory for a plain file, like a script's directory on sys.path) are loaded through the same shim when
the module imports them, absolutely (`import helpers`, `from mypkg import util`) or relatively
(`from . import util`); the module is in `sys.modules` while its top level runs (dataclasses, enum and
typing look classes' modules up there), and its code is compiled with its own `__future__` flags.
"""
from __future__ import annotations

import builtins
import importlib.util
import io
import os
import sys
import tokenize
import types
from pathlib import Path

from palace._src.tools.compat import shim
from palace._src.errors import UnsupportedError, UsageError

_OPS = "jax.experimental.pallas.ops"
_MISSING = object()


class World:
  """One load: the shim table plus every jax-wheel source module loaded through it."""

  def __init__(self, jax_root: Path | None, user_root: Path | None = None, user_top: str | None = None):
    self.modules: dict = shim.build_shim()
    self.jax_root = jax_root
    # the user's own modules: under user_root, in the package user_top (None: any module file there,
    # as for a script's directory)
    self.user_root, self.user_top = user_root, user_top
    b = dict(builtins.__dict__)
    b["__import__"] = self.import_
    self.builtins = b

  # -------------------------------------------------------------- import
  def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
    if level:
      pkg = (globals or {}).get("__package__") or ""
      if not pkg.startswith("jax") and self.user_file(pkg) is None:
        return builtins.__import__(name, globals, locals, fromlist, level)
      name = importlib.util.resolve_name("." * level + name, pkg) if name else \
          importlib.util.resolve_name("." * level, pkg)
    is_jax = name == "jax" or name.startswith("jax.")
    if not is_jax and self.user_file(name) is None:
      return builtins.__import__(name, globals, locals, fromlist, 0)
    mod = self.get(name)
    if fromlist:
      for f in fromlist:
        if f != "*" and f not in mod.__dict__ and (name.startswith(_OPS) or not is_jax):
          sub = f"{name}.{f}"
          if is_jax or self.user_file(sub) is not None:
            self.get(sub)
      return mod
    return self.get(name.partition(".")[0])

  def user_file(self, name: str) -> Path | None:
    """The source file of the user's own module `name` (under user_root), or None."""
    if self.user_root is None or not name or name == "jax" or name.startswith("jax."):
      return None
    if self.user_top is not None and name.partition(".")[0] != self.user_top:
      return None
    base = self.user_root.joinpath(*name.split("."))
    for f in (base / "__init__.py", base.with_suffix(".py")):
      if f.is_file():
        return f
    return None

  def get(self, name: str):
    if name in self.modules:
      return self.modules[name]
    parent, _, child = name.rpartition(".")
    f = self.user_file(name)
    if f is not None:   # the user's own module: through this shim too (parents first, as imports do)
      pmod = self.get(parent) if parent else None
      mod = self.modules.get(name) or self.exec_file(name, f, package=f.name == "__init__.py")
      if pmod is not None:
        setattr(pmod, child, mod)
      return mod
    if name == _OPS or name.startswith(_OPS + "."):
      pmod = self.get(parent)
      mod = self._load_wheel_module(name)
      setattr(pmod, child, mod)
      return mod
    raise UnsupportedError(f"`import {name}`: palace's JAX shim (palace.compat.load_module) does not "
                           f"provide the module `{name}`. Fix: import the palace equivalent (palace, "
                           f"palace.tpu, palace.numpy), or run the file with real JAX.")

  def _load_wheel_module(self, name: str):
    root = self.jax_root or _installed_jax_root()
    if root is None:
      raise UnsupportedError(f"`import {name}`: the kernels shipped in the jax wheel are loaded from its "
                             f"source files, and no jax installation was found. Fix: pass the file path to "
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
    raise UnsupportedError(f"`import {name}`: no such module in the jax sources at {root}. Fix: check "
                           f"the module name against that jax version's sources.")

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
    src = _source_text(Path(file))
    mod = self.new_module(name, file, package)
    if run_name is not None:
      mod.__name__ = run_name
    # dont_inherit: the module's own `from __future__` lines only (not this file's annotations flag)
    code = compile(src, str(file), "exec", dont_inherit=True)
    key = mod.__name__
    before = sys.modules.get(key, _MISSING)
    sys.modules[key] = mod   # while its top level runs, as importing does (dataclasses look it up)
    try:
      exec(code, mod.__dict__)  # noqa: S102  (loading the user's module is the point)
    except BaseException:
      self.modules.pop(name, None)
      raise
    finally:
      # then the entry goes again: later real imports of `jax...` or of this name get the real module
      if sys.modules.get(key) is mod:
        if before is _MISSING:
          del sys.modules[key]
        else:
          sys.modules[key] = before
    return mod


def _source_text(path: Path) -> str:
  """A module's source as Python reads it (PEP 263: a coding line, else UTF-8); a file that is not
  Python text (binary, another encoding without its coding line) is a UsageError, not a decode error."""
  data = path.read_bytes()
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
  except (SyntaxError, UnicodeDecodeError, LookupError) as e:
    raise UsageError(f"palace.compat.load_module: {path} is not Python source text ({e}). Fix: pass "
                     f"a .py file (UTF-8, or with a '# -*- coding: ...' line).") from None
  if "\0" in text:
    raise UsageError(f"palace.compat.load_module: {path} is not Python source text (it contains a NUL "
                     f"byte, as binary files do). Fix: pass a .py file.")
  return text


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
                       f"loaded by name from the jax wheel. Fix: pass a name under {_OPS}, or a file path.")
    root = _installed_jax_root()
    if root is None:
      raise UsageError(f"palace.compat.load_module({s!r}): jax is not installed, so its kernel files "
                       f"cannot be found. Fix: pass a file path (or pip install jax).")
    rel = Path(*s.split("."))
    f = root / rel.with_suffix(".py")
    if not f.is_file():
      f = root / rel / "__init__.py"
    if not f.is_file():
      raise UsageError(f"palace.compat.load_module({s!r}): no such module in {root}. Fix: check the "
                       f"module name, or pass a file path.")
    return f, s, root
  try:
    spec = importlib.util.find_spec(s)
  except (ImportError, ValueError) as e:
    raise UsageError(f"palace.compat.load_module({s!r}): {e}. Fix: pass an importable module name "
                     f"or a file path.") from None
  if spec is None or not spec.origin or not spec.origin.endswith(".py"):
    raise UsageError(f"palace.compat.load_module({s!r}): no Python source file found for it. Fix: "
                     f"pass the path of the .py file.")
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
  if root is not None:   # a jax-wheel kernel: its siblings come from the jax sources
    world = World(root)
  else:
    name, user_root, user_top = _user_package(f, name)
    world = World(None, user_root, user_top)
  package = f.name == "__init__.py"
  parent, _, child = name.rpartition(".")
  pmod = world.get(parent) if parent and world.user_file(parent) is not None else None
  mod = world.exec_file(name, f, package=package)   # its packages ran first, as an import does
  if pmod is not None:
    setattr(pmod, child, mod)
  return mod


def _user_package(f: Path, name: str) -> tuple[str, Path, str | None]:
  """(module name, root directory, top-level package or None) of a user's module file: a file in a
  package (directories with __init__.py) is named and resolved as importing it would; a plain file
  sees its directory's modules, as a script does."""
  d = f.parent
  parts = [] if f.name == "__init__.py" else [f.stem]
  while (d / "__init__.py").is_file() and d.parent != d:
    parts.insert(0, d.name)
    d = d.parent
  if len(parts) <= 1 and f.name != "__init__.py":
    return name if "." in name else f.stem, f.parent, None
  return ".".join(parts), d, parts[0]


def run_path(path, run_name: str = "__main__", argv=None):
  """Execute a JAX Pallas script with palace behind its jax imports (as `python FILE` would).

  Returns the module's globals. The script's directory is put first on sys.path and sys.argv is set
  to [path, *argv] while it runs."""
  p = Path(path).resolve()
  if not p.is_file():
    raise UsageError(f"palace.compat.run_path({path!r}): no such file. Fix: check the path "
                     f"(relative paths start at {os.getcwd()}).")
  root = _root_of(p)
  world = World(root) if root is not None else World(None, p.parent, None)
  old_argv, old_path = sys.argv, list(sys.path)
  sys.argv = [str(p), *(argv or ())]
  sys.path.insert(0, str(p.parent))
  try:
    mod = world.exec_file(p.stem, p, run_name=run_name)
  finally:
    sys.argv, sys.path[:] = old_argv, old_path
  return mod.__dict__


def run_pallas_file(path, chip="v5e", num_chips: int = 1, argv=None, **tpu_kwargs):
  """Run a JAX Pallas script as `__main__` on a fresh `pl.virtual_tpu(chip, num_chips)`.

  Its `import jax ...` lines give palace (see load_module). Returns the VirtualTPU, whose `.reports`
  hold one report per kernel launch."""
  from palace._src.sim.machine import VirtualTPU  # noqa: PLC0415
  tpu = VirtualTPU(chip, num_chips, **tpu_kwargs)
  with tpu:
    run_path(path, "__main__", argv)
  return tpu
