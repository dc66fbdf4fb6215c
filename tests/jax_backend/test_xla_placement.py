"""Which pallas_call operands XLA hands the kernel in VMEM (palace/_src/jax/xla_placement.py): the rule
against the chip's compiled HLO (benchmarks/hw/data/v5e-hlo-2026-12-07.tar.gz, recorded on a TPU v5e,
session 34), and what palace.jax does with a placed operand: its blocks are views of it."""
import os
import re
import tarfile

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

import palace.jax as pj
from palace._src import hw
from palace._src.jax import xla_placement as xp

HLO = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "hw", "data", "v5e-hlo-2026-12-07.tar.gz")
MiB = 1 << 20


def _hlo(name):
  with tarfile.open(HLO) as tar:
    return tar.extractfile(f"hlo/hlo-{name}.txt").read().decode()


def _kernel_buffers(text):
  """(operand shapes in VMEM, operand shapes not, result in VMEM) of the module's Mosaic custom call."""
  line = next(ln for ln in text.splitlines() if 'custom_call_target="tpu_custom_call"' in ln)
  result, args = line.split(" custom-call(", 1)
  names = re.findall(r"%([\w.-]+)", args.split(")", 1)[0])
  where = {}
  for ln in text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.-]+) = \(?(\w+)\[([\d,]*)\]\{([^}]*)\}", ln)
    if m:
      where[m.group(1)] = (tuple(int(d) for d in m.group(3).split(",") if d), "S(1)" in m.group(4))
  for ln in text.splitlines():   # (parameters: their layouts are in the signature, never S(1))
    for m in re.finditer(r"%([\w.-]+): (\w+)\[([\d,]*)\]", ln):
      where.setdefault(m.group(1), (tuple(int(d) for d in m.group(3).split(",") if d), False))
  ops = [where[n] for n in names]
  return ([s for s, v in ops if v], [s for s, v in ops if not v], "S(1)" in result)


def test_the_chip_puts_relaid_out_operands_in_vmem_and_the_rule_agrees():
  v5e = hw.get_chip("v5e")
  budget = v5e.vmem_bytes - v5e.default_scoped_vmem_bytes
  bf16, f32 = jnp.bfloat16, jnp.float32
  for name, ins, out, dtype in [
      ("gather_bf16_rows1_8192x2048_n512", [(8192, 1, 2048)], (512, 1, 2048), bf16),
      ("grow1_bf16_2048x2048_n512", [(2048, 1, 2048)], (512, 1, 2048), bf16),
      ("gather_f32_rows1_8192x1024_n1024", [(8192, 1, 1024)], (1024, 1, 1024), f32),
      ("fsize_b16h8s512d64", [(16, 8, 512, 64)] * 3, (16, 8, 512, 64), bf16)]:
    in_vmem, in_hbm, out_vmem = _kernel_buffers(_hlo(name))
    placed_in, placed_out = xp.xla_vmem([(k, s, dtype) for k, s in enumerate(ins)], [(0, out, dtype)], budget)
    table = [s for s in in_vmem + in_hbm if len(s) == len(ins[0])]
    assert sorted(s for s in in_vmem if len(s) > 1) == sorted(ins[k] for k in placed_in), name
    assert out_vmem == (0 in placed_out), name
    assert len(table) == len(ins), name
  # batch 32: one of four 32 MiB buffers stays in HBM on the chip and in the rule (which one differs)
  in_vmem, in_hbm, out_vmem = _kernel_buffers(_hlo("fsize_b32h8s512d64"))
  shape = (32, 8, 512, 64)
  placed_in, placed_out = xp.xla_vmem([(k, shape, bf16) for k in range(3)], [(0, shape, bf16)], budget)
  assert len(in_vmem) + out_vmem == 3 and len(placed_in) + len(placed_out) == 3
  assert xp.padded_bytes(shape, bf16) == 32 * MiB and xp.padded_bytes((8192, 1, 2048), bf16) == 64 * MiB


def _copy(shape, dtype):
  """A pallas_call copying a (b, s, d) array in (1, 128, d) blocks."""
  spec = pl.BlockSpec((1, 128, shape[-1]), lambda i, j: (i, j, 0))
  return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                        out_shape=jax.ShapeDtypeStruct(shape, dtype), grid=(shape[0], shape[1] // 128),
                        in_specs=[spec], out_specs=spec)


@pytest.mark.parametrize("d, in_vmem", [(64, True), (128, False)])
def test_a_head_dim_64_operand_is_read_in_place_from_vmem(d, in_vmem):
  """The (b, s, 64) bf16 operand and output XLA relays out are in VMEM: the pipeline's blocks are views
  of them (no DMA at all, as the chip's gather steps wait for none); at head_dim 128, HBM copies."""
  shape = (2, 512, d)
  x = jnp.asarray(np.arange(np.prod(shape)).reshape(shape) % 251, jnp.bfloat16)
  with pj.virtual_tpu("v5e") as tpu:
    out = np.asarray(_copy(shape, jnp.bfloat16)(x))
  np.testing.assert_array_equal(out, np.asarray(x))
  kinds = {e[2] for e in tpu.reports[0].events if e[1] == "dma"}
  assert kinds == (set() if in_vmem else {"hbm->vmem", "vmem->hbm"}), kinds


def test_nothing_is_placed_where_it_does_not_fit():
  # v5e: 128 MiB less the 16 MiB scoped default: a 64 MiB relaid-out output fits, then neither 64 MiB
  # input does
  big = (16, 8, 2048, 64)   # 64 MiB padded (its 64 lanes to 128)
  assert xp.padded_bytes(big, jnp.bfloat16) == 64 * MiB
  ins, outs = xp.xla_vmem([(0, big, jnp.bfloat16), (1, big, jnp.bfloat16)], [(0, big, jnp.bfloat16)],
                          112 * MiB)
  assert ins == frozenset() and outs == frozenset({0})
  assert not xp.relaid_out((4096, 128), jnp.float32) and not xp.relaid_out((8192, 1, 1024), jnp.float32)
