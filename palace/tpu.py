"""`from palace import tpu as pltpu`: TPU-specific Pallas names (re-exports only)."""
from palace._src.core import (ARBITRARY, CORE_PARALLEL, PARALLEL, SUBCORE_PARALLEL, CompilerParams,
                              GridDimensionSemantics, InterpretParams, MemorySpace,
                              PrefetchScalarGridSpec, SemaphoreType, TensorCoreMesh)
from palace._src.lang.tpu_primitives import (AsyncCopyDescriptor, async_copy, async_remote_copy,
                                             bitcast, core_barrier, get_barrier_semaphore, load,
                                             make_async_copy, make_async_remote_copy,
                                             prng_random_bits, prng_seed, roll, run_on_first_core,
                                             store, sync_copy, trace_value)
from palace._src.lang.packing import pack_elementwise, stochastic_round, unpack_elementwise
from palace._src.lang.mxu_fifo import matmul_lhs_fifo, matmul_pop_fifo, matmul_push_rhs
from palace._src.launch.host import with_memory_space_constraint
from palace._src.emit_pipeline import PipelineStep, emit_pipeline, emit_pipeline_with_allocations

VMEM = MemorySpace.VMEM
SMEM = MemorySpace.SMEM
HBM = MemorySpace.HBM
CMEM = MemorySpace.CMEM
VMEM_SHARED = MemorySpace.VMEM_SHARED
SEMAPHORE = MemorySpace.SEMAPHORE
