"""Real engines of one XDCR group (seed 001): each its own --cluster-id, all in each other's directory.

``XdcrGroup`` is the harness of ``reptables.testing`` (``EngineSet``) with an XDCR group's defaults:
members ``a`` and ``b``, each its own ``--cluster-id`` (1, 2, ...), ``//sys/clusters`` published with
the peer credentials; ``connect`` sets ``//sys/@xdcr_connections`` the way an operator does
(docs/xdcr.md). What is here besides: the module's ``pair``, a group whose change logs are trimmed,
and writers on every member.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import LockConflict, YtError
from reptables.testing import USERS_SCHEMA, EngineSet, wait_for

ALL = ("a", "b", "c")
SCHEMA = USERS_SCHEMA


@dataclass
class XdcrGroup(EngineSet):
    """An :class:`EngineSet` as an XDCR group: ``a`` and ``b`` unless named, each its own cluster id."""

    names: tuple[str, ...] = ("a", "b")
    cluster_ids: bool = True
    client_timeout: float = 60.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    group = XdcrGroup(tmp_path_factory.mktemp("xdcr2")).start()
    group.connect()
    try:
        yield group
    finally:
        group.stop()


def trimmed_group(trio: XdcrGroup, path: str) -> None:
    """``path`` on a, b and c; a and b connected, written on both, converged and their logs trimmed."""
    trio.connect(("a", "b"))
    for name in ALL:
        trio.client(name).create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True,
                                                            "change_retention": 1})
        trio.client(name).mount_table(path)
    # each cluster's own clock: commit timestamps are (second, counter) per cluster, so within one
    # second a's timestamp can be later than every commit b makes (a made more timestamps)
    starts = {name: trio.client(name).generate_timestamp() for name in ("a", "b")}
    a, b = trio.client("a"), trio.client("b")
    a.insert_rows(path, [{"id": i, "name": f"a{i}", "password": "pa"} for i in range(300)])
    # (a's rows may be applied on b meanwhile: a lock conflict, 1700, retried as a client does)
    wait_for(lambda: b.insert_rows(path, [{"id": i, "name": f"b{i}", "password": "pb"}
                                          for i in range(200, 500)]) is None, 10, "b's rows written")
    wait_for(lambda: trio.converged(path, ("a", "b")) and len(trio.rows("a", path)) == 500, 30, "a and b converged")
    a.delete_rows(path, [{"id": i} for i in range(0, 40)])
    b.delete_rows(path, [{"id": i} for i in range(460, 500)])
    wait_for(lambda: trio.converged(path, ("a", "b")) and len(trio.rows("a", path)) == 420, 30,
             "the deletes on both")
    for name in ("a", "b"):
        try:
            wait_for(lambda n=name: _trimmed(trio.client(n), path, starts[n]), 30,
                     f"the change log of {name} trimmed")
        except AssertionError as exc:
            # what held the log: the peers' positions (dr_status) and the engine's own complaints
            log = trio.engines[name].log_path.read_text(errors="replace").splitlines()
            problems = [line for line in log if '"level": "error"' in line or "Traceback" in line][-20:]
            raise AssertionError(f"{exc}\ndr_status of {name}: {trio.client(name).call('dr_status', {})}\n"
                                 + "\n".join(problems)) from None


def _trimmed(client: Client, path: str, start: int) -> bool:
    try:
        client.pull_changes(path, from_timestamp=start, wait_timeout=0)
    except YtError as exc:
        return exc.code == 1760
    return False


class Writers:
    """A writer per cluster: fresh keys and updates of old ones, each its own client, until stopped."""

    def __init__(self, trio: XdcrGroup, path: str, names: tuple[str, ...]) -> None:
        self.trio, self.path = trio, path
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.writes = dict.fromkeys(names, 0)
        self.threads = [threading.Thread(target=self.run, args=(n, i), daemon=True) for i, n in enumerate(names)]

    def run(self, name: str, index: int) -> None:
        engine = self.trio.engines[name]
        with Client(engine.url, engine.token, timeout=60) as client:
            n = 0
            while not self.stop_event.is_set():
                rows = [{"id": 10_000 * (index + 1) + n, "name": f"{name}-new{n}", "password": "x"},
                        {"id": 100 + n % 300, "name": f"{name}-upd{n}", "password": "y"}]
                try:
                    client.insert_rows(self.path, rows)
                except LockConflict:
                    continue  # a peer's change to the key was applied meanwhile (1700): retried, as a client does
                except YtError as exc:
                    self.errors.append(exc)
                    return
                n += 1
                self.writes[name] = n
                time.sleep(0.01)

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, self.errors
