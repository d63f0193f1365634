"""Dynamic tables: what a table is (its tablets, state and layout) and which storage serves a call.

``DynamicTable`` is the one object per dynamic table the node keeps: its schema and SQL shape, its
tablets (pivot keys, or a count of ordered tablets) and their row counts, its mount state, and the
in-memory state that changes with commits. It knows nothing of transactions beyond "apply these
already-validated, already-locked writes with this commit timestamp" and "which keys changed after
timestamp T" (the conflict check of seed 003).

Its methods route each call to the module that knows the storage: ``sorted_rows.py`` (sorted
tables: the latest image of every row and its older versions, reads at a timestamp, compaction),
``ordered_rows.py`` (ordered tables: per-tablet appends in commit order, ``trim_rows``),
``queue.py`` (a replicated table's replication queue), ``conflicts.py`` (the memory of recent
commits that conflict checks read), ``changes.py`` (the change log every commit writes),
``keys.py`` (key and tablet helpers). Those are functions of the table, not mixins: each declares
as a protocol what it uses of it.

Locking: a ``DynamicTable`` has no lock of its own. Everything in it - row counts, remembered
commits, its state and layout - is changed only under ``Storage.write_lock``, inside a write
transaction whose rollback undoes the in-memory changes too (``on_rollback``), or at start-up
before any other thread runs. Readers without the writer lock (lookups, selects, replicators)
read the fields as they stand (single assignments); what they must not see before the SQL commit,
the queue tail and a new schema, is published after it (``on_commit``). Under the writer lock the
table calls out to one thing only: ``pinned_by``, which takes the transaction manager's session
lock (a leaf).
"""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG, EngineConfig
from ..errors import ErrorCode, SchemaViolation, TabletStateError, YtError
from ..query import QuerySource
from ..schema import TableSchema
from ..storage import UserTables, on_commit, on_rollback
from ..timestamps import COUNTER_BITS
from . import conflicts, ordered_rows, queue, sorted_rows
from .changes import ChangeTail
from .keys import key_sort_tuple
from .queue import QueueRun
from .writes import ImageRun, RowWrite

