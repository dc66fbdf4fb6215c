"""Parity kernels: the TPU kernels shipped inside the jax wheel, imported unmodified by their jax names
(under palace.compat.load_module those imports load the wheel's source files through palace's shim)."""
import jax
import numpy as np
from jax.experimental.pallas.ops.tpu import all_gather
from jax.experimental.pallas.ops.tpu import matmul

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
