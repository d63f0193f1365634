"""Dynamic tables: sorted (keyed, multi-versioned) and ordered (append-only, per-tablet queues).

This module knows how table data is laid out in SQL and how to read it at a timestamp; it knows
nothing of transactions beyond "apply these already-validated, already-locked writes with this
commit timestamp" and "which keys changed after timestamp T" (the conflict check of seed 003).

Sorted tables keep two SQL tables: the latest image of every row (what SQL tools see) and the
older versions and tombstones (see ``storage``); a read at a timestamp takes a row from the first
when its latest write is old enough, else the newest older version from the second. Conflict checks
(seed 003: "a write with a timestamp greater than the transaction start timestamp") look at the
commits a table remembers in memory - the ones a running transaction can still conflict with - and
at SQL only for a transaction older than that memory (one started before a restart, say).

Ordered tables are one SQL table keyed by ``(tablet_index, row_index)``; a row's timestamp is its
commit timestamp, and row indexes are assigned at commit so they follow commit order within a tablet.
"""

from __future__ import annotations

import bisect
import json
import math
import operator
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa

from .. import yson_util
from ..errors import ErrorCode, SchemaViolation, TabletStateError, YtError
from ..query import QuerySource
from ..schema import ColumnType, TableSchema
from ..storage import (
    DELETED,
    KIND,
    LOCK_MASK,
    PAYLOAD,
    ROW_INDEX,
    TABLET_INDEX,
    TS,
    FastStatement,
    UserTables,
    on_commit,
    on_rollback,
    read_locks_table,
    tablets_table,
)
from ..timestamps import COUNTER_BITS

#: rows per SQL statement when we bind key lists
_CHUNK = 500
#: up to this many keys, a lookup runs one prepared point query per key
_POINT_LOOKUPS = 8
#: commits a table remembers for conflict checks: at most this many keys in all...
_RECENT_KEYS = 20_000
#: ...and, within that, every commit of the last seconds, for transactions coordinated elsewhere
#: (a sync replica's prepare carries a start timestamp of its meta-cluster)
_RECENT_GRACE_S = 2


class TabletState(StrEnum):
    UNMOUNTED = "unmounted"
    MOUNTING = "mounting"
    MOUNTED = "mounted"
    FREEZING = "freezing"
    FROZEN = "frozen"
    UNFREEZING = "unfreezing"
    UNMOUNTING = "unmounting"


class WriteKind(StrEnum):
    WRITE = "write"
    DELETE = "delete"
    LOCK = "lock"


@dataclass(slots=True)
class RowWrite:
    """One row change of a transaction, merged per key before commit."""

    kind: WriteKind
    row: dict[str, Any]
    #: lock groups this write takes (bit 0 = primary lock)
    mask: int
    #: update mode: columns not in ``row`` keep their stored values
    update: bool = False
    #: for LOCK: True for shared (read) locks, False for exclusive
    shared: bool = False
    strong: bool = False

    def to_payload(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "row": self.row, "mask": self.mask, "update": self.update,
                "shared": self.shared, "strong": self.strong}

    @classmethod
    def from_payload(cls, data: dict[str, Any]) -> RowWrite:
        return cls(kind=WriteKind(data["kind"]), row=data["row"], mask=int(data["mask"]),
                   update=bool(data["update"]), shared=bool(data["shared"]), strong=bool(data["strong"]))


class QueueEntry(NamedTuple):
    """One change in a replication queue (a tuple: made by the thousand for every replicator batch)."""

    row_index: int
    timestamp: int
    kind: str
    payload: str


_SET_ROW_COUNT = FastStatement.update(tablets_table, "table_id", "tablet_index", columns=("row_count",))

#: rows of each tablet's replication queue kept in memory after their append, so that replicators
#: (one per replica) push fresh changes without reading them back from SQL
QUEUE_TAIL_ROWS = 200_000


TABLET_OBJECT_TYPE = 0x2BC


def tablet_id(table_id: str, index: int) -> str:
    """A stable, GUID-shaped object id for tablet ``index`` of a table (YT shows tablets by id)."""
    digest = uuid.uuid5(uuid.NAMESPACE_OID, f"{table_id}/{index}").int
    return f"{(digest >> 96) & 0xFFFFFFFF:x}-{(digest >> 64) & 0xFFFFFFFF:x}-{TABLET_OBJECT_TYPE:x}-" \
           f"{digest & 0xFFFFFFFF:x}"


def _null_first(value: Any) -> tuple[int, Any]:
    return (0, 0) if value is None else (1, value)


