"""Every user error says what to do (issue 15): a structural test over palace/_src.

It parses every module with `ast`, finds every construction of a PalaceError subclass
(`raise UsageError(...)`, `return ShapeError(...)`, `err = SyncError(...)`, `UnsupportedError.feature(api,
hint)`, and `raise error(...)` where `error` is a parameter defaulting to one), reads the message as far
as it is written in the source (string literals, f-strings and their named parts, `+` concatenations,
`.format`, conditional expressions and local variables assigned from those), and requires the fix
clause marker `Fix: ` followed by an instruction in every branch of it.

The convention (palace/_src/errors.py): a message states `<what> for <operand> [at <place>]: <observed>;
expected <expected>.` and then `Fix: <an imperative: use / pass / make ... / call ...>`.

Two explicit allow-lists, keyed by `path:function`, each entry with its reason:
- INTERNAL: errors that are not user mistakes (a gap in palace's own rules, to be reported), so there is
  no fix to give the user;
- BUILT_ELSEWHERE: another error's text re-raised with context (its fix is checked where it is built).
Messages built elsewhere are followed: a message builder's return values (`self._vmem_message(...)`),
and a parameter forwarded from the callers (`_unsupported(api, hint)`, the `describe` callbacks of
`validate.check_call`), whose every caller's argument is read instead.
A new raise without `Fix: ` fails `test_every_user_error_message_has_a_fix`; an allow-list entry that is
no longer needed fails `test_allow_lists_have_no_stale_entries`. Counts per file:
`python tests/robustness/test_message_fix_clauses.py`."""
from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "palace" / "_src"
FIX = "Fix: "
# After the marker: an instruction, i.e. a word (or a placeholder that substitutes one, e.g. a hint).
_FIX_RE = re.compile(r"Fix: (\{\}|[`'\"(]?[A-Za-z])")

INTERNAL = {
    "jax/interpret.py:_wrong_type": "a palace interpreter rule gave a value of the wrong type: a palace "
                                    "bug the message asks to report, not a user mistake",
    "jax/interpret.py:run_program": "JAX handed palace's interpreter a jaxpr and values that disagree: "
                                   "an internal inconsistency",
}
BUILT_ELSEWHERE = {
    "emit_pipeline.py:_mapping": "re-raises the text of a BlockSpecError from blocks.canonicalize (whose fix "
                                 "is checked there) with the emit_pipeline operand added",
}


def _error_classes(trees) -> set[str]:
  """PalaceError and every class in palace/_src derived from it (by name, to a fixpoint)."""
  names = {"PalaceError"}
  changed = True
  while changed:
    changed = False
    for tree in trees.values():
      for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name not in names:
          bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases}
          if bases & names:
            names.add(node.name)
            changed = True
  return names


def _name(func) -> str | None:
  return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _function_of(parents, node):
  """The innermost function or lambda strictly enclosing `node`, or None at module level."""
  node = parents.get(node)
  while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
    node = parents.get(node)
  return node


def _params(fn) -> list[str]:
  a = fn.args
  return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


