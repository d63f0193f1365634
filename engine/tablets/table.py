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
A replicated table's replication queue is such a table too; its appends, reads and trims are in
``queue.py``, the row changes themselves in ``writes.py``, key and tablet helpers in ``keys.py``.

Locking: a ``DynamicTable`` has no lock of its own. Everything in it - row counts, remembered
commits, its state and layout - is changed only under ``Storage.write_lock``, inside a write
transaction whose rollback undoes the in-memory changes too (``on_rollback``), or at start-up
before any other thread runs. Readers without the writer lock (lookups, selects, replicators)
read the fields as they stand (single assignments); what they must not see before the SQL commit,
the queue tail, is published after it (``on_commit``). Under the writer lock the table calls out
to one thing only: ``pinned_by``, which takes the transaction manager's session lock (a leaf).
"""

from __future__ import annotations

import bisect
import operator
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from .. import yson_util
from ..config import DEFAULT_CONFIG, EngineConfig
from ..errors import ErrorCode, SchemaViolation, TabletStateError, YtError
from ..query import QuerySource
from ..schema import TableSchema
from ..storage import (
    DELETED,
    LOCK_MASK,
    ROW_INDEX,
    TABLET_INDEX,
    TS,
    UserTables,
    on_commit,
    on_rollback,
    read_locks_table,
    tablets_table,
)
from ..timestamps import COUNTER_BITS
from . import changes, queue, xdcr
from .keys import key_sort_tuple
from .queue import QueueEntry
from .writes import RowWrite, WriteKind, masks_conflict

#: rows per SQL statement when we bind key lists
_CHUNK = 500
#: up to this many keys, a lookup runs one prepared point query per key
_POINT_LOOKUPS = 8


class TabletState(StrEnum):
    UNMOUNTED = "unmounted"
    MOUNTING = "mounting"
    MOUNTED = "mounted"
    FREEZING = "freezing"
    FROZEN = "frozen"
    UNFREEZING = "unfreezing"
    UNMOUNTING = "unmounting"



@dataclass
class DynamicTable:
    """A mounted-or-not dynamic table and its tablets."""

    # Every field below is changed only under Storage.write_lock (the node mounts, reshards and
    # alters under it; commits apply under it) and read by lock-free readers as it stands.
    table_id: str
    schema: TableSchema
    sql: UserTables
    pivot_keys: list[list[Any]] = field(default_factory=lambda: [[]])
    tablet_count_ordered: int = 1
    state: TabletState = TabletState.UNMOUNTED
    atomicity: str = "full"
    #: ordered tables: per tablet [row_count, trimmed_row_count]; kept in sync with _rt_tablets.
    #: Changed only under Storage.write_lock (a rolled-back append is undone with its transaction)
    tablet_rows: dict[int, list[int]] = field(default_factory=dict)
    #: a replicated table stores only its replication queue (seed 002)
    replicated: bool = False
    #: replicated tables: the commit timestamp of the newest change trimmed from the queue (0: none
    #: ever was). A replica that starts before it cannot get its history from the queue. Changed
    #: only under Storage.write_lock; kept on the table's node (``_rt_trimmed_timestamp``)
    trimmed_timestamp: int = 0
    #: sorted tables: versions superseded at or before this timestamp were compacted away, so a read
    #: at an earlier timestamp could see a wrong row; such reads are refused (1708). Changed only under
    #: Storage.write_lock; kept on the table's node (``_rt_compacted_until``)
    compacted_until: int = 0
    #: a replica table accepts writes only from this upstream replica (None: from anyone)
    upstream_replica_id: str | None = None
    #: whether _rt_read_locks may hold rows of this table (skips a query per commit when not)
    has_read_locks: bool = True
    #: recent commits (timestamp, writes by key), complete for every commit with a timestamp above
    #: ``recent_floor``; a conflict check of a transaction that started earlier reads SQL instead.
    #: The owner sets the floor to a fresh timestamp when it makes the table (nothing known before)
    #: in commit order: (timestamp, the largest timestamp so far, writes by key).
    #: ``recent``, ``recent_keys`` and ``recent_floor`` are read and changed only under
    #: Storage.write_lock (commits remember, conflict checks read, a rollback forgets)
    recent: deque[tuple[int, int, dict[Any, RowWrite]]] = field(default_factory=deque)
    recent_keys: int = 0
    recent_floor: int = 1 << 64
    #: the start timestamp of the oldest running transaction (commits after it must be remembered);
    #: called under Storage.write_lock, it takes the transaction manager's session lock (a leaf)
    pinned_by: Callable[[], int | None] | None = None
    #: replicated tables: per tablet, the newest queue rows (first row index, entries). Replaced
    #: only by an on_commit hook (after the SQL commit, under Storage.write_lock); replicators read
    #: it without any lock (see ``queue.py``)
    queue_tail: dict[int, tuple[int, list[QueueEntry]]] = field(default_factory=dict)
    #: change streams: the seq of the next change logged (``changes.py``); changed only under
    #: Storage.write_lock, inside the commit that logs (a rollback puts it back)
    change_seq: int = 0
    #: change streams: the newest position trimmed from the log (or, replicated, the queue); a
    #: stream may start only after it. Changed only under Storage.write_lock; kept on the table's
    #: node (``_rt_changes_trimmed``)
    changes_trimmed: tuple[int, int] = (0, 0)
    #: called after every commit that changed the table (wakes stream pulls waiting for changes);
    #: runs under Storage.write_lock and takes only a leaf lock
    on_change: Callable[[], None] | None = None
    #: XDCR (docs/xdcr.md): this cluster's id when the table is an XDCR table (its rows are
    #: versioned in ``_rt_xdcr_rows`` and its changes carry versions), else None. Changed only
    #: under Storage.write_lock
    xdcr_cluster_id: int | None = None
    #: XDCR: the engine's clock of row versions (``xdcr.VersionClock``)
    xdcr_clock: Any = None
    #: the engine's tunables this table uses: ``queue_tail_rows``, ``recent_commit_keys``,
    #: ``recent_commit_grace_seconds`` (the node passes its own; never changed after creation)
    config: EngineConfig = DEFAULT_CONFIG

    def __post_init__(self) -> None:
        # a table is made at start-up (or creation), when no commit is in flight: one stored as
        # freezing (the engine stopped mid-freeze) is frozen
        if self.state == TabletState.FREEZING:
            self.state = TabletState.FROZEN

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
        # freezing refuses writes as frozen does: only commits already past this check go on
        if self.state in (TabletState.FROZEN, TabletState.FREEZING):
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

    # -- schema changes --------------------------------------------------------------------------

    def is_empty(self, conn: sa.Connection) -> bool:
        """Whether the table holds no row: no stored row or version, no queued change (for
        ``alter_table``, which lets an empty table take a new required column)."""
        if self.replicated or not self.sorted:
            if any(count > 0 for count, _ in self.tablet_rows.values()):
                return False
            if self.replicated:
                return True
        for table in (self.sql.data, self.sql.versions):
            if table is not None and conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first():
                return False
        return True

    def alter_schema(self, conn: sa.Connection, schema: TableSchema, added: list[str]) -> None:
        """Give the table ``schema`` (already checked to be a compatible widening of its own, adding
        the columns ``added``) inside the caller's write transaction, under the writer lock.

        The SQL tables get the new columns (a replicated table's queue needs none: its payloads
        are rows by column name), and the table a new SQL shape. The new shape and schema are
        published when the SQL commit is done (``on_commit``), the shape first: a lock-free reader
        takes the schema from the shape it reads (``UserTables.schema``), so it never names a
        column the SQL table it reads lacks. A rollback leaves everything as it was."""
        sql = UserTables.queue(self.sql.sql_name, schema) if self.replicated else \
            UserTables(self.sql.sql_name, schema)
        sql.add_columns(conn, added)

        def publish() -> None:
            self.sql = sql
            self.schema = schema
            # compiled statements naming every column (the "move" of replaced images) are stale
            self.__dict__.pop("_key_statements", None)

        on_commit(conn, publish)

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
                    if other.kind is not WriteKind.LOCK and masks_conflict(other.mask, writes[key].mask):
                        return key, why
        else:
            for key, mask in self._writes_after(conn, list(writes), start_ts):
                if masks_conflict(mask, writes[key].mask):
                    return key, why
        if self.has_read_locks and any(not w.shared for w in writes.values()):
            rl = read_locks_table
            stmt = sa.select(rl.c.row_key, rl.c.lock_mask).where(
                rl.c.table_id == self.table_id, rl.c.timestamp > start_ts)
            for row_key, mask in conn.execute(stmt):
                key = tuple(yson_util.loads_text(row_key))
                w = writes.get(key)
                if w is not None and not w.shared and masks_conflict(mask, w.mask):
                    return key, "a lock taken after the transaction start timestamp"
        return None

    def _writes_after(self, conn: sa.Connection, keys: list[tuple[Any, ...]],
                      start_ts: int) -> Iterator[tuple[tuple[Any, ...], int]]:
        """(key, lock mask) of every write to ``keys`` committed after ``start_ts``, from SQL."""
        nkeys = len(self.schema.key_names)
        for which, table in (("data", self.sql.data), ("versions", self.sql.versions)):
            assert table is not None

            def build(key_in: sa.ColumnElement[bool], table: sa.Table = table) -> sa.ClauseElement:
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
        max_keys = self.config.recent_commit_keys
        cutoff = commit_ts - int(self.config.recent_commit_grace_seconds * (1 << COUNTER_BITS))
        if recent[0][0] > cutoff and self.recent_keys <= max_keys:
            return
        pin = self.pinned_by() if self.pinned_by is not None else None
        if pin is not None:
            cutoff = min(cutoff, pin)
        floor = self.recent_floor if self.recent_floor < (1 << 64) else 0
        while recent and (recent[0][0] <= cutoff or self.recent_keys > max_keys):
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
        if self.on_change is not None:
            on_commit(conn, self.on_change)
        if self.replicated:
            return queue.append(self, conn, writes, commit_ts, tablet_index or 0)
        seq = self.change_seq
        on_rollback(conn, lambda: setattr(self, "change_seq", seq))
        if self.sorted:
            if keyed is None:
                key_of = self.key_of
                keyed = {key_of(w.row): w for w in writes}
            return self._apply_sorted(conn, writes, commit_ts, keyed)
        return self._apply_ordered(conn, writes, commit_ts, tablet_index or 0)

    def read_queue(self, conn: sa.Connection, tablet_index: int, from_row: int, limit: int) -> list[QueueEntry]:
        """Up to ``limit`` committed changes of a replication queue from ``from_row`` on (no writer lock)."""
        return queue.read(self, conn, tablet_index, from_row, limit)

    def first_timestamp_from(self, conn: sa.Connection, tablet_index: int, from_row: int) -> int | None:
        """Commit timestamp of the queue row at ``from_row`` (the oldest unreplicated change)."""
        return queue.first_timestamp_from(self, conn, tablet_index, from_row)

    def trim_queue(self, conn: sa.Connection, tablet_index: int, below_row: int, not_after_ts: int) -> int:
        """Drop queue rows below ``below_row`` committed at or before ``not_after_ts``."""
        return queue.trim(self, conn, tablet_index, below_row, not_after_ts)

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
        #: the change log (``changes.py``): (key, image or None for a delete), in write order
        logged: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]] = []
        nkeys = len(keys)
        key_positions = [names.index(k) for k in keys]
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
                logged.append((image[:nkeys] if key_positions == list(range(nkeys))
                               else tuple(image[i] for i in key_positions), image))
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
                logged.append((deletes[-1], None))
                continue
            merged = dict(current.get(self.key_of(row)) or {})
            merged.update(row)
            image = tuple(merged.get(n) for n in names)
            upserts.append((*image, commit_ts, w.mask))
            logged.append((tuple(image[i] for i in key_positions), image))
        changed = [k for k in keyed if k not in locks_only] if locks_only else list(keyed)
        existed: set[tuple[Any, ...]] = set()
        versioned = self.xdcr_cluster_id is not None
        before: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        if changed:
            # the images this commit replaces become older versions (and tell the log which keys
            # had a row: an update, not an insert; an XDCR table's log also gets the whole image)
            if versioned:
                for result in self._run_with_keys(conn, "move_full", data, self._move_full_statement, changed):
                    for image in result:
                        key = tuple(image[i] for i in key_positions)
                        existed.add(key)
                        before[key] = tuple(image)
            else:
                for result in self._run_with_keys(conn, "move", data, self._move_statement, changed):
                    existed.update(map(tuple, result))
        if deletes:
            for _ in self._run_with_keys(conn, "remove", data, lambda key_in: data.delete().where(key_in), deletes):
                pass
            self.sql.bulk("insert:versions", conn).run(conn, tombstones, [*names, TS, DELETED, LOCK_MASK])
        self.sql.bulk("upsert:data", conn).run(conn, upserts, [*names, TS, LOCK_MASK])
        if logged:
            single = len(self.pivot_keys) == 1
            extras = self._xdcr_versions(conn, keyed, logged, commit_ts, before, names) if versioned else None
            changes.record(self, conn, commit_ts, (
                (0 if single else self.tablet_of_key(key),
                 "delete" if image is None else "update" if key in existed else "insert",
                 None if image is None else dict(zip(names, image, strict=True)),
                 list(key) if image is None else None, None)
                for key, image in logged), extras)
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
                       build: Callable[[sa.ColumnElement[bool]], sa.ClauseElement], keys: list[tuple[Any, ...]],
                       extra: dict[str, Any] | None = None) -> Iterator[sa.CursorResult[Any]]:
        """Run ``build(key IN (...))`` (the key columns of ``table``) once per chunk of ``keys``; yields
        each result.

        The statement is compiled once per chunk length and run straight on the driver: SQLAlchemy
        would otherwise render and process thousands of bound values on every execution."""
        # compiled statements by (name, list length, dialect); filled only under Storage.write_lock
        # (every caller is a commit or a conflict check)
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
                binds: list[list[sa.BindParameter[Any]]] = [
                    [sa.bindparam(f"k{i}_{j}") for j in range(nkeys)] for i in range(size)]
                key_in = cols[0].in_([b[0] for b in binds]) if nkeys == 1 else \
                    sa.tuple_(*cols).in_([sa.tuple_(*b) for b in binds])
                compiled = cast(SQLCompiler, build(key_in).compile(dialect=conn.dialect))
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

    def _xdcr_versions(self, conn: sa.Connection, keyed: dict[Any, RowWrite],
                       logged: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]], commit_ts: int,
                       before: dict[tuple[Any, ...], tuple[Any, ...]], names: list[str]) -> list[dict[str, Any]]:
        """XDCR: the new version of every changed row (stored beside it, ``tablets/xdcr.py``) and
        what the log carries to the peers: the change's version, the version it was made on
        (``e``: [timestamp, cluster id, deleted], None on no row) and the image it replaced."""
        own = self.xdcr_cluster_id
        assert own is not None
        unread = [key for key, _ in logged if not ((w := keyed.get(key)) is not None and w.here_known)]
        current = xdcr.read_versions(conn, self.table_id, unread)
        versions: dict[tuple[Any, ...], xdcr.RowVersion] = {}
        extras: list[dict[str, Any]] = []
        for key, image in logged:
            write = keyed.get(key)
            origin = write.origin if write is not None else None
            cur = write.here if write is not None and write.here_known else current.get(key)
            if origin is None:
                version: xdcr.Version = (self.xdcr_clock.next(), own)
                parent = None if cur is None else cur.version
            else:
                version, parent = origin, write.origin_parent if write is not None else None
            deleted = image is None
            stored = version
            if deleted and cur is not None and cur.deleted:
                stored = xdcr.newer(version, cur.version)  # a delete of a deleted row: the later tombstone
            versions[key] = xdcr.RowVersion(stored, deleted, parent)
            replaced = before.get(key)
            extras.append({"o": list(version),
                           "e": None if cur is None else [cur.version[0], cur.version[1], cur.deleted],
                           "b": None if replaced is None else dict(zip(names, replaced, strict=False))})
        xdcr.write_versions(conn, self.table_id, versions)
        return extras

    def _move_full_statement(self, key_in: sa.ColumnElement[bool]) -> sa.ClauseElement:
        """The move of replaced images, returning each whole image (XDCR: the log carries it)."""
        data, versions = self.sql.data, self.sql.versions
        assert versions is not None
        names = [c.name for c in self.schema.columns]
        image = sa.select(*[data.c[n] for n in names], data.c[TS], sa.false(), data.c[LOCK_MASK]).where(key_in)
        return versions.insert().from_select([*names, TS, DELETED, LOCK_MASK], image).returning(
            *[versions.c[n] for n in names])

    def _move_statement(self, key_in: sa.ColumnElement[bool]) -> sa.ClauseElement:
        """INSERT INTO versions SELECT the current images of :keys (with their timestamps and masks)."""
        data, versions = self.sql.data, self.sql.versions
        assert versions is not None
        names = [c.name for c in self.schema.columns]
        image = sa.select(*[data.c[n] for n in names], data.c[TS], sa.false(), data.c[LOCK_MASK]).where(key_in)
        return versions.insert().from_select([*names, TS, DELETED, LOCK_MASK], image).returning(
            *[versions.c[k] for k in self.schema.key_names])

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
            changes.record(self, conn, commit_ts, (
                (tablet_index, "append", dict(zip(names, r[3:], strict=True)), None, r[1]) for r in rows))
            conn.execute(tablets_table.update().where(
                tablets_table.c.table_id == self.table_id,
                tablets_table.c.tablet_index == tablet_index).values(row_count=start + len(rows)))
            counts[0] = start + len(rows)

            def undo() -> None:
                counts[0] = start  # a rolled-back append leaves no gap in $row_index

            on_rollback(conn, undo)
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
        sql = self.sql  # one shape and its schema, even if an alter_table replaces them meanwhile
        schema = sql.schema
        data = sql.data
        names = schema.key_names
        result: dict[tuple[Any, ...], dict[str, Any]] = {}
        colnames = [c.name for c in schema.columns]
        if len(keys) <= _POINT_LOOKUPS:
            # a few keys: a point query compiled once per table, run straight on the driver
            point = sql.bulk("point:data", conn)
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
        cols = [data.c[c.name] for c in schema.columns]
        for chunk in _chunks(keys):
            stmt = sa.select(*cols).where(sa.tuple_(*[data.c[k] for k in names]).in_(chunk))
            for row in conn.execute(stmt):
                d = dict(zip(colnames, row, strict=True))
                result[tuple(d[k] for k in names)] = d
        return result

    def _fetch_at(self, conn: sa.Connection, keys: list[tuple[Any, ...]], ts: int) -> dict[tuple[Any, ...], dict]:
        """Rows as of ``ts``: the data row if its latest write is that old, else the newest older version."""
        sql = self.sql
        data, versions = sql.data, sql.versions
        assert versions is not None
        names = sql.schema.key_names
        colnames = [c.name for c in sql.schema.columns]
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
        return self._query_source(self.sql, ts)

    def _query_source(self, sql: UserTables, ts: int | None) -> QuerySource:
        # one shape and its schema, even if an alter_table replaces them meanwhile
        schema = sql.schema
        types = {c.name: c.type.value for c in schema.columns}
        if not schema.is_sorted:
            data = sql.data
            cols: dict[str, sa.ColumnElement[Any]] = {
                "$tablet_index": data.c[TABLET_INDEX], "$row_index": data.c[ROW_INDEX],
                "$timestamp": data.c[TS]}
            cols.update({c.name: data.c[c.name] for c in schema.columns})
            types.update({"$tablet_index": "int64", "$row_index": "int64", "$timestamp": "uint64"})
            order = ("$tablet_index", "$row_index")
            if ts is None:
                return QuerySource(from_clause=data, columns=cols, column_types=types, key_columns=order)
            sub = sa.select(data).where(data.c[TS] <= ts).subquery("visible")
            return QuerySource(from_clause=sub, columns={
                name: sub.c[col.name] for name, col in cols.items()}, column_types=types, key_columns=order)
        if ts is None:
            data = sql.data
            return QuerySource(from_clause=data, columns={c.name: data.c[c.name] for c in schema.columns},
                               column_types=types, key_columns=tuple(schema.key_names))
        # rows whose latest write is old enough, plus the newest older version of the others
        data, versions = sql.data, sql.versions
        assert versions is not None
        names = schema.key_names
        colnames = [c.name for c in schema.columns]
        current = sa.select(*[data.c[n] for n in colnames]).where(data.c[TS] <= ts)
        latest = (sa.select(*[versions.c[k] for k in names], sa.func.max(versions.c[TS]).label("m"))
                  .where(versions.c[TS] <= ts).group_by(*[versions.c[k] for k in names]).subquery("latest"))
        newer_current = sa.exists().where(*[data.c[k] == versions.c[k] for k in names], data.c[TS] <= ts)
        older = (sa.select(*[versions.c[n] for n in colnames])
                 .join(latest, sa.and_(*[versions.c[k] == latest.c[k] for k in names],
                                       versions.c[TS] == latest.c["m"]))
                 .where(versions.c[DELETED] == sa.false(), ~newer_current))
        visible = sa.union_all(current, older).subquery("visible")
        return QuerySource(from_clause=visible, columns={c.name: visible.c[c.name] for c in schema.columns},
                           column_types=types, key_columns=tuple(schema.key_names))

    def check_snapshot(self, timestamp: int | None, path: str) -> None:
        """Refuse a read at a timestamp whose versions may have been compacted away."""
        if timestamp is not None and timestamp < self.compacted_until:
            raise YtError(f"Cannot read table {path} at timestamp {timestamp:#x}: its versions before "
                          f"{self.compacted_until:#x} were compacted (min_data_ttl); read at a later timestamp, or "
                          "raise @min_data_ttl before a long snapshot read", code=ErrorCode.TABLET_SNAPSHOT_EXPIRED,
                          attributes={"path": path, "timestamp": timestamp, "compacted_until": self.compacted_until})

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
        if removed and horizon > self.compacted_until:
            before = self.compacted_until
            self.compacted_until = horizon
            on_rollback(conn, lambda: setattr(self, "compacted_until", before))
        return int(removed or 0)



def _chunks(items: list[Any], size: int = _CHUNK) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
