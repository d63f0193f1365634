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
from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..errors import LockConflict
from ..metrics import EngineMetrics
from ..tablets import DynamicTable, RowWrite, WriteKind


class _LockHolder(NamedTuple):
    transaction_id: str
    mask: int
    shared: bool


#: a lock mode: (lock groups, shared)
_MODE = attrgetter("mask", "kind", "shared")


class LockTable:
    """Row locks held by prepared (not yet committed) transactions.

    A sync replica's prepare locks a batch of up to 100,000 keys, and its commit releases them:
    per table a map key -> holders (a tuple, shared by every key a prepare locked in one mode), so
    that locking a batch of keys nobody holds and releasing them again are a few passes in C, not a
    loop of Python per key (which were about a third of a sync replica's time in the sync + async
    case of replication_vs_pg, benchmarks/README.md)."""

    def __init__(self) -> None:
        #: table id -> key -> its holders. A table without locks has no entry (so that the map is
        #: empty when nothing is locked). Guarded by ``_mutex`` (read without it only as a hint:
        #: is anything locked at all?)
        self._locks: dict[str, dict[tuple[Any, ...], tuple[_LockHolder, ...]]] = {}
        #: the keys each transaction locked, per acquire: (table id, keys, the holders tuple they
        #: were given when the keys were free), so that a release touches only those. Guarded by ``_mutex``
        self._by_tx: dict[str, list[tuple[str, list[tuple[Any, ...]], tuple[_LockHolder, ...] | None]]] = {}
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
            table_locks = self._locks.get(table_id)
            if table_locks is None:
                return found
            for key in table_locks.keys() & keys:  # (the keys locked at all: a set operation in C)
                for holder in table_locks[key]:
                    if holder.transaction_id != tx_id:
                        found.add(holder.transaction_id)
        return found

    def conflict(self, table_id: str, keyed: dict[Any, RowWrite], tx_id: str) -> tuple[tuple[Any, ...], str] | None:
        """The first of ``keyed``'s keys (in their order) locked by another transaction in a mode its
        write conflicts with, and that transaction; None if none is."""
        with self._mutex:
            table_locks = self._locks.get(table_id)
            if table_locks is None:
                return None
            locked = {key: table_locks[key] for key in table_locks.keys() & keyed.keys()}
        if not locked:
            return None  # (the usual case, also while other prepares hold other keys)
        for key, write in keyed.items():
            for holder in locked.get(key, ()):
                if holder.transaction_id == tx_id:
                    continue
                if holder.shared and write.kind is WriteKind.LOCK and write.shared:
                    continue
                if holder.mask & write.mask or (holder.mask & 1) or (write.mask & 1):
                    return key, holder.transaction_id
        return None

    def acquire_many(self, table_id: str, keyed: dict[Any, RowWrite], tx_id: str) -> None:
        if not keyed:
            return
        writes = list(keyed.values())
        first = writes[0]
        # one lock mode for every key (the usual batch: one write object shared by its keys, or
        # writes of one kind and mask): one holders tuple for all of them
        one_mode = sum(map(is_, writes, repeat(first))) == len(writes) or len(set(map(_MODE, writes))) == 1
        keys = list(keyed)
        with self._mutex:
            table_locks = self._locks.setdefault(table_id, {})
            if one_mode:
                mine = (_LockHolder(tx_id, first.mask, first.kind is WriteKind.LOCK and first.shared),)
                if table_locks.keys().isdisjoint(keys):
                    table_locks.update(dict.fromkeys(keys, mine))
                    self._by_tx.setdefault(tx_id, []).append((table_id, keys, mine))
                    return
                for key in keys:
                    table_locks[key] = table_locks.get(key, ()) + mine
            else:
                made: dict[tuple[int, bool], _LockHolder] = {}
                for key, write in zip(keys, writes, strict=True):
                    mode = (write.mask, write.kind is WriteKind.LOCK and write.shared)
                    holder = made.get(mode)
                    if holder is None:
                        holder = made[mode] = _LockHolder(tx_id, *mode)
                    table_locks[key] = table_locks.get(key, ()) + (holder,)
            self._by_tx.setdefault(tx_id, []).append((table_id, keys, None))

    def release(self, tx_id: str) -> None:
        with self._mutex:
            for table_id, keys, mine in self._by_tx.pop(tx_id, ()):
                table_locks = self._locks.get(table_id)
                if table_locks is None:
                    continue
                # every key's holders out at once; the keys others hold too go back without this one's
                held = list(map(table_locks.pop, keys, repeat(())))
                if mine is None or held.count(mine) != len(held):
                    for key, holders in zip(keys, held, strict=True):
                        if holders is not mine:
                            rest = tuple(h for h in holders if h.transaction_id != tx_id)
                            if rest:
                                table_locks[key] = rest
                if not table_locks:
                    del self._locks[table_id]


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
        locked = lock_table.conflict(table.table_id, keyed, tx_id)
        if locked is not None:
            raise _conflict_error(metrics, tx_id, start_ts, path, locked[0], f"a lock held by transaction {locked[1]}")
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
