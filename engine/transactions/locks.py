"""Row locks of prepared transactions, and the conflict check every commit and prepare runs.

Seed 003's conflict rule has two halves: a write conflicts with a *committed* write after the
transaction's start timestamp (the table's history: ``DynamicTable.find_conflicts``) and with a
lock held by a *prepared* transaction that has not committed yet (this lock table). Both the
coordinator's commit paths and the participant side of a remotely coordinated transaction run
the same check, so it lives here, beside the locks it reads, rather than in either of them.

Locking: ``LockTable._mutex`` guards the lock maps and is a leaf: nothing is taken while it is
held. Locks are acquired under ``Storage.write_lock`` (in the SQL transaction that checks
conflicts) and released outside it (after a commit or abort); the transaction layer also reads
:meth:`LockTable.holders` while holding ``InFlight.cond``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..errors import LockConflict
from ..metrics import EngineMetrics
from ..tablets import DynamicTable, RowWrite, WriteKind


class _LockHolder(NamedTuple):
    transaction_id: str
    mask: int
    shared: bool


class LockTable:
    """Row locks held by prepared (not yet committed) transactions."""

    def __init__(self) -> None:
        #: (table id, key) -> holders. Guarded by ``_mutex`` (read without it only as a hint: is
        #: anything locked at all?)
        self._locks: dict[tuple[str, tuple[Any, ...]], list[_LockHolder]] = defaultdict(list)
        #: the keys each transaction holds, so that a release touches only those. Guarded by ``_mutex``
        self._by_tx: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
        #: guards _locks and _by_tx; a leaf lock. Needed although locks are taken under the storage
        #: writer lock: they are released outside it (after a commit) and read under InFlight.cond
        self._mutex = threading.Lock()

    def __bool__(self) -> bool:
        """Whether any lock is held (most commits find none and skip the per-key checks).

        Read without the mutex: a hint. A False is exact for a caller holding the writer lock,
        since locks are only ever added under it (they are released outside it)."""
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
        lock = WriteKind.LOCK
        # (a sync batch locks up to 100,000 keys: one holder per distinct mode, shared by its keys -
        # holders are immutable - and the keys' list extended at once)
        made: dict[tuple[int, bool], _LockHolder] = {}
        lock_keys = [(table_id, key) for key in keyed]
        with self._mutex:
            for lock_key, write in zip(lock_keys, keyed.values(), strict=True):
                mode = (write.mask, write.kind is lock and write.shared)
                holder = made.get(mode)
                if holder is None:
                    holder = made[mode] = _LockHolder(tx_id, *mode)
                locks[lock_key].append(holder)
            self._by_tx.setdefault(tx_id, []).extend(lock_keys)

    def release(self, tx_id: str) -> None:
        locks = self._locks
        with self._mutex:
            for lock_key in self._by_tx.pop(tx_id, ()):
                holders = locks.get(lock_key)
                if holders is None:
                    continue
                if len(holders) == 1 and holders[0].transaction_id == tx_id:
                    del locks[lock_key]  # (the usual case: the key's only holder, no list to make)
                    continue
                holders = [h for h in holders if h.transaction_id != tx_id]
                if holders:
                    locks[lock_key] = holders
                else:
                    del locks[lock_key]


def check_conflicts(conn: sa.Connection, lock_table: LockTable, metrics: EngineMetrics, tx_id: str, start_ts: int,
                    table: DynamicTable, path: str, writes: list[RowWrite],
                    keyed: dict[Any, RowWrite] | None = None) -> None:
    """Raise ``LockConflict`` if ``writes`` conflict with a prepared transaction's row lock or
    with a commit after ``start_ts`` (seed 003). Runs under ``Storage.write_lock``, in the SQL
    transaction that then takes the locks or applies the writes."""
    if not table.sorted or table.replicated:
        return
    if keyed is None:
        keyed = table.keyed(writes)
    if lock_table:
        for key, write in keyed.items():
            holder = lock_table.conflict(table.table_id, key, write, tx_id)
            if holder is not None:
                raise _conflict_error(metrics, tx_id, start_ts, path, key, f"a lock held by transaction {holder}")
    found = table.find_conflicts(conn, keyed, start_ts)
    if found is not None:
        raise _conflict_error(metrics, tx_id, start_ts, path, found[0], found[1])


def _conflict_error(metrics: EngineMetrics, tx_id: str, start_ts: int, path: str, key: tuple[Any, ...],
                    why: str) -> LockConflict:
    metrics.conflicts.inc()
    return LockConflict(
        f"Row lock conflict due to concurrent write: transaction {tx_id} conflicts on key "
        f"{list(key)} of table {path} with {why}",
        attributes={"transaction_id": tx_id, "path": path, "key": list(key), "start_timestamp": start_ts})
