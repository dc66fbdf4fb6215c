"""palace internals. Nothing here is public API; use the facades `palace`, `palace.tpu`, ..."""
