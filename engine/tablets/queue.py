"""The replication queue of a replicated table: per tablet, its changes in commit order.

A replicated table stores no rows of its own (seed 002): every commit appends its changes to the
queue of each tablet it wrote (one SQL table keyed by ``(tablet_index, row_index)``, a SQL row per
run of one commit's changes of one kind: a 10,000-row commit is one SQL row, not 10,000), replicators
(one per replica) push them from there, and rows every replica has are trimmed. The newest rows of
each tablet are also kept in memory (``DynamicTable.queue_tail``) so that replicators keeping up
with the writes never read them back from SQL.

These are functions of a ``DynamicTable`` rather than methods so that ``table.py`` reads as "what
a table is and which kind of storage serves a call" (sorted rows in ``sorted_rows.py``, ordered
rows in ``ordered_rows.py``), the queue's own concerns (the in-memory tail, the payload encoding,
trimming) being here; the table keeps thin methods for its callers.

Locking: :func:`append` and :func:`trim` run inside a write transaction, under
``Storage.write_lock``; :func:`read` runs in replicator threads *without* it, and sees committed
rows only: the tail is extended by an ``on_commit`` hook after the SQL commit (still under the
writer lock), and replaced by a new list, never shifted in place, when it outgrows its bound.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Callable
from itertools import groupby, repeat
from operator import attrgetter, itemgetter, methodcaller
from typing import Any, NamedTuple, Protocol

import orjson
import sqlalchemy as sa

from ..config import EngineConfig
from ..schema import ColumnType, TableSchema
from ..storage import (
    KIND,
    PAYLOAD,
    ROW_COUNT,
    ROW_INDEX,
    SHARED_SQL,
    TABLET_INDEX,
    TS,
    FastStatement,
    UserTables,
    on_commit,
    on_rollback,
    tablets_table,
)
from .writes import RowWrite, WriteKind


class ColumnBlock(NamedTuple):
    """The rows of one commit's whole-row writes to one tablet, as columns: what replicators send as
    a push's ``columnar`` form (``replicator.render_columns``) while the commit is in the queue's
    in-memory tail. A column a row lacks is null there (a whole-row write sets every column)."""

    names: tuple[str, ...]
    #: one list per name, a value per change of the commit, in queue order
    values: list[list[Any]]
    #: the row index of the commit's first change
    start: int


class QueueEntry(NamedTuple):
    """One change in a replication queue, as a change stream reads it back from SQL (``read_sql``)."""

    row_index: int
    timestamp: int
    kind: str
    payload: str
    #: always None here (kept so that a run's changes and SQL's read alike)
    block: ColumnBlock | None


class QueueRun(NamedTuple):
    """A run of one commit's changes of one kind to one tablet's queue: what one SQL row of the
    queue holds, and what the in-memory tail and replicators work with.

    A commit of 10,000 rows is one run: one object in the tail instead of 10,000 entries (making
    them, and the garbage collector's passes over them, were about an eighth of a meta-cluster's
    insert), its payloads one text made in one pass. A replicator splits the text only where a
    batch cuts a run (its first and last run, seldom)."""

    #: the row index of the run's first change
    start: int
    #: how many changes it holds
    rows: int
    timestamp: int
    kind: str
    #: the changes' payloads (JSON text each) joined by newlines, which JSON text never holds
    #: outside its strings, where they are escaped (a run of one change: its payload as it is)
    text: str
    #: the commit's columns, while in the in-memory tail, for a commit of whole-row writes that
    #: JSON carries as they are; None for a run read back from SQL and for other changes (deletes,
    #: updates, rows JSON cannot carry as they are), which go as payloads
    block: ColumnBlock | None

    @property
    def end(self) -> int:
        """The row index after its last change."""
        return self.start + self.rows

    def payloads(self) -> list[str]:
        return [self.text] if self.rows == 1 else self.text.split("\n")

    def cut(self, low: int, high: int) -> QueueRun:
        """Its changes with row indices in ``[low, high)`` (within the run) as a run of their own."""
        if low <= self.start and high >= self.end:
            return self
        low, high = max(low, self.start), min(high, self.end)
        text = "\n".join(self.payloads()[low - self.start:high - self.start])
        return self._replace(start=low, rows=high - low, text=text)


#: the changes' text size of a run: its payloads' lengths (the newlines between them not counted)
def run_size(run: QueueRun) -> int:
    return len(run.text) - run.rows + 1


class QueueTable(Protocol):
    """What the queue functions use of a replicated table (``DynamicTable`` is one): the module
    needs no import of ``table.py``, which imports it."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    config: EngineConfig
    tablet_rows: dict[int, list[int]]
    trimmed_timestamp: int
    queue_tail: dict[int, list[QueueRun]]


