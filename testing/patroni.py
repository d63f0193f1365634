"""A highly available PostgreSQL for tests: Patroni over a one-member etcd, a primary and a synchronous standby.

Why it exists: an engine on PostgreSQL storage must live through its database's failover - the
primary lost, a standby promoted - without a restart, without losing an acknowledged write and
without applying a failed one (docs/ha-postgres.md). That needs a real failover under it, made the
way users make one: Patroni (Debian's ``patroni`` package) managing two PostgreSQL 15 servers, with
etcd (Debian's ``etcd-server``) as its consensus store. :class:`PatroniCluster` starts one on free
loopback ports in a directory of its own, gives engines a URL that always reaches the current
primary, kills the primary on demand and waits for the new one.

The settings that make an acknowledged commit survive the primary's loss (Patroni's dynamic
configuration, ``bootstrap.dcs``):

* ``synchronous_mode: true``: Patroni names the standby in ``synchronous_standby_names``, so a
  ``COMMIT`` (``synchronous_commit = on``, PostgreSQL's default) is answered only once the standby
  has flushed its WAL; and Patroni promotes only a standby that was synchronous, so the new primary
  holds every commit the old one acknowledged;
* ``synchronous_mode_strict: true``: with no standby connected the primary does not fall back to
  committing alone (``synchronous_standby_names = '*'``: commits wait). Without it, a primary left
  alone acknowledges commits that exist on one server only, and losing that server loses them. The
  price, with two members: after a failover, writes wait until the old primary has rejoined as the
  new standby;
* ``primary_start_timeout: 0``: a crashed primary is failed over at once rather than restarted in
  place (the default waits 300 s for it to come back);
* ``use_pg_rewind`` (with ``wal_log_hints``): the old primary may hold WAL the standby never got (a
  commit in flight, never acknowledged); pg_rewind discards it so that it can follow the new primary.
  ``ttl``/``loop_wait``/``retry_timeout`` are short (10/1/3 s) so that a test's failover takes seconds.

How engines reach the primary: a libpq multi-host URL with ``target_session_attrs=read-write``
(:meth:`PatroniCluster.url`): each new connection tries the members in turn and keeps the one that
accepts writes; while there is none, connecting fails and the engine answers 105 (retriable). It is
written in SQLAlchemy's form, hosts as query parameters
(``postgresql://user@/db?host=127.0.0.1:P1&host=127.0.0.1:P2&target_session_attrs=read-write``):
SQLAlchemy's ``make_url`` cannot parse libpq's comma form (``user@h1:p1,h2:p2/db``: it takes
``p1,h2:p2`` for a port and raises ``ValueError``), while the query form is what SQLAlchemy's
psycopg dialect turns into libpq's ``host=h1,h2 port=p1,p2``.

What is tricky:

* everything runs in process groups of its own and is stopped by pid, never by name. When root,
  Patroni runs as the ``postgres`` OS user under ``runuser`` (PostgreSQL refuses root; Patroni starts
  PostgreSQL as itself);
* Patroni starts each postmaster in a session of its own (it outlives Patroni by design): stopping
  a member is SIGKILL to Patroni's process group, then SIGQUIT (an immediate shutdown) to the
  postmaster at the pid of its ``postmaster.pid``, checked to be a process of that data directory
  (and SIGKILL to it and its children if it does not end);
* a primary whose postmaster was SIGKILLed leaves orphan backends that exit on their own once
  they notice; Patroni then rewinds that member and starts it as the standby of the new primary;
* :meth:`PatroniCluster.stop` (a ``with`` block, the fixture, ``atexit``) removes every directory,
  also when starting failed.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from reptables.engine.process import free_port

from .postgres import DB_USER, OS_USER, PG_MAJOR, PostgresUnavailable, find_bindir
from .waits import wait_for

__all__ = ["PatroniCluster", "PatroniMember", "PatroniUnavailable"]

START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0
#: Patroni's timing (seconds): the leader key's TTL, the HA loop's period, the retry budget of a DCS
#: or PostgreSQL call (Patroni wants loop_wait + 2 * retry_timeout <= ttl)
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3


class PatroniUnavailable(PostgresUnavailable):
    """Patroni or etcd cannot be started here (binaries missing, or they failed), with the reason."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PatroniUnavailable(f"{name} not found: `apt-get install patroni etcd-server etcd-client` "
                                 "(hack/bootstrap.sh does)")
    return path


