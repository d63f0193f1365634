"""The cache-invalidation pattern of seed 004 over change streams (docs/streams.md)."""