#: a change's kind as the queue stores it (an enum's ``.value`` is a property call)
_KIND_NAMES = {kind: kind.value for kind in WriteKind}
_KIND, _UPDATE = attrgetter("kind"), attrgetter("update")

_SET_ROW_COUNT = FastStatement.update(tablets_table, "table_id", "tablet_index", columns=("row_count",))


def append(table: QueueTable, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
           tablet_index: int) -> int:
    """Append changes to the replication queue of one tablet, in commit order (under the writer lock)."""
    counts = table.tablet_rows.setdefault(tablet_index, [0, 0])
    start = counts[0]
    lock = WriteKind.LOCK
    # (C passes: a commit's batch is up to 100,000 changes)
    write_kinds = list(map(_KIND, writes))
    changes = writes if lock not in write_kinds else [w for w in writes if w.kind is not lock]
    if not changes:
        return 0
    doubles = [c.name for c in table.schema.columns if c.type is ColumnType.DOUBLE]
    if len(changes) != len(writes):
        write_kinds = list(map(_KIND, changes))
    kinds = list(map(_KIND_NAMES.__getitem__, write_kinds))
    texts, plain = _texts(changes, kinds, doubles)
    whole_rows = plain and write_kinds.count(WriteKind.WRITE) == len(changes) and not any(map(_UPDATE, changes))
    block = _block(table.schema, changes, start) if whole_rows else None
    runs = []
    at = start
    for kind, text, count in texts:
        runs.append(QueueRun(at, count, commit_ts, kind, text, block))
        at += count
    table.sql.bulk("insert:data", conn).run(
        conn, [(tablet_index, r.start, commit_ts, r.kind, r.text, r.rows) for r in runs],
        [TABLET_INDEX, ROW_INDEX, TS, KIND, PAYLOAD, ROW_COUNT])
    _SET_ROW_COUNT.run(conn, table_id=table.table_id, tablet_index=tablet_index, row_count=at)
    counts[0] = at
    tail_rows = table.config.queue_tail_rows

    def undo() -> None:
        counts[0] = start

    def publish() -> None:
        # replicators read the tail without the writer lock: it only ever holds committed rows
        tail = table.queue_tail.get(tablet_index)
        if not tail or tail[-1].end != start:
            tail = []
        tail.extend(runs)
        if at - tail[0].start > tail_rows:
            # a new list: a reader holding the tail must never see its runs shift under it
            keep = at - tail_rows // 2
            tail = tail[bisect_right(tail, keep, key=_START) - 1:]
        table.queue_tail[tablet_index] = tail

    on_rollback(conn, undo)
    on_commit(conn, publish)
    return at - start


#: the text between two payloads of whole-row writes: where orjson's ``},{`` between two rows was
_BETWEEN_ROWS = '},"update":false}\n{"row":{'


