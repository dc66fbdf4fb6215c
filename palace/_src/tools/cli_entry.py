"""The `palace` console script's entry point: the CLI needs the `cli` extra (click, rich); without it
the command says so in one line and exits 2 instead of an ImportError traceback."""
from __future__ import annotations

import sys

_EXTRA_MODULES = ("click", "rich", "matplotlib")


def main(argv=None):
  try:
    from palace._src.tools.cli import main as cli_main
  except ImportError as e:
    missing = (e.name or "").split(".")[0]
    if missing not in _EXTRA_MODULES:
      raise
    print(f"palace: error: the palace command needs {missing!r}, part of the 'cli' extra. "
          f"Fix: pip install 'palace[cli]'", file=sys.stderr)
    sys.exit(2)
  return cli_main(args=argv, prog_name="palace")
