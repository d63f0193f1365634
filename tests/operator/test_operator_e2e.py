"""The operator end to end: kopf as a real process, the Kubernetes API emulated, engines real.

``reptables operator`` (the container's command) runs against the API emulator of tests/k8s;
three real engine processes are the TableClusters. Manifests go in through the emulated API (with
CRD schema and CEL validation), and the tests check what users rely on: engine objects appear,
data flows, status is truthful, each engine knows only the clusters its tables link it to, a rogue
TableCluster gets no other cluster's token, credentials the operator may not use are refused, the
tracker moves the sync replica off a dead cluster (collocated tables together), deletion honours
the policy, and a restarted operator adopts what exists.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.process import start_all
from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess, free_port
from tests.k8s.emulator import ApiError, K8sApi
from tests.operator.rogue import Recorder

NS = "test"
ELSEWHERE = "elsewhere"  # a namespace the operator takes no credentials from
CREDENTIALS = {"reptables.io/credentials": "true"}
API = "reptables.io/v1alpha1"
SCHEMA = [{"name": "k", "type": "int64", "sortOrder": "ascending"}, {"name": "v", "type": "string"}]
CLUSTERS = ("primary", "remote-0", "remote-1")


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "REPTABLES_NAMESPACE": NS,
               "REPTABLES_STATUS_REFRESH": "2", "REPTABLES_TRACKER_PERIOD": "1", "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reptables.operator.cli", "operator", "--standalone", "--namespace", NS,
                 "--liveness", f"http://127.0.0.1:{self.health_port}/healthz",
                 "--metrics-port", str(self.metrics_port)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""


@dataclass
class Env:
    api: K8sApi
    engines: dict[str, EngineProcess]
    operator: OperatorProcess

    def client(self, cluster: str) -> Client:
        engine = self.engines[cluster]
        return Client(engine.url, engine.token, timeout=10)

    def wait(self, predicate: Any, timeout: float = 60.0, what: str = "condition") -> Any:
        """:func:`wait_for`, with an API error "not yet" too, and the operator's log in the failure."""
        try:
            return wait_for(predicate, timeout, what, interval=0.25, retry_on=(ApiError,))
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n--- operator log ---\n{self.operator.logs()}") from None

    def status(self, kind: str, name: str) -> dict[str, Any]:
        namespace = None if kind == "tableclusters" else NS
        return self.api.get(kind, name, namespace).get("status") or {}

    def ready(self, kind: str, name: str) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in self.status(kind, name).get("conditions", []))

    def wait_ready(self, kind: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        try:
            self.wait(lambda: self.ready(kind, name), timeout, f"{kind}/{name} Ready")
        except AssertionError as exc:
            # every table's and replica's status: what the one waited for was waiting on
            others = {f"{k}/{o['metadata']['name']}": o.get("status") for k in ("replicatedtables", "tablereplicas")
                      for o in self.api.list(k, NS)}
            raise AssertionError(f"{exc}\n--- status ---\n{self.status(kind, name)}\n--- all statuses ---\n"
                                 f"{others}") from None
        return self.status(kind, name)


def table(name: str, path: str, tracker: bool = False, policy: str = "Retain") -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": "primary", "path": path, "schema": SCHEMA, "deletionPolicy": policy}
    if tracker:
        spec["replicatedTableOptions"] = {"enableReplicatedTableTracker": True, "minSyncReplicaCount": 1,
                                          "maxSyncReplicaCount": 1}
    return {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def replica(name: str, table_name: str, cluster: str, path: str, mode: str = "async",
            policy: str = "Retain") -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableReplica", "metadata": {"name": name, "namespace": NS},
            "spec": {"table": table_name, "cluster": cluster, "replicaPath": path, "mode": mode,
                     "deletionPolicy": policy}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("operator-e2e")
    engines = {name: EngineProcess(name, base / name, token=f"token-{name}-0123456789") for name in CLUSTERS}
    start_all(engines.values())
    with K8sApi(namespaces=[NS, ELSEWHERE]) as api:
        operator = OperatorProcess(api.kubeconfig(base / "kubeconfig"), base / "operator.log").start()
        environment = Env(api, engines, operator)
        try:
            for name, engine in engines.items():
                api.create({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": f"{name}-token", "namespace": NS, "labels": CREDENTIALS},
                            "stringData": {"token": engine.token}})
                api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                            "spec": {"endpoint": engine.url, "clusterId": CLUSTERS.index(name),
                                     "credentialsSecret": {"name": f"{name}-token", "namespace": NS}}})
            for name in CLUSTERS:
                environment.wait_ready("tableclusters", name)
            yield environment
        finally:
            operator.stop()
            for engine in engines.values():
                engine.stop()


