"""Replicated tables (seed 002): replica registry, sync writes, replicators, the exactly-once sink."""

from .manager import (
    DEFAULT_MIN_REPLICATION_LOG_TTL_MS,
    ReplicationManager,
    validate_replicated_table_options,
    validate_throttler,
)

__all__ = [
    "DEFAULT_MIN_REPLICATION_LOG_TTL_MS", "ReplicationManager", "validate_replicated_table_options",
    "validate_throttler",
]