def _texts(changes: list[RowWrite], kinds: list[str], doubles: list[str]) -> tuple[list[tuple[str, str, int]], bool]:
    """The runs of one commit's changes to a tablet's queue as (kind, text, count): a run per run of
    changes of one kind (one, the usual commit of writes), its payloads joined by newlines; and
    whether every row is plain JSON (:func:`_payloads`).

    The usual commit - whole-row writes, plain rows - is one orjson call and one ``str.replace``:
    orjson's ``},{`` between two rows (exactly as many as row boundaries, :func:`_payloads`
    checked) becomes the end of one payload, a newline and the start of the next. Other commits are
    a payload per change joined per run. A payload holding a raw newline (neither encoder writes
    one) would go as a run of its own."""
    same_kind = kinds.count(kinds[0]) == len(kinds)
    if same_kind and not any(map(_UPDATE, changes)):
        whole, plain = _encode_rows(changes, doubles)
        if plain:
            text = '{"row":{' + whole[2:-2].decode().replace("},{", _BETWEEN_ROWS) + '},"update":false}'
            return [(kinds[0], text, len(changes))], True
    payloads, plain = _payloads(changes, doubles)
    if same_kind:
        grouped = [(kinds[0], payloads)]
    else:
        grouped = [(kind, list(map(_SECOND, group)))
                   for kind, group in groupby(zip(kinds, payloads, strict=True), _FIRST)]
    out: list[tuple[str, str, int]] = []
    for kind, run in grouped:
        joined = "\n".join(run)
        if joined.count("\n") == len(run) - 1:
            out.append((kind, joined, len(run)))
        else:
            out.extend(zip(repeat(kind), run, repeat(1)))
    return out, plain


_FIRST, _SECOND, _START = itemgetter(0), itemgetter(1), attrgetter("start")
#: queue rows a statement of a read from SQL takes (a row holds up to a commit's 100,000 changes)
_READ_PAGE = 16


def _holding(data: sa.Table, conn: sa.Connection, tablet_index: int, row: int) -> tuple[int, int, int] | None:
    """(first row index, row count, timestamp) of the queue row holding change ``row``, if any."""
    # compiled once per queue table (and on SQLite once for all: ``SharedSql``), run on the driver: the
    # trim pass asks it of every queue the first time it has rows, a thousand statements at once
    found = SHARED_SQL.statement(conn, data, "holding", lambda: sa.select(
        data.c[ROW_INDEX], data.c[ROW_COUNT], data.c[TS]).where(
        data.c[TABLET_INDEX] == sa.bindparam("tablet"), data.c[ROW_INDEX] <= sa.bindparam("row"))
        .order_by(data.c[ROW_INDEX].desc()).limit(sa.literal_column("1"))).first(
        conn, {"tablet": tablet_index, "row": row})
    if found is None or row >= int(found[0]) + int(found[1]):
        return None
    return int(found[0]), int(found[1]), int(found[2])


def read_sql(data: sa.Table, conn: sa.Connection, tablet_index: int, from_row: int, limit: int,
             bound_ts: int | None = None, whole_commits: bool = False) -> list[QueueEntry]:
    """Changes ``from_row`` on read from SQL, each run split back into its changes: ``limit`` of
    them (fewer at the end of the queue), those committed at or before ``bound_ts`` when given,
    and with ``whole_commits`` the rest of the last one's commit as well."""
    held = _holding(data, conn, tablet_index, from_row)
    at = held[0] if held is not None else from_row
    out: list[QueueEntry] = []
    last_ts: int | None = None
    columns = (data.c[ROW_INDEX], data.c[TS], data.c[KIND], data.c[PAYLOAD], data.c[ROW_COUNT])
    while True:
        where = [data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] >= at]
        if bound_ts is not None:
            where.append(data.c[TS] <= bound_ts)
        rows = conn.execute(sa.select(*columns).where(*where).order_by(data.c[ROW_INDEX]).limit(_READ_PAGE)).all()
        for first, ts, kind, payload, count in rows:
            first, ts = int(first), int(ts)
            if len(out) >= limit and not (whole_commits and ts == last_ts):
                return out if whole_commits else out[:limit]
            if count == 1:
                out.append(QueueEntry(first, ts, kind, payload, None))
            else:
                # (the driver's strings split in C; the entries zipped in C)
                out.extend(map(tuple.__new__, repeat(QueueEntry), zip(
                    range(first, first + int(count)), repeat(ts), repeat(kind), payload.split("\n"), repeat(None))))
            last_ts = ts
            if out[0].row_index < from_row:
                del out[:from_row - out[0].row_index]  # (the run holding from_row began before it)
        if len(rows) < _READ_PAGE:
            break
        at = int(rows[-1][0]) + 1
    return out if whole_commits else out[:limit]


