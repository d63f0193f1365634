"""Metrics, the Grafana dashboard and the alert rules, against real engines and the real operator core.

Three real engine processes (tests/replication's ``ClusterSet``): a replicated table with a sync and
an async replica is written, and each engine's ``/metrics`` is scraped over HTTP with its token and
parsed with prometheus_client's parser. The operator's reconcile core and tracker loop run in this
process against the same engines (as the kopf front end drives them), and the process-global
registry the operator serves is read. Then every metric name the chart's dashboard and
PrometheusRule use must be one of the names these real scrapes expose: a renamed metric breaks this
test, not a production dashboard.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import prometheus_client
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from reptables.operator import metrics as operator_metrics
from reptables.operator.controllers.dispatch import ORDER, reconcile
from reptables.operator.controllers.world import Engines
from reptables.operator.jobs.processes import LocalLauncher
from reptables.operator.registry import CredentialPolicy, Registry
from reptables.operator.tracker.loop import TrackerLoop
from reptables.testing import WaitTimeout, wait_for
from tests.replication.conftest import ClusterSet

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "reptables"
API = "reptables.io/v1alpha1"
OPS = "reptables-system"
NS = "metrics"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(clusters: ClusterSet, name: str) -> Samples:
    """One real scrape of an engine's API-port /metrics (with its token), as sample -> value."""
    engine = clusters.engines[name]
    response = httpx.get(f"{engine.url}/metrics", headers={"Authorization": f"OAuth {engine.token}"}, timeout=10)
    assert response.status_code == 200, response.text
    return parse(response.text)


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None when there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def scrape_until(clusters: ClusterSet, check: Any, what: str, timeout: float = 30.0) -> Samples:
    """Scrape the meta-cluster until ``check(samples)`` holds; the last scrape."""
    last: list[Samples] = []

    def ok() -> bool:
        last[:] = [scrape(clusters, "primary")]
        return bool(check(last[0]))

    wait_for(ok, timeout, what)
    return last[0]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    # hyphens: the cluster names are also TableCluster (Kubernetes object) names
    cs = ClusterSet(tmp_path_factory.mktemp("metrics"), names=("primary", "remote-0", "remote-1")).start()
    try:
        yield cs
    finally:
        cs.stop()


@pytest.fixture(scope="module")
def engine_scrapes(clusters: ClusterSet) -> dict[str, Any]:
    """A replicated table with a sync replica (remote-0) and an async one (remote-1), written, then the
    async replica's cluster stopped (pushes fail) and started again; scrapes at each point."""
    path = clusters.replicated_table("//tmp/m")
    sync = clusters.replica(path, "remote-0", "//tmp/m_sync", mode="sync")
    clusters.wait_in_sync(sync)
    lagging = clusters.replica(path, "remote-1", "//tmp/m_async")
    for start in range(0, 50, 10):
        clusters.meta.insert_rows(path, [{"k": i, "v": f"v{i}"} for i in range(start, start + 10)])
    wait_for(lambda: len(clusters.rows("remote-1", "//tmp/m_async")) == 50, what="rows on the async replica")
    replicated = scrape_until(clusters, lambda s: value(s, "reptables_replication_rows_behind", replica_id=lagging)
                              == 0, "rows behind 0")
    clusters.engines["remote-1"].stop()  # the replica cluster goes down: pushes fail
    clusters.meta.insert_rows(path, [{"k": 100 + i, "v": "late"} for i in range(5)])
    failing = scrape_until(clusters, lambda s: (value(s, "reptables_replication_push_errors_total",
                                                      replica_id=lagging) or 0) > 0, "a failed push counted")
    clusters.engines["remote-1"].start()
    recovered = scrape_until(clusters, lambda s: value(s, "reptables_replication_rows_behind", replica_id=lagging)
                             == 0, "the replica caught up", 60)
    return {"path": path, "sync": sync, "async": lagging, "replicated": replicated, "failing": failing,
            "recovered": recovered, "replica_side": scrape(clusters, "remote-0")}


