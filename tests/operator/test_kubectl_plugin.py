"""``kubectl reptables``: the plugin executable against the Kubernetes API emulator, and the shared view.

The plugin is run as the user runs it (the installed ``kubectl-reptables`` script as a subprocess,
with a kubeconfig) against tests/k8s/emulator.py, which validates every write against crds/ — so
the statuses written here are ones the operator could write, and the spec patches the plugin sends
are ones the API server would accept. ``build_view`` is also tested directly on dicts, since the
local runner renders the same view from its own state.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from rich.console import Console

from reptables.operator.kubectl import statusview
from tests.k8s.emulator import K8sApi

PLUGIN = Path(sys.executable).with_name("kubectl-reptables")
API = "reptables.io/v1alpha1"
T0 = "2026-11-20T10:00:00Z"


def condition(type_: str, status: str, reason: str, message: str, when: str = T0) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": when,
            "observedGeneration": 1}


def cluster(name: str, cluster_id: int, healthy: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    obj = {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
           "spec": {"endpoint": f"http://{name}.reptables-system.svc:9012", "clusterId": cluster_id,
                    "credentialsSecret": {"name": f"{name}-token", "namespace": "reptables-system"}}}
    status = {"version": "0.1.0", "healthy": healthy, "latencyMs": 3, "lastProbeTime": T0, "conditions": [
        condition("Ready", "True", "Healthy", f"{name} answers") if healthy else
        condition("Ready", "False", "Unreachable", f"{name}: connection refused")]}
    return obj, status


def table(name: str, namespace: str, tracker: bool = True) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": name, "namespace": namespace},
            "spec": {"cluster": "primary", "path": f"//home/{namespace}/{name}",
                     "schema": [{"name": "id", "type": "int64", "sortOrder": "ascending"},
                                {"name": "v", "type": "string"}],
                     "replicatedTableOptions": {"enableReplicatedTableTracker": tracker}}}


def replica(name: str, namespace: str, table_name: str, cluster_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableReplica", "metadata": {"name": name, "namespace": namespace},
            "spec": {"table": table_name, "cluster": cluster_name, "replicaPath": f"//home/{namespace}/{name}",
                     **spec}}


def replica_status(replica_id: str, mode: str, state: str, lag: int, **extra: Any) -> dict[str, Any]:
    ready = extra.pop("ready", condition("Ready", "True", "Replicating", f"{mode} replica, lag {lag} s"))
    return {"replicaId": replica_id, "mode": mode, "state": state, "lagSeconds": lag,
            "tablets": {"count": 2, "errors": 0, "maxLagSeconds": lag}, "errors": [], "observedGeneration": 1,
            "conditions": [ready], **extra}


def switch_event(name: str, namespace: str, table_name: str, message: str, when: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": API, "kind": "ReplicatedTable", "name": table_name,
                               "namespace": namespace},
            "reason": "ReplicaModeChanged", "message": message, "type": "Normal", "source": {"component": "kopf"},
            "firstTimestamp": when, "lastTimestamp": when, "count": 1}


def xdcr_group(name: str, clusters: list[str], paused: bool = False) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "XdcrGroup", "metadata": {"name": name},
            "spec": {"clusters": clusters, "paused": paused, "tables": [{"path": "//home/users", "schema": [
                {"name": "id", "type": "int64", "sortOrder": "ascending"}, {"name": "name", "type": "string"}]}]}}


def xdcr_pair(sender: str, receiver: str, state: str, **fields: Any) -> dict[str, Any]:
    """One entry of status.pairs as reconcile_xdcr._report writes it (absent keys: the engine did not answer)."""
    return {"from": sender, "to": receiver, "state": state, **fields}


# "users": both members answer, every pair connected; "west": remote-2 is down while a pause is applied
USERS_READY = "2 pairs of 2 clusters connected (1 XDCR table)"
WEST_DOWN = ("XdcrGroup west: remote-2: connection refused; primary -> remote-2: waiting_for_peer "
             "(remote-2 is unreachable); remote-2 -> primary: unknown (remote-2 did not answer: connection refused)")
XDCR_STATUSES = {
    "users": {"observedGeneration": 1, "tables": ["//home/users"], "paused": False, "conflicts": 3, "pairs": [
        xdcr_pair("remote-0", "remote-1", "connected", lagSeconds=0.4, queuedRows=2, paused=False, conflicts=3),
        xdcr_pair("remote-1", "remote-0", "connected", lagSeconds=0.0, queuedRows=0, paused=False, conflicts=0)],
        "conditions": [condition("Ready", "True", "Connected", USERS_READY),
                       condition("Degraded", "False", "AllPairsConnected", USERS_READY)]},
    "west": {"observedGeneration": 1, "tables": [], "paused": False, "conflicts": 1, "pairs": [
        xdcr_pair("primary", "remote-2", "waiting_for_peer", lagSeconds=12.5, queuedRows=40, paused=True,
                  lastError="remote-2 is unreachable"),
        xdcr_pair("remote-2", "primary", "unknown", lastError="remote-2 did not answer: connection refused",
                  conflicts=1)],
        "conditions": [condition("Ready", "False", "ClusterUnreachable", WEST_DOWN),
                       condition("Degraded", "True", "ClusterUnreachable", WEST_DOWN)]}}


BOOTSTRAP = {"phase": "Copying", "snapshotTimestamp": 1879048192000, "sourceReplicaId": "1-2-3-a", "attempts": 2,
             "rowsCopied": 12345, "jobRef": "orders-remote-2-bootstrap-2", "lastError": "executor lost",
             "nextAttemptTime": None}


def populate(api: K8sApi) -> None:
    """Three clusters (one down), shop/orders with a sync, an async and a bootstrapping replica, and more."""
    for name, cid, healthy in (("primary", 0, True), ("remote-0", 1, True), ("remote-1", 2, True),
                               ("remote-2", 3, False)):
        obj, status = cluster(name, cid, healthy)
        api.create(obj)
        api.patch_status("tableclusters", name, status)
    api.create(table("orders", "shop"))
    api.patch_status("replicatedtables", "orders", {
        "tableId": "1-0-0-1", "syncReplicas": ["orders-remote-0"], "maxLagSeconds": 42,
        "replicas": [{"name": "orders-remote-0", "cluster": "remote-0", "mode": "sync", "state": "enabled",
                      "lagSeconds": 0},
                     {"name": "orders-remote-1", "cluster": "remote-1", "mode": "async", "state": "enabled",
                      "lagSeconds": 42}],
        "tracker": {"lastDecision": "orders-remote-1: sync -> async; orders-remote-0: async -> sync",
                    "reason": "orders-remote-1 lags 700 s (threshold 600 s)", "time": "2026-11-20T10:05:00Z"},
        "conditions": [condition("Ready", "False", "Bootstrapping", "orders-remote-2 is being bootstrapped"),
                       condition("Writable", "True", "SyncReplicaReachable", "orders-remote-0 is sync")]},
        "shop")
    api.create(replica("orders-remote-0", "shop", "orders", "remote-0", mode="sync"))
    api.patch_status("tablereplicas", "orders-remote-0", replica_status("1-2-3-a", "sync", "enabled", 0), "shop")
    api.create(replica("orders-remote-1", "shop", "orders", "remote-1"))
    api.patch_status("tablereplicas", "orders-remote-1", replica_status("1-2-3-b", "async", "enabled", 42), "shop")
    api.create(replica("orders-remote-2", "shop", "orders", "remote-2"))
    api.patch_status("tablereplicas", "orders-remote-2", replica_status(
        "1-2-3-c", "async", "disabled", 0, bootstrap=BOOTSTRAP,
        ready=condition("Ready", "False", "Bootstrapping", "bootstrap Copying: attempt 2 of 3")), "shop")
    api.create(table("customers", "shop", tracker=False))
    api.patch_status("replicatedtables", "customers", {
        "syncReplicas": [], "maxLagSeconds": 3,
        "conditions": [condition("Ready", "True", "Replicating", "every enabled replica replicates")]}, "shop")
    api.create(replica("customers-remote-1", "shop", "customers", "remote-1"))
    api.patch_status("tablereplicas", "customers-remote-1", replica_status(
        "1-2-3-d", "async", "enabled", 3, errors=[{"code": 1, "message": "replica table is unmounted"}],
        ready=condition("Ready", "False", "ReplicationError", "replica table is unmounted")), "shop")
    api.create({"apiVersion": API, "kind": "TableCollocation", "metadata": {"name": "shop", "namespace": "shop"},
                "spec": {"tables": ["orders", "customers"], "preferredSyncReplicaClusters": ["remote-0"]}})
    # the tracker's switches, as kopf posts them (the older one first), and an unrelated event
    api.create(switch_event("orders.1", "shop", "orders", "replica 1-2-3-b is now sync: orders-remote-0 is "
                            "unhealthy (cluster remote-0 unreachable)", "2026-11-20T09:00:00Z"))
    api.create(switch_event("orders.2", "shop", "orders", "replica 1-2-3-b is now async: orders-remote-1 lags "
                            "700 s (threshold 600 s)", "2026-11-20T10:05:00Z"))
    other = switch_event("orders.3", "shop", "orders", "copying", "2026-11-20T10:06:00Z")
    api.create({**other, "reason": "Bootstrapping"})
    # a second namespace: its objects appear with -A only; "lab" is where the spec edits happen
    api.create(table("events", "audit", tracker=False))
    api.create(table("scratch", "lab"))
    api.create(replica("scratch-remote-1", "lab", "scratch", "remote-1"))
    # XDCR groups (cluster-scoped), with the status the operator writes
    api.create(xdcr_group("users", ["remote-0", "remote-1"]))
    api.create(xdcr_group("west", ["primary", "remote-2"], paused=True))
    for name, status in XDCR_STATUSES.items():
        api.patch_status("xdcrgroups", name, status)


@pytest.fixture(scope="module")
def api() -> Iterator[K8sApi]:
    with K8sApi(namespaces=("default", "shop", "audit", "lab")) as emulator:
        populate(emulator)
        yield emulator
        assert not emulator.server_errors()


@pytest.fixture(scope="module")
def kubeconfig(api: K8sApi, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return api.kubeconfig(tmp_path_factory.mktemp("kube") / "config", namespace="shop")


def run(kubeconfig: Path | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "COLUMNS")}
    command = [str(PLUGIN), *(["--kubeconfig", str(kubeconfig)] if kubeconfig else []), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


def ok(kubeconfig: Path, *args: str) -> str:
    result = run(kubeconfig, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def line_of(text: str, first_word: str) -> str:
    return next(line for line in text.splitlines() if line.split() and line.split()[0] == first_word)


# --- status -------------------------------------------------------------------------------------


def test_status_shows_each_table_with_its_replicas_lag_and_bootstrap(kubeconfig: Path) -> None:
    out = ok(kubeconfig, "status")
    assert "ReplicatedTable shop/orders  //home/shop/orders on primary  Ready=False  sync: orders-remote-0" in out
    assert "Ready=False Bootstrapping: orders-remote-2 is being bootstrapped" in out  # a condition not True
    assert "Writable=True" not in out  # True conditions are not repeated
    assert "tracker: orders-remote-1: sync -> async; orders-remote-0: async -> sync (orders-remote-1 lags 700 s" in out
    assert line_of(out, "orders-remote-0").split()[:6] == ["orders-remote-0", "remote-0", "//home/shop/orders-remote-0",
                                                          "sync", "enabled", "0s"]
    assert line_of(out, "orders-remote-1").split()[3:6] == ["async", "enabled", "42s"]
    remote2 = line_of(out, "orders-remote-2")
    assert "disabled" in remote2 and "Copying, attempt 2/3, 12,345 rows" in remote2
    assert "bootstrap orders-remote-2: Copying, attempt 2/3, 12,345 rows, job orders-remote-2-bootstrap-2, " \
           "last error: executor lost" in out
    customers = line_of(out, "customers-remote-1")
    assert "3s" in customers and "replica table is unmounted" in customers
    assert "ReplicatedTable shop/customers" in out
    assert "events" not in out.split("TableClusters")[0]  # audit/events lives in another namespace
    clusters = out.split("TableClusters")[1]
    assert line_of(clusters, "remote-2").split()[:5] == ["remote-2", "http://remote-2.reptables-system.svc:9012",
                                                         "3", "no", "0.1.0"]
    assert "remote-2: connection refused" in clusters
    assert "token" not in out  # Secret references are not shown, let alone Secrets


def section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def test_status_shows_each_xdcr_group_with_its_pairs_lag_and_conflicts(kubeconfig: Path) -> None:
    out = ok(kubeconfig, "status")
    assert out.index("ReplicatedTable shop/orders") < out.index("XdcrGroup users") < out.index("XdcrGroup west") \
        < out.index("TableClusters")
    # cluster-scoped: the name alone, like a TableCluster
    assert "XdcrGroup users  clusters: remote-0, remote-1  tables: //home/users  Ready=True  conflicts: 3\n" in out
    users = section(out, "XdcrGroup users", "XdcrGroup west")
    assert line_of(users, "From").split() == ["From", "To", "State", "Lag", "Queued", "rows", "Conflicts", "Paused",
                                              "Last", "error"]
    assert line_of(users, "remote-0").split() == ["remote-0", "remote-1", "connected", "0.4s", "2", "3", "no", "-"]
    assert line_of(users, "remote-1").split() == ["remote-1", "remote-0", "connected", "0s", "0", "0", "no", "-"]
    assert "!" not in users  # Ready=True, and Degraded=False is not a problem
    west = section(out, "XdcrGroup west", "TableClusters")
    assert west.startswith("  clusters: primary, remote-2  tables: //home/users  Ready=False  conflicts: 1  pausing\n")
    assert f"! Ready=False ClusterUnreachable: {WEST_DOWN}" in " ".join(west.split())  # long: may wrap
    assert "Degraded" not in west  # it repeats Ready's message
    assert line_of(west, "primary").split() == ["primary", "remote-2", "waiting_for_peer", "12.5s", "40", "-", "yes",
                                                "remote-2", "is", "unreachable"]
    assert line_of(west, "remote-2").split()[:7] == ["remote-2", "primary", "unknown", "-", "-", "1", "-"]
    assert "remote-2 did not answer: connection refused" in line_of(west, "remote-2")


def test_status_json_lists_xdcr_groups_as_the_operator_reports_them(kubeconfig: Path) -> None:
    view = json.loads(ok(kubeconfig, "status", "-o", "json"))
    users, west = view["xdcrGroups"]
    assert "namespace" not in users
    assert {k: users[k] for k in ("name", "clusters", "tables", "tablesOnEveryCluster", "paused", "specPaused",
                                  "conflicts", "ready", "reset")} == {
        "name": "users", "clusters": ["remote-0", "remote-1"], "tables": ["//home/users"],
        "tablesOnEveryCluster": ["//home/users"], "paused": False, "specPaused": False, "conflicts": 3,
        "ready": "True", "reset": None}
    assert users["pairs"][0] == {"from": "remote-0", "to": "remote-1", "state": "connected", "lagSeconds": 0.4,
                                 "queuedRows": 2, "conflicts": 3, "paused": False, "lastError": None}
    assert [c["type"] for c in users["conditions"]] == ["Ready", "Degraded"]
    assert west["ready"] == "False" and west["specPaused"] is True and west["paused"] is False
    assert [(p["from"], p["to"], p["lagSeconds"], p["conflicts"]) for p in west["pairs"]] == [
        ("primary", "remote-2", 12.5, None), ("remote-2", "primary", None, 1)]
    # cluster-scoped: the same groups whatever the namespace; none for one ReplicatedTable
    other = json.loads(ok(kubeconfig, "status", "-n", "audit", "-o", "json"))
    assert other["xdcrGroups"] == view["xdcrGroups"]
    assert json.loads(ok(kubeconfig, "status", "orders", "-o", "json"))["xdcrGroups"] == []


def test_status_without_the_xdcr_group_crd_warns_and_shows_the_rest(tmp_path: Path) -> None:
    """An install older than XdcrGroup (its CRD absent): the status view still works, with a warning."""
    crds = Path(__file__).resolve().parents[2] / "crds"
    older = [f for f in sorted(crds.glob("*.yaml")) if "xdcrgroups" not in f.name]
    with K8sApi(crd_dirs=[], crd_files=older, namespaces=("shop",)) as api:
        obj, status = cluster("primary", 0)
        api.create(obj)
        api.patch_status("tableclusters", "primary", status)
        api.create(table("orders", "shop"))
        result = run(api.kubeconfig(tmp_path / "kubeconfig", namespace="shop"), "status", "-o", "json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    assert [t["name"] for t in view["tables"]] == ["orders"] and view["xdcrGroups"] == []
    assert result.stderr.startswith("warning: cannot list xdcrgroups.reptables.io (")
    assert result.stderr.rstrip().endswith("XdcrGroups are not shown")


def test_status_json_and_yaml_carry_the_same_view(kubeconfig: Path) -> None:
    view = json.loads(ok(kubeconfig, "status", "-o", "json"))
    assert [t["name"] for t in view["tables"]] == ["customers", "orders"]
    orders = view["tables"][1]
    assert orders["namespace"] == "shop" and orders["cluster"] == "primary" and orders["path"] == "//home/shop/orders"
    assert orders["syncReplicas"] == ["orders-remote-0"] and orders["ready"] == "False"
    assert orders["tracker"]["reason"] == "orders-remote-1 lags 700 s (threshold 600 s)"
    by_name = {r["name"]: r for r in orders["replicas"]}
    assert {k: by_name["orders-remote-1"][k] for k in ("cluster", "replicaPath", "mode", "state", "lagSeconds",
                                                       "rowsBehind", "lastError", "bootstrap")} == {
        "cluster": "remote-1", "replicaPath": "//home/shop/orders-remote-1", "mode": "async", "state": "enabled",
        "lagSeconds": 42, "rowsBehind": None, "lastError": None, "bootstrap": None}
    boot = by_name["orders-remote-2"]["bootstrap"]
    assert {k: boot[k] for k in ("phase", "rowsCopied", "attempts", "jobRef", "lastError")} == {
        "phase": "Copying", "rowsCopied": 12345, "attempts": 2, "jobRef": "orders-remote-2-bootstrap-2",
        "lastError": "executor lost"}
    assert [c["name"] for c in view["clusters"]] == ["primary", "remote-0", "remote-1", "remote-2"]
    assert view["clusters"][3]["healthy"] is False and view["clusters"][0]["version"] == "0.1.0"
    assert view["collocations"][0]["tables"] == ["customers", "orders"]
    assert [(s["replica"], s["mode"]) for s in view["trackerSwitches"]] == [  # newest first, ids named
        ("orders-remote-1", "async"), ("orders-remote-1", "sync")]
    assert view["trackerSwitches"][0]["reason"] == "orders-remote-1 lags 700 s (threshold 600 s)"
    assert yaml.safe_load(ok(kubeconfig, "status", "-o", "yaml")) == view


def test_status_of_one_table(kubeconfig: Path) -> None:
    view = json.loads(ok(kubeconfig, "status", "customers", "-o", "json"))
    assert [t["name"] for t in view["tables"]] == ["customers"]
    assert [c["name"] for c in view["clusters"]] == ["primary", "remote-1"]  # the clusters it uses
    assert view["trackerSwitches"] == []  # the switches were orders'
    out = ok(kubeconfig, "status", "shop/orders")
    assert "shop/orders" in out and "customers" not in out.split("TableClusters")[0]


def test_all_namespaces_and_the_namespace_flag_after_the_command(kubeconfig: Path) -> None:
    view = json.loads(ok(kubeconfig, "status", "-A", "-o", "json"))
    assert [(t["namespace"], t["name"]) for t in view["tables"]] == [
        ("audit", "events"), ("lab", "scratch"), ("shop", "customers"), ("shop", "orders")]
    view = json.loads(ok(kubeconfig, "status", "-n", "audit", "-o", "json"))
    assert [t["name"] for t in view["tables"]] == ["events"]


def test_unknown_table_is_one_clear_line(kubeconfig: Path) -> None:
    result = run(kubeconfig, "status", "invoices")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: ReplicatedTable 'invoices' not found"
    assert result.stdout == ""


# --- tracker and bootstrap ----------------------------------------------------------------------


def test_tracker_lists_switches_newest_first_with_the_reason(kubeconfig: Path) -> None:
    out = ok(kubeconfig, "tracker")
    newest = out.index("orders-remote-1 lags 700 s (threshold 600 s)", out.index("Recent switches"))
    older = out.index("orders-remote-0 is unhealthy (cluster remote-0 unreachable)")
    assert newest < older
    switch = line_of(out, "2026-11-20T10:05:00Z").split()
    assert switch[:4] == ["2026-11-20T10:05:00Z", "shop/orders", "orders-remote-1", "async"]  # id -> replica name
    assert "Bootstrapping" not in out and "copying" not in out  # other events are not switches
    tables = line_of(out, "shop/orders").split()
    assert tables[1:3] == ["enabled", "orders-remote-0"]
    assert line_of(out, "shop/customers").split()[1] == "disabled"


def test_bootstrap_shows_phase_rows_job_and_error(kubeconfig: Path) -> None:
    out = ok(kubeconfig, "bootstrap", "orders/orders-remote-2")
    fields = {line.split("  ")[0].strip(): line.split("  ", 1)[1].strip() for line in out.splitlines()[1:]
              if "  " in line}
    assert out.splitlines()[0] == "TableReplica shop/orders-remote-2 of orders on remote-2"
    assert fields["Phase"] == "Copying" and fields["Rows copied"] == "12,345"
    assert fields["Job"] == "orders-remote-2-bootstrap-2" and fields["Last error"] == "executor lost"
    assert fields["Attempts"] == "2 of 3" and fields["Snapshot timestamp"] == "1879048192000"
    data = json.loads(ok(kubeconfig, "bootstrap", "orders-remote-2", "-o", "json"))
    assert data["bootstrap"]["phase"] == "Copying" and data["table"] == "orders"
    out = ok(kubeconfig, "bootstrap", "orders/orders-remote-0")
    assert "not bootstrapped" in out


# --- spec edits ---------------------------------------------------------------------------------


def _writes(api: K8sApi, since: int) -> list[dict[str, Any]]:
    return [r for r in api.request_log()[since:] if r["method"] not in ("GET",)]


def test_promote_disable_enable_patch_only_the_replica_spec(api: K8sApi, kubeconfig: Path) -> None:
    before = api.get("tablereplicas", "scratch-remote-1", "lab")
    mark = len(api.request_log())
    out = ok(kubeconfig, "-n", "lab", "promote", "scratch-remote-1")
    assert "tablereplica.reptables.io/scratch-remote-1 patched: spec.mode: \"sync\"" in out
    after = api.get("tablereplicas", "scratch-remote-1", "lab")
    assert after["spec"] == {**before["spec"], "mode": "sync"}
    assert after.get("status") == before.get("status")
    writes = _writes(api, mark)
    assert [(w["method"], w["path"]) for w in writes] == [
        ("PATCH", "/apis/reptables.io/v1alpha1/namespaces/lab/tablereplicas/scratch-remote-1")]
    assert writes[0]["data"] == {"spec": {"mode": "sync"}}
    # the table's tracker owns the mode: the user is told so
    result = run(kubeconfig, "promote", "scratch-remote-1", "-n", "lab")
    assert result.returncode == 0 and "unchanged" in result.stdout

    mark = len(api.request_log())
    ok(kubeconfig, "disable", "scratch-remote-1", "--namespace", "lab")
    assert api.get("tablereplicas", "scratch-remote-1", "lab")["spec"] == {**before["spec"], "mode": "sync",
                                                                            "enabled": False}
    assert [w["data"] for w in _writes(api, mark)] == [{"spec": {"enabled": False}}]
    ok(kubeconfig, "enable", "scratch-remote-1", "-n", "lab")
    assert api.get("tablereplicas", "scratch-remote-1", "lab")["spec"]["enabled"] is True
    # every request carried the plugin's user agent (kmock's request objects keep the headers)
    assert api.emulator is not None
    agents = {r.headers.get("User-Agent") for r in list(api.emulator.history)[mark:]}
    assert {a for a in agents if not str(a).startswith("python-httpx")} == {"kubectl-reptables"}  # not ours


def test_promote_tells_when_the_tracker_owns_the_mode(api: K8sApi, kubeconfig: Path) -> None:
    api.create(replica("scratch-remote-0", "lab", "scratch", "remote-0"))
    result = run(kubeconfig, "promote", "scratch-remote-0", "-n", "lab")
    assert result.returncode == 0
    assert "tracker of ReplicatedTable lab/scratch owns this replica's mode" in result.stderr


def test_edits_of_a_missing_replica_fail_clearly(kubeconfig: Path) -> None:
    result = run(kubeconfig, "disable", "nope")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: TableReplica shop/nope not found"


# --- failures -----------------------------------------------------------------------------------


def test_unreachable_api_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "gone",
              "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
              "users": [{"name": "u", "user": {"token": "secret-token-123"}}],
              "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    result = run(path, "status")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the Kubernetes API at "
                                                   f"http://127.0.0.1:{port}: "), result.stderr
    assert "refused" in lines[0] and "secret-token-123" not in result.stderr


def test_kubeconfig_from_the_environment_and_a_missing_one(kubeconfig: Path, tmp_path: Path) -> None:
    result = run(None, "status", "customers", "-o", "json", env={"KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 0 and json.loads(result.stdout)["tables"][0]["name"] == "customers"
    result = run(tmp_path / "missing", "status")
    assert result.returncode == 1 and result.stderr.startswith("error: cannot load the Kubernetes configuration")
    assert "Traceback" not in result.stderr


def test_forbidden_is_one_clear_line(api: K8sApi, tmp_path: Path) -> None:
    """An RBAC refusal: the emulator answers this namespace's list with the API server's 403 Status."""
    assert api.emulator is not None
    message = ('replicatedtables.reptables.io is forbidden: User "alice" cannot list resource "replicatedtables" '
               'in API group "reptables.io" in the namespace "vault"')
    for plural in ("replicatedtables", "tablereplicas", "tablecollocations"):
        api.emulator[kmock.path(f"/apis/reptables.io/v1alpha1/namespaces/vault/{plural}")] << kmock.Response(
            status=403, payload={"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                                 "code": 403, "message": message})
    result = run(api.kubeconfig(tmp_path / "kubeconfig", namespace="vault"), "status")
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: forbidden by the Kubernetes API at {api.url}: {message}"


# --- the view, on dicts -------------------------------------------------------------------------


def _objects() -> list[dict[str, Any]]:
    orders = table("orders", "shop")
    orders["status"] = {"syncReplicas": ["r0"], "replicas": [
        {"name": "r0", "cluster": "remote-0", "mode": "sync", "state": "enabled", "lagSeconds": 0},
        {"name": "ghost", "cluster": "remote-9", "mode": "async", "state": "enabled", "lagSeconds": 7}]}
    r0 = replica("r0", "shop", "orders", "remote-0")
    r0["status"] = replica_status("id-0", "sync", "enabled", 0, tablets={"count": 1, "rowsBehind": 5})
    stray = replica("stray", "shop", "invoices", "remote-1")
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop"}}
    east = {**xdcr_group("east", ["remote-1", "remote-0"]), "spec": {"clusters": ["remote-1", "remote-0"]}}
    return [other, r0, orders, stray, table("orders", "staging"), cluster("remote-0", 1)[0], east]


def test_build_view_merges_replica_objects_with_the_table_summary() -> None:
    view = statusview.build_view(_objects())
    assert [(t["namespace"], t["name"]) for t in view["tables"]] == [("shop", "orders"), ("staging", "orders")]
    reps = {r["name"]: r for r in view["tables"][0]["replicas"]}
    assert sorted(reps) == ["ghost", "r0"]
    assert reps["r0"]["rowsBehind"] == 5 and reps["r0"]["replicaPath"] == "//home/shop/r0"
    assert reps["ghost"]["lagSeconds"] == 7 and reps["ghost"]["replicaPath"] is None  # only in the summary
    assert view["orphanReplicas"] == [{"namespace": "shop", "name": "stray", "table": "invoices"}]
    assert json.loads(json.dumps(view)) == view
    assert statusview.build_view(list(reversed(_objects()))) == view  # deterministic
    assert [g["name"] for g in view["xdcrGroups"]] == ["east"]


def test_render_a_new_xdcr_group_before_its_first_status() -> None:
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    statusview.render(statusview.build_view([_objects()[-1]]), console)
    text = console.export_text()
    assert "XdcrGroup east  clusters: remote-0, remote-1  tables: -  Ready=Unknown  conflicts: -\n" in text
    assert "no pairs reported yet" in text and "No reptables objects found" not in text


def test_build_view_filters_one_table_and_refuses_unknown_or_ambiguous_names() -> None:
    view = statusview.build_view(_objects(), table="shop/orders")
    assert [t["namespace"] for t in view["tables"]] == ["shop"] and [c["name"] for c in view["clusters"]] == [
        "remote-0"]
    with pytest.raises(ValueError, match="ReplicatedTable 'invoices' not found"):
        statusview.build_view(_objects(), table="invoices")
    with pytest.raises(ValueError, match=r"'orders' is ambiguous \(shop/orders, staging/orders\)"):
        statusview.build_view(_objects(), table="orders")


def test_build_view_reads_switch_events_newest_first() -> None:
    events = [switch_event("a", "shop", "orders", "replica id-0 is now async: r0 lags", "2026-11-20T09:00:00Z"),
              switch_event("b", "shop", "orders", "replica id-0 is now sync: r0 caught up", "2026-11-20T11:00:00Z"),
              {**switch_event("c", "shop", "orders", "x", "2026-11-20T12:00:00Z"), "reason": "Other"},
              switch_event("d", "staging", "orders", "something else happened", "2026-11-20T10:00:00Z")]
    switches = statusview.build_view(_objects(), events)["trackerSwitches"]
    assert [(s["replica"], s["mode"], s["reason"]) for s in switches] == [
        ("r0", "sync", "r0 caught up"), (None, None, "something else happened"), ("r0", "async", "r0 lags")]
    assert len(statusview.build_view(_objects(), events, table="staging/orders")["trackerSwitches"]) == 1


def test_a_replicas_mode_is_its_own_status_never_the_tables_older_summary() -> None:
    """Issue 26: the view fell back to the table's ``status.replicas`` when a TableReplica's status left
    the mode out, so a replica whose meta-cluster is unreachable showed the last mode seen. A
    TableReplica that exists is shown from its own status; the summary is for one whose object is gone."""
    orders = table("orders", "shop")
    orders["status"] = {"syncReplicas": [], "replicas": [
        {"name": "orders-remote-0", "cluster": "remote-0", "mode": "sync", "state": "enabled", "lagSeconds": 0},
        {"name": "gone", "cluster": "remote-1", "mode": "async", "state": "enabled", "lagSeconds": 4}]}
    rep = replica("orders-remote-0", "shop", "orders", "remote-0")
    rep["status"] = {"replicaId": "1-2-3-a", "unreachable": {"cluster": "primary", "since": T0, "message": "refused"},
                     "conditions": [condition("Ready", "False", "ClusterUnreachable",
                                              f"meta-cluster primary unreachable since {T0}: refused")]}
    view = statusview.build_view([orders, rep])
    replicas = {r["name"]: r for r in view["tables"][0]["replicas"]}
    assert (replicas["orders-remote-0"]["mode"], replicas["orders-remote-0"]["state"]) == (None, None)
    assert replicas["orders-remote-0"]["unreachable"] == {"cluster": "primary", "since": T0, "message": "refused"}
    assert (replicas["gone"]["mode"], replicas["gone"]["lagSeconds"]) == ("async", 4)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    statusview.render(view, console)
    row = next(line.split() for line in console.export_text().splitlines() if line.startswith("orders-remote-0 "))
    assert row[3:6] == ["-", "-", "(unreachable)"], row


def test_render_shows_the_trackers_latest_check_recent_switches_and_events() -> None:
    orders = table("orders", "shop")
    switch = {"replica": "orders-remote-1", "replicaId": "1-2-3-b", "cluster": "remote-1", "mode": "sync",
              "reason": "promoted to reach max_sync_replica_count 1"}
    orders["status"] = {"tracker": {
        "lastDecision": "orders-remote-1: async -> sync", "reason": "orders-remote-1: promoted", "time": T0,
        "summary": "sync: orders-remote-1@remote-1 (min 1, max 1); no changes",
        "recentSwitches": [{**switch, "time": T0}, {**switch, "mode": "async", "time": "2026-11-20T09:00:00Z",
                                                    "reason": "cluster remote-1 unhealthy"}]}}
    events = [{"type": "Normal", "reason": "Created", "message": "made", "lastTimestamp": T0,
               "involvedObject": {"kind": "ReplicatedTable", "namespace": "shop", "name": "orders"}},
              {"type": "Warning", "reason": "ReplicaClusterUnavailable", "message": "down", "lastTimestamp": T0,
               "involvedObject": {"kind": "TableReplica", "namespace": "shop", "name": "orders-remote-0"}}]
    view = statusview.build_view([orders], events)
    assert [e["reason"] for e in view["recentEvents"]] == ["ReplicaClusterUnavailable", "Created"]  # newest first
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    statusview.render(view, console)
    statusview.render_tracker(view, console)
    text = console.export_text()
    assert f"tracker: orders-remote-1: async -> sync (orders-remote-1: promoted) at {T0}" in text
    assert "tracker now: sync: orders-remote-1@remote-1 (min 1, max 1); no changes" in text
    assert f"    {T0}  orders-remote-1 -> sync: promoted to reach max_sync_replica_count 1" in text
    assert "2026-11-20T09:00:00Z  orders-remote-1 -> async: cluster remote-1 unhealthy" in text
    assert "Recent events (newest first)" in text and "ReplicaClusterUnavailable" in text
    # the switch Events are gone (Kubernetes keeps them an hour): kubectl reptables tracker shows the status' ones
    assert "Recent switches (status.tracker.recentSwitches, newest first)" in text


def test_render_is_plain_text_for_a_file() -> None:
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    view = statusview.build_view(_objects())
    statusview.render(view, console)
    statusview.render_tracker(view, console)
    text = console.export_text()
    assert "ReplicatedTable shop/orders" in text and "ghost" in text
    assert "TableReplica shop/stray: its ReplicatedTable 'invoices' does not exist" in text
    with pytest.raises(ValueError, match="TableReplica 'nope' not found"):
        statusview.render_bootstrap(view, console, "nope")


# --- names that hold terminal escape sequences ----------------------------------------------------

#: a valid table path (any character but whitespace) that would recolour the terminal, retitle its
#: window, close a rich markup tag that was never opened, and reverse the text after it
HOSTILE_PATH = "//tmp/a\x1b[31mred\x1b]0;title\x07[/x]\u202eoops"
HOSTILE_SHOWN = "//tmp/a\\x1b[31mred\\x1b]0;title\\x07[/x]\\u202eoops"


def _hostile_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A table on the hostile path whose status, replica, cluster and tracker events quote it, as the
    operator writes them when the engine's errors name the table."""
    orders = table("orders", "shop")
    orders["spec"]["path"] = HOSTILE_PATH
    orders["status"] = {
        "syncReplicas": ["orders-remote-0"], "maxLagSeconds": 1,
        "tracker": {"lastDecision": "orders-remote-0: async -> sync", "reason": f"{HOSTILE_PATH} lags",
                    "time": T0},
        "conditions": [condition("Ready", "False", "CreateFailed", f"cannot create {HOSTILE_PATH}: \x1b[2J")]}
    rep = replica("orders-remote-0", "shop", "orders", "remote-0", replicaPath=HOSTILE_PATH)
    rep["status"] = replica_status(
        "1-2-3-a", "sync", "enabled", 0, errors=[{"code": 1, "message": f"replica table {HOSTILE_PATH} is unmounted"}],
        bootstrap={**BOOTSTRAP, "lastError": f"copy of {HOSTILE_PATH} failed"},
        ready=condition("Ready", "False", "ReplicationError", f"replica table {HOSTILE_PATH} is unmounted"))
    remote, status = cluster("remote-0", 1, healthy=False)
    status["conditions"][0]["message"] = f"remote-0: cannot open {HOSTILE_PATH}"
    events = [switch_event("orders.9", "shop", "orders", f"replica 1-2-3-a is now sync: {HOSTILE_PATH} caught up",
                           T0)]
    return [orders, rep, {**remote, "status": status}], events


