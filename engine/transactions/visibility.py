"""What a read must wait for: commits being applied, and transactions prepared here by another
coordinator.

A reader at timestamp T must see every commit with a smaller timestamp. A commit timestamp is
registered as *in flight* at the moment it is generated (under the writer lock, in the commit's
SQL transaction) and readers at T >= it wait until it is applied, which closes the window between
"timestamp chosen" and "rows written". A transaction prepared here by another cluster's
coordinator (a sync replica write) may still commit with any timestamp above its prepare
timestamp, so reads wait for it too; and reads of the latest data wait for the prepared
transactions that wrote their table (see ``TransactionManager.wait_prepared_writes``).

Both kinds of state are guarded by one condition, because one wait (``wait_visible``) looks at
both; that condition and everything it guards live in this one object, which the coordinator
(``manager.py``) and the participant side (``participant.py``) share.

A remote prepare whose coordinator gives no decision for too long (unreachable, or gone) is marked
*stalled* by the replication layer's in-doubt resolution (``mark_stalled``): from then on a read
that would wait for it fails at once with YT's retriable ``BlockedRowWaitTimeout`` (1713), naming
the transaction and its coordinator, instead of waiting 10 s per read, until the coordinator's
decision arrives. It is not aborted here: aborting a transaction the coordinator committed would
lose an acknowledged write (docs/replication.md, "In-doubt transactions").

Lock order: ``Storage.write_lock`` -> ``InFlight.cond`` -> ``LockTable._mutex`` and
``TimestampProvider._lock`` (both leaves). Nothing here takes the writer lock, the session lock or
a transaction's lock. The waits release ``cond`` while they sleep, but must not be entered with
``Storage.write_lock`` held: a remote prepare is released only by a commit or abort, which needs
the writer lock (they would time out, not deadlock forever).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import ErrorCode, YtError
from ..timestamps import TimestampProvider
from .locks import LockTable

#: YT's ``BlockedRowWaitTimeout`` (NTabletClient::EErrorCode): a read waited for rows held by a
#: prepared transaction; the official client retries it
BLOCKED_ROW_WAIT_TIMEOUT = ErrorCode.BLOCKED_ROW_WAIT_TIMEOUT


class InFlight:
    """In-flight commit timestamps and remote prepares, under one condition."""

    def __init__(self, timestamps: TimestampProvider) -> None:
        self.timestamps = timestamps
        #: guards every field below; notified whenever a commit is applied or a prepare released
        self.cond = threading.Condition()
        #: commit timestamps chosen and not yet applied (or rolled back). Guarded by cond
        self._commits: set[int] = set()
        #: transactions coordinated elsewhere, prepared here: id -> prepare timestamp. Guarded by cond
        self._remote_prepared: dict[str, int] = {}
        #: when each of them was prepared (or re-held after a restart), by this process' clock.
        #: Guarded by cond
        self._remote_held_since: dict[str, float] = {}
        #: the tables each of them wrote here. Guarded by cond; read without it as a hint (is any
        #: prepared transaction writing this table?) by :meth:`has_remote_prepared`
        self._remote_tables: dict[str, set[str]] = {}
        #: those of them undecided past the in-doubt bound: id -> why (what their coordinator
        #: said, or that it cannot be reached). Reads fail at once instead of waiting for them.
        #: Guarded by cond
        self._remote_stalled: dict[str, str] = {}

    # -- commit timestamps -------------------------------------------------------------------------

    def begin_commit(self, at_least: int = 0) -> int:
        """A fresh commit timestamp (at least ``at_least``), registered in flight until :meth:`end_commit`."""
        with self.cond:
            ts = self.timestamps.generate()
            if at_least > ts:
                self.timestamps.observe(at_least)
                ts = at_least
            self._commits.add(ts)
            return ts

    def adopt(self, ts: int) -> None:
        """Register a commit timestamp chosen elsewhere (a replicated batch keeping its source's)."""
        with self.cond:
            self._commits.add(ts)

    def end_commit(self, ts: int) -> None:
        """The commit at ``ts`` is applied (or rolled back): readers at or after it may go on."""
        with self.cond:
            self._commits.discard(ts)
            self.cond.notify_all()

    def wait_visible(self, ts: int, timeout: float = 10.0) -> None:
        """Block until no commit with a timestamp <= ``ts`` is still being applied."""
        deadline = time.monotonic() + timeout
        with self.cond:
            # a prepared remote transaction may still commit with a timestamp <= ts
            while any(t <= ts for t in self._commits) or any(t <= ts for t in self._remote_prepared.values()):
                blocking = [tx for tx, t in self._remote_prepared.items() if t <= ts]
                self._raise_if_stalled(blocking, f"a read at timestamp {ts:#x}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if blocking:
                        raise YtError(f"Timed out waiting for prepared transactions {sorted(blocking)} before "
                                      f"timestamp {ts:#x} to be committed or aborted by their coordinator",
                                      code=BLOCKED_ROW_WAIT_TIMEOUT, attributes={"transaction_ids": sorted(blocking)})
                    raise YtError(f"Timed out waiting for commits before timestamp {ts:x} to be applied",
                                  code=ErrorCode.TIMEOUT)
                self.cond.wait(remaining)

    def visible_bound(self, ts: int) -> int:
        """The largest timestamp at most ``ts`` below which nothing is in flight: every commit at
        or before it is applied, and no prepared remote transaction can still commit at or before
        it (a commit's timestamp is after its prepare's). Change streams read up to it; it never waits."""
        with self.cond:
            bound = ts
            if self._commits:
                bound = min(bound, min(self._commits) - 1)
            if self._remote_prepared:
                bound = min(bound, min(self._remote_prepared.values()) - 1)
            return bound

    # -- transactions prepared here by another coordinator -----------------------------------------

    def hold_remote(self, tx_id: str, table_id: str, prepare_ts: int) -> None:
        """A remotely coordinated transaction prepared writes to ``table_id`` at ``prepare_ts``."""
        with self.cond:
            self._remote_prepared[tx_id] = prepare_ts
            self._remote_held_since.setdefault(tx_id, time.monotonic())
            self._remote_tables.setdefault(tx_id, set()).add(table_id)

    def release_remote(self, tx_id: str) -> None:
        """It committed or aborted: wake the reads and prepares waiting for it."""
        with self.cond:
            self._remote_prepared.pop(tx_id, None)
            self._remote_held_since.pop(tx_id, None)
            self._remote_tables.pop(tx_id, None)
            self._remote_stalled.pop(tx_id, None)
            self.cond.notify_all()

    def mark_stalled(self, tx_id: str, reason: str) -> bool:
        """In-doubt past the bound: reads stop waiting for it (they fail at once, retriable) until it
        is released. ``reason`` says why no decision came. False if it is not held (any more) or
        was already marked."""
        with self.cond:
            if tx_id not in self._remote_prepared or tx_id in self._remote_stalled:
                return False
            self._remote_stalled[tx_id] = reason
            self.cond.notify_all()  # waiting readers re-check, and fail now
            return True

    def _raise_if_stalled(self, tx_ids: Iterable[str], what: str) -> None:
        """Under cond: the retriable error of a read blocked by a stalled in-doubt transaction."""
        stalled = self._remote_stalled
        if not stalled:
            return
        for tx in tx_ids:
            reason = stalled.get(tx)
            if reason is not None:
                raise YtError(f"Cannot serve {what}: rows are held by transaction {tx}, prepared here and "
                              f"still in doubt: {reason}; retry later", code=BLOCKED_ROW_WAIT_TIMEOUT,
                              attributes={"transaction_id": tx})

    def has_remote_prepared(self, table_id: str) -> bool:
        """Whether a transaction coordinated elsewhere holds prepared writes to this table (a hint)."""
        tables = self._remote_tables
        return bool(tables) and any(table_id in t for t in list(tables.values()))

    def wait_prepared_writes(self, table_id: str, timeout: float = 10.0) -> None:
        """Wait for the remotely coordinated transactions that had written ``table_id`` when called."""
        if not self._remote_tables:
            return
        deadline = time.monotonic() + timeout
        with self.cond:
            pending = {tx for tx, tables in self._remote_tables.items() if table_id in tables}
            while pending & self._remote_tables.keys():
                self._raise_if_stalled(pending & self._remote_tables.keys(), f"a read of table {table_id}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise YtError(f"Timed out waiting for prepared transactions {sorted(pending)} to be "
                                  "committed or aborted by their coordinator", code=BLOCKED_ROW_WAIT_TIMEOUT,
                                  attributes={"transaction_ids": sorted(pending)})
                self.cond.wait(remaining)

    def wait_remote_locks(self, lock_table: LockTable, table_id: str, keys: Iterable[tuple[Any, ...]],
                          tx_id: str, timeout: float) -> None:
        """Let the transactions prepared here by other coordinators that lock these keys finish
        (their decision is usually on its way) before a new prepare checks its conflicts.

        Takes ``LockTable._mutex`` under ``cond`` (the only nesting of the two)."""
        if not lock_table:
            return
        keys = list(keys)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                waiting = lock_table.holders(table_id, keys, tx_id) & self._remote_prepared.keys()
                remaining = deadline - time.monotonic()
                if not waiting or remaining <= 0:
                    return  # the conflict check reports a holder still there
                self.cond.wait(remaining)

    def held_longer_than(self, tx_ids: Iterable[str], seconds: float, now: float) -> set[str]:
        """Those of ``tx_ids`` held here for at least ``seconds`` at ``now`` (monotonic clock); an id
        not held (yet) counts as held since ``now``."""
        with self.cond:
            return {t for t in tx_ids if now - self._remote_held_since.get(t, now) >= seconds}
