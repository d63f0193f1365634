"""Credentials and directories: which Secrets a TableCluster may use, and which tokens each engine gets.

The reconcile core with the real registry: a TableCluster whose Secret is outside the allowed
namespaces, unlabelled, reserved for another TableCluster or not a usable token is refused with a
reason naming the Secret, and is neither connected to nor listed in any directory. Each engine's
``//sys/clusters`` lists only the clusters its tables and replicas link it to: written to real
engines, and to a rogue endpoint (a recording HTTP server standing in for an attacker's) that must
receive no other cluster's token. No status carries anything derived from a token.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.operator.controllers.clusters import reconcile_table_cluster
from reptables.operator.controllers.directory import desired_directory, needed_clusters, sync_directory
from reptables.operator.controllers.world import Engines
from reptables.operator.registry import CredentialPolicy, Registry
from tests.harness import EngineProcess
from tests.operator.rogue import Recorder

API = "reptables.io/v1alpha1"
OPS = "reptables-system"
LABELS = {"reptables.io/credentials": "true"}


def secret(name: str, value: bytes | str, namespace: str = OPS, labels: dict[str, str] | None = LABELS,
           annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    data = value if isinstance(value, str) else base64.b64encode(value).decode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"token": data}}


def cluster(name: str, endpoint: str, secret_name: str, namespace: str | None = None,
            cluster_id: int = 0) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret_name}
    if namespace is not None:
        ref["namespace"] = namespace
    return {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"endpoint": endpoint, "credentialsSecret": ref, "clusterId": cluster_id}}


def table(name: str, on: str, namespace: str = "shop") -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": name, "namespace": namespace},
            "spec": {"cluster": on, "path": f"//home/{name}",
                     "schema": [{"name": "k", "type": "int64", "sortOrder": "ascending"}]}}


def replica(name: str, table_name: str, on: str, namespace: str = "shop") -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableReplica", "metadata": {"name": name, "namespace": namespace},
            "spec": {"table": table_name, "cluster": on, "replicaPath": f"//home/{table_name}"}}


def registry(*docs: dict[str, Any], namespaces: frozenset[str] | None = frozenset({OPS})) -> Registry:
    reg = Registry(Engines(), OPS, CredentialPolicy(namespaces))
    for doc in docs:
        if doc["kind"] == "Secret":
            reg.upsert_secret(doc)
        else:
            reg.upsert(doc)
    return reg


# --- which Secrets a TableCluster may use ------------------------------------------------------------


def test_a_labelled_secret_in_the_operator_namespace_connects_the_cluster() -> None:
    reg = registry(secret("a-token", b"token-a-0123456789"), cluster("a", "http://127.0.0.1:1", "a-token"))
    assert reg.refresh_cluster("a") is None
    assert reg.engines.ref("a").token == "token-a-0123456789"


REFUSED = [
    pytest.param([secret("a-token", b"token-a", namespace="shop")], "shop", "SecretNotAllowed",
                 "Secret shop/a-token: the operator takes credentials only from Secrets in reptables-system",
                 id="namespace-not-allowed"),
    pytest.param([secret("a-token", b"token-a", labels=None)], None, "SecretNotAllowed",
                 "Secret reptables-system/a-token lacks the label reptables.io/credentials=true", id="unlabelled"),
    pytest.param([secret("a-token", b"token-a", labels={"reptables.io/credentials": "false"})], None,
                 "SecretNotAllowed", "lacks the label reptables.io/credentials=true", id="label-false"),
    pytest.param([], None, "SecretNotFound",
                 "Secret reptables-system/a-token (key 'token') not found; the operator reads only Secrets "
                 "labelled reptables.io/credentials=true", id="missing"),
    pytest.param([secret("a-token", b"token-a", annotations={"reptables.io/table-clusters": "b, c"})], None,
                 "SecretNotAllowed", "Secret reptables-system/a-token may be used only by the TableClusters in "
                 "its annotation reptables.io/table-clusters (b, c)", id="reserved-for-others"),
    pytest.param([secret("a-token", b"\xff\xfe\x00binary")], None, "SecretInvalid",
                 "Secret reptables-system/a-token key 'token' is not a text token: byte 0xff at offset 0 is "
                 "not ASCII", id="binary"),
    pytest.param([secret("a-token", "t\u00f6ken".encode())], None, "SecretInvalid",
                 "byte 0xc3 at offset 1 is not ASCII", id="utf8-not-ascii"),
    pytest.param([secret("a-token", b"token-a\n")], None, "SecretInvalid",
                 "contains a whitespace or control character (0x0a) at offset 7 (a trailing newline, as `echo` "
                 "adds, is a common cause)", id="trailing-newline"),
    pytest.param([secret("a-token", b"")], None, "SecretInvalid", "key 'token' is empty", id="empty"),
    pytest.param([secret("a-token", "%%% not base64")], None, "SecretInvalid",
                 "key 'token' is not valid base64", id="not-base64"),
]


@pytest.mark.parametrize(("secrets", "namespace", "reason", "message"), REFUSED)
def test_a_cluster_whose_secret_cannot_be_used_is_refused_and_never_connected(
        secrets: list[dict[str, Any]], namespace: str | None, reason: str, message: str) -> None:
    reg = registry(*secrets, cluster("a", "http://127.0.0.1:1", "a-token", namespace=namespace),
                   secret("b-token", b"token-b"), cluster("b", "http://127.0.0.1:2", "b-token", cluster_id=1),
                   table("t", on="b"), replica("t-a", "t", on="a"))
    problem = reg.refresh_cluster("a")
    assert problem is not None and (problem.reason, message in problem.message) == (reason, True), problem
    assert set(reg.engines.clusters()) == {"b"}
    assert "a" not in desired_directory("b", reg.world())  # linked by a replica, yet never listed


def test_a_secret_that_loses_its_label_or_goes_away_disconnects_the_cluster() -> None:
    reg = registry(secret("a-token", b"token-a"), cluster("a", "http://127.0.0.1:1", "a-token"))
    assert set(reg.engines.clusters()) == {"a"}
    reg.upsert_secret(secret("a-token", b"token-a", labels={}))
    assert reg.engines.clusters() == {}
    reg.upsert_secret(secret("a-token", b"token-a"))
    assert set(reg.engines.clusters()) == {"a"}
    reg.remove_secret(OPS, "a-token")
    assert reg.engines.clusters() == {}


def test_secrets_outside_the_allowed_namespaces_are_not_kept() -> None:
    reg = registry(secret("x", b"some-other-teams-token", namespace="shop"))
    assert reg.credentials("a", "shop", "x", "token").reason == "SecretNotAllowed"  # type: ignore[union-attr]
    wider = registry(secret("x", b"shop-token-0123", namespace="shop"), cluster("a", "http://h:1", "x", "shop"),
                     namespaces=frozenset({OPS, "shop"}))
    assert wider.engines.ref("a").token == "shop-token-0123"


# --- which clusters each engine's directory lists --------------------------------------------------------


def linked_world() -> Registry:
    docs: list[dict[str, Any]] = []
    for index, name in enumerate(("meta", "r0", "r1", "other-meta", "rogue")):
        docs += [secret(f"{name}-token", f"token-{name}".encode()),
                 cluster(name, f"http://127.0.0.1:{9000 + index}", f"{name}-token", cluster_id=index)]
    docs += [table("orders", on="meta"), replica("orders-r0", "orders", on="r0"),
             replica("orders-r1", "orders", on="r1"), table("orders", on="other-meta", namespace="billing"),
             replica("b-r1", "orders", on="r1", namespace="billing"), replica("dangling", "no-such-table", on="rogue")]
    return registry(*docs)


def test_each_engine_needs_only_the_clusters_its_tables_and_replicas_link_it_to() -> None:
    world = linked_world().world()
    assert needed_clusters("meta", world) == {"r0", "r1"}
    assert needed_clusters("r0", world) == {"meta"}
    assert needed_clusters("r1", world) == {"meta", "other-meta"}  # ReplicatedTables are per namespace
    assert needed_clusters("other-meta", world) == {"r1"}
    assert needed_clusters("rogue", world) == set()  # a replica of a table that does not exist links nothing
    # r0 calls meta with the credential for that pair, never with meta's API token
    assert desired_directory("r0", world) == {"meta": {"proxy_url": "http://127.0.0.1:9000",
                                                       "token": peer_credential("token-meta", "r0")}}
    assert desired_directory("rogue", world) == {}


# --- real engines, and a rogue endpoint ------------------------------------------------------------------


@dataclass
class Clusters:
    meta: EngineProcess
    replica: EngineProcess
    rogue: Recorder

    def docs(self, replica_token: str | None = None) -> list[dict[str, Any]]:
        return [secret("meta-token", self.meta.token.encode()),  # type: ignore[union-attr]
                secret("replica-token", (replica_token or self.replica.token or "").encode()),
                secret("rogue-token", b"rogue-own-token"),
                cluster("meta", self.meta.url, "meta-token"),
                cluster("replica", self.replica.url, "replica-token", cluster_id=1),
                cluster("rogue", self.rogue.url, "rogue-token", cluster_id=2),
                table("orders", on="meta"), replica("orders-r", "orders", on="replica")]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    base: Path = tmp_path_factory.mktemp("credentials")
    meta = EngineProcess("meta", base / "meta", token="token-meta-0123456789").start()
    replica_engine = EngineProcess("replica", base / "replica", token="token-replica-0123456789").start()
    rogue = Recorder().start()
    try:
        yield Clusters(meta, replica_engine, rogue)
    finally:
        rogue.stop()
        replica_engine.stop()
        meta.stop()


def _as_resource(reg: Registry, name: str) -> Any:
    return next(r for r in reg.of_kind("TableCluster") if r.name == name)


def test_a_rogue_table_cluster_receives_no_other_clusters_token(clusters: Clusters) -> None:
    reg = registry(*clusters.docs())
    for name in ("meta", "replica", "rogue"):
        outcome = reconcile_table_cluster(_as_resource(reg, name), reg.world())
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in outcome.status["conditions"]), outcome
    with Client(clusters.meta.url, clusters.meta.token) as meta, \
            Client(clusters.replica.url, clusters.replica.token) as replica:
        assert set(meta.get("//sys/clusters")) == {"replica"}
        assert set(replica.get("//sys/clusters")) == {"meta"}
    received = "\n".join(clusters.rogue.requests)
    assert clusters.rogue.wrote_directory()  # the operator did write the rogue's directory: an empty one
    for token in (clusters.meta.token, clusters.replica.token):
        assert token and token not in received
    # and each engine holds a credential for its own calls to the other, never the other's API token
    world = reg.world()
    assert desired_directory("meta", world)["replica"]["token"] == peer_credential(clusters.replica.token or "", "meta")
    assert desired_directory("replica", world)["meta"]["token"] == peer_credential(clusters.meta.token or "", "replica")


def test_status_carries_nothing_derived_from_a_token_and_a_rotated_token_is_rewritten(clusters: Clusters) -> None:
    reg = registry(*clusters.docs())
    meta = _as_resource(reg, "meta")
    first = reconcile_table_cluster(meta, reg.world())
    assert [e.reason for e in first.events] == ["DirectoryUpdated"]
    text = json.dumps(first.status)
    desired = desired_directory("meta", reg.world())
    for secret_value in (clusters.replica.token or "", hashlib.sha256(json.dumps(desired, sort_keys=True).encode())
                         .hexdigest()[:16]):
        assert secret_value not in text
    assert "directoryFingerprint" not in first.status
    assert reconcile_table_cluster(meta, reg.world()).events == []  # nothing changed: nothing written
    # the replica's Secret is rotated: the meta-cluster's directory is rewritten, the status is unchanged
    for doc in clusters.docs(replica_token="token-replica-rotated-0123"):
        if doc["kind"] == "Secret":
            reg.upsert_secret(doc)
    rotated = reconcile_table_cluster(meta, reg.world())
    assert [e.reason for e in rotated.events] == ["DirectoryUpdated"]
    assert {k: v for k, v in rotated.status.items() if k not in ("lastProbeTime", "latencyMs", "conditions")} == \
        {k: v for k, v in first.status.items() if k not in ("lastProbeTime", "latencyMs", "conditions")}
    # a restarted operator remembers nothing: it writes each directory once, then no more
    restarted = registry(*clusters.docs())
    assert sync_directory("meta", restarted.world())[1] is True
    assert sync_directory("meta", restarted.world())[1] is False


def test_a_directory_written_out_of_band_is_put_back(clusters: Clusters) -> None:
    reg = registry(*clusters.docs())
    sync_directory("meta", reg.world())
    with Client(clusters.meta.url, clusters.meta.token) as meta:
        meta.set("//sys/clusters", {"stranger": {"proxy_url": "http://127.0.0.1:1", "token": "x"}})
        directory, written = sync_directory("meta", reg.world())
        assert written and set(directory) == {"replica"}
        assert set(meta.get("//sys/clusters")) == {"replica"}


def test_reptables_up_uses_an_unlabelled_secret_of_its_own_files_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reptables.operator.local.runner import LocalRunner

    runner = LocalRunner([secret("a-token", b"token-a", namespace="anywhere", labels=None),
                          cluster("a", "http://127.0.0.1:1", "a-token", namespace="anywhere")], tmp_path)
    try:
        assert runner.registry.refresh_cluster("a") is None
        assert "Secret anywhere/a-token lacks the label reptables.io/credentials=true: the operator on " \
               "Kubernetes would not use it" in capsys.readouterr().err
    finally:
        runner.stop()
