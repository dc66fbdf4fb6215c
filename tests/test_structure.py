"""Architecture rules enforced by tests (style-anchors section 6.3): LAYOUT.md's layer table, no import
cycles, the sim/lang split, thin facades and the size budget.

Imports are read from the source (ast). Module-level imports (including those under a top-level
`if`/`try`) must follow the layer table and form no cycle; importing `a.b.c` also runs package `a.b`'s
`__init__`, so that edge counts too (except the root `palace`, which Python always initialises first,
and the packages the importing module is itself in).
Function-local imports run only after every module is loaded, so they cannot create an import cycle:
they are exempt from the cycle check but must still follow the layer table."""
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
# layer -> the modules in it (path prefixes under palace/, "/" for packages). Keep in step with LAYOUT.md.
LAYERS = {
    "L0": ("_src/util.py", "_src/errors.py", "_src/dtypes.py", "_src/blas.py", "_src/hostmem.py",
           "_src/validate.py"),
    "L1": ("_src/hw.py",),
    "L2": ("_src/core.py", "_src/blocks.py"),
    "L3": ("_src/executor.py",),
    "L4a": ("_src/lang/",),
    "L4b": ("_src/sim/",),
    "L5": ("_src/pipeline.py", "_src/emit_pipeline.py", "_src/block_offsets.py", "_src/launch/", "_src/jax/"),
    "L6": ("__init__.py", "tpu.py", "tpu_sc.py", "numpy.py", "lax.py", "compat.py", "jax.py"),
    "L7": ("_src/tools/",),
    "pkg": ("_src/__init__.py",),
}
# layer -> the layers its modules may import (its own layer always included)
MAY_IMPORT = {
    "L0": {"L0"},
    "L1": {"L0", "L1"},
    "L2": {"L0", "L1", "L2"},
    "L3": {"L0", "L1", "L2", "L3"},
    "L4a": {"L0", "L1", "L2", "L3", "L4a"},           # the language never imports the virtual TPU
    "L4b": {"L0", "L1", "L2", "L3", "L4b"},           # ... nor the virtual TPU the language
    "L5": {"L0", "L1", "L2", "L3", "L4a", "L4b", "L5"},
    # facades re-export everything, some tools included (autotune, explore, jax_callable); tools are
    # written against the facades. The one pair of layers importing both ways: the cycle test below
    # keeps it acyclic at module level.
    "L6": {"L0", "L1", "L2", "L3", "L4a", "L4b", "L5", "L6", "L7"},
    "L7": {"L0", "L1", "L2", "L3", "L4a", "L4b", "L5", "L6", "L7"},
    "pkg": {"pkg"},
}


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(SRC.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _layer(path: pathlib.Path):
  rel = str(path.relative_to(SRC))
  found = [name for name, prefixes in LAYERS.items()
           if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)]
  return found[0] if len(found) == 1 else None


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
def test_every_module_has_one_layer(path):
  assert _layer(path) is not None, (f"{path.relative_to(SRC)} is in no layer (or several) of LAYERS: add it "
                                    f"to the table here and in LAYOUT.md")


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_follow_the_layer_table(path):
  mine = _layer(path)
  bad = []
  for line, m in _palace_imports(path, module_level=False):
    theirs = _layer(MODULES[m])
    if theirs not in MAY_IMPORT[mine]:
      bad.append(f"line {line}: {m} ({theirs})")
  assert not bad, f"{path.relative_to(SRC)} ({mine}) imports {bad}; see LAYOUT.md's layer table"


def test_layout_md_lists_every_module_with_its_layer():
  """Each row of LAYOUT.md's table names a layer; every module's file must appear in a row of its layer."""
  text = (SRC.parent / "LAYOUT.md").read_text()
  rows = {}
  for line in text.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 3 and re.fullmatch(r"L\d[ab]?", cells[1]):
      rows.setdefault(cells[1], []).append(cells[0] + " " + cells[2])
  missing = []
  for path in sorted(SRC.rglob("*.py")):
    layer = _layer(path)
    if layer == "pkg" or path.name == "__init__.py" and layer != "L6":
      continue
    stem = path.stem if layer != "L6" else path.name
    if not any(re.search(rf"(?<![\w.]){re.escape(stem)}(?![\w])", r) for r in rows.get(layer, [])):
      missing.append(f"{path.relative_to(SRC)} ({layer})")
  assert not missing, f"LAYOUT.md's table does not list {missing} in their layer's row"


def test_no_module_level_import_cycles():
  graph = {}
  for m, path in MODULES.items():
    deps = set()
    for _, dep in _palace_imports(path, module_level=True):
      deps.add(dep)
      parts = dep.split(".")
      # package __init__s run first, except the packages `m` itself is in (already initialising)
      deps.update(pkg for pkg in (".".join(parts[:k]) for k in range(2, len(parts)))
                  if not m.startswith(pkg + "."))
    graph[m] = {d for d in deps if d in MODULES and d != m}
  state, stack = {}, []

  def visit(m):
    state[m] = "open"
    stack.append(m)
    for d in sorted(graph[m]):
      if state.get(d) == "open":
        cycle = stack[stack.index(d):] + [d]
        raise AssertionError("module-level import cycle: " + " -> ".join(cycle))
      if d not in state:
        visit(d)
    stack.pop()
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m)