def read_runs_sql(data: sa.Table, conn: sa.Connection, tablet_index: int, from_row: int,
                  limit: int) -> list[QueueRun]:
    """The runs holding changes ``from_row`` on read from SQL, ``limit`` changes of them (fewer at
    the end of the queue): the first run cut at ``from_row``, the last after the ``limit``-th change."""
    held = _holding(data, conn, tablet_index, from_row)
    at = held[0] if held is not None else from_row
    stop = from_row + limit
    out: list[QueueRun] = []
    columns = (data.c[ROW_INDEX], data.c[ROW_COUNT], data.c[TS], data.c[KIND], data.c[PAYLOAD])
    while True:
        rows = conn.execute(sa.select(*columns).where(data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] >= at)
                            .order_by(data.c[ROW_INDEX]).limit(_READ_PAGE)).all()
        for first, count, ts, kind, text in rows:
            run = QueueRun(int(first), int(count), int(ts), kind, text, None)
            if run.start >= stop:
                return out
            out.append(run.cut(from_row, stop))
        if len(rows) < _READ_PAGE or out and out[-1].end >= stop:
            return out
        at = int(rows[-1][0]) + 1


def read(table: QueueTable, conn: sa.Connection, tablet_index: int, from_row: int, limit: int) -> list[QueueRun]:
    """The runs holding up to ``limit`` committed changes from ``from_row`` on (the first and last
    cut to them): from the in-memory tail, else from SQL."""
    held = read_tail(table, tablet_index, from_row, limit)
    if held is not None:
        return held
    return [_with_columns(table.schema, run) for run in read_runs_sql(table.sql.data, conn, tablet_index, from_row,
                                                                       limit)]


def read_tail(table: QueueTable, tablet_index: int, from_row: int, limit: int) -> list[QueueRun] | None:
    """:func:`read` from the in-memory tail alone, without a connection; None if the tail does not
    hold ``from_row`` (the caller reads SQL). A replicator that keeps up pushes a commit or two at a
    time: a read connection taken for each would be a seventh of its push's interpreter time."""
    tail = table.queue_tail.get(tablet_index)
    if not tail or tail[0].start > from_row:
        return None
    stop = from_row + limit
    i = bisect_right(tail, from_row, key=_START) - 1
    out = []
    while i < len(tail) and tail[i].start < stop:
        if tail[i].end > from_row:
            out.append(tail[i].cut(from_row, stop))
        i += 1
    return out


def _with_columns(schema: TableSchema, run: QueueRun) -> QueueRun:
    """A run read back from SQL with its columns, when it is whole-row writes whose payloads are
    plain JSON: what the tail would have held. A replica behind the in-memory tail (after an
    outage, or slower than the writes) then gets columns as one that keeps up does, instead of
    entries, which cost it about twice the CPU per row (benchmarks/README.md): the meta parses the
    run's text once (one orjson call) for every replica that reads it. Any other run is returned as
    it is: deletes, updates, a payload JSON cannot parse as it is (NaN or infinity, which only the
    standard encoder wrote), a table with ``any`` columns (their YSON text)."""
    if run.kind != "write" or any(c.type is ColumnType.ANY for c in schema.columns):
        return run
    try:
        changes = orjson.loads("[" + run.text.replace("\n", ",") + "]")
    except orjson.JSONDecodeError:
        return run
    if len(changes) != run.rows or set(map(type, changes)) != {dict} or set(map(len, changes)) != {2}:
        return run
    try:
        if list(map(itemgetter("update"), changes)).count(False) != run.rows:
            return run
        rows = list(map(itemgetter("row"), changes))
    except KeyError:
        return run
    if set(map(type, rows)) != {dict}:
        return run
    if not set().union(*map(dict.keys, rows)) <= schema.by_name.keys():
        return run  # (a column the schema no longer has: as entries, which name it)
    return run._replace(block=_rows_block(schema, rows, run.start))


