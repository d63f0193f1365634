"""Versions kept for reads at a timestamp: compaction, and the leases that hold it back.

A sorted table keeps the older versions of its rows for ``@min_data_ttl`` (30 min by default), so
reads at a timestamp that recent see the rows as they were; compaction drops what is older, but
never past the start of an open transaction or a live snapshot lease (a bootstrap copy reading a
replica as of T for as long as the copy takes, ``/internal/v1/lease_snapshot``). A lease is granted
under the storage writer, as compaction runs, so the two never pass each other.

``SnapshotService`` gets its collaborators from the composition root (``cluster.py``): the storage,
the tree, the node's tables, timestamps, the transaction manager (the oldest open transaction), the
leases, and the check a peer's read of a table must pass (``RowService.check_peer_read``: a peer
leases only the replica tables it reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..cypress import Cypress, Node
from ..errors import ErrorCode, YtError
from ..storage import Storage
from ..tablets import MAX_LEASE_SECONDS, DynamicTable, SnapshotLeases
from ..timestamps import COUNTER_BITS, MAX_TIMESTAMP, TimestampProvider
from ..transactions import TransactionManager
from .tables import COMPACTED_UNTIL_ATTRIBUTE, DEFAULT_MIN_DATA_TTL_MS, Tables

#: (the calling cluster, the command, its parameters) -> None, or a 403 YtError
PeerReadCheck = Callable[[str, str, dict[str, Any]], None]


class SnapshotService:
    """Compaction of old versions, and the snapshot leases that hold it back."""

    def __init__(self, storage: Storage, cypress: Cypress, tables: Tables, timestamps: TimestampProvider,
                 transactions: TransactionManager, leases: SnapshotLeases, check_peer_read: PeerReadCheck) -> None:
        self.storage = storage
        self.cypress = cypress
        self.tables = tables
        self.timestamps = timestamps
        self.transactions = transactions
        self.leases = leases
        self._check_peer_read = check_peer_read

    # -- snapshot leases (/internal/v1/lease_snapshot, release_snapshot) ----------------------------------

    def lease_snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """Hold compaction of a table at ``timestamp`` for ``seconds`` (a new lease, or ``lease_id``
        renewed). A peer leases only its own replica tables, as it reads them."""
        path = body.get("path")
        if caller is not None:
            self._check_peer_read(caller, "lookup_rows", {"path": path})
        table, table_path, _ = self.tables.table(path)
        ts, seconds, lease_id = body.get("timestamp"), body.get("seconds", 600), body.get("lease_id")
        if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= MAX_TIMESTAMP:
            raise YtError(f"lease_snapshot: timestamp must be a timestamp, an integer in [0, {MAX_TIMESTAMP:#x}]",
                          code=ErrorCode.INVALID_PARAMETER)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_LEASE_SECONDS:
            raise YtError(f"lease_snapshot: seconds must be in (0, {MAX_LEASE_SECONDS:g}]",
                          code=ErrorCode.INVALID_PARAMETER)
        if lease_id is not None and not isinstance(lease_id, str):
            raise YtError("lease_snapshot: lease_id must be a string", code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write():
            # under the writer, as compaction: a snapshot already compacted away cannot be leased back
            table.check_snapshot(ts, table_path)
            lease = self.leases.grant(table.table_id, ts, float(seconds), lease_id, holder=caller or "")
        return {"lease_id": lease.lease_id, "timestamp": lease.timestamp, "seconds": float(seconds)}

    def release_snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        lease_id = body.get("lease_id")
        if not isinstance(lease_id, str):
            raise YtError("release_snapshot: lease_id must be a string", code=ErrorCode.INVALID_PARAMETER)
        self.leases.release(lease_id, holder=caller or "")
        return {}

    # -- compaction ----------------------------------------------------------------------------------------

    def compact(self) -> int:
        """Drop versions older than each table's min_data_ttl, never past an active snapshot. The tables
        a pass may find something in (``DynamicTable.compaction_needed``) share write transactions, up
        to :data:`COMPACT_TABLES_PER_WRITE` or :data:`COMPACT_WRITE_SECONDS` each: at 1,000 tables
        written in the last half hour, one transaction (and fsync) per table made a pass cost seconds."""
        removed = 0
        pinned = self.transactions.oldest_active_start_timestamp()
        due: list[tuple[Node, DynamicTable, int]] = []
        for node in self.tables.all_tables():
            table = node.table
            if table is None or not table.sorted:
                continue
            ttl_ms = int(node.attributes.get("min_data_ttl", DEFAULT_MIN_DATA_TTL_MS))
            # timestamps are (seconds << 30) | counter, so a duration shifts them by seconds << 30
            horizon = self.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
            if pinned is not None:
                horizon = min(horizon, pinned)
            if table.compaction_needed(horizon):
                due.append((node, table, horizon))
        while due:
            with self.storage.write() as conn:
                # (under the writer: a lease granted meanwhile is checked against compacted_until)
                started, count = time.monotonic(), 0
                for count, (node, table, horizon) in enumerate(due, 1):
                    if node.table is not table:
                        continue  # (removed or altered since the list was made)
                    leased = self.leases.pinned(node.id)
                    before = table.compacted_until
                    removed += table.compact(conn, horizon if leased is None else min(horizon, leased))
                    if table.compacted_until != before:
                        node.attributes[COMPACTED_UNTIL_ATTRIBUTE] = table.compacted_until
                        self.cypress.save(conn, node)
                    if count >= COMPACT_TABLES_PER_WRITE or time.monotonic() - started > COMPACT_WRITE_SECONDS:
                        break
                del due[:count]
        return removed


#: at most this many tables compacted in one write transaction of a pass ...
COMPACT_TABLES_PER_WRITE = 64
#: ... and no more once the transaction has taken this long (commits wait for the writer meanwhile)
COMPACT_WRITE_SECONDS = 0.02
