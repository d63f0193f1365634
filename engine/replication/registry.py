"""The replica registry: which ``table_replica`` objects this meta-cluster has, and their bookkeeping.

The registry loads the replicas at start-up, creates and removes them (``create``: the checks of
a new replica's attributes, its node, its first progress), saves a replica's state on its Cypress
node and its progress in ``_rt_replica_progress``, and finds replicas for everyone else. It also
drives the state changes of ``alter_table_replica`` and ends those the replicator finishes, saving
each in one write transaction; the replica objects, their state and its transitions are
``replica.py``. Enabling a replica, or widening a replicated table's schema, first asks the
replica clusters about their tables (seed 002): those are network calls, made with no lock held.

Locks, in the order they may be taken (never the reverse; docs/architecture.md, "Lock order"):

1. ``Storage.write_lock`` (the storage writer): SQL writes, and every change of a replica's
   ``row_index`` progress, so that the draining check of a sync replica and the commit path see
   the same queue tail;
2. ``ReplicaRegistry._lock``: which replicas exist (the ``_replicas`` map and its index by table);
3. ``Replica._lock`` (``replica.py``): one replica's mutable fields; a leaf.

``ReplicatorPool._lock`` (the replicators' schedule, ``scheduler.py``) is a leaf of its own, never
held with 2 or 3 (it may be taken under 1: a commit's ``on_commit`` hook wakes the replicators of
its table). No replication lock is held during network I/O, while waiting for the storage writer,
or while calling the transaction manager, whose locks (its session lock and the in-flight
condition) are thus never taken under a replication lock. The transaction manager calls
``after_queue_append`` with the storage writer held and none of its own locks; that hook takes
the registry lock, then replica locks, in the order above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from ..credentials import cell_tag
from ..cypress import OBJECT_TYPES, Node
from ..errors import ErrorCode, YtError
from ..peers import Peers
from ..replica_types import ReplicaMode, ReplicaState
from ..schema import TableSchema
from ..storage import FastStatement, replica_progress_table
from ..tablets import DynamicTable
from ..transactions import make_object_id
from .host import ReplicationHost
from .replica import Replica, SyncPhase, TabletProgress, history_trimmed_error

log = logging.getLogger("reptables.engine.replication")

#: where a replica object keeps the id of its replicated table (hidden from users)
TABLE_ID_ATTRIBUTE = "_rt_table_id"
#: internal attributes of a replica's node: see Replica.history_trimmed, created_at, enabled_once
HISTORY_TRIMMED_ATTRIBUTE = "_rt_history_trimmed"
CREATED_AT_ATTRIBUTE = "_rt_created_at"
ENABLED_ONCE_ATTRIBUTE = "_rt_enabled_once"

# the statements on the latency path of every sync replica commit (storage.FastStatement)
_UPDATE_PROGRESS = FastStatement.update(replica_progress_table, "replica_id", "tablet_index")
_INSERT_PROGRESS = FastStatement.insert(replica_progress_table)


def save_progress(conn: sa.Connection, replica_id: str, tablet: int, row_index: int, timestamp: int) -> None:
    """Persist a replica's progress on one tablet (inside the caller's write transaction)."""
    updated = _UPDATE_PROGRESS.run(conn, replica_id=replica_id, tablet_index=tablet, row_index=row_index,
                                   timestamp=timestamp)
    if updated.rowcount == 0:
        _INSERT_PROGRESS.run(conn, replica_id=replica_id, tablet_index=tablet, row_index=row_index,
                             timestamp=timestamp)


class ReplicaRegistry:
    """The replicas of this meta-cluster: loading, persistence, create/remove/alter."""

    def __init__(self, host: ReplicationHost, peers: Peers) -> None:
        self.host = host
        self.peers = peers
        #: guards _replicas and _by_table (which replicas exist). Taken after Storage.write_lock,
        #: before a Replica._lock; never held across network I/O or while waiting for the storage writer.
        self._lock = threading.Lock()
        self._replicas: dict[str, Replica] = {}
        #: the same replicas by replicated table id (the commit path asks for a table's replicas on
        #: every commit: an index, not a scan of every replica of the cluster); guarded by _lock
        self._by_table: dict[str, list[Replica]] = {}

    # -- loading and persistence -------------------------------------------------------------------

    def load(self, conn: sa.Connection) -> None:
        progress: dict[str, dict[int, TabletProgress]] = {}
        for row in conn.execute(sa.select(replica_progress_table)):
            progress.setdefault(row.replica_id, {})[row.tablet_index] = TabletProgress(row.row_index, row.timestamp)
        loaded = {node.id: self._from_node(node, progress.get(node.id, {}))
                  for node in list(self.host.cypress.by_id.values()) if node.type == "table_replica"}
        with self._lock:
            for replica in loaded.values():
                self._add(replica)

    def _from_node(self, node: Node, progress: dict[int, TabletProgress]) -> Replica:
        a = node.attributes
        table_node = self.host.cypress.by_id.get(a[TABLE_ID_ATTRIBUTE])
        mode = ReplicaMode(a.get("mode", "async"))
        state = ReplicaState(a.get("state", "disabled"))
        return Replica(
            id=node.id, node=node, table_id=a[TABLE_ID_ATTRIBUTE], cluster_name=a["cluster_name"],
            replica_path=a["replica_path"], mode=mode, state=state,
            start_replication_timestamp=int(a.get("start_replication_timestamp", 0)),
            preserve_timestamps=bool(a.get("preserve_timestamps", True)), atomicity=a.get("atomicity", "full"),
            tracker_enabled=bool(a.get("enable_replicated_table_tracker", True)),
            phase=SyncPhase.CATCHING_UP if mode is ReplicaMode.SYNC and
            state in (ReplicaState.ENABLED, ReplicaState.ENABLING) else None,
            table_path=table_node.path if table_node is not None else a.get("table_path", ""), progress=progress,
            history_trimmed=int(a.get(HISTORY_TRIMMED_ATTRIBUTE, 0)),
            # (replicas made before these were recorded: old, and taken as enabled once if enabled)
            created_at=float(a.get(CREATED_AT_ATTRIBUTE, 0.0)),
            enabled_once=bool(a.get(ENABLED_ONCE_ATTRIBUTE, state is not ReplicaState.DISABLED)))

    def save(self, conn: sa.Connection, replica: Replica) -> None:
        """Persist a replica's state on its node (in the caller's write transaction)."""
        self._save(conn, replica)

    def _save(self, conn: sa.Connection, replica: Replica) -> None:
        snap = replica.snapshot()
        replica.node.attributes.update(snap.attributes())
        replica.node.attributes[TABLE_ID_ATTRIBUTE] = replica.table_id
        replica.node.attributes[HISTORY_TRIMMED_ATTRIBUTE] = snap.history_trimmed
        replica.node.attributes[CREATED_AT_ATTRIBUTE] = snap.created_at
        replica.node.attributes[ENABLED_ONCE_ATTRIBUTE] = snap.enabled_once
        self.host.cypress.save(conn, replica.node)

    # -- lookups -----------------------------------------------------------------------------------

    def _add(self, replica: Replica) -> None:
        """(``_lock`` held) one more replica, or a replica object that replaces one of the same id."""
        previous = self._replicas.get(replica.id)
        self._replicas[replica.id] = replica
        siblings = [r for r in self._by_table.get(replica.table_id, ()) if r is not previous]
        self._by_table[replica.table_id] = [*siblings, replica]

    def replicas_of(self, table_id: str) -> list[Replica]:
        with self._lock:
            return list(self._by_table.get(table_id, ()))

    def all(self) -> list[Replica]:
        with self._lock:
            return list(self._replicas.values())

    def find(self, replica_id: str) -> Replica | None:
        with self._lock:
            return self._replicas.get(replica_id.lstrip("#"))

    def get(self, replica_id: str) -> Replica:
        replica = self.find(replica_id)
        if replica is None:
            raise YtError(f"No such table replica {replica_id}", code=ErrorCode.RESOLVE_ERROR, http_status=404,
                          attributes={"replica_id": replica_id})
        return replica

    # -- replica objects -------------------------------------------------------------------------------

    def create(self, attrs: dict[str, Any]) -> str:
        table_path = attrs.get("table_path")
        if not isinstance(table_path, str):
            raise YtError("Cannot create table_replica: attribute \"table_path\" is required",
                          code=ErrorCode.INVALID_PARAMETER)
        table, path, _ = self.host.resolve_table(table_path)
        if not table.replicated:
            raise YtError(f"Cannot create a replica of {path}: it is not a replicated_table",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": path})
        cluster_name = attrs.get("cluster_name")
        if not isinstance(cluster_name, str) or not cluster_name:
            raise YtError("Cannot create table_replica: attribute \"cluster_name\" is required",
                          code=ErrorCode.INVALID_PARAMETER)
        replica_path = attrs.get("replica_path")
        if not isinstance(replica_path, str) or not replica_path.startswith("//"):
            raise YtError("Cannot create table_replica: attribute \"replica_path\" must be a path like //tmp/replica",
                          code=ErrorCode.INVALID_PARAMETER)
        self.peers.connection(cluster_name)
        mode = attrs.get("mode", "async")
        if mode not in ("sync", "async"):
            raise YtError(f"Invalid replica mode {mode!r}: expected sync or async", code=ErrorCode.INVALID_PARAMETER)
        start_ts = attrs.get("start_replication_timestamp", 0)
        if isinstance(start_ts, bool) or not isinstance(start_ts, int) or start_ts < 0:
            raise YtError("start_replication_timestamp must be a timestamp (non-negative integer)",
                          code=ErrorCode.INVALID_PARAMETER)
        if mode == "sync" and not attrs.get("preserve_timestamps", True):
            raise YtError("A replica with preserve_timestamps=%false can only be asynchronous",
                          code=ErrorCode.INVALID_PARAMETER)
        atomicity = attrs.get("atomicity", "full")
        if atomicity not in ("full", "none"):
            raise YtError("Replica atomicity must be full or none", code=ErrorCode.INVALID_PARAMETER)
        if atomicity == "none" and mode == "sync":
            # seed 002: atomicity "makes sense only for asynchronous replicas"
            raise YtError("A replica with atomicity=none can only be asynchronous: a sync replica takes part in "
                          "every commit, atomically", code=ErrorCode.INVALID_PARAMETER)
        # lock order: the storage writer, then the registry (the duplicate check and the insert are one step)
        with self.host.storage.write() as conn, self._lock:
            for other in self._by_table.get(table.table_id, ()):
                if other.cluster_name == cluster_name and other.replica_path == replica_path:
                    raise YtError(f"Replica {other.id} of {path} already points to {cluster_name}:{replica_path}",
                                  code=ErrorCode.ALREADY_EXISTS)
            # the id carries this cluster's cell tag: replica clusters accept its rows only from here
            node = Node(id=make_object_id(OBJECT_TYPES["table_replica"], cell_tag(self.host.name)),
                        type="table_replica", name=None, parent=None, attributes={})
            # a new replica starts at the oldest change still in the queue; if changes after its
            # start_replication_timestamp already left it, the replica misses them (and says so)
            progress = {tablet: TabletProgress(table.tablet_rows.get(tablet, [0, 0])[1], 0)
                        for tablet in range(table.tablet_count)}
            history_trimmed = table.trimmed_timestamp if table.trimmed_timestamp > start_ts else 0
            replica = Replica(
                id=node.id, node=node, table_id=table.table_id, cluster_name=cluster_name,
                replica_path=replica_path, mode=ReplicaMode(mode), state=ReplicaState.DISABLED,
                start_replication_timestamp=start_ts,
                preserve_timestamps=bool(attrs.get("preserve_timestamps", True)), atomicity=atomicity,
                tracker_enabled=bool(attrs.get("enable_replicated_table_tracker", True)), table_path=path,
                progress=progress, history_trimmed=history_trimmed, created_at=time.time())
            known = replica.attributes()
            for key, value in attrs.items():
                if key not in known and key != "table_path":
                    node.attributes[key] = value
            for tablet, p in progress.items():
                save_progress(conn, node.id, tablet, p.row_index, p.timestamp)
            self.host.cypress.attach(node)
            self._save(conn, replica)
            self._add(replica)
        log.info("replica created", extra={"replica_id": node.id, "path": path, "cluster": cluster_name,
                                           "replica_path": replica_path})
        return node.id

    def remove(self, conn: sa.Connection, replica_id: str) -> None:
        """Forget a replica (inside the caller's write transaction, which also deletes its node)."""
        with self._lock:
            replica = self._replicas.pop(replica_id, None)
            if replica is not None:
                siblings = [r for r in self._by_table.get(replica.table_id, ()) if r is not replica]
                if siblings:
                    self._by_table[replica.table_id] = siblings
                else:
                    self._by_table.pop(replica.table_id, None)
        if replica is None:
            return
        conn.execute(replica_progress_table.delete().where(replica_progress_table.c.replica_id == replica_id))

    def alter(self, replica_id: str, enabled: bool | None, mode: str | None) -> None:
        """``alter_table_replica``: returns at once, the replica is then ``enabling`` or ``disabling``.

        What makes enabling impossible (history trimmed, an incompatible replica table) fails the
        command here, before any change. The transition is ended by the replicator
        (``replicator.py``): ``enabled`` after its first pass over every tablet (a sync replica: once
        it starts draining), ``disabled`` once it has stopped with its progress saved. An enable of
        a replica already enabled or enabling (a disable of one disabled or disabling) changes
        nothing; an enable of a ``disabling`` replica turns it back to ``enabling``."""
        replica = self.get(replica_id)
        if mode is not None and mode not in ("sync", "async"):
            raise YtError(f"Invalid replica mode {mode!r}: expected sync or async", code=ErrorCode.INVALID_PARAMETER)
        if mode == "sync" and not replica.preserve_timestamps:
            raise YtError(f"Replica {replica.id} has preserve_timestamps=%false and can only be asynchronous",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"replica_id": replica.id})
        if enabled is True and replica.state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
            trimmed = replica.history_trimmed
            if trimmed:
                raise history_trimmed_error(replica, trimmed)
            self.check_replica_table(replica)  # network: no lock held
            self._change(replica, replica.begin_enabling)
        elif enabled is False and replica.state not in (ReplicaState.DISABLED, ReplicaState.DISABLING):
            self._change(replica, replica.begin_disabling)
        if mode is not None and ReplicaMode(mode) is not replica.mode:
            new_mode = ReplicaMode(mode)
            self._change(replica, lambda: replica.set_mode(new_mode))
        snap = replica.snapshot()
        log.info("replica altered", extra={"replica_id": replica.id, "path": replica.table_path,
                                           "state": snap.state.value, "mode": snap.mode.value})

    def finish_transition(self, replica: Replica, change: Callable[[], bool]) -> bool:
        """End a transition (``Replica.finish_enabling``, ``finish_disabling``, ``start_draining``)
        and save the new state in one write transaction, if ``change`` made one (it returns whether)."""
        with self.host.storage.write() as conn:
            if self.find(replica.id) is not replica or not change():
                return False
            self._save(conn, replica)
        snap = replica.snapshot()
        log.info("replica state changed", extra={"replica_id": replica.id, "path": replica.table_path,
                                                 "state": snap.state.value, "mode": snap.mode.value})
        return True

    def _change(self, replica: Replica, change: Callable[[], None]) -> None:
        """One state change, saved in one write transaction (the storage writer, then the replica)."""
        with self.host.storage.write() as conn:
            change()
            self._save(conn, replica)

    def check_replica_table(self, replica: Replica) -> None:
        """Seed 002: a replica table must be at least as wide, with the same key, of the same kind."""
        table_node = self.host.cypress.by_id[replica.table_id]
        table = table_node.table
        assert table is not None
        try:
            info = self.peers.client(replica.cluster_name).call("table_info", {"path": replica.replica_path},
                                                                timeout=5.0)
        except YtError as exc:
            raise YtError(f"Cannot enable replica {replica.id}: replica table {replica.replica_path} on cluster "
                          f"{replica.cluster_name} cannot be inspected: {exc.message}", code=exc.code,
                          attributes={"replica_id": replica.id}) from None
        where = f"replica table {replica.replica_path} on cluster {replica.cluster_name}"
        if bool(info["sorted"]) != table.sorted:
            kind = "sorted" if info["sorted"] else "ordered"
            raise YtError(f"Cannot enable replica {replica.id}: {where} is {kind} but {table_node.path} is "
                          f"{'sorted' if table.sorted else 'ordered'}", code=ErrorCode.INCOMPATIBLE_KEY_COLUMNS)
        if list(info["key_columns"]) != table.schema.key_names:
            raise YtError(f"Cannot enable replica {replica.id}: key columns of {where} {info['key_columns']} "
                          f"differ from {table.schema.key_names} of {table_node.path}",
                          code=ErrorCode.INCOMPATIBLE_KEY_COLUMNS)
        columns = {c["name"]: c["type"] for c in info["columns"]}
        for col in table.schema.columns:
            if col.name not in columns:
                raise YtError(f"Cannot enable replica {replica.id}: {where} has no column {col.name!r}; its schema "
                              f"is narrower than that of {table_node.path}", code=ErrorCode.SCHEMA_VIOLATION)
            if columns[col.name] != col.type.value:
                raise YtError(f"Cannot enable replica {replica.id}: column {col.name!r} of {where} has type "
                              f"{columns[col.name]}, expected {col.type.value}", code=ErrorCode.SCHEMA_VIOLATION)
        # replication writes carry the replica's atomicity; a table of the other atomicity would refuse
        # them at every push (seed 003: the modes of the table and the transaction must match)
        table_atomicity = info.get("atomicity", "full")
        if table_atomicity != replica.atomicity:
            raise YtError(f"Cannot enable replica {replica.id}: {where} has atomicity={table_atomicity} but the "
                          f"replica has atomicity={replica.atomicity}; they must match",
                          code=ErrorCode.INVALID_TRANSACTION_ATOMICITY, attributes={"replica_id": replica.id})
        expected = replica.id if replica.preserve_timestamps else None
        if info.get("upstream_replica_id") != expected:
            raise YtError(f"Cannot enable replica {replica.id}: {where} has upstream_replica_id "
                          f"{info.get('upstream_replica_id')!r}, expected {expected!r}",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH)

    def check_schema_change(self, table: DynamicTable, path: str, schema: TableSchema) -> None:
        """Seed 002: a replicated table's schema is never wider than its replicas' ("start the schema
        change with the replicas and then move on to the replicated table").

        Refuses ``schema`` for the replicated table at ``path`` while the table of an enabled (or
        enabling) replica lacks one of its columns or has it with another type; the error names the
        replica, its cluster and path. Each replica cluster is asked through ``table_info``, as
        :meth:`check_replica_table` does; no lock is held. A disabled replica is not asked: it gets
        nothing until it is enabled, and enabling checks its table against the schema then."""
        for replica in self.replicas_of(table.table_id):
            snap = replica.snapshot()
            if snap.state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                continue
            where = f"replica table {snap.replica_path} on cluster {snap.cluster_name}"
            attributes = {"path": path, "replica_id": snap.id, "cluster_name": snap.cluster_name,
                          "replica_path": snap.replica_path}
            try:
                info = self.peers.client(snap.cluster_name).call("table_info", {"path": snap.replica_path},
                                                                 timeout=5.0)
            except YtError as exc:
                raise YtError(f"Cannot alter the schema of replicated table {path}: {where} of enabled replica "
                              f"{snap.id} cannot be inspected: {exc.message}", code=exc.code,
                              attributes=attributes) from None
            columns = {c["name"]: c["type"] for c in info["columns"]}
            for col in schema.columns:
                have = columns.get(col.name)
                if have is None:
                    raise YtError(f"Cannot alter the schema of replicated table {path}: {where} of enabled replica "
                                  f"{snap.id} has no column {col.name!r}; alter the replica tables first (seed 002: "
                                  "a replicated table's schema must be no wider than its replicas')",
                                  code=ErrorCode.SCHEMA_VIOLATION, attributes={**attributes, "column": col.name})
                if have != col.type.value:
                    raise YtError(f"Cannot alter the schema of replicated table {path}: column {col.name!r} of "
                                  f"{where} (replica {snap.id}) has type {have}, expected {col.type.value}",
                                  code=ErrorCode.SCHEMA_VIOLATION, attributes={**attributes, "column": col.name})
