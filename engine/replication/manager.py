"""Replicated tables (seed 002): the facade the rest of the engine calls.

On the **meta-cluster** a replicated table stores only its replication queue (one per tablet,
``tablets``). Each ``table_replica`` object names a replica table on some cluster and carries
state (disabled/enabling/enabled/disabling), mode (sync/async) and per-tablet progress
(``current_replication_row_index`` and ``_timestamp``, persisted in ``_rt_replica_progress``).

* **Sync replicas** are participants of every commit (``sync.py``): the coordinator prepares them
  over ``/internal/v1/prepare``, appends to the queue and advances their progress in the same SQL
  transaction as its commit decision, then commits them.
* **Async replicas** are fed by a replicator per replica (``replicator.py``), whose passes a pool
  of a few worker threads runs when a commit, a backoff's end or ``alter_table_replica`` makes them
  due (``scheduler.py``): a pass pushes a batch from the queue at the replica's progress with the
  row index it starts at; the replica (``sink.py``) applies it and records the new index in the
  same SQL transaction, so delivery is exactly once and in order. Idle tablets' heartbeats (the
  replica tables' freshness) go out for many replicas at once (``heartbeats.py``).
* Switching async -> sync goes catching up -> draining -> in sync (``replicator.py``), the last
  step under the storage writer lock so that no commit slips between.
* ``alter_table_replica`` returns at once: the replica is ``enabling`` until its replicator has
  made a first pass over every tablet (a sync replica: until it starts draining), ``disabling``
  until its replicator has stopped; the replicators' passes end both (``replicator.py``).

The pieces, each with one job: ``registry.py`` owns the set of replicas and their persistence,
``replica.py`` a replica's mutable state and its transitions, ``status.py`` reads it for
attributes, ``options.py`` validates table options, ``trim.py`` trims the queues. This class builds them over a
``ReplicationHost`` (the engine, without knowing ``Cluster``) and keeps the methods the node, the
API and the transaction manager call. The lock order is documented in ``registry.py``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG, EngineConfig
from ..metrics import StateSamples
from ..peers import Peers
from ..storage import on_commit
from ..tablets import DynamicTable, RowWrite
from ..transactions import Participant, RemoteParticipant, TabletTransaction
from .bootstrap import bootstrap_progress, handle_bootstrap_write
from .host import ReplicationHost
from .registry import ReplicaRegistry
from .replica import Replica
from .scheduler import ReplicatorPool
from .sink import ReplicaSink, replica_freshness
from .status import ReplicationStatus
from .sync import SyncCommits
from .trim import QueueTrimmer


class ReplicationManager:
    """Replica objects and replication on this cluster, as meta-cluster and as replica cluster."""

    def __init__(self, host: ReplicationHost, peers: Peers, config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.host = host
        self.peers = peers
        self.config = config
        self.registry = ReplicaRegistry(host, peers)
        self.sink = ReplicaSink(host, peers, config)
        self.sync = SyncCommits(host, peers, self.registry, self.sink, config)
        self.status = ReplicationStatus(host, self.registry)
        self.trimmer = QueueTrimmer(host, self.registry, config)
        self.replicators = ReplicatorPool(host, peers, self.registry, config, maintenance=(
            self.sync.deliver_decisions, self.sync.resolve_in_doubt, self.trim_queues))
        # lag, rows behind, queue depth, in-doubt count: read at scrape time (engine/metrics.py)
        host.transactions.metrics.register_state(self.metric_samples)

    # -- life cycle --------------------------------------------------------------------------------

    def load(self, conn: sa.Connection) -> None:
        self.registry.load(conn)

    def start(self) -> None:
        self.replicators.start()

    def close(self) -> None:
        self.replicators.close()
        self.sync.close()

    # -- replica objects (node layer) -------------------------------------------------------------------

    def create_replica(self, attrs: dict[str, Any]) -> str:
        return self.registry.create(attrs)

    def remove_replica(self, conn: sa.Connection, replica_id: str) -> None:
        self.registry.remove(conn, replica_id)
        self.replicators.forget(replica_id)

    def replica(self, replica_id: str) -> Replica:
        return self.registry.get(replica_id)

    def replicas_of(self, table_id: str) -> list[Replica]:
        return self.registry.replicas_of(table_id)

    def alter_replica(self, replica_id: str, enabled: bool | None, mode: str | None) -> None:
        """Returns at once; the replicator's next pass, due now, ends ``enabling``/``disabling``
        (``replicator.py``)."""
        self.registry.alter(replica_id, enabled, mode)
        self.replicators.wake(replica_id)

    # -- the write path (transactions.CommitHooks) --------------------------------------------------

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]:
        return self.sync.sync_participants(part, require_sync_replica)

    def prepare_remote(self, tx: TabletTransaction, remote: list[RemoteParticipant],
                       prepare_ts: int) -> list[RemoteParticipant]:
        return self.sync.prepare_remote(tx, remote, prepare_ts)

    def abort_remote(self, tx_id: str, remote: list[RemoteParticipant]) -> None:
        self.sync.abort_remote(tx_id, remote)

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> None:
        fed, synced = self.sync.after_queue_append(conn, part, commit_ts, remote)
        if fed or synced:
            # once durable (after the queue's own hook published the rows): their replicators are due
            on_commit(conn, lambda: self.replicators.appended(fed, synced))

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None:
        self.sync.commit_remote(tx_id, commit_ts, remote)

    # -- background jobs ---------------------------------------------------------------------------

    def deliver_decisions(self) -> None:
        self.sync.deliver_decisions()

    def resolve_in_doubt(self, older_than: float = 1.0) -> None:
        self.sync.resolve_in_doubt(older_than)

    def trim_queues(self) -> None:
        self.trimmer.trim_queues()

    # -- the replica side (/internal/v1) -----------------------------------------------------------

    def check_peer_writes(self, table: DynamicTable, path: str, writes: list[RowWrite], what: str) -> None:
        """Rows a peer sends, checked as a client's (``ReplicaSink.check_writes``; XDCR uses it too)."""
        self.sink.check_writes(table, path, writes, what)

    def table_info(self, path: Any, caller: str | None) -> dict[str, Any]:
        return self.sink.table_info(path, caller)

    def prepare_may_wait(self, body: dict[str, Any]) -> bool:
        return self.sink.prepare_may_wait(body)

    # ``caller``: the cluster a peer credential names (engine/credentials.py); None in process
    def handle_prepare(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.sink.handle_prepare(body, caller)

    def handle_commit(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.sink.handle_commit(body, caller)

    def handle_abort(self, body: dict[str, Any], caller: str | None) -> None:
        self.sink.handle_abort(body, caller)

    def handle_push(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.sink.handle_push(body, caller)

    def handle_bootstrap_write(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return handle_bootstrap_write(self.sink, body, caller)

    # -- reads and status ----------------------------------------------------------------------------

    def in_sync_read_replica(self, table: DynamicTable, path: str) -> Replica:
        return self.status.in_sync_read_replica(table, path)

    def in_sync_replicas(self, table: DynamicTable, timestamp: int) -> list[str]:
        return self.status.in_sync_replicas(table, timestamp)

    def tablet_lag_ms(self, replica: Replica, table: DynamicTable, tablet: int, conn: sa.Connection) -> int:
        return self.status.tablet_lag_ms(replica.snapshot(), table, tablet, conn)

    def describe(self, replica: Replica, with_tablets: bool = True) -> dict[str, Any]:
        return self.status.describe(replica, with_tablets)

    def replicas_attribute(self, table_id: str) -> dict[str, Any]:
        return self.status.replicas_attribute(table_id)

    def metric_samples(self) -> StateSamples:
        """The state figures of ``/metrics``: replication (``status.py``) and the in-doubt count."""
        samples = self.status.metric_samples()
        samples.in_doubt = len({tx for tx, _ in self.host.transactions.pending_participants(1.0)})
        return samples

    def replica_freshness(self, table: DynamicTable) -> int | None:
        """A replica table's freshness (``sink.replica_freshness``); None for other tables. A read of
        it is what keeps the meta-cluster's heartbeats coming at the short interval (``heartbeats.py``)."""
        if not table.upstream_replica_id:
            return None
        self.sink.freshness_read(table.upstream_replica_id)
        with self.host.storage.read() as conn:
            return replica_freshness(conn, table.upstream_replica_id)

    def bootstrap_progress(self, replica_id: str) -> dict[str, int] | None:
        """A replica table's ``@bootstrap_progress`` on this cluster (``bootstrap.bootstrap_progress``)."""
        with self.host.storage.read() as conn:
            return bootstrap_progress(conn, replica_id)
