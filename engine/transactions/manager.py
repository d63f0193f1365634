"""Tablet transactions (seed 003): snapshot isolation, row locks, two-phase commit, recovery.

A tablet transaction lives in the engine between ``start_transaction`` and ``commit_transaction``
(the HTTP proxy plays the role of YT's client library, which buffers writes). Reads inside it use
its start timestamp; its own writes are invisible to it until commit.

Commit groups the buffered writes by *participant* (one tablet of one table) and then:

* one participant: one-phase commit — conflict checks, commit timestamp and the write happen in
  one SQL transaction under the writer lock (YT also commits single-participant transactions in
  one phase);
* several participants: two-phase commit — each participant *prepares* (checks conflicts, takes
  row locks in the lock table, writes a durable prepare record with the write set), the
  coordinator durably records its *commit decision* with the commit timestamp, and the
  participants apply the writes and drop their prepare records. After a crash, prepared
  participants with a decision are committed from their records and those without one are
  aborted (presumed abort), so a transaction is either wholly visible or not at all.

Visibility: a reader at timestamp T must see every commit with a smaller timestamp. A commit
timestamp is registered as *in flight* at the moment it is generated, and readers at T >= it wait
until it is applied (``wait_visible``), which closes the window between "timestamp chosen" and
"rows written".
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa

from ..errors import ErrorCode, LockConflict, NoSuchTransaction, YtError
from ..faults import NO_FAULTS, Faults
from ..httpconn import dumps_json, loads_json
from ..metrics import EngineMetrics
from ..storage import FastStatement, Storage, commits_table, prepared_table
from ..tablets import DynamicTable, RowWrite, WriteKind, decode_writes, encode_writes
from ..timestamps import COUNTER_BITS, TimestampProvider

#: seed 003: "Transactions must be short (the default limit is 1 minute)"
MAX_TRANSACTION_LIFETIME = 60.0
#: seed 003: "Transactions must write a limited amount of data (the default limit is 100,000 rows)"
MAX_ROWS_PER_TRANSACTION = 100_000
# the statements on the latency path of every sync replica commit (storage.FastStatement)
_INSERT_DECISION = FastStatement.insert(commits_table)
_DELETE_DECISION = FastStatement.delete(commits_table, "transaction_id")
_INSERT_PREPARED = FastStatement.insert(prepared_table)
_FIND_PREPARED = FastStatement.select(prepared_table, ("transaction_id",), "transaction_id", "participant")
_PARTICIPANTS = FastStatement.select(prepared_table, ("participant",), "transaction_id")
_DELETE_PREPARED = FastStatement.delete(prepared_table, "transaction_id")

#: how long a prepare waits for rows locked by a transaction prepared here by another coordinator
#: (committed, most likely, its decision on the way) before it reports a conflict
REMOTE_LOCK_WAIT = 1.0
#: seed 003: client_timestamp_threshold, one minute by default
CLIENT_TIMESTAMP_THRESHOLD = 60.0

ATOMIC_TX_TYPE = 0x2
NON_ATOMIC_TX_TYPE = 0x3


class Atomicity(StrEnum):
    FULL = "full"
    NONE = "none"


class Durability(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class TxState(StrEnum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


def make_object_id(object_type: int, counter: int = 0) -> str:
    """A YT-shaped object id ``a-b-c-d`` whose third part carries the object type."""
    raw = uuid.uuid4().int
    return f"{(raw >> 96) & 0xFFFFFFFF:x}-{(raw >> 64) & 0xFFFFFFFF:x}-{((counter & 0xFFFF) << 16) | object_type:x}-" \
           f"{raw & 0xFFFFFFFF:x}"


@dataclass
class Participant:
    """One tablet of one table taking part in a commit."""

    table: DynamicTable
    path: str
    tablet_index: int
    writes: list[RowWrite]
    #: the same writes by key (sorted tables), when the caller has them at hand
    keyed: dict[Any, RowWrite] | None = None

    @property
    def name(self) -> str:
        return f"{self.table.table_id}:{self.tablet_index}"


@dataclass
class RemoteParticipant:
    """A sync replica of a replicated table's tablet: written inside the same commit."""

    cluster: str
    replica_id: str
    replica_path: str
    #: the meta-cluster tablet whose writes this replica receives
    tablet_index: int
    meta_table_id: str
    writes: list[RowWrite]
    #: the replica's row index in the replication queue after this commit (set at apply)
    row_index: int = 0

    @property
    def name(self) -> str:
        return f"{self.cluster}/{self.replica_id}/{self.tablet_index}"

    def progress(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "tablet_index": self.tablet_index, "row_index": self.row_index}


