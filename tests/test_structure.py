"""Architecture rules enforced by tests (style-anchors section 6.3): LAYOUT.md's layer table (read from
LAYOUT.md itself: its rows' paths, layers and `imports` arrows), no import cycles, the sim/lang split,
no private executor state outside the executor and the machine, thin facades and the size budget.

Imports are read from the source (ast). Every import, function-local ones included, must be one of its
module's row's arrows. Module-level imports (including those under a top-level `if`/`try`) form no
cycle; importing `a.b.c` also runs package `a.b`'s `__init__`, so that edge counts too (except the root
`palace`, which Python always initialises first, and the packages the importing module is itself in).
Function-local imports run only after every module is loaded, so they cannot make an import fail, but
a cycle through them is still a tangle of two modules that need each other: all imports together form
no cycle either."""
import ast
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "palace"
MAX_LINES = 800


def _imports(path: pathlib.Path):
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
    elif isinstance(node, ast.Import):
      for a in node.names:
        yield a.name


def _files(sub):
  return sorted((SRC / sub).rglob("*.py"))


@pytest.mark.parametrize("path", _files("_src/sim"), ids=lambda p: p.name)
def test_simulator_never_imports_the_language(path):
  bad = [m for m in _imports(path) if m.startswith(("palace._src.lang", "palace._src.launch", "palace._src.tools"))
         or m in ("palace._src.pipeline", "palace._src.emit_pipeline")]
  assert not bad, f"{path.name} imports {bad}: the virtual TPU must not depend on the language side"


@pytest.mark.parametrize("path", _files("_src/lang"), ids=lambda p: p.name)
def test_language_never_imports_the_simulator(path):
  bad = [m for m in _imports(path) if m.startswith("palace._src.sim")]
  assert not bad, f"{path.name} imports {bad}: language ops reach the machine through executor.py"


# Tools built on the public API, as a user would write them (L7): the CLI, the demo, the JAX shim.
APPLICATIONS = ("_src/tools/")


@pytest.mark.parametrize("path", [p for p in _files("_src")
                                  if not str(p.relative_to(SRC)).startswith(APPLICATIONS)],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_src_never_imports_a_facade(path):
  facades = {"palace", "palace.tpu", "palace.tpu_sc", "palace.numpy", "palace.lax", "palace.compat"}
  bad = [m for m in _imports(path) if m in facades]
  assert not bad, f"{path.name} imports the facade(s) {bad}"


@pytest.mark.parametrize("path", [p for p in SRC.rglob("*.py")], ids=lambda p: str(p.relative_to(SRC)))
def test_file_size_budget(path):
  n = sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))
  assert n <= MAX_LINES, f"{path.relative_to(SRC)} has {n} code lines (budget {MAX_LINES}); split it"


def test_facades_only_reexport():
  for name in ("__init__.py", "tpu.py", "tpu_sc.py", "numpy.py", "lax.py"):
    tree = ast.parse((SRC / name).read_text())
    for node in tree.body:
      ok = isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign))
      if isinstance(node, ast.Assign):
        ok = isinstance(node.value, (ast.Name, ast.Attribute, ast.Constant))
      assert ok, f"{name} line {node.lineno}: facades only re-export (found {type(node).__name__})"


# ------------------------------------------------------------------ LAYOUT.md's layer table
ORDER = ("L0", "L1", "L2", "L3", "L4a", "L4b", "L5", "L6", "L7")
PKG = ("_src/__init__.py",)   # (the _src package itself: empty, in no row)


def _layout_rows() -> list:
  """[(path prefixes under palace/, layer, layers it may import, the row's text)] of LAYOUT.md's table.
  A row's first path is written from palace/ on; the others are in its folder (`errors.py` after
  `palace/_src/util.py`); a path ending in / is a package."""
  rows = []
  for line in (SRC.parent / "LAYOUT.md").read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 4 or not re.fullmatch(r"L\d[ab]?", cells[1]):
      continue
    paths = re.findall(r"`([^`]+)`", cells[0])
    folder = paths[0].rsplit("/", 1)[0] if "/" in paths[0].rstrip("/") else ""
    prefixes = [(q if "/" in q.rstrip("/") else f"{folder}/{q}").removeprefix("palace/") for q in paths]
    allowed = set()
    for part in cells[2].split(","):
      lo, _, hi = part.strip().partition("-")
      allowed.update(ORDER[ORDER.index(lo):ORDER.index(hi or lo) + 1])
    rows.append((tuple(prefixes), cells[1], allowed, cells[0] + " " + cells[3]))
  return rows


