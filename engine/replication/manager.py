"""Replicated tables (seed 002): replicas, sync writes, the async replicator, exactly once.

On the **meta-cluster** a replicated table stores only its replication queue (one per tablet,
``tables.py``). Each ``table_replica`` object names a replica table on some cluster and carries
state (disabled/enabling/enabled/disabling), mode (sync/async) and per-tablet progress
(``current_replication_row_index`` and ``_timestamp``, persisted in ``_rt_replica_progress``).

* **Sync replicas** are participants of every commit: the coordinator prepares them over
  ``/internal/v1/prepare`` (failing within ``DEFAULT_SYNC_TIMEOUT``), appends to the queue and
  advances their progress in the same SQL transaction as its commit decision, then commits them.
* **Async replicas** are fed by a replicator thread per replica: it reads a batch from the queue
  at the replica's progress and pushes it with ``prev_replication_row_index``. The replica applies
  the batch and records ``(upstream_replica_id, tablet) -> row index`` in the *same* SQL
  transaction (``_rt_replica_sink``), and accepts a batch only if its record equals the batch's
  previous index. A retried batch is thus recognised, and delivery is exactly once and in order.

The tricky part is switching async -> sync without a gap or a duplicate. The replica first
*catches up* while still fed asynchronously (writes proceed), then *drains*: writes fail with the
retriable 1732 "sync replica not in sync" while the replicator pushes the last batch, and under the
writer lock the replica flips to *in sync* once the queue tail is fully replicated. Every queue
append re-checks this under the same lock, so no commit can slip between the flip and the tail.

On the **replica cluster** this module answers ``/internal/v1`` calls: prepare/commit/abort of sync
writes, pushes from replicators, and the coordinator's side of in-doubt resolution.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
import yt.yson as yson

from ..errors import ErrorCode, YtError
from ..peers import Peers
from ..replica_types import ReplicaMode, ReplicaState
from ..storage import FastStatement, replica_progress_table, replica_sink_table
from ..tablets import (
    WRITE_KINDS,
    DynamicTable,
    RowWrite,
    WriteKind,
    decode_writes,
    encode_writes,
    tablet_id,
)
from ..timestamps import COUNTER_BITS
from ..transactions import Participant, RemoteParticipant, TabletTransaction, commit_messages

if TYPE_CHECKING:
    from ..cypress import Node
    from ..node import Cluster

log = logging.getLogger("reptables.engine.replication")


# the statements on the latency path of every sync replica commit (storage.FastStatement)
_UPDATE_PROGRESS = FastStatement.update(replica_progress_table, "replica_id", "tablet_index")
_INSERT_PROGRESS = FastStatement.insert(replica_progress_table)
_READ_SINK = FastStatement.select(replica_sink_table, ("row_index", "timestamp"), "upstream_replica_id", "tablet_index")
_UPDATE_SINK = FastStatement.update(replica_sink_table, "upstream_replica_id", "tablet_index")
_INSERT_SINK = FastStatement.insert(replica_sink_table)

#: where a replica object keeps the id of its replicated table (hidden from users)
TABLE_ID_ATTRIBUTE = "_rt_table_id"
#: seed/notes defaults: replicator tick, batch cut, backoff, queue retention
REPLICATOR_TICK = 0.1
BATCH_ROWS = 90_000
BATCH_BYTES = 128 * 1024 * 1024
BATCH_TIMESTAMPS = 10_000
SOFT_BACKOFF = 3.0
HARD_BACKOFF = 60.0
DEFAULT_MIN_REPLICATION_LOG_TTL_MS = 5 * 60 * 1000
#: a replica switching to sync stops catching up and starts draining at this many pending rows
DRAIN_THRESHOLD_ROWS = 1_000
#: extra answer time a sync replica gets per row of a prepare (a 10,000-row batch: +2 s)
PREPARE_SECONDS_PER_ROW = 0.0002
#: how long a coordinator waits for sync replicas to acknowledge a commit before answering the client
COMMIT_ACK_TIMEOUT = 5.0


class SyncPhase(StrEnum):
    CATCHING_UP = "catching_up"
    DRAINING = "draining"
    IN_SYNC = "in_sync"


def _sync_not_in_sync(replica: Replica) -> YtError:
    return YtError(f"Sync replica {replica.id} of table {replica.table_path} on cluster {replica.cluster_name} "
                   "is not in sync yet; retry", code=ErrorCode.SYNC_REPLICA_NOT_IN_SYNC,
                   attributes={"replica_id": replica.id, "path": replica.table_path, "retriable": True})


@dataclass
class TabletProgress:
    row_index: int = 0
    timestamp: int = 0
    error: dict[str, Any] | None = None


@dataclass
class Replica:
    id: str
    node: Node
    table_id: str
    cluster_name: str
    replica_path: str
    mode: ReplicaMode
    state: ReplicaState
    start_replication_timestamp: int
    preserve_timestamps: bool
    atomicity: str
    tracker_enabled: bool
    progress: dict[int, TabletProgress] = field(default_factory=dict)
    phase: SyncPhase | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    backoff_until: float = 0.0
    table_path: str = ""

    def attributes(self) -> dict[str, Any]:
        return {"table_path": self.table_path, "cluster_name": self.cluster_name, "replica_path": self.replica_path,
                "mode": self.mode.value, "state": self.state.value,
                "start_replication_timestamp": self.start_replication_timestamp,
                "preserve_timestamps": self.preserve_timestamps, "atomicity": self.atomicity,
                "enable_replicated_table_tracker": self.tracker_enabled}

    @property
    def writes_synchronously(self) -> bool:
        return self.state is ReplicaState.ENABLED and self.mode is ReplicaMode.SYNC and \
            self.phase is SyncPhase.IN_SYNC


class ReplicationManager:
    """Replica objects and replication on this cluster, as meta-cluster and as replica cluster."""

    def __init__(self, cluster: Cluster, peers: Peers) -> None:
        self.cluster = cluster
        self.peers = peers
        self.replicas: dict[str, Replica] = {}
        self._lock = threading.RLock()
        self._threads: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="replication-rpc")
        self._throttle: dict[tuple[str, int], tuple[float, float]] = {}

    # -- loading and persistence -------------------------------------------------------------------

    def load(self, conn: sa.Connection) -> None:
        progress: dict[str, dict[int, TabletProgress]] = {}
        for row in conn.execute(sa.select(replica_progress_table)):
            progress.setdefault(row.replica_id, {})[row.tablet_index] = TabletProgress(row.row_index, row.timestamp)
        for node in list(self.cluster.cypress.by_id.values()):
            if node.type == "table_replica":
                replica = self._from_node(node)
                replica.progress = progress.get(node.id, {})
                self.replicas[node.id] = replica

    def _from_node(self, node: Node) -> Replica:
        a = node.attributes
        table_node = self.cluster.cypress.by_id.get(a[TABLE_ID_ATTRIBUTE])
        mode = ReplicaMode(a.get("mode", "async"))
        state = ReplicaState(a.get("state", "disabled"))
        return Replica(
            id=node.id, node=node, table_id=a[TABLE_ID_ATTRIBUTE], cluster_name=a["cluster_name"],
            replica_path=a["replica_path"], mode=mode, state=state,
            start_replication_timestamp=int(a.get("start_replication_timestamp", 0)),
            preserve_timestamps=bool(a.get("preserve_timestamps", True)), atomicity=a.get("atomicity", "full"),
            tracker_enabled=bool(a.get("enable_replicated_table_tracker", True)),
            phase=SyncPhase.CATCHING_UP if mode is ReplicaMode.SYNC and state is ReplicaState.ENABLED else None,
            table_path=table_node.path if table_node is not None else a.get("table_path", ""))

    def _save(self, conn: sa.Connection, replica: Replica) -> None:
        replica.node.attributes.update(replica.attributes())
        replica.node.attributes[TABLE_ID_ATTRIBUTE] = replica.table_id
        self.cluster.cypress.save(conn, replica.node)

    @staticmethod
    def _save_progress(conn: sa.Connection, replica_id: str, tablet: int, progress: TabletProgress) -> None:
        updated = _UPDATE_PROGRESS.run(conn, replica_id=replica_id, tablet_index=tablet,
                                       row_index=progress.row_index, timestamp=progress.timestamp)
        if updated.rowcount == 0:
            _INSERT_PROGRESS.run(conn, replica_id=replica_id, tablet_index=tablet, row_index=progress.row_index,
                                 timestamp=progress.timestamp)

    def replicas_of(self, table_id: str) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas.values() if r.table_id == table_id]

    # -- replica objects -------------------------------------------------------------------------------

    def create_replica(self, attrs: dict[str, Any]) -> str:
        from ..cypress import OBJECT_TYPES, Node
        from ..transactions import make_object_id

        table_path = attrs.get("table_path")
        if not isinstance(table_path, str):
            raise YtError("Cannot create table_replica: attribute \"table_path\" is required",
                          code=ErrorCode.INVALID_PARAMETER)
        table, path, table_node = self.cluster._table(table_path)
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
        with self.cluster.storage.write() as conn, self._lock:
            for other in self.replicas_of(table.table_id):
                if other.cluster_name == cluster_name and other.replica_path == replica_path:
                    raise YtError(f"Replica {other.id} of {path} already points to {cluster_name}:{replica_path}",
                                  code=ErrorCode.ALREADY_EXISTS)
            node = Node(id=make_object_id(OBJECT_TYPES["table_replica"]), type="table_replica", name=None,
                        parent=None, attributes={})
            replica = Replica(
                id=node.id, node=node, table_id=table.table_id, cluster_name=cluster_name,
                replica_path=replica_path, mode=ReplicaMode(mode), state=ReplicaState.DISABLED,
                start_replication_timestamp=start_ts,
                preserve_timestamps=bool(attrs.get("preserve_timestamps", True)), atomicity=atomicity,
                tracker_enabled=bool(attrs.get("enable_replicated_table_tracker", True)), table_path=path)
            for key, value in attrs.items():
                if key not in replica.attributes() and key not in ("table_path",):
                    node.attributes[key] = value
            for tablet in range(table.tablet_count):
                # a new replica starts at the oldest change still in the queue
                start = table.tablet_rows.get(tablet, [0, 0])[1]
                replica.progress[tablet] = TabletProgress(start, 0)
                self._save_progress(conn, node.id, tablet, replica.progress[tablet])
            self.cluster.cypress.attach(node)
            self._save(conn, replica)
            self.replicas[node.id] = replica
        log.info("replica created", extra={"replica_id": node.id, "path": path, "cluster": cluster_name,
                                           "replica_path": replica_path})
        return node.id

    def remove_replica(self, conn: sa.Connection, replica_id: str) -> None:
        with self._lock:
            replica = self.replicas.pop(replica_id, None)
        if replica is None:
            return
        conn.execute(replica_progress_table.delete().where(replica_progress_table.c.replica_id == replica_id))

    def replica(self, replica_id: str) -> Replica:
        with self._lock:
            replica = self.replicas.get(replica_id.lstrip("#"))
        if replica is None:
            raise YtError(f"No such table replica {replica_id}", code=ErrorCode.RESOLVE_ERROR, http_status=404,
                          attributes={"replica_id": replica_id})
        return replica

    def alter_replica(self, replica_id: str, enabled: bool | None, mode: str | None) -> None:
        replica = self.replica(replica_id)
        if mode is not None and mode not in ("sync", "async"):
            raise YtError(f"Invalid replica mode {mode!r}: expected sync or async", code=ErrorCode.INVALID_PARAMETER)
        if mode == "sync" and not replica.preserve_timestamps:
            raise YtError(f"Replica {replica.id} has preserve_timestamps=%false and can only be asynchronous",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"replica_id": replica.id})
        if enabled is True and replica.state is not ReplicaState.ENABLED:
            self._set_state(replica, ReplicaState.ENABLING)
            try:
                self._check_replica_table(replica)
            except YtError:
                self._set_state(replica, ReplicaState.DISABLED)
                raise
            replica.errors.clear()
            replica.backoff_until = 0.0
            replica.phase = SyncPhase.CATCHING_UP if replica.mode is ReplicaMode.SYNC else None
            self._set_state(replica, ReplicaState.ENABLED)
        elif enabled is False and replica.state is not ReplicaState.DISABLED:
            self._set_state(replica, ReplicaState.DISABLING)
            # the replicator finishes its batch in flight and stops
            thread = self._threads.get(replica.id)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=30)
            replica.phase = None
            self._set_state(replica, ReplicaState.DISABLED)
        if mode is not None and ReplicaMode(mode) is not replica.mode:
            # lock order (docs/architecture.md): the storage writer lock, then the replica registry's
            with self.cluster.storage.write() as conn, self._lock:
                replica.mode = ReplicaMode(mode)
                replica.phase = SyncPhase.CATCHING_UP if replica.mode is ReplicaMode.SYNC else None
                self._save(conn, replica)
        log.info("replica altered", extra={"replica_id": replica.id, "path": replica.table_path,
                                           "state": replica.state.value, "mode": replica.mode.value})
        self._wake.set()

    def _set_state(self, replica: Replica, state: ReplicaState) -> None:
        with self.cluster.storage.write() as conn, self._lock:
            replica.state = state
            self._save(conn, replica)

    def _check_replica_table(self, replica: Replica) -> None:
        """Seed 002: a replica table must be at least as wide, with the same key, of the same kind."""
        table_node = self.cluster.cypress.by_id[replica.table_id]
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
        expected = replica.id if replica.preserve_timestamps else None
        if info.get("upstream_replica_id") != expected:
            raise YtError(f"Cannot enable replica {replica.id}: {where} has upstream_replica_id "
                          f"{info.get('upstream_replica_id')!r}, expected {expected!r}",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH)

    # -- the write path (meta-cluster) ------------------------------------------------------------

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]:
        out: list[RemoteParticipant] = []
        pending: list[Replica] = []
        for replica in self.replicas_of(part.table.table_id):
            if replica.state is not ReplicaState.ENABLED or replica.mode is not ReplicaMode.SYNC:
                continue
            if replica.phase is SyncPhase.DRAINING:
                raise _sync_not_in_sync(replica)
            if replica.phase is SyncPhase.CATCHING_UP:
                pending.append(replica)
                continue
            out.append(RemoteParticipant(cluster=replica.cluster_name, replica_id=replica.id,
                                         replica_path=replica.replica_path, tablet_index=part.tablet_index,
                                         meta_table_id=part.table.table_id, writes=part.writes))
        if not out and require_sync_replica:
            if pending:
                raise _sync_not_in_sync(pending[0])
            raise YtError(f"Table {part.path} has no synchronous replicas", code=ErrorCode.NO_SYNC_REPLICAS,
                          attributes={"path": part.path})
        return out

    def prepare_remote(self, tx: TabletTransaction, remote: list[RemoteParticipant],
                       prepare_ts: int) -> list[RemoteParticipant]:
        def prepare(rp: RemoteParticipant) -> None:
            # an answer may take longer for a big batch; connecting never waits past the sync timeout
            timeout = self.peers.timeout + len(rp.writes) * PREPARE_SECONDS_PER_ROW
            self.peers.client(rp.cluster).call("prepare", timeout=timeout, body={
                "transaction_id": tx.id, "coordinator": self.cluster.name, "replica_id": rp.replica_id,
                "replica_path": rp.replica_path, "tablet_index": rp.tablet_index,
                "start_timestamp": tx.start_timestamp, "prepare_timestamp": prepare_ts,
                **encode_writes(rp.writes)})

        if len(remote) == 1:
            # one sync replica: no thread hand-off on the latency path
            try:
                prepare(remote[0])
            except YtError as exc:
                self.abort_remote(tx.id, remote)
                raise YtError(f"Cannot write to sync replica {remote[0].replica_id} "
                              f"({remote[0].cluster}:{remote[0].replica_path}): {exc.message}", code=exc.code,
                              attributes={"replica_id": remote[0].replica_id, "cluster_name": remote[0].cluster},
                              inner_errors=[exc]) from None
            return list(remote)
        futures = [(rp, self._pool.submit(prepare, rp)) for rp in remote]
        prepared: list[RemoteParticipant] = []
        failure: YtError | None = None
        for rp, future in futures:
            try:
                future.result(timeout=self.peers.timeout * 3 + len(rp.writes) * PREPARE_SECONDS_PER_ROW)
                prepared.append(rp)
            except YtError as exc:
                failure = failure or YtError(
                    f"Cannot write to sync replica {rp.replica_id} ({rp.cluster}:{rp.replica_path}): {exc.message}",
                    code=exc.code, attributes={"replica_id": rp.replica_id, "cluster_name": rp.cluster},
                    inner_errors=[exc])
            except Exception as exc:  # noqa: BLE001 - a timeout or a bug must still abort the commit
                failure = failure or YtError(f"Cannot write to sync replica {rp.replica_id} on cluster "
                                             f"{rp.cluster}: {type(exc).__name__}: {exc}",
                                             code=ErrorCode.UNAVAILABLE)
        if failure is not None:
            # every participant is told, also those that did not answer: a late prepare is refused
            self.abort_remote(tx.id, remote)
            raise failure
        return prepared

    def abort_remote(self, tx_id: str, remote: list[RemoteParticipant]) -> None:
        for rp in remote:
            self._pool.submit(self._call_quietly, rp.cluster, "abort", {"transaction_id": tx_id})

    def _call_quietly(self, cluster: str, method: str, body: dict[str, Any]) -> bool:
        try:
            self.peers.client(cluster).call(method, body)
            return True
        except YtError as exc:
            log.warning("peer call failed", extra={"cluster": cluster, "method": method, "error": exc.message})
            return False

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> None:
        """Inside the commit's SQL transaction: advance sync replicas, re-check the sync set."""
        table = part.table
        end = table.tablet_rows[part.tablet_index][0]
        start = end - sum(1 for w in part.writes if w.kind is not WriteKind.LOCK)
        mine = {rp.replica_id: rp for rp in remote
                if rp.meta_table_id == table.table_id and rp.tablet_index == part.tablet_index}
        for replica in self.replicas_of(table.table_id):
            rp = mine.get(replica.id)
            if rp is None:
                if replica.writes_synchronously:
                    # the replica turned in sync after this commit chose its participants
                    raise _sync_not_in_sync(replica)
                continue
            progress = replica.progress.setdefault(part.tablet_index, TabletProgress())
            if progress.row_index != start or not replica.writes_synchronously:
                raise _sync_not_in_sync(replica)
            progress.row_index = end
            progress.timestamp = max(progress.timestamp, commit_ts)
            rp.row_index = end
            self._save_progress(conn, replica.id, part.tablet_index, progress)

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None:
        """Tell the sync replicas a durable decision, in the background.

        The commit is acknowledged to the client as soon as the decision record is durable, as a
        coordinator's commit is: the replicas hold the prepared rows (their reads wait for them, see
        ``TransactionManager.wait_prepared_writes``) until the message arrives; one that does not
        get it is sent it again by :meth:`deliver_decisions`, or asks (``resolve_in_doubt``)."""
        messages = commit_messages(tx_id, commit_ts, remote)

        def deliver() -> None:
            remaining = [m for m in messages if not self._call_quietly(m["cluster"], "commit", m)]
            try:
                self.cluster.transactions.forget_decision(tx_id, remaining)
            except Exception:  # noqa: BLE001 - a decision not forgotten is only delivered again
                log.exception("cannot record delivered commit", extra={"transaction_id": tx_id})

        try:
            self._pool.submit(deliver)
        except RuntimeError:
            pass  # shutting down: the decision record stays and is delivered after the restart

    def deliver_decisions(self) -> None:
        """Background: resend commits that sync replicas have not acknowledged yet."""
        for tx_id, _ts, pending in self.cluster.transactions.undelivered_decisions():
            remaining = [m for m in pending if not self._call_quietly(m["cluster"], "commit", m)]
            if len(remaining) != len(pending):
                self.cluster.transactions.forget_decision(tx_id, remaining)

    def resolve_in_doubt(self, older_than: float = 1.0) -> None:
        """Background (replica side): ask coordinators about transactions prepared here.

        Asking about a transaction still running is harmless (the answer is "in_progress"), so
        every prepare older than a second is asked about on every pass.
        """
        for tx_id, coordinator in self.cluster.transactions.pending_participants(older_than):
            try:
                status = self.peers.client(coordinator).call("transaction_status", {"transaction_id": tx_id})
            except YtError:
                continue
            if status["state"] == "committed":
                mine = [m for m in status.get("participants", []) if m.get("cluster") == self.cluster.name]
                for message in mine or [{"transaction_id": tx_id, "commit_timestamp": status["commit_timestamp"]}]:
                    self.handle_commit(message)
            elif status["state"] == "aborted":
                self.cluster.transactions.abort_participant(tx_id)

    # -- the replica side ---------------------------------------------------------------------------

    def _replica_table(self, path: str, replica_id: str, preserve: bool = True) -> tuple[DynamicTable, str]:
        table, table_path, _ = self.cluster._table(path)
        expected = replica_id if preserve else None
        if table.upstream_replica_id != expected:
            raise YtError(f"Table {table_path} does not accept writes of replica {replica_id}: its "
                          f"upstream_replica_id is {table.upstream_replica_id!r}",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH, attributes={"path": table_path})
        return table, table_path

    def table_info(self, path: str) -> dict[str, Any]:
        table, _, _ = self.cluster._table(path)
        return {"sorted": table.sorted, "key_columns": table.schema.key_names,
                "columns": [{"name": c.name, "type": c.type.value} for c in table.schema.columns],
                "upstream_replica_id": table.upstream_replica_id, "tablet_state": table.state.value}

    def prepare_may_wait(self, body: dict[str, Any]) -> bool:
        """Whether a prepare may wait for the decision on an earlier transaction (which arrives as
        another request: such a prepare must not hold the event loop)."""
        try:
            table, _, _ = self.cluster._table(body.get("replica_path"))
        except YtError:
            return False
        return self.cluster.transactions.has_remote_prepared(table.table_id)

    def handle_prepare(self, body: dict[str, Any]) -> None:
        table, path = self._replica_table(body["replica_path"], body["replica_id"])
        writes = decode_writes(body)
        if table.sorted:
            # this table's lock groups, not the meta's
            full_mask, write_kind = table.schema.full_lock_mask, WriteKind.WRITE
            for w in writes:
                w.mask = (table.schema.lock_mask(list(w.row)) if w.update else full_mask) \
                    if w.kind is write_kind else 1
        self.cluster.transactions.prepare_participant(
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
                self._advance_sink(conn, extra["upstream_replica_id"], extra["meta_tablet_index"], row_index,
                                   int(extra["commit_timestamp"]))

        self.cluster.transactions.commit_participant(body["transaction_id"], int(body["commit_timestamp"]), advance)

    def handle_abort(self, body: dict[str, Any]) -> None:
        self.cluster.transactions.abort_participant(body["transaction_id"])

    @staticmethod
    def _read_sink(conn: sa.Connection, replica_id: str, tablet: int) -> tuple[int, int] | None:
        row = _READ_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet).fetchone()
        return None if row is None else (row[0], row[1])

    def _advance_sink(self, conn: sa.Connection, replica_id: str, tablet: int, row_index: int, ts: int) -> None:
        current = self._read_sink(conn, replica_id, tablet)
        if current is None:
            _INSERT_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet, row_index=row_index,
                             timestamp=ts)
        elif row_index > current[0] or ts > current[1]:
            _UPDATE_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet,
                             row_index=max(row_index, current[0]), timestamp=max(ts, current[1]))

    def handle_push(self, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one replicator batch exactly once; answer with the stored progress."""
        replica_id = body["upstream_replica_id"]
        preserve = bool(body.get("preserve_timestamps", True))
        table, _ = self._replica_table(body["replica_path"], replica_id, preserve)
        tablet = int(body["tablet_index"])
        prev, end = int(body["prev_row_index"]), int(body["row_index"])
        groups: list[tuple[int, list[RowWrite]]] = []
        full_mask = table.schema.full_lock_mask if table.sorted else 1
        kinds = WRITE_KINDS
        write_kind = WriteKind.WRITE
        last_ts, group = None, None
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
        return self.cluster.transactions.apply_replicated(
            table, groups, preserve, tablet % table.tablet_count,
            check=lambda conn: self._read_sink(conn, replica_id, tablet),
            expected=prev,
            record=lambda conn, last_ts: self._advance_sink(conn, replica_id, tablet, end, last_ts),
            end=end)

    # -- the replicator (meta side) ---------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=self._supervise, name="replication-supervisor", daemon=True)
        thread.start()
        self._threads["supervisor"] = thread

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in list(self._threads.values()):
            thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _supervise(self) -> None:
        last_maintenance = 0.0
        while not self._stop.is_set():
            with self._lock:
                wanted = [r.id for r in self.replicas.values() if r.state is ReplicaState.ENABLED]
            for replica_id in wanted:
                thread = self._threads.get(replica_id)
                if thread is None or not thread.is_alive():
                    thread = threading.Thread(target=self._replicate_loop, args=(replica_id,),
                                              name=f"replicator-{replica_id}", daemon=True)
                    self._threads[replica_id] = thread
                    thread.start()
            if time.monotonic() - last_maintenance > 1.0:
                last_maintenance = time.monotonic()
                for job in (self.deliver_decisions, self.resolve_in_doubt, self.trim_queues):
                    try:
                        job()
                    except Exception:  # noqa: BLE001 - maintenance must keep running
                        log.exception("replication maintenance failed", extra={"job": job.__name__})
            self._stop.wait(0.5)

    def _replicate_loop(self, replica_id: str) -> None:
        while not self._stop.is_set():
            with self._lock:
                replica = self.replicas.get(replica_id)
            if replica is None or replica.state is not ReplicaState.ENABLED:
                return
            busy = False
            if time.monotonic() >= replica.backoff_until:
                try:
                    busy = self._replicate_once(replica)
                except Exception as exc:  # noqa: BLE001 - any failure is recorded and backed off
                    log.exception("replicator failed", extra={"replica_id": replica.id})
                    self._record_error(replica, None, YtError(f"Replicator failed: {exc}"), SOFT_BACKOFF)
            if not busy:
                self._wake.wait(REPLICATOR_TICK)
                self._wake.clear()

    def _record_error(self, replica: Replica, tablet: int | None, error: YtError, backoff: float) -> None:
        entry = {"code": error.code, "message": error.message, "attributes": error.attributes}
        replica.errors = [entry]
        if tablet is not None:
            replica.progress.setdefault(tablet, TabletProgress()).error = entry
        replica.backoff_until = time.monotonic() + backoff
        log.warning("replication error", extra={"replica_id": replica.id, "path": replica.table_path,
                                                "cluster": replica.cluster_name, "tablet": tablet,
                                                "error": error.message})

    def _table_of(self, replica: Replica) -> DynamicTable | None:
        node = self.cluster.cypress.by_id.get(replica.table_id)
        return node.table if node is not None else None

    def _replicate_once(self, replica: Replica) -> bool:
        """Push at most one batch per tablet; returns True when more work is waiting."""
        table = self._table_of(replica)
        if table is None:
            return False
        if replica.writes_synchronously:
            return False
        busy = False
        for tablet in range(table.tablet_count):
            busy |= self._push_tablet(replica, table, tablet)
        if replica.mode is ReplicaMode.SYNC and replica.phase is not SyncPhase.IN_SYNC:
            self._advance_sync_phase(replica, table)
        if not busy and not replica.errors:
            replica.backoff_until = 0.0
        return busy

    def _push_tablet(self, replica: Replica, table: DynamicTable, tablet: int) -> bool:
        progress = replica.progress.setdefault(tablet, TabletProgress())
        queue_end = table.tablet_rows.get(tablet, [0, 0])[0]
        if progress.row_index >= queue_end:
            progress.error = None
            self._barrier(replica, table, tablet, progress)
            return False
        if not self._throttle_allows(replica, table, tablet):
            return False
        with self.cluster.storage.read() as conn:
            entries = table.read_queue(conn, tablet, progress.row_index, BATCH_ROWS)
        batch, size, stamps = [], 0, set()
        for entry in entries:
            if batch and (size + len(entry.payload) > BATCH_BYTES or
                          (entry.timestamp not in stamps and len(stamps) >= BATCH_TIMESTAMPS)):
                break
            batch.append(entry)
            size += len(entry.payload)
            stamps.add(entry.timestamp)
        if not batch:
            return False
        end = batch[-1].row_index + 1
        header = json.dumps({"upstream_replica_id": replica.id, "replica_path": replica.replica_path,
                             "tablet_index": tablet, "prev_row_index": progress.row_index, "row_index": end,
                             "preserve_timestamps": replica.preserve_timestamps})
        # queue payloads are JSON already: splice them in instead of encoding JSON inside JSON
        entries = ",".join(f'{{"timestamp":{e.timestamp},"kind":"{e.kind}","payload":{e.payload}}}'
                           for e in batch if e.timestamp > replica.start_replication_timestamp)
        body = f'{header[:-1]},"entries":[{entries}]}}'.encode()
        try:
            answer = self.peers.client(replica.cluster_name).call("push", raw_body=body, timeout=60.0)
        except YtError as exc:
            self._record_error(replica, tablet, exc, SOFT_BACKOFF)
            return False
        stored = int(answer["row_index"])
        if stored < progress.row_index:
            # the replica still misses sync commits in flight to it: wait for them
            self._record_error(replica, tablet, YtError(
                f"Replica {replica.id} is behind: it has row {stored}, the batch starts at {progress.row_index}"),
                REPLICATOR_TICK * 5)
            return False
        new_progress = TabletProgress(stored, batch[-1].timestamp if stored == end else progress.timestamp)
        if stored != end and stored > progress.row_index:
            with self.cluster.storage.read() as conn:
                ts = table.first_timestamp_from(conn, tablet, stored - 1)
            new_progress.timestamp = max(progress.timestamp, ts or 0)
        with self.cluster.storage.write() as conn:
            self._save_progress(conn, replica.id, tablet, new_progress)
        replica.progress[tablet] = new_progress
        self._account_throttle(replica, table, tablet, size)
        replica.errors = []
        return new_progress.row_index < table.tablet_rows.get(tablet, [0, 0])[0]

    def _barrier(self, replica: Replica, table: DynamicTable, tablet: int, progress: TabletProgress) -> None:
        """An idle, caught-up tablet's replication timestamp moves on with time (at most once a second).

        Without it a replica whose tablet saw no writes for an hour would look an hour behind the
        moment a new row arrives. The barrier is a fresh timestamp below which every commit is
        applied, taken only while the replica has every queued row.
        """
        if time.time() - (progress.timestamp >> COUNTER_BITS) < 1.0:
            return
        barrier = self.cluster.timestamps.generate()
        self.cluster.transactions.wait_visible(barrier)
        if progress.row_index >= table.tablet_rows.get(tablet, [0, 0])[0]:
            progress.timestamp = max(progress.timestamp, barrier)

    def _throttle_allows(self, replica: Replica, table: DynamicTable, tablet: int) -> bool:
        budget = self._throttle.get((replica.id, tablet))
        return budget is None or time.monotonic() >= budget[0]

    def _account_throttle(self, replica: Replica, table: DynamicTable, tablet: int, size: int) -> None:
        node = self.cluster.cypress.by_id.get(table.table_id)
        options = (node.attributes.get("replication_throttler") if node is not None else None) or {}
        limit, period = options.get("limit"), options.get("period", 1000)
        if not limit:
            return
        # the batch used size bytes of a budget of `limit` bytes per `period` ms: wait accordingly
        delay = size / float(limit) * (float(period) / 1000.0)
        self._throttle[(replica.id, tablet)] = (time.monotonic() + delay, float(size))

    def _advance_sync_phase(self, replica: Replica, table: DynamicTable) -> None:
        pending = sum(max(0, table.tablet_rows.get(t, [0, 0])[0] - replica.progress.get(t, TabletProgress()).row_index)
                      for t in range(table.tablet_count))
        if replica.phase is SyncPhase.CATCHING_UP and pending <= DRAIN_THRESHOLD_ROWS:
            replica.phase = SyncPhase.DRAINING
        if replica.phase is SyncPhase.DRAINING:
            with self.cluster.storage.write_lock:
                drained = all(replica.progress.get(t, TabletProgress()).row_index >=
                              table.tablet_rows.get(t, [0, 0])[0] for t in range(table.tablet_count))
                if drained and replica.mode is ReplicaMode.SYNC and replica.state is ReplicaState.ENABLED:
                    replica.phase = SyncPhase.IN_SYNC
                    log.info("sync replica in sync", extra={"replica_id": replica.id, "path": replica.table_path})

    def trim_queues(self) -> None:
        """Drop queue rows every replica has, once older than min_replication_log_ttl."""
        for node in list(self.cluster.cypress.by_id.values()):
            table = node.table
            if table is None or not table.replicated:
                continue
            replicas = self.replicas_of(table.table_id)
            ttl_ms = int(node.attributes.get("min_replication_log_ttl", DEFAULT_MIN_REPLICATION_LOG_TTL_MS))
            horizon = self.cluster.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
            for tablet in range(table.tablet_count):
                rows, trimmed = table.tablet_rows.get(tablet, [0, 0])
                floor = min((r.progress.get(tablet, TabletProgress()).row_index for r in replicas), default=rows)
                if floor > trimmed:
                    with self.cluster.storage.write() as conn:
                        table.trim_queue(conn, tablet, floor, horizon)

    # -- reads and status ------------------------------------------------------------------------------

    def in_sync_read_replica(self, table: DynamicTable, path: str) -> Replica:
        for replica in self.replicas_of(table.table_id):
            if replica.writes_synchronously:
                return replica
        raise YtError(f"No in-sync replicas found for table {path}", code=ErrorCode.NO_IN_SYNC_REPLICAS,
                      attributes={"path": path})

    def in_sync_replicas(self, table: DynamicTable, timestamp: int) -> list[str]:
        out = []
        with self.cluster.storage.read() as conn:
            for replica in self.replicas_of(table.table_id):
                if replica.state is not ReplicaState.ENABLED:
                    continue
                if replica.mode is ReplicaMode.SYNC:
                    # a sync replica still catching up is not in sync, whatever it has already
                    if replica.writes_synchronously:
                        out.append(replica.id)
                    continue
                ok = True
                for tablet in range(table.tablet_count):
                    progress = replica.progress.get(tablet, TabletProgress())
                    if progress.row_index >= table.tablet_rows.get(tablet, [0, 0])[0]:
                        continue
                    first = table.first_timestamp_from(conn, tablet, progress.row_index)
                    if first is not None and first <= timestamp:
                        ok = False
                        break
                if ok:
                    out.append(replica.id)
        return out

    def tablet_lag_ms(self, replica: Replica, table: DynamicTable, tablet: int, conn: sa.Connection) -> int:
        if replica.mode is ReplicaMode.SYNC and replica.writes_synchronously:
            return 0
        progress = replica.progress.get(tablet, TabletProgress())
        end = table.tablet_rows.get(tablet, [0, 0])[0]
        if progress.row_index >= end:
            return 0
        # rows are waiting: the replica is as old as its replication timestamp (advanced by a barrier
        # while idle), so a stuck replica's lag keeps growing, as in YT
        since = progress.timestamp or table.first_timestamp_from(conn, tablet, progress.row_index) or 0
        now = time.time()
        return max(0, int((now - (since >> COUNTER_BITS)) * 1000)) if since else 0

    def describe(self, replica: Replica, with_tablets: bool = True) -> dict[str, Any]:
        table = self._table_of(replica)
        attrs = replica.attributes()
        attrs["replicated_table_tracker_enabled"] = replica.tracker_enabled
        attrs["errors"] = list(replica.errors)
        tablets = []
        lag = 0
        if table is not None:
            with self.cluster.storage.read() as conn:
                for t in range(table.tablet_count):
                    progress = replica.progress.get(t, TabletProgress())
                    rows, trimmed = table.tablet_rows.get(t, [0, 0])
                    tablet_lag = self.tablet_lag_ms(replica, table, t, conn)
                    lag = max(lag, tablet_lag)
                    tablet: dict[str, Any] = {
                        "tablet_id": tablet_id(table.table_id, t), "state": replica.state.value,
                        "current_replication_row_index": progress.row_index,
                        "current_replication_timestamp": yson.YsonUint64(progress.timestamp),
                        "replication_lag_time": tablet_lag, "flushed_row_count": rows, "trimmed_row_count": trimmed}
                    if progress.error is not None:
                        # seed 002: "If there is no error, this tag will also be missing"
                        tablet["replication_error"] = progress.error
                    tablets.append(tablet)
        attrs["replication_lag_time"] = lag
        if with_tablets:
            attrs["tablets"] = tablets
        return attrs

    def replicas_attribute(self, table_id: str) -> dict[str, Any]:
        out = {}
        for replica in self.replicas_of(table_id):
            full = self.describe(replica, with_tablets=False)
            out[replica.id] = {k: full[k] for k in (
                "cluster_name", "replica_path", "state", "mode", "replication_lag_time", "errors",
                "preserve_timestamps", "atomicity", "replicated_table_tracker_enabled")}
        return out


_OPTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "enable_replicated_table_tracker": bool, "min_sync_replica_count": int, "max_sync_replica_count": int,
    "preferred_sync_replica_clusters": list, "sync_replica_lag_threshold": int,
}


def validate_replicated_table_options(options: Any, path: str) -> None:
    """``replicated_table_options`` with the names and rules of YT's tracker (see notes/tracker.md)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise YtError(f"replicated_table_options of {path} must be a map", code=ErrorCode.INVALID_PARAMETER)
    for key, value in options.items():
        expected = _OPTION_TYPES.get(key)
        if expected is None:
            raise YtError(f"Unknown replicated_table_options field {key!r} for table {path}; known: "
                          f"{', '.join(sorted(_OPTION_TYPES))}", code=ErrorCode.INVALID_PARAMETER)
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            raise YtError(f"replicated_table_options/{key} of {path} must be of type {expected.__name__}",
                          code=ErrorCode.INVALID_PARAMETER)
        if expected is int and value < 0:
            raise YtError(f"replicated_table_options/{key} of {path} must be >= 0", code=ErrorCode.INVALID_PARAMETER)
    clusters = options.get("preferred_sync_replica_clusters", [])
    if not all(isinstance(c, str) for c in clusters):
        raise YtError(f"replicated_table_options/preferred_sync_replica_clusters of {path} must be a list of "
                      "cluster names", code=ErrorCode.INVALID_PARAMETER)
    low, high = options.get("min_sync_replica_count"), options.get("max_sync_replica_count")
    if low is not None and high is not None and low > high:
        raise YtError(f"replicated_table_options of {path}: min_sync_replica_count ({low}) must not exceed "
                      f"max_sync_replica_count ({high})", code=ErrorCode.INVALID_PARAMETER)


def validate_throttler(throttler: Any, path: str) -> None:
    """``replication_throttler`` is ``{period=<ms>; limit=<bytes per period>}``."""
    if throttler is None:
        return
    if not isinstance(throttler, dict) or set(throttler) - {"period", "limit"}:
        raise YtError(f"replication_throttler of {path} must be a map {{period; limit}}",
                      code=ErrorCode.INVALID_PARAMETER)
    for key in ("period", "limit"):
        value = throttler.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise YtError(f"replication_throttler/{key} of {path} must be a positive integer",
                          code=ErrorCode.INVALID_PARAMETER)
