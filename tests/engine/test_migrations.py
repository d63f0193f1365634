"""A database an older engine made is brought to this engine's system tables at start
(``storage/migrations.py``), once, on SQLite here (``test_storage_postgresql.py`` does the same on
PostgreSQL through a whole engine).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from reptables.engine.schema import TableSchema
from reptables.engine.storage import ROW_COUNT, UserTables
from reptables.engine.storage.migrations import SCHEMA_VERSION, migrate
from reptables.engine.storage.sql import Storage
from reptables.engine.storage.system_tables import xdcr_rows_table
from reptables.engine.tablets.queue import read_sql, timestamp_at


def test_xdcr_rows_of_schema_2_get_delete_horizons(tmp_path: Path) -> None:
    """Schema 2 kept the version each XDCR change was made on (``parent_*``): version 3 orders
    changes by their delete horizon, a tombstone's own version, none for a live row."""
    storage = Storage(f"sqlite:///{tmp_path / 'engine.sqlite'}")
    try:
        with storage.write() as conn:
            for new, old in (("horizon_timestamp", "parent_timestamp"), ("horizon_cluster_id", "parent_cluster_id")):
                conn.exec_driver_sql(f"ALTER TABLE _rt_xdcr_rows RENAME COLUMN {new} TO {old}")
            conn.exec_driver_sql(
                "INSERT INTO _rt_xdcr_rows (table_id, row_key, cluster_id, timestamp, deleted, parent_timestamp, "
                "parent_cluster_id) VALUES ('t', '[1]', 2, 500, 1, 400, 1), ('t', '[2]', 1, 600, 0, 550, 2)")
            storage.set_meta(conn, "schema_version", "2")
        assert migrate(storage) == SCHEMA_VERSION == 4
        c = xdcr_rows_table.c
        with storage.read() as conn:
            rows = conn.execute(sa.select(c.row_key, c.horizon_timestamp, c.horizon_cluster_id)
                                .order_by(c.row_key)).all()
        assert [tuple(r) for r in rows] == [("[1]", 500, 2), ("[2]", None, None)]
        assert migrate(storage) == 4  # once: a second start changes nothing
        with storage.read() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(xdcr_rows_table)).scalar() == 2
    finally:
        storage.close()


def test_queue_rows_of_schema_3_become_runs_of_one_change(tmp_path: Path) -> None:
    """Schema 3 wrote a replication queue row per change; version 4's rows hold runs of changes
    (``tablets/queue.py``): every queue table gets a row count, 1 for the rows it holds, and reads
    them as before."""
    storage = Storage(f"sqlite:///{tmp_path / 'engine.sqlite'}")
    schema = TableSchema.parse([{"name": "k", "type": "int64", "sort_order": "ascending"}], "//tmp/q")
    queue = UserTables.queue("t_q", schema)
    try:
        with storage.write() as conn:
            queue.create(conn)
            conn.exec_driver_sql(f"ALTER TABLE t_q DROP COLUMN {ROW_COUNT}")
            for i, ts in enumerate((100, 100, 200)):
                conn.exec_driver_sql("INSERT INTO t_q VALUES (0, ?, ?, 'write', ?)", (i, ts, f'{{"row":{{"k":{i}}}}}'))
            storage.set_meta(conn, "schema_version", "3")
        assert migrate(storage) == 4
        with storage.read() as conn:
            entries = read_sql(queue.data, conn, 0, 1, 10)
            assert [(e.row_index, e.timestamp, e.payload) for e in entries] == [
                (1, 100, '{"row":{"k":1}}'), (2, 200, '{"row":{"k":2}}')]
            assert timestamp_at(queue.data, conn, 0, 2) == 200 and timestamp_at(queue.data, conn, 0, 3) is None
            assert conn.exec_driver_sql(f"SELECT sum({ROW_COUNT}) FROM t_q").scalar() == 3
    finally:
        storage.close()