ROWS = _layout_rows()


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(SRC.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _rows_of(path: pathlib.Path) -> list:
  rel = str(path.relative_to(SRC))
  return [r for r in ROWS if any(rel == q or (q.endswith("/") and rel.startswith(q)) for q in r[0])]


def _layer(path: pathlib.Path):
  rows = _rows_of(path)
  return rows[0][1] if len(rows) == 1 else None


def _resolve(module: str, name: str | None) -> str | None:
  """The palace module an import names: `from a.b import c` is a.b.c when that is a module."""
  if name is not None and f"{module}.{name}" in MODULES:
    return f"{module}.{name}"
  return module if module in MODULES else None


def _palace_imports(path: pathlib.Path, module_level: bool):
  """(line, imported palace module) of the imports in `path`: module-level ones only, or all."""
  tree = ast.parse(path.read_text(), str(path))
  if module_level:
    nodes, todo = [], list(tree.body)
    while todo:
      n = todo.pop()
      nodes.append(n)
      if isinstance(n, (ast.If, ast.Try)):
        todo += n.body + n.orelse + getattr(n, "finalbody", []) + [x for h in getattr(n, "handlers", [])
                                                                   for x in h.body]
  else:
    nodes = list(ast.walk(tree))
  for n in nodes:
    if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "palace":
      for a in n.names:
        m = _resolve(n.module, a.name)
        if m:
          yield n.lineno, m
    elif isinstance(n, ast.Import):
      for a in n.names:
        m = _resolve(a.name, None)
        if m:
          yield n.lineno, m


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_is_in_one_row_of_layout_md(path):
  if str(path.relative_to(SRC)) in PKG:
    return
  rows = _rows_of(path)
  assert len(rows) == 1, (f"{path.relative_to(SRC)} is in {len(rows)} rows of LAYOUT.md's table: give it "
                          f"exactly one (a row's paths: its files, or its package ending in /)")


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_every_import_is_an_arrow_of_layout_md(path):
  if str(path.relative_to(SRC)) in PKG:
    assert not list(_palace_imports(path, module_level=False))
    return
  (_, mine, allowed, _), = _rows_of(path)
  bad = []
  for line, m in _palace_imports(path, module_level=False):
    if str(MODULES[m].relative_to(SRC)) in PKG:
      continue
    theirs = _layer(MODULES[m])
    if theirs not in allowed:
      bad.append(f"line {line}: {m} ({theirs})")
  assert not bad, (f"{path.relative_to(SRC)} ({mine}, may import {sorted(allowed)}) imports {bad}; see "
                   f"LAYOUT.md's layer table")


def test_the_jax_front_end_reaches_the_machine_through_the_language_and_launch():
  """jax/ imports neither executor.py nor sim/ (its LAYOUT.md row; checked here by name as well)."""
  bad = [(p.name, m) for p in _files("_src/jax") for _, m in _palace_imports(p, module_level=False)
         if m == "palace._src.executor" or m.startswith("palace._src.sim")]
  assert not bad, f"palace._src.jax imports {bad}: use the language's ops and launch/ instead"


def test_layout_md_lists_every_module_with_its_layer():
  """Each module's file (or package) is named in the text of its row: listed, not only matched."""
  missing = []
  for path in sorted(SRC.rglob("*.py")):
    rows = _rows_of(path)
    if len(rows) != 1 or path.name == "__init__.py" and rows[0][1] != "L6":
      continue
    stem = path.stem if rows[0][1] != "L6" else path.name
    if not re.search(rf"(?<![\w.]){re.escape(stem)}(?![\w])", rows[0][3]):
      missing.append(f"{path.relative_to(SRC)} ({rows[0][1]})")
  assert not missing, f"LAYOUT.md's table does not list {missing} in their layer's row"


def _private_reads(path: pathlib.Path, module: str) -> list:
  """(line, name) of every private name of palace module `module` read in `path`: `from module import
  _x`, or `alias._x` for an alias bound to the module (`from palace._src import executor`)."""
  tree = ast.parse(path.read_text(), str(path))
  parent, _, leaf = module.rpartition(".")
  aliases, out = set(), []
  for n in ast.walk(tree):
    if isinstance(n, ast.ImportFrom) and n.module == module:
      out += [(n.lineno, a.name) for a in n.names if a.name.startswith("_")]
    elif isinstance(n, ast.ImportFrom) and n.module == parent:
      aliases |= {a.asname or a.name for a in n.names if a.name == leaf}
    elif isinstance(n, ast.Import):
      aliases |= {a.asname for a in n.names if a.name == module and a.asname}
  for n in ast.walk(tree):
    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases and \
        n.attr.startswith("_"):
      out.append((n.lineno, n.attr))
  return out


@pytest.mark.parametrize("path", [p for p in SRC.rglob("*.py") if not str(p.relative_to(SRC)).startswith(
    ("_src/executor.py", "_src/sim/"))], ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_executor_or_machine_state_outside_them(path):
  bad = [(m, line, name) for m in MODULES if m == "palace._src.executor" or m.startswith("palace._src.sim.")
         for line, name in _private_reads(path, m)]
  assert not bad, (f"{path.relative_to(SRC)} reads private state {bad}: use the executor's and the "
                   f"machine's public members (executor.maybe_current, launch/host.on_tpu, ...)")


def _import_graph(module_level: bool) -> dict:
  """module -> the palace modules it imports: module-level imports (with the package __init__s they
  run first), or all imports, function-local ones included."""
  graph = {}
  for m, path in MODULES.items():
    deps = set()
    for _, dep in _palace_imports(path, module_level=True):
      deps.add(dep)
      parts = dep.split(".")
      # package __init__s run first, except the packages `m` itself is in (already initialising)
      deps.update(pkg for pkg in (".".join(parts[:k]) for k in range(2, len(parts)))
                  if not m.startswith(pkg + "."))
    if not module_level:
      deps.update(dep for _, dep in _palace_imports(path, module_level=False))
    graph[m] = {d for d in deps if d in MODULES and d != m}
  return graph


def _find_cycle(graph) -> list | None:
  state, stack = {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for d in sorted(graph[m]):
      if state.get(d) == "open":
        return stack[stack.index(d):] + [d]
      if d not in state:
        cycle = visit(d)
        if cycle:
          return cycle
    stack.pop()
    state[m] = "done"
    return None

  for m in sorted(graph):
    if m not in state:
      cycle = visit(m)
      if cycle:
        return cycle
  return None


def test_no_module_level_import_cycles():
  cycle = _find_cycle(_import_graph(module_level=True))
  assert cycle is None, "module-level import cycle: " + " -> ".join(cycle or ())


def test_no_import_cycles_with_function_local_imports():
  cycle = _find_cycle(_import_graph(module_level=False))
  assert cycle is None, "import cycle (function-local imports included): " + " -> ".join(cycle or ())


def test_the_checks_above_can_fail(tmp_path):
  assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _find_cycle({"a": {"b"}, "b": set()}) is None
  f = tmp_path / "m.py"
  f.write_text("from palace._src import executor\nfrom palace._src.executor import _current\n"
               "def g():\n  return executor._current.get\n")
  assert sorted(_private_reads(f, "palace._src.executor")) == [(2, "_current"), (4, "_current")]
  (jax_row,) = [r for r in ROWS if r[0] == ("_src/jax/",)]
  assert jax_row[1] == "L5" and jax_row[2] == {"L0", "L1", "L2", "L4a", "L5"}
  assert _layer(SRC / "_src" / "errors.py") == "L0" and _layer(SRC / "tpu.py") == "L6"
