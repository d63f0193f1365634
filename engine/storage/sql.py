"""SQL storage through SQLAlchemy Core: the system tables and the SQL shape of user tables.

Why SQL tables per user table: a replica stored on PostgreSQL (or SQLite) must be readable by any SQL
tool, so a sorted dynamic table is a real table (key columns as the primary key, the schema's value
columns, and two hidden columns: ``_rt_ts``, the commit timestamp of the row's latest write, and
``_rt_lock_mask``, the lock groups that write took). Older versions live beside it in
``<table>_versions``: when a commit overwrites or deletes a row, the image it replaces moves there
(with its own timestamp and lock mask), and a delete leaves a tombstone there. A write of a new key
therefore costs one SQL row, not two - the bulk load of a table writes no version rows at all - and
the newest version of every key is always in the data table. An ordered table is one SQL table
keyed by (tablet, row index).

Everything here is dialect-neutral: no SQLite-only SQL. SQLite runs in WAL mode with
``synchronous=FULL`` so that an acknowledged commit survives a crash; writes are serialized by the
engine (one writer), reads run concurrently on other pooled connections.

A database file found damaged by any statement (SQLite's "database disk image is malformed") turns
into a ``StorageCorruptedError`` (a 500, never a client's 400), logs one line, and leaves
``Storage.corruption`` set, which keeps ``/readyz`` failing until a restart checks the file again
(``datadir.py``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql.compiler import SQLCompiler

from ..errors import StorageCorruptedError
from ..schema import ColumnType, TableSchema

log = logging.getLogger("reptables.engine.storage")

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

#: the change log of every sorted and ordered table (change streams, docs/streams.md): one row per
#: changed row, appended in the commit's SQL transaction. ``(timestamp, seq)`` is a change's position
#: in its table's stream: commit order, then order within the commit (``seq`` grows per table, so a
#: change applied later at an equal timestamp - a replica receiving one commit in two batches -
#: still sorts after). A replicated table's stream is its replication queue instead.
changes_table = sa.Table(
    "_rt_changes", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("timestamp", sa.BigInteger, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("tablet_index", sa.Integer, nullable=False),
    #: insert, update, delete (sorted tables) or append (ordered tables)
    sa.Column("kind", sa.String(16), nullable=False),
    #: JSON: {"row": the new row} or {"key": [...]} for a delete; ordered rows add "row_index"
    sa.Column("payload", sa.Text, nullable=False),
)

#: registered stream consumers (YT's queue consumers): their offset is an event token position;
#: a vital one holds the trimming of its table's changes at its offset
consumers_table = sa.Table(
    "_rt_consumers", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("consumer_path", sa.String(1000), primary_key=True),
    sa.Column("vital", sa.Boolean, nullable=False),
    sa.Column("offset_timestamp", sa.BigInteger, nullable=False),
    sa.Column("offset_seq", sa.BigInteger, nullable=False),
)

#: XDCR (docs/xdcr.md): the version of every row of an XDCR table - the cluster id and commit
#: timestamp of its last change, a delete's too (a tombstone) - the row's "hidden columns", kept
#: beside it and changed in the same SQL transaction
xdcr_rows_table = sa.Table(
    "_rt_xdcr_rows", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("row_key", sa.Text, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False),
    #: the version the change was made on (None: on no row): a delete beats only changes not made
    #: after it, which this tells (docs/xdcr.md)
    sa.Column("parent_timestamp", sa.BigInteger, nullable=True),
    sa.Column("parent_cluster_id", sa.Integer, nullable=True),
    # small rows found only by their key: kept in the key's B-tree itself (SQLite), with no rowid
    # table beside a second copy of the key in an index. A data directory made before keeps its table
    sqlite_with_rowid=False,
)

#: XDCR, the sending side: how far each peer has this cluster's changes of each XDCR table (a
#: change-log position); saved when the peer acknowledged a batch
xdcr_progress_table = sa.Table(
    "_rt_xdcr_progress", SYSTEM_METADATA,
    sa.Column("peer", sa.String(200), primary_key=True),
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

#: XDCR, the receiving side: the last change-log position applied per (table, origin cluster),
#: written in the SQL transaction that applies the batch: a retried batch is recognised
xdcr_sink_table = sa.Table(
    "_rt_xdcr_sink", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("origin_cluster_id", sa.Integer, primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

TS = "_rt_ts"
DELETED = "_rt_deleted"
LOCK_MASK = "_rt_lock_mask"
TABLET_INDEX = "_rt_tablet_index"
ROW_INDEX = "_rt_row_index"
KIND = "_rt_kind"
PAYLOAD = "_rt_payload"


def sql_type(col_type: ColumnType) -> sa.types.TypeEngine[Any]:
    types: dict[ColumnType, sa.types.TypeEngine[Any]] = {
        ColumnType.INT64: sa.BigInteger(),
        ColumnType.UINT64: sa.BigInteger(),
        ColumnType.DOUBLE: sa.Double(),
        ColumnType.BOOLEAN: sa.Boolean(),
        ColumnType.STRING: sa.Text(),
        ColumnType.ANY: sa.Text(),
    }
    return types[col_type]


class BulkStatement:
    """A statement compiled once for a dialect and run with ``executemany`` on plain tuples.

    Building SQLAlchemy statements and per-row parameter dicts costs more than SQLite itself for a
    10,000-row batch; the hot write paths (table upserts, versions, the replication queue) compile
    their statements once and hand the DBAPI tuples in table-column order. The SQL is whatever the
    dialect compiles, so the path stays dialect-neutral.
    """

    def __init__(self, stmt: sa.ClauseElement, dialect: sa.Dialect) -> None:
        compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
        self.sql = str(compiled)
        self.positional = bool(compiled.positional)
        self.names: list[str] = list(compiled.positiontup or []) if self.positional else list(compiled.params)

    def params(self, values: tuple[Any, ...], columns: list[str]) -> tuple[Any, ...] | dict[str, Any]:
        """Parameters for one execution, ``values`` in the order of ``columns``."""
        if self.positional and self.names == columns:
            return values
        by_name = dict(zip(columns, values, strict=True))
        return tuple(by_name[n] for n in self.names) if self.positional else {n: by_name[n] for n in self.names}

    def run(self, conn: sa.Connection, rows: list[tuple[Any, ...]], columns: list[str]) -> None:
        """``rows`` are tuples in the order of ``columns``."""
        if not rows:
            return
        if self.positional and self.names == columns:
            conn.exec_driver_sql(self.sql, rows)
            return
        index = {name: i for i, name in enumerate(columns)}
        if self.positional:
            order = [index[n] for n in self.names]
            conn.exec_driver_sql(self.sql, [tuple(r[i] for i in order) for r in rows])
        else:
            conn.exec_driver_sql(self.sql, [{n: r[index[n]] for n in self.names} for r in rows])


class FastStatement:
    """A statement compiled once per dialect and run on the DBAPI cursor of a connection.

    For the few statements on the latency path of every commit (prepare records, decisions,
    replication progress): SQLAlchemy's execution machinery costs ~0.1 ms a statement here, the
    query itself a few microseconds. ``build`` makes the statement with named bind parameters; the
    SQL is whatever the dialect compiles, so the path stays dialect-neutral. Bind parameters are
    named ``p_<name>`` (SQLAlchemy reserves column names in INSERT and UPDATE); ``run`` takes
    ``<name>=value``."""

    def __init__(self, build: Callable[[], sa.ClauseElement]) -> None:
        self._build = build
        self._compiled: dict[str, tuple[str, list[str] | None]] = {}

    @staticmethod
    def _keys_match(table: sa.Table, keys: tuple[str, ...]) -> list[sa.ColumnElement[bool]]:
        return [table.c[k] == sa.bindparam(f"p_{k}") for k in keys]

    @classmethod
    def insert(cls, table: sa.Table) -> FastStatement:
        """INSERT of one row (every column a parameter)."""
        return cls(lambda: table.insert().values({c.name: sa.bindparam(f"p_{c.name}") for c in table.columns}))

    @classmethod
    def update(cls, table: sa.Table, *keys: str, columns: tuple[str, ...] | None = None) -> FastStatement:
        """UPDATE of ``columns`` (default: every column but the keys) of the rows matching ``keys``."""
        names = columns or tuple(c.name for c in table.columns if c.name not in keys)
        return cls(lambda: table.update().where(*cls._keys_match(table, keys)).values(
            {n: sa.bindparam(f"p_{n}") for n in names}))

    @classmethod
    def delete(cls, table: sa.Table, *keys: str) -> FastStatement:
        return cls(lambda: table.delete().where(*cls._keys_match(table, keys)))

    @classmethod
    def select(cls, table: sa.Table, columns: tuple[str, ...], *keys: str) -> FastStatement:
        return cls(lambda: sa.select(*[table.c[n] for n in columns]).where(*cls._keys_match(table, keys)))

    def run(self, conn: sa.Connection, **params: Any) -> Any:
        """Execute with ``params``; returns the DBAPI cursor (``fetchone``, ``rowcount``)."""
        entry = self._compiled.get(conn.dialect.name)
        if entry is None:
            compiled = cast(SQLCompiler, self._build().compile(dialect=conn.dialect))
            entry = self._compiled[conn.dialect.name] = (
                str(compiled), list(compiled.positiontup or []) if compiled.positional else None)
        sql, order = entry
        cursor = conn.connection.cursor()
        if order is not None:
            cursor.execute(sql, tuple(params[n[2:]] for n in order))
        else:
            cursor.execute(sql, {f"p_{k}": v for k, v in params.items()})
        return cursor


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
                                 sa.Column(TS, sa.BigInteger, nullable=False),
                                 sa.Column(LOCK_MASK, sa.Integer, nullable=False), sqlite_with_rowid=False)
            vcols = [sa.Column(c.name, sql_type(c.type), primary_key=c.is_key,
                               nullable=not c.is_key, autoincrement=False) for c in schema.columns]
            self.versions: sa.Table | None = sa.Table(
                f"{sql_name}_versions", self.metadata, *vcols,
                sa.Column(TS, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(DELETED, sa.Boolean, nullable=False),
                sa.Column(LOCK_MASK, sa.Integer, nullable=False),
                sa.Index(f"{sql_name}_versions_ts", TS),
                sqlite_with_rowid=False,
            )
        else:
            cols = [sa.Column(c.name, sql_type(c.type), nullable=True) for c in schema.columns]
            self.data = sa.Table(
                sql_name, self.metadata,
                sa.Column(TABLET_INDEX, sa.Integer, primary_key=True, autoincrement=False),
                sa.Column(ROW_INDEX, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(TS, sa.BigInteger, nullable=False),
                *cols,
                sqlite_with_rowid=False,
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
            sqlite_with_rowid=False,
        )
        tables.versions = None
        return tables

    def bulk(self, name: str, conn: sa.Connection) -> BulkStatement:
        """A cached compiled statement: "insert:data", "upsert:data", "insert:versions"."""
        cache = self.__dict__.setdefault("_bulk", {})
        key = (name, conn.dialect.name)
        stmt = cache.get(key)
        if stmt is None:
            kind, which = name.split(":")
            table = self.data if which == "data" else self.versions
            assert table is not None
            if kind == "point":
                keys = [c for c in table.primary_key.columns]
                statement: sa.ClauseElement = sa.select(*[c for c in table.columns if c.name in self.schema.by_name]) \
                    .where(*[c == sa.bindparam(c.name) for c in keys])
            elif kind == "upsert":
                statement = _upsert(table, conn.dialect)
            else:
                statement = table.insert()
            stmt = cache[key] = BulkStatement(statement, conn.dialect)
        return stmt

    @property
    def data_columns(self) -> list[str]:
        return [c.name for c in self.data.columns]

    @property
    def version_columns(self) -> list[str]:
        assert self.versions is not None
        return [c.name for c in self.versions.columns]

    def create(self, conn: sa.Connection) -> None:
        self.metadata.create_all(conn)

    def add_columns(self, conn: sa.Connection, names: list[str]) -> None:
        """``ALTER TABLE ... ADD COLUMN`` for the columns ``names`` of this (new, wider) shape, on the
        data table and the versions table: in the caller's transaction, so a failure adds none.

        Rows already stored read the new columns as NULL. SQLAlchemy Core has no construct for an
        ALTER; the column's SQL is the dialect's own (``CreateColumn``), so this stays dialect-neutral.
        A replication queue stores changes as payloads and has no user columns: nothing to alter."""
        if KIND in self.data.c:
            return
        preparer = conn.dialect.identifier_preparer
        for table in (self.data, self.versions):
            if table is None:
                continue
            for name in names:
                spec = CreateColumn(table.c[name]).compile(dialect=conn.dialect)
                conn.execute(sa.text(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {spec}"))

    def drop(self, conn: sa.Connection) -> None:
        self.metadata.drop_all(conn)


_SYSTEM_UPSERTS: dict[tuple[str, str], BulkStatement] = {}


def system_upsert(table: sa.Table, conn: sa.Connection) -> BulkStatement:
    """INSERT ... ON CONFLICT DO UPDATE of a system table, compiled once per dialect (hot paths)."""
    key = (table.name, conn.dialect.name)
    stmt = _SYSTEM_UPSERTS.get(key)
    if stmt is None:
        stmt = _SYSTEM_UPSERTS[key] = BulkStatement(_upsert(table, conn.dialect), conn.dialect)
    return stmt


def _upsert(table: sa.Table, dialect: sa.Dialect) -> sa.ClauseElement:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE: valid SQL for SQLite and PostgreSQL alike."""
    keys = [c.name for c in table.primary_key.columns]
    if dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        pg = postgresql.insert(table)
        return pg.on_conflict_do_update(index_elements=keys, set_={
            c.name: pg.excluded[c.name] for c in table.columns if c.name not in keys})
    from sqlalchemy.dialects import sqlite

    lite = sqlite.insert(table)
    return lite.on_conflict_do_update(index_elements=keys, set_={
        c.name: lite.excluded[c.name] for c in table.columns if c.name not in keys})


