"""Engines, the tracker and jobs of a fault run, each in its network namespace, stopped by pid.

Why it exists: a fault run starts real processes in the namespaces of :mod:`.net` and must stop every
one of them, and delete every namespace, however it ends - a failed check, an exception, Ctrl-C,
SIGTERM from CI. :class:`ChaosRun` owns all of it: ``close()`` (also from ``atexit`` and from the
signal handlers :func:`exit_on_signals` installs) stops the processes it started, by pid, then
removes the network.

* :class:`NetnsEngine` is the tests' :class:`~reptables.testing.engines.EngineProcess` started as
  ``ip netns exec <ns> python -m reptables.testing.chaos.clock --clock-file F serve --host <addr>``:
  in its namespace, listening on its own address, with a wall clock the nemesis can skew
  (:mod:`.clock` says why not libfaketime). ``ip netns exec`` execs the engine in place, so the pid
  the runner holds is the engine's, and its own session makes its process group the engine alone.
* :class:`ChaosEngines` is the tests' :class:`~reptables.testing.engines.EngineSet` (directory
  with peer credentials, replicated tables, XDCR groups) made of such engines.
* :class:`ChaosProcess` is any other process of the run (the tracker, a Spark job): own session,
  log file, SIGTERM then SIGKILL by pid; :class:`TrackerProcess` runs :mod:`.tracker`.
* :class:`RunDatabase` is the run's PostgreSQL server (``storage="postgresql"``): the tests' throwaway
  server (:mod:`reptables.testing.postgres`), listening also on the run's host address, with a
  database per engine (``engine serve --storage``). Every engine then reaches its database over the
  run's network, so a partition can cut an engine from its database alone (:meth:`Network.drop`
  with the server's port), and the server itself can crash.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from reptables.testing.engines import EngineProcess, EngineSet
from reptables.testing.postgres import PostgresServer

from .clock import ClockFile
from .net import Network, Node

__all__ = ["ENGINE_PORT", "STORAGES", "ChaosEngines", "ChaosProcess", "ChaosRun", "NetnsEngine", "RunDatabase",
           "TrackerProcess", "exit_on_signals"]

#: every engine listens on this port of its own address (each namespace has all ports to itself)
ENGINE_PORT = 8000
#: what the engines of a run keep their data in
STORAGES = ("sqlite", "postgresql")


class RunDatabase:
    """The run's PostgreSQL server, reachable from the run's namespaces at the host address."""

    def __init__(self, base: Path, network: Network) -> None:
        address = network.host_address
        self.base = base
        # in a directory of its own under /tmp (the run's directory is its user's alone: 0700, while the
        # server runs as the postgres user); its log is copied into the run's directory at the end.
        # (appended after the server's own listen_addresses line: the last one counts)
        self.server = PostgresServer(None, settings={"listen_addresses": f"127.0.0.1,{address}"}).start()
        subnet = address.rsplit(".", 1)[0] + ".0/24"
        with open(self.server.datadir / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write(f"host all all {subnet} trust\n")
        self.reload()
        self.address = address

    @property
    def port(self) -> int:
        return self.server.port

    def reload(self) -> None:
        pid = self.server.pid
        if pid is not None:
            os.kill(pid, signal.SIGHUP)  # the postmaster re-reads pg_hba.conf

    def url(self, engine: str) -> str:
        """A new database for ``engine``, as the engine (in its namespace) reaches it."""
        return self.server.create_database(f"chaos_{engine}").replace("@127.0.0.1:", f"@{self.address}:")

    # a crash of the server: immediate shutdown (no checkpoint), started again on heal
    def kill(self) -> None:
        self.server.shut_down("immediate")

    def alive(self) -> bool:
        return self.server.running

    def restart(self) -> None:
        self.server.start_again()

    def stop(self) -> None:
        self.server.shut_down("fast")
        with contextlib.suppress(OSError):
            shutil.copyfile(self.server.logfile, self.base / "postgresql.log")
        self.server.stop()


@dataclass
class NetnsEngine(EngineProcess):
    """An engine in a network namespace, on its own address, with a skewable wall clock."""

    node: Node | None = None
    clock: ClockFile | None = None

    def __post_init__(self) -> None:
        """Nothing: the run chooses the storage (``ChaosRun(storage=...)``), never the test suite's
        backend, whose server listens on loopback, where an engine in a namespace cannot reach it."""

    @property
    def url(self) -> str:
        assert self.node is not None
        return f"http://{self.node.address}:{self.port}"

    def spawn(self) -> NetnsEngine:
        assert self.node is not None and self.clock is not None
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        if self.token is not None:
            env["REPTABLES_TOKEN"] = self.token
        if not self.clock.path.exists():
            self.clock.set(0.0)
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.proc = subprocess.Popen(
                [*self.node.exec_argv(), sys.executable, "-m", "reptables.testing.chaos.clock",
                 "--clock-file", str(self.clock.path), "serve", "--cluster-name", self.cluster_name,
                 "--data-dir", str(self.data_dir), "--host", self.node.address, "--port", str(self.port),
                 "--log-level", self.log_level, *self.extra_args],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        return self

    def pause(self) -> None:
        """SIGSTOP the engine's process group (it keeps its sockets and answers nothing)."""
        if self.alive():
            os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGCONT)

    def stop(self, timeout: float = 15.0) -> None:
        self.resume()  # a paused engine cannot act on SIGTERM
        super().stop(timeout)


