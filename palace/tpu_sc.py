"""`from palace import tpu_sc as plsc`: SparseCore Pallas names (re-exports only)."""
