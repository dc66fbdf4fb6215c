"""Every tutorial example under docs/examples runs (skipped, with the missing name, when its capability is
not built yet), and every tutorial chapter includes its example."""
import ast
import importlib
import os
import runpy
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("ch*.py"))


def _requires(path: Path) -> tuple:
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "REQUIRES" for t in node.targets):
      return tuple(ast.literal_eval(node.value))
  raise AssertionError(f"{path.name} has no REQUIRES = (...) line")


def _missing(name: str):
  """The first part of dotted `name` (palace.tpu.emit_pipeline) that does not exist, or None."""
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      if not hasattr(obj, attr):
        return name
      obj = getattr(obj, attr)
    return None
  return name


def test_there_is_one_example_per_chapter():
  chapters = sorted((DOCS / "tutorial").glob("*.md"))
  assert len(EXAMPLES) == len(chapters) == 9
  for ch, ex in zip(chapters, EXAMPLES):
    assert f"docs/examples/{ex.name}" in ch.read_text(), (ch.name, ex.name)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path, capsys):
  missing = [n for n in _requires(path) if _missing(n)]
  if missing:
    pytest.skip(f"not built yet: needs {', '.join(missing)}")
  cwd = os.getcwd()
  os.chdir(tmp_path)  # examples may write traces into the working directory
  try:
    runpy.run_path(str(path), run_name="__main__")
  finally:
    os.chdir(cwd)
  assert capsys.readouterr().out.strip()


def test_api_page_is_generated_from_docstrings():
  gen = runpy.run_path(str(DOCS / "gen_api.py"))
  text = gen["render"]()
  for name in ("### `pl.pallas_call(", "### `pl.autotune(", "### `pl.kernel(", "### `pltpu.VMEM`",
               "| `jnp.dot` |"):
    assert name in text, name
  assert "Rank `configs` by the modelled time" in text
  assert gen["MARKER"] in (DOCS / "api.md").read_text()


def test_mkdocs_nav_points_at_existing_pages():
  nav = [line.split(": ", 1)[1].strip() for line in (DOCS.parent / "mkdocs.yml").read_text().splitlines()
         if line.strip().startswith("- ") and line.strip().endswith(".md")]
  assert len(nav) >= 13
  for page in nav:
    assert (DOCS / page).exists(), page
