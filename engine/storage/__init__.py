"""Storage: SQL through SQLAlchemy Core, one serialized writer, the system tables and user table shapes;
the data directory and its start-up checks.

``sql`` holds ``Storage`` (the writer connection and its lock, the readers, ``on_commit`` and
``on_rollback``), ``system_tables`` the engine's own tables, ``shapes`` the SQL shape of user
tables, ``statements`` the statements the hot paths compile once, ``datadir`` the data directory.
"""

from .database import DatabaseRefused, DatabaseReservation, open_database
from .datadir import DataDir, new_database_id, open_data_dir, storage_for_data_dir
from .shapes import DELETED, KIND, LOCK_MASK, PAYLOAD, ROW_COUNT, ROW_INDEX, TABLET_INDEX, TS, UserTables, view_name
from .sql import Storage, on_commit, on_rollback
from .statements import (
    COPY_FORM_ROWS,
    SHARED_SQL,
    BulkStatement,
    FastStatement,
    SharedSql,
    array_parameter,
    bulk_insert,
    on_driver,
    on_driver_count,
    on_driver_each,
    positional,
    system_upsert,
)
from .system_tables import (
    changes_table,
    commits_table,
    consumers_table,
    meta_table,
    nodes_table,
    prepared_table,
    read_locks_table,
    replica_progress_table,
    replica_sink_table,
    tablets_table,
    xdcr_progress_table,
    xdcr_rows_table,
    xdcr_sink_table,
)

__all__ = [
    "changes_table", "commits_table", "consumers_table", "DatabaseRefused", "DatabaseReservation", "DataDir",
    "SHARED_SQL", "SharedSql",
    "BulkStatement", "DELETED", "FastStatement", "KIND", "LOCK_MASK", "meta_table", "new_database_id", "nodes_table",
    "on_commit", "on_driver", "on_driver_count", "on_driver_each",
    "on_rollback", "open_data_dir", "open_database", "positional", "PAYLOAD", "prepared_table", "read_locks_table",
    "replica_progress_table", "replica_sink_table", "ROW_COUNT", "ROW_INDEX", "Storage", "storage_for_data_dir",
    "system_upsert",
    "TABLET_INDEX", "array_parameter", "bulk_insert", "tablets_table", "TS", "view_name", "UserTables",
    "xdcr_progress_table", "xdcr_rows_table", "xdcr_sink_table", "COPY_FORM_ROWS",
]
