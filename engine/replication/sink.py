"""The replica side: tables fed by another cluster's replicated table, exactly once.

A replica table (``upstream_replica_id`` set) accepts writes only from its replica's replicator
and from the sync commits of its meta-cluster. Both record how far they got in
``_rt_replica_sink``: ``(upstream_replica_id, meta tablet) -> (row index, timestamp)``, written
in the *same* SQL transaction as the rows. A replicator batch carries the row index it starts at
(``prev_row_index``) and is applied only if the record still says so; otherwise the answer is the
stored index. So a batch retried after a lost answer or a crash is recognised, a batch that would
leave a gap is refused, and every change arrives once and in order. The replicator (meta side)
learns the truth from the answer and continues from there.

The ``/internal/v1`` handlers here are ``prepare``/``commit``/``abort`` of sync writes, ``push``
of replicator batches and ``table_info`` (what ``alter_table_replica --enable`` inspects).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..storage import FastStatement, replica_sink_table
from ..tablets import WRITE_KINDS, DynamicTable, RowWrite, WriteKind, decode_writes
from .host import ReplicationHost

_READ_SINK = FastStatement.select(replica_sink_table, ("row_index", "timestamp"), "upstream_replica_id", "tablet_index")
_UPDATE_SINK = FastStatement.update(replica_sink_table, "upstream_replica_id", "tablet_index")
_INSERT_SINK = FastStatement.insert(replica_sink_table)


def read_sink(conn: sa.Connection, replica_id: str, tablet: int) -> tuple[int, int] | None:
    """The stored (row index, timestamp) of a replica's tablet on this cluster, if any."""
    row = _READ_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet).fetchone()
    return None if row is None else (row[0], row[1])


def advance_sink(conn: sa.Connection, replica_id: str, tablet: int, row_index: int, ts: int) -> None:
    """Move the record forward (never back), inside the transaction that applies the rows."""
    current = read_sink(conn, replica_id, tablet)
    if current is None:
        _INSERT_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet, row_index=row_index,
                         timestamp=ts)
    elif row_index > current[0] or ts > current[1]:
        _UPDATE_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet,
                         row_index=max(row_index, current[0]), timestamp=max(ts, current[1]))


class ReplicaSink:
    """Answers the meta-cluster's calls on a replica cluster."""

    def __init__(self, host: ReplicationHost) -> None:
        self.host = host

    def replica_table(self, path: str, replica_id: str, preserve: bool = True) -> tuple[DynamicTable, str]:
        table, table_path, _ = self.host.resolve_table(path)
        expected = replica_id if preserve else None
        if table.upstream_replica_id != expected:
            raise YtError(f"Table {table_path} does not accept writes of replica {replica_id}: its "
                          f"upstream_replica_id is {table.upstream_replica_id!r}",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH, attributes={"path": table_path})
        return table, table_path

    def table_info(self, path: str) -> dict[str, Any]:
        table, _, _ = self.host.resolve_table(path)
        return {"sorted": table.sorted, "key_columns": table.schema.key_names,
                "columns": [{"name": c.name, "type": c.type.value} for c in table.schema.columns],
                "upstream_replica_id": table.upstream_replica_id, "tablet_state": table.state.value}

    def prepare_may_wait(self, body: dict[str, Any]) -> bool:
        """Whether a prepare may wait for the decision on an earlier transaction (which arrives as
        another request: such a prepare must not hold the event loop)."""
        try:
            table, _, _ = self.host.resolve_table(body.get("replica_path"))
        except YtError:
            return False
        return self.host.transactions.has_remote_prepared(table.table_id)

    # -- sync writes ---------------------------------------------------------------------------------

    def handle_prepare(self, body: dict[str, Any]) -> None:
        table, path = self.replica_table(body["replica_path"], body["replica_id"])
        writes = decode_writes(body)
        if table.sorted:
            # this table's lock groups, not the meta's
            full_mask, write_kind = table.schema.full_lock_mask, WriteKind.WRITE
            for w in writes:
                w.mask = (table.schema.lock_mask(list(w.row)) if w.update else full_mask) \
                    if w.kind is write_kind else 1
        self.host.transactions.prepare_participant(
            body["transaction_id"], body["coordinator"], table, path, writes, int(body["start_timestamp"]),
            int(body["prepare_timestamp"]), {"upstream_replica_id": body["replica_id"],
                                             # (no null: a null in a record makes its encoding
                                             # look for NaNs)
                                             **({} if table.sorted else {
                                                 "tablet_index": int(body["tablet_index"]) % table.tablet_count}),
                                             "meta_tablet_index": body["tablet_index"]},
            participant=f"{table.table_id}/{body['replica_id']}/{body['tablet_index']}")

    def handle_commit(self, body: dict[str, Any]) -> None:
        progress = {(p["replica_id"], int(p["tablet_index"])): int(p["row_index"]) for p in body.get("progress", [])}

        def advance(conn: sa.Connection, _table: DynamicTable, extra: dict[str, Any]) -> None:
            row_index = progress.get((extra["upstream_replica_id"], int(extra["meta_tablet_index"])))
            if row_index is not None:
                advance_sink(conn, extra["upstream_replica_id"], extra["meta_tablet_index"], row_index,
                             int(extra["commit_timestamp"]))

        self.host.transactions.commit_participant(body["transaction_id"], int(body["commit_timestamp"]), advance)

    def handle_abort(self, body: dict[str, Any]) -> None:
        self.host.transactions.abort_participant(body["transaction_id"])

    # -- replicator batches -------------------------------------------------------------------------

    def handle_push(self, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one replicator batch exactly once; answer with the stored progress."""
        replica_id = body["upstream_replica_id"]
        preserve = bool(body.get("preserve_timestamps", True))
        table, _ = self.replica_table(body["replica_path"], replica_id, preserve)
        tablet = int(body["tablet_index"])
        prev, end = int(body["prev_row_index"]), int(body["row_index"])
        groups: list[tuple[int, list[RowWrite]]] = []
        full_mask = table.schema.full_lock_mask if table.sorted else 1
        kinds = WRITE_KINDS
        write_kind = WriteKind.WRITE
        last_ts: Any = None
        group: list[RowWrite] | None = None
        for entry in body["entries"]:
            payload = entry["payload"]
            if isinstance(payload, str):
                payload = json.loads(payload)
            try:
                kind = kinds[entry["kind"]]
            except KeyError:
                raise YtError(f"Unknown change kind {entry['kind']!r} in a replication batch",
                              code=ErrorCode.PROTOCOL_ERROR) from None
            row = payload["row"]
            update = payload["update"] is True
            if kind is write_kind and table.sorted:
                mask = table.schema.lock_mask(list(row)) if update else full_mask
            else:
                mask = 1
            ts = entry["timestamp"]
            if ts != last_ts or group is None:
                last_ts, group = ts, []
                groups.append((int(ts), group))
            group.append(RowWrite(kind, row, mask, update))
        return self.host.transactions.apply_replicated(
            table, groups, preserve, tablet % table.tablet_count,
            check=lambda conn: read_sink(conn, replica_id, tablet),
            expected=prev,
            record=lambda conn, newest_ts: advance_sink(conn, replica_id, tablet, end, newest_ts),
            end=end)
