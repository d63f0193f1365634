"""Seed 002's schema migration, replayed with the official ``yt`` CLI while a client keeps writing.

"The replica table schemas ... must be no narrower than the replicated table schema for replication
to work correctly. You need to start the schema change with the replicas and then move on to the
replicated table." Three real engines: the meta-cluster ``primary`` holds ``//tmp/replicated`` with
a sync replica on ``remote_0`` and an async one on ``remote_1``. A writer thread inserts rows the
whole time; the replicated table refuses the wider schema while a replica is narrower (naming it),
the replica tables take it first, then the replicated table, then rows with the new column reach
both replicas - and every acknowledged row is on every replica, none lost.
"""

from __future__ import annotations

import threading
from typing import Any

import yt.yson as yson

from reptables.engine.errors import YtError
from reptables.testing import wait_for
from tests.replication.conftest import SCHEMA, ClusterSet

TABLE, REPLICA = "//tmp/replicated", "//tmp/replica"
WIDER = SCHEMA + [{"name": "extra", "type": "int64"}]


class Writer(threading.Thread):
    """Inserts one row per commit into the replicated table until stopped; after ``widen`` is set,
    rows carry the new column. Keeps what was acknowledged, and any error."""

    def __init__(self, clusters: ClusterSet) -> None:
        super().__init__(daemon=True)
        self.client = clusters.client("primary")
        self.stop = threading.Event()
        self.widen = threading.Event()
        self.acked: dict[int, dict[str, Any]] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        k = 0
        while not self.stop.is_set():
            k += 1
            row: dict[str, Any] = {"k": k, "v": f"v{k}"}
            if self.widen.is_set():
                row["extra"] = k * 10
            try:
                self.client.insert_rows(TABLE, [row])
            except YtError as exc:
                self.errors.append(f"row {k}: {exc.message}")
                continue
            self.acked[k] = row

    def wait_rows(self, count: int) -> None:
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + count or self.errors, 30, f"{count} more writes")


def _cli_alter(clusters: ClusterSet, cluster: str, path: str, schema: list[dict[str, Any]],
               check: bool = True) -> Any:
    return clusters.engines[cluster].yt("alter-table", path, "--schema", yson.dumps(schema).decode(), check=check)


def test_migration_in_seed_order_while_writing(clusters: ClusterSet) -> None:
    clusters.replicated_table(TABLE)
    sync_id = clusters.replica(TABLE, "remote_0", REPLICA, mode="sync")
    async_id = clusters.replica(TABLE, "remote_1", REPLICA, mode="async")
    clusters.wait_in_sync(sync_id)
    writer = Writer(clusters)
    writer.start()
    try:
        writer.wait_rows(20)
        # the replicated table first is the wrong order: refused, naming the narrower replica
        refused = _cli_alter(clusters, "primary", TABLE, WIDER, check=False)
        assert refused.returncode != 0
        assert "has no column 'extra'" in refused.stderr
        assert sync_id in refused.stderr and "remote_0" in refused.stderr and REPLICA in refused.stderr
        assert [c["name"] for c in clusters.meta.get(f"{TABLE}/@schema")] == ["k", "v"]

        # the seed's order: every replica table, then the replicated table
        _cli_alter(clusters, "remote_0", REPLICA, WIDER)
        writer.wait_rows(20)
        still = _cli_alter(clusters, "primary", TABLE, WIDER, check=False)
        assert still.returncode != 0 and async_id in still.stderr and "remote_1" in still.stderr
        _cli_alter(clusters, "remote_1", REPLICA, WIDER)
        writer.wait_rows(20)
        _cli_alter(clusters, "primary", TABLE, WIDER)
        assert [c["name"] for c in clusters.meta.get(f"{TABLE}/@schema")] == ["k", "v", "extra"]
        writer.widen.set()
        writer.wait_rows(50)
    finally:
        writer.stop.set()
        writer.join(30)
    assert writer.errors == []
    widened = {k for k, row in writer.acked.items() if "extra" in row}
    assert len(widened) >= 40

    expected = {k: {"k": k, "v": row["v"], "extra": row.get("extra")} for k, row in writer.acked.items()}
    for cluster in ("remote_0", "remote_1"):
        wait_for(lambda cluster=cluster: len(clusters.rows(cluster, REPLICA)) >= len(expected), 30,
                 f"every row on {cluster}")
        got = {r["k"]: r for r in clusters.rows(cluster, REPLICA)}
        assert got == expected, f"rows on {cluster} differ from the acknowledged writes"
    # the replicated table reads through its sync replica, new column included
    last = max(widened)
    assert clusters.meta.lookup_rows(TABLE, [{"k": last}]) == [expected[last]]


def test_disabled_replica_does_not_block_and_is_checked_when_enabled(clusters: ClusterSet) -> None:
    clusters.replicated_table(TABLE)
    enabled = clusters.replica(TABLE, "remote_0", REPLICA, mode="sync", schema=WIDER)
    clusters.wait_in_sync(enabled)
    disabled = clusters.replica(TABLE, "remote_1", REPLICA, mode="async", enable=False)
    clusters.meta.call("alter_table", {"path": TABLE, "schema": WIDER})
    clusters.meta.insert_rows(TABLE, [{"k": 1, "v": "a", "extra": 5}])
    assert clusters.rows("remote_0", REPLICA) == [{"k": 1, "v": "a", "extra": 5}]
    # the narrower table cannot be enabled; once widened, it can, and gets the row
    try:
        clusters.alter(disabled, enabled=True)
    except (YtError, AssertionError) as exc:
        assert "has no column 'extra'" in str(exc) or clusters.meta.get(f"#{disabled}/@state") != "enabled"
    else:
        raise AssertionError("a narrower replica table was enabled")
    clusters.wait_state(disabled, "disabled")
    clusters.client("remote_1").call("alter_table", {"path": REPLICA, "schema": WIDER})
    clusters.alter(disabled, enabled=True)
    wait_for(lambda: clusters.rows("remote_1", REPLICA) == [{"k": 1, "v": "a", "extra": 5}], 30, "row replicated")
