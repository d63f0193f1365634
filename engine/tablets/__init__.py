"""Tablets: dynamic tables (sorted, ordered, replication queues), their rows, versions and counters.

``table`` holds ``DynamicTable`` (a table's tablets, state and layout; it routes each call to the
storage that serves it), ``sorted_rows`` the rows of sorted tables (latest image + versions, reads
at a timestamp, compaction), ``ordered_rows`` the rows of ordered tables, ``queue`` the
replication queue of a replicated table, ``conflicts`` the memory of recent commits that conflict
checks read, ``writes`` the row changes every layer above exchanges, ``changes`` the change log
and event tokens of change streams, ``keys`` the key-to-tablet helpers, ``leases`` the snapshot
leases that hold compaction back.
Only ``SnapshotLeases`` takes a lock of its own (a leaf); everything else is changed under
``Storage.write_lock`` (see ``table.py``).
"""

from . import changes
from .keys import parse_pivot_keys, tablet_id, validate_key_not_null
from .leases import MAX_LEASE_SECONDS, SnapshotLeases
from .queue import QueueRun, run_size
from .table import DynamicTable, TabletState
from .writes import WRITE_KINDS, ImageRun, RowWrite, WriteKind, columns_well_formed, decode_writes, encode_writes

__all__ = [
    "DynamicTable", "ImageRun", "MAX_LEASE_SECONDS", "QueueRun", "RowWrite", "SnapshotLeases", "TabletState",
    "WRITE_KINDS", "WriteKind", "columns_well_formed", "decode_writes", "encode_writes", "parse_pivot_keys",
    "tablet_id", "validate_key_not_null", "changes", "run_size",
]
