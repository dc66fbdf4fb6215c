"""Architecture rules enforced by tests (style-anchors section 6.3): layering and a size budget."""
import ast
import pathlib

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
         or m == "palace._src.pipeline"]
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
