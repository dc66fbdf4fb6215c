"""Console helpers shared by the `palace` command and the demo (rich is imported lazily)."""
from __future__ import annotations

import os


def make_console():
  from rich.console import Console
  return Console(highlight=False, soft_wrap=False, width=max(100, min(160, term_width())))


def term_width() -> int:
  try:
    return os.get_terminal_size().columns
  except OSError:
    return 120


def progress(console):
  from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn)
  return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True)


def table(title, columns, **kw):
  from rich.table import Table
  t = Table(title=title, title_justify="left", **kw)
  for c in columns:
    if isinstance(c, tuple):
      t.add_column(c[0], justify=c[1])
    else:
      t.add_column(c, justify="right")
  return t


def fmt_us(s: float) -> str:
  return f"{s * 1e6:,.1f} us" if s < 1e-2 else f"{s * 1e3:,.3f} ms"