def key_sort_tuple(key: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    return tuple(_null_first(v) for v in key)


@dataclass
class DynamicTable:
    """A mounted-or-not dynamic table and its tablets."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    pivot_keys: list[list[Any]] = field(default_factory=lambda: [[]])
    tablet_count_ordered: int = 1
    state: TabletState = TabletState.UNMOUNTED
    atomicity: str = "full"
    #: ordered tables: per tablet [row_count, trimmed_row_count]; kept in sync with _rt_tablets
    tablet_rows: dict[int, list[int]] = field(default_factory=dict)
    #: a replicated table stores only its replication queue (seed 002)
    replicated: bool = False
    #: a replica table accepts writes only from this upstream replica (None: from anyone)
    upstream_replica_id: str | None = None
    #: whether _rt_read_locks may hold rows of this table (skips a query per commit when not)
    has_read_locks: bool = True
    #: recent commits (timestamp, writes by key), complete for every commit with a timestamp above
    #: ``recent_floor``; a conflict check of a transaction that started earlier reads SQL instead.
    #: The owner sets the floor to a fresh timestamp when it makes the table (nothing known before)
    #: in commit order: (timestamp, the largest timestamp so far, writes by key)
    recent: deque[tuple[int, int, dict[Any, RowWrite]]] = field(default_factory=deque)
    recent_keys: int = 0
    recent_floor: int = 1 << 64
    #: the start timestamp of the oldest running transaction (commits after it must be remembered)
    pinned_by: Callable[[], int | None] | None = None
    #: replicated tables: per tablet, the newest queue rows (first row index, entries)
    queue_tail: dict[int, tuple[int, list[QueueEntry]]] = field(default_factory=dict)

    @property
    def sorted(self) -> bool:
        return self.schema.is_sorted

    @property
    def tablet_count(self) -> int:
        return len(self.pivot_keys) if self.sorted else self.tablet_count_ordered


    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        names = self.schema.key_names
        if len(names) == 1:
            return (row[names[0]],)
        return tuple(row[name] for name in names)

    def tablet_of_key(self, key: tuple[Any, ...]) -> int:
        if len(self.pivot_keys) == 1:
            return 0
        pivots = [key_sort_tuple(tuple(p)) for p in self.pivot_keys[1:]]
        return bisect.bisect_right(pivots, key_sort_tuple(key))

    def tablet_for_row(self, row: dict[str, Any], explicit: Any = None) -> int:
        if self.sorted:
            return 0 if len(self.pivot_keys) == 1 else self.tablet_of_key(self.key_of(row))
        if explicit is not None:
            if isinstance(explicit, bool) or not isinstance(explicit, int):
                raise SchemaViolation(f"$tablet_index must be an integer tablet index, got {explicit!r}",
                                      attributes={"column": "$tablet_index"})
            index = explicit
            if not 0 <= index < self.tablet_count:
                raise YtError(f"Invalid $tablet_index {index}: table has {self.tablet_count} tablets",
                              code=ErrorCode.NO_SUCH_TABLET)
            return index
        return random.randrange(self.tablet_count)

    # -- state checks ----------------------------------------------------------------------------

    def check_writable(self, path: str) -> None:
        if self.state == TabletState.FROZEN:
            raise TabletStateError(f"Cannot write into table {path}: its tablets are frozen",
                                   attributes={"path": path, "tablet_state": self.state.value})
        if self.state != TabletState.MOUNTED:
            raise TabletStateError(f"Cannot write into table {path}: table is not mounted "
                                   f"(tablet state is {self.state.value!r})",
                                   code=ErrorCode.TABLET_NOT_MOUNTED,
                                   attributes={"path": path, "tablet_state": self.state.value})

    def check_readable(self, path: str) -> None:
        if self.state not in (TabletState.MOUNTED, TabletState.FROZEN, TabletState.FREEZING,
                              TabletState.UNFREEZING):
            raise TabletStateError(f"Cannot read from table {path}: table is not mounted "
                                   f"(tablet state is {self.state.value!r})",
                                   code=ErrorCode.TABLET_NOT_MOUNTED,
                                   attributes={"path": path, "tablet_state": self.state.value})

    # -- conflict checks -------------------------------------------------------------------------

    def find_conflicts(self, conn: sa.Connection, writes: dict[tuple[Any, ...], RowWrite],
                       start_ts: int) -> tuple[tuple[Any, ...], str] | None:
        """First key whose write or lock conflicts with history after ``start_ts`` (seed 003)."""
        why = "a write with a timestamp greater than the transaction start timestamp"
        if start_ts >= self.recent_floor:
            # newest first, until every earlier commit is known to be older than the start
            for ts, newest, committed in reversed(self.recent):
                if newest <= start_ts:
                    break
                if ts <= start_ts:
                    continue
                for key in committed.keys() & writes.keys():
                    other = committed[key]
                    if other.kind is not WriteKind.LOCK and _masks_conflict(other.mask, writes[key].mask):
                        return key, why
        else:
            for key, mask in self._writes_after(conn, list(writes), start_ts):
                if _masks_conflict(mask, writes[key].mask):
                    return key, why
        if self.has_read_locks and any(not w.shared for w in writes.values()):
            rl = read_locks_table
            stmt = sa.select(rl.c.row_key, rl.c.lock_mask).where(
                rl.c.table_id == self.table_id, rl.c.timestamp > start_ts)
            for row_key, mask in conn.execute(stmt):
                key = tuple(yson_util.loads_text(row_key))
                w = writes.get(key)
                if w is not None and not w.shared and _masks_conflict(mask, w.mask):
                    return key, "a lock taken after the transaction start timestamp"
        return None

    def _writes_after(self, conn: sa.Connection, keys: list[tuple[Any, ...]],
                      start_ts: int) -> Iterator[tuple[tuple[Any, ...], int]]:
        """(key, lock mask) of every write to ``keys`` committed after ``start_ts``, from SQL."""
        nkeys = len(self.schema.key_names)
        for which, table in (("data", self.sql.data), ("versions", self.sql.versions)):
            assert table is not None

            def build(key_in: sa.ColumnElement[bool], table: sa.Table = table) -> sa.Executable:
                return sa.select(*self._key_cols(table), table.c[LOCK_MASK]).where(
                    key_in, table.c[TS] > sa.bindparam("start_ts"))

            for result in self._run_with_keys(conn, f"writes_after:{which}", table, build, keys,
                                              {"start_ts": start_ts}):
                for row in result:
                    yield tuple(row[:nkeys]), row[nkeys]

    def remember_commit(self, commit_ts: int, writes: dict[Any, RowWrite]) -> None:
        """Keep a commit's writes for conflict checks; forget the ones no check can need any more."""
        if self.atomicity != "full":
            return  # atomicity=none commits are never checked
        recent = self.recent
        # commits arrive in timestamp order, except replicated ones that keep their source's
        # timestamps: each entry carries the largest timestamp so far, so a check can stop early
        newest = max(commit_ts, recent[-1][1]) if recent else commit_ts
        entry = (commit_ts, newest, writes)
        recent.append(entry)
        self.recent_keys += len(writes)
        cutoff = commit_ts - (_RECENT_GRACE_S << COUNTER_BITS)
        if recent[0][0] > cutoff and self.recent_keys <= _RECENT_KEYS:
            return
        pin = self.pinned_by() if self.pinned_by is not None else None
        if pin is not None:
            cutoff = min(cutoff, pin)
        floor = self.recent_floor if self.recent_floor < (1 << 64) else 0
        while recent and (recent[0][0] <= cutoff or self.recent_keys > _RECENT_KEYS):
            ts, _, keyed = recent.popleft()
            floor = max(floor, ts)
            self.recent_keys -= len(keyed)
        self.recent_floor = floor

    def _unremember(self, writes: dict[Any, RowWrite]) -> None:
        """Forget a commit that rolled back (its entry, if still remembered)."""
        for i in range(len(self.recent) - 1, -1, -1):
            if self.recent[i][2] is writes:
                del self.recent[i]
                self.recent_keys -= len(writes)
                return

    # -- applying writes -------------------------------------------------------------------------

    def apply(self, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
              tablet_index: int | None = None, keyed: dict[Any, RowWrite] | None = None) -> int:
        """Apply merged writes with ``commit_ts``; returns the number of data rows written.

        ``keyed`` is the same writes by key, when the caller has it (a sorted table needs it)."""
        if self.replicated:
            return self._apply_queue(conn, writes, commit_ts, tablet_index or 0)
        if self.sorted:
            if keyed is None:
                key_of = self.key_of
                keyed = {key_of(w.row): w for w in writes}
            return self._apply_sorted(conn, writes, commit_ts, keyed)
        return self._apply_ordered(conn, writes, commit_ts, tablet_index or 0)

    def _apply_queue(self, conn: sa.Connection, writes: list[RowWrite], commit_ts: int, tablet_index: int) -> int:
        """Append changes to the replication queue of one tablet, in commit order."""
        counts = self.tablet_rows.setdefault(tablet_index, [0, 0])
        start = counts[0]
        changes = [w for w in writes if w.kind is not WriteKind.LOCK]
        if not changes:
            return 0
        doubles = [c.name for c in self.schema.columns if c.type is ColumnType.DOUBLE]
        entries = [QueueEntry(start + i, commit_ts, w.kind.value, payload)
                   for i, (w, payload) in enumerate(zip(changes, _payloads(changes, doubles), strict=True))]
        self.sql.bulk("insert:data", conn).run(conn, [(tablet_index, *e) for e in entries],
                                               [TABLET_INDEX, ROW_INDEX, TS, KIND, PAYLOAD])
        _SET_ROW_COUNT.run(conn, table_id=self.table_id, tablet_index=tablet_index, row_count=start + len(entries))
        counts[0] = start + len(entries)

        def undo() -> None:
            counts[0] = start

        def publish() -> None:
            # replicators read the tail without the writer lock: it only ever holds committed rows
            base, tail = self.queue_tail.get(tablet_index, (start, []))
            if base + len(tail) != start:
                base, tail = start, []
            tail.extend(entries)
            if len(tail) > QUEUE_TAIL_ROWS:
                # a new list: a reader holding (base, tail) must never see indices shift under it
                drop = len(tail) - QUEUE_TAIL_ROWS // 2
                tail = tail[drop:]
                base += drop
            self.queue_tail[tablet_index] = (base, tail)

        on_rollback(conn, undo)
        on_commit(conn, publish)
        return len(entries)

    def read_queue(self, conn: sa.Connection, tablet_index: int, from_row: int, limit: int) -> list[QueueEntry]:
        base, tail = self.queue_tail.get(tablet_index, (0, []))
        if tail and base <= from_row:
            return tail[from_row - base:from_row - base + limit]
        data = self.sql.data
        stmt = (sa.select(data.c[ROW_INDEX], data.c[TS], data.c[KIND], data.c[PAYLOAD])
                .where(data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] >= from_row)
                .order_by(data.c[ROW_INDEX]).limit(limit))
        # a batch is up to 90,000 rows: plain tuples from the driver, no ORM-style row objects
        result = conn.execute(stmt)
        return list(map(QueueEntry._make, result.cursor.fetchall())) if result.cursor is not None else []

    def first_timestamp_from(self, conn: sa.Connection, tablet_index: int, from_row: int) -> int | None:
        """Commit timestamp of the queue row at ``from_row`` (the oldest unreplicated change)."""
        data = self.sql.data
        return conn.execute(sa.select(data.c[TS]).where(
            data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] == from_row)).scalar()

    def trim_queue(self, conn: sa.Connection, tablet_index: int, below_row: int, not_after_ts: int) -> int:
        """Drop queue rows below ``below_row`` committed at or before ``not_after_ts``."""
        data = self.sql.data
        counts = self.tablet_rows.setdefault(tablet_index, [0, 0])
        oldest = self.first_timestamp_from(conn, tablet_index, counts[1])
        if oldest is None or oldest > not_after_ts:
            return 0  # nothing old enough: no scan
        # timestamps grow along the queue: binary search the last row old enough to go
        low, high = counts[1], below_row - 1
        while low < high:
            middle = (low + high + 1) // 2
            ts = self.first_timestamp_from(conn, tablet_index, middle)
            if ts is not None and ts <= not_after_ts:
                low = middle
            else:
                high = middle - 1
        last = low
        if last is None or last + 1 <= counts[1]:
            return 0
        removed = conn.execute(data.delete().where(data.c[TABLET_INDEX] == tablet_index,
                                                   data.c[ROW_INDEX] <= last)).rowcount
        conn.execute(tablets_table.update().where(
            tablets_table.c.table_id == self.table_id,
            tablets_table.c.tablet_index == tablet_index).values(trimmed_row_count=last + 1))
        counts[1] = last + 1
        return removed

    def _apply_sorted(self, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
                      keyed: dict[Any, RowWrite]) -> int:
        data = self.sql.data
        versions = self.sql.versions
        assert versions is not None
        keys = self.schema.key_names
        names = [c.name for c in self.schema.columns]
        updates = [w for w in writes if w.kind is WriteKind.WRITE and w.update]
        current: dict[tuple[Any, ...], dict[str, Any]] = {}
        if updates:
            current = self._fetch_latest(conn, [self.key_of(w.row) for w in updates])
        upserts: list[tuple[Any, ...]] = []
        deletes: list[tuple[Any, ...]] = []
        tombstones: list[tuple[Any, ...]] = []
        lock_rows: list[dict[str, Any]] = []
        locks_only: set[Any] = set()
        # a whole-row write of every column is one C call from dict to tuple
        image_of = operator.itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],))
        write_kind = WriteKind.WRITE
        for w in writes:
            row = w.row
            if w.kind is write_kind and not w.update:
                try:
                    image = image_of(row)
                except KeyError:
                    image = tuple(row.get(n) for n in names)
                upserts.append(image + (commit_ts, w.mask))
                continue
            if w.kind is WriteKind.LOCK:
                locks_only.add(self.key_of(row))
                if w.strong or not w.shared:
                    lock_rows.append({"table_id": self.table_id,
                                      "row_key": yson_util.dumps_text(list(self.key_of(row))),
                                      "lock_mask": w.mask, "timestamp": commit_ts})
                continue
            if w.kind is WriteKind.DELETE:
                deletes.append(tuple(row[k] for k in keys))
                tombstones.append((*(row[n] if n in keys else None for n in names), commit_ts, True, w.mask))
                continue
            merged = dict(current.get(self.key_of(row)) or {})
            merged.update(row)
            upserts.append((*(merged.get(n) for n in names), commit_ts, w.mask))
        changed = [k for k in keyed if k not in locks_only] if locks_only else list(keyed)
        if changed:
            # the images this commit replaces become older versions
            for _ in self._run_with_keys(conn, "move", data, self._move_statement, changed):
                pass
        if deletes:
            for _ in self._run_with_keys(conn, "remove", data, lambda key_in: data.delete().where(key_in), deletes):
                pass
            self.sql.bulk("insert:versions", conn).run(conn, tombstones, [*names, TS, DELETED, LOCK_MASK])
        self.sql.bulk("upsert:data", conn).run(conn, upserts, [*names, TS, LOCK_MASK])
        if lock_rows:
            self._record_locks(conn, lock_rows)
            self.has_read_locks = True
        self.remember_commit(commit_ts, keyed)
        on_rollback(conn, lambda: self._unremember(keyed))
        return len(upserts) + len(deletes)

    # -- SQL helpers of sorted tables ------------------------------------------------------------

    @property
    def _chunk(self) -> int:
        """Keys per ``IN`` list: a few thousand bound values, well inside every dialect's limit."""
        return max(1, 4000 // len(self.schema.key_names))

    def _key_cols(self, table: sa.Table) -> list[sa.Column[Any]]:
        return [table.c[k] for k in self.schema.key_names]

    def _run_with_keys(self, conn: sa.Connection, name: str, table: sa.Table,
                       build: Callable[[sa.ColumnElement[bool]], sa.Executable], keys: list[tuple[Any, ...]],
                       extra: dict[str, Any] | None = None) -> Iterator[sa.CursorResult[Any]]:
        """Run ``build(key IN (...))`` (the key columns of ``table``) once per chunk of ``keys``; yields
        each result.

        The statement is compiled once per chunk length and run straight on the driver: SQLAlchemy
        would otherwise render and process thousands of bound values on every execution."""
        cache = self.__dict__.setdefault("_key_statements", {})
        nkeys = len(self.schema.key_names)
        extra = extra or {}
        for chunk in _chunks(keys, self._chunk):
            # a few list lengths only (powers of two, and the full chunk): a short list is padded
            # with its last key, which changes nothing in an IN list
            size = len(chunk) if len(chunk) == self._chunk else 1 << (len(chunk) - 1).bit_length()
            chunk = chunk + [chunk[-1]] * (size - len(chunk))
            entry = cache.get((name, size, conn.dialect.name))
            if entry is None:
                cols = self._key_cols(table)
                binds = [[sa.bindparam(f"k{i}_{j}") for j in range(nkeys)] for i in range(size)]
                key_in = cols[0].in_([b[0] for b in binds]) if nkeys == 1 else \
                    sa.tuple_(*cols).in_([sa.tuple_(*b) for b in binds])
                compiled = build(key_in).compile(dialect=conn.dialect)
                order = list(compiled.positiontup or []) if compiled.positional else None
                keys_first = order is not None and order[:size * nkeys] == [
                    f"k{i}_{j}" for i in range(size) for j in range(nkeys)]
                entry = cache[(name, size, conn.dialect.name)] = (str(compiled), order, keys_first)
            sql, order, keys_first = entry
            if keys_first:
                # positional, keys first (the usual shape): a flat tuple
                flat = [v for key in chunk for v in key]
                params: Any = tuple(flat) + tuple(extra[n] for n in order[len(flat):])
            else:
                values = dict(extra)
                for i, key in enumerate(chunk):
                    for j, value in enumerate(key):
                        values[f"k{i}_{j}"] = value
                params = tuple(values[n] for n in order) if order is not None else values
            yield conn.exec_driver_sql(sql, params)

    def _move_statement(self, key_in: sa.ColumnElement[bool]) -> sa.Executable:
        """INSERT INTO versions SELECT the current images of :keys (with their timestamps and masks)."""
        data, versions = self.sql.data, self.sql.versions
        assert versions is not None
        names = [c.name for c in self.schema.columns]
        image = sa.select(*[data.c[n] for n in names], data.c[TS], sa.false(), data.c[LOCK_MASK]).where(key_in)
        return versions.insert().from_select([*names, TS, DELETED, LOCK_MASK], image)

    def _record_locks(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        rl = read_locks_table
        for row in rows:
            updated = conn.execute(rl.update().where(
                rl.c.table_id == row["table_id"], rl.c.row_key == row["row_key"],
                rl.c.lock_mask == row["lock_mask"]).values(timestamp=row["timestamp"]))
            if updated.rowcount == 0:
                conn.execute(rl.insert().values(**row))

    def _apply_ordered(self, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
                       tablet_index: int) -> int:
        counts = self.tablet_rows.setdefault(tablet_index, [0, 0])
        start = counts[0]
        names = [c.name for c in self.schema.columns]
        rows = [(tablet_index, start + i, commit_ts, *(w.row.get(n) for n in names)) for i, w in enumerate(writes)]
        if rows:
            self.sql.bulk("insert:data", conn).run(conn, rows, [TABLET_INDEX, ROW_INDEX, TS, *names])
            conn.execute(tablets_table.update().where(
                tablets_table.c.table_id == self.table_id,
                tablets_table.c.tablet_index == tablet_index).values(row_count=start + len(rows)))
            counts[0] = start + len(rows)
        return len(rows)

    def trim_rows(self, conn: sa.Connection, tablet_index: int, trimmed_row_count: int, path: str) -> None:
        if self.sorted:
            raise YtError(f"Cannot trim sorted table {path}: trim_rows is for ordered tables",
                          code=ErrorCode.INVALID_PARAMETER)
        if not 0 <= tablet_index < self.tablet_count:
            raise YtError(f"Invalid tablet index {tablet_index} for table {path} with {self.tablet_count} "
                          "tablets", code=ErrorCode.NO_SUCH_TABLET)
        counts = self.tablet_rows.setdefault(tablet_index, [0, 0])
        if trimmed_row_count > counts[0]:
            raise YtError(f"Cannot trim tablet {tablet_index} of table {path} to {trimmed_row_count} rows: "
                          f"it has only {counts[0]} rows", code=ErrorCode.INVALID_PARAMETER)
        if trimmed_row_count <= counts[1]:
            return
        data = self.sql.data
        conn.execute(data.delete().where(data.c[TABLET_INDEX] == tablet_index,
                                         data.c[ROW_INDEX] < trimmed_row_count))
        conn.execute(tablets_table.update().where(
            tablets_table.c.table_id == self.table_id,
            tablets_table.c.tablet_index == tablet_index).values(trimmed_row_count=trimmed_row_count))
        counts[1] = trimmed_row_count

    # -- reads -----------------------------------------------------------------------------------

    def _fetch_latest(self, conn: sa.Connection, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict]:
        data = self.sql.data
        names = self.schema.key_names
        result: dict[tuple[Any, ...], dict[str, Any]] = {}
        colnames = [c.name for c in self.schema.columns]
        if len(keys) <= _POINT_LOOKUPS:
            # a few keys: a point query compiled once per table, run straight on the driver
            point = self.sql.bulk("point:data", conn)
            # on the DBAPI cursor: SQLAlchemy's result machinery costs more than the query
            cursor = conn.connection.cursor()
            try:
                for key in keys:
                    cursor.execute(point.sql, point.params(key, names))
                    row = cursor.fetchone()
                    if row is not None:
                        result[key] = dict(zip(colnames, row, strict=True))
            finally:
                cursor.close()
            return result
        cols = [data.c[c.name] for c in self.schema.columns]
        for chunk in _chunks(keys):
            stmt = sa.select(*cols).where(sa.tuple_(*[data.c[k] for k in names]).in_(chunk))
            for row in conn.execute(stmt):
                d = dict(zip([c.name for c in self.schema.columns], row, strict=True))
                result[tuple(d[k] for k in names)] = d
        return result

    def _fetch_at(self, conn: sa.Connection, keys: list[tuple[Any, ...]], ts: int) -> dict[tuple[Any, ...], dict]:
        """Rows as of ``ts``: the data row if its latest write is that old, else the newest older version."""
        data, versions = self.sql.data, self.sql.versions
        assert versions is not None
        names = self.schema.key_names
        colnames = [c.name for c in self.schema.columns]
        result: dict[tuple[Any, ...], dict[str, Any]] = {}
        for key in keys:
            row = conn.execute(sa.select(*[data.c[n] for n in colnames], data.c[TS]).where(
                *[data.c[k] == v for k, v in zip(names, key, strict=True)])).first()
            if row is not None and row[-1] <= ts:
                result[key] = dict(zip(colnames, row[:-1], strict=True))
                continue
            row = conn.execute(
                sa.select(*[versions.c[n] for n in colnames], versions.c[DELETED])
                .where(*[versions.c[k] == v for k, v in zip(names, key, strict=True)], versions.c[TS] <= ts)
                .order_by(versions.c[TS].desc()).limit(1)).first()
            if row is not None and not row[-1]:
                result[key] = dict(zip(colnames, row[:-1], strict=True))
        return result

    def lookup(self, conn: sa.Connection, keys: list[tuple[Any, ...]], ts: int | None) -> list[dict | None]:
        found = self._fetch_latest(conn, keys) if ts is None else self._fetch_at(conn, keys, ts)
        return [found.get(k) for k in keys]

    def query_source(self, ts: int | None) -> QuerySource:
        """The relation a query reads: latest data, or the versions visible at ``ts``."""
        types = {c.name: c.type.value for c in self.schema.columns}
        if not self.sorted:
            data = self.sql.data
            cols: dict[str, sa.ColumnElement[Any]] = {
                "$tablet_index": data.c[TABLET_INDEX], "$row_index": data.c[ROW_INDEX],
                "$timestamp": data.c[TS]}
            cols.update({c.name: data.c[c.name] for c in self.schema.columns})
            types.update({"$tablet_index": "int64", "$row_index": "int64", "$timestamp": "uint64"})
            order = ("$tablet_index", "$row_index")
            if ts is None:
                return QuerySource(from_clause=data, columns=cols, column_types=types, key_columns=order)
            sub = sa.select(data).where(data.c[TS] <= ts).subquery("visible")
            return QuerySource(from_clause=sub, columns={
                name: sub.c[col.name] for name, col in cols.items()}, column_types=types, key_columns=order)
        if ts is None:
            data = self.sql.data
            return QuerySource(from_clause=data, columns={c.name: data.c[c.name] for c in self.schema.columns},
                               column_types=types, key_columns=tuple(self.schema.key_names))
        # rows whose latest write is old enough, plus the newest older version of the others
        data, versions = self.sql.data, self.sql.versions
        assert versions is not None
        names = self.schema.key_names
        colnames = [c.name for c in self.schema.columns]
        current = sa.select(*[data.c[n] for n in colnames]).where(data.c[TS] <= ts)
        latest = (sa.select(*[versions.c[k] for k in names], sa.func.max(versions.c[TS]).label("m"))
                  .where(versions.c[TS] <= ts).group_by(*[versions.c[k] for k in names]).subquery("latest"))
        newer_current = sa.exists().where(*[data.c[k] == versions.c[k] for k in names], data.c[TS] <= ts)
        older = (sa.select(*[versions.c[n] for n in colnames])
                 .join(latest, sa.and_(*[versions.c[k] == latest.c[k] for k in names],
                                       versions.c[TS] == latest.c["m"]))
                 .where(versions.c[DELETED] == sa.false(), ~newer_current))
        visible = sa.union_all(current, older).subquery("visible")
        return QuerySource(from_clause=visible, columns={c.name: visible.c[c.name] for c in self.schema.columns},
                           column_types=types, key_columns=tuple(self.schema.key_names))

    def compact(self, conn: sa.Connection, horizon: int) -> int:
        """Drop versions no read at or after ``horizon`` can see; returns the number removed.

        Such a read sees, per key, the newest version at or before it: an older version superseded
        at or before ``horizon`` (by a newer one here or by the data row) is never seen again, and
        a tombstone at or before ``horizon`` reads the same as no version at all."""
        data, versions = self.sql.data, self.sql.versions
        if versions is None:
            return 0
        names = self.schema.key_names
        newer = versions.alias("newer")
        superseded = sa.or_(
            sa.exists().where(*[newer.c[k] == versions.c[k] for k in names],
                              newer.c[TS] > versions.c[TS], newer.c[TS] <= horizon),
            sa.exists().where(*[data.c[k] == versions.c[k] for k in names], data.c[TS] <= horizon))
        removed = conn.execute(versions.delete().where(
            versions.c[TS] <= horizon, sa.or_(versions.c[DELETED] == sa.true(), superseded))).rowcount
        rl = read_locks_table
        conn.execute(rl.delete().where(rl.c.table_id == self.table_id, rl.c.timestamp < horizon))
        return int(removed or 0)


#: a change's kind by its name on the wire
WRITE_KINDS = {kind.value: kind for kind in WriteKind}


def encode_writes(writes: list[RowWrite]) -> dict[str, Any]:
    """Writes as JSON-able columns: the rows, and each other field once when all writes share it
    (the usual case: a batch of whole-row writes) or as a list. A sync replica's prepare carries
    up to 100,000 writes: a map per write would cost more than the rows themselves."""
    out: dict[str, Any] = {"rows": [w.row for w in writes]}
    for name, values in (("kind", [w.kind.value for w in writes]), ("mask", [w.mask for w in writes]),
                         ("update", [w.update for w in writes]), ("shared", [w.shared for w in writes]),
                         ("strong", [w.strong for w in writes])):
        first = values[0] if values else None
        out[name] = first if values.count(first) == len(values) else values
    return out


def decode_writes(data: dict[str, Any]) -> list[RowWrite]:
    """The writes of :func:`encode_writes` (or of the older form, a list of per-write maps)."""
    if "writes" in data:
        return [RowWrite.from_payload(w) for w in data["writes"]]
    rows = data["rows"]
    n = len(rows)

    def column(name: str, default: Any) -> list[Any]:
        value = data.get(name, default)
        if isinstance(value, list):
            if len(value) != n:
                raise YtError(f"Malformed writes: {len(value)} values of {name!r} for {n} rows",
                              code=ErrorCode.PROTOCOL_ERROR)
            return value
        return [value] * n

    try:
        kinds = [WRITE_KINDS[k] for k in column("kind", "write")]
    except KeyError as exc:
        raise YtError(f"Malformed writes: unknown kind {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
    return [RowWrite(kind, row, int(mask), bool(update), bool(shared), bool(strong))
            for kind, row, mask, update, shared, strong in zip(
                kinds, rows, column("mask", 1), column("update", False), column("shared", False),
                column("strong", False), strict=True)]


def _payloads(writes: list[RowWrite], doubles: list[str]) -> list[str]:
    """:func:`_payload` of every write, with one orjson call for all the rows.

    orjson encodes a list of flat rows as ``[{...},{...}]``; split at the ``},{`` between rows
    (safe when there are exactly as many as row boundaries, i.e. no value holds one) each row is
    wrapped into its payload. A ``null`` in the output may be a NaN or an infinity, which only
    :func:`_payload` keeps: then, and for anything orjson refuses, each row is encoded alone."""
    try:
        whole = orjson.dumps([w.row for w in writes])
    except TypeError:
        whole = b""
    plain = whole.startswith(b"[{") and whole.count(b"},{") == len(writes) - 1 and not (
        b"null" in whole and any(not math.isfinite(w.row[n]) for w in writes for n in doubles
                                 if w.row.get(n) is not None))
    if not plain:
        return [_payload(w, doubles) for w in writes]
    flags = (b'},"update":false}', b'},"update":true}')
    return [(b'{"row":{' + part + flags[w.update]).decode()
            for part, w in zip(whole[2:-2].split(b"},{"), writes, strict=True)]


def _payload(write: RowWrite, doubles: list[str]) -> str:
    """A queue row's change as JSON text: orjson (fast) unless a double is NaN or infinite, which
    JSON cannot carry and orjson would turn into null; the standard encoder keeps them."""
    row = write.row
    for name in doubles:
        value = row.get(name)
        if value is not None and not math.isfinite(value):
            return json.dumps({"row": row, "update": write.update})
    return orjson.dumps({"row": row, "update": write.update}).decode()


def _masks_conflict(a: int, b: int) -> bool:
    """Lock groups conflict on overlap; the primary lock (bit 0) conflicts with every group."""
    if a & b:
        return True
    return bool((a & 1) and b) or bool((b & 1) and a)


def _chunks(items: list[Any], size: int = _CHUNK) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def validate_key_not_null(schema: TableSchema, row: dict[str, Any], path: str) -> None:
    for col in schema.key_columns:
        if row.get(col.name) is None:
            raise SchemaViolation(f"Key column {col.name!r} of table {path} cannot be null "
                                  "(reptables keys are SQL primary keys)",
                                  attributes={"column": col.name, "path": path})


def parse_pivot_keys(raw: Any, schema: TableSchema, path: str) -> list[list[Any]]:
    pivots = yson_util.to_python(raw)
    if not isinstance(pivots, list) or not pivots or any(not isinstance(p, list) for p in pivots):
        raise YtError(f"Invalid pivot keys for table {path}: expected a list of key lists",
                      code=ErrorCode.INVALID_PARAMETER)
    if pivots[0] != []:
        raise YtError(f"Invalid pivot keys for table {path}: the first pivot key must be []",
                      code=ErrorCode.INVALID_PARAMETER)
    keycols = schema.key_columns
    for p in pivots[1:]:
        if len(p) > len(keycols) or not p:
            raise YtError(f"Invalid pivot key {p} for table {path}: it must be a non-empty prefix of "
                          f"the key columns {[c.name for c in keycols]}", code=ErrorCode.INVALID_PARAMETER)
        for value, col in zip(p, keycols, strict=False):
            if value is not None and col.type in (ColumnType.INT64, ColumnType.UINT64) and (
                    isinstance(value, bool) or not isinstance(value, int)):
                raise YtError(f"Invalid pivot key {p} for table {path}: value {value!r} does not match "
                              f"key column {col.name!r} of type {col.type.value}", code=ErrorCode.INVALID_PARAMETER)
            if value is not None and col.type is ColumnType.STRING and not isinstance(value, str):
                raise YtError(f"Invalid pivot key {p} for table {path}: value {value!r} does not match "
                              f"key column {col.name!r} of type string", code=ErrorCode.INVALID_PARAMETER)
    sort_keys = [key_sort_tuple(tuple(p)) for p in pivots[1:]]
    if any(a >= b for a, b in zip(sort_keys, sort_keys[1:], strict=False)):
        raise YtError(f"Invalid pivot keys for table {path}: pivot keys must be strictly increasing",
                      code=ErrorCode.INVALID_PARAMETER)
    return pivots
