"""Which storage the engines of a test use: SQLite (the default) or PostgreSQL, one server per run.

Every module whose behaviour depends on storage runs twice in the suite, once per backend
(tests/conftest.py collects it a second time as ``test_x.py[postgresql]``). The harness reads the
backend here: an :class:`~.engines.EngineProcess` made while the backend is PostgreSQL gets a new
database of the run's server (``--storage``), and :func:`open_cluster` opens an in-process cluster
on one. The run's server is started once, by the process that runs the session (the controller
under pytest-xdist), and its address handed to the workers in ``REPTABLES_TEST_PG``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reptables.engine.config import EngineConfig
    from reptables.engine.node import Cluster

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
#: the backend of the engines made now (set by the collector of a backend's module; default SQLite)
BACKEND_ENV = "REPTABLES_TEST_BACKEND"
#: the run's PostgreSQL server: "HOST:PORT" (set by the session; absent: no server)
SERVER_ENV = "REPTABLES_TEST_PG"
#: the database user of the run's server
DB_USER = "reptables"

_databases = 0


class RunServer:
    """The run's PostgreSQL server as the tests see it: its address, new databases, connections."""

    def __init__(self, address: str) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)

    def url(self, database: str) -> str:
        return f"postgresql://{DB_USER}@{self.host}:{self.port}/{database}"

    @property
    def conninfo(self) -> str:
        """The libpq connection string of its ``postgres`` database."""
        return f"host={self.host} port={self.port} dbname=postgres user={DB_USER}"

    def connect(self, autocommit: bool = True) -> Any:
        """A psycopg connection to its ``postgres`` database (the caller closes it)."""
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=autocommit, connect_timeout=30)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """``psql -At -c sql``: its output (raises with psql's message when it fails)."""
        proc = subprocess.run(["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", self.host, "-p", str(self.port),
                               "-U", DB_USER, "-d", database, "-c", sql], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"psql {sql!r} on {database}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def create_database(self, prefix: str = "engine", options: str = "") -> str:
        """A new, empty database (``CREATE DATABASE ... options``): its URL (no password: trust auth)."""
        global _databases
        _databases += 1
        name = "".join(ch if ch.isalnum() else "_" for ch in f"{prefix}_{os.getpid()}_{_databases}".lower())[:60]
        self.psql(f'CREATE DATABASE "{name}" {options}')
        return self.url(name)


def run_server() -> RunServer:
    """The run's PostgreSQL server (started by the session: tests/conftest.py)."""
    address = os.environ.get(SERVER_ENV)
    if not address:
        raise RuntimeError(f"no PostgreSQL server for this test run ({SERVER_ENV} is not set): the session starts "
                           "one (tests/conftest.py) unless REPTABLES_TEST_BACKENDS leaves postgresql out; install "
                           "PostgreSQL 15 (hack/bootstrap.sh does)")
    return RunServer(address)


def current() -> str:
    """The backend engines made now use."""
    return os.environ.get(BACKEND_ENV, SQLITE)


@contextlib.contextmanager
def using(backend: str) -> Iterator[None]:
    """Make ``backend`` the current one for the block (a module's tests, a fixture)."""
    before = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = backend
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = before


def new_database_url(prefix: str = "engine") -> str:
    """A new, empty database on the run's server, for one engine: its URL (no password: trust auth)."""
    return run_server().create_database(prefix)


def storage_args(name: str) -> list[str]:
    """The ``engine serve`` arguments that put an engine named ``name`` on the current backend."""
    if current() != POSTGRESQL:
        return []
    return ["--storage", new_database_url(name)]


#: the database of each data directory an in-process cluster was opened on (a reopen finds its data)
_cluster_databases: dict[Path, str] = {}


def open_cluster(name: str, data_dir: Path, config: EngineConfig | None = None) -> Cluster:
    """An in-process cluster on the current backend: for PostgreSQL on a database of the run's server,
    a new one for a new ``data_dir`` and the same one when ``data_dir`` is opened again."""
    from reptables.engine.config import DEFAULT_CONFIG
    from reptables.engine.node import Cluster

    if current() == POSTGRESQL:
        url = _cluster_databases.get(data_dir)
        if url is None:
            url = _cluster_databases[data_dir] = new_database_url(name)
        return Cluster.open_database(name, url, data_dir, config or DEFAULT_CONFIG)
    return Cluster.open(name, data_dir, config or DEFAULT_CONFIG)
