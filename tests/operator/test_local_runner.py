"""``reptables up``: the examples run on one machine, as the README's first command does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from reptables.engine.client import Client
from reptables.engine.process import LocalEngine, free_port
from reptables.testing import wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def copy_examples(tmp_path: Path, min_replication_log_ttl: str | None = None) -> Path:
    """examples/*.yaml in ``tmp_path/manifests`` with free ports (the examples use 9012-9014), and
    ``minReplicationLogTtl`` of the orders table when given."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for source in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "TableCluster":
                doc["spec"]["endpoint"] = f"http://127.0.0.1:{free_port()}"
            if min_replication_log_ttl is not None and doc.get("kind") == "ReplicatedTable" \
                    and doc["metadata"]["name"] == "orders":
                doc["spec"]["minReplicationLogTtl"] = min_replication_log_ttl
        (manifests / source.name).write_text(yaml.safe_dump_all(docs))
    return manifests


def test_reptables_up_runs_the_examples_and_replicates(tmp_path: Path) -> None:
    manifests = copy_examples(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "reptables.operator.cli", "up", str(manifests), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "wrote 1000 rows to primary://home/shop/orders with yt.wrapper" in out
    assert "replica orders-remote-0 on remote-0" in out and "replica orders-remote-1 on remote-1" in out
    assert ": 1000 rows" in out and "served by the sync replica" in out
    final = out[out.rindex("TableCluster     primary"):]
    assert final.count("Ready=True") == 7 and "Ready=False" not in final
    assert "sync=orders-remote-0" in final  # the preferred cluster of the examples


def test_reptables_up_bootstraps_a_replica_added_to_a_table_with_trimmed_history(tmp_path: Path) -> None:
    """The issue's check: run the examples, trim the queue, add a replica, run again on the same data.

    The first run writes 1000 rows; with ``minReplicationLogTtl: 0s`` the queue is trimmed once both
    replicas have them. The second run (the same data directory: the engines keep their tables)
    finds a new TableReplica of that table: the local launcher copies the rows with local Spark,
    verifies them, enables the replica, and the demo shows it holds every row. The second run's
    ``--timeout`` is shorter than the two Spark jobs: ``up`` waits on while a job of its own runs.
    The second run writes no demo rows (the directory ran before): the new replica holds the first
    run's 1000, counted on its engine afterwards.
    """
    manifests = copy_examples(tmp_path, min_replication_log_ttl="0s")
    command = [sys.executable, "-m", "reptables.operator.cli", "up", str(manifests), "--data-dir",
               str(tmp_path / "data")]
    first = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "bootstrap=" not in first.stdout  # the replicas came before the rows: nothing to copy
    # the meta-cluster alone, on its data, until its queue has trimmed what both replicas received
    primary = next(d for d in yaml.safe_load_all((manifests / "tableclusters.yaml").read_text())
                   if d and d["kind"] == "TableCluster" and d["metadata"]["name"] == "primary")
    port = int(primary["spec"]["endpoint"].rsplit(":", 1)[1])
    engine = LocalEngine("primary", tmp_path / "data" / "primary", port=port, token="change-me-primary").start()
    try:
        with Client(engine.url, "change-me-primary") as meta:
            wait_for(lambda: sum(t["trimmed_row_count"] for t in meta.get("//home/shop/orders/@tablets")) >= 1000,
                     60, "the queue of //home/shop/orders to be trimmed", interval=0.2)
    finally:
        engine.stop()
    (manifests / "zz-new-replica.yaml").write_text(yaml.safe_dump({
        "apiVersion": "reptables.io/v1alpha1", "kind": "TableReplica", "metadata": {"name": "orders-copy"},
        "spec": {"table": "orders", "cluster": "remote-1", "replicaPath": "//home/shop/orders_copy",
                 "mode": "async", "bootstrap": {"parallelism": 2}}}))
    # a short --timeout: the copy and verify jobs (two Spark JVMs) outlast it, and up waits for them
    second = subprocess.run([*command, "--timeout", "20"], capture_output=True, text=True, timeout=700)
    out = second.stdout
    assert second.returncode == 0, out[-4000:] + second.stderr[-3000:]
    assert "TableReplica default/orders-copy: BootstrapPending: the history of //home/shop/orders was trimmed" in out
    assert "TableReplica default/orders-copy: BootstrapCopying" in out, out[-4000:]
    assert "TableReplica default/orders-copy: BootstrapDone: 1000 rows copied" in out, out[-4000:]
    assert "wrote 1000 rows" not in out and "demo: not written again" in out
    final = out[out.rindex("TableCluster     primary"):]
    assert "bootstrap=Done" in final and "Ready=False" not in final
    remote = next(d for d in yaml.safe_load_all((manifests / "tableclusters.yaml").read_text())
                  if d and d["kind"] == "TableCluster" and d["metadata"]["name"] == "remote-1")
    remote_port = int(remote["spec"]["endpoint"].rsplit(":", 1)[1])
    engine = LocalEngine("remote-1", tmp_path / "data" / "remote-1", port=remote_port,
                         token="change-me-remote-1").start()
    try:
        with Client(engine.url, "change-me-remote-1") as replica:
            assert replica.select_rows("sum(1) as n from [//home/shop/orders_copy] group by 1") == [{"n": 1000}]
    finally:
        engine.stop()
