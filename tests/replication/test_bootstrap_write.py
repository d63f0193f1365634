"""A bootstrap copy fills a new replica of a table whose history was trimmed; then it joins.

The engine half of the bootstrap, over HTTP against real engines: the copy as of T is read from a
replica in sync at T and written with ``/internal/v1/bootstrap_write`` by the meta-cluster's peer
credential, in numbered chunks; the replica is created with ``start_replication_timestamp = T`` and
enabled after the copy. A writer keeps writing the whole time. The Spark job drives the same calls
(``reptables.sparkapps.bootstrap``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.credentials import peer_credential
from reptables.testing import wait_for

from .conftest import SCHEMA, ClusterSet

META, REPLICA = "primary", "remote_0"
_names = itertools.count()


@pytest.fixture(scope="module")
def cs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("bootstrap")), names=(META, REPLICA, "rogue"))
    try:
        yield clusters.start(own_tokens=True)
    finally:
        clusters.stop()


def bootstrap_write(cs: ClusterSet, replica_id: str, path: str, ts: int, chunk: int, rows: list[dict[str, Any]],
                    caller: str = META) -> httpx.Response:
    engine = cs.engines[REPLICA]
    assert engine.token
    return httpx.post(f"{engine.url}/internal/v1/bootstrap_write", timeout=30, json={
        "upstream_replica_id": replica_id, "replica_path": path, "timestamp": ts, "chunk": chunk, "rows": rows},
        headers={"Authorization": f"OAuth {peer_credential(engine.token, caller)}"})


class Writer(threading.Thread):
    """Upserts keys 0..99 over and over (and new keys from 1000 on) until stopped."""

    def __init__(self, cs: ClusterSet, path: str) -> None:
        super().__init__(daemon=True)
        self.client = cs.client(META)
        self.path = path
        self.stop_event = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop_event.is_set():
                self.client.insert_rows(self.path, [{"k": n % 100, "v": f"w{n}"}, {"k": 1000 + n, "v": f"new{n}"}],
                                        require_sync_replica=False)
                n += 1
                self.writes = n
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        assert self.error is None, self.error


def trimmed_table_with_a_writer(cs: ClusterSet) -> tuple[str, str, str, Writer]:
    """(table, its first replica's id, that replica's path, a running writer), history trimmed."""
    n = next(_names)
    path = cs.replicated_table(f"//tmp/boot_{n}", attributes={"min_replication_log_ttl": 0})
    first_path = f"//tmp/boot_first_{n}"
    first = cs.replica(path, REPLICA, first_path)
    cs.meta.insert_rows(path, [{"k": i, "v": f"old{i}"} for i in range(100)], require_sync_replica=False)
    wait_for(lambda: cs.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] >= 100, 30, "the history trimmed")
    writer = Writer(cs, path)
    writer.start()
    wait_for(lambda: writer.writes > 20, 30, "the writer running")
    return path, first, first_path, writer


def new_replica(cs: ClusterSet, path: str, start: int) -> tuple[str, str]:
    replica_path = f"//tmp/boot_new_{next(_names)}"
    return cs.replica(path, REPLICA, replica_path, enable=False, start_replication_timestamp=start), replica_path


def snapshot(cs: ClusterSet, source_path: str, ts: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = cs.client(REPLICA).select_rows(f"* from [{source_path}] order by k limit 100000",
                                                                timestamp=ts)
    return rows


def test_a_bootstrapped_replica_equals_its_source_row_for_row(cs: ClusterSet) -> None:
    path, first, first_path, writer = trimmed_table_with_a_writer(cs)
    try:
        start = cs.meta.generate_timestamp()
        replica_id, replica_path = new_replica(cs, path, start)
        # the source: a replica with every change up to T
        wait_for(lambda: first in cs.in_sync(path, start), 30, "the source replica in sync at T")
        rows = snapshot(cs, first_path, start)
        assert len(rows) >= 100
        halves = [rows[:len(rows) // 2], rows[len(rows) // 2:]]
        for chunk, part in enumerate(halves):
            answer = bootstrap_write(cs, replica_id, replica_path, start, chunk, part)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"applied": True, "rows": len(part)}
        # a retried chunk (a Spark task run twice) changes nothing
        assert bootstrap_write(cs, replica_id, replica_path, start, 0, halves[0]).json()["applied"] is False
        # the replica table counts what the copy wrote, each chunk once (the operator's rowsCopied)
        assert cs.client(REPLICA).get(f"{replica_path}/@bootstrap_progress") == {
            "chunks": 2, "rows": len(rows), "timestamp": start}
        assert "bootstrap_progress" not in cs.client(REPLICA).get(f"{first_path}/@")  # never bootstrapped
        assert cs.client(REPLICA).select_rows(f"* from [{replica_path}] order by k limit 100000",
                                              timestamp=start) == rows
        cs.alter(replica_id, enabled=True)
    finally:
        writer.finish()
    # every change after T arrives; the copy and the source agree row for row
    final = cs.meta.generate_timestamp()
    wait_for(lambda: replica_id in cs.in_sync(path, final), 60, "the new replica in sync")
    # (the source is an async replica too: it may trail the writer's last rows)
    wait_for(lambda: first in cs.in_sync(path, final), 60, "the source replica in sync")
    assert cs.rows(REPLICA, replica_path) == cs.rows(REPLICA, first_path)
    assert len(cs.rows(REPLICA, replica_path)) == 100 + writer.writes
    # the copy is older than every replicated change: a read at T shows the snapshot, a later read the changes
    assert cs.client(REPLICA).select_rows(f"* from [{replica_path}] order by k limit 100000",
                                          timestamp=start) == rows
    # once changes are delivered, the bootstrap is over
    over = bootstrap_write(cs, replica_id, replica_path, start, 7, [{"k": 5, "v": "late"}])
    assert over.status_code == 400 and "bootstrap is over" in over.json()["message"]
    assert cs.client(REPLICA).lookup_rows(replica_path, [{"k": 5}])[0]["v"] != "late"


def test_a_bootstrap_write_is_checked_like_every_peer_input(cs: ClusterSet) -> None:
    n = next(_names)
    path = cs.replicated_table(f"//tmp/boot_checked_{n}")
    start = cs.meta.generate_timestamp()
    replica_id, replica_path = new_replica(cs, path, start)
    # only the replica's meta-cluster
    forged = bootstrap_write(cs, replica_id, replica_path, start, 0, [{"k": 1, "v": "forged"}], caller="rogue")
    assert forged.status_code == 403 and forged.json()["code"] == 901
    # rows against the replica table's schema; nothing of a refused chunk is applied
    bad = bootstrap_write(cs, replica_id, replica_path, start, 0, [{"k": 1, "v": "ok"}, {"k": 2, "v": 5}])
    assert bad.status_code == 400 and "'v'" in bad.json()["message"]
    # a snapshot timestamp far in the future is refused
    ahead = bootstrap_write(cs, replica_id, replica_path, start + (3600 * 1000 << 30), 0, [{"k": 1, "v": "x"}])
    assert ahead.status_code == 400
    assert cs.rows(REPLICA, replica_path) == []
    # an ordered replica table is not bootstrapped this way
    ordered = cs.replicated_table(f"//tmp/boot_ordered_{n}", schema=SCHEMA[1:])
    ordered_id, ordered_path = (cs.replica(ordered, REPLICA, f"//tmp/boot_ordered_r_{n}", schema=SCHEMA[1:],
                                           enable=False), f"//tmp/boot_ordered_r_{n}")
    refused = bootstrap_write(cs, ordered_id, ordered_path, start, 0, [{"v": "x"}])
    assert refused.status_code == 400 and "sorted tables only" in refused.json()["message"]