def test_text_views_show_escape_sequences_in_names_as_text() -> None:
    objects, events = _hostile_objects()
    view = statusview.build_view(objects, events)
    out = io.StringIO()
    console = Console(file=out, width=300, force_terminal=False)
    statusview.render(view, console)
    statusview.render_tracker(view, console)
    statusview.render_bootstrap(view, console, "orders/orders-remote-0")
    text = out.getvalue()
    for control in ("\x1b", "\x07", "\u202e"):
        assert control not in text
    assert f"ReplicatedTable shop/orders  {HOSTILE_SHOWN} on primary" in text
    assert f"CreateFailed: cannot create {HOSTILE_SHOWN}: \\x1b[2J" in text
    assert f"Last error          copy of {HOSTILE_SHOWN} failed" in text  # the bootstrap view
    assert f"remote-0: cannot open {HOSTILE_SHOWN}" in text  # the clusters' table
    assert f"{HOSTILE_SHOWN} caught up" in text  # the tracker's switches


def test_json_view_keeps_names_exact() -> None:
    objects, events = _hostile_objects()
    view = statusview.build_view(objects, events)
    assert json.loads(json.dumps(view)) == view
    assert view["tables"][0]["path"] == HOSTILE_PATH
    assert view["tables"][0]["replicas"][0]["replicaPath"] == HOSTILE_PATH


def test_a_failure_naming_what_the_user_typed_is_one_escaped_line(kubeconfig: Path) -> None:
    result = run(kubeconfig, "promote", "ghost\x1b]0;pwned\x07")
    assert result.returncode == 1
    assert result.stderr == "error: TableReplica shop/ghost\\x1b]0;pwned\\x07 not found\n"
