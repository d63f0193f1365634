"""Replicated tables (seed 002): replica registry, sync writes, replicators, the exactly-once sink."""

from .host import ReplicationHost
from .manager import ReplicationManager
from .options import (
    DEFAULT_MIN_REPLICATION_LOG_TTL_MS,
    TRIMMED_TIMESTAMP_ATTRIBUTE,
    UPSTREAM_TABLE_ATTRIBUTE,
    validate_replicated_table_options,
    validate_throttler,
)

__all__ = [
    "DEFAULT_MIN_REPLICATION_LOG_TTL_MS", "ReplicationHost", "ReplicationManager", "TRIMMED_TIMESTAMP_ATTRIBUTE",
    "UPSTREAM_TABLE_ATTRIBUTE", "validate_replicated_table_options", "validate_throttler",
]