def test_table_clusters_probe_engines_and_share_no_directory_yet(env: Env) -> None:
    status = env.status("tableclusters", "primary")
    assert status["healthy"] is True and status["version"]
    assert "directoryFingerprint" not in status  # nothing derived from a token in a status
    for name in CLUSTERS:  # no table links the clusters yet: no engine knows another
        assert env.client(name).get("//sys/clusters") == {}


def test_manifests_create_engine_objects_and_data_flows(env: Env) -> None:
    env.api.create(table("orders", "//home/orders"))
    env.api.create(replica("orders-sync", "orders", "remote-0", "//home/orders", mode="sync"))
    env.api.create(replica("orders-async", "orders", "remote-1", "//home/orders"))
    for name in ("orders-sync", "orders-async"):
        env.wait_ready("tablereplicas", name)
    meta = env.client("primary")
    assert meta.get("//home/orders/@type") == "replicated_table"
    replicas = meta.get("//home/orders/@replicas")
    assert sorted((r["cluster_name"], r["mode"]) for r in replicas.values()) == [("remote-0", "sync"),
                                                                               ("remote-1", "async")]
    sync_id = env.status("tablereplicas", "orders-sync")["replicaId"]
    assert env.client("remote-0").get("//home/orders/@upstream_replica_id") == sync_id
    env.wait(lambda: env.status("replicatedtables", "orders").get("syncReplicas") == ["orders-sync"],
             what="syncReplicas in status")
    meta.insert_rows("//home/orders", [{"k": i, "v": f"v{i}"} for i in range(50)])
    assert len(env.client("remote-0").select_rows("* from [//home/orders]")) == 50
    env.wait(lambda: len(env.client("remote-1").select_rows("* from [//home/orders]")) == 50, what="async rows")
    status = env.wait_ready("replicatedtables", "orders")
    assert {r["name"]: r["mode"] for r in status["replicas"]} == {"orders-sync": "sync", "orders-async": "async"}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Writable"]["status"] == "True" and conditions["Replicating"]["status"] == "True"


def test_each_engine_knows_only_the_clusters_its_tables_link_it_to(env: Env) -> None:
    """After the test above: orders on primary, replicas on remote-0 and remote-1."""
    directories = {name: env.client(name).get("//sys/clusters") for name in CLUSTERS}
    assert {name: set(d) for name, d in directories.items()} == {
        "primary": {"remote-0", "remote-1"}, "remote-0": {"primary"}, "remote-1": {"primary"}}
    assert directories["primary"]["remote-0"]["proxy_url"] == env.engines["remote-0"].url
    assert all(entry["token"] == "<hidden>" for d in directories.values() for entry in d.values())


def test_a_rogue_table_cluster_receives_no_other_clusters_token(env: Env) -> None:
    rogue = Recorder().start()
    try:
        env.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "rogue-token", "namespace": NS, "labels": CREDENTIALS}, "stringData": {"token": "rogue-0123"}})
        env.api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": "rogue"},
                        "spec": {"endpoint": rogue.url, "clusterId": 100,
                                 "credentialsSecret": {"name": "rogue-token", "namespace": NS}}})
        env.wait_ready("tableclusters", "rogue")
        time.sleep(2.5)  # one more status refresh: its writes are recorded too
        received = "\n".join(rogue.requests)
        assert rogue.wrote_directory()  # its directory was written: an empty one
        for engine in env.engines.values():
            assert engine.token and engine.token not in received
        assert "rogue" not in env.client("primary").get("//sys/clusters")
    finally:
        env.api.delete("tableclusters", "rogue", None)
        env.api.wait_for_deletion("tableclusters", "rogue", None, timeout=60)
        rogue.stop()