def commit_messages(tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> list[dict[str, Any]]:
    """One commit message per cluster, with the queue progress of each of its participants."""
    by_cluster: dict[str, dict[str, Any]] = {}
    for rp in remote:
        message = by_cluster.setdefault(rp.cluster, {"cluster": rp.cluster, "transaction_id": tx_id,
                                                     "commit_timestamp": commit_ts, "progress": []})
        message["progress"].append(rp.progress())
    return list(by_cluster.values())


#: called inside the participant's commit with (connection, table, prepare extras + commit_timestamp)
ApplyHook = Callable[[sa.Connection, DynamicTable, dict[str, Any]], None]


class ReplicationHooks(Protocol):
    """What the commit path needs from the replication layer (see ``replication.py``)."""

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]: ...

    def prepare_remote(self, tx: TabletTransaction, remote: list[RemoteParticipant],
                       prepare_ts: int) -> list[RemoteParticipant]: ...

    def abort_remote(self, tx_id: str, remote: list[RemoteParticipant]) -> None: ...

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> None: ...

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None: ...


@dataclass
class TabletTransaction:
    id: str
    start_timestamp: int
    atomicity: Atomicity
    durability: Durability
    started_at: float
    timeout: float
    state: TxState = TxState.ACTIVE
    #: (table_id, tablet) -> key or row position -> merged write, in arrival order
    writes: dict[tuple[str, int], dict[Any, RowWrite]] = field(default_factory=dict)
    tables: dict[str, tuple[DynamicTable, str]] = field(default_factory=dict)
    row_count: int = 0
    #: per table id: the last ``require_sync_replica`` given for writes to it
    require_sync_replica: dict[str, bool] = field(default_factory=dict)
    last_ping: float = 0.0
    commit_timestamp: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check_active(self) -> None:
        if self.state is not TxState.ACTIVE:
            raise YtError(f"Transaction {self.id} is {self.state.value}, cannot use it",
                          code=ErrorCode.INVALID_TRANSACTION_STATE)
        if time.monotonic() - self.started_at > MAX_TRANSACTION_LIFETIME:
            raise YtError(f"Transaction {self.id} has exceeded the maximum lifetime of "
                          f"{MAX_TRANSACTION_LIFETIME:.0f} s and can no longer be used",
                          code=ErrorCode.INVALID_TRANSACTION_STATE)

    def add_many(self, table: DynamicTable, path: str, writes: list[tuple[int, RowWrite]]) -> None:
        """Buffer a batch of writes of one table (the hot path of insert_rows)."""
        if self.row_count + len(writes) > MAX_ROWS_PER_TRANSACTION:
            raise YtError(f"Transaction {self.id} exceeds the limit of {MAX_ROWS_PER_TRANSACTION} rows",
                          code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION,
                          attributes={"limit": MAX_ROWS_PER_TRANSACTION})
        self.row_count += len(writes)
        self.tables[table.table_id] = (table, path)
        buckets = self.writes
        key_of = table.key_of
        last_tablet, bucket = -1, {}
        for tablet, write in writes:
            if tablet != last_tablet:
                bucket = buckets.get((table.table_id, tablet))
                if bucket is None:
                    bucket = buckets[(table.table_id, tablet)] = {}
                last_tablet = tablet
            if not table.sorted:
                bucket[len(bucket)] = write
                continue
            key = key_of(write.row)
            prev = bucket.get(key)
            bucket[key] = write if prev is None else _merge(prev, write)

    def add(self, table: DynamicTable, path: str, tablet: int, write: RowWrite) -> None:
        """Buffer a write, merging it with earlier writes of the same key (last one wins)."""
        if self.row_count >= MAX_ROWS_PER_TRANSACTION:
            raise YtError(f"Transaction {self.id} exceeds the limit of {MAX_ROWS_PER_TRANSACTION} rows",
                          code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION,
                          attributes={"limit": MAX_ROWS_PER_TRANSACTION})
        self.row_count += 1
        self.tables[table.table_id] = (table, path)
        bucket = self.writes.setdefault((table.table_id, tablet), {})
        if not table.sorted:
            bucket[len(bucket)] = write
            return
        key = table.key_of(write.row)
        prev = bucket.get(key)
        bucket[key] = _merge(prev, write) if prev is not None else write


