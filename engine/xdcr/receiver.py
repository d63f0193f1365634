"""The receiving side of XDCR: a peer's batch of its own changes, applied once, every conflict resolved.

A batch (``xdcr_apply``) is parsed and range-checked first (``tablets/xdcr.parse_apply``), then who
sent it is checked (the caller's peer credential names the origin; the origin's id is confirmed with
its own engine, ``XdcrState.check_peer_identity``), then its rows against the table's schema; only
then is anything applied. The batch is applied in one SQL transaction per origin commit with the
batch's last log position recorded in the same transaction (``_rt_xdcr_sink``), so a batch retried
after a lost answer or a crash is applied once. Every action is resolved by the seed's rules
(``tablets/xdcr.resolve``) against the row here; every conflict goes to the conflict log in the
applying transaction. Runs in the request's worker thread under the storage writer (lock 1), like a
replicator push.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..storage import on_rollback, xdcr_sink_table
from ..tablets import DynamicTable, RowWrite, WriteKind, xdcr
from ..tablets.changes import Position
from .conflicts import ConflictLog
from .host import JOIN_ATTRIBUTE, REWIND_ATTRIBUTE
from .state import XdcrState


class Receiver:
    """Applies the peers' batches (``xdcr_apply``)."""

    def __init__(self, state: XdcrState, conflicts: ConflictLog) -> None:
        self.state = state
        self.conflicts = conflicts

    def apply(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """A peer's batch of its own changes of one table (``caller``: the cluster its peer credential
        names; None in process). Who may send what is checked first, then every field (range and
        size), then the rows against the table's schema; nothing is applied unless all of it holds."""
        own = self.state.own_id()
        batch = xdcr.parse_apply(body, xdcr.Bounds.ahead_of_now(self.state.config.max_peer_clock_skew),
                                 self.state.config.max_peer_batch_rows)
        origin, origin_id = batch.origin, batch.origin_id
        if caller is not None and caller != origin:
            raise YtError(f"Cluster {caller} may not send XDCR changes in the name of {origin}",
                          code=ErrorCode.AUTHORIZATION_ERROR, http_status=403, attributes={"cluster_name": caller})
        if origin_id == own:
            raise YtError(f"Cluster {origin} has XDCR cluster id {origin_id}, the id of cluster {self.state.name} too: "
                          "every cluster of a group needs its own id", code=ErrorCode.XDCR_NOT_CONNECTED,
                          attributes={"cluster_name": origin, "cluster_id": origin_id})
        if origin not in self.state.connections():
            raise YtError(f"Cluster {self.state.name} is not connected to {origin} for XDCR: add it to "
                          f"//sys/@xdcr_connections of {self.state.name}", code=ErrorCode.XDCR_NOT_CONNECTED,
                          attributes={"cluster_name": origin})
        if caller is not None:
            # the id in the body is a claim: the origin's own engine says which id it has
            self.state.check_peer_identity(origin, origin_id)
        table, path, node = self.state.host.resolve_table(batch.path)
        if table.xdcr_cluster_id is None:
            raise YtError(f"Table {path} of cluster {self.state.name} is not an XDCR table (create it with xdcr=%true, "
                          "while empty)", code=ErrorCode.XDCR_NOT_CONNECTED, attributes={"path": path})
        joining = node.attributes.get(JOIN_ATTRIBUTE)
        if isinstance(joining, dict):
            raise YtError(f"Table {path} of cluster {self.state.name} is joining the group from a snapshot of cluster "
                          f"{joining.get('source')}: changes wait until the join is finished",
                          code=ErrorCode.XDCR_NEEDS_SNAPSHOT, attributes={"path": path})
        self.state.check_same_schema(table, path, batch.schema, origin, "replication")
        end_position, start_position = batch.end, batch.start
        groups: list[tuple[int, list[RowWrite]]] = []
        group_keys: set[tuple[Any, ...]] = set()
        meta: dict[int, xdcr.Action] = {}
        newest = 0
        writes: list[RowWrite] = []
        for action in batch.actions:
            if action.kind == "delete":
                write = RowWrite(WriteKind.DELETE, dict(zip(table.schema.key_names, action.key or [], strict=False)), 1)
            else:
                write = RowWrite(WriteKind.WRITE, dict(action.row or {}), table.schema.full_lock_mask)
            write.origin = action.origin
            meta[id(write)] = action
            newest = max(newest, action.origin[0])
            writes.append(write)
        # everything a peer sends is input: its rows are checked against this table's schema as a
        # client's would be (types, keys, row weight), before anything is applied (the rows the
        # changes were made on are checked where they are used: in the conflict log, _resolve_actions)
        self.state.host.check_peer_writes(table, path, writes, f"XDCR changes of cluster {origin}")
        for write in writes:
            # one local commit for a run of changes to distinct keys (each keeps its own version):
            # a key changed twice starts the next commit, so the later change sees the earlier
            key = table.key_of(write.row)
            if not groups or key in group_keys:
                groups.append((meta[id(write)].origin[0], []))
                group_keys = set()
            groups[-1][1].append(write)
            group_keys.add(key)
        if newest:
            # later changes made here are newer than every change seen (versions follow causality);
            # ``newest`` is at most max_peer_clock_skew ahead of this host's clock (parse_apply)
            self.state.clock.observe(newest)
        stored_box: dict[str, Position] = {}

        def check(conn: sa.Connection) -> tuple[Any, Any] | None:
            if isinstance(node.attributes.get(JOIN_ATTRIBUTE), dict):
                # (checked again under the writer: a join that began meanwhile clears the table)
                raise YtError(f"Table {path} of cluster {self.state.name} is joining the group from a snapshot: "
                              "changes wait until the join is finished", code=ErrorCode.XDCR_NEEDS_SNAPSHOT,
                              attributes={"path": path})
            c = xdcr_sink_table.c
            row = conn.execute(sa.select(c.timestamp, c.seq).where(
                c.table_id == table.table_id, c.origin_cluster_id == origin_id)).first()
            stored = (0, 0) if row is None else (int(row[0]), int(row[1]))
            stored_box["stored"] = stored
            pending = node.attributes.get(REWIND_ATTRIBUTE) or []
            if origin_id in pending:
                # the first batch from this origin since this cluster joined from a snapshot: one
                # that starts past the snapshot's position (the sender shipped to the table before
                # the join cleared it) is answered with the position, and the sender rewinds to it
                if start_position is not None and stored < start_position:
                    return (stored, 0)
                remaining = [o for o in pending if o != origin_id]
                if remaining:
                    node.attributes[REWIND_ATTRIBUTE] = remaining
                else:
                    node.attributes.pop(REWIND_ATTRIBUTE, None)
                self.state.cypress.save(conn, node)
                on_rollback(conn, lambda: node.attributes.__setitem__(REWIND_ATTRIBUTE, pending))
            # a batch at or below what is recorded is a retry: answered with the record
            return (stored, 0) if stored >= end_position else None

        def prepare(conn: sa.Connection, _source_ts: int, commit_ts: int, writes: list[RowWrite]) -> list[RowWrite]:
            stored = stored_box.get("stored", (0, 0))
            todo = [w for w in writes if meta[id(w)].position > stored]
            return self._resolve_actions(conn, table, path, todo, meta, commit_ts, origin)

        def record(conn: sa.Connection, _newest: int) -> None:
            c = xdcr_sink_table.c
            updated = conn.execute(xdcr_sink_table.update().where(
                c.table_id == table.table_id, c.origin_cluster_id == origin_id).values(
                timestamp=end_position[0], seq=end_position[1])).rowcount
            if not updated:
                conn.execute(xdcr_sink_table.insert().values(table_id=table.table_id, origin_cluster_id=origin_id,
                                                             timestamp=end_position[0], seq=end_position[1]))

        answer = self.state.transactions.apply_replicated(table, groups, False, 0, check=check, expected=None,
                                                    record=record, end=end_position, prepare=prepare)
        if not answer.get("applied", True):
            stored = stored_box.get("stored", end_position)
            return {"applied": False, "position": list(stored)}
        return {"applied": True, "position": list(end_position)}

    def _resolve_actions(self, conn: sa.Connection, table: DynamicTable, path: str, writes: list[RowWrite],
                         meta: dict[int, xdcr.Action], commit_ts: int, origin: str) -> list[RowWrite]:
        """The seed's rules for each action, against the rows as they are now (under the writer);
        conflicts go to the conflict log in this same transaction."""
        own = self.state.own_id()
        keys = [table.key_of(w.row) for w in writes]
        current = xdcr.read_versions(conn, table.table_id, keys)
        accepted: list[RowWrite] = []
        conflicted: list[tuple[RowWrite, tuple[Any, ...], xdcr.Resolution, xdcr.RowVersion | None]] = []
        for write, key in zip(writes, keys, strict=True):
            action = meta[id(write)]
            expected = action.expected
            assert write.origin is not None
            here = current.get(key)
            resolution = xdcr.resolve(action.kind, action.incoming, expected, here)
            write.origin_horizon = action.incoming.horizon
            write.here_known, write.here = True, here
            if resolution.accept:
                accepted.append(write)
            if resolution.is_conflict:
                conflicted.append((write, key, resolution, expected))
        log_rows: list[dict[str, Any]] = []
        befores = [RowWrite(WriteKind.WRITE, dict(meta[id(w)].before or {}), table.schema.full_lock_mask)
                   for w, _, _, expected in conflicted if expected is not None and meta[id(w)].before is not None]
        if befores:
            # the rows the conflicting changes were made on go to the conflict log (EXP): checked like
            # rows first (a bad one refuses the whole batch: nothing of it is applied)
            self.state.host.check_peer_writes(table, path, befores, "the earlier rows in XDCR changes of "
                                                                     f"cluster {origin}")
        if conflicted:
            # the rows as they are here, for the log (read only when there is a conflict)
            rows = dict(zip([k for _, k, _, _ in conflicted],
                            table.lookup(conn, [k for _, k, _, _ in conflicted], None), strict=True))
            # when the conflict was resolved, on the version clock: the unit of the versions logged
            resolved_at = self.state.clock.read()
            for write, key, resolution, expected in conflicted:
                log_rows += self.conflicts.conflict_rows(table, path, meta[id(write)], write, key, resolution, expected,
                                                current.get(key), rows.get(key), own, resolved_at)
        if log_rows:
            self.conflicts.log(conn, log_rows, commit_ts, origin)
        return accepted
