"""The data directory of one engine: its files, who may read them, and the start-up checks that keep
a lost or damaged database from being served as an empty, ready cluster.

Why: SQLite opens a missing or 0-byte file as a new, empty database, and a deleted write-ahead log
simply is not replayed. Left alone, a data directory whose database was truncated started as an
empty cluster (every row silently gone), and one whose WAL was deleted after a crash silently lost
the commits since the last checkpoint. So a directory that has held a cluster says so in a marker
file, and a start-up that does not find what the marker promises refuses to start (``DataDirError``:
the process exits, naming the directory and the reason) instead of creating anything.

The files (the directory 0700, every file 0600: the database and its WAL hold peer tokens):

* ``engine.sqlite`` - created 0600 before SQLite opens it; SQLite creates ``-wal`` and ``-shm``
  with the database file's mode.
* ``engine.marker`` - JSON ``{cluster_name, database_id, state}``, written (atomically) once the
  cluster's database is in place. ``database_id`` is also in the database's ``_rt_meta``, so a
  database from another directory is told apart. ``state`` is ``running`` from start-up until a
  clean close: closing the last connection checkpoints the WAL into the database and deletes it,
  then the state becomes ``stopped``. A start that finds ``running`` (the last run was killed) must
  find the WAL still there; if it is gone, it was deleted, and with it every commit since the last
  checkpoint. Removing the marker is the explicit way to accept what is there (or to start empty).
* ``token``, ``timestamp.reservation`` (and the local runner's ``engine.log``).
* ``engine.lock`` - one engine at a time: the engine that serves the directory holds an advisory
  lock (``flock``) on it from the first step of start-up until it closes the database, and writes
  its pid into it once it holds the lock. A second engine on the directory (another process, or
  this process opening it twice) is refused at once, naming the holder's pid
  (``DataDirInUseError``), before it reads or creates anything else: SQLite alone would let it
  start and fail later with "database is locked", or worse, check a database another engine is
  writing. The kernel releases the lock when its holder dies, so the file a killed engine leaves
  behind never blocks a restart: only the lock decides, not the file's existence or the pid in it.
  The file is never removed (a stopping engine that removed it could let the next two engines
  lock two different files of one name).

What start-up checks, in order: the marker's promises (database present, not empty, the WAL of an
unclean stop present), the database's first bytes (SQLite's magic: a file of garbage is refused
before SQLite touches it), then ``PRAGMA quick_check`` and, for a directory that held a cluster,
the system tables, the Cypress nodes and the metadata rows. ``quick_check`` reads the whole file:
on a 1,000,000-row table (89 MB) it takes 0.15 s with the file in the page cache and 1.7 s from a
cold disk - a cost worth paying once per start for never serving a structurally damaged file.
It does not verify row contents (SQLite keeps no checksums): a flipped byte inside a value goes
unnoticed by any check short of comparing with a replica.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import time
import uuid
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import sqlalchemy as sa

from ..errors import DataDirError, DataDirInUseError
from .sql import Storage
from .system_tables import meta_table, nodes_table

log = logging.getLogger("reptables.engine.storage")

DATABASE = "engine.sqlite"
MARKER = "engine.marker"
LOCK = "engine.lock"
#: files of a data directory that no other user may read (tokens: the token file, the peer
#: directory inside the database and its WAL)
PRIVATE_FILES = (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm", "token", "timestamp.reservation", MARKER,
                 LOCK, "engine.log")
#: the tables without which a database that held a cluster is not that cluster's any more (the
#: others are created when missing: a newer engine may add system tables)
ESSENTIAL_TABLES = ("_rt_meta", "_rt_nodes", "_rt_tablets")
#: the metadata rows a cluster's database has after its first start (format 1 had no storage_format);
#: one written since the marker exists also has these
ESSENTIAL_META = ("cluster_name",)
DATABASE_ID = "database_id"
MARKED_META = ("storage_format", DATABASE_ID)
RUNNING = "running"
STOPPED = "stopped"
_SQLITE_MAGIC = b"SQLite format 3\x00"
RECOVERY = 'see "Corruption and recovery" in docs/engine.md'
#: how long a refused start waits for the lock's holder to write its pid (it does so right after
#: taking the lock: only a start that loses the race by microseconds reads the file before)
_HOLDER_WAIT = 1.0


@dataclass(frozen=True)
class Marker:
    """What ``engine.marker`` says about the directory's cluster."""

    cluster_name: str
    database_id: str
    state: str


