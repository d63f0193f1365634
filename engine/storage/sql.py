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

On PostgreSQL every write transaction is fenced (``leadership.py``): the statement that records its
token before COMMIT also locks the ``_rt_leader`` row ``FOR SHARE`` and writes the token only if the
row's epoch is still this engine's; if it is not, another engine took the database over, the
transaction rolls back and the engine steps down. Still one statement, one round trip, per commit.

A database file found damaged by any statement (SQLite's "database disk image is malformed") turns
into a ``StorageCorruptedError`` (a 500, never a client's 400), logs one line, and leaves
``Storage.corruption`` set, which keeps ``/readyz`` failing until a restart checks the file again
(``datadir.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import StorageCorruptedError, UnavailableError
from .system_tables import SYSTEM_METADATA, meta_table

if TYPE_CHECKING:
    from .leadership import Leadership

log = logging.getLogger("reptables.engine.storage")


class Storage:
    """Owns the SQLAlchemy engine; one writer at a time, readers in parallel."""

    def __init__(self, url: str, create_schema: bool = True, application_name: str = "reptables-engine") -> None:
        """``create_schema=False``: the system tables are created later (:meth:`create_schema`),
        once the data directory's checks have seen the database as it was. ``application_name``
        (PostgreSQL) names the engine's sessions: a takeover ends those of the engine it replaced
        (``leadership.py``)."""
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
            kwargs["connect_args"] = {"connect_timeout": 10, "application_name": application_name}
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
        #: why this engine's memory is ahead of its database (PostgreSQL lost asynchronous commits in
        #: a crash); set once, under write_lock, and never cleared: writes are refused until a restart
        self.diverged: str | None = None
        #: PostgreSQL: the token of the last commit that changed anything (``_rt_last_commit``), under
        #: write_lock; unknown until the first writer connection reads it
        self._last_token: int | None | object = _UNKNOWN
        #: PostgreSQL: the server process of the writer connection and its start time, under
        #: write_lock (kept here, not on the connection: a lost connection cannot be asked)
        self._writer_backend: tuple[int, Any] | None = None
        #: the token of the commit whose outcome the writer is looking up (set and cleared under
        #: write_lock; read without it by writers that would wait for it: a reference, a hint)
        self._resolving: int | None = None
        #: set by close(): a commit whose outcome is being looked up stops waiting
        self._closing = threading.Event()
        #: PostgreSQL: this engine's claim on the database (``leadership.py``), set by ``open_database``
        #: before the first write and never changed: every write transaction compares its epoch with
        #: ``_rt_leader``'s in its pre-commit statement (fencing). None: not fenced (SQLite)
        self.leadership: Leadership | None = None
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
    def write(self, durable: bool = True, harmless_if_lost: bool = False) -> Iterator[sa.Connection]:
        """One serialized write transaction; ``durable=False`` skips the fsync (durability=async).

        ``harmless_if_lost`` (with ``durable=False``): a write whose loss in a crash of the database
        changes nothing this engine remembers (forgetting a delivered decision: a lost one is
        delivered again). It is not this engine's "last commit" (see ``_check_last_commit``)."""
        while not self.write_lock.acquire(timeout=0.25):
            if self._resolving is not None:
                # the writer waits for the database to say whether a commit happened: the database is
                # away, and a write would only wait behind it; the caller retries
                raise UnavailableError(f"The database {self.display_url} is unreachable: writes wait for it to say "
                                       "whether the last commit happened; retry")
        try:
            yield from self._write(durable, harmless_if_lost)
        finally:
            self.write_lock.release()

    def _write(self, durable: bool, harmless_if_lost: bool) -> Iterator[sa.Connection]:
        """:meth:`write` with ``write_lock`` held."""
        if self._writer is not None and self._writer.in_transaction():
            # re-entrant use (a write inside a write): join the open transaction
            yield self._writer
            return
        if self.diverged is not None:
            raise self._diverged_error()
        conn = self._writer_connection()
        relaxed = self.is_sqlite and not durable
        if relaxed:
            # NORMAL, not OFF: in WAL mode it skips the commit's fsync as OFF does, but a checkpoint
            # run by this commit still syncs the log before and the database after, so the next
            # durable commit makes this one durable too (the log it fsyncs holds every earlier frame
            # not yet safely in the database): ParticipantSide's relaxed commits rely on that
            _raw_pragma(conn, "PRAGMA synchronous=NORMAL")
        undo: list[Callable[[], None]] = []
        published: list[Callable[[], None]] = []
        conn.info[_UNDO] = undo
        conn.info[_PUBLISH] = published
        trans = conn.begin()
        token: int | None = None
        committing = False
        try:
            yield conn
            lead = self.leadership
            if self.is_postgresql and lead is not None:
                # one statement, as without fencing: if the transaction changed anything, the lease
                # row locked FOR SHARE and its epoch compared with this engine's, and only if it is
                # this engine's, the transaction's token (so that a commit whose answer is lost can be
                # looked up, _resolve); SET LOCAL synchronous_commit in the same round trip
                if harmless_if_lost:
                    found = conn.execute(_FENCE_DURABLE if durable else _FENCE_RELAXED).scalar()
                else:
                    found, token = conn.execute(_FENCED_COMMIT_DURABLE if durable else _FENCED_COMMIT_RELAXED,
                                                {"token": _new_token(), "epoch": lead.epoch}).one()
                if found is not None and found != lead.epoch:
                    # another engine took over: this one must not commit (rolled back below)
                    token = None
                    raise lead.fenced(found)
            elif self.is_postgresql and harmless_if_lost:
                if not durable:
                    conn.execute(_RELAXED)
            elif self.is_postgresql:
                # the transaction's token, written by the transaction itself if it changed anything
                # (None if not: nothing to commit), so that a commit whose answer is lost can be looked
                # up (_resolve); SET LOCAL synchronous_commit in the same round trip
                token = conn.execute(_PRE_COMMIT_DURABLE if durable else _PRE_COMMIT_RELAXED,
                                     {"token": _new_token()}).scalar()
            committing = True
            trans.commit()
        except BaseException as exc:
            if committing and token is not None and self._resolve(token, exc):
                log.warning("the answer to a commit was lost with the database connection; the database "
                            "says it committed", extra={"database": self.display_url})
            else:
                # what the transaction changed in memory goes back with its rows
                with contextlib.suppress(Exception):
                    if trans.is_active:
                        trans.rollback()
                for fn in reversed(undo):
                    fn()
                if _connection_broken(exc, conn):
                    # a new connection for the next write (which checks the database still holds
                    # this engine's last commit: the server may have restarted); closed below
                    self._writer = None
                corrupted = self._corrupted(exc)
                if corrupted is not None:
                    raise corrupted from exc
                if committing and token is not None and isinstance(exc, sa.exc.DBAPIError):
                    raise UnavailableError(f"The commit did not happen: the database {self.display_url} "
                                           f"failed it ({_first_line(exc)}); retry") from exc
                raise
        finally:
            if self._writer is conn:
                conn.info.pop(_UNDO, None)
                conn.info.pop(_PUBLISH, None)
                if relaxed:
                    _raw_pragma(conn, "PRAGMA synchronous=FULL")
            else:  # broken, or lost with a commit's answer (_resolve)
                with contextlib.suppress(Exception):
                    conn.close()
        if token is not None:
            self._last_token = token
        # committed: what readers outside the writer lock may see now (still under the lock). The
        # transaction is durable whatever a hook does: a failing hook is logged, never raised
        # (a caller must not take a committed transaction for a failed one)
        for fn in published:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("publishing a committed write failed")

    def _resolve(self, token: int, exc: BaseException) -> bool:
        """Whether the transaction whose COMMIT raised ``exc`` (the connection was lost) committed:
        asked of the database on a new connection once the lost one's server process is gone,
        waiting (the writer lock held: no other write can go on meanwhile, writers that come are
        told to retry) until the database answers. A commit whose outcome is unknown must be
        neither reported as failed (it may be in the database: a retry would apply it twice) nor
        as done (it may not). Raises ``UnavailableError`` if the storage is closed first (the
        engine is stopping; a restart reads the outcome from the database)."""
        self._writer = None
        backend, self._writer_backend = self._writer_backend, None
        self._resolving = token
        try:
            return self._look_up(token, backend, exc)
        finally:
            self._resolving = None

    def _look_up(self, token: int, backend: tuple[int, Any] | None, exc: BaseException) -> bool:
        waited = 0.0
        delay = 0.1
        while not self._closing.is_set():
            try:
                with self.engine.connect() as conn, conn.begin():
                    if backend is not None and _still_running(conn, backend):
                        # the server may still be committing it: end that session first (its
                        # COMMIT then either happened or not), and look again
                        conn.execute(_TERMINATE, {"pid": backend[0]})
                        status = "the lost connection's session still runs"
                    else:
                        stored = conn.execute(_LAST_TOKEN).scalar()
                        return bool(stored == token)
            except sa.exc.DBAPIError:  # refused, starting up, shutting down, reset
                status = "unreachable"
            if waited == 0.0 or int(waited + delay) // 10 != int(waited) // 10:
                log.warning("a commit's outcome is unknown until the database answers; writes wait",
                            extra={"database": self.display_url, "status": status, "error": _first_line(exc)})
            self._closing.wait(delay)
            waited += delay
            delay = min(delay * 2, 2.0)
        raise UnavailableError("The engine is stopping with a commit whose outcome the database has not told; "
                               "a restart reads it from the database") from exc

    def _diverged_error(self) -> StorageCorruptedError:
        return StorageCorruptedError(f"This engine's memory is ahead of its database ({self.diverged}); restart "
                                     "the engine to reload it", attributes={"reason": self.diverged})

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
                try:
                    with writer.begin():
                        backend = tuple(writer.execute(_BACKEND_OF_SESSION).one())
                        stored, epoch = writer.execute(_LAST_TOKEN_AND_EPOCH).one()
                except BaseException:
                    writer.close()
                    raise
                lead = self.leadership
                if lead is not None and epoch != lead.epoch:
                    # replaced while away (its sessions ended by the new leader): not a divergence
                    writer.close()
                    raise lead.fenced(epoch)
                try:
                    self._check_last_commit(stored)
                except StorageCorruptedError:
                    writer.close()
                    raise
                self._writer_backend = (int(backend[0]), backend[1])
            self._writer = writer
        return self._writer

    def _check_last_commit(self, stored: int | None) -> None:
        """A new writer connection (at start, or after one was lost: the server may have restarted):
        the database must hold the last commit this engine made. If it does not (PostgreSQL lost
        commits made with durability=async in a crash, or the database was restored from a backup
        under the engine), the engine's memory (row counts, queue tails, replication progress) is
        ahead of its database: it refuses every write until a restart reloads it from the database."""
        if self._last_token is _UNKNOWN:
            self._last_token = stored  # the engine's first connection: what the database holds
            return
        if stored == self._last_token:
            return
        self.diverged = f"the database {self.display_url} no longer holds this engine's last commit"
        log.error("the database lost commits this engine acknowledged (made with durability=async before "
                  "PostgreSQL crashed, or a backup restored under the engine); writes are refused until the "
                  "engine is restarted", extra={"database": self.display_url})
        raise self._diverged_error()

    @contextmanager
    def read(self, one_statement: bool = False) -> Iterator[sa.Connection]:
        """A read-only transaction (a consistent snapshot) on a pooled connection.

        The event-loop thread, which serves small reads itself, keeps one connection of its own:
        a pool checkout and return cost more than a point lookup.

        ``one_statement``: the caller runs a single statement, on the DBAPI cursor. On SQLite, a
        statement outside a transaction is its own read transaction, as consistent as one inside,
        so the event loop's reader runs it without BEGIN and COMMIT - two more statements and
        SQLAlchemy's transaction objects, about a sixth of a point lookup's engine CPU. (Not on
        PostgreSQL: there the driver would open a transaction that nothing ends.)"""
        try:
            conn = None
            if threading.current_thread() is threading.main_thread():
                if self._loop_reader is None or self._loop_reader.closed or self._loop_reader.invalidated:
                    self._loop_reader = self.engine.connect()
                if not self._loop_reader.in_transaction():  # not a read inside a read
                    conn = self._loop_reader
            if conn is None:
                with self.engine.connect() as pooled, pooled.begin():
                    yield pooled
                return
            try:
                if one_statement and self.is_sqlite:
                    try:
                        yield conn
                    finally:
                        if conn.in_transaction():  # (SQLAlchemy began one after all: ended unchanged)
                            conn.rollback()
                    return
                with conn.begin():
                    yield conn
            except Exception as exc:
                if _connection_broken(exc, conn):
                    with contextlib.suppress(Exception):
                        conn.close()
                    self._loop_reader = None
                raise
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
        self._closing.set()
        with self.write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        if self._loop_reader is not None:
            self._loop_reader.close()
            self._loop_reader = None
        self.engine.dispose()
        if self.leadership is not None:
            # no write follows: the lease ends now, and a standby takes over at once
            self.leadership.close()


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


#: the last statement of a PostgreSQL write transaction before its COMMIT: if the transaction
#: changed anything (it has a transaction id), its token in _rt_last_commit (RETURNING it; no row if
#: it changed nothing: it has nothing to commit, and writing the token would make it write); for
#: durability=async no WAL flush at its COMMIT (SET LOCAL synchronous_commit = off, read at COMMIT)
_PRE_COMMIT_DURABLE = sa.text(
    "INSERT INTO _rt_last_commit (id, token) SELECT 1, :token WHERE pg_current_xact_id_if_assigned() IS NOT NULL "
    "ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token RETURNING token")
_PRE_COMMIT_RELAXED = sa.text(
    "INSERT INTO _rt_last_commit (id, token) SELECT 1, :token WHERE pg_current_xact_id_if_assigned() IS NOT NULL "
    "AND set_config('synchronous_commit', 'off', true) = 'off' "
    "ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token RETURNING token")
_RELAXED = sa.text("SET LOCAL synchronous_commit = off")
_LAST_TOKEN = sa.text("SELECT token FROM _rt_last_commit WHERE id = 1")
_LAST_TOKEN_AND_EPOCH = sa.text("SELECT (SELECT token FROM _rt_last_commit WHERE id = 1), "
                                "(SELECT epoch FROM _rt_leader WHERE id = 1)")
#: the same with fencing (storage/leadership.py), still one statement: ``fence`` is NULL if the
#: transaction changed nothing (no transaction id yet: checked first, so that the lock below does not
#: make it write), else the lease row's epoch, read under a share lock held until COMMIT (-1 if the row
#: is gone); the token is written only if that epoch is this engine's. Answers (epoch found, token):
#: (None, None) nothing to commit, (mine, token) commit, (other, None) fenced
_FENCE = ("SELECT CASE WHEN pg_current_xact_id_if_assigned() IS NULL THEN NULL "
          "ELSE coalesce((SELECT epoch FROM _rt_leader WHERE id = 1 FOR SHARE), -1) END AS epoch")
_FENCED_COMMIT = (
    "WITH fence AS MATERIALIZED ({fence}{relaxed}), "
    "wrote AS (INSERT INTO _rt_last_commit (id, token) SELECT 1, :token FROM fence WHERE fence.epoch = :epoch "
    "ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token RETURNING token) "
    "SELECT fence.epoch, (SELECT token FROM wrote) FROM fence")
_SET_RELAXED = ", set_config('synchronous_commit', 'off', true) AS relaxed"
_FENCED_COMMIT_DURABLE = sa.text(_FENCED_COMMIT.format(fence=_FENCE, relaxed=""))
_FENCED_COMMIT_RELAXED = sa.text(_FENCED_COMMIT.format(fence=_FENCE, relaxed=_SET_RELAXED))
#: a write whose loss is harmless (no token): the fence alone
_FENCE_DURABLE = sa.text(_FENCE)
_FENCE_RELAXED = sa.text(_FENCE + _SET_RELAXED)
#: the server process of a session and its start (a pid alone may be reused after a restart)
_BACKEND_OF_SESSION = sa.text("SELECT pg_backend_pid(), backend_start FROM pg_stat_activity "
                              "WHERE pid = pg_backend_pid()")
_SESSION_RUNS = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid AND backend_start = :start")
_TERMINATE = sa.text("SELECT pg_terminate_backend(:pid)")
_UNKNOWN = object()


def _new_token() -> int:
    """A transaction's token: random, 63 bits (a BIGINT)."""
    return int.from_bytes(os.urandom(8), "big") >> 1


def _still_running(conn: sa.Connection, backend: tuple[int, Any]) -> bool:
    return bool(conn.execute(_SESSION_RUNS, {"pid": backend[0], "start": backend[1]}).scalar())


def _connection_broken(exc: BaseException, conn: sa.Connection) -> bool:
    """Whether ``exc`` left ``conn`` unusable (lost, or its transaction beyond a rollback)."""
    return conn.invalidated or (isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated) \
        or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.PendingRollbackError))


def _first_line(exc: BaseException) -> str:
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


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
