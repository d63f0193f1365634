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
* ``commit_remote``: the decision, delivered in the background once durable. The replica writes
  it without an fsync where it can (``relaxed``, transactions/participant.py): the decision record
  here is kept until an answer of that replica (to a later prepare, or to the commit itself) says
  the commit is durable there, and a commit no answer covers is sent again without ``relaxed``.

``deliver_decisions`` resends decisions not acknowledged yet; ``resolve_in_doubt`` is the replica
side asking coordinators about transactions it prepared and never heard of again.

In-doubt resolution never guesses a decision: aborting a prepare the coordinator committed would
lose a write the client was told is durable. So a transaction is committed or aborted on its
coordinator's word only (an unknown transaction is "aborted": presumed abort), with one exception:
a coordinator that has left ``//sys/clusters`` for ``in_doubt_timeout`` can never answer, and its
transactions are aborted. One that is merely unreachable (or answers nonsense) keeps its prepares;
past ``in_doubt_timeout`` they are reported (a warning, ``reptables_in_doubt_transactions``) and
marked stalled, so that reads fail at once with a retriable error instead of waiting for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
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
from .registry import ReplicaRegistry, save_progress
from .replica import Replica, SyncPhase, sync_not_in_sync
from .sink import ReplicaSink

log = logging.getLogger("reptables.engine.replication")

#: how long delivered commit decisions gather before one write forgets them all (seconds)
FORGET_BATCH_DELAY = 0.05
#: a participant's ``instance`` is a uuid4 in hex (``ParticipantSide.instance``): a longer one is not
_MAX_INSTANCE_LENGTH = 64