def _http_get(port: int, path: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
    """GET ``http://127.0.0.1:port/path``: the status and the JSON body (a 5xx is an answer, not an error)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as answer:
        body = answer.read()
        return answer.code, json.loads(body) if body.startswith(b"{") else {}


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc: relations of pids, never names)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ')'
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads (Patroni, under ``runuser`` when root, and what Patroni
    runs: pg_basebackup, pg_rewind; never a postmaster, which Patroni starts in a session of its own).

    Under ``runuser``, Patroni is SIGKILLed first and ``runuser`` left to reap it (killed together,
    Patroni would be left a zombie for init to reap); ``proc`` is waited for without being reaped
    until the group is killed, so that its pid, the group's id, cannot have been reused meanwhile."""
    if proc.poll() is None and proc.args[0] == "runuser":  # type: ignore[index]
        for child in _children(proc.pid):
            _kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) \
                is None:
            time.sleep(0.02)
    if proc.returncode is None:  # not reaped: the group's id is still ours
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _wait_gone(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


@dataclass
class PatroniMember:
    """One Patroni-managed PostgreSQL server: its name, ports, directory and Patroni process."""

    name: str
    dir: Path
    pg_port: int
    api_port: int
    #: the process started: ``runuser`` when root (Patroni is its child), else Patroni; its own group
    proc: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.dir / "data"

    @property
    def address(self) -> str:
        """``host:port`` of its PostgreSQL server."""
        return f"127.0.0.1:{self.pg_port}"

    @property
    def logfile(self) -> Path:
        """Patroni's log, with its PostgreSQL server's (the server writes to Patroni's stderr)."""
        return self.dir / "patroni.log"

    def status(self, path: str = "/patroni") -> tuple[int, dict[str, Any]] | None:
        """Patroni's REST answer to ``GET path`` (``/patroni``, ``/primary``, ``/sync``, ...), None if
        it does not answer."""
        try:
            return _http_get(self.api_port, path)
        except (OSError, ValueError, http.client.HTTPException):  # down, restarting, or cut off mid-answer
            return None

    def primary_status(self) -> dict[str, Any] | None:
        """Patroni's status of its server if it is the primary: it holds the leader key (``/primary``
        answers 200) and its server runs out of recovery. Right after a kill Patroni still holds the
        key for up to a loop, and a standby takes the key before its promotion ends: both are not
        primaries yet. None otherwise."""
        answer = self.status("/primary")
        if answer is None or answer[0] != 200:
            return None
        body = answer[1]
        return body if body.get("state") == "running" and body.get("role") in ("master", "primary") else None

    def is_primary(self) -> bool:
        return self.primary_status() is not None

    @property
    def postmaster_pid(self) -> int | None:
        """Its postmaster's pid from ``postmaster.pid``, if that process is alive and serves this data
        directory (a stale file's pid may belong to another process by now)."""
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if str(self.datadir).encode() in cmdline else None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@dataclass
class PatroniCluster:
    """etcd and ``members`` Patroni-managed PostgreSQL servers, a primary and a synchronous standby
    (see the module docstring). Use it as a context manager, or :meth:`start` and :meth:`stop`."""

    members_count: int = 2
    base: Path | None = None
    #: PostgreSQL parameters added to the cluster's (Patroni's dynamic configuration)
    settings: dict[str, str] = field(default_factory=dict)
    scope: str = "reptables"
    members: list[PatroniMember] = field(default_factory=list)
    #: the etcd process, its own process group
    etcd: subprocess.Popen[bytes] | None = None
    dir: Path = field(init=False)
    sockdir: Path = field(init=False)
    etcd_port: int = 0
    _databases: int = 0

    def __post_init__(self) -> None:
        self.bindir = find_bindir()
        self.patroni_bin = _binary("patroni")
        self.etcd_bin = _binary("etcd")
        self.account = self._account()
        self.dir = Path(tempfile.mkdtemp(prefix="reptables-patroni-", dir=str(self.base) if self.base else None))
        # a short socket directory (unix socket paths are limited to ~100 bytes), shared by the members
        self.sockdir = Path(tempfile.mkdtemp(prefix="pts-", dir="/tmp"))

    @staticmethod
    def _account() -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(OS_USER)
        except KeyError:
            raise PatroniUnavailable(f"running as root, and there is no '{OS_USER}' OS user to run Patroni and "
                                     f"PostgreSQL as: `apt-get install postgresql-{PG_MAJOR}` creates it") from None

    def _own(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> Self:
        """etcd, then every member at once (the first to take etcd's initialize key runs initdb, the
        others clone it); returns once there is a primary and a streaming synchronous standby."""
        atexit.register(self.stop)
        try:
            for path in (self.dir, self.sockdir):
                self._own(path)
            self._start_etcd()
            for index in range(self.members_count):
                self.members.append(self._start_member(f"pg{index}"))
            self.wait_healthy(START_TIMEOUT)
        except BaseException as exc:
            logs = "\n".join(f"--- {m.name} ({m.logfile}):\n{m.log_tail()}" for m in self.members)
            self.stop()
            if isinstance(exc, (AssertionError, PatroniUnavailable)):  # say what the members logged
                raise PatroniUnavailable(f"the Patroni cluster did not come up: {exc}\n{logs}") from exc
            raise
        return self

    def _start_etcd(self) -> None:
        data = self.dir / "etcd"
        for attempt in range(3):  # a port free a moment ago may be taken by now: fresh ports
            self.etcd_port, peer = free_port(), free_port()
            client, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer}"
            shutil.rmtree(data, ignore_errors=True)
            with open(self.dir / "etcd.log", "ab") as log:
                self.etcd = subprocess.Popen(
                    [self.etcd_bin, "--name", "etcd0", "--data-dir", str(data), "--listen-client-urls", client,
                     "--advertise-client-urls", client, "--listen-peer-urls", peer_url,
                     "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"etcd0={peer_url}",
                     "--initial-cluster-state", "new", "--initial-cluster-token", self.dir.name,
                     "--logger", "zap", "--log-level", "warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                wait_for(self._etcd_healthy, 30, "etcd healthy",
                         retry_on=(OSError, ValueError, http.client.HTTPException))
                return
            except AssertionError:
                self._stop_etcd()
                if attempt == 2:
                    raise PatroniUnavailable("etcd did not start; its log ends with:\n"
                                             + (self.dir / "etcd.log").read_text(errors="replace")[-2000:]) from None

    def _etcd_healthy(self) -> bool:
        if self.etcd is None or self.etcd.poll() is not None:
            raise AssertionError("etcd exited")
        return _http_get(self.etcd_port, "/health")[1].get("health") == "true"

    def _config(self, member: PatroniMember) -> dict[str, Any]:
        parameters = {"max_connections": "200", "wal_log_hints": "on", "synchronous_commit": "on",
                      "max_wal_senders": "10", "max_replication_slots": "10", **self.settings}
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
        return {
            "scope": self.scope,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{member.api_port}", "connect_address": f"127.0.0.1:{member.api_port}"},
            "etcd3": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True, "synchronous_mode_strict": True,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": parameters},
                },
                "initdb": [{"encoding": "UTF8"}, "no-locale", "no-sync"],
            },
            "postgresql": {
                "listen": member.address, "connect_address": member.address,
                "data_dir": str(member.datadir), "bin_dir": str(self.bindir),
                "pgpass": str(member.dir / "pgpass"),
                "authentication": {"superuser": {"username": DB_USER}, "replication": {"username": DB_USER}},
                "parameters": {"unix_socket_directories": str(self.sockdir)},
                "pg_hba": hba,
                "basebackup": [{"checkpoint": "fast"}, "no-sync"],
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def _start_member(self, name: str) -> PatroniMember:
        member_dir = self.dir / name
        member_dir.mkdir()
        member = PatroniMember(name, member_dir, free_port(), free_port())
        config = member_dir / "patroni.yml"
        config.write_text(json.dumps(self._config(member), indent=1))  # JSON is YAML
        for path in (member_dir, config):
            self._own(path)
        argv = [self.patroni_bin, str(config)]
        if self.account is not None:
            argv = ["runuser", "-u", self.account.pw_name, "--", *argv]
        log = open(member.logfile, "ab")  # noqa: SIM115 - handed to the process
        try:
            member.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True, cwd=member_dir)
        finally:
            log.close()
        return member

    def stop(self) -> None:
        """Stop every member, then etcd, by pid; then remove every directory. Stopping again does nothing.

        The cluster's data is thrown away, so nothing is stopped gracefully (a graceful stop of two
        Patroni members takes seconds: a standby waits for the primary to release it, a primary for
        its replicas to have the shutdown checkpoint): each Patroni is SIGKILLed first, so that it
        neither promotes nor restarts anything, then each server gets an immediate shutdown (SIGQUIT
        to its postmaster), and a server that does not end in time is SIGKILLed with its children."""
        atexit.unregister(self.stop)
        errors: list[str] = []
        for member in self.members:
            proc, member.proc = member.proc, None
            if proc is not None:
                _kill_group(proc)
        for member in self.members:
            try:
                self._stop_server(member)
            except Exception as exc:  # noqa: BLE001 - stop the others, then say which did not stop
                errors.append(f"{member.name}: {exc}")
        self.members.clear()
        self._stop_etcd()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sockdir, ignore_errors=True)
        if errors:
            raise PatroniUnavailable(f"could not stop every member: {'; '.join(errors)}")

    @staticmethod
    def _stop_server(member: PatroniMember) -> None:
        postmaster = member.postmaster_pid
        if postmaster is None:
            return
        _kill(postmaster, signal.SIGQUIT)  # immediate shutdown: the postmaster ends its children
        try:
            wait_for(lambda: member.postmaster_pid is None, STOP_TIMEOUT, f"{member.name}'s server stopped",
                     interval=0.02, retry_on=())
        except AssertionError:
            for child in _children(postmaster):
                _kill(child, signal.SIGKILL)
            _kill(postmaster, signal.SIGKILL)
            wait_for(lambda: member.postmaster_pid is None, 10, f"{member.name}'s postmaster gone", retry_on=())

    def _stop_etcd(self) -> None:
        proc, self.etcd = self.etcd, None
        if proc is None:
            return
        _kill(proc.pid, signal.SIGTERM)
        if not _wait_gone(proc, STOP_TIMEOUT):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- roles --------------------------------------------------------------------------------------

    def primary(self) -> PatroniMember | None:
        """The member whose server is the primary now, or None (between a primary's loss and a
        standby's promotion)."""
        return next((m for m in self.members if m.is_primary()), None)

    def sync_standby(self) -> PatroniMember | None:
        """The synchronous standby, or None (a commit on the primary waits until there is one). Both
        sides must say so: the primary sees it streaming as synchronous (``pg_stat_replication``), and
        Patroni has recorded it as the synchronous standby in etcd, without which Patroni does not fail
        over to it (right after the start, or a rejoin, the primary's ``synchronous_standby_names = '*'``
        makes any standby synchronous before Patroni has named one)."""
        primary = next((status for status in map(PatroniMember.primary_status, self.members) if status), None)
        if primary is None:
            return None
        streaming = {r.get("application_name") for r in primary.get("replication", [])
                     if r.get("state") == "streaming" and r.get("sync_state") in ("sync", "quorum")}
        for member in self.members:
            answer = member.status("/patroni") if member.name in streaming else None
            if answer is not None and answer[1].get("sync_standby") is True and answer[1].get("role") == "replica":
                return member
        return None

    @property
    def primary_address(self) -> str:
        """``host:port`` of the current primary (raises if there is none right now)."""
        primary = self.primary()
        if primary is None:
            raise PatroniUnavailable("the Patroni cluster has no primary right now")
        return primary.address

    def wait_for_primary(self, timeout: float = 60.0, other_than: PatroniMember | None = None) -> PatroniMember:
        """Until a member is the primary (one other than ``other_than``: a new primary after a failover)."""
        def new_primary() -> PatroniMember | None:
            primary = self.primary()
            return primary if primary is not None and primary is not other_than else None

        return wait_for(new_primary, timeout, "a new primary" if other_than else "a primary", retry_on=())

    def wait_healthy(self, timeout: float = 60.0) -> tuple[PatroniMember, PatroniMember]:
        """Until there is a primary and a streaming synchronous standby (commits are acknowledged again)."""
        def healthy() -> tuple[PatroniMember, PatroniMember] | None:
            exited = [m.name for m in self.members if m.proc is not None and m.proc.poll() is not None]
            if exited:
                raise PatroniUnavailable(f"Patroni exited: {', '.join(exited)}")
            primary, standby = self.primary(), self.sync_standby()
            return (primary, standby) if primary is not None and standby is not None else None

        return wait_for(healthy, timeout, "a primary and a synchronous standby", interval=0.1, retry_on=())

    def kill_primary(self) -> PatroniMember:
        """SIGKILL the current primary's postmaster (by its pid): the machine's loss, as far as the
        database is concerned. Returns the member it was; Patroni fails over to the standby."""
        primary = self.primary()
        pid = primary.postmaster_pid if primary is not None else None
        if primary is None or pid is None:
            raise PatroniUnavailable("the Patroni cluster has no running primary to kill")
        os.kill(pid, signal.SIGKILL)
        return primary

    # -- databases ----------------------------------------------------------------------------------

    def url(self, database: str) -> str:
        """The engine's ``--storage`` URL of ``database``: every member, connections kept only by the
        one that accepts writes (see the module docstring for the form)."""
        hosts = "&".join(f"host={m.address}" for m in self.members)
        return f"postgresql://{DB_USER}@/{database}?{hosts}&target_session_attrs=read-write"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """``psql -At -c sql`` on the current primary: its output (raises with psql's message)."""
        host, port = self.primary_address.rsplit(":", 1)
        proc = subprocess.run(["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", DB_USER,
                               "-d", database, "-c", sql], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise PatroniUnavailable(f"psql {sql!r} on {database}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def create_database(self, name: str) -> str:
        """A new, empty database named after ``name`` (made unique): its URL (:meth:`url`)."""
        self._databases += 1
        database = "".join(ch if ch.isalnum() else "_" for ch in f"{name}_{os.getpid()}_{self._databases}".lower())
        self.wait_for_primary()
        self.psql(f'CREATE DATABASE "{database[:60]}"')
        return self.url(database[:60])