@dataclass
class ChaosEngines(EngineSet):
    """An :class:`EngineSet` whose engines each live in a namespace of ``network``."""

    network: Network | None = None
    #: engines' wall-clock offsets, by engine name
    clocks: dict[str, ClockFile] = field(default_factory=dict)
    client_timeout: float = 10.0
    #: the run's PostgreSQL server (None: SQLite in each engine's data directory)
    database: RunDatabase | None = None

    def _engine(self, name: str, index: int, env: Mapping[str, str] | None, extra_args: Sequence[str] | None,
                own_tokens: bool) -> EngineProcess:
        assert self.network is not None
        node = self.network.nodes.get(name) or self.network.add(name)
        clock = self.clocks.setdefault(name, ClockFile(self.base / f"{name}.clock"))
        cluster_id = ["--cluster-id", str(index)] if self.cluster_ids else []
        storage = ["--storage", self.database.url(name)] if self.database is not None else []
        return NetnsEngine(name, self.base / name, port=ENGINE_PORT, token=f"token-{name}-0123456789abcdef",
                           env=dict(env or {}), log_level=self.log_level,
                           extra_args=[*cluster_id, *storage, *(extra_args or [])], node=node, clock=clock)

    def engine(self, name: str) -> NetnsEngine:
        engine = self.engines[name]
        assert isinstance(engine, NetnsEngine)
        return engine


@dataclass
class ChaosProcess:
    """A process of the run other than an engine: its own session and log, stopped by pid."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ChaosProcess:
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.env}, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)


@dataclass
class TrackerProcess(ChaosProcess):
    """The operator's tracker loop (:mod:`.tracker`) in namespace ``op``; its switches on stdout."""

    def switches(self) -> list[dict[str, Any]]:
        """Every mode switch it has made so far (the JSON lines of its log)."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        event = json.loads(line)
                        if event.get("event") == "switch":
                            out.append(event)
        return out

    @classmethod
    def make(cls, node: Node, base: Path, engines: ChaosEngines, tables: list[dict[str, Any]],
             period: float = 1.0) -> TrackerProcess:
        clusters = {name: {"endpoint": e.url, "token": e.read_token()} for name, e in engines.engines.items()}
        config = {"period": period, "tables": tables, "clusters": clusters}
        path = base / "tracker.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        return cls("tracker", [*node.exec_argv(), sys.executable, "-m", "reptables.testing.chaos.tracker",
                               "--config", str(path)], base / "tracker.log")


class ChaosRun:
    """Everything one run starts: its network, engine sets and other processes; :meth:`close` ends all."""

    def __init__(self, base: Path, storage: str = "sqlite") -> None:
        if storage not in STORAGES:
            raise ValueError(f"unknown storage {storage!r}: {', '.join(STORAGES)}")
        self.base = base
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.network = Network.create()
        self.database: RunDatabase | None = None
        if storage == "postgresql":
            try:
                self.database = RunDatabase(base, self.network)
            except BaseException:
                self.network.close()
                raise
        self.engine_sets: list[ChaosEngines] = []
        self.processes: list[ChaosProcess] = []
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)

    def engines(self, names: Sequence[str], cluster_ids: bool = False, extra_args: Sequence[str] = (),
                clocks: Mapping[str, float] | None = None) -> ChaosEngines:
        """Start engines ``names`` (each in a new namespace, its wall clock at ``clocks[name]`` seconds
        from true time from the start) and publish their directory."""
        engines = ChaosEngines(self.base, names=tuple(names), cluster_ids=cluster_ids, network=self.network,
                               database=self.database)
        for name, offset in (clocks or {}).items():
            engines.clocks[name] = ClockFile(self.base / f"{name}.clock")
            engines.clocks[name].set(offset)
        self.engine_sets.append(engines)
        engines.start(extra_args=list(extra_args))
        return engines

    def node(self, name: str) -> Node:
        return self.network.nodes.get(name) or self.network.add(name)

    def process(self, process: ChaosProcess) -> ChaosProcess:
        """Start ``process`` and stop it with the run."""
        with self._lock:
            self.processes.append(process)
        return process.start()

    def close(self) -> list[str]:
        """Stop every process (by pid) and every engine, heal and delete the network; what went wrong."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
        atexit.unregister(self.close)
        problems: list[str] = []
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest whatever one does
                problems.append(f"{process.name}: {exc}")
        for engines in self.engine_sets:
            try:
                engines.stop()
            except Exception as exc:  # noqa: BLE001
                problems.append(str(exc))
        if self.database is not None:
            try:
                self.database.stop()
            except Exception as exc:  # noqa: BLE001
                problems.append(f"postgresql: {exc}")
        problems += self.network.close()
        return problems

    def __enter__(self) -> ChaosRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit`` in the main thread (as Ctrl-C raises
    ``KeyboardInterrupt``), so every ``finally`` of a run - and :meth:`ChaosRun.close` - runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