_KIND = attrgetter("kind")


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
        #: in-doubt transactions whose coordinator is not in the directory: id -> since when
        #: (monotonic). Only the maintenance thread (``resolve_in_doubt``) uses it
        self._coordinator_unknown_since: dict[str, float] = {}
        #: relaxed commits delivered to a sync replica's cluster and not yet known durable there:
        #: cluster -> [(the participant's instance, the commit's number, transaction id)], in order
        self._unsynced: dict[str, list[tuple[str, int, str]]] = {}
        #: transaction id -> (the clusters whose relaxed commit is still not durable, the commit
        #: messages that could not be delivered): its decision is forgotten when the set is empty
        self._awaiting: dict[str, tuple[set[str], list[dict[str, Any]]]] = {}
        #: cluster -> (instance, durable_through) of its last answer
        self._durable_seen: dict[str, tuple[str, int]] = {}
        #: decisions delivered (and durable where they were relaxed), to forget in the next batch, and
        #: whether a batch is due (submitted, not yet taken them)
        self._forgettable: list[tuple[str, list[dict[str, Any]]]] = []
        self._forget_due = False
        #: guards _unsynced, _awaiting, _durable_seen, _forgettable and _forget_due (a leaf; never
        #: held during a call or a write)
        self._unsynced_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the write path (meta-cluster) ------------------------------------------------------------

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]:
        out: list[RemoteParticipant] = []
        pending: list[Replica] = []
        for replica in self.registry.replicas_of(part.table.table_id):
            state, mode, phase = replica.flags()
            # (an enabling sync replica is catching up: a write that needs it is told to retry)
            if state not in (ReplicaState.ENABLED, ReplicaState.ENABLING) or mode is not ReplicaMode.SYNC:
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
            answer = self.peers.client(rp.cluster).call("prepare", timeout=timeout, body={
                "transaction_id": tx.id, "coordinator": self.host.name, "replica_id": rp.replica_id,
                "replica_path": rp.replica_path, "tablet_index": rp.tablet_index,
                "start_timestamp": tx.start_timestamp, "prepare_timestamp": prepare_ts,
                **encode_writes(rp.writes)})
            self._note_durability(rp.cluster, answer)

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
        return self._call_answer(cluster, method, body) is not None

    def _call_answer(self, cluster: str, method: str, body: dict[str, Any]) -> Any:
        """The peer's answer to ``method``, or None (logged) if the call failed."""
        try:
            answer = self.peers.client(cluster).call(method, body)
        except YtError as exc:
            log.warning("peer call failed", extra={"cluster": cluster, "method": method, "error": exc.message})
            return None
        return {} if answer is None else answer

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> tuple[list[Replica], list[Replica]]:
        """Inside the commit's SQL transaction (storage writer held): advance sync replicas, re-check
        the sync set. A progress moved here goes back if the transaction rolls back, as the queue's
        row count does: it must never run ahead of the queue rows that exist.

        Returns the replicas the commit concerns once it is durable: (those fed from the queue,
        enabled or enabling, whose replicator has rows to push now; the sync participants, whose
        replica tables' freshness a heartbeat moves past this commit later)."""
        table = part.table
        tablet = part.tablet_index
        end = table.tablet_rows[tablet][0]
        kinds = list(map(_KIND, part.writes))  # (a C pass: up to 100,000 writes)
        start = end - (len(kinds) - kinds.count(WriteKind.LOCK))
        mine = {rp.replica_id: rp for rp in remote
                if rp.meta_table_id == table.table_id and rp.tablet_index == tablet}
        fed: list[Replica] = []
        synced: list[Replica] = []
        for replica in self.registry.replicas_of(table.table_id):
            rp = mine.get(replica.id)
            if rp is None:
                state, mode, phase = replica.flags()
                if state is ReplicaState.ENABLED and mode is ReplicaMode.SYNC and phase is SyncPhase.IN_SYNC:
                    # the replica turned in sync after this commit chose its participants
                    raise sync_not_in_sync(replica)
                replica.note_queued(tablet, start, commit_ts)
                if state in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                    fed.append(replica)
                continue
            previous = replica.commit_sync(tablet, start, end, commit_ts)
            if previous is None:
                raise sync_not_in_sync(replica)
            on_rollback(conn, _undo_commit_sync(replica, tablet, previous, end))
            rp.row_index = end
            save_progress(conn, replica.id, tablet, end, max(previous[1], commit_ts))
            synced.append(replica)
        return fed, synced

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None:
        """Tell the sync replicas a durable decision, in the background.

        The commit is acknowledged to the client as soon as the decision record is durable, as a
        coordinator's commit is: the replicas hold the prepared rows (their reads wait for them, see
        ``TransactionManager.wait_prepared_writes``) until the message arrives; one that does not
        get it is sent it again by :meth:`deliver_decisions`, or asks (``resolve_in_doubt``)."""
        messages = commit_messages(tx_id, commit_ts, remote)

        def deliver() -> None:
            remaining: list[dict[str, Any]] = []
            relaxed: list[tuple[str, str, int]] = []  # (cluster, instance, number) not yet durable
            for m in messages:
                answer = self._call_answer(m["cluster"], "commit", {**m, "relaxed": True})
                if answer is None:
                    remaining.append(m)
                    continue
                number = answer.get("sequence") if isinstance(answer, dict) else None
                if isinstance(number, int) and not isinstance(number, bool):
                    relaxed.append((m["cluster"], str(answer.get("instance")), number))
                self._note_durability(m["cluster"], answer)
            if relaxed and self._await_durable(tx_id, relaxed, remaining):
                return  # forgotten once the replicas say the commits are durable (_note_durability)
            self._forget_soon([(tx_id, remaining)])

        try:
            self._pool.submit(deliver)
        except RuntimeError:
            pass  # shutting down: the decision record stays and is delivered after the restart

    def _forget_soon(self, decisions: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """Forget delivered decisions in a batch a moment later (FORGET_BATCH_DELAY): one write for all
        of them rather than one per commit, each taking the writer lock from the next commit."""
        with self._unsynced_lock:
            self._forgettable.extend(decisions)
            if self._forget_due:
                return
            self._forget_due = True
        try:
            self._pool.submit(self._forget_batch)
        except RuntimeError:
            pass  # shutting down: the decision records stay and are delivered after the restart

    def _forget_batch(self) -> None:
        time.sleep(FORGET_BATCH_DELAY)
        with self._unsynced_lock:
            decisions, self._forgettable = self._forgettable, []
            self._forget_due = False
        try:
            self.host.transactions.forget_decisions(decisions)
        except Exception:  # noqa: BLE001 - a decision not forgotten is only delivered again
            log.exception("cannot record delivered commits", extra={"transactions": len(decisions)})

    def _await_durable(self, tx_id: str, relaxed: list[tuple[str, str, int]],
                       remaining: list[dict[str, Any]]) -> bool:
        """Keep ``tx_id``'s decision until every commit in ``relaxed`` is known durable; False if all
        already are (the answers so far say so)."""
        with self._unsynced_lock:
            waiting = set()
            for cluster, instance, number in relaxed:
                seen = self._durable_seen.get(cluster)
                if seen is None or seen[0] != instance or seen[1] < number:
                    waiting.add(cluster)
                    self._unsynced.setdefault(cluster, []).append((instance, number, tx_id))
            if not waiting:
                return False
            self._awaiting[tx_id] = (waiting, remaining)
            return True

    def _note_durability(self, cluster: str, answer: Any) -> None:
        """A replica's answer says through which relaxed commit its commits are durable: the decisions
        whose every relaxed commit that covers are forgotten (in the background)."""
        if not isinstance(answer, dict):
            return
        instance, through = answer.get("instance"), answer.get("durable_through")
        if not isinstance(instance, str) or len(instance) > _MAX_INSTANCE_LENGTH or \
                isinstance(through, bool) or not isinstance(through, int):
            return  # (an engine that commits durably only; an answer that is not one this side makes)
        done: list[tuple[str, list[dict[str, Any]]]] = []
        with self._unsynced_lock:
            self._durable_seen[cluster] = (instance, through)
            entries = self._unsynced.get(cluster)
            if not entries:
                return
            kept = []
            for entry in entries:
                if entry[0] == instance and entry[1] > through:
                    kept.append(entry)
                    continue
                # durable, or made by an earlier run of the replica's engine: the resend of the
                # undelivered decisions (deliver_decisions) makes that one durable, or applies it
                if entry[0] != instance:
                    continue
                awaiting = self._awaiting.get(entry[2])
                if awaiting is not None:
                    awaiting[0].discard(cluster)
                    if not awaiting[0]:
                        del self._awaiting[entry[2]]
                        done.append((entry[2], awaiting[1]))
            self._unsynced[cluster] = kept
        if done:
            self._forget_soon(done)

    def deliver_decisions(self) -> None:
        """Background: resend commits that sync replicas have not acknowledged yet, or not as durable
        (a relaxed commit no answer has covered since: the resend, durable, makes it so)."""
        delivered: list[tuple[str, list[dict[str, Any]]]] = []
        for tx_id, _ts, pending in self.host.transactions.undelivered_decisions():
            remaining = [m for m in pending if not self.call_quietly(m["cluster"], "commit", m)]
            with self._unsynced_lock:
                self._awaiting.pop(tx_id, None)
            if len(remaining) != len(pending):
                delivered.append((tx_id, remaining))
        if delivered:
            self.host.transactions.forget_decisions(delivered)

    # -- in-doubt resolution (replica side) -------------------------------------------------------

    def resolve_in_doubt(self, older_than: float = 1.0) -> None:
        """Background (replica side): ask coordinators about transactions prepared here.

        Asking about a transaction still running is harmless (the answer is "in_progress"), so
        every prepare older than a second is asked about on every pass. One left undecided past
        ``in_doubt_timeout`` is reported and stalled, or aborted if its coordinator has left the
        directory for that long (see the module docstring).
        """
        # one row per participant: a transaction prepared for several tablets is asked about once
        pending = list(dict.fromkeys(self.host.transactions.pending_participants(older_than)))
        if not pending:
            self._coordinator_unknown_since.clear()
            return
        bound = self.config.in_doubt_timeout
        overdue = {tx for tx, _ in self.host.transactions.pending_participants(bound)}
        now = time.monotonic()
        held = {tx for tx, _ in pending}
        self._coordinator_unknown_since = {tx: at for tx, at in self._coordinator_unknown_since.items()
                                           if tx in held}
        for tx_id, coordinator in pending:
            if not self.peers.known(coordinator):
                since = self._coordinator_unknown_since.setdefault(tx_id, now)
                if now - since >= bound:
                    self._abort_orphan(tx_id, coordinator, now - since)
                elif tx_id in overdue:
                    self._stall(tx_id, coordinator, f"its coordinator, cluster {coordinator}, is not in "
                                                    "//sys/clusters")
                continue
            self._coordinator_unknown_since.pop(tx_id, None)
            try:
                status = self.peers.client(coordinator).call("transaction_status", {"transaction_id": tx_id})
            except YtError as exc:
                reason = f"its coordinator, cluster {coordinator}, cannot be asked: {exc.message[:300]}"
            else:
                try:
                    if self._apply_status(tx_id, status):
                        continue
                    reason = f"its coordinator, cluster {coordinator}, reports it {str(status.get('state'))[:50]}"
                except YtError as exc:
                    reason = f"the decision of its coordinator, cluster {coordinator}, cannot be applied: " \
                             f"{exc.message[:300]}"
                    log.warning("in-doubt transaction: the coordinator's decision is refused",
                                extra={"transaction_id": tx_id, "coordinator": coordinator, "error": exc.message})
            if tx_id in overdue:
                self._stall(tx_id, coordinator, reason)

    def _apply_status(self, tx_id: str, status: Any) -> bool:
        """Commit or abort per the coordinator's answer; False when it decided nothing (yet)."""
        if not isinstance(status, dict):
            raise YtError(f"Malformed transaction status of {tx_id}: expected a map", code=ErrorCode.PROTOCOL_ERROR)
        metrics = self.host.transactions.metrics
        if status.get("state") == "committed":
            participants = status.get("participants", [])
            if not isinstance(participants, list):
                participants = []
            mine = [m for m in participants if isinstance(m, dict) and m.get("cluster") == self.host.name]
            for message in mine or [{"transaction_id": tx_id, "commit_timestamp": status.get("commit_timestamp")}]:
                self.sink.handle_commit(message, None)  # asked of its own coordinator: in process
            metrics.in_doubt.labels(outcome="committed").inc()
            log.info("in-doubt transaction committed by its coordinator's record", extra={"transaction_id": tx_id})
            return True
        if status.get("state") == "aborted":
            self.host.transactions.abort_participant(tx_id)
            metrics.in_doubt.labels(outcome="aborted").inc()
            log.info("in-doubt transaction aborted by its coordinator", extra={"transaction_id": tx_id})
            return True
        return False

    def _stall(self, tx_id: str, coordinator: str, reason: str) -> None:
        """Past the bound without a decision: reported once; reads stop waiting for it."""
        if self.host.transactions.mark_participant_stalled(tx_id, reason):
            self.host.transactions.metrics.in_doubt.labels(outcome="stalled").inc()
            log.warning("in-doubt transaction undecided past in_doubt_timeout: reads of its rows fail until its "
                        "coordinator decides", extra={"transaction_id": tx_id, "coordinator": coordinator,
                                                      "reason": reason,
                                                      "in_doubt_timeout": self.config.in_doubt_timeout})

    def _abort_orphan(self, tx_id: str, coordinator: str, for_seconds: float) -> None:
        """Its coordinator left the directory long ago: no decision can ever arrive."""
        self.host.transactions.abort_participant(tx_id)
        self._coordinator_unknown_since.pop(tx_id, None)
        self.host.transactions.metrics.in_doubt.labels(outcome="aborted_unknown_coordinator").inc()
        log.warning("in-doubt transaction aborted: its coordinator is not in //sys/clusters",
                    extra={"transaction_id": tx_id, "coordinator": coordinator,
                           "unknown_for_seconds": round(for_seconds, 1)})