def test_credentials_the_operator_may_not_use_are_refused(env: Env) -> None:
    endpoint = Recorder().start()
    refused = {"outsider": ("SecretNotAllowed", "Secret elsewhere/outsider-token: the operator takes credentials "
                                                "only from Secrets in test"),
               "unlabelled": ("SecretNotFound", f"Secret {NS}/unlabelled-token (key 'token') not found; the operator "
                                                "reads only Secrets labelled reptables.io/credentials=true"),
               "binary": ("SecretInvalid", f"Secret {NS}/binary-token key 'token' is not a text token: byte 0xff "
                                           "at offset 0 is not ASCII")}
    try:
        env.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "outsider-token", "namespace": ELSEWHERE, "labels": CREDENTIALS},
            "stringData": {"token": env.engines["primary"].token}})
        env.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unlabelled-token", "namespace": NS},
                        "stringData": {"token": env.engines["primary"].token}})
        env.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "binary-token", "namespace": NS, "labels": CREDENTIALS},
            "data": {"token": base64.b64encode(b"\xff\xfe\x00binary").decode()}})
        for index, name in enumerate(refused):
            env.api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                            "spec": {"endpoint": endpoint.url, "clusterId": 110 + index, "credentialsSecret": {
                                "name": f"{name}-token", "namespace": ELSEWHERE if name == "outsider" else NS}}})
        for name, (reason, message) in refused.items():
            ready = env.wait(lambda name=name: next((c for c in env.status("tableclusters", name).get("conditions", [])
                                                     if c["type"] == "Ready" and c.get("reason") != "Unknown"), None),
                             what=f"{name}'s Ready condition")
            assert (ready["status"], ready["reason"]) == ("False", reason), ready
            assert message in ready["message"], ready
            warning = env.wait(lambda name=name, reason=reason: env.api.events(
                involved_name=name, involved_kind="TableCluster", reason=reason), what=f"{name}'s Warning event")
            assert warning[0]["type"] == "Warning" and message in warning[0]["message"]
        assert endpoint.requests == []  # nothing was sent to the endpoint of a refused TableCluster
        for name in CLUSTERS:
            assert not set(env.client(name).get("//sys/clusters")) & set(refused)
        assert env.operator.proc is not None and env.operator.proc.poll() is None
        assert "Traceback" not in env.operator.log_path.read_text(errors="replace")
    finally:
        for name in refused:
            env.api.delete("tableclusters", name, None)
            env.api.wait_for_deletion("tableclusters", name, None, timeout=60)
        endpoint.stop()


def test_the_operator_lists_and_watches_only_labelled_secrets(env: Env) -> None:
    secrets = [r for r in list(env.api.emulator.history)
               if "kopf" in r.headers.get("User-Agent", "") and r.url.path.endswith("/secrets")]
    assert secrets, "the operator never listed Secrets"
    assert {dict(r.params).get("labelSelector") for r in secrets} == {"reptables.io/credentials=true"}


def test_the_log_keeps_what_was_done_not_every_status_refresh(env: Env) -> None:
    # (the tests before ran for many of the operator's 2 s refreshes, over a dozen resources)
    lines = env.operator.log_path.read_text(errors="replace").splitlines()
    assert any("Handler '_register.<locals>.apply' succeeded." in line for line in lines)
    routine = [line for line in lines if "succeeded." in line and ("Timer '" in line or ".observe'" in line)]
    assert routine == []


def test_invalid_manifests_are_rejected_by_the_api(env: Env) -> None:
    bad_cluster = {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": "bad"},
                   "spec": {"endpoint": "http://127.0.0.1:1", "clusterId": 200, "credentialsSecret": {"name": "x"}}}
    with pytest.raises(ApiError) as err:
        env.api.create(bad_cluster)
    assert err.value.status == 422 and "clusterId" in err.value.message
    bad_options = table("bad-options", "//home/bad", tracker=True)
    bad_options["spec"]["replicatedTableOptions"]["minSyncReplicaCount"] = 3
    with pytest.raises(ApiError) as err:
        env.api.create(bad_options)
    assert err.value.status == 422
    env.api.create(table("immutable", "//home/immutable"))
    with pytest.raises(ApiError) as err:
        env.api.patch("replicatedtables", "immutable", {"spec": {"path": "//home/moved"}}, NS)
    assert err.value.status == 422 and "path" in err.value.message


