"""The tracker and the replicas it does not own, on real engines (docs/operations.md, "Replicas the
tracker does not own"): the reconcile core and the tracker loop the operator runs, four engines.

A replica whose ``enableReplicatedTableTracker`` is false keeps the mode its TableReplica sets, and
a sync one holds one of the table's ``maxSyncReplicaCount`` slots: the tracker never makes the
table's sync count exceed the maximum, and never splits a collocation. Issue 26 found the opposite:
with two replicas managed by hand (one sync) the tracker promoted the third.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.process import start_all
from reptables.operator.controllers.world import ENGINE_TIMEOUT, Engines
from reptables.operator.registry import CredentialPolicy, Registry
from reptables.operator.tracker.decision import ClusterHealth
from reptables.operator.tracker.loop import TrackerLoop
from reptables.testing import wait_for
from tests.harness import EngineProcess
from tests.operator.test_bootstrap import API, NS, OPS, Operator, cluster, replica, secret, table

NAMES = ("meta", "c0", "c1", "c2")
LIVE = ("enabled", "enabling")  # a sync replica in these states takes part in every commit


class TrackedOperator:
    """The reconcile core plus the tracker, driven pass by pass; every check's outcome is kept."""

    def __init__(self, op: Operator) -> None:
        self.op = op
        self.tracker = TrackerLoop(op.registry.world(), period=0.0)
        #: after each check: table name -> clusters of its live sync replicas, as the meta-cluster says
        self.after_checks: list[dict[str, list[str]]] = []
        self.tables: list[str] = []

    def sync_clusters(self, name: str) -> list[str]:
        with self.op.client("meta") as meta:
            replicas = meta.get(f"//home/{name}/@replicas") or {}
        return sorted(r["cluster_name"] for r in replicas.values() if r["mode"] == "sync" and r["state"] in LIVE)

    def step(self) -> None:
        self.op.reconcile_all()
        self.tracker.check(time.monotonic())
        self.after_checks.append({name: self.sync_clusters(name) for name in self.tables})

    def until(self, predicate: Any, timeout: float, what: str) -> None:
        def stepped() -> bool:
            self.step()
            return bool(predicate())

        wait_for(stepped, timeout, what, interval=0.3)

    def edit(self, name: str, **spec: Any) -> None:
        """A spec edit of a TableReplica, as ``kubectl patch`` (or ``kubectl reptables promote``) makes it."""
        body = self.op.bodies[("TableReplica", NS, name)]
        body["spec"].update(spec)
        body["metadata"]["generation"] += 1
        self.op.registry.upsert(body)

    def mode(self, name: str) -> str | None:
        return self.op.replica(name).status.get("mode")


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackedOperator]:
    base: Path = tmp_path_factory.mktemp("op-tracker-ownership")
    engines: dict[str, EngineProcess] = {}
    registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
    driver: TrackedOperator | None = None
    try:
        for name in NAMES:
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789abcdef")
        start_all(engines.values())
        op = Operator(engines, registry, launcher=None)  # type: ignore[arg-type]  # no jobs here
        for index, name in enumerate(NAMES):
            registry.upsert_secret(secret(f"{name}-token", engines[name].read_token()))
            op.add(cluster(name, engines[name].url, index))
        driver = TrackedOperator(op)
        yield driver
    finally:
        if driver is not None:
            driver.tracker.close()
        for engine in engines.values():
            engine.stop()


def tracked_table(name: str, **options: Any) -> dict[str, Any]:
    doc = table(name)
    doc["spec"]["replicatedTableOptions"] = {"enableReplicatedTableTracker": True, **options}
    return doc


def pinned(name: str, table_name: str, on: str, mode: str) -> dict[str, Any]:
    doc = replica(name, table_name, on)
    doc["spec"].update({"mode": mode, "enableReplicatedTableTracker": False})
    return doc


def test_the_tracker_counts_a_sync_replica_managed_by_hand_and_promotes_nothing(tracked: TrackedOperator) -> None:
    """Issue 26: two replicas managed by hand (tracker off on them, one sync), maxSyncReplicaCount 1.
    The tracker owns the third replica but has no sync slot to give it; it takes the slot when the
    hand-managed replicas are both async."""
    op = tracked.op
    tracked.tables.append("manual")
    op.add(tracked_table("manual", minSyncReplicaCount=1, maxSyncReplicaCount=1))
    op.add(pinned("manual-c0", "manual", "c0", "sync"))
    op.add(pinned("manual-c1", "manual", "c1", "async"))
    op.add(replica("manual-c2", "manual", "c2"))
    tracked.until(lambda: all(op.replica(f"manual-c{i}").status.get("state") == "enabled" for i in range(3)),
                  60, "three enabled replicas")
    for _ in range(6):  # the tracked replica's warm-up is over after its first check: five real ones
        tracked.step()
    assert all(len(check["manual"]) <= 1 for check in tracked.after_checks), tracked.after_checks
    assert tracked.sync_clusters("manual") == ["c0"]
    assert tracked.mode("manual-c2") == "async"
    summary = op.bodies[("ReplicatedTable", NS, "manual")]["status"]["tracker"]["summary"]
    assert "not owned by the tracker: manual-c0@c0 (sync, counted)" in summary, summary

    # the owner moves the sync role from c0 to c1 by hand: still one sync replica, still not c2
    tracked.edit("manual-c0", mode="async")
    tracked.edit("manual-c1", mode="sync")
    tracked.until(lambda: tracked.sync_clusters("manual") == ["c1"], 30, "the hand-made switch to c1")
    for _ in range(3):
        tracked.step()
    assert all(len(check["manual"]) <= 1 for check in tracked.after_checks), tracked.after_checks
    assert tracked.mode("manual-c2") == "async"

    # both hand-managed replicas async: the sync slot is free, and the tracker fills it with its own
    tracked.edit("manual-c1", mode="async")
    tracked.until(lambda: tracked.sync_clusters("manual") == ["c2"], 30, "the tracker to promote manual-c2")
    assert all(len(check["manual"]) <= 1 for check in tracked.after_checks), tracked.after_checks
    tracked.until(lambda: (op.bodies[("ReplicatedTable", NS, "manual")]["status"].get("tracker") or {})
                  .get("lastDecision") == "manual-c2: async -> sync", 10, "the decision in status.tracker")


