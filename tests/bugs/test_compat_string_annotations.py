"""A module loaded by palace.compat.load_module may define dataclasses under
`from __future__ import annotations` (the jax wheel's flash_attention does): dataclasses looks the
module up in sys.modules while the class body runs. It failed with AttributeError ('NoneType' object
has no attribute '__dict__') when the real module was not imported."""
import sys

from palace import compat

SRC = '''from __future__ import annotations
import dataclasses
import jax.numpy as jnp

@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_q: int
  block_k: int = 128
  ratio: dataclasses.InitVar[int] = 1
'''


def test_dataclass_with_string_annotations_loads(tmp_path):
  path = tmp_path / "kern_with_dataclass.py"
  path.write_text(SRC)
  before = set(sys.modules)
  mod = compat.load_module(str(path))
  assert mod.BlockSizes(256).block_k == 128
  assert set(sys.modules) == before   # visible during its own execution only
