"""A ReplicatedTable manifest's schema edit, applied by the operator in seed 002's order.

kopf runs as a real process (``reptables operator``) against the Kubernetes API emulator; three
real engines are the TableClusters. What users rely on: an edit adding a value column and relaxing
``required`` reaches every replica table first and the replicated table after (events in that
order), ``status.schemaMigration`` ends ``Done`` and rows with the new column flow to every
replica; an edit the engine cannot take (a retyped column) is refused with ``Ready=False``, reason
``SchemaChangeRefused`` naming the column, and no engine table changes; reverting it heals.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reptables.engine.process import start_all
from tests.harness import EngineProcess
from tests.k8s.emulator import K8sApi
from tests.operator.test_operator_e2e import API, CLUSTERS, CREDENTIALS, NS, Env, OperatorProcess, replica

BEFORE = [{"name": "k", "type": "int64", "sortOrder": "ascending"},
          {"name": "v", "type": "string", "required": True}]
AFTER = [BEFORE[0], {"name": "v", "type": "string"}, {"name": "extra", "type": "int64"}]
PATH = "//home/evolving"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("schema-migration")
    engines: dict[str, EngineProcess] = {}
    try:
        for name in CLUSTERS:
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789")
        start_all(engines.values())
        with K8sApi(namespaces=[NS]) as api:
            operator = OperatorProcess(api.kubeconfig(base / "kubeconfig"), base / "operator.log").start()
            try:
                for name, engine in engines.items():
                    api.create({"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": f"{name}-token", "namespace": NS, "labels": CREDENTIALS},
                                "stringData": {"token": engine.token}})
                    api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                                "spec": {"endpoint": engine.url, "clusterId": CLUSTERS.index(name),
                                         "credentialsSecret": {"name": f"{name}-token", "namespace": NS}}})
                yield Env(api, engines, operator)
            finally:
                operator.stop()
    finally:
        for engine in engines.values():
            engine.stop()


def _names(env: Env, cluster: str, path: str = PATH) -> list[tuple[str, str, bool]]:
    return [(c["name"], c["type"], bool(c.get("required"))) for c in env.client(cluster).get(f"{path}/@schema")]


def _set_schema(env: Env, schema: list[dict[str, Any]]) -> int:
    body = env.api.patch("replicatedtables", "evolving", {"spec": {"schema": schema}}, NS)
    return int(body["metadata"]["generation"])


def _migration(env: Env) -> dict[str, Any]:
    return env.status("replicatedtables", "evolving").get("schemaMigration") or {}


def _ready(env: Env) -> dict[str, Any]:
    return next((c for c in env.status("replicatedtables", "evolving").get("conditions", [])
                 if c["type"] == "Ready"), {})


def test_schema_edit_reaches_replicas_first_then_the_table(env: Env) -> None:
    env.api.create({"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "evolving", "namespace": NS},
                    "spec": {"cluster": "primary", "path": PATH, "schema": BEFORE}})
    env.api.create(replica("evolving-sync", "evolving", "remote-0", PATH, mode="sync"))
    env.api.create(replica("evolving-async", "evolving", "remote-1", PATH))
    for name in ("evolving-sync", "evolving-async"):
        env.wait_ready("tablereplicas", name, 90)
    env.wait_ready("replicatedtables", "evolving", 60)
    meta = env.client("primary")
    meta.insert_rows(PATH, [{"k": 1, "v": "before"}])

    generation = _set_schema(env, AFTER)
    env.wait(lambda: _migration(env).get("phase") == "Done" and _migration(env).get("observedGeneration")
             == generation, 60, f"the migration to finish: {_migration(env)}")
    wider = [("k", "int64", False), ("v", "string", False), ("extra", "int64", False)]
    for cluster in CLUSTERS:
        assert _names(env, cluster) == wider, cluster
    assert "extra" in _migration(env)["message"]
    # the seed's order: each replica table was altered before the replicated table
    events = env.api.events(NS, involved_name="evolving")
    reasons = [e["reason"] for e in events if e["reason"] in ("SchemaMigrating", "SchemaMigrated")]
    assert reasons == ["SchemaMigrating", "SchemaMigrating", "SchemaMigrated"], reasons
    assert {m for e in events if e["reason"] == "SchemaMigrating" for m in ("remote-0", "remote-1")
            if m in e["message"]} == {"remote-0", "remote-1"}
    env.wait_ready("replicatedtables", "evolving", 30)

    # rows with the new column (and the relaxed one null) reach every replica
    meta.insert_rows(PATH, [{"k": 2, "extra": 20}, {"k": 3, "v": "after", "extra": 30}])
    expected = [{"k": 1, "v": "before", "extra": None}, {"k": 2, "v": None, "extra": 20},
                {"k": 3, "v": "after", "extra": 30}]
    for cluster in ("remote-0", "remote-1"):
        env.wait(lambda cluster=cluster: env.client(cluster).select_rows(
            f"k, v, extra from [{PATH}] order by k limit 10") == expected, 30, f"rows on {cluster}")


def test_an_edit_the_engine_cannot_take_is_refused_and_changes_nothing(env: Env) -> None:
    before = {cluster: _names(env, cluster) for cluster in CLUSTERS}
    retyped = [AFTER[0], {"name": "v", "type": "int64"}, AFTER[2]]
    _set_schema(env, retyped)
    env.wait(lambda: _ready(env).get("reason") == "SchemaChangeRefused", 30, f"the refusal: {_ready(env)}")
    ready = _ready(env)
    assert ready["status"] == "False"
    assert "Type mismatch for column 'v'" in ready["message"]
    assert _migration(env)["phase"] == "Refused"
    assert env.api.events(NS, involved_name="evolving", reason="SchemaChangeRefused")
    assert {cluster: _names(env, cluster) for cluster in CLUSTERS} == before
    # removing a column is refused too, naming it
    _set_schema(env, AFTER[:2])
    env.wait(lambda: "Cannot remove column 'extra'" in _ready(env).get("message", ""), 30,
             f"the removal refused: {_ready(env)}")
    assert {cluster: _names(env, cluster) for cluster in CLUSTERS} == before
    # reverting the edit heals
    _set_schema(env, AFTER)
    env.wait_ready("replicatedtables", "evolving", 30)
    env.wait(lambda: _migration(env).get("phase") == "Done", 30, "the migration record healed")