def timestamp_at(data: sa.Table, conn: sa.Connection, tablet_index: int, row: int) -> int | None:
    """Commit timestamp of the change at ``row`` of a tablet's queue, if it is there."""
    held = _holding(data, conn, tablet_index, row)
    return None if held is None else held[2]


def first_timestamp_from(table: QueueTable, conn: sa.Connection, tablet_index: int, from_row: int) -> int | None:
    """Commit timestamp of the queue row at ``from_row`` (the oldest unreplicated change)."""
    return timestamp_at(table.sql.data, conn, tablet_index, from_row)


def last_row(data: sa.Table, conn: sa.Connection, tablet_index: int) -> tuple[int, int] | None:
    """(first, last) change row index a tablet's queue holds, if any (two lookups in its key index)."""
    tablet_column, row_column = data.c[TABLET_INDEX], data.c[ROW_INDEX]
    # (min and max in two statements: SQLite looks either up in the index, not both at once)
    first = conn.execute(sa.select(sa.func.min(row_column)).where(tablet_column == tablet_index)).scalar()
    last = conn.execute(sa.select(row_column, data.c[ROW_COUNT]).where(tablet_column == tablet_index)
                        .order_by(row_column.desc()).limit(1)).first()
    if first is None or last is None:
        return None
    return int(first), int(last[0]) + int(last[1]) - 1


def uncounted_tablets(table: QueueTable, conn: sa.Connection, tablet_count: int,
                      acknowledged: Callable[[int], int]) -> dict[int, list[int]]:
    """The tablets that have no row counts (no ``_rt_tablets`` row), with the counts their queues show.

    Those are the tablets below ``tablet_count`` without counts, and those past it whose queues
    hold rows without counts (a reshard made no ``_rt_tablets`` rows for the tablets it added,
    before the fix of docs/reliability.md's first finding). Rows are appended at the end of a
    tablet's queue and trimmed from its start, so they are ``[trimmed_row_count, row_count)``;
    ``acknowledged(tablet)`` is the largest row index a replica has acknowledged (the queue had
    every row below it), where a queue trimmed empty ends. Only the queue's key index is read:
    two lookups per tablet, none over its rows."""
    data = table.sql.data
    tablet_column = data.c[TABLET_INDEX]
    uncounted = [t for t in range(tablet_count) if t not in table.tablet_rows]
    after = tablet_count
    while True:  # the tablets past the count holding rows, one index lookup each
        tablet = conn.execute(sa.select(sa.func.min(tablet_column)).where(tablet_column >= after)).scalar()
        if tablet is None:
            break
        if int(tablet) not in table.tablet_rows:
            uncounted.append(int(tablet))
        after = int(tablet) + 1
    found: dict[int, list[int]] = {}
    for tablet in uncounted:
        held = last_row(data, conn, tablet)
        end = acknowledged(tablet)
        found[tablet] = [end, end] if held is None else [max(held[1] + 1, end), held[0]]
    return found


def trim(table: QueueTable, conn: sa.Connection, tablet_index: int, below_row: int, not_after_ts: int) -> int:
    """Drop queue rows below ``below_row`` committed at or before ``not_after_ts`` (under the writer
    lock); ``table.trimmed_timestamp`` then covers the newest change dropped (the caller keeps it)."""
    data = table.sql.data
    counts = table.tablet_rows.setdefault(tablet_index, [0, 0])
    oldest = first_timestamp_from(table, conn, tablet_index, counts[1])
    if oldest is None or oldest > not_after_ts:
        return 0  # nothing old enough: no scan
    # timestamps grow along the queue: binary search the last row old enough to go
    low, high = counts[1], below_row - 1
    while low < high:
        middle = (low + high + 1) // 2
        ts = first_timestamp_from(table, conn, tablet_index, middle)
        if ts is not None and ts <= not_after_ts:
            low = middle
        else:
            high = middle - 1
    last = low
    held = _holding(data, conn, tablet_index, last)
    if held is not None and held[0] + held[1] - 1 > last:
        last = held[0] - 1  # (a run goes whole: its changes after `last` are not replicated yet)
    if last is None or last + 1 <= counts[1]:
        return 0
    last_ts = first_timestamp_from(table, conn, tablet_index, last)
    going = (data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] <= last)
    removed = int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(data.c[ROW_COUNT]), 0))
                               .where(*going)).scalar_one())
    conn.execute(data.delete().where(*going))
    conn.execute(tablets_table.update().where(
        tablets_table.c.table_id == table.table_id,
        tablets_table.c.tablet_index == tablet_index).values(trimmed_row_count=last + 1))
    counts[1], trimmed_before, before = last + 1, counts[1], table.trimmed_timestamp
    table.trimmed_timestamp = max(before, last_ts or 0)

    def undo() -> None:
        counts[1] = trimmed_before
        table.trimmed_timestamp = before

    on_rollback(conn, undo)
    return removed