class Storage:
    """Owns the SQLAlchemy engine; one writer at a time, readers in parallel."""

    def __init__(self, url: str, create_schema: bool = True) -> None:
        """``create_schema=False``: the system tables are created later (:meth:`create_schema`),
        once the data directory's checks have seen the database as it was."""
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            kwargs["pool_size"] = 8
            kwargs["max_overflow"] = 8
        # every transaction is ended explicitly, so returning a connection needs no rollback
        kwargs["pool_reset_on_return"] = None
        self.engine = sa.create_engine(url, **kwargs)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
        #: THE writer lock: serializes every write transaction (one SQL writer) and guards every
        #: in-memory state that changes with one (Cypress nodes, table counters, replica progress).
        #: First in the engine's lock order (docs/architecture.md): it is never taken while holding
        #: any other engine lock. Re-entrant: a write inside a write joins the open transaction.
        self.write_lock = threading.RLock()
        self._writer: sa.Connection | None = None  # guarded by write_lock
        #: the event-loop thread's own read connection: used only by that thread, so unlocked
        self._loop_reader: sa.Connection | None = None
        #: why the database file is damaged, once a statement found it so (SQLite's message); set
        #: once and never cleared - a restart checks the file again. Written and read without a
        #: lock: a reference assignment, and at worst two threads finding it at once both log it
        self.corruption: str | None = None
        if create_schema:
            self.create_schema()

    def create_schema(self) -> None:
        """Create the system tables that are missing."""
        SYSTEM_METADATA.create_all(self.engine)

    def _corrupted(self, exc: BaseException) -> StorageCorruptedError | None:
        """The API's error for ``exc`` if it says the database file is damaged, else None; the first
        one logs a line and marks the storage damaged."""
        reason = corruption_of(exc)
        if reason is None:
            return None
        if self.corruption is None:
            self.corruption = reason
            log.error("the database file is damaged: this engine reports itself unready until it is restarted",
                      extra={"database": self.url, "error": reason})
        return StorageCorruptedError(
            f"The storage of this cluster is damaged ({reason}); the engine stays unready until it is "
            "restarted, which checks its data directory", attributes={"reason": reason})

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[sa.Connection]:
        """One serialized write transaction; ``durable=False`` skips the fsync (durability=async)."""
        with self.write_lock:
            if self._writer is not None and self._writer.in_transaction():
                # re-entrant use (a write inside a write): join the open transaction
                yield self._writer
                return
            conn = self._writer_connection()
            relaxed = self.is_sqlite and not durable
            if relaxed:
                _raw_pragma(conn, "PRAGMA synchronous=OFF")
            undo: list[Callable[[], None]] = []
            published: list[Callable[[], None]] = []
            conn.info[_UNDO] = undo
            conn.info[_PUBLISH] = published
            try:
                with conn.begin():
                    yield conn
            except BaseException as exc:
                # what the transaction changed in memory goes back with its rows
                for fn in reversed(undo):
                    fn()
                if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
                    self._writer = None
                corrupted = self._corrupted(exc)
                if corrupted is not None:
                    raise corrupted from exc
                raise
            finally:
                conn.info.pop(_UNDO, None)
                conn.info.pop(_PUBLISH, None)
                if relaxed and self._writer is not None:
                    _raw_pragma(conn, "PRAGMA synchronous=FULL")
            # committed: what readers outside the writer lock may see now (still under the lock). The
            # transaction is durable whatever a hook does: a failing hook is logged, never raised
            # (a caller must not take a committed transaction for a failed one)
            for fn in published:
                try:
                    fn()
                except Exception:  # noqa: BLE001
                    log.exception("publishing a committed write failed")

    def write_busy(self) -> bool:
        """Whether a write transaction holds the writer right now (a hint: it may change at once)."""
        if self.write_lock.acquire(blocking=False):
            self.write_lock.release()
            return False
        return True

    def _writer_connection(self) -> sa.Connection:
        """The one connection all writes use (held under ``write_lock``): no pool checkout per commit."""
        if self._writer is None or self._writer.closed:
            self._writer = self.engine.connect()
        return self._writer

    @contextmanager
    def read(self) -> Iterator[sa.Connection]:
        """A read-only transaction (a consistent snapshot) on a pooled connection.

        The event-loop thread, which serves small reads itself, keeps one connection of its own:
        a pool checkout and return cost more than a point lookup."""
        try:
            conn = None
            if threading.current_thread() is threading.main_thread():
                if self._loop_reader is None or self._loop_reader.closed:
                    self._loop_reader = self.engine.connect()
                if not self._loop_reader.in_transaction():  # not a read inside a read
                    conn = self._loop_reader
            if conn is None:
                with self.engine.connect() as pooled, pooled.begin():
                    yield pooled
                return
            with conn.begin():
                yield conn
        except Exception as exc:
            corrupted = self._corrupted(exc)
            if corrupted is None:
                raise
            raise corrupted from exc

    def get_meta(self, name: str) -> str | None:
        with self.read() as conn:
            return conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == name)).scalar()

    def table_names(self) -> set[str]:
        """The names of the SQL tables in the database."""
        with self.read() as conn:
            return set(sa.inspect(conn).get_table_names())

    def set_meta(self, conn: sa.Connection, name: str, value: str) -> None:
        updated = conn.execute(meta_table.update().where(meta_table.c.name == name).values(value=value))
        if updated.rowcount == 0:
            conn.execute(meta_table.insert().values(name=name, value=value))

    def close(self) -> None:
        with self.write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self._loop_reader is not None:
            self._loop_reader.close()
            self._loop_reader = None
        self.engine.dispose()


