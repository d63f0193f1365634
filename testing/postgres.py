"""A PostgreSQL server for a test run: started once, shared by every engine, stopped by its pid.

Engines backed by PostgreSQL (``engine serve --storage postgresql://...``) each own a database of
their own; a test run starts ONE server (Debian's ``postgresql-15`` binaries, which the project's
test command installs) on a free loopback port, in a directory of its own, and gives each engine a
new database on it (:meth:`PostgresServer.create_database`). The server runs as the ``postgres``
OS user when the run is root (PostgreSQL refuses to run as root), with trust authentication on
loopback and a unix socket in its own directory; it is stopped with SIGINT (a fast shutdown) to its
postmaster's pid, never by name, and its directory removed.

The durability the tests rely on is PostgreSQL's default (``fsync=on``, ``synchronous_commit=on``):
a commit the engine acknowledged is on disk. Settings that only make a throwaway server start and
run faster on a 2-core machine (small ``shared_buffers``, no ``full_page_writes`` tuning) are left
at their defaults, so what the tests see is what a user's server does.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from reptables.engine.process import free_port

PG_MAJOR = 15
OS_USER = "postgres"
#: the database user the engines connect as (the server's superuser, made by initdb)
DB_USER = "reptables"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here (binaries or the OS user missing), with the reason."""


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (``$PG_BINDIR``, else Debian's)."""
    candidates = [Path(os.environ["PG_BINDIR"])] if os.environ.get("PG_BINDIR") else []
    candidates.append(Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin"))
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        candidates.append(Path(pg_ctl).resolve().parent)
    for directory in candidates:
        if all(os.access(directory / b, os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return directory
    raise PostgresUnavailable(f"PostgreSQL {PG_MAJOR} server binaries not found in "
                              f"{', '.join(map(str, candidates))}: `apt-get install postgresql-{PG_MAJOR}` "
                              "(hack/bootstrap.sh does) or set PG_BINDIR")


class PostgresServer:
    """One PostgreSQL server in a directory of its own (see the module docstring)."""

    def __init__(self, base: Path | None = None, settings: dict[str, str] | None = None) -> None:
        """``settings``: lines added to its ``postgresql.conf`` (a test that needs a slower WAL writer, say)."""
        self.settings = dict(settings or {})
        self.bindir = find_bindir()
        self.account = self._account()
        self.dir = Path(tempfile.mkdtemp(prefix="reptables-pg-", dir=str(base) if base else None))
        self.datadir = self.dir / "data"
        # a short socket directory (unix socket paths are limited to ~100 bytes)
        self.sockdir = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
        self.logfile = self.dir / "postgres.log"
        self.port = 0
        #: the process started (``runuser`` when root, else the postmaster), its own process group
        self._proc: subprocess.Popen[bytes] | None = None
        self._databases = 0

    @staticmethod
    def _account() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(OS_USER)
        except KeyError:
            raise PostgresUnavailable(f"running as root, and there is no '{OS_USER}' OS user to run PostgreSQL as: "
                                      f"`apt-get install postgresql-{PG_MAJOR}` creates it") from None

    def _cmd(self, argv: list[str]) -> list[str]:
        return argv if self.account is None else ["runuser", "-u", self.account.pw_name, "--", *argv]

    def _run(self, argv: list[str], what: str, timeout: float = 120.0) -> None:
        proc = subprocess.run(self._cmd(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        if proc.returncode != 0:
            raise PostgresUnavailable(f"{what} failed ({proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")

    def start(self) -> PostgresServer:
        """initdb, then the server on a free loopback port; returns once it takes connections."""
        for path in (self.dir, self.sockdir):
            if self.account is not None:
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
        self._run([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", DB_USER, "--auth=trust", "-E", "UTF8",
                   "--no-locale", "--no-sync", "--no-instructions"], "initdb")
        with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"\n# testing/postgres.py\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.sockdir}'\nmax_connections = 400\n")
            conf.writelines(f"{name} = '{value}'\n" for name, value in self.settings.items())
        for attempt in range(3):
            self.port = free_port()
            if self._launch():
                return self
            text = self.logfile.read_text(errors="replace")[-2000:]
            if "could not bind" not in text or attempt == 2:
                raise PostgresUnavailable(f"PostgreSQL did not start; its log ends with:\n{text}")
        raise AssertionError("unreachable")

    def _launch(self) -> bool:
        """Start the postmaster on ``self.port``; whether it takes connections (else it is killed)."""
        log = open(self.logfile, "ab")  # noqa: SIM115 - handed to the server process
        try:
            proc = subprocess.Popen(self._cmd([str(self.bindir / "postgres"), "-D", str(self.datadir),
                                               "-p", str(self.port)]),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            log.close()
        if self._wait_ready(proc):
            self._proc = proc
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return False

    def shut_down(self, mode: str = "fast") -> None:
        """Stop the server and keep its data: ``fast`` (SIGINT: clients disconnected, a checkpoint)
        or ``immediate`` (SIGQUIT: no checkpoint, crash recovery at the next start), to its postmaster's pid."""
        signals = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals[mode])
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    @property
    def running(self) -> bool:
        """Whether the server was started (and not shut down since)."""
        return self._proc is not None

    def start_again(self) -> None:
        """Start the server shut down by :meth:`shut_down`, on the same port and data."""
        if not self._launch():
            raise PostgresUnavailable("PostgreSQL did not start again; its log ends with:\n"
                                      + self.logfile.read_text(errors="replace")[-2000:])

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                if self._psql("SELECT 1", check=False) == 0:
                    return True
            time.sleep(0.1)
        return False

    def _psql(self, sql: str, database: str = "postgres", check: bool = True) -> int:
        proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
                               "-U", DB_USER, "-d", database, "-c", sql], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise PostgresUnavailable(f"psql {sql!r} failed: {proc.stderr[-1000:]}")
        return proc.returncode

    def url(self, database: str) -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "engine") -> str:
        """A new, empty database for one engine; its URL (``postgresql://...``)."""
        self._databases += 1
        name = f"{prefix}_{os.getpid()}_{self._databases}".lower()
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (from its ``postmaster.pid``), while it runs."""
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster, by its pid), then its directories removed."""
        self.shut_down("fast")
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sockdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