def _block(schema: TableSchema, writes: list[RowWrite], start: int) -> ColumnBlock | None:
    """The :class:`ColumnBlock` of a commit of whole-row writes whose rows orjson encodes as they
    are (the caller checked both), a C pass per column; None for a table with ``any`` columns
    (their YSON text is parsed back on the replica)."""
    if any(c.type is ColumnType.ANY for c in schema.columns):
        return None
    return _rows_block(schema, [w.row for w in writes], start)


def _rows_block(schema: TableSchema, rows: list[dict[str, Any]], start: int) -> ColumnBlock:
    """Whole rows as the schema's columns, a C pass per column (a column a row lacks is null)."""
    names = tuple(c.name for c in schema.columns)
    try:
        values = [list(map(itemgetter(name), rows)) for name in names]
    except KeyError:
        values = [list(map(methodcaller("get", name), rows)) for name in names]  # (a row lacks a column)
    return ColumnBlock(names, values, start)


def _encode_rows(writes: list[RowWrite], doubles: list[str]) -> tuple[bytes, bool]:
    """Every write's row in one orjson call (``[{...},{...}]``), and whether every row is plain JSON
    (what orjson encodes as it is: no NaN, no infinity, nothing it refuses) with the ``},{`` between
    rows exactly the row boundaries (no value holds one). A ``null`` in the output may be a NaN or an
    infinity, which only :func:`_payload` keeps."""
    try:
        whole = orjson.dumps([w.row for w in writes])
    except TypeError:
        return b"", False
    plain = whole.startswith(b"[{") and whole.count(b"},{") == len(writes) - 1 and not (
        b"null" in whole and any(not math.isfinite(w.row[n]) for w in writes for n in doubles
                                 if w.row.get(n) is not None))
    return whole, plain


def _payloads(writes: list[RowWrite], doubles: list[str]) -> tuple[list[str], bool]:
    """:func:`_payload` of every write, with one orjson call for all the rows when they are plain
    (:func:`_encode_rows`): split at the ``},{`` between rows each row is wrapped into its payload;
    else each row is encoded alone."""
    whole, plain = _encode_rows(writes, doubles)
    if not plain:
        return [_payload(w, doubles) for w in writes], False
    parts = whole[2:-2].decode().split("},{")  # (one decode: the marker is ASCII, UTF-8 splits alike)
    if not any(w.update for w in writes):
        return ['{"row":{' + part + '},"update":false}' for part in parts], True
    flags = ('},"update":false}', '},"update":true}')
    return ['{"row":{' + part + flags[w.update] for part, w in zip(parts, writes, strict=True)], True


def _payload(write: RowWrite, doubles: list[str]) -> str:
    """A queue row's change as JSON text: orjson (fast) unless a double is NaN or infinite, which
    JSON cannot carry and orjson would turn into null; the standard encoder keeps them."""
    row = write.row
    for name in doubles:
        value = row.get(name)
        if value is not None and not math.isfinite(value):
            return json.dumps({"row": row, "update": write.update})
    return orjson.dumps({"row": row, "update": write.update}).decode()