#: SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB
_CORRUPTION_CODES = (11, 26)


def corruption_of(exc: BaseException) -> str | None:
    """SQLite's message if ``exc`` (raw or wrapped by SQLAlchemy) says the database file is damaged."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    if isinstance(orig, sqlite3.DatabaseError) and getattr(orig, "sqlite_errorcode", 0) & 0xFF in _CORRUPTION_CODES:
        return str(orig)
    return None


_UNDO = "reptables_undo"
_PUBLISH = "reptables_publish"


def on_rollback(conn: sa.Connection, undo: Callable[[], None]) -> None:
    """Run ``undo`` if the write transaction of ``conn`` rolls back: in-memory state changed with
    the transaction's rows (a queue's row count, say) must not outlive them."""
    hooks = conn.info.get(_UNDO)
    if hooks is not None:
        hooks.append(undo)


def on_commit(conn: sa.Connection, publish: Callable[[], None]) -> None:
    """Run ``publish`` once the write transaction of ``conn`` has committed, before the writer lock
    is released. State that threads read *without* the writer lock (the in-memory queue tail the
    replicators push from) is changed here, never inside the transaction: a reader must not see
    rows of a transaction that may still roll back. Outside a write transaction it runs at once."""
    hooks = conn.info.get(_PUBLISH)
    if hooks is None:
        publish()
    else:
        hooks.append(publish)


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
    # straight on the driver: the same statement without SQLAlchemy's execution machinery
    conn.connection.driver_connection.execute("BEGIN")  # type: ignore[union-attr]
