"""Tablets: dynamic tables (sorted, ordered, replication queues), their rows, versions and counters."""

from .table import (
    WRITE_KINDS,
    DynamicTable,
    RowWrite,
    TabletState,
    WriteKind,
    decode_writes,
    encode_writes,
    parse_pivot_keys,
    tablet_id,
    validate_key_not_null,
)

__all__ = [
    "DynamicTable", "RowWrite", "TabletState", "WRITE_KINDS", "WriteKind", "decode_writes", "encode_writes",
    "parse_pivot_keys", "tablet_id", "validate_key_not_null",
]
