"""Real engine processes for tests and benchmarks: one engine, and a set of engines that know each other.

Why it exists: the replication tests, the XDCR tests and the benchmarks all need several real
engines on loopback that call each other, and each had its own copy of the set-up (``ClusterSet``,
``XdcrGroup``, the benchmarks' ``EngineSet``). This is the one copy:

* :class:`EngineProcess` is a :class:`reptables.engine.process.LocalEngine` (its own process group,
  stopped by its pid, SIGKILLed by :meth:`~LocalEngine.kill` for crash tests) with what a test
  drives it with: the official ``yt`` CLI and ``yt.wrapper`` pointed at it, and our own client;
* :class:`EngineSet` starts engines named ``names`` side by side (``start_all``: their start-ups
  overlap), optionally each with its own XDCR ``--cluster-id``, and writes ``//sys/clusters`` into
  each exactly as an operator does; it then builds what the tests and benchmarks build on top:
  replicated tables with replicas (docs/replication.md, seed 002) and XDCR groups and tables
  (docs/xdcr.md, seed 001).

What is tricky:

* ``//sys/clusters`` differs per engine: the token in engine X's entry for peer Y is the peer
  credential with which *X* calls *Y* (``peer_credential(Y's token, X)``), one per ordered pair;
  a test that changes a token or restarts an engine elsewhere calls :meth:`EngineSet.publish_directory`;
* a restart keeps the engine's port and data directory, and the set's client of it: the client's
  next request reconnects (tests hold a client across a restart on purpose);
* two processes can race for a port that was free a moment ago: a start that loses the race is
  retried on fresh ports, for every engine of the set (the others were stopped by ``start_all``);
* a set is stopped by :meth:`EngineSet.stop` (``with`` blocks and ``atexit`` call it too, so a
  benchmark that dies leaves no engine behind); stopping again does nothing;
* a member may be a leader and standbys over one PostgreSQL database (``standbys``, docs/ha.md):
  its engines are all started with ``--standby``, whichever wins the lease leads (:meth:`EngineSet.leader`),
  the directories name every engine of it (``proxy_url`` a list: no Service in front of it), and the
  set's client of it is given every URL; :meth:`EngineSet.revive` starts its dead engines again as
  standbys, as their supervisor would.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.process import LocalEngine, free_port, start_all, stop_all

from . import backends
from .waits import wait_for

__all__ = ["KV_SCHEMA", "TEST_TOKEN", "USERS_SCHEMA", "EngineProcess", "EngineSet", "free_port"]

VENV_BIN = Path(sys.executable).parent
#: the API token of every engine that is not given its own
TEST_TOKEN = "test-token-0123456789"
#: the schema of the replicated tables of the tests: a key and a value
KV_SCHEMA: list[dict[str, Any]] = [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                   {"name": "v", "type": "string"}]
#: the schema of the XDCR tables of the tests (seed 001's users table)
USERS_SCHEMA: list[dict[str, Any]] = [{"name": "id", "type": "int64", "sort_order": "ascending"},
                                      {"name": "name", "type": "string"}, {"name": "password", "type": "string"}]
#: how many times a set's start is tried when an engine lost the race for its port
START_ATTEMPTS = 3


@dataclass
class EngineProcess(LocalEngine):
    """A real engine, with the official ``yt`` CLI, ``yt.wrapper`` and our :class:`Client` pointed at it."""

    token: str | None = TEST_TOKEN

    def __post_init__(self) -> None:
        # the test's storage backend (testing/backends.py): a database of the run's PostgreSQL server,
        # made once, so that a restart finds its data
        if "--storage" not in self.extra_args:
            self.extra_args = [*self.extra_args, *backends.storage_args(self.cluster_name)]

    def client(self, timeout: float = 30.0) -> Client:
        """A new :class:`Client` of this engine (the caller closes it)."""
        return Client(self.url, self.read_token(), timeout=timeout)

    def yt_env(self, config_patch: str = "{}") -> dict[str, str]:
        return {**os.environ, "YT_PROXY": self.url, "YT_TOKEN": self.read_token(), "YT_CONFIG_PATCHES": config_patch}

    def yt(self, *args: str, input: str | None = None, check: bool = True,
           config_patch: str = "{}") -> subprocess.CompletedProcess[str]:
        """Run the official ``yt`` CLI against this engine (``config_patch``: YSON, YT_CONFIG_PATCHES)."""
        result = subprocess.run([str(VENV_BIN / "yt"), *args], input=input, capture_output=True, text=True,
                                env=self.yt_env(config_patch), timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"yt {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def wrapper_client(self) -> Any:
        """A ``yt.wrapper.YtClient`` of this engine (the official Python client)."""
        import yt.wrapper as yt

        return yt.YtClient(proxy=self.url, token=self.read_token())


@dataclass
class EngineSet:
    """Engines named ``names`` under ``base``, each with every other one in its ``//sys/clusters``.

    The first name is the meta-cluster of the replicated tables (:attr:`meta`). With
    ``cluster_ids`` the i-th engine (from 1) runs with ``--cluster-id i``, as the members of an
    XDCR group must. Clients are shared, one per engine, and closed by :meth:`stop`.
    """

    base: Path
    names: tuple[str, ...] = ("primary", "remote_0", "remote_1")
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)
    #: each engine its own ``--cluster-id`` (1, 2, ... in the order of ``names``)
    cluster_ids: bool = False
    #: the API token of every engine, unless :meth:`start` gives each its own
    token: str | None = TEST_TOKEN
    log_level: str = "info"
    #: the storage of some engines, by name: a backend ("sqlite", "postgresql": a new database of the
    #: run's server) or a database URL; the others use the current backend (testing/backends.py)
    storage: Mapping[str, str] = field(default_factory=dict)
    #: the timeout of the shared clients
    client_timeout: float = 30.0
    start_timeout: float = 30.0
    #: members served by a leader and standbys, by name: how many standby engines beside the first.
    #: Their engines share one PostgreSQL database (``storage``'s URL, else a new one of the run's server)
    standbys: Mapping[str, int] = field(default_factory=dict)
    #: ``--leader-lease`` of the engines of those members (None: the engine's default)
    leader_lease: float | None = None
    #: the other engines of each member that has standbys (``engines[name]`` is its first)
    standby_engines: dict[str, list[EngineProcess]] = field(default_factory=dict)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, env: Mapping[str, str] | None = None, extra_args: Sequence[str] | None = None,
              own_tokens: bool = False) -> Self:
        """Start every engine side by side and publish the directory; what started is stopped again
        if anything fails.

        ``env``: added to each engine's environment; ``extra_args``: for each ``serve`` (after
        ``--cluster-id``); ``own_tokens``: each engine its own API token, as clusters that must not
        be able to mint each other's peer credentials.
        """
        atexit.register(self.stop)
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                for index, name in enumerate(self.names, start=1):  # fresh ports on every attempt
                    self.engines[name] = self._engine(name, index, env, extra_args, own_tokens)
                try:
                    start_all([e for n, e in self.engines.items() if n not in self.standbys], self.start_timeout)
                    self._start_groups()
                    break
                except RuntimeError as exc:
                    if attempt == START_ATTEMPTS or "address already in use" not in str(exc).lower():
                        raise
                    self._stop_engines()
            self.publish_directory()
        except BaseException:
            self.stop()
            raise
        return self

    def _engine(self, name: str, index: int, env: Mapping[str, str] | None, extra_args: Sequence[str] | None,
                own_tokens: bool) -> EngineProcess:
        cluster_id = ["--cluster-id", str(index)] if self.cluster_ids else []
        token = f"token-{name}-0123456789abcdef" if own_tokens else self.token
        storage = self.storage.get(name, backends.current())
        args = [*cluster_id, *(extra_args or [])]
        if name in self.standbys:
            if not storage.startswith("postgresql://"):
                storage = backends.run_server().create_database(f"{name}_group")
            lease = ["--leader-lease", str(self.leader_lease)] if self.leader_lease is not None else []
            group = []
            for i in range(self.standbys[name] + 1):
                engine = EngineProcess(name, self.base / (name if i == 0 else f"{name}-standby{i}"), token=token,
                                       env=dict(env or {}), log_level=self.log_level)
                engine.extra_args = [*args, "--storage", storage, "--standby", "--advertise-url", engine.url, *lease]
                group.append(engine)
            self.standby_engines[name] = group[1:]
            return group[0]
        if storage.startswith("postgresql://"):
            args += ["--storage", storage]
            storage = backends.current()
        with backends.using(storage):
            return EngineProcess(name, self.base / name, token=token, env=dict(env or {}), log_level=self.log_level,
                                 extra_args=args)

    def _start_groups(self) -> None:
        """Start the engines of the members with standbys side by side, and wait until each group leads."""
        group = [e for name in self.standbys for e in self.group(name)]
        for engine in group:
            engine.spawn()
        for engine in group:
            engine.wait_up(self.start_timeout)
        for name in self.standbys:
            self.leader(name, self.start_timeout)

    def group(self, name: str) -> list[EngineProcess]:
        """The engines of member ``name``: one, or its leader and standbys (in the order started)."""
        return [self.engines[name], *self.standby_engines.get(name, [])]

    def urls(self, name: str) -> str | list[str]:
        """How the directories name member ``name``: its engine's URL, or the list of its engines' URLs."""
        engines = self.group(name)
        return engines[0].url if len(engines) == 1 else [e.url for e in engines]

    def leader(self, name: str, timeout: float = 30.0) -> EngineProcess:
        """The engine of member ``name`` that serves (``/readyz`` 200), waited for."""
        return wait_for(lambda: next((e for e in self.group(name) if e.alive() and _ready(e)), None), timeout,
                        f"a leader of {name}")

    def revive(self, name: str) -> list[EngineProcess]:
        """Start every engine of member ``name`` that is not running again, as a standby (as a supervisor
        restarts an engine that was killed or that stepped down): the engines started, up."""
        dead = [e for e in self.group(name) if not e.alive()]
        for engine in dead:
            engine.spawn()
        for engine in dead:
            engine.wait_up(self.start_timeout)
        return dead

    def publish_directory(self) -> None:
        """Write ``//sys/clusters`` into every engine: every engine's URL (every engine of a member with
        standbys), with the credential with which *this* engine calls it (one per ordered pair)."""
        for name in self.engines:
            directory = {n: {"proxy_url": self.urls(n), "token": peer_credential(e.read_token(), name)}
                         for n, e in self.engines.items()}
            self.client(name).set("//sys/clusters", directory)

    def restart(self, name: str, kill: bool = True) -> None:
        """SIGKILL (or, with ``kill=False``, stop) engine ``name`` and start it again: the same port,
        data directory and shared client."""
        engine = self.engines[name]
        if kill:
            engine.kill()
        else:
            engine.stop()
        engine.start(self.start_timeout)

    def stop(self) -> None:
        """Close the shared clients and stop every engine by its pid (SIGTERM, SIGKILL after a bounded
        wait); an engine that cannot be stopped does not keep the others running."""
        atexit.unregister(self.stop)
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        self._stop_engines()

    def _stop_engines(self) -> None:
        engines = [e for name in self.engines for e in self.group(name)]
        for engine in engines:  # a paused engine (SIGSTOP) cannot stop
            if engine.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(engine.pid, signal.SIGCONT)
        # side by side (their graceful stops overlap): stop the others whatever one
        # does, then say which did not stop
        errors = stop_all(reversed(engines))
        if errors:
            raise RuntimeError(f"could not stop every engine: {'; '.join(errors)}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- access -------------------------------------------------------------------------------------

    def client(self, name: str, timeout: float | None = None) -> Client:
        """The shared :class:`Client` of engine ``name`` (made on first use, with ``timeout`` or the
        set's ``client_timeout``)."""
        client = self.clients.get(name)
        if client is None:
            engine = self.engines[name]
            client = self.clients[name] = Client([e.url for e in self.group(name)], engine.read_token(),
                                                 timeout=self.client_timeout if timeout is None else timeout)
        return client

    @property
    def meta_name(self) -> str:
        return self.names[0]

    @property
    def meta(self) -> Client:
        """The meta-cluster's shared client."""
        return self.client(self.meta_name)

    def pids(self) -> dict[str, int]:
        return {n: e.pid for n, e in self.engines.items()}

    def rows(self, cluster: str, path: str) -> list[dict[str, Any]]:
        """Every row of table ``path`` on ``cluster``."""
        return self.client(cluster).select_rows(f"* from [{path}]", output_row_limit=10_000_000)

    # -- replicated tables (docs/replication.md) ----------------------------------------------------

    def replicated_table(self, path: str, schema: list[dict[str, Any]] = KV_SCHEMA,
                         attributes: dict[str, Any] | None = None) -> str:
        """A mounted replicated table on the meta-cluster."""
        self.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": schema,
                                                               **(attributes or {})})
        self.meta.mount_table(path)
        return path

    def replica(self, table_path: str, cluster: str, replica_path: str, mode: str = "async",
                schema: list[dict[str, Any]] = KV_SCHEMA, enable: bool = True,
                table_attributes: dict[str, Any] | None = None, **attrs: Any) -> str:
        """A replica the way a user makes one: the ``table_replica`` on the meta-cluster (``attrs``
        are more of its attributes), the replica table on ``cluster`` (with ``upstream_replica_id``
        unless ``preserve_timestamps`` is false, and ``table_attributes``), mounted; enabled (and
        waited for) with ``enable``."""
        replica_id: str = self.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": table_path, "cluster_name": cluster, "replica_path": replica_path, "mode": mode,
            **attrs}})["node_id"]
        table_attrs: dict[str, Any] = {"dynamic": True, "schema": schema, **(table_attributes or {})}
        if attrs.get("preserve_timestamps", True):
            table_attrs["upstream_replica_id"] = replica_id
        self.client(cluster).create("table", replica_path, attributes=table_attrs, recursive=True)
        self.client(cluster).mount_table(replica_path)
        if enable:
            self.alter(replica_id, enabled=True)
        return replica_id

    def alter(self, replica_id: str, wait: bool = True, **params: Any) -> None:
        """``alter_table_replica``; it returns at once, with the replica ``enabling`` or ``disabling``:
        with ``wait`` (the default) this waits, as seed 002 tells users to, for ``enabled`` or
        ``disabled`` (a sync replica is ``enabled`` once it has caught up and drains)."""
        self.meta.call("alter_table_replica", {"replica_id": replica_id, **params})
        if wait and params.get("enabled") is not None:
            self.wait_state(replica_id, "enabled" if params["enabled"] else "disabled")

    def wait_state(self, replica_id: str, state: str, timeout: float = 30.0) -> None:
        """Until the replica's ``@state`` is ``state`` (seed 002's "wait for the state")."""
        wait_for(lambda: self.meta.get(f"#{replica_id}/@state") == state, timeout,
                 f"replica {replica_id} {state}")

    def wait_in_sync(self, replica_id: str, timeout: float = 30.0) -> None:
        """Until a sync replica accepts writes (the async -> sync catch-up is over)."""
        path = self.meta.get(f"#{replica_id}/@table_path")
        wait_for(lambda: replica_id in self.in_sync(path), timeout, f"replica {replica_id} in sync")

    def in_sync(self, path: str, timestamp: int | None = None) -> list[str]:
        """``get_in_sync_replicas`` of ``path`` for all keys, at ``timestamp`` (by default a fresh one)."""
        ts = timestamp if timestamp is not None else self.meta.generate_timestamp()
        return list(self.meta.call("get_in_sync_replicas", {"path": path, "timestamp": ts, "all_keys": True}))

    # -- XDCR groups (docs/xdcr.md) -----------------------------------------------------------------

    def connect(self, names: tuple[str, ...] | None = None) -> None:
        """``//sys/@xdcr_connections`` of each of ``names`` (by default all): the others, as an operator sets it."""
        names = names or self.names
        for name in names:
            self.client(name).set("//sys/@xdcr_connections", [n for n in names if n != name])

    def table(self, path: str, schema: list[dict[str, Any]] = USERS_SCHEMA,
              names: tuple[str, ...] | None = None) -> str:
        """An XDCR table (``xdcr=%true``), mounted, on each of ``names`` (by default all)."""
        for name in names or self.names:
            self.client(name).create("table", path, attributes={"dynamic": True, "schema": schema, "xdcr": True})
            self.client(name).mount_table(path)
        return path

    def converged(self, path: str, names: tuple[str, ...] | None = None) -> bool:
        """Whether table ``path`` holds the same rows on each of ``names`` (by default all)."""
        contents = [self.rows(n, path) for n in names or self.names]
        return all(c == contents[0] for c in contents)


def _ready(engine: EngineProcess) -> bool:
    try:
        return httpx.get(f"{engine.url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
