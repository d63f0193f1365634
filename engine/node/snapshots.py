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

from collections.abc import Callable
from typing import Any

from ..cypress import Cypress
from ..errors import ErrorCode, YtError
from ..storage import Storage, on_rollback
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
        """Drop versions older than each table's min_data_ttl, never past an active snapshot."""
        removed = 0
        pinned = self.transactions.oldest_active_start_timestamp()
        for node in self.tables.all_tables():
            table = node.table
            if table is None or not table.sorted:
                continue
            if not table.compaction_due and table.applied_ts <= table.compacted_through:
                # nothing applied since a pass that dropped all it could up to its horizon, and no
                # commit after that horizon: no version left can be droppable (a read without the
                # writer lock: a commit racing it is seen by the next pass)
                continue
            ttl_ms = int(node.attributes.get("min_data_ttl", DEFAULT_MIN_DATA_TTL_MS))
            # timestamps are (seconds << 30) | counter, so a duration shifts them by seconds << 30
            horizon = self.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
            if pinned is not None:
                horizon = min(horizon, pinned)
            with self.storage.write() as conn:
                # (under the writer: a lease granted meanwhile is checked against compacted_until)
                leased = self.leases.pinned(node.id)
                before = table.compacted_until
                through = horizon if leased is None else min(horizon, leased)
                removed += table.compact(conn, through)
                if table.compacted_until != before:
                    node.attributes[COMPACTED_UNTIL_ATTRIBUTE] = table.compacted_until
                    self.cypress.save(conn, node)
                # (a commit after this transaction sets it again; kept as it was if this one fails)
                table.compaction_due, table.compacted_through = False, through
                on_rollback(conn, _due_again(table))
        return removed


def _due_again(table: DynamicTable) -> Callable[[], None]:
    def undo() -> None:
        table.compaction_due = True
    return undo