def test_replication_state_is_reported_per_replica_and_tablet(engine_scrapes: dict[str, Any]) -> None:
    s, path, sync, lagging = (engine_scrapes[k] for k in ("replicated", "path", "sync", "async"))
    for replica_id, cluster in ((sync, "remote-0"), (lagging, "remote-1")):
        labels = {"table": path, "replica_id": replica_id, "cluster": cluster, "tablet": "0"}
        assert value(s, "reptables_replication_lag_seconds", **labels) == 0
        assert value(s, "reptables_replication_rows_behind", **labels) == 0
    assert value(s, "reptables_replication_queue_flushed_rows", table=path, tablet="0") == 50
    assert value(s, "reptables_replication_queue_rows", table=path, tablet="0") is not None
    assert value(s, "reptables_replication_queue_trimmed_rows", table=path, tablet="0") is not None
    assert value(s, "reptables_sync_replicas", table=path) == 1
    assert value(s, "reptables_replica_info", replica_id=sync, mode="sync", state="enabled") == 1
    assert value(s, "reptables_replica_info", replica_id=lagging, mode="async", state="enabled") == 1


def test_pushes_and_rows_pushed_are_counted_for_the_async_replica(engine_scrapes: dict[str, Any]) -> None:
    s, lagging, sync = engine_scrapes["replicated"], engine_scrapes["async"], engine_scrapes["sync"]
    assert (value(s, "reptables_replication_pushes_total", replica_id=lagging, cluster="remote-1") or 0) >= 1
    assert value(s, "reptables_replication_pushed_rows_total", replica_id=lagging) == 50
    # the sync replica got its rows inside the commits, not from the replicator
    assert (value(s, "reptables_replication_pushed_rows_total", replica_id=sync) or 0) == 0
    assert value(s, "reptables_replication_push_errors_total", replica_id=lagging) is None


def test_two_phase_commits_with_the_sync_replica_are_timed(engine_scrapes: dict[str, Any]) -> None:
    s = engine_scrapes["replicated"]
    for name in ("reptables_two_phase_commit_seconds", "reptables_two_phase_prepare_seconds"):
        count = value(s, f"{name}_count", participants="sync_replicas")
        assert count is not None and count >= 5  # five inserts, each a 2PC with the sync replica
        total = value(s, f"{name}_sum", participants="sync_replicas")
        assert total is not None and 0 < total < 60
    assert value(s, "reptables_in_doubt_pending_transactions") == 0
    # the sync replica's cluster reports its own (zero) in-doubt transactions
    assert value(engine_scrapes["replica_side"], "reptables_in_doubt_pending_transactions") == 0


def test_a_failing_replica_shows_errors_rows_behind_and_lag_until_it_catches_up(
        engine_scrapes: dict[str, Any]) -> None:
    failing, recovered, lagging = engine_scrapes["failing"], engine_scrapes["recovered"], engine_scrapes["async"]
    assert (value(failing, "reptables_replication_push_errors_total", replica_id=lagging) or 0) >= 1
    assert value(failing, "reptables_replication_rows_behind", replica_id=lagging) == 5
    assert (value(failing, "reptables_replication_lag_seconds", replica_id=lagging) or 0) > 0
    # the sync replica got the five rows in their commits: nothing behind
    assert value(failing, "reptables_replication_rows_behind", replica_id=engine_scrapes["sync"]) == 0
    assert value(recovered, "reptables_replication_rows_behind", replica_id=lagging) == 0
    assert value(recovered, "reptables_replication_lag_seconds", replica_id=lagging) == 0
    assert value(recovered, "reptables_replication_pushed_rows_total", replica_id=lagging) == 55


# --- the operator ----------------------------------------------------------------------------------

def _doc(kind: str, name: str, spec: dict[str, Any], namespace: str | None = NS) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{kind}-{name}", "generation": 1,
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": API, "kind": kind, "metadata": meta, "spec": spec, "status": {}}


