"""Printing of the benchmarks' result tables (rich when installed, plain text otherwise)."""


def print_table(title, columns, rows, *, width=160):
  """`rows`: sequences of strings, one per column; numbers are right-aligned by rich."""
  try:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
  except ImportError:
    print(f"\n{title}")
    print(" | ".join(columns))
    for row in rows:
      print(" | ".join(row))
    return
  t = Table(title=title)
  for c in columns:
    t.add_column(c, justify="right")
  for row in rows:
    t.add_row(*row)
  Console(width=width).print(t)
