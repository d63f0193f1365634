"""Three real engine processes that know each other: a meta-cluster and two replica clusters.

``ClusterSet`` starts the engines on free loopback ports, writes the same ``//sys/clusters``
directory into each, and offers helpers to build a replicated table with replicas the way a user
would (create replica objects on the meta-cluster, replica tables with ``upstream_replica_id`` on
the replica clusters, enable).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.engine.process import start_all
from tests.harness import EngineProcess

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]


@dataclass
class ClusterSet:
    base: Path
    names: tuple[str, ...] = ("primary", "remote_0", "remote_1")
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)

    def start(self, env: dict[str, str] | None = None, extra_args: list[str] | None = None,
              own_tokens: bool = False) -> ClusterSet:
        """Start every engine (``extra_args`` for ``serve``; ``own_tokens``: each its own API token,
        as clusters that must not be able to mint each other's peer credentials) and publish the
        directory; what started is stopped again if a later one fails."""
        try:
            for name in self.names:
                kwargs = {"token": f"token-{name}-0123456789abcdef"} if own_tokens else {}
                self.engines[name] = EngineProcess(name, self.base / name, env=dict(env or {}),
                                                   extra_args=list(extra_args or []), **kwargs)
            start_all(self.engines.values())
            self.publish_directory()
        except BaseException:
            self.stop()
            raise
        return self

    def publish_directory(self) -> None:
        for name in self.engines:
            # each engine holds the credentials with which *it* calls the others (one per ordered pair)
            directory = {n: {"proxy_url": e.url, "token": peer_credential(e.token, name)}
                         for n, e in self.engines.items()}
            self.client(name).set("//sys/clusters", directory)

    def client(self, name: str, timeout: float = 30.0) -> Client:
        engine = self.engines[name]
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = Client(engine.url, engine.token, timeout=timeout)
        return client

    @property
    def meta(self) -> Client:
        return self.client(self.names[0])

    def restart(self, name: str, kill: bool = True) -> None:
        engine = self.engines[name]
        engine.kill() if kill else engine.stop()
        engine.start()

    def stop(self) -> None:
        for client in self.clients.values():
            client.close()
        for engine in self.engines.values():
            engine.stop()

    # -- building replicated tables ----------------------------------------------------------------

    def replicated_table(self, path: str, schema: list[dict[str, Any]] = SCHEMA,
                         attributes: dict[str, Any] | None = None) -> str:
        self.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": schema,
                                                               **(attributes or {})})
        self.meta.mount_table(path)
        return path

    def replica(self, table_path: str, cluster: str, replica_path: str, mode: str = "async",
                schema: list[dict[str, Any]] = SCHEMA, enable: bool = True, **attrs: Any) -> str:
        replica_id = self.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": table_path, "cluster_name": cluster, "replica_path": replica_path, "mode": mode,
            **attrs}})["node_id"]
        table_attrs: dict[str, Any] = {"dynamic": True, "schema": schema}
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
        ts = timestamp if timestamp is not None else self.meta.generate_timestamp()
        return self.meta.call("get_in_sync_replicas", {"path": path, "timestamp": ts, "all_keys": True})

    def rows(self, cluster: str, path: str) -> list[dict[str, Any]]:
        return self.client(cluster).select_rows(f"* from [{path}]", output_row_limit=10_000_000)


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except YtError as exc:
            last_error = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" +
                         (f" (last error: {last_error})" if last_error else ""))


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[ClusterSet]:
    cs = ClusterSet(tmp_path).start()
    try:
        yield cs
    finally:
        cs.stop()
