"""Tablet transactions (seed 003): snapshot isolation, row locks, two-phase commit, recovery.

A tablet transaction lives in the engine between ``start_transaction`` and ``commit_transaction``
(the HTTP proxy plays the role of YT's client library, which buffers writes). Reads inside it use
its start timestamp; its own writes are invisible to it until commit.

Commit groups the buffered writes by *participant* (one tablet of one table) and then:

* one participant: one-phase commit — conflict checks, commit timestamp and the write happen in
  one SQL transaction under the writer lock (YT also commits single-participant transactions in
  one phase);
* several participants: two-phase commit — each participant *prepares*, then all commit. The
  local participants prepare in memory (conflict checks, row locks in the lock table) and commit
  in one SQL transaction with the coordinator's durable *commit decision*, so a crash leaves all
  of them or none. Remote participants (sync replicas, ``participant.py`` on their cluster) write
  a durable prepare record with the write set and apply it when told the decision; after a crash
  they re-hold it and ask the coordinator, which answers "aborted" without a decision record
  (presumed abort). A transaction is either wholly visible or not at all.

Visibility: a reader at timestamp T must see every commit with a smaller timestamp. A commit
timestamp is registered as *in flight* at the moment it is generated, and readers at T >= it wait
until it is applied (``wait_visible``), which closes the window between "timestamp chosen" and
"rows written" (see ``visibility.py``).

This module is the coordinator: sessions, the commit paths and the decision records that sync
replicas ask about. The participant side of transactions coordinated by *another* cluster is
``participant.py`` (``ParticipantSide``, owned here; the public ``*_participant`` methods delegate
to it), the row locks and the conflict check are ``locks.py``, and what a commit asks of the
replication layer is the ``CommitHooks`` protocol of ``hooks.py``: this package never imports
replication.

Lock order of this package (a lock is only taken while holding those before it, never the reverse):

* ``Storage.write_lock`` -> ``InFlight.cond`` -> ``LockTable._mutex`` / ``TimestampProvider._lock``
  (the writer lock also takes the last two directly: conflict checks, row locks, ``observe``);
* ``Storage.write_lock`` -> ``TransactionManager._lock`` (``DynamicTable.pinned_by`` in a commit);
* ``Storage.write_lock`` -> whatever ``CommitHooks.after_queue_append`` and an ``ApplyHook`` take
  (replication's registry lock);
* ``TransactionManager._lock``, ``TabletTransaction.lock``, ``LockTable._mutex`` and
  ``TimestampProvider._lock`` are leaves.

The waits of ``InFlight`` (``wait_visible``, ``wait_prepared_writes``, a prepare's wait for remote
row locks) must never be entered with ``Storage.write_lock`` held: a remote prepare they wait for
is released only by a commit or abort, which needs the writer lock.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG, EngineConfig
from ..errors import ErrorCode, NoSuchTransaction, YtError
from ..faults import NO_FAULTS, Faults
from ..metrics import EngineMetrics
from ..storage import FastStatement, Storage, commits_table
from ..tablets import DynamicTable, ImageRun, RowWrite
from ..timestamps import COUNTER_BITS, TimestampProvider, unix_to_timestamp
from .hooks import CommitHooks
from .locks import LockTable, check_conflicts
from .model import (
    ATOMIC_TX_TYPE,
    NON_ATOMIC_TX_TYPE,
    ApplyHook,
    Atomicity,
    Durability,
    Participant,
    RemoteParticipant,
    TabletTransaction,
    TxState,
    commit_messages,
    make_object_id,
)
from .participant import ParticipantSide
from .visibility import InFlight

# the statements on the latency path of every sync replica commit (storage.FastStatement)
_INSERT_DECISION = FastStatement.insert(commits_table)
_DELETE_DECISION = FastStatement.delete(commits_table, "transaction_id")


class TransactionManager:
    def __init__(self, storage: Storage, timestamps: TimestampProvider,
                 resolve_table: Callable[[str], tuple[DynamicTable, str] | None],
                 metrics: EngineMetrics | None = None, faults: Faults = NO_FAULTS,
                 config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.storage = storage
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self.faults = faults
        self.config = config
        self.timestamps = timestamps
        self._resolve_table = resolve_table
        self._lock = threading.Lock()  # guards _transactions; a leaf
        #: running transactions by id. Guarded by _lock
        self._transactions: dict[str, TabletTransaction] = {}
        #: row locks of prepared transactions, local and remote (guarded by its own mutex)
        self._lock_table = LockTable()
        #: in-flight commit timestamps and remote prepares (guarded by ``InFlight.cond``)
        self._inflight = InFlight(timestamps)
        self.participants = ParticipantSide(storage, timestamps, resolve_table, self._lock_table, self._inflight,
                                            self.metrics, config, faults)
        #: set once at start-up, before any commit (see :meth:`register_commit_hooks`)
        self._hooks: CommitHooks | None = None

    def register_commit_hooks(self, hooks: CommitHooks) -> None:
        """What commits of replicated tables call in the replication layer (see ``hooks.py``)."""
        self._hooks = hooks

    # -- timestamps and visibility -----------------------------------------------------------------

    def visible_bound(self, ts: int) -> int:
        """See ``InFlight.visible_bound`` (change streams read up to it)."""
        return self._inflight.visible_bound(ts)

    def wait_visible(self, ts: int, timeout: float = 10.0) -> None:
        """Block until no commit with a timestamp <= ``ts`` is still being applied."""
        self._inflight.wait_visible(ts, timeout)

    def has_remote_prepared(self, table_id: str) -> bool:
        """Whether a transaction coordinated elsewhere holds prepared writes to this table."""
        return self._inflight.has_remote_prepared(table_id)

    def commits_in_flight(self, table_id: str) -> bool:
        """Whether a commit that may still write ``table_id`` is under way here: a transaction this
        cluster coordinates that is committing with writes to it, or one coordinated elsewhere holding
        prepared writes to it (what a freezing table waits for)."""
        if self.has_remote_prepared(table_id):
            return True
        with self._lock:  # a leaf: only the list is copied under it
            running = list(self._transactions.values())
        # a committing transaction's writes no longer change
        return any(tx.state is TxState.COMMITTING and any(key[0] == table_id for key in list(tx.writes))
                   for tx in running)

    def wait_prepared_writes(self, table_id: str, timeout: float = 10.0) -> None:
        """Before a read of the latest data: wait for the transactions prepared here (by another
        cluster's coordinator) that had written this table when the read began.

        A coordinator acknowledges a commit once its decision is durable, and tells the participants
        after; a sync replica must still show every acknowledged commit to a read (seed 002, "reading
        without specifying a timestamp ... visibility of data from all committed transactions is
        guaranteed"), so such a read waits for those few in flight, as YT's reads wait for rows
        locked by a prepared transaction."""
        self._inflight.wait_prepared_writes(table_id, timeout)

    def oldest_active_start_timestamp(self) -> int | None:
        """Called by tables under Storage.write_lock (``DynamicTable.pinned_by``): takes only _lock."""
        with self._lock:
            starts = [t.start_timestamp for t in self._transactions.values()
                      if t.state is TxState.ACTIVE and t.atomicity is Atomicity.FULL]
        return min(starts) if starts else None

    # -- sessions --------------------------------------------------------------------------------

    def start(self, atomicity: Atomicity = Atomicity.FULL, durability: Durability = Durability.SYNC,
              timeout: float | None = None, start_timestamp: int | None = None) -> TabletTransaction:
        if durability is Durability.ASYNC and atomicity is Atomicity.FULL:
            raise YtError("durability=async is only allowed for non-atomic transactions (atomicity=none)",
                          code=ErrorCode.INVALID_PARAMETER)
        if atomicity is Atomicity.FULL:
            if start_timestamp is not None:
                raise YtError("start_timestamp may only be given for non-atomic transactions (atomicity=none)",
                              code=ErrorCode.INVALID_PARAMETER)
            start_ts = self.timestamps.generate()
            tx_type = ATOMIC_TX_TYPE
        else:
            start_ts = start_timestamp if start_timestamp is not None else int(time.time()) << COUNTER_BITS
            tx_type = NON_ATOMIC_TX_TYPE
        now = time.monotonic()
        lifetime = self.config.max_transaction_lifetime
        tx = TabletTransaction(id=make_object_id(tx_type), start_timestamp=start_ts, atomicity=atomicity,
                               durability=durability, started_at=now,
                               timeout=min(timeout or lifetime, lifetime),
                               last_ping=now, max_lifetime=lifetime,
                               max_rows=self.config.max_rows_per_transaction)
        with self._lock:
            self._transactions[tx.id] = tx
        return tx

    def get(self, tx_id: str) -> TabletTransaction:
        with self._lock:
            tx = self._transactions.get(tx_id)
        if tx is None:
            raise NoSuchTransaction(f"No such transaction {tx_id}", attributes={"transaction_id": tx_id})
        return tx

    def ping(self, tx_id: str) -> None:
        tx = self.get(tx_id)
        tx.check_active()
        tx.last_ping = time.monotonic()

    def abort(self, tx_id: str) -> None:
        tx = self.get(tx_id)
        with tx.lock:
            if tx.state is TxState.COMMITTED:
                raise YtError(f"Transaction {tx_id} is already committed", code=ErrorCode.INVALID_TRANSACTION_STATE)
            tx.state = TxState.ABORTED
        self._forget(tx)

    def _forget(self, tx: TabletTransaction) -> None:
        with self._lock:
            self._transactions.pop(tx.id, None)

    def expire(self) -> int:
        """Abort transactions past their lifetime or unpinged past their timeout."""
        now = time.monotonic()
        with self._lock:
            stale = [t for t in self._transactions.values() if t.state is TxState.ACTIVE and (
                now - t.started_at > t.max_lifetime or now - t.last_ping > t.timeout)]
        expired = 0
        for tx in stale:
            with tx.lock:
                # a commit may have begun since the scan: a committing transaction is the commit's
                # (its coordinator answers "in progress", never "aborted", to an in-doubt replica)
                if tx.state is not TxState.ACTIVE:
                    continue
                tx.state = TxState.ABORTED
            self._forget(tx)
            expired += 1
        return expired

    # -- commit ----------------------------------------------------------------------------------

    def commit(self, tx: TabletTransaction) -> int:
        with tx.lock:
            tx.check_active()
            tx.state = TxState.COMMITTING
        try:
            ts = self._commit(tx)
        except BaseException:
            tx.state = TxState.ABORTED
            self._forget(tx)
            raise
        tx.state = TxState.COMMITTED
        tx.commit_timestamp = ts
        self._forget(tx)
        return ts

    def _participants(self, tx: TabletTransaction) -> tuple[list[Participant], list[RemoteParticipant]]:
        parts = []
        for (table_id, tablet), bucket in tx.writes.items():
            table, path = tx.tables[table_id]
            parts.append(Participant(table, path, tablet, list(bucket.values()),
                                     keyed=bucket if table.sorted else None,
                                     layout_revision=tx.layouts.get(table_id, table.layout_revision)))
        for part in parts:
            part.table.check_writable(part.path)
            if part.table.atomicity != tx.atomicity.value:
                raise YtError(
                    f"Atomicity mismatch: table {part.path} has atomicity {part.table.atomicity!r}, "
                    f"transaction {tx.id} has atomicity {tx.atomicity.value!r}",
                    code=ErrorCode.INVALID_TRANSACTION_ATOMICITY,
                    attributes={"path": part.path, "transaction_id": tx.id})
        remote: list[RemoteParticipant] = []
        replicated = [p for p in parts if p.table.replicated]
        if replicated:
            if self._hooks is None:
                raise YtError("Replication is not available on this cluster", code=ErrorCode.INVALID_PARAMETER)
            for part in replicated:
                remote.extend(self._hooks.sync_participants(
                    part, require_sync_replica=tx.require_sync_replica.get(part.table.table_id, True)))
        return parts, remote

    def _commit(self, tx: TabletTransaction) -> int:
        parts, remote = self._participants(tx)
        if not parts:
            return self.timestamps.generate()
        if tx.atomicity is Atomicity.NONE:
            return self._commit_non_atomic(tx, parts)
        if len(parts) == 1 and not remote:
            return self._commit_one_phase(tx, parts[0])
        return self._commit_two_phase(tx, parts, remote)

    def _check(self, conn: sa.Connection, tx: TabletTransaction, part: Participant) -> None:
        check_conflicts(conn, self._lock_table, self.metrics, tx.id, tx.start_timestamp, part.table, part.path,
                        part.writes, part.keyed)

    def _commit_one_phase(self, tx: TabletTransaction, part: Participant) -> int:
        ts = 0
        try:
            with self.storage.write() as conn:
                part.check_layout(tx.id)
                self._check(conn, tx, part)
                ts = self._inflight.begin_commit()
                rows = part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
                if part.table.replicated:
                    assert self._hooks is not None
                    self._hooks.after_queue_append(conn, part, ts, [])
        finally:
            if ts:
                self._inflight.end_commit(ts)
        self.metrics.rows_written.inc(rows)
        self.metrics.child(self.metrics.commits, "one_phase").inc()
        return ts

    def _commit_non_atomic(self, tx: TabletTransaction, parts: list[Participant]) -> int:
        server_ts = self.timestamps.generate()
        drift = abs((server_ts >> COUNTER_BITS) - (tx.start_timestamp >> COUNTER_BITS))
        if drift > self.config.client_timestamp_threshold:
            raise YtError("Transaction timestamp is off limits, check the local clock readings",
                          code=ErrorCode.INVALID_PARAMETER,
                          attributes={"client_timestamp": tx.start_timestamp, "server_timestamp": server_ts})
        ts = 0
        rows = 0
        try:
            with self.storage.write(durable=tx.durability is Durability.SYNC) as conn:
                for part in parts:
                    part.check_layout(tx.id)
                ts = self._inflight.begin_commit(at_least=tx.start_timestamp)
                for part in parts:
                    rows += part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
        finally:
            if ts:
                self._inflight.end_commit(ts)
        self.metrics.rows_written.inc(rows)
        self.metrics.child(self.metrics.commits, "non_atomic").inc()
        return ts

    def _commit_two_phase(self, tx: TabletTransaction, parts: list[Participant],
                          remote: list[RemoteParticipant]) -> int:
        """Prepare everyone, then commit: local participants atomically with the decision record."""
        started = time.perf_counter()
        prepare_ts = self.timestamps.generate()
        prepared_remote: list[RemoteParticipant] = []
        try:
            if remote:
                assert self._hooks is not None
                prepared_remote = self._hooks.prepare_remote(tx, remote, prepare_ts)
            for part in parts:
                if part.table.replicated or not part.table.sorted:
                    continue  # nothing to check or lock: sync replicas did it, ordered tables have no keys
                with self.storage.write() as conn:
                    self._check(conn, tx, part)
                    if part.table.sorted and not part.table.replicated:
                        keyed = part.keyed if part.keyed is not None else part.table.keyed(part.writes)
                        self._lock_table.acquire_many(part.table.table_id, keyed, tx.id)
            self.faults.crash_point("after_prepare")
            prepared_at = time.perf_counter()
        except BaseException:
            self._lock_table.release(tx.id)
            if prepared_remote:
                assert self._hooks is not None
                self._hooks.abort_remote(tx.id, prepared_remote)
            raise
        ts = 0
        rows = 0
        try:
            with self.storage.write() as conn:
                for part in parts:
                    part.check_layout(tx.id)
                ts = self._inflight.begin_commit()
                for part in parts:
                    rows += part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
                    if part.table.replicated:
                        assert self._hooks is not None
                        self._hooks.after_queue_append(conn, part, ts, remote)
                if remote:
                    _INSERT_DECISION.run(conn, transaction_id=tx.id, commit_timestamp=ts,
                                         participants=json.dumps(commit_messages(tx.id, ts, remote)))
            self.faults.crash_point("after_commit_decision")
        except BaseException:
            # no decision was recorded (the SQL transaction rolled back): the prepared sync
            # replicas are told at once, instead of holding locks and reads until they ask
            if remote:
                assert self._hooks is not None
                self._hooks.abort_remote(tx.id, remote)
            raise
        finally:
            self._lock_table.release(tx.id)
            if ts:
                self._inflight.end_commit(ts)
        decided_at = time.perf_counter()
        if remote:
            assert self._hooks is not None
            self._hooks.commit_remote(tx.id, ts, remote)
        self.metrics.rows_written.inc(rows)
        self.metrics.child(self.metrics.commits, "two_phase").inc()
        participants = "sync_replicas" if remote else "local"
        self.metrics.child(self.metrics.prepare_seconds, participants).observe(prepared_at - started)
        self.metrics.child(self.metrics.two_phase_seconds, participants).observe(decided_at - started)
        return ts

    # -- decision records: what participants ask the coordinator -----------------------------------

    def transaction_status(self, tx_id: str) -> dict[str, Any]:
        """What a participant needs to resolve an in-doubt transaction coordinated here."""
        with self._lock:
            if tx_id in self._transactions:
                return {"state": "in_progress"}
        with self.storage.read() as conn:
            row = conn.execute(sa.select(commits_table).where(commits_table.c.transaction_id == tx_id)).first()
        if row is None:
            return {"state": "aborted"}
        return {"state": "committed", "commit_timestamp": row.commit_timestamp,
                "participants": json.loads(row.participants)}

    def undelivered_decisions(self, older_than: float = 2.0) -> list[tuple[str, int, list[dict[str, Any]]]]:
        """Decisions not yet acknowledged by every participant, committed at least ``older_than``
        seconds ago (younger ones are normally still being delivered)."""
        # from the clock, not from the last timestamp handed out: on an idle engine that one stands
        # still, and a decision left to deliver (a relaxed commit no later prepare covered) with it
        now = max(self.timestamps.last, unix_to_timestamp(time.time()))
        before = now - (int(older_than * 1000) << COUNTER_BITS) // 1000
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(commits_table).where(commits_table.c.commit_timestamp <= before)).all()
        return [(r.transaction_id, r.commit_timestamp, json.loads(r.participants)) for r in rows]

    def forget_decision(self, tx_id: str, remaining: list[dict[str, Any]]) -> None:
        self.forget_decisions([(tx_id, remaining)])

    def forget_decisions(self, decisions: list[tuple[str, list[dict[str, Any]]]]) -> None:
        """Drop delivered decisions, or keep only the messages still to deliver (``remaining``), all in
        one write: sync commits delivered one by one are forgotten in batches, not each with a write
        that takes the writer lock from the next commit."""
        # no fsync: a forgetting lost in a crash only makes the commit be sent again, which is a no-op
        with self.storage.write(durable=False, harmless_if_lost=True) as conn:
            for tx_id, remaining in decisions:
                if remaining:
                    conn.execute(commits_table.update().where(commits_table.c.transaction_id == tx_id)
                                 .values(participants=json.dumps(remaining)))
                else:
                    _DELETE_DECISION.run(conn, transaction_id=tx_id)

    # -- the participant side (``ParticipantSide``), for the node and the replication layer --------

    def prepare_participant(self, tx_id: str, coordinator: str, table: DynamicTable, path: str,
                            writes: list[RowWrite] | ImageRun, start_ts: int, prepare_ts: int, extra: dict[str, Any],
                            participant: str | None = None, encoded: dict[str, Any] | None = None) -> None:
        """Durably prepare writes of a transaction coordinated elsewhere (see ``ParticipantSide.prepare``)."""
        self.participants.prepare(tx_id, coordinator, table, path, writes, start_ts, prepare_ts, extra, participant,
                                  encoded)

    def commit_participant(self, tx_id: str, commit_ts: int, on_apply: ApplyHook | None = None,
                           coordinator: str | None = None, relaxed: bool = False) -> int | None:
        """Apply a prepared remote transaction with the coordinator's commit timestamp (``coordinator``:
        the calling cluster, which must be the one that prepared it; None for this cluster's own
        in-doubt resolution). ``relaxed``: without an fsync if the storage allows, and then its
        number is returned (see ``ParticipantSide.commit``)."""
        return self.participants.commit(tx_id, commit_ts, on_apply, coordinator, relaxed)

    def participant_durability(self) -> dict[str, Any]:
        """Through which relaxed commit this participant's commits are durable (``ParticipantSide.durability``)."""
        return self.participants.durability()

    def abort_participant(self, tx_id: str, coordinator: str | None = None) -> None:
        self.participants.abort(tx_id, coordinator)

    def pending_participants(self, older_than: float) -> list[tuple[str, str]]:
        """Remotely coordinated transactions prepared here for at least ``older_than`` seconds:
        (transaction id, coordinator)."""
        return self.participants.pending(older_than)

    def mark_participant_stalled(self, tx_id: str, reason: str) -> bool:
        """Undecided past the in-doubt bound: reads stop waiting for it (see ``ParticipantSide.mark_stalled``)."""
        return self.participants.mark_stalled(tx_id, reason)

    def recover(self) -> tuple[int, int]:
        """After a restart: abort local prepares, re-hold remote ones (see ``ParticipantSide.recover``)."""
        return self.participants.recover()

    def apply_replicated(self, table: DynamicTable, groups: Sequence[tuple[int, list[RowWrite] | ImageRun]],
                         preserve: bool, tablet_index: int, check: Callable[[sa.Connection], tuple[Any, Any] | None],
                         expected: Any, record: Callable[[sa.Connection, int], None], end: Any,
                         prepare: Callable[[sa.Connection, int, int, list[RowWrite]], list[RowWrite]] | None = None,
                         ) -> dict[str, Any]:
        """Apply a replicator batch exactly once (see ``ParticipantSide.apply_replicated``)."""
        return self.participants.apply_replicated(table, groups, preserve, tablet_index, check, expected, record,
                                                  end, prepare)
