"""The participant side: transactions coordinated by another cluster, and replicator batches.

A sync replica is a participant of its meta-cluster's two-phase commit: it *prepares* (checks
conflicts with the meta-cluster's start timestamp, takes row locks, writes a durable prepare
record with the write set), then *commits* with the coordinator's commit timestamp or *aborts*.
Between the two, the transaction is in doubt here: reads wait for it (``InFlight``), a restart
re-holds it from its record (:meth:`ParticipantSide.recover`) and the replication layer asks the
coordinator about the old ones (:meth:`ParticipantSide.pending`), and marks those left undecided
past ``in_doubt_timeout`` stalled (:meth:`ParticipantSide.mark_stalled`: reads stop waiting for
them). A replica also applies the asynchronous replicator's batches
(:meth:`ParticipantSide.apply_replicated`), exactly once.

This is the half of the transaction layer that never coordinates anything, so it is its own
object, owned by the ``TransactionManager`` (which keeps the public ``*_participant`` methods and
delegates them here). It shares two things with the coordinator, handed to it explicitly: the
``LockTable`` (a remote prepare's locks conflict with local commits and the reverse) and the
``InFlight`` condition (reads wait for remote prepares as for local commits).

Locking: every prepare, commit, abort, recovery and batch runs in one write transaction, under
``Storage.write_lock``; inside it this takes ``InFlight.cond`` and ``LockTable._mutex`` (never
the other way round), and calls the caller's apply hook (``ApplyHook``). Locks and in-flight
registrations are released after the SQL transaction.

Everything here comes from another cluster, so its timestamps are checked like a client's
(``TimestampProvider.check``, bounded by ``max_peer_clock_skew``) before anything is recorded or
applied: one value near 2^63 would otherwise move this cluster's clock out of range for good. A
commit timestamp below the prepare timestamp is refused too (reads at a timestamp between the two
would not be repeatable).

Commits without an fsync (SQLite storage). A participant's commit is the second of its two durable
writes per transaction, and the coordinator has already answered its client: the decision record at
the coordinator is what makes the transaction durable. So a commit the coordinator asks for with
``relaxed`` is written without an fsync and numbered, and every answer to the coordinator says
through which number this engine's commits are known durable (``durable_through``, of this
``instance`` of the participant): the next durable write here (a prepare, which always writes its
record) makes every earlier one durable too, SQLite's write-ahead log being appended in commit
order. The coordinator keeps its decision record until an answer covers the commit; one that none
covers (an idle replica, a restarted one) is sent again after a while without ``relaxed``, and that
commit, a no-op by then, first makes the earlier ones durable (:meth:`ParticipantSide.sync`). A
commit lost in a power loss leaves its durable prepare record behind: the restarted engine holds it
again, and the coordinator's resend (or its own in-doubt question) applies it. This saves an fsync
per sync replica write on the single-row commit path (benchmarks/replication_vs_pg.py). Not on
PostgreSQL storage, where a relaxed commit lost in a database failover reads as the database having
diverged from this engine.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ..config import EngineConfig
from ..errors import ErrorCode, YtError
from ..faults import NO_FAULTS, Faults
from ..httpconn import dumps_json, loads_json
from ..metrics import EngineMetrics
from ..storage import FastStatement, Storage, on_rollback, prepared_table
from ..tablets import DynamicTable, ImageRun, RowWrite, decode_writes, encode_writes
from ..timestamps import TimestampProvider
from .locks import LockTable, check_conflicts
from .model import ApplyHook
from .visibility import InFlight

# the statements on the latency path of every sync replica commit (storage.FastStatement)
_INSERT_PREPARED = FastStatement.insert(prepared_table)
_FIND_PREPARED = FastStatement.select(prepared_table, ("transaction_id",), "transaction_id", "participant")
_PARTICIPANTS = FastStatement.select(prepared_table, ("participant", "prepare_timestamp", "coordinator"),
                                     "transaction_id")
_DELETE_PREPARED = FastStatement.delete(prepared_table, "transaction_id")

#: the transaction id of the record :meth:`ParticipantSide.sync` writes and deletes
_SYNC_RECORD = "-sync-"

#: a participant's prepared writes: (table, writes, writes by key, extra)
PreparedWrites = tuple[DynamicTable, list[RowWrite] | ImageRun, dict[Any, RowWrite] | None, dict[str, Any]]

log = logging.getLogger("reptables.engine.transactions")


def _check_coordinator(tx_id: str, what: str, caller: str | None, coordinators: set[str | None]) -> None:
    """Only the cluster that prepared a transaction here may decide it."""
    if caller is not None and coordinators - {caller}:
        raise YtError(f"Cluster {caller} may not {what} transaction {tx_id}: it was prepared here by "
                      f"coordinator {', '.join(sorted(str(c) for c in coordinators))}",
                      code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                      attributes={"transaction_id": tx_id, "cluster_name": caller})


class ParticipantSide:
    """Prepare, commit and abort of remotely coordinated transactions; recovery; replicator batches."""

    def __init__(self, storage: Storage, timestamps: TimestampProvider,
                 resolve_table: Callable[[str], tuple[DynamicTable, str] | None], lock_table: LockTable,
                 inflight: InFlight, metrics: EngineMetrics, config: EngineConfig,
                 faults: Faults = NO_FAULTS) -> None:
        self.storage = storage
        self.faults = faults
        self.timestamps = timestamps
        self.metrics = metrics
        self.config = config
        self._resolve_table = resolve_table
        #: shared with the coordinator (guarded by its own mutex)
        self._lock_table = lock_table
        #: shared with the coordinator (guarded by ``InFlight.cond``)
        self._inflight = inflight
        #: writes of remotely coordinated transactions prepared here: id -> participant -> prepared
        #: writes; what their commit applies. Added to and read under Storage.write_lock; a whole
        #: entry is dropped after the commit's or abort's SQL transaction (one dict operation)
        self._prepared_writes: dict[str, dict[str, PreparedWrites]] = {}
        #: remotely coordinated transactions aborted here recently: id -> when (monotonic).
        #: Read and changed only under Storage.write_lock
        self._aborted_remote: dict[str, float] = {}
        #: this participant's run: the numbers of relaxed commits mean something within one only
        self.instance = uuid.uuid4().hex
        #: the number of the last commit written without an fsync. Changed only under Storage.write_lock
        self._relaxed_sequence = 0
        #: every relaxed commit numbered up to this one is durable. Guarded by _durable_lock (a leaf)
        self._durable_through = 0
        self._durable_lock = threading.Lock()

    # -- prepare, commit, abort --------------------------------------------------------------------

    def prepare(self, tx_id: str, coordinator: str, table: DynamicTable, path: str,
                writes: list[RowWrite] | ImageRun, start_ts: int, prepare_ts: int, extra: dict[str, Any],
                participant: str | None = None, encoded: dict[str, Any] | None = None) -> None:
        """Durably prepare writes of a transaction coordinated elsewhere (a sync replica write).

        ``participant`` names this part of the transaction (one replica table may receive the rows
        of several tablets of the replicated table, each its own participant); a repeated prepare
        of the same participant is a no-op. ``encoded``: the writes in the form of ``encode_writes``
        as they arrived, when they are exactly ``writes`` (the durable record is then written from
        it instead of encoding the writes again); always given with an :class:`ImageRun` (whole rows
        of a sorted table as their images, checked as they came), whose keys are locked and checked
        for conflicts as its writes would be.
        """
        participant = participant or table.table_id
        skew = self.config.max_peer_clock_skew
        self.timestamps.check(start_ts, f"start timestamp of transaction {tx_id}", skew)
        self.timestamps.check(prepare_ts, f"prepare timestamp of transaction {tx_id}", skew)
        if start_ts > prepare_ts:
            raise YtError(f"Invalid prepare of transaction {tx_id}: its start timestamp {start_ts:#x} is after its "
                          f"prepare timestamp {prepare_ts:#x}", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"transaction_id": tx_id})
        if isinstance(writes, ImageRun):
            assert encoded is not None and table.sorted
            keyed: dict[Any, RowWrite] | None = writes.keyed()
            listed: list[RowWrite] = []  # (every use below reads ``keyed``)
        else:
            keyed = table.keyed(writes) if table.sorted else None
            listed = writes
        if keyed:
            self._inflight.wait_remote_locks(self._lock_table, table.table_id, keyed, tx_id,
                                             self.config.remote_lock_wait)
        with self.storage.write() as conn:
            if tx_id in self._aborted_remote:
                raise YtError(f"Transaction {tx_id} was already aborted by its coordinator {coordinator}",
                              code=ErrorCode.INVALID_TRANSACTION_STATE, attributes={"transaction_id": tx_id})
            if _FIND_PREPARED.run(conn, transaction_id=tx_id, participant=participant).fetchone():
                return
            covered = self._relaxed_sequence  # (this durable commit makes every earlier one durable)
            table.check_writable(path)
            check_conflicts(conn, self._lock_table, self.metrics, tx_id, start_ts, table, path, listed, keyed)
            _INSERT_PREPARED.run(conn, transaction_id=tx_id, participant=participant, start_timestamp=start_ts,
                                 prepare_timestamp=prepare_ts, coordinator=coordinator,
                                 payload=dumps_json({"table_id": table.table_id, "path": path, "extra": extra,
                                                     **(encode_writes(listed) if encoded is None else encoded)}
                                                    ).decode())
            held_before = tx_id in self._prepared_writes
            # held before the SQL commit, so that no read at or after prepare_ts misses it; undone if
            # the commit does not happen (the database went away: no record, so nothing would ever
            # ask its coordinator, and reads of the table would wait for it forever)
            self._hold(tx_id, table, listed, prepare_ts, keyed)
            # the commit applies these (the durable record is for a restart in between)
            self._prepared_writes.setdefault(tx_id, {})[participant] = (table, writes, keyed, extra)
            on_rollback(conn, lambda: self._unhold(tx_id, participant, held_before))
            self.faults.delay_point("participant_prepare_held")  # (fault tests: the database goes meanwhile)
        self._made_durable(covered)

    def _made_durable(self, through: int) -> None:
        with self._durable_lock:
            self._durable_through = max(self._durable_through, through)

    def durability(self) -> dict[str, Any]:
        """What a coordinator needs to know which relaxed commits here are durable (module docstring)."""
        with self._durable_lock:
            return {"instance": self.instance, "durable_through": self._durable_through}

    def sync(self) -> None:
        """Make every relaxed commit so far durable, if one is not yet: one durable write that changes
        a page (a record written and deleted again in one transaction)."""
        with self._durable_lock:
            if self._durable_through >= self._relaxed_sequence:
                return
        with self.storage.write() as conn:
            covered = self._relaxed_sequence
            _INSERT_PREPARED.run(conn, transaction_id=_SYNC_RECORD, participant="", start_timestamp=0,
                                 prepare_timestamp=0, coordinator="", payload="{}")
            _DELETE_PREPARED.run(conn, transaction_id=_SYNC_RECORD)
        self._made_durable(covered)

    def _hold(self, tx_id: str, table: DynamicTable, writes: list[RowWrite], prepare_ts: int,
              keyed: dict[Any, RowWrite] | None = None) -> None:
        """Take the row locks of a prepared participant and make reads wait for it (writer lock held)."""
        if table.sorted:
            if keyed is None:
                keyed = table.keyed(writes)
            self._lock_table.acquire_many(table.table_id, keyed, tx_id)
        self._inflight.hold_remote(tx_id, table.table_id, prepare_ts)

    def _unhold(self, tx_id: str, participant: str, held_before: bool) -> None:
        """A prepare's SQL transaction rolled back: drop what it held. If other participants of the
        transaction are prepared here (durably), their transaction stays held as a whole (its
        decision releases everything, this participant's row locks too)."""
        if held_before:
            self._prepared_writes.get(tx_id, {}).pop(participant, None)
        else:
            self._release(tx_id)

    def _release(self, tx_id: str) -> None:
        """Drop what :meth:`_hold` took, after the commit's or abort's SQL transaction."""
        self._lock_table.release(tx_id)
        self._prepared_writes.pop(tx_id, None)
        self._inflight.release_remote(tx_id)

    def commit(self, tx_id: str, commit_ts: int, on_apply: ApplyHook | None = None,
               coordinator: str | None = None, relaxed: bool = False) -> int | None:
        """Apply a prepared remote transaction with the coordinator's commit timestamp; ``coordinator``
        (if given) must be the one its prepare named. ``relaxed`` (heeded on SQLite storage): without
        an fsync; its number is returned (None: the commit is durable). A durable commit of a
        transaction no longer prepared here (a resend) makes the relaxed ones before it durable."""
        rows = 0
        what = f"commit timestamp of transaction {tx_id}"
        self.timestamps.check(commit_ts, what, self.config.max_peer_clock_skew)
        relaxed = relaxed and self.storage.is_sqlite
        sequence: int | None = None
        with self.storage.write(durable=not relaxed) as conn:
            records = _PARTICIPANTS.run(conn, transaction_id=tx_id).fetchall()
            _check_coordinator(tx_id, "commit", coordinator, {r[2] for r in records})
            names = [r[0] for r in records]
            prepared_at = max((r[1] for r in records), default=0)
            if commit_ts < prepared_at:
                raise YtError(f"Invalid commit of transaction {tx_id}: its commit timestamp {commit_ts:#x} is before "
                              f"its prepare timestamp {prepared_at:#x}", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"transaction_id": tx_id})
            cached = self._prepared_writes.get(tx_id, {})
            if set(cached) != set(names):
                cached = self._load_prepared(conn, tx_id)
            self.timestamps.observe(commit_ts, self.config.max_peer_clock_skew)
            for name in names:
                if name not in cached:
                    continue  # its table is gone
                table, writes, keyed, extra = cached[name]
                rows += table.apply(conn, writes, commit_ts, extra.get("tablet_index"), keyed)
                if on_apply is not None:
                    on_apply(conn, table, extra | {"commit_timestamp": commit_ts})
            _DELETE_PREPARED.run(conn, transaction_id=tx_id)
            covered = self._relaxed_sequence
            if relaxed:
                sequence = self._relaxed_sequence = covered + 1  # (if this rolls back, the number is unused)
        self._release(tx_id)
        self.metrics.rows_written.inc(rows)
        if relaxed:
            return sequence
        if names:
            self._made_durable(covered)
        else:
            self.sync()  # (a resend: the relaxed commit it repeats must be durable when this answers)
        return None

    def _load_prepared(self, conn: sa.Connection, tx_id: str) -> dict[str, PreparedWrites]:
        """The prepared writes of a transaction, from their durable records (after a restart)."""
        out: dict[str, PreparedWrites] = {}
        for record in conn.execute(sa.select(prepared_table).where(prepared_table.c.transaction_id == tx_id)):
            payload = loads_json(record.payload.encode())
            resolved = self._resolve_table(payload["table_id"])
            if resolved is None:
                continue
            table, _ = resolved
            out[record.participant] = (table, decode_writes(payload), None,
                                       payload["extra"])
        return out

    def abort(self, tx_id: str, coordinator: str | None = None) -> None:
        with self.storage.write() as conn:
            if coordinator is not None:
                records = _PARTICIPANTS.run(conn, transaction_id=tx_id).fetchall()
                _check_coordinator(tx_id, "abort", coordinator, {r[2] for r in records})
            # remembered so that a prepare arriving after its abort (a slow network) is refused
            self._aborted_remote[tx_id] = time.monotonic()
            cutoff = time.monotonic() - 2 * self.config.max_transaction_lifetime
            for old in [t for t, at in self._aborted_remote.items() if at < cutoff]:
                del self._aborted_remote[old]
            conn.execute(prepared_table.delete().where(prepared_table.c.transaction_id == tx_id))
        self._release(tx_id)

    def pending(self, older_than: float) -> list[tuple[str, str]]:
        """Remotely coordinated transactions prepared here for at least ``older_than`` seconds
        (by this process' clock): (transaction id, coordinator)."""
        now = time.monotonic()
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(prepared_table.c.transaction_id, prepared_table.c.coordinator)
                                .where(prepared_table.c.coordinator.is_not(None))).all()
        old = self._inflight.held_longer_than([r[0] for r in rows], older_than, now)
        return [(r[0], r[1]) for r in rows if r[0] in old]

    def mark_stalled(self, tx_id: str, reason: str) -> bool:
        """No decision past the in-doubt bound: reads stop waiting for it (see ``InFlight.mark_stalled``)."""
        return self._inflight.mark_stalled(tx_id, reason)

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> tuple[int, int]:
        """After a restart: abort local prepares (never in doubt), re-hold remote ones.

        Participants on this cluster commit in the same SQL transaction as the coordinator's
        decision record, so a prepare of a locally coordinated transaction that survived a crash
        was never decided: it is aborted. Prepares of transactions coordinated by *another*
        cluster are in doubt until that coordinator answers; they keep their locks meanwhile and
        are resolved by :meth:`pending` and the replication layer.
        Returns (re-held, aborted).
        """
        held = aborted = 0
        with self.storage.write() as conn:
            aborted = conn.execute(prepared_table.delete().where(prepared_table.c.coordinator.is_(None))).rowcount
            records = conn.execute(sa.select(prepared_table)).all()
            invalid: set[str] = set()
            for record in records:
                try:
                    # recorded before prepares were checked: a forged timestamp must not stop the start
                    self.timestamps.check(record.prepare_timestamp, "prepare timestamp",
                                          self.config.max_peer_clock_skew)
                except YtError as exc:
                    if record.transaction_id not in invalid:
                        log.warning("aborted a prepared transaction with an invalid timestamp",
                                    extra={"transaction_id": record.transaction_id,
                                           "coordinator": record.coordinator, "error": exc.message})
                        invalid.add(record.transaction_id)
            for tx_id in invalid:
                conn.execute(prepared_table.delete().where(prepared_table.c.transaction_id == tx_id))
            aborted += len(invalid)
            for record in records:
                if record.transaction_id in invalid:
                    continue
                self.timestamps.observe(record.prepare_timestamp, self.config.max_peer_clock_skew)
                payload = loads_json(record.payload.encode())
                resolved = self._resolve_table(payload["table_id"])
                if resolved is None:
                    continue
                table, _ = resolved
                self._hold(record.transaction_id, table, decode_writes(payload), record.prepare_timestamp)
                held += 1
        return held, aborted

    # -- replicator batches (replica side) ---------------------------------------------------------

    def apply_replicated(self, table: DynamicTable, groups: Sequence[tuple[int, list[RowWrite] | ImageRun]],
                         preserve: bool, tablet_index: int, check: Callable[[sa.Connection], tuple[Any, Any] | None],
                         expected: Any, record: Callable[[sa.Connection, int], None], end: Any,
                         prepare: Callable[[sa.Connection, int, int, list[RowWrite]], list[RowWrite]] | None = None,
                         ) -> dict[str, Any]:
        """Apply a replicator batch if the stored progress is ``expected``, and record ``end``.

        ``prepare(conn, source_ts, commit_ts, writes)``, when given, turns each group's writes
        into the ones to apply, under the writer lock just before they are (XDCR's conflict
        resolution, which must see the rows as this commit will change them).

        Both happen in one SQL transaction: a batch is applied and acknowledged exactly once.
        With ``preserve`` the rows keep the meta-cluster's commit timestamps; without it each
        source commit gets a fresh timestamp of this cluster.
        """
        stamps: list[int] = []
        try:
            with self.storage.write() as conn:
                stored = check(conn)
                if stored is not None and stored[0] != expected:
                    return {"row_index": stored[0], "applied": False}
                last_ts = 0
                rows = 0
                for source_ts, writes in groups:
                    if preserve:
                        self.timestamps.observe(source_ts, self.config.max_peer_clock_skew)
                        self._inflight.adopt(source_ts)
                        ts = source_ts
                    else:
                        ts = self._inflight.begin_commit()
                    stamps.append(ts)
                    if prepare is not None:
                        # (XDCR resolves each change: its batches are writes, never images)
                        assert not isinstance(writes, ImageRun)
                        writes = prepare(conn, source_ts, ts, writes)
                        if not writes:
                            continue
                    rows += table.apply(conn, writes, ts, tablet_index)
                    last_ts = ts
                record(conn, last_ts)
        finally:
            for ts in stamps:
                self._inflight.end_commit(ts)
        self.metrics.rows_written.inc(rows)
        return {"row_index": end, "applied": True}