class _Source:
  """Every module's tree, with what the message reader needs: parents, functions by name, and the calls
  to each function name (module-level aliases `f = validate.check_call` and `import ... as` followed)."""

  def __init__(self, trees):
    self.trees = trees
    self.parents = {}
    self.functions = collections.defaultdict(list)
    self.calls = collections.defaultdict(list)
    alias = {}
    for tree in trees.values():
      for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
          self.parents[child] = node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          self.functions[node.name].append(node)
        elif isinstance(node, ast.ImportFrom):
          alias.update({a.asname: a.name for a in node.names if a.asname})
      for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.Name, ast.Attribute))):
          alias[node.targets[0].id] = _name(node.value)
    for tree in trees.values():
      for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func):
          name = _name(node.func)
          self.calls[alias.get(name, name)].append(node)

  def function_of(self, node):
    return _function_of(self.parents, node)

  def texts(self, node, depth=0) -> list[str] | None:
    """The message `node` as written: literal parts kept, computed parts as `{}`, one string per
    branch (conditional expressions, variables assigned several times, every caller's argument for a
    parameter); None when it is not written anywhere this reader can follow."""
    if depth > 10:
      return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      return [node.value]
    if isinstance(node, ast.JoinedStr):   # a named part (`{hint}`) is read where it is assigned
      out = [""]
      for v in node.values:
        part = ["{}"]
        if isinstance(v, ast.Constant):
          part = [v.value]
        elif isinstance(v.value, ast.Name) and v.format_spec is None:
          part = self.texts(v.value, depth + 1) or ["{}"]
        out = [a + b for a in out for b in part][:64]
      return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
      left, right = self.texts(node.left, depth + 1), self.texts(node.right, depth + 1)
      if left is None and right is None:
        return None
      return [a + b for a in (left or ["{}"]) for b in (right or ["{}"])]
    if isinstance(node, ast.IfExp):
      body, orelse = self.texts(node.body, depth + 1), self.texts(node.orelse, depth + 1)
      return None if body is None or orelse is None else body + orelse
    if isinstance(node, ast.Name):
      return self._variable(node, depth)
    if isinstance(node, ast.Call):
      if isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return self.texts(node.func.value, depth + 1)
      if isinstance(node.func, ast.Name) and self._owner(node, node.func.id):   # describe(e): a callback
        args = self._arguments(node, node.func.id)
        if not args or not all(isinstance(a, ast.Lambda) for a in args):
          return None
        return self._union([self.texts(a.body, depth + 1) for a in args])
      builders = self.functions.get(_name(node.func) or "", [])
      if len(builders) == 1:   # a message builder: every value it returns
        returns = [r.value for r in ast.walk(builders[0]) if isinstance(r, ast.Return) and r.value is not None
                   and not (isinstance(r.value, ast.Constant) and r.value.value is None)]   # "no error"
        return self._union([self.texts(r, depth + 1) for r in returns]) if returns else None
    return None

  @staticmethod
  def _union(parts):
    return None if not parts or any(p is None for p in parts) else [t for p in parts for t in p]

  def _owner(self, node, name):
    """The innermost enclosing function that has `name` as a parameter."""
    fn = self.function_of(node)
    while fn is not None:
      if name in _params(fn):
        return fn
      fn = self.function_of(fn)
    return None

  def _variable(self, node, depth):
    fn = self.function_of(node)
    while fn is not None:
      if not isinstance(fn, ast.Lambda):
        values = [(n.value, isinstance(n, ast.AugAssign)) for n in ast.walk(fn)
                  if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id
                                                        for t in n.targets))
                  or (isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
                      and n.target.id == node.id)]
        if any(not aug for _, aug in values):
          base = self._union([self.texts(v, depth + 1) for v, aug in values if not aug])
          if base is None:
            return None
          suffix = "".join((self.texts(v, depth + 1) or ["{}"])[0] for v, aug in values if aug)
          return [b + suffix for b in base]
      if node.id in _params(fn):
        args = self._arguments(node, node.id)
        return self._union([self.texts(a, depth + 1) for a in args]) if args else None
      fn = self.function_of(fn)
    return None

  def _arguments(self, node, param):
    """What the callers of the function owning `param` pass for it (its default when they omit it)."""
    fn = self._owner(node, param)
    if fn is None or isinstance(fn, ast.Lambda):
      return []
    names = _params(fn)
    positional = [x.arg for x in fn.args.posonlyargs + fn.args.args]
    defaults = dict(zip(positional[len(positional) - len(fn.args.defaults):], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    offset = 1 if names and names[0] in ("self", "cls") else 0
    out = []
    for call in self.calls.get(fn.name, []):
      kw = {k.arg: k.value for k in call.keywords}
      i = positional.index(param) - offset if param in positional else None
      if param in kw:
        out.append(kw[param])
      elif i is not None and 0 <= i < len(call.args) and not isinstance(call.args[i], ast.Starred):
        out.append(call.args[i])
      elif param in defaults:
        out.append(defaults[param])
      else:
        return []
    return out


def _constructions(trees=None):
  """[(key 'path:function', line, class, texts or None)] for every PalaceError construction."""
  trees = trees or {p: ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}
  classes = _error_classes(trees)
  source = _Source(trees)
  out = []
  for path, tree in trees.items():
    rel = str(path.relative_to(SRC)) if isinstance(path, pathlib.Path) else path
    for node in ast.walk(tree):
      if not isinstance(node, ast.Call):
        continue
      fn = source.function_of(node)
      while isinstance(fn, ast.Lambda):
        fn = source.function_of(fn)
      name = _name(node.func)
      msg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "msg"), None)
      if name in classes:
        cls = name
      elif (name == "feature" and isinstance(node.func, ast.Attribute)
            and _name(node.func.value) in classes):
        cls = f"{_name(node.func.value)}.feature"   # `api` is not supported in palace yet. <hint>
        msg = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "hint"), None)
      elif (isinstance(node.func, ast.Name) and fn is not None
            and _param_default(fn, node.func.id) in classes):
        cls = f"{node.func.id}={_param_default(fn, node.func.id)}"
      else:
        continue
      key = f"{rel}:{fn.name if fn is not None else '<module>'}"
      texts = [""] if msg is None else source.texts(msg)
      out.append((key, node.lineno, cls, texts))
  return out


def _param_default(fn, param: str) -> str | None:
  args = fn.args.args + fn.args.kwonlyargs
  defaults = [None] * (len(fn.args.args) - len(fn.args.defaults)) + fn.args.defaults + fn.args.kw_defaults
  for a, d in zip(args, defaults):
    if a.arg == param and d is not None:
      return _name(d)
  return None


def _has_fix(text: str) -> bool:
  return bool(_FIX_RE.search(text))


CONSTRUCTIONS = _constructions()


def _missing(constructions):
  missing, nonliteral = [], []
  for key, line, cls, texts in constructions:
    where = f"palace/_src/{key.split(':')[0]}:{line} ({key.split(':')[1]}, {cls})"
    if key in INTERNAL:
      continue
    if key in BUILT_ELSEWHERE:
      continue
    if texts is None:
      nonliteral.append(where)
      continue
    bad = [t for t in texts if not _has_fix(t)]
    if bad:
      missing.append(f"{where}: {bad[0][:140]!r}")
  return missing, nonliteral