def _merge(prev: RowWrite, new: RowWrite) -> RowWrite:
    if new.kind is WriteKind.LOCK:
        if prev.kind is WriteKind.LOCK:
            return RowWrite(WriteKind.LOCK, new.row, prev.mask | new.mask,
                            shared=prev.shared and new.shared, strong=prev.strong or new.strong)
        prev.mask |= new.mask
        return prev
    mask = prev.mask | new.mask
    if new.kind is WriteKind.WRITE and new.update and prev.kind is WriteKind.WRITE:
        return RowWrite(WriteKind.WRITE, {**prev.row, **new.row}, mask, update=prev.update)
    if new.kind is WriteKind.WRITE and new.update and prev.kind is WriteKind.DELETE:
        return RowWrite(WriteKind.WRITE, new.row, mask, update=False)
    return RowWrite(new.kind, new.row, mask, update=new.update)


class _LockHolder(NamedTuple):
    transaction_id: str
    mask: int
    shared: bool


class LockTable:
    """Row locks held by prepared (not yet committed) transactions."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, tuple[Any, ...]], list[_LockHolder]] = defaultdict(list)
        #: the keys each transaction holds, so that a release touches only those
        self._by_tx: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
        #: locks are taken under the storage writer, but released outside it (after a commit)
        self._mutex = threading.Lock()

    def __bool__(self) -> bool:
        """Whether any lock is held (most commits find none and skip the per-key checks)."""
        return bool(self._locks)

    def holders(self, table_id: str, keys: Iterable[tuple[Any, ...]], tx_id: str) -> set[str]:
        """The other transactions holding locks on any of ``keys``."""
        found: set[str] = set()
        if not self._locks:
            return found
        with self._mutex:
            for key in keys:
                for holder in self._locks.get((table_id, key), ()):
                    if holder.transaction_id != tx_id:
                        found.add(holder.transaction_id)
        return found

    def conflict(self, table_id: str, key: tuple[Any, ...], write: RowWrite, tx_id: str) -> str | None:
        with self._mutex:
            holders = list(self._locks.get((table_id, key), ()))
        for holder in holders:
            if holder.transaction_id == tx_id:
                continue
            if holder.shared and write.kind is WriteKind.LOCK and write.shared:
                continue
            if holder.mask & write.mask or (holder.mask & 1) or (write.mask & 1):
                return holder.transaction_id
        return None

    def acquire(self, table_id: str, key: tuple[Any, ...], write: RowWrite, tx_id: str) -> None:
        shared = write.kind is WriteKind.LOCK and write.shared
        with self._mutex:
            self._locks[(table_id, key)].append(_LockHolder(tx_id, write.mask, shared))
            self._by_tx.setdefault(tx_id, []).append((table_id, key))

    def acquire_many(self, table_id: str, keyed: dict[Any, RowWrite], tx_id: str) -> None:
        locks = self._locks
        with self._mutex:
            held = self._by_tx.setdefault(tx_id, [])
            for key, write in keyed.items():
                lock_key = (table_id, key)
                locks[lock_key].append(_LockHolder(tx_id, write.mask, write.kind is WriteKind.LOCK and write.shared))
                held.append(lock_key)

    def release(self, tx_id: str) -> None:
        with self._mutex:
            for lock_key in self._by_tx.pop(tx_id, ()):
                holders = self._locks.get(lock_key)
                if holders is None:
                    continue
                holders = [h for h in holders if h.transaction_id != tx_id]
                if holders:
                    self._locks[lock_key] = holders
                else:
                    del self._locks[lock_key]


class TransactionManager:
    def __init__(self, storage: Storage, timestamps: TimestampProvider,
                 resolve_table: Callable[[str], tuple[DynamicTable, str] | None],
                 metrics: EngineMetrics | None = None, faults: Faults = NO_FAULTS) -> None:
        self.storage = storage
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self.faults = faults
        self.timestamps = timestamps
        self._resolve_table = resolve_table
        self._transactions: dict[str, TabletTransaction] = {}
        self._lock_table = LockTable()
        self._lock = threading.Lock()
        self._inflight: set[int] = set()
        self._inflight_cond = threading.Condition()
        #: transactions coordinated elsewhere, prepared here: id -> prepare timestamp
        self._remote_prepared: dict[str, int] = {}
        #: when each of them was prepared (or re-held after a restart), by this process' clock
        self._remote_held_since: dict[str, float] = {}
        #: writes of remotely coordinated transactions prepared here: id -> participant ->
        #: (table, writes, writes by key, extra); what their commit applies
        self._prepared_writes: dict[str, dict[str, tuple[DynamicTable, list[RowWrite], dict[Any, RowWrite] | None,
                                                         dict[str, Any]]]] = {}
        #: the tables each of them wrote here
        self._remote_tables: dict[str, set[str]] = {}
        #: remotely coordinated transactions aborted here recently: id -> when (monotonic)
        self._aborted_remote: dict[str, float] = {}
        self.replication: ReplicationHooks | None = None

    # -- timestamps and visibility -----------------------------------------------------------------

    def _begin_commit_timestamp(self, at_least: int = 0) -> int:
        with self._inflight_cond:
            ts = self.timestamps.generate()
            if at_least > ts:
                self.timestamps.observe(at_least)
                ts = at_least
            self._inflight.add(ts)
            return ts

    def _end_commit_timestamp(self, ts: int) -> None:
        with self._inflight_cond:
            self._inflight.discard(ts)
            self._inflight_cond.notify_all()

    def wait_visible(self, ts: int, timeout: float = 10.0) -> None:
        """Block until no commit with a timestamp <= ``ts`` is still being applied."""
        deadline = time.monotonic() + timeout
        with self._inflight_cond:
            # a prepared remote transaction may still commit with a timestamp <= ts
            while any(t <= ts for t in self._inflight) or any(t <= ts for t in self._remote_prepared.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise YtError(f"Timed out waiting for commits before timestamp {ts:x} to be applied",
                                  code=ErrorCode.TIMEOUT)
                self._inflight_cond.wait(remaining)

    def has_remote_prepared(self, table_id: str) -> bool:
        """Whether a transaction coordinated elsewhere holds prepared writes to this table."""
        tables = self._remote_tables
        return bool(tables) and any(table_id in t for t in list(tables.values()))

    def wait_prepared_writes(self, table_id: str, timeout: float = 10.0) -> None:
        """Before a read of the latest data: wait for the transactions prepared here (by another
        cluster's coordinator) that had written this table when the read began.

        A coordinator acknowledges a commit once its decision is durable, and tells the participants
        after; a sync replica must still show every acknowledged commit to a read (seed 002, "reading
        without specifying a timestamp ... visibility of data from all committed transactions is
        guaranteed"), so such a read waits for those few in flight, as YT's reads wait for rows
        locked by a prepared transaction."""
        if not self._remote_tables:
            return
        deadline = time.monotonic() + timeout
        with self._inflight_cond:
            pending = {tx for tx, tables in self._remote_tables.items() if table_id in tables}
            while pending & self._remote_tables.keys():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise YtError(f"Timed out waiting for prepared transactions {sorted(pending)} to be "
                                  "committed or aborted by their coordinator", code=ErrorCode.TIMEOUT)
                self._inflight_cond.wait(remaining)

    def _wait_remote_locks(self, table: DynamicTable, keys: Iterable[tuple[Any, ...]], tx_id: str,
                           timeout: float) -> None:
        """Let the transactions prepared here by other coordinators that lock these keys finish
        (their decision is usually on its way) before a new prepare checks its conflicts."""
        if not self._lock_table:
            return
        keys = list(keys)
        deadline = time.monotonic() + timeout
        with self._inflight_cond:
            while True:
                waiting = self._lock_table.holders(table.table_id, keys, tx_id) & self._remote_prepared.keys()
                remaining = deadline - time.monotonic()
                if not waiting or remaining <= 0:
                    return  # the conflict check reports a holder still there
                self._inflight_cond.wait(remaining)

    def oldest_active_start_timestamp(self) -> int | None:
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
        tx = TabletTransaction(id=make_object_id(tx_type), start_timestamp=start_ts, atomicity=atomicity,
                               durability=durability, started_at=now,
                               timeout=min(timeout or MAX_TRANSACTION_LIFETIME, MAX_TRANSACTION_LIFETIME),
                               last_ping=now)
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
                now - t.started_at > MAX_TRANSACTION_LIFETIME or now - t.last_ping > t.timeout)]
        for tx in stale:
            tx.state = TxState.ABORTED
            self._forget(tx)
        return len(stale)

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
                                     keyed=bucket if table.sorted else None))
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
            if self.replication is None:
                raise YtError("Replication is not available on this cluster", code=ErrorCode.INVALID_PARAMETER)
            for part in replicated:
                remote.extend(self.replication.sync_participants(
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

    def _check(self, conn: sa.Connection, tx_id: str, start_ts: int, table: DynamicTable, path: str,
               writes: list[RowWrite], keyed: dict[Any, RowWrite] | None = None) -> None:
        if not table.sorted or table.replicated:
            return
        if keyed is None:
            keyed = {table.key_of(w.row): w for w in writes}
        if self._lock_table:
            for key, write in keyed.items():
                holder = self._lock_table.conflict(table.table_id, key, write, tx_id)
                if holder is not None:
                    raise self._conflict_error(tx_id, start_ts, path, key, f"a lock held by transaction {holder}")
        found = table.find_conflicts(conn, keyed, start_ts)
        if found is not None:
            raise self._conflict_error(tx_id, start_ts, path, found[0], found[1])

    def _conflict_error(self, tx_id: str, start_ts: int, path: str, key: tuple[Any, ...], why: str) -> LockConflict:
        self.metrics.conflicts.inc()
        return LockConflict(
            f"Row lock conflict due to concurrent write: transaction {tx_id} conflicts on key "
            f"{list(key)} of table {path} with {why}",
            attributes={"transaction_id": tx_id, "path": path, "key": list(key), "start_timestamp": start_ts})

    def _commit_one_phase(self, tx: TabletTransaction, part: Participant) -> int:
        ts = 0
        try:
            with self.storage.write() as conn:
                self._check(conn, tx.id, tx.start_timestamp, part.table, part.path, part.writes, part.keyed)
                ts = self._begin_commit_timestamp()
                rows = part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
                if part.table.replicated:
                    assert self.replication is not None
                    self.replication.after_queue_append(conn, part, ts, [])
        finally:
            if ts:
                self._end_commit_timestamp(ts)
        self.metrics.rows_written.inc(rows)
        self.metrics.commits.labels(kind="one_phase").inc()
        return ts

    def _commit_non_atomic(self, tx: TabletTransaction, parts: list[Participant]) -> int:
        server_ts = self.timestamps.generate()
        drift = abs((server_ts >> COUNTER_BITS) - (tx.start_timestamp >> COUNTER_BITS))
        if drift > CLIENT_TIMESTAMP_THRESHOLD:
            raise YtError("Transaction timestamp is off limits, check the local clock readings",
                          code=ErrorCode.INVALID_PARAMETER,
                          attributes={"client_timestamp": tx.start_timestamp, "server_timestamp": server_ts})
        ts = 0
        rows = 0
        try:
            with self.storage.write(durable=tx.durability is Durability.SYNC) as conn:
                ts = self._begin_commit_timestamp(at_least=tx.start_timestamp)
                for part in parts:
                    rows += part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
        finally:
            if ts:
                self._end_commit_timestamp(ts)
        self.metrics.rows_written.inc(rows)
        self.metrics.commits.labels(kind="non_atomic").inc()
        return ts

    def _commit_two_phase(self, tx: TabletTransaction, parts: list[Participant],
                          remote: list[RemoteParticipant]) -> int:
        """Prepare everyone, then commit: local participants atomically with the decision record."""
        prepare_ts = self.timestamps.generate()
        prepared_remote: list[RemoteParticipant] = []
        try:
            if remote:
                assert self.replication is not None
                prepared_remote = self.replication.prepare_remote(tx, remote, prepare_ts)
            for part in parts:
                if part.table.replicated or not part.table.sorted:
                    continue  # nothing to check or lock: sync replicas did it, ordered tables have no keys
                with self.storage.write() as conn:
                    self._check(conn, tx.id, tx.start_timestamp, part.table, part.path, part.writes, part.keyed)
                    if part.table.sorted and not part.table.replicated:
                        keyed = part.keyed if part.keyed is not None else {
                            part.table.key_of(w.row): w for w in part.writes}
                        self._lock_table.acquire_many(part.table.table_id, keyed, tx.id)
            self.faults.crash_point("after_prepare")
        except BaseException:
            self._lock_table.release(tx.id)
            if prepared_remote:
                assert self.replication is not None
                self.replication.abort_remote(tx.id, prepared_remote)
            raise
        ts = 0
        rows = 0
        try:
            with self.storage.write() as conn:
                ts = self._begin_commit_timestamp()
                for part in parts:
                    rows += part.table.apply(conn, part.writes, ts, part.tablet_index, part.keyed)
                    if part.table.replicated:
                        assert self.replication is not None
                        self.replication.after_queue_append(conn, part, ts, remote)
                if remote:
                    _INSERT_DECISION.run(conn, transaction_id=tx.id, commit_timestamp=ts,
                                         participants=json.dumps(commit_messages(tx.id, ts, remote)))
            self.faults.crash_point("after_commit_decision")
        finally:
            self._lock_table.release(tx.id)
            if ts:
                self._end_commit_timestamp(ts)
        if remote:
            assert self.replication is not None
            self.replication.commit_remote(tx.id, ts, remote)
        self.metrics.rows_written.inc(rows)
        self.metrics.commits.labels(kind="two_phase").inc()
        return ts

    # -- the participant side of a transaction coordinated by another cluster ----------------------

    def prepare_participant(self, tx_id: str, coordinator: str, table: DynamicTable, path: str,
                            writes: list[RowWrite], start_ts: int, prepare_ts: int, extra: dict[str, Any],
                            participant: str | None = None) -> None:
        """Durably prepare writes of a transaction coordinated elsewhere (a sync replica write).

        ``participant`` names this part of the transaction (one replica table may receive the rows
        of several tablets of the replicated table, each its own participant); a repeated prepare
        of the same participant is a no-op.
        """
        participant = participant or table.table_id
        keyed = {table.key_of(w.row): w for w in writes} if table.sorted else None
        if keyed:
            self._wait_remote_locks(table, keyed, tx_id, REMOTE_LOCK_WAIT)
        with self.storage.write() as conn:
            if tx_id in self._aborted_remote:
                raise YtError(f"Transaction {tx_id} was already aborted by its coordinator {coordinator}",
                              code=ErrorCode.INVALID_TRANSACTION_STATE, attributes={"transaction_id": tx_id})
            if _FIND_PREPARED.run(conn, transaction_id=tx_id, participant=participant).fetchone():
                return
            table.check_writable(path)
            self._check(conn, tx_id, start_ts, table, path, writes, keyed)
            _INSERT_PREPARED.run(conn, transaction_id=tx_id, participant=participant, start_timestamp=start_ts,
                                 prepare_timestamp=prepare_ts, coordinator=coordinator,
                                 payload=dumps_json({"table_id": table.table_id, "path": path, "extra": extra,
                                                     **encode_writes(writes)}).decode())
            self._hold_remote(tx_id, table, writes, prepare_ts, keyed)
            # the commit applies these (the durable record is for a restart in between)
            self._prepared_writes.setdefault(tx_id, {})[participant] = (table, writes, keyed, extra)

    def _hold_remote(self, tx_id: str, table: DynamicTable, writes: list[RowWrite], prepare_ts: int,
                     keyed: dict[Any, RowWrite] | None = None) -> None:
        if table.sorted:
            if keyed is None:
                keyed = {table.key_of(w.row): w for w in writes}
            self._lock_table.acquire_many(table.table_id, keyed, tx_id)
        with self._inflight_cond:
            self._remote_prepared[tx_id] = prepare_ts
            self._remote_held_since.setdefault(tx_id, time.monotonic())
            self._remote_tables.setdefault(tx_id, set()).add(table.table_id)

    def _release_remote(self, tx_id: str) -> None:
        self._lock_table.release(tx_id)
        self._prepared_writes.pop(tx_id, None)
        with self._inflight_cond:
            self._remote_prepared.pop(tx_id, None)
            self._remote_held_since.pop(tx_id, None)
            self._remote_tables.pop(tx_id, None)
            self._inflight_cond.notify_all()

    def commit_participant(self, tx_id: str, commit_ts: int, on_apply: ApplyHook | None = None) -> bool:
        """Apply a prepared remote transaction with the coordinator's commit timestamp."""
        rows = 0
        with self.storage.write() as conn:
            names = [r[0] for r in _PARTICIPANTS.run(conn, transaction_id=tx_id).fetchall()]
            cached = self._prepared_writes.get(tx_id, {})
            if set(cached) != set(names):
                cached = self._load_prepared(conn, tx_id)
            self.timestamps.observe(commit_ts)
            for name in names:
                if name not in cached:
                    continue  # its table is gone
                table, writes, keyed, extra = cached[name]
                rows += table.apply(conn, writes, commit_ts, extra.get("tablet_index"), keyed)
                if on_apply is not None:
                    on_apply(conn, table, extra | {"commit_timestamp": commit_ts})
            _DELETE_PREPARED.run(conn, transaction_id=tx_id)
        self._release_remote(tx_id)
        self.metrics.rows_written.inc(rows)
        return bool(names)

    def _load_prepared(self, conn: sa.Connection, tx_id: str) -> dict[str, tuple[DynamicTable, list[RowWrite],
                                                                                   dict[Any, RowWrite] | None,
                                                                                   dict[str, Any]]]:
        """The prepared writes of a transaction, from their durable records (after a restart)."""
        out = {}
        for record in conn.execute(sa.select(prepared_table).where(prepared_table.c.transaction_id == tx_id)):
            payload = loads_json(record.payload.encode())
            resolved = self._resolve_table(payload["table_id"])
            if resolved is None:
                continue
            table, _ = resolved
            out[record.participant] = (table, decode_writes(payload), None,
                                       payload["extra"])
        return out

    def abort_participant(self, tx_id: str) -> None:
        with self.storage.write() as conn:
            # remembered so that a prepare arriving after its abort (a slow network) is refused
            self._aborted_remote[tx_id] = time.monotonic()
            cutoff = time.monotonic() - 2 * MAX_TRANSACTION_LIFETIME
            for old in [t for t, at in self._aborted_remote.items() if at < cutoff]:
                del self._aborted_remote[old]
            conn.execute(prepared_table.delete().where(prepared_table.c.transaction_id == tx_id))
        self._release_remote(tx_id)

    def pending_participants(self, older_than: float) -> list[tuple[str, str]]:
        """Remotely coordinated transactions prepared here for at least ``older_than`` seconds
        (by this process' clock): (transaction id, coordinator)."""
        now = time.monotonic()
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(prepared_table.c.transaction_id, prepared_table.c.coordinator)
                                .where(prepared_table.c.coordinator.is_not(None))).all()
        with self._inflight_cond:
            return [(r[0], r[1]) for r in rows if now - self._remote_held_since.get(r[0], now) >= older_than]

    # -- the coordinator side --------------------------------------------------------------------------

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
        before = self.timestamps.last - (int(older_than * 1000) << COUNTER_BITS) // 1000
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(commits_table).where(commits_table.c.commit_timestamp <= before)).all()
        return [(r.transaction_id, r.commit_timestamp, json.loads(r.participants)) for r in rows]

    def forget_decision(self, tx_id: str, remaining: list[dict[str, Any]]) -> None:
        # no fsync: a forgetting lost in a crash only makes the commit be sent again, which is a no-op
        with self.storage.write(durable=False) as conn:
            if remaining:
                conn.execute(commits_table.update().where(commits_table.c.transaction_id == tx_id)
                             .values(participants=json.dumps(remaining)))
            else:
                _DELETE_DECISION.run(conn, transaction_id=tx_id)

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> tuple[int, int]:
        """After a restart: abort local prepares (never in doubt), re-hold remote ones.

        Participants on this cluster commit in the same SQL transaction as the coordinator's
        decision record, so a prepare of a locally coordinated transaction that survived a crash
        was never decided: it is aborted. Prepares of transactions coordinated by *another*
        cluster are in doubt until that coordinator answers; they keep their locks meanwhile and
        are resolved by :meth:`pending_participants` and the replication layer.
        Returns (re-held, aborted).
        """
        held = aborted = 0
        with self.storage.write() as conn:
            aborted = conn.execute(prepared_table.delete().where(prepared_table.c.coordinator.is_(None))).rowcount
            for record in conn.execute(sa.select(prepared_table)).all():
                payload = loads_json(record.payload.encode())
                resolved = self._resolve_table(payload["table_id"])
                if resolved is None:
                    continue
                table, _ = resolved
                self.timestamps.observe(record.prepare_timestamp)
                self._hold_remote(record.transaction_id, table,
                                  decode_writes(payload), record.prepare_timestamp)
                held += 1
        return held, aborted

    # -- replicator batches (replica side) ---------------------------------------------------------

    def apply_replicated(self, table: DynamicTable, groups: list[tuple[int, list[RowWrite]]], preserve: bool,
                         tablet_index: int, check: Callable[[sa.Connection], tuple[int, int] | None],
                         expected: int, record: Callable[[sa.Connection, int], None], end: int) -> dict[str, Any]:
        """Apply a replicator batch if the stored progress is ``expected``, and record ``end``.

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
                        self.timestamps.observe(source_ts)
                        with self._inflight_cond:
                            self._inflight.add(source_ts)
                        ts = source_ts
                    else:
                        ts = self._begin_commit_timestamp()
                    stamps.append(ts)
                    rows += table.apply(conn, writes, ts, tablet_index)
                    last_ts = ts
                record(conn, last_ts)
        finally:
            for ts in stamps:
                self._end_commit_timestamp(ts)
        self.metrics.rows_written.inc(rows)
        return {"row_index": end, "applied": True}
