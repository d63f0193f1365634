"""Engine processes for benchmarks: several reptables engines that know each other, on loopback.

Why this module exists: benchmarks must not import from ``tests/``, yet the replication benchmark
needs what ``tests/replication/conftest.py`` does - start a meta-cluster engine and replica
engines, publish the same ``//sys/clusters`` directory into each, and build a replicated table
with replicas the way a user would (``create table_replica`` on the meta-cluster, a replica table
with ``upstream_replica_id`` on the replica cluster, ``alter_table_replica enabled=%true``). This
module is that, with the process discipline of ``benchmarks/engine_bench.py``:

* every engine is ``python -m reptables.operator.cli engine serve`` on a free ``127.0.0.1`` port,
  in its own data directory and its **own session** (``start_new_session``: its pid is its process
  group id), with its log in ``<data dir>/engine.log``;
* it is stopped by that pid only - SIGTERM to its process group, SIGKILL after a bounded wait -
  from :meth:`EngineSet.stop`, which ``with`` blocks and ``atexit`` call;
* every wait is bounded in time and in count.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.engine.process import LocalEngine, free_port

TOKEN = "bench-token-0123456789abcdef"
START_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = POLL_INTERVAL_S) -> Any:
    """Call ``predicate()`` until it returns something truthy; bounded in time and count.

    A :class:`YtError` raised by the predicate counts as "not yet" (the last one is reported).
    """
    deadline = time.monotonic() + timeout
    last_error: YtError | None = None
    for _ in range(int(timeout / interval) + 2):
        try:
            value = predicate()
            if value:
                return value
        except YtError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (f" (last error: {last_error})" if last_error else ""))


@dataclass
class Engine(LocalEngine):
    """One engine process in its own session (process group), stopped by its pid."""

    token: str | None = TOKEN
    log_level: str = "warning"

    @property
    def name(self) -> str:
        return self.cluster_name

    def start(self, timeout: float = START_TIMEOUT_S, attempts: int = 3) -> Engine:
        """Start and wait for ``/readyz``; a start that loses the race for its port tries another."""
        for attempt in range(attempts):
            self.port = free_port()
            try:
                super().start(timeout)
                return self
            except RuntimeError as exc:
                if "address already in use" in str(exc).lower() and attempt + 1 < attempts:
                    continue
                raise
        raise AssertionError("unreachable")

    def client(self, timeout: float = 300.0) -> Client:
        """A new :class:`Client` of this engine (the caller closes it)."""
        return Client(self.url, self.token, timeout=timeout)


class EngineSet:
    """Engines named ``names`` under ``base``, each knowing all others through ``//sys/clusters``.

    The first name is the meta-cluster. Use as a ``with`` block, or call :meth:`stop`; ``atexit``
    stops whatever is still running.
    """

    def __init__(self, base: Path, names: tuple[str, ...] = ("meta", "replica_0", "replica_1"),
                 log_level: str = "warning", extra_args: dict[str, list[str]] | None = None) -> None:
        self.base = base
        self.names = names
        self.engines: dict[str, Engine] = {
            n: Engine(n, base / n, log_level=log_level, extra_args=list((extra_args or {}).get(n, [])))
            for n in names}
        self._clients: dict[str, Client] = {}
        self._stopped = False

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> EngineSet:
        atexit.register(self.stop)
        try:
            for engine in self.engines.values():
                engine.start()
            for name in self.names:
                directory = {n: {"proxy_url": e.url, "token": peer_credential(e.read_token(), name)}
                             for n, e in self.engines.items()}
                self.client(name).set("//sys/clusters", directory)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        errors: list[str] = []
        for engine in reversed(list(self.engines.values())):
            try:
                engine.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{engine.name} (pid {engine.proc.pid if engine.proc else '-'}): {exc}")
        atexit.unregister(self.stop)
        if errors:
            raise RuntimeError(f"could not stop every engine: {'; '.join(errors)}")

    def __enter__(self) -> EngineSet:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- access -------------------------------------------------------------------------------------

    @property
    def meta_name(self) -> str:
        return self.names[0]

    def client(self, name: str) -> Client:
        """The shared :class:`Client` of engine ``name`` (closed by :meth:`stop`)."""
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.engines[name].client()
        return client

    @property
    def meta(self) -> Client:
        return self.client(self.meta_name)

    def pids(self) -> dict[str, int]:
        return {n: e.pid for n, e in self.engines.items()}

    # -- replicated tables --------------------------------------------------------------------------

    def replicated_table(self, path: str, schema: list[dict[str, Any]],
                         attributes: dict[str, Any] | None = None) -> str:
        self.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": schema,
                                                               **(attributes or {})})
        self.meta.mount_table(path)
        return path

    def replica(self, table_path: str, cluster: str, replica_path: str, schema: list[dict[str, Any]],
                mode: str = "async") -> str:
        """Create a replica object and its replica table (``upstream_replica_id`` set), mount, enable."""
        replica_id = self.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": table_path, "cluster_name": cluster, "replica_path": replica_path,
            "mode": mode}})["node_id"]
        replica_client = self.client(cluster)
        replica_client.create("table", replica_path, attributes={
            "dynamic": True, "schema": schema, "upstream_replica_id": replica_id}, recursive=True)
        replica_client.mount_table(replica_path)
        self.meta.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
        return replica_id

    def in_sync_replicas(self, path: str) -> list[str]:
        ts = self.meta.generate_timestamp()
        return list(self.meta.call("get_in_sync_replicas", {"path": path, "timestamp": ts, "all_keys": True}))

    def wait_in_sync(self, path: str, replica_id: str, timeout: float = 60.0) -> None:
        """Until a sync replica accepts writes (its async -> sync catch-up is over)."""
        wait_until(lambda: replica_id in self.in_sync_replicas(path), timeout, f"replica {replica_id} in sync")