#: a write's row
_ROW = attrgetter("row")
#: commit timestamps are ``(unix seconds << 30) | counter``: this shift gives a 64-second span
_MARK_SHIFT = COUNTER_BITS + 6


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
    #: how many reshards the table has had (kept on its node, ``_rt_layout_revision``): a replica
    #: cluster tells a newer tablet count of a replicated table from an older one by it. A reshard
    #: publishes the new tablets first and this after them, so a reader that reads this first and
    #: the tablet count second never pairs a new revision with an old count
    layout_revision: int = 0
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
    #: the horizon of the last compaction pass over the table (0: none yet in this process). While
    #: ``applied_ts`` is not past it, no version can have become droppable. Changed only under
    #: Storage.write_lock
    compacted_through: int = 0
    #: a compaction pass is due whatever :attr:`compaction_marks` say (set at start-up: the versions
    #: kept before it were superseded by commits this process never saw). Under Storage.write_lock
    compaction_due: bool = True
    #: the commits a compaction pass has not yet covered, as the smallest commit timestamp of each
    #: 64-second span that had one (ascending). A version becomes droppable only once a pass's horizon
    #: reaches the commit that superseded it, so a pass whose horizon is before the first mark has
    #: nothing to drop and is skipped: with the default ``@min_data_ttl`` of 30 minutes, a table
    #: written once was otherwise visited by every pass for 30 minutes (a write transaction each,
    #: every 30 s: at 1,000 tables, seconds of CPU a pass). At most one mark per span: 29 for 30
    #: minutes of writes. Changed only under Storage.write_lock (a rolled-back commit leaves its mark:
    #: at worst one pass too many)
    compaction_marks: list[int] = field(default_factory=list)
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
    queue_tail: dict[int, list[QueueRun]] = field(default_factory=dict)
    #: change streams: the seq of the next change logged (``changes.py``); changed only under
    #: Storage.write_lock, inside the commit that logs (a rollback puts it back)
    change_seq: int = 0
    #: change streams: the newest position trimmed from the log (or, replicated, the queue); a
    #: stream may start only after it. Changed only under Storage.write_lock; kept on the table's
    #: node (``_rt_changes_trimmed``)
    changes_trimmed: tuple[int, int] = (0, 0)
    #: change streams: the position a stream may start after at the earliest because the log was
    #: switched on there (an XDCR table's; a plain table's switch moves ``changes_trimmed``
    #: instead). Kept on the node (``_rt_stream_start``); changed only under Storage.write_lock
    stream_start: tuple[int, int] = (0, 0)
    #: change streams: whether commits log every change (``@enable_change_log``; on an XDCR table
    #: by default). A table nobody streams writes no log: the log would double the rows every
    #: commit writes. An XDCR table logs its own changes whatever this says (its shippers read
    #: them); with it false, not the changes it received. Changed only under Storage.write_lock
    change_log: bool = False
    #: the latest logged changes, kept while streams pull them (``changes.ChangeTail``; made by a
    #: pull, let go by a commit once no pull used it for a while). Set under Storage.write_lock
    change_tail: ChangeTail | None = None
    #: the newest commit timestamp applied to the table (a log switched on starts after it), at
    #: least the moment this process started serving it (``note_start``); under Storage.write_lock
    applied_ts: int = 0
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
    def takes_images(self) -> bool:
        """Whether whole-row writes may come as an :class:`ImageRun`: a sorted table that keeps no
        change log and no XDCR versions (those need each change's row)."""
        return self.sorted and not self.replicated and not self.change_log and self.xdcr_cluster_id is None

    @property
    def tablet_count(self) -> int:
        return len(self.pivot_keys) if self.sorted else self.tablet_count_ordered

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]:
        names = self.schema.key_names
        if len(names) == 1:
            return (row[names[0]],)
        return tuple(row[name] for name in names)

    def keyed(self, writes: list[RowWrite]) -> dict[tuple[Any, ...], RowWrite]:
        """``writes`` by their rows' keys (a later write of a key replaces an earlier one), as
        ``{key_of(w.row): w for w in writes}`` but in C passes: a replica applies batches of up
        to 90,000 rows, and a call of :meth:`key_of` per row was a tenth of its apply."""
        names = self.schema.key_names
        rows = map(_ROW, writes)
        keys = zip(map(itemgetter(names[0]), rows)) if len(names) == 1 else map(itemgetter(*names), rows)
        return dict(zip(keys, writes, strict=True))

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

    def alter_schema(self, conn: sa.Connection, schema: TableSchema, added: list[str], path: str | None = None) -> None:
        """Give the table ``schema`` (already checked to be a compatible widening of its own, adding
        the columns ``added``) inside the caller's write transaction, under the writer lock; its SQL
        view (named after ``path``) is made again with them.

        The SQL tables get the new columns (a replicated table's queue needs none: its payloads
        are rows by column name), and the table a new SQL shape. The new shape and schema are
        published when the SQL commit is done (``on_commit``), the shape first: a lock-free reader
        takes the schema from the shape it reads (``UserTables.schema``), so it never names a
        column the SQL table it reads lacks. A rollback leaves everything as it was."""
        sql = UserTables.queue(self.sql.sql_name, schema) if self.replicated else \
            UserTables(self.sql.sql_name, schema)
        sql.add_columns(conn, added)
        if path is not None:
            sql.create_view(conn, path)  # the table's SQL view shows the new columns too

        def publish() -> None:
            self.sql = sql
            self.schema = schema
            # compiled statements naming every column (the "move" of replaced images) are stale
            sorted_rows.drop_compiled(self)

        on_commit(conn, publish)

    # -- conflict checks (``conflicts.py``) ------------------------------------------------------

    def find_conflicts(self, conn: sa.Connection, writes: dict[tuple[Any, ...], RowWrite],
                       start_ts: int) -> tuple[tuple[Any, ...], str] | None:
        """First key whose write or lock conflicts with history after ``start_ts`` (seed 003)."""
        return conflicts.find(self, conn, writes, start_ts)

    def remember_commit(self, commit_ts: int, writes: dict[Any, RowWrite]) -> None:
        """Keep a commit's writes for conflict checks; forget the ones no check can need any more."""
        conflicts.remember(self, commit_ts, writes)

    # -- applying writes -------------------------------------------------------------------------

    def apply(self, conn: sa.Connection, writes: list[RowWrite] | ImageRun, commit_ts: int,
              tablet_index: int | None = None, keyed: dict[Any, RowWrite] | None = None) -> int:
        """Apply merged writes with ``commit_ts``; returns the number of data rows written.

        ``keyed`` is the same writes by key, when the caller has it (a sorted table needs it).
        An :class:`ImageRun` (whole rows as images: an async replica's push) is applied as such
        where the table needs no row of each change (no change log, no XDCR versions)."""
        if self.on_change is not None:
            on_commit(conn, self.on_change)
        if isinstance(writes, ImageRun):
            if not self.takes_images or writes.names != tuple(c.name for c in self.schema.columns):
                # (the log needs each change's row; an alter since the images were made: by name)
                writes, keyed = writes.writes(), None
            else:
                return self._apply_images(conn, writes, commit_ts, keyed)
        if self.replicated:
            return queue.append(self, conn, writes, commit_ts, tablet_index or 0)
        seq = self.change_seq
        on_rollback(conn, lambda: setattr(self, "change_seq", seq))
        if commit_ts > self.applied_ts:
            self.applied_ts = commit_ts  # (not put back on a rollback: a start too late skips nothing kept)
        if self.sorted:
            self.mark_for_compaction(commit_ts)
            if keyed is None:
                keyed = self.keyed(writes)
            by_key = keyed
            written = sorted_rows.apply(self, conn, writes, commit_ts, by_key)
            self.remember_commit(commit_ts, by_key)
            on_rollback(conn, lambda: conflicts.forget(self, by_key))
            return written
        return ordered_rows.append(self, conn, writes, commit_ts, tablet_index or 0)

    def _apply_images(self, conn: sa.Connection, run: ImageRun, commit_ts: int,
                      keyed: dict[Any, RowWrite] | None) -> int:
        if commit_ts > self.applied_ts:
            self.applied_ts = commit_ts
        self.mark_for_compaction(commit_ts)
        written = sorted_rows.apply_images(self, conn, run, commit_ts)
        # conflict checks read a remembered write's kind and lock mask only: one write for all keys
        by_key = keyed if keyed is not None else run.keyed()
        self.remember_commit(commit_ts, by_key)
        on_rollback(conn, lambda: conflicts.forget(self, by_key))
        return written

    def trim_rows(self, conn: sa.Connection, tablet_index: int, trimmed_row_count: int, path: str) -> None:
        ordered_rows.trim(self, conn, tablet_index, trimmed_row_count, path)

    # -- the replication queue (``queue.py``) ----------------------------------------------------

    def read_queue(self, conn: sa.Connection, tablet_index: int, from_row: int, limit: int) -> list[QueueRun]:
        """The runs holding up to ``limit`` committed changes of a replication queue from ``from_row`` on
        (no writer lock)."""
        return queue.read(self, conn, tablet_index, from_row, limit)

    def read_queue_tail(self, tablet_index: int, from_row: int, limit: int) -> list[QueueRun] | None:
        """:meth:`read_queue` from the in-memory tail, without a connection; None if the rows from
        ``from_row`` are no longer (or not) held there."""
        return queue.read_tail(self, tablet_index, from_row, limit)

    def first_timestamp_from(self, conn: sa.Connection, tablet_index: int, from_row: int) -> int | None:
        """Commit timestamp of the queue row at ``from_row`` (the oldest unreplicated change)."""
        return queue.first_timestamp_from(self, conn, tablet_index, from_row)

    def trim_queue(self, conn: sa.Connection, tablet_index: int, below_row: int, not_after_ts: int) -> int:
        """Drop queue rows below ``below_row`` committed at or before ``not_after_ts``."""
        return queue.trim(self, conn, tablet_index, below_row, not_after_ts)

    def uncounted_tablets(self, conn: sa.Connection, acknowledged: Callable[[int], int]) -> dict[int, list[int]]:
        """Tablets of a replication queue without row counts, and the counts the queue shows for them
        (``acknowledged(tablet)``: the largest row index a replica has acknowledged)."""
        return queue.uncounted_tablets(self, conn, self.tablet_count, acknowledged)

    # -- reads -----------------------------------------------------------------------------------

    def lookup(self, conn: sa.Connection, keys: list[tuple[Any, ...]], ts: int | None) -> list[dict | None]:
        # one shape and its schema, even if an alter_table replaces them meanwhile
        sql = self.sql
        found = sorted_rows.fetch_latest(sql, conn, keys) if ts is None else sorted_rows.fetch_at(sql, conn, keys, ts)
        return [found.get(k) for k in keys]

    def query_source(self, ts: int | None) -> QuerySource:
        """The relation a query reads: latest data, or the versions visible at ``ts``."""
        # one shape and its schema, even if an alter_table replaces them meanwhile
        sql = self.sql
        if not sql.schema.is_sorted:
            return ordered_rows.query_source(sql, ts)
        return sorted_rows.query_source(sql, ts)

    def check_snapshot(self, timestamp: int | None, path: str) -> None:
        """Refuse a read at a timestamp whose versions may have been compacted away."""
        if timestamp is not None and timestamp < self.compacted_until:
            raise YtError(f"Cannot read table {path} at timestamp {timestamp:#x}: its versions before "
                          f"{self.compacted_until:#x} were compacted (min_data_ttl); read at a later timestamp, or "
                          "raise @min_data_ttl before a long snapshot read", code=ErrorCode.TABLET_SNAPSHOT_EXPIRED,
                          attributes={"path": path, "timestamp": timestamp, "compacted_until": self.compacted_until})

    def mark_for_compaction(self, commit_ts: int) -> None:
        """Note a commit for :attr:`compaction_marks` (under the writer, as the commit applies)."""
        marks = self.compaction_marks
        span = commit_ts >> _MARK_SHIFT
        if not marks or marks[-1] >> _MARK_SHIFT < span:
            marks.append(commit_ts)  # (the usual case: commits come in timestamp order)
            return
        i = bisect.bisect_left(marks, span << _MARK_SHIFT)
        if i < len(marks) and marks[i] >> _MARK_SHIFT == span:
            marks[i] = min(marks[i], commit_ts)
        else:
            marks.insert(i, commit_ts)

    def note_start(self, ts: int) -> None:
        """This process starts serving a table that had commits before ``ts`` (a fresh timestamp):
        the versions they superseded were noted by no mark, so the first pass visits the table
        (``compaction_due``), and a mark at ``ts`` covers them: a version superseded within the
        ttl before the start is dropped by the pass whose horizon reaches ``ts``, not kept until
        the table's next write. Called before any commit applies here."""
        self.compaction_due = True
        self.applied_ts = max(self.applied_ts, ts)  # (a commit applied before this process is older)
        if self.sorted:
            self.mark_for_compaction(ts)

    def compaction_needed(self, horizon: int) -> bool:
        """Whether a compaction pass up to ``horizon`` may find a version to drop (a read without the
        writer lock: a commit racing it is seen by the next pass)."""
        if self.compaction_due:
            return True
        if self.applied_ts <= self.compacted_through:
            return False
        marks = self.compaction_marks
        return bool(marks) and marks[0] <= horizon

    def compact(self, conn: sa.Connection, horizon: int) -> int:
        """Drop versions no read at or after ``horizon`` can see; returns the number removed. The marks
        of the commits it covers (every 64-second span before the one of ``horizon``) are dropped,
        put back if the transaction rolls back."""
        removed = sorted_rows.compact(self, conn, horizon)
        marks, due, through = self.compaction_marks, self.compaction_due, self.compacted_through
        covered = bisect.bisect_left(marks, (horizon >> _MARK_SHIFT) << _MARK_SHIFT)
        self.compaction_marks = marks[covered:]
        self.compaction_due, self.compacted_through = False, max(through, horizon)

        def undo() -> None:
            self.compaction_marks, self.compaction_due, self.compacted_through = marks, due, through
        on_rollback(conn, undo)
        return removed
