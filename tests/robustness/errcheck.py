"""Shared assertion of the robustness suite: a malformed call raises a PalaceError subclass that also
subclasses the fitting builtin, and its message names the operand and gives a fix."""
import re

import pytest

import palace as pl

BUILTIN = {pl.UsageError: ValueError, pl.BlockSpecError: ValueError, pl.ShapeError: ValueError,
           pl.ResourceError: MemoryError, pl.SyncError: RuntimeError, pl.OutOfBoundsError: IndexError,
           pl.UnsupportedError: NotImplementedError}


def raises(fn, cls, operand: str, hint: str = "Fix"):
  """Call `fn()`; assert it raises `cls` (a PalaceError and its builtin), the message contains the
  operand (a regex) and the hint (a regex, 'Fix' by default). Returns the message."""
  with pytest.raises(cls) as info:
    fn()
  e = info.value
  assert isinstance(e, pl.PalaceError), type(e)
  assert isinstance(e, BUILTIN[cls]), type(e).__mro__
  msg = str(e)
  assert re.search(operand, msg), f"operand {operand!r} not named in: {msg}"
  assert re.search(hint, msg), f"hint {hint!r} missing in: {msg}"
  return msg
