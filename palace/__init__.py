"""palace: Pallas TPU kernels on a virtual TPU. Use as `import palace as pl`.

This module only re-exports; the implementation lives in `palace._src`.
"""
from palace._src.tools.autotune import autotune
from palace._src.core import (ANY, BlockSpec, Blocked, BoundedSlice, Buffered, CompilerParams,
                              CostEstimate, DeviceIdType, Element, GridSpec, HOST, MemoryRef, MemorySpace,
                              ShapeDtypeStruct, Squeezed, no_block_spec, squeezed)
from palace._src.errors import (BlockSpecError, CompilerRejectError, MemorySpaceError, MissingApiError,
                                OutOfBoundsError, PalaceError, RaceError, ResourceError, ShapeError, SyncError,
                                TracingError, UninitializedReadError, UnsupportedError, UsageError)
from palace._src.tools.explore import ScheduleReport, explore_schedules
from palace._src.lang.array import Array
from palace._src.lang.primitives import (debug_print, delay, loop, multiple_of, num_programs, program_id,
                                         run_scoped, semaphore_read, semaphore_signal, semaphore_wait,
                                         when, with_scoped)
from palace._src.lang.ref_index import Slice, ds
from palace._src.lang.refs import Ref
from palace._src.lang.numpy_ops import broadcast_to
from palace._src.launch.pallas_call import pallas_call
from palace._src.launch.kernel import kernel
from palace._src.launch.spmd import Mesh, P, PartitionSpec, make_mesh, shard_map
from palace._src.launch.host_refs import empty_ref, free_ref, freeze, new_ref
from palace._src.sim.machine import VirtualTPU
from palace._src.sim.report import Report
from palace._src.util import align_to, cdiv, next_power_of_2
from palace._src.tools.compat.interop import jax_callable

dslice = ds
virtual_tpu = VirtualTPU

__version__ = "0.1.0"
