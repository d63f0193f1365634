"""Conditions say what the docs say they do (docs/crds.md, "Conditions"): real engines, the reconcile core.

* a ReplicatedTable without an enabled replica is not Ready (reason NoReplicas): nothing is
  replicated and reads find no in-sync replica;
* a TableReplica whose lag is above the table's ``syncReplicaLagThreshold`` is not Replicating
  (reason Lagging), and is again once it caught up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reptables.engine.errors import YtError
from reptables.engine.process import start_all
from reptables.operator.controllers.dispatch import reconcile
from reptables.operator.controllers.world import Engines, Resource
from reptables.operator.registry import CredentialPolicy, Registry
from tests.harness import EngineProcess
from tests.operator.test_bootstrap import OPS, Operator, cluster, condition, replica, secret, table

NAMES = ("meta", "source", "target")


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    base: Path = tmp_path_factory.mktemp("op-conditions")
    engines: dict[str, EngineProcess] = {}
    registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
    try:
        for name in NAMES:
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789abcdef")
        start_all(engines.values())
        operator = Operator(engines, registry, launcher=None)  # type: ignore[arg-type]  # no jobs here
        for index, name in enumerate(NAMES):
            registry.upsert_secret(secret(f"{name}-token", engines[name].read_token()))
            operator.add(cluster(name, engines[name].url, index))
        yield operator
    finally:
        for engine in engines.values():
            engine.stop()


def replicated_table(op: Operator, name: str) -> Resource:
    return next(r for r in op.registry.of_kind("ReplicatedTable") if r.name == name)


def test_a_table_without_an_enabled_replica_is_not_ready(op: Operator) -> None:
    op.add(table("lonely"))
    op.until(lambda: "tableId" in replicated_table(op, "lonely").status, 30, "the table")
    ready = condition(replicated_table(op, "lonely"), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NoReplicas")
    assert "no enabled replica" in ready["message"]
    op.add(replica("lonely-r", "lonely", "source"))
    op.until(lambda: condition(replicated_table(op, "lonely"), "Ready")["status"] == "True", 60, "Ready")
    assert condition(replicated_table(op, "lonely"), "Ready")["reason"] == "Replicating"


def test_a_replica_lagging_beyond_the_threshold_is_not_replicating(op: Operator) -> None:
    """A throttled replica falls behind without any error: Lagging, then Replicating once it caught up."""
    doc = table("slow")
    doc["spec"]["replicatedTableOptions"] = {"syncReplicaLagThreshold": "1s"}
    doc["spec"]["replicationThrottler"] = {"period": 1000, "limit": 400}  # 400 bytes/s
    op.add(doc)
    op.add(replica("slow-r", "slow", "target"))

    def replicating() -> dict[str, str]:
        return condition(op.replica("slow-r"), "Replicating")

    op.until(lambda: op.replica("slow-r").status.get("state") == "enabled"
             and replicating()["status"] == "True", 60, "the replica replicating")
    with op.client("meta") as meta:
        for k in range(40):  # ~4 KB: ten seconds of replication at the throttled rate
            meta.insert_rows("//home/slow", [{"k": k, "v": "x" * 80}], require_sync_replica=False)
    op.until(lambda: replicating()["reason"] == "Lagging", 30, f"the replica to lag: {replicating()}")
    assert replicating()["status"] == "False"
    assert "above syncReplicaLagThreshold 1 s" in replicating()["message"]
    assert op.replica("slow-r").status["errors"] == []  # slow, not failing
    assert 0 < op.replica("slow-r").status["tablets"]["rowsBehind"] <= 40
    op.until(lambda: replicating()["status"] == "True", 90, "the replica to catch up")
    op.until(lambda: op.replica("slow-r").status["tablets"]["rowsBehind"] == 0, 30, "no row behind")
    with op.client("target") as target:
        assert len(target.select_rows("* from [//home/slow_target]")) == 40


def test_a_read_only_table_cluster_makes_its_engine_refuse_client_writes(op: Operator) -> None:
    doc = cluster("source", op.engines["source"].url, 1)
    doc["spec"]["readOnly"] = True
    op.add(doc)
    with op.client("source") as source:
        op.until(lambda: source.get("//sys/@read_only") is True, 30, "//sys/@read_only on the engine")
        source.create("table", "//tmp/ro", attributes={"dynamic": True, "schema": [
            {"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]})
        source.mount_table("//tmp/ro")
        op.until(lambda: source.get("//tmp/ro/@tablet_state") == "mounted", 10, "mounted")
        with pytest.raises(YtError, match="Cluster source is read-only"):
            source.insert_rows("//tmp/ro", [{"k": 1, "v": "x"}])
        assert [e.reason for e in op.events["source"]].count("ReadOnly") == 1
        op.add(cluster("source", op.engines["source"].url, 1))  # readOnly back to false
        op.until(lambda: source.get("//sys/@read_only") is False, 30, "writable again")
        source.insert_rows("//tmp/ro", [{"k": 1, "v": "x"}])
    assert "Writable" in [e.reason for e in op.events["source"]]


def test_a_replica_is_named_by_its_table_replica_before_its_status_records_the_replica_id(op: Operator) -> None:
    """The table's status lists each replica by its TableReplica's name, also in the moment between the
    replica's creation on the engine and the patch that records its ``replicaId`` (kopf applies a
    status patch after the handler returns; the table's reconcile can run in between)."""
    op.add(table("named"))
    op.until(lambda: "tableId" in replicated_table(op, "named").status, 30, "the table")
    op.add(replica("named-r", "named", "source"))
    table_res = replicated_table(op, "named")
    replica_res = op.replica("named-r")
    # the replica's reconcile runs; its status (with replicaId) is not merged back yet
    created = reconcile(replica_res, op.registry.world())
    assert created.status.get("replicaId") and not op.replica("named-r").status.get("replicaId")
    listed = reconcile(table_res, op.registry.world()).status["replicas"]
    assert [(r["name"], r["cluster"]) for r in listed] == [("named-r", "source")]