def test_replica_on_unknown_cluster_is_not_ready_with_a_precise_reason(env: Env) -> None:
    env.api.create(table("lonely", "//home/lonely"))
    # created and mounted, but with no enabled replica it is not Ready (docs/crds.md, "Conditions")
    env.wait(lambda: any(c.get("reason") == "NoReplicas" and c.get("status") == "False"
                         for c in env.status("replicatedtables", "lonely").get("conditions", [])),
             what="Ready=False NoReplicas")
    assert env.status("replicatedtables", "lonely").get("tableId")
    env.api.create(replica("lonely-nowhere", "lonely", "nowhere", "//home/lonely"))
    env.wait(lambda: any(c.get("reason") == "ClusterNotFound" for c in
                         env.status("tablereplicas", "lonely-nowhere").get("conditions", [])),
             what="ClusterNotFound condition")
    assert not env.ready("tablereplicas", "lonely-nowhere")


def test_tracker_moves_collocated_sync_replicas_off_a_dead_cluster(env: Env) -> None:
    for name in ("ta", "tb"):
        env.api.create(table(name, f"//home/{name}", tracker=True))
        for cluster in ("remote-0", "remote-1"):
            env.api.create(replica(f"{name}-{cluster}", name, cluster, f"//home/{name}"))
    env.api.create({"apiVersion": API, "kind": "TableCollocation", "metadata": {"name": "pair", "namespace": NS},
                    "spec": {"tables": ["ta", "tb"]}})
    env.wait_ready("tablecollocations", "pair")

    def sync_clusters() -> dict[str, list[str]]:
        return {t: [r["cluster"] for r in env.status("replicatedtables", t).get("replicas", []) if r["mode"] == "sync"]
                for t in ("ta", "tb")}

    # once the collocation is known, both tables keep their one sync replica on the same cluster
    before = env.wait(lambda: (s := sync_clusters()) and all(len(v) == 1 for v in s.values())
                      and s["ta"] == s["tb"] and s, what="one sync replica per table, on one cluster")
    dead = before["ta"][0]
    survivor = "remote-1" if dead == "remote-0" else "remote-0"
    env.engines[dead].kill()
    try:
        env.wait(lambda: sync_clusters() == {"ta": [survivor], "tb": [survivor]}, 60, "sync replicas moved together")
        metrics = httpx.get(f"http://127.0.0.1:{env.operator.metrics_port}/metrics").text
        assert 'reptables_tracker_mode_switches_total{mode="sync",namespace="test",table="ta"}' in metrics
        env.client("primary").insert_rows("//home/ta", [{"k": 1, "v": "after failover"}])
        assert env.client(survivor).lookup_rows("//home/ta", [{"k": 1}]) == [{"k": 1, "v": "after failover"}]

        # status from the source of truth (issue 26): the dead replica's TableReplica says what the
        # meta-cluster says (async now), and that its cluster is unreachable; the table's status.tracker
        # holds the decision and the switches, named by TableReplica
        expected = f"ta-{survivor}: async -> sync; ta-{dead}: sync -> async"
        tracker = env.wait(lambda: (t := env.status("replicatedtables", "ta").get("tracker") or {})
                           .get("lastDecision") == expected and t, 30, "status.tracker.lastDecision")
        assert f"ta-{dead}: cluster {dead} unhealthy" in tracker["reason"], tracker
        assert [(s["replica"], s["mode"]) for s in tracker["recentSwitches"][:2]] == [
            (f"ta-{dead}", "async"), (f"ta-{survivor}", "sync")], tracker
        replica_status = env.wait(lambda: (s := env.status("tablereplicas", f"ta-{dead}")).get("mode") == "async"
                                  and s.get("unreachable") and s, 30, f"ta-{dead}'s mode from the meta-cluster")
        assert replica_status["unreachable"]["cluster"] == dead
        text = subprocess.run([str(Path(sys.executable).with_name("kubectl-reptables")), "--kubeconfig",
                               str(env.operator.kubeconfig), "status", "ta", "-n", NS], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COLUMNS": "250"})
        assert text.returncode == 0, text.stderr
        assert f"tracker: {expected} (" in text.stdout, text.stdout
        assert f"ta-{dead} -> async: cluster {dead} unhealthy" in text.stdout, text.stdout
        row = next(line.split() for line in text.stdout.splitlines() if line.split()[:2] == [f"ta-{dead}", dead])
        assert row[3:6] == ["async", "enabled", "(unreachable)"], text.stdout
        assert f"cluster {dead} unreachable since {replica_status['unreachable']['since']}" in text.stdout
    finally:
        env.engines[dead].start()
        env.wait(lambda: env.ready("tableclusters", dead), 60, f"{dead} back")


def test_removing_the_throttler_from_the_manifest_lifts_it_as_a_configuration_change(env: Env) -> None:
    """Issue 26: after ``replicationThrottler`` was removed, ``@replication_throttler`` stayed and the change
    was logged as DriftCorrected. The field's removal restores the engine's default (no limit), and the
    event names it as the configuration change it is."""
    doc = table("throttled", "//home/throttled")
    doc["spec"]["replicationThrottler"] = {"period": 1000, "limit": 2000}
    env.api.create(doc)
    meta = env.client("primary")
    env.wait(lambda: meta.exists("//home/throttled")
             and meta.get("//home/throttled/@").get("replication_throttler") == {"period": 1000, "limit": 2000},
             what="the throttler on the engine")
    env.wait(lambda: env.status("replicatedtables", "throttled").get("observedGeneration") == 1,
             what="the first generation reconciled")
    env.api.patch("replicatedtables", "throttled", {"spec": {"replicationThrottler": None}}, NS)
    env.wait(lambda: "replication_throttler" not in meta.get("//home/throttled/@"), 30, "the throttler lifted")
    changed = env.wait(lambda: env.api.events(NS, involved_name="throttled", reason="ConfigurationChanged"),
                       what="a ConfigurationChanged event")
    assert "spec.replicationThrottler removed (the default: no limit)" in changed[-1]["message"], changed
    assert not env.api.events(NS, involved_name="throttled", reason="DriftCorrected")


def test_deletion_honours_the_deletion_policy(env: Env) -> None:
    env.api.create(table("gone", "//home/gone", policy="Delete"))
    env.api.create(replica("gone-r", "gone", "remote-1", "//home/gone", policy="Delete"))
    env.api.create(table("kept", "//home/kept"))
    env.api.create(replica("kept-r", "kept", "remote-1", "//home/kept"))
    env.wait_ready("tablereplicas", "gone-r")
    env.wait_ready("tablereplicas", "kept-r")
    meta, remote = env.client("primary"), env.client("remote-1")
    for name in ("gone-r", "kept-r", "gone", "kept"):
        kind = "tablereplicas" if name.endswith("-r") else "replicatedtables"
        env.api.delete(kind, name, NS)
        env.api.wait_for_deletion(kind, name, NS, timeout=60)
    assert not meta.exists("//home/gone") and not remote.exists("//home/gone")
    assert meta.exists("//home/kept") and remote.exists("//home/kept")
    assert len(meta.get("//home/kept/@replicas")) == 1


def test_table_cluster_in_use_cannot_be_deleted(env: Env) -> None:
    env.api.delete("tableclusters", "remote-0", None)
    env.wait(lambda: any(c.get("reason") == "InUse" for c in env.status("tableclusters", "remote-0")["conditions"]),
             what="InUse condition")
    assert env.api.get("tableclusters", "remote-0", None)["metadata"].get("deletionTimestamp")


def test_restarted_operator_adopts_existing_objects(env: Env) -> None:
    meta = env.client("primary")
    before = dict(meta.get("//home/orders/@replicas"))
    env.operator.stop()
    env.api.patch("tablereplicas", "orders-async", {"spec": {"enabled": False}}, NS)
    env.operator.start()
    env.wait(lambda: env.status("tablereplicas", "orders-async").get("state") == "disabled", 60,
             "the change made while the operator was down")
    after = meta.get("//home/orders/@replicas")
    assert set(after) == set(before)
    env.wait_ready("tablereplicas", "orders-sync")
