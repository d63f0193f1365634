"""Storage: SQL through SQLAlchemy Core, one serialized writer, the system tables and user table shapes."""

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
    commits_table,
    meta_table,
    nodes_table,
    on_commit,
    on_rollback,
    prepared_table,
    read_locks_table,
    replica_progress_table,
    replica_sink_table,
    tablets_table,
)

__all__ = [
    "DELETED", "FastStatement", "KIND", "LOCK_MASK", "PAYLOAD", "ROW_INDEX", "Storage", "TABLET_INDEX", "TS",
    "UserTables", "commits_table", "meta_table", "nodes_table", "on_commit", "on_rollback", "prepared_table",
    "read_locks_table", "replica_progress_table", "replica_sink_table", "tablets_table",
]