class Core:
    """The reconcile core driven as a front end drives it (status merged back into the bodies)."""

    def __init__(self, clusters: ClusterSet, launcher: LocalLauncher) -> None:
        self.registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
        self.registry.launcher = launcher
        self.bodies: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        for index, (name, engine) in enumerate(clusters.engines.items()):
            self.registry.upsert_secret({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": f"{name}-token", "namespace": OPS, "labels": {"reptables.io/credentials": "true"}},
                "data": {"token": base64.b64encode(engine.token.encode()).decode()}})
            self.add(_doc("TableCluster", name, {
                "endpoint": engine.url, "credentialsSecret": {"name": f"{name}-token"}, "clusterId": index}, None))

    def add(self, doc: dict[str, Any]) -> None:
        meta = doc["metadata"]
        self.bodies[(doc["kind"], meta.get("namespace"), meta["name"])] = doc
        self.registry.upsert(doc)

    def reconcile_all(self) -> None:
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                outcome = reconcile(res, self.registry.world())
                body = self.bodies[res.key]
                body["status"] = {**body.get("status", {}), **outcome.status}
                self.registry.upsert(body)

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return self.bodies[(kind, NS, name)]["status"]

    def until(self, predicate: Any, timeout: float, what: str) -> None:
        """Reconcile everything until ``predicate()`` holds (:func:`wait_for`, a pass per look)."""
        def reconciled() -> bool:
            self.reconcile_all()
            return bool(predicate())

        try:
            wait_for(reconciled, timeout, what, interval=0.2)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}: {json.dumps(self.bodies_status())[:3000]}") from None

    def bodies_status(self) -> dict[str, Any]:
        return {"/".join(str(p) for p in key): body.get("status") for key, body in self.bodies.items()}


def _table_spec(path: str, tracker: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": "primary", "path": path, "minReplicationLogTtl": "0s",
                            "schema": [{"name": "k", "type": "int64", "sortOrder": "ascending"},
                                       {"name": "v", "type": "string"}]}
    if tracker:
        spec["replicatedTableOptions"] = {"enableReplicatedTableTracker": True}
    return spec


@pytest.fixture(scope="module")
def operator_scrape(clusters: ClusterSet, tmp_path_factory: pytest.TempPathFactory) -> Samples:
    """The tracker promotes a replica; a bootstrap whose job cannot run fails; the registry is read."""
    # a job "interpreter" that exits 1 at once: the real LocalLauncher, a real failed attempt
    launcher = LocalLauncher(base_dir=tmp_path_factory.mktemp("jobs"), python="/bin/false")
    core = Core(clusters, launcher)
    try:
        core.add(_doc("ReplicatedTable", "tracked", _table_spec("//tmp/op_tracked", tracker=True)))
        core.add(_doc("TableReplica", "tracked-r0", {"table": "tracked", "cluster": "remote-0",
                                                     "replicaPath": "//tmp/op_tracked_r0"}))
        core.until(lambda: core.status("TableReplica", "tracked-r0").get("state") == "enabled", 60, "replica enabled")
        tracker = TrackerLoop(core.registry.world(), period=0.0)
        try:
            tracker.check(time.monotonic())
            tracker.check(time.monotonic())  # the first check of a replica only ends its warm-up
        finally:
            tracker.close()
        core.add(_doc("ReplicatedTable", "boot", _table_spec("//tmp/op_boot", tracker=False)))
        core.add(_doc("TableReplica", "boot-source", {"table": "boot", "cluster": "remote-0",
                                                      "replicaPath": "//tmp/op_boot_source"}))
        core.until(lambda: core.status("TableReplica", "boot-source").get("state") == "enabled", 60, "source")
        meta = clusters.meta
        meta.insert_rows("//tmp/op_boot", [{"k": i, "v": "x"} for i in range(20)], require_sync_replica=False)
        wait_for(lambda: sum(t["trimmed_row_count"] for t in meta.get("//tmp/op_boot/@tablets")) >= 20, 60,
                 "the history trimmed")
        core.add(_doc("TableReplica", "boot-target", {
            "table": "boot", "cluster": "remote-1", "replicaPath": "//tmp/op_boot_target",
            "bootstrap": {"maxAttempts": 1, "verify": False}}))
        core.until(lambda: (core.status("TableReplica", "boot-target").get("bootstrap") or {}).get("phase")
                   == "Failed", 60, "the bootstrap to fail")
    finally:
        launcher.close()
    return parse(prometheus_client.generate_latest(prometheus_client.REGISTRY).decode())


