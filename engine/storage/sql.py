"""SQL storage through SQLAlchemy Core: the one writer connection and its lock, and the readers.

Everything here is dialect-neutral: no SQLite-only SQL. Two backends: SQLite (the embedded
default, one file in the data directory) runs in WAL mode with ``synchronous=FULL`` so that an
acknowledged commit survives a crash; PostgreSQL (``postgresql://...``, one database per table
cluster, ``storage/database.py``) with its defaults (``fsync``, ``synchronous_commit=on``). Writes
are serialized by the engine (one writer connection, READ COMMITTED on PostgreSQL: it is the only
writer), reads run concurrently on other pooled connections, each a consistent snapshot (SQLite's
read transaction; REPEATABLE READ on PostgreSQL, whose default would let two statements of one
read see different commits). A write with ``durable=False`` (``durability=async``) skips the
fsync: ``PRAGMA synchronous=OFF`` on SQLite, ``SET LOCAL synchronous_commit = off`` on PostgreSQL.
Connections are pooled by SQLAlchemy's own pool (``QueuePool``), with a liveness check before a
pooled connection is used on PostgreSQL (a server restart leaves dead connections behind). The system tables are
defined in ``system_tables.py``, the SQL shape of user tables in ``shapes.py``, the statements the
hot paths compile once in ``statements.py``.

What is tricky: in-memory state changes with a write transaction, so a write transaction carries
two lists of hooks. ``on_rollback`` undoes, if the transaction fails, what it changed in memory
(a queue's row count, say); ``on_commit`` publishes, once the SQL commit is done and still under
the writer lock, what threads read *without* the writer lock (the queue tail the replicators push
from), so that no reader sees rows of a transaction that may still roll back.

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
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import StorageCorruptedError
from .system_tables import SYSTEM_METADATA, meta_table

log = logging.getLogger("reptables.engine.storage")


class Storage:
    """Owns the SQLAlchemy engine; one writer at a time, readers in parallel."""

    def __init__(self, url: str, create_schema: bool = True) -> None:
        """``create_schema=False``: the system tables are created later (:meth:`create_schema`),
        once the data directory's checks have seen the database as it was."""
        self.is_sqlite = url.startswith("sqlite")
        self.is_postgresql = url.startswith("postgresql")
        self.url = postgresql_driver_url(url) if self.is_postgresql else url
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            kwargs["pool_size"] = 8
            kwargs["max_overflow"] = 8
        if self.is_postgresql:
            kwargs["pool_size"] = 8
            kwargs["max_overflow"] = 16
            kwargs["pool_pre_ping"] = True
            kwargs["isolation_level"] = "REPEATABLE READ"
            kwargs["connect_args"] = {"connect_timeout": 10, "application_name": "reptables-engine"}
        # every transaction is ended explicitly, so returning a connection needs no rollback
        kwargs["pool_reset_on_return"] = None
        self.engine = sa.create_engine(self.url, **kwargs)
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
                      extra={"database": self.display_url, "error": reason})
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
                    if self.is_postgresql and not durable:
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
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
        if self._writer is None or self._writer.closed or self._writer.invalidated:
            writer = self.engine.connect()
            if self.is_postgresql:
                # the only writer: each statement sees what the writer itself committed last
                writer = writer.execution_options(isolation_level="READ COMMITTED")
            self._writer = writer
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

    @property
    def display_url(self) -> str:
        """The database's URL for logs and messages: never its password."""
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

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


def postgresql_driver_url(url: str) -> str:
    """``postgresql://...`` with the driver the engine uses (psycopg 3) named, as SQLAlchemy wants it."""
    parsed = sa.engine.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


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