class DataDir:
    """One engine's data directory: checked by :func:`open_data_dir`, marked by the node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.database = path / DATABASE
        self.wal = path / f"{DATABASE}-wal"
        self.marker_path = path / MARKER
        #: the marker as found at start-up, then as last written (only the start-up thread and
        #: close() write it, one after the other)
        self.marker: Marker | None = None
        #: closes the descriptor of ``engine.lock`` that holds the directory's lock (None until
        #: :meth:`prepare` took it); also run if this object is dropped still holding it
        self._unlock: weakref.finalize | None = None

    def refuse(self, reason: str) -> DataDirError:
        """The start-up error for this directory: its path, the reason, and where recovery is."""
        return DataDirError(f"Refusing to serve the data directory {self.path}: {reason}; {RECOVERY}",
                            attributes={"data_dir": str(self.path)})

    # -- before SQLite opens anything ------------------------------------------------------------------

    def prepare_local(self) -> None:
        """For an engine whose database is elsewhere (PostgreSQL): take the directory's lock and make
        it private; the directory then holds only the engine's own files (token, conflict CSVs,
        snapshot pages), and the database checks are the database's (``database.py``)."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock()
        self._private_directory()
        self._private_files()

    def prepare(self) -> None:
        """Take the directory's lock, make the directory private, read the marker, check what it
        promises, create the database file (0600) when there is none and nothing says there was one."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock()
        self._private_directory()
        self.marker = self._read_marker()
        exists = self.database.exists()
        marker = self.marker
        if marker is not None:
            held = f"it held cluster {marker.cluster_name!r} ({MARKER} says so)"
            if not exists:
                raise self.refuse(f"{held}, but its database {DATABASE} is missing")
            if self.database.stat().st_size == 0:
                raise self.refuse(f"{held}, but its database {DATABASE} is empty (0 bytes): it was truncated")
            if marker.state == RUNNING and not self.wal.exists():
                raise self.refuse(
                    f"{held} and its last run did not stop cleanly, but the write-ahead log {self.wal.name} is "
                    "missing: the commits since its last checkpoint are lost. If another SQLite client has "
                    f"opened and closed the database since (which checkpoints and removes the log), remove "
                    f"{MARKER} to accept the database as it is")
        if exists and self.database.stat().st_size > 0:
            with open(self.database, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
            if head != _SQLITE_MAGIC:
                raise self.refuse(f"its database {DATABASE} is not a SQLite database (its first bytes are "
                                  f"{head[:16]!r})")
        if not exists:
            # 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database's mode
            os.close(os.open(self.database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._private_files()

    def _private_directory(self) -> None:
        mode = stat.S_IMODE(self.path.stat().st_mode)
        if not mode & 0o077:
            return
        try:
            os.chmod(self.path, (mode & ~0o077) | 0o700)
            log.warning("the data directory was open to other users: made private",
                        extra={"data_dir": str(self.path), "mode": oct(mode), "new_mode": "0o700"})
        except OSError as exc:
            log.warning("the data directory is open to other users and cannot be made private",
                        extra={"data_dir": str(self.path), "mode": oct(mode), "error": str(exc)})

    # -- the lock ----------------------------------------------------------------------------------------

    def _lock(self) -> None:
        """Take the lock on ``engine.lock`` for as long as this engine serves the directory, or
        refuse (``DataDirInUseError``, naming the holder's pid) if another holds it."""
        if self._unlock is not None:
            return
        try:
            # not truncated on open: until the lock is ours, the pid in the file is the holder's
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self.refuse(f"its lock file {LOCK} cannot be opened ({exc.strerror})") from exc
        try:
            if not self._flock(fd):
                raise self._in_use(self._holder())
        except BaseException:
            os.close(fd)
            raise
        self._unlock = weakref.finalize(self, os.close, fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def _flock(self, fd: int) -> bool:
        """Whether the lock was taken (False: someone holds it)."""
        try:
            # flock, not fcntl's POSIX locks: an flock lock belongs to the open file, so a second
            # open of the directory in the same process is refused too, and the lock is not dropped
            # when something else in the process opens and closes the file (POSIX locks are)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise self.refuse(f"its lock file {LOCK} cannot be locked ({exc.strerror})") from exc
        return True

    def release(self) -> None:
        """Release the directory's lock (a later engine may serve it); nothing if not held."""
        if self._unlock is not None:
            self._unlock()
            self._unlock = None

    def _in_use(self, pid: int | None) -> DataDirInUseError:
        if pid == os.getpid():
            who, then = f"this process ({pid}) serves it already", "close the cluster it opened first"
        else:
            who = "another process serves it (its pid is not in the file)" if pid is None \
                else f"the process {pid} serves it"
            then = "stop that engine first, or serve another directory"
        return DataDirInUseError(f"Refusing to serve the data directory {self.path}: {who} and holds its lock "
                                 f"{LOCK}; {then}", attributes={"data_dir": str(self.path), "pid": pid})

    def _holder(self) -> int | None:
        """The pid in ``engine.lock``, once it is a live process's (or after a moment, as it is:
        a holder in another pid namespace is not one of ours)."""
        deadline = time.monotonic() + _HOLDER_WAIT
        while True:
            try:
                text = (self.path / LOCK).read_text().strip()
            except OSError:
                text = ""
            pid = int(text) if text.isdigit() else None
            if (pid is not None and _alive(pid)) or time.monotonic() >= deadline:
                return pid
            time.sleep(0.02)

    def _private_files(self) -> None:
        loose = []
        for name in PRIVATE_FILES:
            path = self.path / name
            try:
                mode = stat.S_IMODE(path.stat().st_mode)
                if mode & 0o077:
                    os.chmod(path, mode & 0o700)
                    loose.append(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("a data file is open to other users and cannot be made private",
                            extra={"data_dir": str(self.path), "file": name, "error": str(exc)})
        if loose:
            log.warning("data files were open to other users: made private (0600)",
                        extra={"data_dir": str(self.path), "files": ", ".join(loose)})

    def _read_marker(self) -> Marker | None:
        try:
            raw = self.marker_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
            marker = Marker(cluster_name=str(data["cluster_name"]), database_id=str(data["database_id"]),
                            state=str(data["state"]))
        except (ValueError, KeyError, TypeError):
            raise self.refuse(f"its marker {MARKER} is damaged ({raw[:60]!r})") from None
        if marker.state not in (RUNNING, STOPPED):
            raise self.refuse(f"its marker {MARKER} has an unknown state {marker.state!r}")
        return marker

    # -- with the database open ------------------------------------------------------------------------

    def verify(self, storage: Storage) -> None:
        """``PRAGMA quick_check``, then, if the directory or the database held a cluster, its system
        tables, Cypress nodes and metadata rows (before any is created: a missing one is refused)."""
        started = time.monotonic()
        try:
            with storage.engine.connect() as conn:
                try:
                    problems = [line for r in conn.exec_driver_sql("PRAGMA quick_check(5)")
                                for line in str(r[0]).splitlines() if not line.startswith("***")]
                except sa.exc.DBAPIError as exc:
                    # the check itself could not read the file (a damaged page it cannot walk)
                    problems = [str(exc.orig)]
                if problems != ["ok"]:
                    raise self.refuse(f"its database {DATABASE} failed SQLite's integrity check ("
                                      + "; ".join(p[:200] for p in problems[:5]) + ")")
                tables = set(sa.inspect(conn).get_table_names())
                nodes = conn.execute(sa.select(sa.func.count()).select_from(nodes_table)).scalar() \
                    if "_rt_nodes" in tables else 0
                if self.marker is None and not nodes:
                    return  # a new directory (or one whose first start did not get this far)
                missing = [t for t in ESSENTIAL_TABLES if t not in tables]
                if missing:
                    raise self.refuse(f"its database {DATABASE} lacks the system tables {', '.join(missing)}")
                if not nodes:
                    raise self.refuse(f"its database {DATABASE} has no Cypress nodes")
                meta = {r.name: r.value for r in conn.execute(sa.select(meta_table.c.name, meta_table.c.value))}
                expected = ESSENTIAL_META + (MARKED_META if self.marker is not None else ())
                missing = [m for m in expected if m not in meta]
                if missing:
                    raise self.refuse(f"its database {DATABASE} lacks its metadata ({', '.join(missing)})")
                if self.marker is not None and meta[DATABASE_ID] != self.marker.database_id:
                    raise self.refuse(f"its database {DATABASE} belongs to another data directory (database id "
                                      f"{meta[DATABASE_ID]}, {MARKER} names {self.marker.database_id})")
        except sa.exc.DBAPIError as exc:
            raise self.refuse(f"its database {DATABASE} cannot be read ({exc.orig})") from exc
        log.info("data directory checked", extra={"data_dir": str(self.path),
                                                  "seconds": round(time.monotonic() - started, 3),
                                                  "database_bytes": self.database.stat().st_size})

    # -- the marker --------------------------------------------------------------------------------------

    def mark_running(self, cluster_name: str, database_id: str) -> None:
        """From now until :meth:`mark_stopped`: this directory holds this cluster, and a start that
        follows a kill must find the WAL. Called once the cluster is loaded (the WAL exists)."""
        self._write_marker(Marker(cluster_name=cluster_name, database_id=database_id, state=RUNNING))

    def mark_stopped(self) -> None:
        """After the database was closed (its WAL checkpointed and removed): the marker says so,
        and the directory's lock is released - the last thing the engine does with the directory."""
        try:
            if self.marker is not None:
                self._write_marker(Marker(self.marker.cluster_name, self.marker.database_id, STOPPED))
        finally:
            self.release()

    def _write_marker(self, marker: Marker) -> None:
        tmp = self.marker_path.with_name(f"{MARKER}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(asdict(marker)).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.marker_path)
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.marker = marker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def new_database_id() -> str:
    return uuid.uuid4().hex


def open_data_dir(data_dir: DataDir) -> Storage:
    """The storage of a checked data directory, its system tables created, the directory locked; a
    ``DataDirInUseError`` when another engine serves it, a ``DataDirError`` (nothing created) when
    the directory is not what it should be.

    The lock is released by ``data_dir.mark_stopped`` (``Cluster.close``), or, for a storage opened
    without the ``DataDir`` being kept (``storage_for_data_dir``), once the storage is garbage."""
    try:
        data_dir.prepare()
        storage = Storage(f"sqlite:///{data_dir.database}", create_schema=False)
    except BaseException:
        data_dir.release()
        raise
    try:
        data_dir.verify(storage)
        storage.create_schema()
    except BaseException:
        storage.close()
        data_dir.release()
        raise
    weakref.finalize(storage, data_dir.release)
    return storage


def storage_for_data_dir(path: Path) -> Storage:
    """The storage of the data directory ``path``, after its checks (``open_data_dir``; ``Cluster.open``
    keeps the ``DataDir`` too, to mark it)."""
    return open_data_dir(DataDir(path))
