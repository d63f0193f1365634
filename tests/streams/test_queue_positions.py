"""Where a pull of a replicated table's queue starts in each tablet (``changes._first_row_after``).

Found by the 10-minute ``reshard`` fault run (docs/reliability.md): the meta-cluster's stream of a
replicated table skipped one acknowledged change. A pull knows a tablet's row count from memory,
where an append counts its rows before its SQL commit, and searches its start row in its own read
snapshot, which lacks those rows. The search took a row it could not see for one before the start,
so with a commit in flight on the tablet it could start after a committed row the pull had not
delivered yet, and the next pull started after it for good. The search must only look at the rows
its snapshot holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from reptables.engine.schema import TableSchema
from reptables.engine.storage import KIND, PAYLOAD, ROW_INDEX, TABLET_INDEX, TS, UserTables
from reptables.engine.tablets import changes

SCHEMA = TableSchema.parse([{"name": "k", "type": "int64", "sort_order": "ascending"},
                            {"name": "v", "type": "string"}], "//tmp/q")
BASE_TS = 1 << 40


@dataclass
class Queue:
    sql: UserTables
    tablet_rows: dict[int, list[int]] = field(default_factory=dict)
    table_id: str = "q"
    replicated: bool = True


def _queue(rows: int, counted: int, trimmed: int = 0) -> tuple[Queue, sa.Engine]:
    """Tablet 0 with committed rows ``trimmed``..``rows - 1`` (timestamps growing) and ``counted``
    rows in the in-memory count (more than ``rows``: appends in flight)."""
    engine = sa.create_engine("sqlite://")
    queue = Queue(UserTables.queue("q_data", SCHEMA), {0: [counted, trimmed]})
    queue.sql.metadata.create_all(engine)
    with engine.begin() as conn:
        if rows > trimmed:
            conn.execute(queue.sql.data.insert(), [
                {TABLET_INDEX: 0, ROW_INDEX: r, TS: BASE_TS + 10 * r, KIND: "upsert", PAYLOAD: "{}"}
                for r in range(trimmed, rows)])
    return queue, engine


def _after_row(row: int) -> changes.Position:
    return (BASE_TS + 10 * row, row)


def test_a_commit_in_flight_does_not_move_the_start_past_a_committed_row() -> None:
    # rows 0-4 committed, row 5 counted but not committed yet; the stream is at row 3
    queue, engine = _queue(rows=5, counted=6)
    with engine.connect() as conn:
        assert changes._first_row_after(queue, conn, 0, _after_row(3)) == 4  # (before the fix: 6)
        assert changes._first_row_after(queue, conn, 0, _after_row(4)) == 5
        assert changes._first_row_after(queue, conn, 0, (BASE_TS - 1, 0)) == 0
        assert changes._first_row_after(queue, conn, 0, (BASE_TS + 35, changes.HEARTBEAT_SEQ)) == 4


def test_many_rows_in_flight_and_rows_trimmed() -> None:
    queue, engine = _queue(rows=40, counted=100, trimmed=7)
    with engine.connect() as conn:
        for after in range(7, 40):
            assert changes._first_row_after(queue, conn, 0, _after_row(after)) == after + 1, after
        # before every row still there: the first one
        assert changes._first_row_after(queue, conn, 0, (0, 0)) == 7


def test_a_tablet_with_no_row_in_the_snapshot() -> None:
    queue, engine = _queue(rows=0, counted=3)
    with engine.connect() as conn:
        start = changes._first_row_after(queue, conn, 0, (0, 0))
        assert start == 3  # past every row counted: nothing to read in this tablet yet
        rows = conn.execute(sa.select(queue.sql.data.c[ROW_INDEX]).where(
            queue.sql.data.c[ROW_INDEX] >= start)).all()
        assert rows == []