def test_collocated_tables_follow_a_sync_replica_pinned_by_hand_and_never_split(tracked: TrackedOperator) -> None:
    """events and audit, collocated, each with a tracked replica on c0 and c1. Pinning events' replica on
    the other cluster as sync (by hand: tracker off on it) takes events' one sync slot: the tracker
    demotes events' own sync replica and moves audit's with it, in the same check."""
    op = tracked.op
    tracked.tables += ["events", "audit"]
    for name in ("events", "audit"):
        op.add(tracked_table(name))
        for on in ("c0", "c1"):
            op.add(replica(f"{name}-{on}", name, on))
    op.add({"apiVersion": API, "kind": "TableCollocation", "metadata": {"name": "pair", "namespace": NS},
            "spec": {"tables": ["events", "audit"]}})
    tracked.until(lambda: (s := tracked.sync_clusters("events")) and len(s) == 1
                  and tracked.sync_clusters("audit") == s, 90, "one sync replica per table, on one cluster")
    before = tracked.sync_clusters("events")[0]
    other = "c1" if before == "c0" else "c0"
    checks = len(tracked.after_checks)

    tracked.edit(f"events-{other}", mode="sync", enableReplicatedTableTracker=False)
    tracked.until(lambda: tracked.sync_clusters("events") == [other] and tracked.sync_clusters("audit") == [other],
                  30, f"both tables' sync replicas on {other}")
    for _ in range(3):
        tracked.step()
    after = tracked.after_checks[checks:]
    assert all(len(check["events"]) <= 1 and len(check["audit"]) <= 1 for check in after), after
    # the first check after the pin may find the pinned replica still enabling in async mode; from the
    # moment the pin holds the slot, every check leaves both tables on the same cluster
    pinned_from = next(i for i, check in enumerate(after) if check["events"] == [other])
    assert all(check["events"] == check["audit"] for check in after[pinned_from:]), after
    assert tracked.mode(f"events-{before}") == "async" and tracked.mode(f"audit-{other}") == "sync"


def test_a_replica_cluster_that_stops_answering_after_its_probe_costs_a_check_one_short_read(
        tracked: TrackedOperator) -> None:
    """A fault run found this: the sync replica's cluster answered the check's probe and was cut off a
    moment later, and the check then waited for the operator's 5 s request timeout on each of its
    replica tables, in turn - the tracker sat in one check for the cut's whole length and moved nothing.
    The replica tables are read in parallel with a short timeout, and a cluster that does not answer
    that read counts as a bad probe: tolerated once, acted on at the next check."""
    op = tracked.op
    tracked.tables.append("stalled")
    op.add(tracked_table("stalled", preferredSyncReplicaClusters=["c2"]))
    for on in ("c1", "c2"):
        op.add(replica(f"stalled-{on}", "stalled", on))
    tracked.until(lambda: tracked.sync_clusters("stalled") == ["c2"], 90, "the sync replica on c2")
    probed = {name: ClusterHealth(True) for name in NAMES}  # every probe answered, just before the cut
    engine = op.engines["c2"]
    os.killpg(engine.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        tracked.tracker.check(time.monotonic(), probed)
        took = time.monotonic() - started
        assert tracked.sync_clusters("stalled") == ["c2"]  # one bad probe is tolerated
        # c2 holds replica tables of three tables; one read each at 5 s was 15 s
        assert took < ENGINE_TIMEOUT, f"the check waited {took:.1f} s on a cluster that did not answer"
        tracked.tracker.check(time.monotonic(), probed)
        assert tracked.sync_clusters("stalled") == ["c1"], tracked.tracker.verdicts[(NS, "stalled")]
        assert "c2 unhealthy: replica table read failed" in tracked.tracker.verdicts[(NS, "stalled")].reason
    finally:
        os.killpg(engine.pid, signal.SIGCONT)
    tracked.until(lambda: tracked.sync_clusters("stalled") == ["c2"], 60, "the sync replica back on c2")
