"""Versioned changes of the system tables: a database is brought to this engine's schema once.

A newer engine may need the system tables an older one made to look different. ``create_schema``
creates the tables that are missing (a new system table needs nothing more); a change to a table
that exists - a new column, a new index, data rewritten - is a numbered step in :data:`STEPS`,
run once, in the writer's transaction with the new version recorded in ``_rt_meta``
(``schema_version``), in order, at the engine's start. A database whose version is newer than this
engine's is refused (an older engine does not know what the steps it lacks changed). Both backends
run the same steps: each is written with SQLAlchemy Core, dialect-neutral, but for a column's type,
which Core cannot alter: such a step says which backend it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa

from ..errors import DataDirError
from .shapes import PAYLOAD, ROW_COUNT, ROW_INDEX
from .sql import Storage
from .system_tables import meta_table

log = logging.getLogger("reptables.engine.storage")

_VERSION = "schema_version"

#: (version, what it changes, the step): in version order. Version 1 is the schema as
#: ``create_schema`` makes it; add a step with the next version to change an existing table.
def _sink_chunks_in_64_bits(conn: sa.Connection) -> None:
    """A bootstrap copy records its chunks (partition << 32 | chunk) in ``_rt_replica_sink``'s
    ``tablet_index``, made ``integer`` by the first PostgreSQL-backed engines: ``bigint`` now.
    SQLite's integers have 64 bits whatever the declared type: nothing to change there."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("ALTER TABLE _rt_replica_sink ALTER COLUMN tablet_index TYPE bigint")


def _xdcr_delete_horizons(conn: sa.Connection) -> None:
    """XDCR rows kept the version each change was made on (``parent_*``); the rules now order
    changes by their delete horizon (``tablets/xdcr.py``): the columns are renamed, a tombstone's
    horizon is its own version, and a live row's history is not known - none (as a row whose history
    has no delete). A database made by this engine has the new columns already."""
    columns = {c["name"] for c in sa.inspect(conn).get_columns("_rt_xdcr_rows")}
    if "parent_timestamp" not in columns:
        return
    for old, new in (("parent_timestamp", "horizon_timestamp"), ("parent_cluster_id", "horizon_cluster_id")):
        conn.exec_driver_sql(f"ALTER TABLE _rt_xdcr_rows RENAME COLUMN {old} TO {new}")
    conn.exec_driver_sql("UPDATE _rt_xdcr_rows SET horizon_timestamp = CASE WHEN deleted THEN timestamp END, "
                         "horizon_cluster_id = CASE WHEN deleted THEN cluster_id END")


def _queue_row_runs(conn: sa.Connection) -> None:
    """A replication queue row may hold a run of changes of one commit (``tablets/queue.py``):
    every queue table gets its count, 1 for the rows it has. Queue tables are the user tables
    with a payload column; a database made by this engine has the column already."""
    inspector = sa.inspect(conn)
    for name in inspector.get_table_names():
        columns = {c["name"] for c in inspector.get_columns(name)}
        if PAYLOAD in columns and ROW_INDEX in columns and ROW_COUNT not in columns:
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {ROW_COUNT} INTEGER NOT NULL DEFAULT 1")


STEPS: list[tuple[int, str, Callable[[sa.Connection], None]]] = [
    (2, "bootstrap chunk numbers in 64 bits on PostgreSQL", _sink_chunks_in_64_bits),
    (3, "XDCR rows ordered by their delete horizon", _xdcr_delete_horizons),
    (4, "replication queue rows hold runs of changes", _queue_row_runs),
]
#: the version this engine brings a database to
SCHEMA_VERSION = max([1, *(v for v, _, _ in STEPS)])


def migrate(storage: Storage) -> int:
    """Run the steps the database lacks; its version afterwards. After ``create_schema``."""
    with storage.write() as conn:
        stored = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == _VERSION)).scalar()
        version = int(stored) if stored is not None and stored.isdigit() else 1
        if version > SCHEMA_VERSION:
            raise DataDirError(f"The database {storage.display_url} has schema version {version}; this engine knows "
                               f"versions up to {SCHEMA_VERSION}: a newer reptables wrote it",
                               attributes={"schema_version": version})
        for step_version, what, step in STEPS:
            if step_version > version:
                log.info("storage migration", extra={"version": step_version, "change": what})
                step(conn)
                version = step_version
        storage.set_meta(conn, _VERSION, str(version))
    return version
