"""Generate the API reference from the facades' docstrings.

Used two ways: as an mkdocs hook (mkdocs.yml `hooks:`), which fills the `<!-- generated -->` marker of
docs/api.md at build time, and as a script, `python docs/gen_api.py [out.md]`, which writes the page
without mkdocs. Every public name of a facade is listed, so new APIs appear without editing this file.
"""
from __future__ import annotations

import enum
import importlib
import inspect
import sys
import types

# (module, alias used in the docs, full entries?) — numpy and lax get a one-line table.
FACADES = (("palace", "pl", True), ("palace.tpu", "pltpu", True), ("palace.tpu_sc", "plsc", True),
           ("palace.numpy", "jnp", False), ("palace.lax", "lax", False))
MARKER = "<!-- generated -->"


def _public(mod) -> list:
  names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
  return sorted(n for n in names if not isinstance(getattr(mod, n, None), types.ModuleType))


def _signature(obj) -> str:
  try:
    return str(inspect.signature(obj))
  except (TypeError, ValueError):
    return ""


def _summary(obj) -> str:
  doc = inspect.getdoc(obj) or ""
  return doc.strip().splitlines()[0] if doc.strip() else ""


def _entry(alias: str, name: str, obj) -> str:
  if isinstance(obj, enum.Enum):
    return f"### `{alias}.{name}`\n\n*constant* `{type(obj).__name__}.{obj.name}`: {_summary(type(obj))}\n"
  if inspect.isclass(obj) or callable(obj):
    kind = "class" if inspect.isclass(obj) else "function"
    head = f"### `{alias}.{name}{_signature(obj)}`\n\n*{kind}*"
    doc = inspect.getdoc(obj) or "(no docstring yet)"
  else:
    head = f"### `{alias}.{name}`\n\n*constant*"
    doc = f"= {obj!r}"
  return f"{head}\n\n```text\n{doc}\n```\n"


def render() -> str:
  out = []
  for modname, alias, full in FACADES:
    try:
      mod = importlib.import_module(modname)
    except ImportError as e:  # pragma: no cover - a facade missing is a broken install
      out.append(f"## `{modname}`\n\nnot importable: {e}\n")
      continue
    names = _public(mod)
    out.append(f"## `{modname}` (`{alias}`), {len(names)} names\n")
    if full:
      out += [_entry(alias, n, getattr(mod, n)) for n in names]
    else:
      rows = [f"| `{alias}.{n}` | {_summary(getattr(mod, n)).replace('|', '/')} |" for n in names]
      out.append("| name | summary |\n|---|---|\n" + "\n".join(rows) + "\n")
  return "\n".join(out)


def on_page_markdown(markdown, page, **kwargs):  # mkdocs hook
  if page.file.src_path == "api.md" and MARKER in markdown:
    return markdown.replace(MARKER, render())
  return markdown


if __name__ == "__main__":
  text = open(__file__.replace("gen_api.py", "api.md")).read().replace(MARKER, render())
  if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
      f.write(text)
  else:
    print(text)
