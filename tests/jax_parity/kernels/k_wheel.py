"""Parity kernels: the TPU kernels shipped inside the jax wheel, imported unmodified by their jax names
(under palace.compat.load_module those imports load the wheel's source files through palace's shim)."""
import jax
import numpy as np
from jax.experimental.pallas.ops.tpu import all_gather
from jax.experimental.pallas.ops.tpu import flash_attention
from jax.experimental.pallas.ops.tpu import matmul
from jax.experimental.pallas.ops.tpu import megablox
from jax.experimental.pallas.ops.tpu import paged_attention
from jax.experimental.pallas.ops.tpu import splash_attention

NUM_DEVICES = 4


def _ints(shape, seed, dtype=np.float32):
  return np.random.default_rng(seed).integers(-8, 8, shape).astype(dtype)


def case_wheel_matmul_f32():
  x, y = _ints((256, 512), 50), _ints((512, 384), 51)
  return lambda a, b: matmul.matmul(a, b, block_shape=(128, 128), block_k=256), (x, y), None


def case_wheel_matmul_bf16():
  r = np.random.default_rng(52)
  x = r.standard_normal((256, 256)).astype(jax.numpy.bfloat16)
  y = r.standard_normal((256, 256)).astype(jax.numpy.bfloat16)
  return lambda a, b: matmul.matmul(a, b, block_shape=(128, 128), block_k=128), (x, y), (1e-2, 1e-2)


def case_wheel_all_gather():
  def run(x):
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    return all_gather.all_gather(xs, mesh=mesh, axis_name="x")
  return run, (np.arange(NUM_DEVICES * 16 * 128, dtype=np.float32).reshape(-1, 128),), None


def case_wheel_all_gather_hbm():
  def run(x):
    mesh = jax.make_mesh((NUM_DEVICES,), ("x",))
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    return all_gather.all_gather(xs, mesh=mesh, axis_name="x", memory_space=jax.experimental.pallas.ANY)
  return run, (_ints((NUM_DEVICES * 8, 256), 53),), None


def _normal(*shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# f32 kernels with default-precision matmuls: palace rounds their operands to bf16 as a TPU does, JAX's
# interpret mode does not (the chip wins, docs/numerics.md): a tolerance of bf16 operand rounding's size
CHIP_F32_DOT_TOL = (5e-2, 5e-2)


def case_wheel_flash_attention_causal():
  q, k, v = (_normal(1, 2, 256, 128, seed=s) for s in (54, 55, 56))
  return (lambda a, b, c: flash_attention.flash_attention(a, b, c, causal=True, sm_scale=0.125)), (q, k, v), \
      CHIP_F32_DOT_TOL


def case_wheel_paged_attention():
  q = _normal(2, 4, 128, seed=57)
  kp, vp = _normal(2, 8, 16, 128, seed=58), _normal(2, 8, 16, 128, seed=59)
  lengths = np.array([37, 64], np.int32)
  idx = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], np.int32)
  return (lambda *a: paged_attention.paged_attention(*a, pages_per_compute_block=2)), \
      (q, kp, vp, lengths, idx), CHIP_F32_DOT_TOL


def _paged_gqa(ratio, seed):
  """paged_attention in f32 with grouped queries (`ratio` query heads per KV head). The kernel casts
  K and V to bfloat16 after loading them (its MultiPageAsyncCopyDescriptor dequantizes to bf16 by
  default), in JAX's interpret mode and on a TPU alike: against an f32 reference it is off by bf16
  rounding (~4e-2), against the same kernel in JAX it agrees to f32 summation-order noise. docs/compat.md"""
  kv_heads, page, head_dim = 2, 16, 128
  q = _normal(2, kv_heads * ratio, head_dim, seed=seed)
  kp, vp = (_normal(kv_heads, 8, page, head_dim, seed=seed + s) for s in (1, 2))
  lengths = np.array([37, 64], np.int32)
  idx = np.array([[3, 1, 0, 2], [4, 6, 5, 7]], np.int32)
  return (lambda *a: paged_attention.paged_attention(*a, pages_per_compute_block=2)), \
      (q, kp, vp, lengths, idx), CHIP_F32_DOT_TOL


def case_wheel_paged_attention_f32_gqa4():
  return _paged_gqa(4, 70)


def case_wheel_paged_attention_f32_gqa8():
  return _paged_gqa(8, 73)


def case_wheel_megablox_gmm():
  lhs, rhs = _ints((512, 256), 60), _ints((3, 256, 128), 61)
  sizes = np.array([128, 256, 128], np.int32)
  return (lambda a, b, c: megablox.gmm(a, b, c, np.float32, (128, 128, 128))), (lhs, rhs, sizes), None


def case_wheel_splash_attention_causal():
  heads, seq = 2, 256
  mask = splash_attention.MultiHeadMask([splash_attention.CausalMask((seq, seq)) for _ in range(heads)])
  bs = splash_attention.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128,
                                   block_kv_dkv=128, block_kv_dkv_compute=128, block_q_dq=128,
                                   block_kv_dq=128)
  kernel = splash_attention.make_splash_mha_single_device(mask, block_sizes=bs)
  q, k, v = (_normal(heads, seq, 128, seed=s) for s in (62, 63, 64))
  return kernel, (q, k, v), (2e-1, 2e-1)   # bf16-rounded q k^T and p v (0.11 measured)
