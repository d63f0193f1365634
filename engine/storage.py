"""SQL storage through SQLAlchemy Core: the system tables and the SQL shape of user tables.

Why SQL tables per user table: a replica stored on PostgreSQL (or SQLite) must be readable by any SQL
tool, so a sorted dynamic table is a real table (key columns as the primary key, the schema's value
columns, and a hidden ``_rt_ts`` commit timestamp). MVCC versions live beside it in
``<table>_versions`` (one full row image per committed write, deletes as tombstones, and the lock
mask the write took, which conflict checks need). An ordered table is one SQL table keyed by
(tablet, row index).

Everything here is dialect-neutral: no SQLite-only SQL. SQLite runs in WAL mode with
``synchronous=FULL`` so that an acknowledged commit survives a crash; writes are serialized by the
engine (one writer), reads run concurrently on other pooled connections.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from reptables.engine.schema import ColumnType, TableSchema

SYSTEM_METADATA = sa.MetaData()

meta_table = sa.Table(
    "_rt_meta", SYSTEM_METADATA,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

nodes_table = sa.Table(
    "_rt_nodes", SYSTEM_METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("parent_id", sa.String(64), nullable=True, index=True),
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("attributes", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=True),
)

tablets_table = sa.Table(
    "_rt_tablets", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("tablet_index", sa.Integer, primary_key=True),
    sa.Column("row_count", sa.BigInteger, nullable=False, default=0),
    sa.Column("trimmed_row_count", sa.BigInteger, nullable=False, default=0),
)

prepared_table = sa.Table(
    "_rt_prepared", SYSTEM_METADATA,
    sa.Column("transaction_id", sa.String(64), primary_key=True),
    sa.Column("participant", sa.String(200), primary_key=True),
    sa.Column("start_timestamp", sa.BigInteger, nullable=False),
    sa.Column("prepare_timestamp", sa.BigInteger, nullable=False),
    #: the cluster coordinating the transaction; NULL when it is this cluster
    sa.Column("coordinator", sa.String(200), nullable=True),
    sa.Column("payload", sa.Text, nullable=False),
)

commits_table = sa.Table(
    "_rt_commits", SYSTEM_METADATA,
    sa.Column("transaction_id", sa.String(64), primary_key=True),
    sa.Column("commit_timestamp", sa.BigInteger, nullable=False),
    sa.Column("participants", sa.Text, nullable=False),
)

#: meta-cluster side: how far each replica has replicated each tablet of a replicated table
replica_progress_table = sa.Table(
    "_rt_replica_progress", SYSTEM_METADATA,
    sa.Column("replica_id", sa.String(64), primary_key=True),
    sa.Column("tablet_index", sa.Integer, primary_key=True),
    sa.Column("row_index", sa.BigInteger, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

#: replica-cluster side: the last replicated row per (upstream replica, tablet); written in the
#: same SQL transaction as the rows it describes, which is what makes delivery exactly once
replica_sink_table = sa.Table(
    "_rt_replica_sink", SYSTEM_METADATA,
    sa.Column("upstream_replica_id", sa.String(64), primary_key=True),
    sa.Column("tablet_index", sa.Integer, primary_key=True),
    sa.Column("row_index", sa.BigInteger, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

read_locks_table = sa.Table(
    "_rt_read_locks", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("row_key", sa.Text, primary_key=True),
    sa.Column("lock_mask", sa.Integer, primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

TS = "_rt_ts"
DELETED = "_rt_deleted"
LOCK_MASK = "_rt_lock_mask"
TABLET_INDEX = "_rt_tablet_index"
ROW_INDEX = "_rt_row_index"
KIND = "_rt_kind"
PAYLOAD = "_rt_payload"


def sql_type(col_type: ColumnType) -> sa.types.TypeEngine[Any]:
    return {
        ColumnType.INT64: sa.BigInteger(),
        ColumnType.UINT64: sa.BigInteger(),
        ColumnType.DOUBLE: sa.Double(),
        ColumnType.BOOLEAN: sa.Boolean(),
        ColumnType.STRING: sa.Text(),
        ColumnType.ANY: sa.Text(),
    }[col_type]


class UserTables:
    """The SQLAlchemy ``Table`` objects of one dynamic table (data, and versions when sorted)."""

    def __init__(self, sql_name: str, schema: TableSchema) -> None:
        self.sql_name = sql_name
        self.schema = schema
        self.metadata = sa.MetaData()
        if schema.is_sorted:
            cols = [sa.Column(c.name, sql_type(c.type), primary_key=c.is_key,
                              nullable=not c.is_key, autoincrement=False) for c in schema.columns]
            self.data = sa.Table(sql_name, self.metadata, *cols,
                                 sa.Column(TS, sa.BigInteger, nullable=False))
            vcols = [sa.Column(c.name, sql_type(c.type), primary_key=c.is_key,
                               nullable=not c.is_key, autoincrement=False) for c in schema.columns]
            self.versions: sa.Table | None = sa.Table(
                f"{sql_name}_versions", self.metadata, *vcols,
                sa.Column(TS, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(DELETED, sa.Boolean, nullable=False),
                sa.Column(LOCK_MASK, sa.Integer, nullable=False),
                sa.Index(f"{sql_name}_versions_ts", TS),
            )
        else:
            cols = [sa.Column(c.name, sql_type(c.type), nullable=True) for c in schema.columns]
            self.data = sa.Table(
                sql_name, self.metadata,
                sa.Column(TABLET_INDEX, sa.Integer, primary_key=True, autoincrement=False),
                sa.Column(ROW_INDEX, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(TS, sa.BigInteger, nullable=False),
                *cols,
            )
            self.versions = None

    @classmethod
    def queue(cls, sql_name: str, schema: TableSchema) -> UserTables:
        """The replication queue of a replicated table: (tablet, row index) -> timestamped change."""
        tables = cls.__new__(cls)
        tables.sql_name = sql_name
        tables.schema = schema
        tables.metadata = sa.MetaData()
        tables.data = sa.Table(
            sql_name, tables.metadata,
            sa.Column(TABLET_INDEX, sa.Integer, primary_key=True, autoincrement=False),
            sa.Column(ROW_INDEX, sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column(TS, sa.BigInteger, nullable=False),
            sa.Column(KIND, sa.String(16), nullable=False),
            sa.Column(PAYLOAD, sa.Text, nullable=False),
        )
        tables.versions = None
        return tables

    def create(self, conn: sa.Connection) -> None:
        self.metadata.create_all(conn)

    def drop(self, conn: sa.Connection) -> None:
        self.metadata.drop_all(conn)


class Storage:
    """Owns the SQLAlchemy engine; one writer at a time, readers in parallel."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            kwargs["pool_size"] = 8
            kwargs["max_overflow"] = 8
        self.engine = sa.create_engine(url, **kwargs)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
        self.write_lock = threading.RLock()
        SYSTEM_METADATA.create_all(self.engine)

    @classmethod
    def for_data_dir(cls, data_dir: Path) -> Storage:
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{data_dir / 'engine.sqlite'}")

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[sa.Connection]:
        """One serialized write transaction; ``durable=False`` skips the fsync (durability=async)."""
        with self.write_lock:
            with self.engine.connect() as conn:
                relaxed = self.is_sqlite and not durable
                if relaxed:
                    _raw_pragma(conn, "PRAGMA synchronous=OFF")
                try:
                    with conn.begin():
                        yield conn
                finally:
                    if relaxed:
                        _raw_pragma(conn, "PRAGMA synchronous=FULL")

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    def get_meta(self, name: str) -> str | None:
        with self.read() as conn:
            return conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == name)).scalar()

    def set_meta(self, conn: sa.Connection, name: str, value: str) -> None:
        updated = conn.execute(meta_table.update().where(meta_table.c.name == name).values(value=value))
        if updated.rowcount == 0:
            conn.execute(meta_table.insert().values(name=name, value=value))

    def close(self) -> None:
        self.engine.dispose()


def _raw_pragma(conn: sa.Connection, pragma: str) -> None:
    """Run a pragma on the DBAPI connection, outside any transaction (SQLite requires that)."""
    conn.connection.driver_connection.execute(pragma)  # type: ignore[union-attr]


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=OFF")
    cur.close()


def _sqlite_on_begin(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN")
