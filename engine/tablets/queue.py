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
    """One change in a replication queue (a tuple: made by the thousand for every replicator batch)."""

    row_index: int
    timestamp: int
    kind: str
    payload: str
    #: its commit's columns (shared by the commit's entries), while in the in-memory tail; None for a
    #: change read back from SQL, and for a commit of other changes (deletes, updates) or of rows
    #: JSON cannot carry as they are (they go as ``payload``)
    block: ColumnBlock | None


class QueueTable(Protocol):
    """What the queue functions use of a replicated table (``DynamicTable`` is one): the module
    needs no import of ``table.py``, which imports it."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    config: EngineConfig
    tablet_rows: dict[int, list[int]]
    trimmed_timestamp: int
    queue_tail: dict[int, tuple[int, list[QueueEntry]]]


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
    payloads, plain = _payloads(changes, doubles)
    indices = range(start, start + len(changes))
    whole_rows = plain and write_kinds.count(WriteKind.WRITE) == len(changes) and not any(map(_UPDATE, changes))
    block = _block(table.schema, changes, start) if whole_rows else None
    # a commit's batch is up to 100,000 changes: the rows of the SQL table and the tail's entries
    # are zipped in C (tuple.__new__ makes a QueueEntry without its Python-level constructor)
    entries: list[QueueEntry] = list(map(tuple.__new__, repeat(QueueEntry),
                                         zip(indices, repeat(commit_ts), kinds, payloads, repeat(block))))
    table.sql.bulk("insert:data", conn).run(conn, _runs(tablet_index, start, commit_ts, kinds, payloads),
                                            [TABLET_INDEX, ROW_INDEX, TS, KIND, PAYLOAD, ROW_COUNT])
    _SET_ROW_COUNT.run(conn, table_id=table.table_id, tablet_index=tablet_index, row_count=start + len(entries))
    counts[0] = start + len(entries)
    tail_rows = table.config.queue_tail_rows

    def undo() -> None:
        counts[0] = start

    def publish() -> None:
        # replicators read the tail without the writer lock: it only ever holds committed rows
        base, tail = table.queue_tail.get(tablet_index, (start, []))
        if base + len(tail) != start:
            base, tail = start, []
        tail.extend(entries)
        if len(tail) > tail_rows:
            # a new list: a reader holding (base, tail) must never see indices shift under it
            drop = len(tail) - tail_rows // 2
            tail = tail[drop:]
            base += drop
        table.queue_tail[tablet_index] = (base, tail)

    on_rollback(conn, undo)
    on_commit(conn, publish)
    return len(entries)


def _runs(tablet_index: int, start: int, commit_ts: int, kinds: list[str],
          payloads: list[str]) -> list[tuple[int, int, int, str, str, int]]:
    """The SQL rows of one commit's changes to a tablet's queue: a row per run of changes of one kind
    (one run, the usual commit of writes), its payloads joined by newlines (which JSON text never
    holds outside its strings, where it is escaped), the run's length as its row count. One SQL row
    for a commit of 10,000 changes writes about a third of the time 10,000 rows do."""
    if kinds.count(kinds[0]) == len(kinds):
        runs = [(start, kinds[0], payloads)]
    else:
        runs = []
        at = start
        for kind, group in groupby(zip(kinds, payloads, strict=True), _FIRST):
            run = list(map(_SECOND, group))
            runs.append((at, kind, run))
            at += len(run)
    out: list[tuple[int, int, int, str, str, int]] = []
    for first, kind, run in runs:
        joined = "\n".join(run)
        if joined.count("\n") == len(run) - 1:
            out.append((tablet_index, first, commit_ts, kind, joined, len(run)))
        else:  # (a raw newline in a payload: neither encoder writes one; a row each, as before runs)
            out.extend(zip(repeat(tablet_index), range(first, first + len(run)), repeat(commit_ts), repeat(kind), run,
                           repeat(1)))
    return out


_FIRST, _SECOND = itemgetter(0), itemgetter(1)
#: queue rows a statement of a read from SQL takes (a row holds up to a commit's 100,000 changes)
_READ_PAGE = 16


def _holding(data: sa.Table, conn: sa.Connection, tablet_index: int, row: int) -> tuple[int, int, int] | None:
    """(first row index, row count, timestamp) of the queue row holding change ``row``, if any."""
    found = conn.execute(sa.select(data.c[ROW_INDEX], data.c[ROW_COUNT], data.c[TS])
                         .where(data.c[TABLET_INDEX] == tablet_index, data.c[ROW_INDEX] <= row)
                         .order_by(data.c[ROW_INDEX].desc()).limit(1)).first()
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


def read(table: QueueTable, conn: sa.Connection, tablet_index: int, from_row: int, limit: int) -> list[QueueEntry]:
    """Up to ``limit`` committed changes from ``from_row`` on: from the in-memory tail, else from SQL."""
    base, tail = table.queue_tail.get(tablet_index, (0, []))
    if tail and base <= from_row:
        return tail[from_row - base:from_row - base + limit]
    return read_sql(table.sql.data, conn, tablet_index, from_row, limit)


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
    names = tuple(c.name for c in schema.columns)
    rows = [w.row for w in writes]
    try:
        values = [list(map(itemgetter(name), rows)) for name in names]
    except KeyError:
        values = [list(map(methodcaller("get", name), rows)) for name in names]  # (a row lacks a column)
    return ColumnBlock(names, values, start)


def _payloads(writes: list[RowWrite], doubles: list[str]) -> tuple[list[str], bool]:
    """:func:`_payload` of every write, with one orjson call for all the rows; and whether every
    row is plain JSON (what orjson encodes as it is: no NaN, no infinity, nothing it refuses).

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
