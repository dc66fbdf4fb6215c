"""Front ends and the host side of a launch (L5): pallas_call, pl.kernel, shard_map, SparseCore meshes."""
