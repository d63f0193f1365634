"""Real engines of one XDCR group (seed 001): each its own --cluster-id, all in each other's directory.

``XdcrGroup`` starts the engines on free loopback ports, publishes ``//sys/clusters`` with the
peer credentials, and sets ``//sys/@xdcr_connections`` the way an operator does (docs/xdcr.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from tests.harness import EngineProcess

SCHEMA = [{"name": "id", "type": "int64", "sort_order": "ascending"}, {"name": "name", "type": "string"},
          {"name": "password", "type": "string"}]


@dataclass
class XdcrGroup:
    base: Path
    names: tuple[str, ...] = ("a", "b")
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)

    def start(self) -> XdcrGroup:
        try:
            for i, name in enumerate(self.names, start=1):
                self.engines[name] = EngineProcess(name, self.base / name, extra_args=["--cluster-id", str(i)]).start()
            for name in self.names:
                directory = {n: {"proxy_url": e.url, "token": peer_credential(e.token, name)}
                             for n, e in self.engines.items()}
                self.client(name).set("//sys/clusters", directory)
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, name: str) -> Client:
        if name not in self.clients:
            engine = self.engines[name]
            self.clients[name] = Client(engine.url, engine.token, timeout=60)
        return self.clients[name]

    def connect(self, names: tuple[str, ...] | None = None) -> None:
        names = names or self.names
        for name in names:
            self.client(name).set("//sys/@xdcr_connections", [n for n in names if n != name])

    def table(self, path: str, schema: list[dict[str, Any]] = SCHEMA, names: tuple[str, ...] | None = None) -> str:
        for name in names or self.names:
            self.client(name).create("table", path, attributes={"dynamic": True, "schema": schema, "xdcr": True})
            self.client(name).mount_table(path)
        return path

    def rows(self, name: str, path: str) -> list[dict[str, Any]]:
        return self.client(name).select_rows(f"* from [{path}]", output_row_limit=10_000_000)

    def converged(self, path: str, names: tuple[str, ...] | None = None) -> bool:
        contents = [self.rows(n, path) for n in names or self.names]
        return all(c == contents[0] for c in contents)

    def restart(self, name: str, kill: bool = True) -> None:
        engine = self.engines[name]
        self.clients.pop(name).close()
        engine.kill() if kill else engine.stop()
        engine.start()

    def stop(self) -> None:
        for client in self.clients.values():
            client.close()
        for engine in self.engines.values():
            engine.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    group = XdcrGroup(tmp_path_factory.mktemp("xdcr2")).start()
    group.connect()
    try:
        yield group
    finally:
        group.stop()
