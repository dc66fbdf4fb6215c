"""`from palace import tpu_sc as plsc`: SparseCore Pallas names (re-exports only)."""
from palace._src.lang.indexed import Indices
from palace._src.lang.sc_primitives import (PackFormat, addupdate, addupdate_compressed,
                                            addupdate_scatter, all_reduce_ffs,
                                            all_reduce_population_count, bitcast, cummax, cummin,
                                            cumsum, fetch_and_add, load_expanded, load_gather, pack,
                                            parallel_loop, scan_count, sort_key_val,
                                            store_compressed, store_scatter, subcore_barrier, unpack)
from palace._src.launch.sc_mesh import ScalarSubcoreMesh, VectorSubcoreMesh, get_sparse_core_info