def test_operator_metrics_count_tracker_checks_and_switches(operator_scrape: Samples) -> None:
    assert (value(operator_scrape, "reptables_tracker_checks_total") or 0) >= 2
    assert (value(operator_scrape, "reptables_tracker_mode_switches_total", namespace=NS, table="tracked",
                  mode="sync") or 0) >= 1


def test_operator_metrics_follow_a_failed_bootstrap(operator_scrape: Samples) -> None:
    labels = {"namespace": NS, "replica": "boot-target"}
    assert value(operator_scrape, "reptables_bootstrap_phase", phase="Failed", **labels) == 1
    for phase in ("Pending", "Copying", "Verifying", "Enabling", "Done"):
        assert value(operator_scrape, "reptables_bootstrap_phase", phase=phase, **labels) == 0
    assert value(operator_scrape, "reptables_bootstrap_failures_total", final="true", **labels) == 1
    assert value(operator_scrape, "reptables_bootstrap_rows_copied", **labels) == 0
    # a replica that never needed a bootstrap has no bootstrap series
    assert value(operator_scrape, "reptables_bootstrap_phase", replica="boot-source", phase="Done") is None


def test_every_operator_metric_is_registered_on_the_default_registry() -> None:
    names = {f.name for f in text_string_to_metric_families(
        prometheus_client.generate_latest(prometheus_client.REGISTRY).decode())}
    for metric in (operator_metrics.TRACKER_CHECKS, operator_metrics.MODE_SWITCHES, operator_metrics.BOOTSTRAP_PHASE,
                   operator_metrics.BOOTSTRAP_ROWS_COPIED, operator_metrics.BOOTSTRAP_FAILURES,
                   operator_metrics.RECONCILE_ERRORS):
        assert metric._name in names  # noqa: SLF001 - the name the metric was registered under


# --- the dashboard and the rules use only real metric names ------------------------------------------

_NAME = re.compile(r"\breptables_[a-z0-9_]+")


def _rendered(values: dict[str, Any]) -> dict[str, str]:
    helm_python = pytest.importorskip("helm_python")
    with helm_python.Chart.load(str(CHART)) as chart:
        manifests: dict[str, str] = chart.render(values, name="rt", namespace=OPS, is_install=True)
    return manifests


def test_dashboard_and_rules_use_only_metrics_the_engine_and_operator_expose(
        engine_scrapes: dict[str, Any], operator_scrape: Samples) -> None:
    exposed = {name for scrape_ in (engine_scrapes["failing"], engine_scrapes["recovered"], operator_scrape)
               for name, _ in scrape_}
    manifests = _rendered({"metrics": {"prometheusRule": {"enabled": True}}})
    (dashboard_doc,) = [yaml.safe_load(t) for p, t in manifests.items() if p.endswith("dashboard-configmap.yaml")]
    dashboard = json.loads(dashboard_doc["data"]["reptables.json"])
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    (rule_doc,) = [yaml.safe_load(t) for p, t in manifests.items() if p.endswith("prometheusrule.yaml")]
    exprs += [rule["expr"] for group in rule_doc["spec"]["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in _NAME.findall(str(expr))}
    assert len(used) >= 15
    assert used - exposed == set(), f"not in any real scrape: {sorted(used - exposed)}"
