"""Which of a pallas_call's operands XLA hands the kernel in VMEM (palace.jax, session 34).

A TPU custom call takes its operands in the row-major tiled layout Mosaic compiled it for. XLA lays a
program's arrays out as it prefers, and where its layout differs it copies the operand into the kernel's
layout just before the call (and the result back after it). That copy is a new buffer only the kernel
reads, and XLA's memory-space assignment puts it in VMEM when it fits beside the kernel's own scoped
VMEM: the pipeline then reads and writes the kernel's blocks of it in place (views of a source already
in the blocks' memory, palace's pipeline `_ALIAS` mode), with no DMA. Measured on a TPU v5e (the compiled HLO of
five recorded kernels, `benchmarks/hw/data/v5e-hlo-2026-12-07.tar.gz`, docs/validation.md "Session 34"):
- a bf16 (n, 1, d) gather table is laid out {2,0,1} by XLA (its unit dim outermost), relaid out to the
  kernel's {2,1,0} into memory space 1 (`S(1)`: VMEM), and the (m, 1, d) result too; its f32 twin keeps
  XLA's {2,1,0} layout and no copy (`gather_rows1`: the bf16 kernel's steps 38 cycles, the f32 one's a
  DMA round trip; the bf16 kernel's region traces show no DMA wait at all, session 31);
- the flash kernel's (b, h, s, 64) bf16 q, k, v and output are laid out {2,3,1,0} by XLA (the sequence
  minor: 64 lanes would be half empty), relaid out into VMEM at batch 16 (all four, 16 MiB each with
  their lanes padded to 128) and at batch 32 three of the four (32 MiB each; one input stays in HBM).

`xla_vmem(...)` applies that: an operand (not scalar prefetch, not in SMEM, not aliased) or output whose
array XLA would lay out otherwise (`relaid_out`: a minor dim under 128 lanes over a second-minor dim of
whole 128s, or a sub-word type with a unit second-minor dim) is placed in VMEM while the placed
buffers, padded to their tiles, fit in the chip's VMEM less the kernel's scoped limit: outputs first,
then inputs in order (the batch-32 launch kept its last input in HBM). Which buffers XLA places depends
on the whole program; a kernel alone in a jit, as measured, is the case modelled.
"""
from __future__ import annotations

import numpy as np

LANES = 128


def relaid_out(shape: tuple, dtype) -> bool:
  """Would XLA copy an array of this shape and dtype into a TPU kernel's row-major layout?"""
  if len(shape) < 2:
    return False
  itemsize = np.dtype(dtype).itemsize
  minor, second = shape[-1], shape[-2]
  if minor < LANES and second >= LANES and second % LANES == 0:
    return True
  return itemsize < 4 and len(shape) >= 3 and second == 1 and minor >= LANES


def padded_bytes(shape: tuple, dtype) -> int:
  """Bytes of the array in the kernel's tiled layout: lanes padded to 128, rows to the sublane tile
  (8 32-bit rows; a unit second-minor dim to the sub-word packing)."""
  itemsize = np.dtype(dtype).itemsize
  pack = max(1, 4 // itemsize)
  rows_tile = pack if shape[-2] == 1 else 8 * pack
  lead = int(np.prod(shape[:-2], dtype=np.int64))
  rows = -(-shape[-2] // rows_tile) * rows_tile
  cols = -(-shape[-1] // LANES) * LANES
  return lead * rows * cols * itemsize


def xla_vmem(candidates_in: list, candidates_out: list, budget_bytes: int) -> tuple:
  """(input indices, output indices) placed in VMEM: `candidates_in` / `candidates_out` are (index,
  shape, dtype) of the operands and outputs that may be (module docstring); outputs first, then
  inputs, each while the placed total fits `budget_bytes`."""
  placed_in, placed_out, used = [], [], 0
  for where, cands in ((placed_out, candidates_out), (placed_in, candidates_in)):
    for k, shape, dtype in cands:
      if not relaid_out(shape, dtype):
        continue
      size = padded_bytes(shape, dtype)
      if used + size <= budget_bytes:
        used += size
        where.append(k)
  return frozenset(placed_in), frozenset(placed_out)
