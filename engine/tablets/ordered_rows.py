"""Ordered tables in SQL: per-tablet rows in commit order, their appends, trims and reads.

An ordered table is one SQL table keyed by ``(tablet_index, row_index)``; a row's timestamp is its
commit timestamp, and row indexes are assigned at commit, so they follow commit order within a
tablet. Each tablet's ``[row_count, trimmed_row_count]`` is kept in memory
(``DynamicTable.tablet_rows``) and on its ``_rt_tablets`` row.

What is tricky: ``$row_index`` must never have a gap, so an append that rolls back puts the
tablet's row count back (``on_rollback``); and a trim only ever moves the trimmed count forward
(a trim below it is a no-op, not an error). A replicated table's replication queue is stored the
same way, but its appends, reads and trims are the queue's own (``queue.py``).

These are functions of a ``DynamicTable`` rather than methods so that ``table.py`` reads as "what
a table is and which kind of storage serves a call"; the sorted tables' rows are in
``sorted_rows.py``. What they use of a table is what the change log uses
(``changes.ChangeTable``), which every append also writes.

Locking: :func:`append` and :func:`trim` run inside a write transaction under
``Storage.write_lock``; :func:`query_source` builds a statement for a reader holding no lock.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..query import QuerySource
from ..storage import ROW_INDEX, TABLET_INDEX, TS, UserTables, on_rollback, tablets_table
from . import changes
from .changes import ChangeTable
from .writes import RowWrite


def append(table: ChangeTable, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
           tablet_index: int) -> int:
    """Append the rows of ``writes`` to one tablet with ``commit_ts``, logging each as a change when
    the table keeps a change log; returns the number of rows written."""
    counts = table.tablet_rows.setdefault(tablet_index, [0, 0])
    start = counts[0]
    names = [c.name for c in table.schema.columns]
    rows = [(tablet_index, start + i, commit_ts, *(w.row.get(n) for n in names)) for i, w in enumerate(writes)]
    if rows:
        table.sql.bulk("insert:data", conn).run(conn, rows, [TABLET_INDEX, ROW_INDEX, TS, *names])
        if table.change_log:
            changes.record(table, conn, commit_ts, (
                (tablet_index, "append", dict(zip(names, r[3:], strict=True)), None, r[1]) for r in rows))
        conn.execute(tablets_table.update().where(
            tablets_table.c.table_id == table.table_id,
            tablets_table.c.tablet_index == tablet_index).values(row_count=start + len(rows)))
        counts[0] = start + len(rows)

        def undo() -> None:
            counts[0] = start  # a rolled-back append leaves no gap in $row_index

        on_rollback(conn, undo)
    return len(rows)


def trim(table: ChangeTable, conn: sa.Connection, tablet_index: int, trimmed_row_count: int, path: str) -> None:
    """``trim_rows``: drop the rows of one tablet below ``trimmed_row_count``."""
    if table.sorted:
        raise YtError(f"Cannot trim sorted table {path}: trim_rows is for ordered tables",
                      code=ErrorCode.INVALID_PARAMETER)
    if not 0 <= tablet_index < table.tablet_count:
        raise YtError(f"Invalid tablet index {tablet_index} for table {path} with {table.tablet_count} "
                      "tablets", code=ErrorCode.NO_SUCH_TABLET)
    counts = table.tablet_rows.setdefault(tablet_index, [0, 0])
    if trimmed_row_count > counts[0]:
        raise YtError(f"Cannot trim tablet {tablet_index} of table {path} to {trimmed_row_count} rows: "
                      f"it has only {counts[0]} rows", code=ErrorCode.INVALID_PARAMETER)
    if trimmed_row_count <= counts[1]:
        return
    data = table.sql.data
    conn.execute(data.delete().where(data.c[TABLET_INDEX] == tablet_index,
                                     data.c[ROW_INDEX] < trimmed_row_count))
    conn.execute(tablets_table.update().where(
        tablets_table.c.table_id == table.table_id,
        tablets_table.c.tablet_index == tablet_index).values(trimmed_row_count=trimmed_row_count))
    counts[1] = trimmed_row_count


def query_source(sql: UserTables, ts: int | None) -> QuerySource:
    """The relation a query of an ordered table reads: every row, or those committed by ``ts``
    (with the system columns ``$tablet_index``, ``$row_index``, ``$timestamp``)."""
    schema = sql.schema
    types = {c.name: c.type.value for c in schema.columns}
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