def test_every_user_error_message_has_a_fix():
  missing, nonliteral = _missing(CONSTRUCTIONS)
  assert not missing, (f"{len(missing)} user error message(s) without a fix clause ('{FIX}<what to do>'); "
                       f"add one, or list the function in INTERNAL with the reason it is not a user "
                       f"error:\n  " + "\n  ".join(missing))
  assert not nonliteral, ("messages not written at the construction site (write them there, or list "
                          "the function in BUILT_ELSEWHERE with where the text is checked):\n  "
                          + "\n  ".join(nonliteral))


def test_allow_lists_have_no_stale_entries():
  needed = {key for key, _, _, texts in CONSTRUCTIONS
            if texts is None or not all(_has_fix(t) for t in texts)}
  for name, allowed in (("INTERNAL", INTERNAL), ("BUILT_ELSEWHERE", BUILT_ELSEWHERE)):
    stale = sorted(set(allowed) - needed)
    assert not stale, f"stale {name} entries (gone, or every message there has a fix now): {stale}"


def test_the_scan_sees_the_user_errors():
  """Guards the scanner itself: it finds the known constructions of each kind."""
  kinds = collections.Counter(cls.split("=")[0].split(".")[0] for _, _, cls, _ in CONSTRUCTIONS)
  assert len(CONSTRUCTIONS) > 250, len(CONSTRUCTIONS)
  for cls in ("UsageError", "ShapeError", "BlockSpecError", "OutOfBoundsError", "ResourceError",
              "SyncError", "UnsupportedError", "MemorySpaceError", "MissingNameError"):
    assert kinds[cls], f"no construction of {cls} found: the scanner is broken"
  assert any(cls.startswith("error=") for _, _, cls, _ in CONSTRUCTIONS)   # validate's `error=` parameter
  assert any(cls.endswith(".feature") for _, _, cls, _ in CONSTRUCTIONS)


@pytest.mark.parametrize("source,ok", [
    ('raise UsageError(f"pl.ds size {n} is negative.")', False),
    ('raise UsageError(f"pl.ds size {n} is negative. Fix: pass a size >= 0.")', True),
    ('raise UsageError("x is bad. " + ("Fix: use y." if a else "see docs"))', False),
    ('raise UsageError("x is bad. " + ("Fix: use y." if a else "Fix: use z."))', True),
    ('msg = f"x {a} is bad."\nraise ShapeError(msg)', False),
    ('msg = f"x {a} is bad."\nmsg += " Fix: pass y."\nraise ShapeError(msg)', True),
    ('raise UnsupportedError.feature("pl.foo")', False),
    ('raise UnsupportedError.feature("pl.foo", "Fix: use pl.bar.")', True),
    ('return SyncError("Semaphore left at 1. Fix:")', False),
    ('raise UsageError("x. Fix: {}".format(hint))', True),
    ('raise UsageError(hint)', False),   # a parameter nobody passes: not written anywhere
    ('def g(x):\n  return f"bad {x}."\nraise UsageError(g(a))', False),   # a builder without a fix
    ('def g(x):\n  return f"bad {x}. Fix: pass 1."\nraise UsageError(g(a))', True),
    ('def g(x, describe, error=UsageError):\n  raise error(describe(x))\n'
     'g(1, lambda e: f"bad {e}.")', False),   # validate.check_call's callbacks are read at the caller
    ('def g(x, describe, error=UsageError):\n  raise error(describe(x))\n'
     'g(1, lambda e: f"bad {e}. Fix: pass 2.")', True),
])
def test_the_checker_rejects_a_message_without_a_fix(source, ok):
  """A new raise without a fix makes the main test fail: the same reader on a snippet."""
  tree = ast.parse("class PalaceError(Exception): pass\n"
                   "class UsageError(PalaceError): pass\nclass ShapeError(PalaceError): pass\n"
                   "class SyncError(PalaceError): pass\nclass UnsupportedError(PalaceError): pass\n"
                   "def f(a, n, hint):\n" + "\n".join("  " + line for line in source.splitlines()))
  found = _constructions({"snippet.py": tree})
  assert len(found) == 1, found
  missing, nonliteral = _missing(found)
  assert (not missing and not nonliteral) == ok, (missing, nonliteral)


if __name__ == "__main__":   # counts per file: python tests/robustness/test_message_fix_clauses.py
  total = collections.Counter(key.split(":")[0] for key, *_ in CONSTRUCTIONS)
  missing, nonliteral = _missing(CONSTRUCTIONS)
  without = collections.Counter(m.split(":")[0][len("palace/_src/"):] for m in missing + nonliteral)
  for path in sorted(total):
    print(f"{path:40s} {total[path]:4d} constructions {without[path]:4d} without a fix")
  print(f"{'total':40s} {sum(total.values()):4d} constructions {sum(without.values()):4d} without a fix")
