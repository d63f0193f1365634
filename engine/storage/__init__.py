"""Storage: SQL through SQLAlchemy Core, one serialized writer, the system tables and user table shapes;
the data directory and its start-up checks."""

from .datadir import DataDir, new_database_id, open_data_dir, storage_for_data_dir
from .sql import (
    DELETED,
    KIND,
    LOCK_MASK,
    PAYLOAD,
    ROW_INDEX,
    TABLET_INDEX,
    TS,
    FastStatement,
    Storage,
    UserTables,
    changes_table,
    commits_table,
    consumers_table,
    meta_table,
    nodes_table,
    on_commit,
    on_rollback,
    prepared_table,
    read_locks_table,
    replica_progress_table,
    replica_sink_table,
    system_upsert,
    tablets_table,
    xdcr_progress_table,
    xdcr_rows_table,
    xdcr_sink_table,
)

__all__ = [
    "DELETED", "DataDir", "FastStatement", "KIND", "LOCK_MASK", "PAYLOAD", "ROW_INDEX", "Storage", "TABLET_INDEX",
    "TS", "UserTables", "changes_table", "commits_table", "consumers_table", "meta_table", "new_database_id",
    "nodes_table", "on_commit", "on_rollback", "open_data_dir", "prepared_table", "read_locks_table",
    "replica_progress_table", "replica_sink_table", "system_upsert", "tablets_table", "xdcr_progress_table",
    "storage_for_data_dir", "xdcr_rows_table", "xdcr_sink_table",
]
