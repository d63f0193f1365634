"""Tablet state (mount, unmount, freeze, reshard), schema changes and the replication commands of a
table (``TabletService``).

A state change runs in one write transaction. Mount, unmount and unfreeze complete before the
command returns. ``freeze_table`` does not wait for commits in flight: the table is ``freezing``
(writes refused with the frozen error from then on) until no commit that already passed the
writable check holds it any more, then ``frozen`` — so "frozen" means what seed 002's queue check
relies on (every accepted change is in the queue, ``flushed_row_count`` is final).

Collaborators (given by the composition root, ``cluster.py``): the storage and the tree, the node's
tables, the transaction manager (commits in flight, for a freeze), replication (the replicas of a
table: a reshard waits for them, a schema change asks them, the start-up repair of queue row counts
reads their progress) and the serving state (an XDCR table's schema changes only while its cluster
is paused).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..cypress import (
    INTERNAL_PREFIX,
    Cypress,
)
from ..errors import ErrorCode, TabletStateError, YtError
from ..replication import ReplicationManager
from ..schema import TableSchema, check_schema_update, validate_row
from ..storage import Storage, on_commit, on_rollback, tablets_table
from ..tablets import (
    DynamicTable,
    TabletState,
    parse_pivot_keys,
)
from ..transactions import TransactionManager
from .serving import ServingState
from .tables import LAYOUT_REVISION_ATTRIBUTE, Tables

log = logging.getLogger("reptables.engine")


class TabletService:
    """Tablet state, schema changes and the replication commands."""

    def __init__(self, name: str, storage: Storage, cypress: Cypress, tables: Tables,
                 transactions: TransactionManager, replication: ReplicationManager, serving: ServingState) -> None:
        self.name = name
        self.storage = storage
        self.cypress = cypress
        self.tables = tables
        self.transactions = transactions
        self.replication = replication
        self.serving = serving

    def _transition(self, path: Any, allowed: tuple[TabletState, ...], target: TabletState, verb: str) -> None:
        """Move a table to ``target``; the change is complete when the command returns."""
        table, table_path, node = self.tables.table(path)
        with self.storage.write() as conn:
            if table.state == target:
                return
            if table.state not in allowed:
                raise TabletStateError(f"Cannot {verb} table {table_path}: tablet state is {table.state.value!r}",
                                       attributes={"path": table_path, "tablet_state": table.state.value})
            table.state = target
            self.tables.save_table_state(conn, node)

    def mount_table(self, path: Any, freeze: bool = False) -> None:
        target = TabletState.FROZEN if freeze else TabletState.MOUNTED
        self._transition(path, (TabletState.UNMOUNTED,), target, "mount")

    def unmount_table(self, path: Any, force: bool = False) -> None:
        self._transition(path, (TabletState.MOUNTED, TabletState.FROZEN), TabletState.UNMOUNTED, "unmount")

    def remount_table(self, path: Any) -> None:
        table, table_path, _ = self.tables.table(path)
        if table.state not in (TabletState.MOUNTED, TabletState.FROZEN):
            raise TabletStateError(f"Cannot remount table {table_path}: it is not mounted")

    def freeze_table(self, path: Any) -> None:
        """mounted -> ``freezing`` now, -> ``frozen`` once the table's commits in flight are done.

        A commit checks that its tables are writable before it prepares, so one that passed the
        check before the table turned ``freezing`` may still append; ``frozen`` waits for it
        (:meth:`_commits_in_flight`). Returns at once; with nothing in flight the table is frozen
        before it returns. Freezing a freezing table waits on (a restart ends the wait: after it
        nothing is in flight)."""
        table, table_path, node = self.tables.table(path)
        with self.storage.write() as conn:
            if table.state == TabletState.FROZEN:
                return
            if table.state not in (TabletState.MOUNTED, TabletState.FREEZING):
                raise TabletStateError(f"Cannot freeze table {table_path}: tablet state is {table.state.value!r}",
                                       attributes={"path": table_path, "tablet_state": table.state.value})
            if table.state == TabletState.MOUNTED:
                table.state = TabletState.FREEZING
                self.tables.save_table_state(conn, node)
        if not self._finish_freezing(table, node):
            threading.Thread(target=self._await_frozen, args=(table, node, table_path),
                             name=f"freeze-{table.table_id}", daemon=True).start()

    def unfreeze_table(self, path: Any) -> None:
        """frozen (or still freezing) -> mounted."""
        self._transition(path, (TabletState.FROZEN, TabletState.FREEZING), TabletState.MOUNTED, "unfreeze")

    def _commits_in_flight(self, table_id: str) -> bool:
        return self.transactions.commits_in_flight(table_id)

    def _finish_freezing(self, table: DynamicTable, node: Any) -> bool:
        """freezing -> frozen if no commit is in flight; True when the table is no longer freezing."""
        if table.state != TabletState.FREEZING:
            return True
        if self._commits_in_flight(table.table_id):
            return False
        with self.storage.write() as conn:
            # a commit applies under the storage writer: none is between its check and its apply now
            if table.state == TabletState.FREEZING and not self._commits_in_flight(table.table_id):
                table.state = TabletState.FROZEN
                self.tables.save_table_state(conn, node)
        return table.state != TabletState.FREEZING

    def _await_frozen(self, table: DynamicTable, node: Any, table_path: str) -> None:
        """The background end of a freeze: poll until the commits in flight are done (a commit is
        bounded by its prepare and transaction timeouts), then freeze."""
        while True:
            try:
                if self._finish_freezing(table, node):
                    break
            except Exception:  # noqa: BLE001 - e.g. the engine is shutting down; freeze-table may be retried
                log.exception("freezing failed", extra={"path": table_path})
                return
            time.sleep(0.02)
        # (unfrozen or unmounted meanwhile: nothing to say)
        if table.state == TabletState.FROZEN:
            log.info("table frozen", extra={"path": table_path, "tablet_state": table.state.value})

    def _check_queue_replicated(self, table: DynamicTable, table_path: str) -> None:
        """A replicated table is resharded only once every replica has its whole queue.

        Queued changes reach a replica tablet by tablet. A reshard moves keys between tablets (and
        may drop tablets), so a change still queued could reach a replica after a newer change of
        the same key written to its new tablet, or be stranded in a tablet that no longer exists.
        The table is unmounted for a reshard, so the replicators drain the queue meanwhile."""
        for replica in self.replication.replicas_of(table.table_id):
            snapshot = replica.snapshot()
            for tablet in range(table.tablet_count):
                end = table.tablet_rows.get(tablet, [0, 0])[0]
                have = snapshot.progress_of(tablet).row_index
                if have < end:
                    raise TabletStateError(
                        f"Cannot reshard replicated table {table_path} yet: replica {snapshot.id} on cluster "
                        f"{snapshot.cluster_name} has not received {end - have} queued rows of tablet {tablet}; "
                        "retry once it has caught up (a disabled replica must be enabled or removed first)",
                        attributes={"path": table_path, "replica_id": snapshot.id, "tablet_index": tablet,
                                    "retriable": True})

    def reshard_table(self, path: Any, pivot_keys: Any = None, tablet_count: Any = None) -> None:
        """Give an unmounted table new tablets: pivot keys (sorted) or a tablet count (ordered).

        A table whose tablets count rows (an ordered table, a replicated table's queue) has one
        ``_rt_tablets`` row per tablet, made here for every tablet the reshard adds, in the same
        write transaction: a queue append updates that row, and a restart reads its counts from it
        alone. A tablet index that had rows before (a sorted replicated table resharded to fewer
        tablets and back) keeps its counts: its queue goes on from its last row. The new layout is
        published once the SQL commit is done, the tablets first and ``layout_revision`` after them
        (what replicators send to replica clusters, ``DynamicTable.layout_revision``)."""
        table, table_path, node = self.tables.table(path)
        if (pivot_keys is None) == (tablet_count is None):
            raise YtError(f"Cannot reshard table {table_path}: give exactly one of pivot_keys and tablet_count",
                          code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write() as conn:
            if table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot reshard table {table_path}: table must be unmounted "
                                       f"(tablet state is {table.state.value!r})", attributes={"path": table_path})
            if table.replicated:
                self._check_queue_replicated(table, table_path)
            pivots: list[list[Any]] | None = None
            if pivot_keys is not None:
                if not table.sorted:
                    raise YtError(f"Cannot reshard ordered table {table_path} by pivot keys; use tablet_count",
                                  code=ErrorCode.INVALID_PARAMETER)
                pivots = parse_pivot_keys(pivot_keys, table.schema, table_path)
                count = len(pivots)
                attributes: dict[str, Any] = {"pivot_keys": pivots}
            else:
                count = yson_util.to_python(tablet_count)
                if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
                    raise YtError(f"Cannot reshard table {table_path}: tablet_count must be in [1, 10000]",
                                  code=ErrorCode.INVALID_PARAMETER)
                if table.sorted:
                    raise YtError(f"Cannot reshard sorted table {table_path} by tablet_count: give pivot_keys",
                                  code=ErrorCode.INVALID_PARAMETER)
                for i in range(count, table.tablet_count):
                    rows, trimmed = table.tablet_rows.get(i, [0, 0])
                    if rows > trimmed:
                        raise YtError(f"Cannot reshard table {table_path} to {count} tablets: tablet {i} "
                                      "still holds rows", code=ErrorCode.INVALID_PARAMETER)
                attributes = {f"{INTERNAL_PREFIX}tablet_count": count}
            dropped, added = self._reshard_tablet_rows(conn, table, node.id, count) \
                if table.replicated or not table.sorted else ([], {})
            revision = table.layout_revision + 1
            attributes[LAYOUT_REVISION_ATTRIBUTE] = revision
            previous = {name: node.attributes.get(name) for name in attributes}

            def undo() -> None:
                for name, value in previous.items():
                    if value is None:
                        node.attributes.pop(name, None)
                    else:
                        node.attributes[name] = value

            on_rollback(conn, undo)
            node.attributes.update(attributes)
            self.cypress.save(conn, node)

            def publish() -> None:
                # lock-free readers (replicators) read the revision first and the tablets second:
                # the tablets go first, so that a new revision is never read with an old tablet count
                for i in dropped:
                    table.tablet_rows.pop(i, None)
                for i, counts in added.items():
                    table.tablet_rows[i] = counts
                if pivots is not None:
                    table.pivot_keys = pivots
                else:
                    table.tablet_count_ordered = count
                table.layout_revision = revision

            on_commit(conn, publish)

    @staticmethod
    def _reshard_tablet_rows(conn: sa.Connection, table: DynamicTable, table_id: str,
                             count: int) -> tuple[list[int], dict[int, list[int]]]:
        """The ``_rt_tablets`` rows of a table resharded to ``count`` tablets, in the caller's write
        transaction: (the tablets whose counts go, the tablets that get counts) for the caller to
        publish.

        An ordered table's tablets past ``count`` are empty (checked) and go. A replicated table's
        keep their rows and counts: its change stream is its queue, tablets that left the layout
        included. Every tablet below ``count`` gets its row if it has none, with the counts the
        table holds for it, if any (a tablet it had before), else none yet."""
        dropped = list(range(count, table.tablet_count)) if not table.sorted else []
        for i in dropped:
            conn.execute(tablets_table.delete().where(tablets_table.c.table_id == table_id,
                                                      tablets_table.c.tablet_index == i))
        stored = set(conn.execute(sa.select(tablets_table.c.tablet_index).where(
            tablets_table.c.table_id == table_id)).scalars())
        added: dict[int, list[int]] = {}
        for i in range(count):
            if i in stored:
                continue
            rows, trimmed = added[i] = list(table.tablet_rows.get(i, [0, 0]))
            conn.execute(tablets_table.insert().values(table_id=table_id, tablet_index=i, row_count=rows,
                                                       trimmed_row_count=trimmed))
        return dropped, added

    def restore_tablet_counts(self) -> None:
        """At start-up, before anything writes: give every tablet of a replicated table that has no
        ``_rt_tablets`` row one, with the counts its queue shows.

        A reshard of an engine before the fix of docs/reliability.md's first finding made no such
        row for the tablets it added, so their queues' row counts were never saved: a restart took
        them for empty queues (writes to them failed, queued rows were never sent). The counts
        come from the queue's rows and the replicas' acknowledged progress
        (``DynamicTable.uncounted_tablets``)."""
        restored: list[tuple[str, dict[int, list[int]]]] = []
        with self.storage.write() as conn:
            for node in self.tables.all_tables():
                table = node.table
                if table is None or not table.replicated:
                    continue

                def acknowledged(tablet: int, table_id: str = table.table_id) -> int:
                    return max((r.progress_of(tablet).row_index for r in self.replication.replicas_of(table_id)),
                               default=0)

                found = table.uncounted_tablets(conn, acknowledged)
                for tablet, (rows, trimmed) in found.items():
                    conn.execute(tablets_table.insert().values(table_id=table.table_id, tablet_index=tablet,
                                                               row_count=rows, trimmed_row_count=trimmed))
                if found:
                    on_commit(conn, functools.partial(table.tablet_rows.update, found))
                    restored.append((node.path, found))
        for path, found in restored:
            log.warning("restored the queue row counts of tablets a reshard had added without them",
                        extra={"path": path, "tablets": found})

    def alter_table(self, path: Any, upstream_replica_id: Any = None, schema: Any = None) -> None:
        table, table_path, node = self.tables.table(path)
        if schema is not None:
            self.alter_schema(path, schema)
        if upstream_replica_id is None:
            return
        if not isinstance(upstream_replica_id, str):
            raise YtError("upstream_replica_id must be a replica id string", code=ErrorCode.INVALID_PARAMETER)
        if table.replicated:
            raise YtError(f"Cannot set upstream_replica_id of replicated table {table_path}",
                          code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write() as conn:
            if table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot alter table {table_path}: table must be unmounted",
                                       attributes={"path": table_path})
            value = None if upstream_replica_id in ("", "0-0-0-0") else upstream_replica_id
            previous = table.upstream_replica_id
            on_rollback(conn, lambda: setattr(table, "upstream_replica_id", previous))
            table.upstream_replica_id = value
            if value is None:
                node.attributes.pop("upstream_replica_id", None)
            else:
                node.attributes["upstream_replica_id"] = value
            self.cypress.save(conn, node)

    def alter_schema(self, path: Any, raw_schema: Any) -> None:
        """``alter_table --schema``: widen a dynamic table's schema, mounted or not (docs/engine.md).

        YT asks for an unmounted table; reptables also takes a mounted (or frozen) one, because the
        change is one write transaction under the writer lock: a commit applies entirely before or
        entirely after it, and rows buffered against the old schema simply have no value in the
        new columns. That is what lets writes go on through the seed's migration order (replica
        tables first, then the replicated table). A replicated table's new schema must not be wider
        than the table of any enabled (or enabling) replica: the replicas are asked first (network,
        no lock held), and the change is checked again under the lock against the schema then."""
        table, table_path, node = self.tables.table(path)
        new_schema = TableSchema.parse(raw_schema, table_path)
        if table.xdcr_cluster_id is not None and not self.serving.paused:
            # seed 001: schema changes are not replicated; every cluster changes its own while the
            # group is paused and drained, so no change in flight meets another schema
            raise YtError(f"Cannot alter the schema of XDCR table {table_path} while cluster {self.name} takes writes: "
                          "pause and drain every cluster of the group first (`reptables dr pause`), change the schema "
                          "on each, then resume", code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        with self.storage.read() as conn:
            empty = table.is_empty(conn)
        check_schema_update(table.schema, new_schema, table_path, empty=empty)
        if table.replicated:
            self.replication.registry.check_schema_change(table, table_path, new_schema)
        with self.storage.write() as conn:
            current = table.schema
            added = check_schema_update(current, new_schema, table_path, empty=table.is_empty(conn))
            if new_schema == current:
                return
            table.alter_schema(conn, new_schema, [c.name for c in added], table_path)
            previous = (node.attributes.get("schema"), node.attributes.get(f"{INTERNAL_PREFIX}schema_attrs"))

            def undo() -> None:
                node.attributes["schema"], node.attributes[f"{INTERNAL_PREFIX}schema_attrs"] = previous

            on_rollback(conn, undo)
            node.attributes["schema"] = [c.to_yt() for c in new_schema.columns]
            node.attributes[f"{INTERNAL_PREFIX}schema_attrs"] = {"strict": new_schema.strict,
                                                                "unique_keys": new_schema.unique_keys}
            self.cypress.save(conn, node)
        log.info("table schema altered", extra={"path": table_path, "added": [c.name for c in added]})

    def alter_table_replica(self, replica_id: str, enabled: bool | None = None, mode: str | None = None) -> None:
        if mode == "sync" and self.replication.replica(replica_id).atomicity == "none":
            raise YtError(f"Replica {replica_id} has atomicity=none and can only be asynchronous",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"replica_id": replica_id})
        self.replication.alter_replica(replica_id, enabled, mode)

    def get_in_sync_replicas(self, path: Any, timestamp: Any, keys: list[Any] | None = None) -> list[str]:
        table, table_path, _ = self.tables.table(path)
        if not table.replicated:
            raise YtError(f"Table {table_path} is not replicated", code=ErrorCode.INVALID_PARAMETER)
        if timestamp is None:
            raise YtError("get_in_sync_replicas requires a timestamp", code=ErrorCode.INVALID_PARAMETER)
        ts = self.tables.read_timestamp(timestamp)
        if ts is None:
            ts = self.tables.timestamps.generate()
        for raw in keys or []:
            validate_row(table.schema, raw, table_path, key_only=True)
        return self.replication.in_sync_replicas(table, ts)
