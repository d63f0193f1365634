"""Tablets: dynamic tables (sorted, ordered, replication queues), their rows, versions and counters.

``table`` holds ``DynamicTable`` (SQL layout, reads at a timestamp, conflict memory), ``writes``
the row changes every layer above exchanges, ``queue`` the replication queue of a replicated
table, ``keys`` the key-to-tablet helpers. Nothing in this package takes a lock of its own: its
state is changed under ``Storage.write_lock`` (see ``table.py``).
"""

from .keys import parse_pivot_keys, tablet_id, validate_key_not_null
from .queue import QueueEntry
from .table import DynamicTable, TabletState
from .writes import WRITE_KINDS, RowWrite, WriteKind, decode_writes, encode_writes

__all__ = [
    "DynamicTable", "QueueEntry", "RowWrite", "TabletState", "WRITE_KINDS", "WriteKind", "decode_writes",
    "encode_writes", "parse_pivot_keys", "tablet_id", "validate_key_not_null",
]
