"""Status from the source of truth, through ``reptables up``'s runner and ``reptables status``.

One :class:`~reptables.operator.local.runner.LocalRunner` (the reconcile core and the tracker in this
process, three real engines on free loopback ports) serves the module; the tests stop and start its
engines as ``reptables cluster stop|start`` does, and read what users read: the objects' status, and
the text and JSON of the real ``reptables status`` command on the runner's state file.

Issue 26 found the status lying after a failover: the killed replica's TableReplica kept
``mode: sync`` (its reconcile stopped at the dead cluster before it read the mode from the
meta-cluster), ``lagSeconds: 0`` and ``rowsBehind: 0``; ``status.tracker.lastDecision`` stayed null
and the text view said "tracker: enabled, no switch yet" after many switches, with no recent switches
or events. The tests run in file order: the failover first, then what each view shows of it, then
the meta-cluster's own outage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.process import free_port
from reptables.operator.local.runner import LocalRunner
from reptables.testing import wait_for

API = "reptables.io/v1alpha1"
CLUSTERS = ("primary", "remote-0", "remote-1")
PATH = "//home/truth/orders"
REPTABLES = Path(sys.executable).with_name("reptables")


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for index, name in enumerate(CLUSTERS):
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": f"{name}-token", "namespace": "default", "labels": {"reptables.io/credentials": "true"}},
            "stringData": {"token": f"token-{name}-0123456789"}})
        docs.append({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                     "spec": {"endpoint": f"http://127.0.0.1:{free_port()}", "clusterId": index,
                              "credentialsSecret": {"name": f"{name}-token", "namespace": "default"}}})
    docs.append({"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "orders"}, "spec": {
        "cluster": "primary", "path": PATH, "minReplicationLogTtl": "10m",
        "schema": [{"name": "k", "type": "int64", "sortOrder": "ascending"}, {"name": "v", "type": "string"}],
        "replicatedTableOptions": {"enableReplicatedTableTracker": True, "maxSyncReplicaCount": 1,
                                   "preferredSyncReplicaClusters": ["remote-0"]}}})
    for name in ("remote-0", "remote-1"):
        docs.append({"apiVersion": API, "kind": "TableReplica", "metadata": {"name": f"orders-{name}"},
                     "spec": {"table": "orders", "cluster": name, "replicaPath": PATH,
                              "mode": "sync" if name == "remote-0" else "async",
                              "bootstrap": {"enabled": False}}})
    return docs


class Local:
    """The runner, and the helpers a test needs around it."""

    def __init__(self, runner: LocalRunner) -> None:
        self.runner = runner

    def status(self, kind: str, name: str) -> dict[str, Any]:
        key = (kind, None if kind == "TableCluster" else "default", name)
        return self.runner.bodies[key].get("status") or {}

    def until(self, predicate: Any, timeout: float, what: str) -> Any:
        def reconciled() -> Any:
            self.runner.reconcile_all()
            return predicate()

        return wait_for(reconciled, timeout, what, interval=0.3)

    def client(self, cluster: str) -> Client:
        engine = self.runner.processes[cluster]
        return Client(engine.url, engine.read_token(), timeout=10)

    def meta_replicas(self) -> dict[str, dict[str, Any]]:
        """TableReplica name -> the meta-cluster's ``#<id>/@`` of its replica."""
        with self.client("primary") as meta:
            return {f"orders-{info['cluster_name']}": meta.get(f"#{replica_id}/@")
                    for replica_id, info in meta.get(f"{PATH}/@replicas").items()}

    def reptables(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.runner.write_state()
        return subprocess.run([str(REPTABLES), *args, "--data-dir", str(self.runner.data_dir)], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    runner = LocalRunner(manifests(), tmp_path_factory.mktemp("status-truth") / "data")
    try:
        runner.start_engines()
        assert runner.converge(timeout=90), "the resources never became Ready"
        yield Local(runner)
    finally:
        runner.stop()


def replica_row(text: str, name: str) -> list[str]:
    """The words of a replica's row in the text view's replica table."""
    return next(words for words in map(str.split, text.splitlines())
                if words[:3] == [name, name.removeprefix("orders-"), PATH])


def rows_behind(info: dict[str, Any]) -> int:
    return sum(max(0, int(t.get("flushed_row_count") or 0) - int(t.get("current_replication_row_index") or 0))
               for t in info.get("tablets") or [])


def test_a_replica_whose_cluster_is_down_shows_the_meta_clusters_mode_lag_and_rows_behind(local: Local) -> None:
    local.until(lambda: local.status("TableReplica", "orders-remote-0").get("mode") == "sync"
                == local.meta_replicas()["orders-remote-0"]["mode"], 30, "the tracker to settle")
    local.runner.processes["remote-0"].stop()
    local.until(lambda: local.meta_replicas()["orders-remote-0"]["mode"] == "async", 30, "the tracker's switch")
    with local.client("primary") as meta:  # sync on remote-1 (a retriable 1732 while it catches up)
        wait_for(lambda: meta.insert_rows(PATH, [{"k": k, "v": "while remote-0 is down"} for k in range(7)]) or True,
                 30, "the rows written")

    def truthful() -> bool:
        status = local.status("TableReplica", "orders-remote-0")
        info = local.meta_replicas()["orders-remote-0"]
        return (status.get("mode") == info["mode"] == "async"
                and (status.get("tablets") or {}).get("rowsBehind") == rows_behind(info) > 0
                and status.get("lagSeconds") == int(info.get("replication_lag_time", 0)) // 1000)

    local.until(truthful, 30, "orders-remote-0's status to be the meta-cluster's")
    status = local.status("TableReplica", "orders-remote-0")
    assert status["unreachable"]["cluster"] == "remote-0" and status["unreachable"]["since"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicaClusterUnavailable")
    assert ready["message"].startswith(f"cluster remote-0 unreachable since {status['unreachable']['since']}: ")
    assert local.status("TableReplica", "orders-remote-1")["mode"] == "sync"


def test_the_tables_status_holds_the_trackers_last_decision_and_its_switches(local: Local) -> None:
    tracker = local.status("ReplicatedTable", "orders")["tracker"]
    assert tracker["lastDecision"] == "orders-remote-1: async -> sync; orders-remote-0: sync -> async", tracker
    assert tracker["reason"].startswith("orders-remote-1: promoted to reach max_sync_replica_count 1"), tracker
    assert "orders-remote-0: cluster remote-0 unhealthy: probe failed" in tracker["reason"], tracker
    newest = tracker["recentSwitches"][0]
    assert (newest["replica"], newest["cluster"], newest["mode"]) == ("orders-remote-0", "remote-0", "async")
    assert [s["replica"] for s in tracker["recentSwitches"][:2]] == ["orders-remote-0", "orders-remote-1"]
    assert tracker["time"] == newest["time"]
    assert tracker["summary"].startswith("sync: orders-remote-1@remote-1 (min 1, max 1)"), tracker
    assert len(tracker["recentSwitches"]) == 3  # and, first, the tracker's promotion of orders-remote-0
    first = tracker["recentSwitches"][2]
    assert (first["replica"], first["mode"]) == ("orders-remote-0", "sync")


def test_reptables_status_shows_the_tracker_the_switches_and_the_unreachable_cluster(local: Local) -> None:
    result = local.reptables("status", "orders")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "tracker: orders-remote-1: async -> sync; orders-remote-0: sync -> async (orders-remote-1: promoted" in text
    assert "tracker: enabled, no switch yet" not in text
    assert "tracker now: sync: orders-remote-1@remote-1 (min 1, max 1)" in text
    assert "recent switches (newest first):" in text
    assert "orders-remote-0 -> async: cluster remote-0 unhealthy: probe failed" in text
    row = replica_row(text, "orders-remote-0")
    assert row[3:6] == ["async", "enabled", "(unreachable)"], row
    assert "ReplicaClusterUnavailable: cluster remote-0 unreachable since" in text
    assert "Recent events (newest first)" in text and "ReplicaClusterUnavailable" in text

    view = json.loads(local.reptables("status", "orders", "-o", "json").stdout)
    (table,) = view["tables"]
    assert table["tracker"]["lastDecision"] == "orders-remote-1: async -> sync; orders-remote-0: sync -> async"
    replica = next(r for r in table["replicas"] if r["name"] == "orders-remote-0")
    assert replica["mode"] == "async" and replica["unreachable"]["cluster"] == "remote-0"
    assert replica["rowsBehind"] > 0


def test_a_cluster_that_answers_again_is_no_longer_unreachable(local: Local) -> None:
    local.runner.processes["remote-0"].start()
    local.until(lambda: (s := local.status("TableReplica", "orders-remote-0")).get("unreachable") is None
                and (s.get("tablets") or {}).get("rowsBehind") == 0, 60, "remote-0 back and caught up")
    # (the tracker gives the sync role back to the preferred remote-0 meanwhile: the status follows it)
    local.until(lambda: local.status("TableReplica", "orders-remote-0")["mode"]
                == local.meta_replicas()["orders-remote-0"]["mode"] == "sync", 30, "remote-0 sync again")
    ready = next(c for c in local.status("TableReplica", "orders-remote-0")["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready


def test_a_meta_cluster_that_is_down_leaves_modes_and_lags_unknown_not_stale(local: Local) -> None:
    local.runner.processes["primary"].stop()
    try:
        def unknown() -> bool:
            replica = local.status("TableReplica", "orders-remote-1")
            table = local.status("ReplicatedTable", "orders")
            return replica.get("mode") is None and (replica.get("unreachable") or {}).get("cluster") == "primary" \
                and (table.get("unreachable") or {}).get("cluster") == "primary"

        local.until(unknown, 30, "the statuses to say the meta-cluster is unreachable")
        replica = local.status("TableReplica", "orders-remote-1")
        assert replica["lagSeconds"] is None and replica["state"] is None and replica["tablets"]["rowsBehind"] is None
        ready = next(c for c in replica["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "ClusterUnreachable"
        since = replica["unreachable"]["since"]
        assert ready["message"].startswith(f"meta-cluster primary unreachable since {since}: ")
        table = local.status("ReplicatedTable", "orders")
        assert table["syncReplicas"] == [] and table["maxLagSeconds"] is None
        assert all(set(r) == {"name", "cluster"} for r in table["replicas"]), table["replicas"]
        writable = next(c for c in table["conditions"] if c["type"] == "Writable")
        assert (writable["status"], writable["reason"]) == ("False", "ClusterUnreachable")
        text = local.reptables("status", "orders").stdout
        row = replica_row(text, "orders-remote-1")
        assert row[3:5] == ["-", "-"], row  # mode and state: unknown, not the last ones seen
    finally:
        local.runner.processes["primary"].start()
    local.until(lambda: local.status("TableReplica", "orders-remote-1").get("mode") is not None
                and local.status("ReplicatedTable", "orders").get("unreachable") is None, 60, "primary back")
