"""A table cluster's PostgreSQL database: owned by that cluster, checked at start, and its clock.

With ``engine serve --storage postgresql://...`` a table cluster's state lives in a database of its
own on a PostgreSQL server that its operators already run, back up and fail over (CloudNativePG on
Kubernetes; Patroni elsewhere). Three things a data directory did for SQLite are done here:

* **Ownership.** The database remembers the cluster it holds (``_rt_meta``: ``cluster_name``,
  ``database_id``, ``storage_format``). An engine refuses, in one line, a database that holds
  another cluster, that a newer reptables wrote, or that lacks system tables a cluster's database
  has (a database emptied by hand is not started as an empty cluster): ``DatabaseRefused``.
* **Integrity at start.** The system tables are all there, and the SQL tables of every table of
  the tree (checked with the tree, by the node). PostgreSQL checks its own pages (checksums, WAL).
* **The timestamp reservation** (``timestamps.py``: timestamps stay unique across restarts) is a
  row of ``_rt_meta`` instead of a file, written on a connection of its own in autocommit, so that
  every engine process that ever serves the database (a restart on another machine, a standby)
  continues above it. It only ever grows: an engine that a standby replaced may write it late.
* **Who serves it**: one engine at a time (``leadership.py``), whose writes are fenced.

Passwords: the URL's password never reaches a log or an error (``Storage.display_url``).
"""

from __future__ import annotations

import threading

import sqlalchemy as sa

from ..errors import DataDirError
from ..timestamps import MAX_TIMESTAMP
from .leadership import Leadership
from .sql import Storage
from .system_tables import meta_table

#: the system tables without which a database that held a cluster is not that cluster's any more
ESSENTIAL_TABLES = ("_rt_meta", "_rt_nodes", "_rt_tablets")
_RESERVATION = "timestamp_reservation"
_RAISE_RESERVATION = sa.text(
    "INSERT INTO _rt_meta (name, value) VALUES (:name, :value) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value "
    "WHERE CASE WHEN _rt_meta.value ~ '^[0-9]{1,19}$' "
    "THEN CAST(_rt_meta.value AS numeric) < CAST(EXCLUDED.value AS numeric) ELSE true END")


class DatabaseRefused(DataDirError):
    """A database this engine must not serve (another cluster's, a newer format's, an incomplete one)."""


def open_database(url: str, cluster_name: str, storage_format: str, leadership: Leadership | None = None) -> Storage:
    """The storage of the PostgreSQL database at ``url`` for cluster ``cluster_name``, after its checks;
    its system tables created when it is new (an empty database becomes this cluster's).

    Its writes are fenced by ``leadership`` (``leadership.py``): a group's leader that won the lease
    (``engine serve --standby``), or, by default, a single engine's claim, taken here (refused, with
    ``DatabaseRefused``, while a group's leader holds the database). The storage owns the leadership
    from here on: closing it ends the lease, and so does a refusal."""
    leadership = leadership if leadership is not None else Leadership(url, cluster_name)
    storage = Storage(url, create_schema=False, application_name=leadership.application_name)
    try:
        check_database(storage, cluster_name, storage_format)
        storage.create_schema()
        if leadership.epoch is None:
            leader = leadership.claim()
            if leader is not None:
                where = f" at {leader.address}" if leader.address else ""
                raise DatabaseRefused(
                    f"Refusing to serve the database {storage.display_url}: engine {leader.holder}{where} leads it "
                    "(a leader/standby group); start this engine with --standby to join the group",
                    attributes={"database": storage.display_url, "leader_url": leader.address})
        storage.leadership = leadership
    except BaseException:
        storage.close()
        leadership.close()
        raise
    return storage


def probe_database(url: str, cluster_name: str, storage_format: str) -> None:
    """:func:`check_database` on a storage of its own, closed again: a standby refuses at once what it
    would refuse to serve once it wins (``DatabaseRefused``)."""
    storage = Storage(url, create_schema=False)
    try:
        check_database(storage, cluster_name, storage_format)
    finally:
        storage.close()


def check_database(storage: Storage, cluster_name: str, storage_format: str) -> None:
    """Refuse (``DatabaseRefused``, one line naming the database) what this engine must not serve."""
    where = storage.display_url
    try:
        present = storage.table_names()
    except sa.exc.OperationalError as exc:
        raise DatabaseRefused(f"Cannot reach the database {where}: {str(exc.orig).strip().splitlines()[0]}",
                              attributes={"database": where}) from None
    held = "_rt_meta" in present
    if not held:
        # (_rt_leader is made by the first standby of a new database, before a leader made it a cluster's)
        others = sorted(n for n in present if (n.startswith("_rt_") or n.startswith("rt_t")) and n != "_rt_leader")
        if others:
            raise DatabaseRefused(f"Refusing to serve the database {where}: it has reptables tables "
                                  f"({', '.join(others[:5])}) but no _rt_meta; it is not a cluster's database as it "
                                  "was left (restore it, or give an empty database)", attributes={"database": where})
        return
    with storage.read() as conn:
        meta = dict(conn.execute(sa.select(meta_table.c.name, meta_table.c.value)).all())
    owner = meta.get("cluster_name")
    if owner is not None and owner != cluster_name:
        raise DatabaseRefused(f"Refusing to serve the database {where} as cluster {cluster_name}: it holds cluster "
                              f"{owner} (one database per table cluster; give this cluster a database of its own)",
                              attributes={"database": where, "cluster_name": owner})
    stored = meta.get("storage_format")
    if stored is not None and stored.isdigit() and storage_format.isdigit() and int(stored) > int(storage_format):
        raise DatabaseRefused(f"Refusing to serve the database {where}: a newer reptables wrote it (storage format "
                              f"{stored}, this engine reads format {storage_format}); run that reptables",
                              attributes={"database": where, "storage_format": stored})
    missing = [t for t in ESSENTIAL_TABLES if t not in present]
    if owner is not None and missing:
        raise DatabaseRefused(f"Refusing to serve the database {where}: it held cluster {owner}, but its tables "
                              f"{', '.join(missing)} are missing", attributes={"database": where})


class DatabaseReservation:
    """The timestamp reservation in ``_rt_meta``: ``read`` at start, ``write`` (durable) once a
    second or so, on a connection of its own in autocommit (never the writer's transaction: the
    reservation must be durable before a timestamp above the old one is handed out, whatever that
    transaction does). ``_lock`` guards the connection: a leaf, taken under ``TimestampProvider._lock``."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._lock = threading.Lock()
        self._conn: sa.Connection | None = None

    def read(self) -> int:
        with self.storage.read() as conn:
            value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == _RESERVATION)).scalar()
        if value is None:
            return 0
        if not value.isdigit() or not 0 <= int(value) <= MAX_TIMESTAMP:
            raise DatabaseRefused(f"The timestamp reservation in the database {self.storage.display_url} is damaged "
                                  f"(it holds {value[:40]!r}): timestamps could repeat", attributes={})
        return int(value)

    def write(self, value: int) -> None:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.invalidated:
                self._conn = self.storage.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                # only ever up: an engine that another replaced (leadership.py) and that writes its
                # reservation late must not lower the new leader's, or a third engine would hand out
                # the new leader's timestamps again
                self._conn.execute(_RAISE_RESERVATION, {"name": _RESERVATION, "value": str(value)})
            except BaseException:
                self._conn.close()
                self._conn = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
