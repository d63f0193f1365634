"""The conflict memory of a table (seed 003): which keys changed after a transaction started.

A transaction's write conflicts with "a write with a timestamp greater than the transaction start
timestamp" (seed 003), or with a lock taken after it. Reading SQL for every check would cost a
query per commit, so a table remembers its recent commits in memory (``DynamicTable.recent``):
that memory is complete for every commit above ``recent_floor``, and a check of a transaction
that started earlier (one started before a restart, say) reads SQL instead.

What is tricky: the memory must be bounded (``recent_commit_keys``, ``recent_commit_grace_seconds``)
yet never forget a commit a running transaction can still conflict with, so :func:`remember` asks
the table's ``pinned_by`` (the start timestamp of the oldest running transaction) before it drops
anything, and raises the floor past what it dropped. Replicated commits keep their source's
timestamps, so commits do not always arrive in timestamp order: each entry carries the largest
timestamp so far, and a check walks back only until that is at or below its start.

These are functions of a ``DynamicTable`` rather than methods so that ``table.py`` reads as "what
a table is and which kind of storage serves a call"; the table keeps thin methods for its callers.

Locking: everything here runs under ``Storage.write_lock`` (commits remember, conflict checks
read, a rollback forgets: :func:`forget`). ``pinned_by`` takes the transaction manager's session
lock, a leaf: the one call out of a table under the writer lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import sqlalchemy as sa

from .. import yson_util
from ..config import EngineConfig
from ..schema import TableSchema
from ..storage import LOCK_MASK, TS, UserTables, read_locks_table
from ..timestamps import COUNTER_BITS
from .sorted_rows import key_cols, run_with_keys
from .writes import RowWrite, WriteKind, masks_conflict


class ConflictTable(Protocol):
    """What this module uses of a table (``DynamicTable`` is one): the module needs no import of
    ``table.py``, which imports it."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    atomicity: str
    has_read_locks: bool
    recent: deque[tuple[int, int, dict[Any, RowWrite]]]
    recent_keys: int
    recent_floor: int
    pinned_by: Callable[[], int | None] | None
    config: EngineConfig


def find(table: ConflictTable, conn: sa.Connection, writes: dict[tuple[Any, ...], RowWrite],
         start_ts: int) -> tuple[tuple[Any, ...], str] | None:
    """First key whose write or lock conflicts with history after ``start_ts`` (seed 003)."""
    why = "a write with a timestamp greater than the transaction start timestamp"
    if start_ts >= table.recent_floor:
        # newest first, until every earlier commit is known to be older than the start
        for ts, newest, committed in reversed(table.recent):
            if newest <= start_ts:
                break
            if ts <= start_ts:
                continue
            for key in committed.keys() & writes.keys():
                other = committed[key]
                if other.kind is not WriteKind.LOCK and masks_conflict(other.mask, writes[key].mask):
                    return key, why
    else:
        for key, mask in _writes_after(table, conn, list(writes), start_ts):
            if masks_conflict(mask, writes[key].mask):
                return key, why
    if table.has_read_locks and any(not w.shared for w in writes.values()):
        rl = read_locks_table
        stmt = sa.select(rl.c.row_key, rl.c.lock_mask).where(
            rl.c.table_id == table.table_id, rl.c.timestamp > start_ts)
        for row_key, mask in conn.execute(stmt):
            key = tuple(yson_util.loads_text(row_key))
            w = writes.get(key)
            if w is not None and not w.shared and masks_conflict(mask, w.mask):
                return key, "a lock taken after the transaction start timestamp"
    return None


def _writes_after(table: ConflictTable, conn: sa.Connection, keys: list[tuple[Any, ...]],
                  start_ts: int) -> Iterator[tuple[tuple[Any, ...], int]]:
    """(key, lock mask) of every write to ``keys`` committed after ``start_ts``, from SQL."""
    nkeys = len(table.schema.key_names)
    for which, sql_table in (("data", table.sql.data), ("versions", table.sql.versions)):
        assert sql_table is not None

        def build(key_in: sa.ColumnElement[bool], sql_table: sa.Table = sql_table) -> sa.ClauseElement:
            return sa.select(*key_cols(table, sql_table), sql_table.c[LOCK_MASK]).where(
                key_in, sql_table.c[TS] > sa.bindparam("start_ts"))

        for result in run_with_keys(table, conn, f"writes_after:{which}", sql_table, build, keys,
                                    {"start_ts": start_ts}):
            for row in result:
                yield tuple(row[:nkeys]), row[nkeys]


def remember(table: ConflictTable, commit_ts: int, writes: dict[Any, RowWrite]) -> None:
    """Keep a commit's writes for conflict checks; forget the ones no check can need any more."""
    if table.atomicity != "full":
        return  # atomicity=none commits are never checked
    recent = table.recent
    # commits arrive in timestamp order, except replicated ones that keep their source's
    # timestamps: each entry carries the largest timestamp so far, so a check can stop early
    newest = max(commit_ts, recent[-1][1]) if recent else commit_ts
    entry = (commit_ts, newest, writes)
    recent.append(entry)
    table.recent_keys += len(writes)
    max_keys = table.config.recent_commit_keys
    cutoff = commit_ts - int(table.config.recent_commit_grace_seconds * (1 << COUNTER_BITS))
    if recent[0][0] > cutoff and table.recent_keys <= max_keys:
        return
    pin = table.pinned_by() if table.pinned_by is not None else None
    if pin is not None:
        cutoff = min(cutoff, pin)
    floor = table.recent_floor if table.recent_floor < (1 << 64) else 0
    while recent and (recent[0][0] <= cutoff or table.recent_keys > max_keys):
        ts, _, keyed = recent.popleft()
        floor = max(floor, ts)
        table.recent_keys -= len(keyed)
    table.recent_floor = floor


def forget(table: ConflictTable, writes: dict[Any, RowWrite]) -> None:
    """Forget a commit that rolled back (its entry, if still remembered)."""
    for i in range(len(table.recent) - 1, -1, -1):
        if table.recent[i][2] is writes:
            del table.recent[i]
            table.recent_keys -= len(writes)
            return
