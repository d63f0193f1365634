"""Sync replicas in the commit path (meta-cluster side) and in-doubt resolution (replica side).

A sync replica is a participant of every commit to its table. The transaction manager calls the
hooks here (``transactions.CommitHooks``) at fixed points of its two-phase commit:

* ``sync_participants`` (no lock held): which replicas must be prepared; a replica that is
  catching up or draining refuses the write with the retriable 1732 instead of being skipped;
* ``prepare_remote`` / ``abort_remote``: the network calls, in parallel, never under a lock;
* ``after_queue_append`` (under the storage writer, inside the commit's SQL transaction): the
  sync replicas' progress moves to the new queue end, in the same transaction as the queue rows
  and the decision record, and the sync set is checked again so that a replica that turned in
  sync after the participants were chosen fails the commit rather than missing it;
* ``commit_remote``: the decision, delivered in the background once durable.

``deliver_decisions`` resends decisions not acknowledged yet; ``resolve_in_doubt`` is the replica
side asking coordinators about transactions it prepared and never heard of again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa

from ..config import EngineConfig
from ..errors import ErrorCode, YtError
from ..peers import Peers
from ..replica_types import ReplicaMode, ReplicaState
from ..storage import on_rollback
from ..tablets import WriteKind, encode_writes
from ..transactions import Participant, RemoteParticipant, TabletTransaction, commit_messages
from .host import ReplicationHost
from .registry import Replica, ReplicaRegistry, SyncPhase, save_progress, sync_not_in_sync
from .sink import ReplicaSink

log = logging.getLogger("reptables.engine.replication")


def _undo_commit_sync(replica: Replica, tablet: int, previous: tuple[int, int], end: int) -> Callable[[], None]:
    return lambda: replica.undo_commit_sync(tablet, previous, end)


class SyncCommits:
    """The commit hooks for sync replicas, and delivery of commit decisions."""

    def __init__(self, host: ReplicationHost, peers: Peers, registry: ReplicaRegistry, sink: ReplicaSink,
                 config: EngineConfig) -> None:
        self.host = host
        self.peers = peers
        self.registry = registry
        self.sink = sink
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=config.replication_rpc_workers,
                                        thread_name_prefix="replication-rpc")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the write path (meta-cluster) ------------------------------------------------------------

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]:
        out: list[RemoteParticipant] = []
        pending: list[Replica] = []
        for replica in self.registry.replicas_of(part.table.table_id):
            state, mode, phase = replica.flags()
            if state is not ReplicaState.ENABLED or mode is not ReplicaMode.SYNC:
                continue
            if phase is SyncPhase.DRAINING:
                raise sync_not_in_sync(replica)
            if phase is SyncPhase.CATCHING_UP:
                pending.append(replica)
                continue
            out.append(RemoteParticipant(cluster=replica.cluster_name, replica_id=replica.id,
                                         replica_path=replica.replica_path, tablet_index=part.tablet_index,
                                         meta_table_id=part.table.table_id, writes=part.writes))
        if not out and require_sync_replica:
            if pending:
                raise sync_not_in_sync(pending[0])
            raise YtError(f"Table {part.path} has no synchronous replicas", code=ErrorCode.NO_SYNC_REPLICAS,
                          attributes={"path": part.path})
        return out

    def prepare_remote(self, tx: TabletTransaction, remote: list[RemoteParticipant],
                       prepare_ts: int) -> list[RemoteParticipant]:
        per_row = self.config.prepare_seconds_per_row

        def prepare(rp: RemoteParticipant) -> None:
            # an answer may take longer for a big batch; connecting never waits past the sync timeout
            timeout = self.peers.timeout + len(rp.writes) * per_row
            self.peers.client(rp.cluster).call("prepare", timeout=timeout, body={
                "transaction_id": tx.id, "coordinator": self.host.name, "replica_id": rp.replica_id,
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
                future.result(timeout=self.peers.timeout * 3 + len(rp.writes) * per_row)
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
            self._pool.submit(self.call_quietly, rp.cluster, "abort", {"transaction_id": tx_id})

    def call_quietly(self, cluster: str, method: str, body: dict[str, Any]) -> bool:
        try:
            self.peers.client(cluster).call(method, body)
            return True
        except YtError as exc:
            log.warning("peer call failed", extra={"cluster": cluster, "method": method, "error": exc.message})
            return False

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> None:
        """Inside the commit's SQL transaction (storage writer held): advance sync replicas, re-check
        the sync set. A progress moved here goes back if the transaction rolls back, as the queue's
        row count does: it must never run ahead of the queue rows that exist."""
        table = part.table
        tablet = part.tablet_index
        end = table.tablet_rows[tablet][0]
        start = end - sum(1 for w in part.writes if w.kind is not WriteKind.LOCK)
        mine = {rp.replica_id: rp for rp in remote
                if rp.meta_table_id == table.table_id and rp.tablet_index == tablet}
        for replica in self.registry.replicas_of(table.table_id):
            rp = mine.get(replica.id)
            if rp is None:
                if replica.writes_synchronously:
                    # the replica turned in sync after this commit chose its participants
                    raise sync_not_in_sync(replica)
                continue
            previous = replica.commit_sync(tablet, start, end, commit_ts)
            if previous is None:
                raise sync_not_in_sync(replica)
            on_rollback(conn, _undo_commit_sync(replica, tablet, previous, end))
            rp.row_index = end
            save_progress(conn, replica.id, tablet, end, max(previous[1], commit_ts))

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None:
        """Tell the sync replicas a durable decision, in the background.

        The commit is acknowledged to the client as soon as the decision record is durable, as a
        coordinator's commit is: the replicas hold the prepared rows (their reads wait for them, see
        ``TransactionManager.wait_prepared_writes``) until the message arrives; one that does not
        get it is sent it again by :meth:`deliver_decisions`, or asks (``resolve_in_doubt``)."""
        messages = commit_messages(tx_id, commit_ts, remote)

        def deliver() -> None:
            remaining = [m for m in messages if not self.call_quietly(m["cluster"], "commit", m)]
            try:
                self.host.transactions.forget_decision(tx_id, remaining)
            except Exception:  # noqa: BLE001 - a decision not forgotten is only delivered again
                log.exception("cannot record delivered commit", extra={"transaction_id": tx_id})

        try:
            self._pool.submit(deliver)
        except RuntimeError:
            pass  # shutting down: the decision record stays and is delivered after the restart

    def deliver_decisions(self) -> None:
        """Background: resend commits that sync replicas have not acknowledged yet."""
        for tx_id, _ts, pending in self.host.transactions.undelivered_decisions():
            remaining = [m for m in pending if not self.call_quietly(m["cluster"], "commit", m)]
            if len(remaining) != len(pending):
                self.host.transactions.forget_decision(tx_id, remaining)

    # -- in-doubt resolution (replica side) -------------------------------------------------------

    def resolve_in_doubt(self, older_than: float = 1.0) -> None:
        """Background (replica side): ask coordinators about transactions prepared here.

        Asking about a transaction still running is harmless (the answer is "in_progress"), so
        every prepare older than a second is asked about on every pass.
        """
        for tx_id, coordinator in self.host.transactions.pending_participants(older_than):
            try:
                status = self.peers.client(coordinator).call("transaction_status", {"transaction_id": tx_id})
            except YtError:
                continue
            if status["state"] == "committed":
                mine = [m for m in status.get("participants", []) if m.get("cluster") == self.host.name]
                for message in mine or [{"transaction_id": tx_id, "commit_timestamp": status["commit_timestamp"]}]:
                    self.sink.handle_commit(message)
            elif status["state"] == "aborted":
                self.host.transactions.abort_participant(tx_id)
