"""The replicated table tracker and the operator over a meta-cluster served by a leader engine and a
standby, when the leader is SIGKILLed or paused past its lease under writes (issue 24, item 4: "the
tracker and the operator saw the right leader").

The topology of Kubernetes: the meta-cluster ``meta`` is two engines over one PostgreSQL database
(``--standby``) behind a Service (``reptables.testing.service.LeaderService``, readiness =
leadership), which is its TableCluster's endpoint; the replica clusters ``r0`` and ``r1`` are single
engines. The operator's reconcile core and its tracker loop (``operator/tracker``) run side by side
every 0.3 s, as the operator runs them, over a ReplicatedTable whose tracker keeps exactly one sync
replica (``min``/``maxSyncReplicaCount`` 1, a lag threshold of 5 s). Writers insert one new key per
commit through clients given both meta engines. Through the takeover:

* the tracker never switches a replica: a meta-cluster that does not answer is skipped (nothing can
  be switched), and the new leader reports the same sync replica, in sync, with no lag - so the sync
  replica stays where it was on every check;
* its checks go on at the new leader (a decision recorded after the takeover, read through the
  Service), and the operator's TableCluster ``meta`` is Ready again, through the same endpoint;
* every acknowledged write is on the sync replica exactly once, no failed one is there; the old
  leader, paused, never writes and exits 75.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reptables.engine.client import Client
from reptables.engine.storage.leadership import EXIT_STEPPED_DOWN
from reptables.operator.controllers.world import Engines, Resource
from reptables.operator.registry import CredentialPolicy, Registry
from reptables.operator.tracker.loop import TrackerLoop
from reptables.testing import TEST_TOKEN, EngineSet, wait_for
from reptables.testing.service import LeaderService
from tests.ha.xdcr_load import Writer, check_once
from tests.operator.test_bootstrap import NS, OPS, Operator, cluster, replica, secret, table

NAMES = ("meta", "r0", "r1")
PATH = "//home/orders"
LIVE = ("enabled", "enabling")


@dataclass
class Tracked:
    """The engines, the Service of ``meta``, the operator's core and tracker, and what each check saw."""

    engines: EngineSet
    service: LeaderService
    op: Operator
    tracker: TrackerLoop
    meta: Client
    #: (replica id, new mode, reason) of every switch the tracker made
    switches: list[tuple[str, str, str]] = field(default_factory=list)
    #: (monotonic time, clusters of the live sync replicas) after each check
    checks: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def sync_clusters(self) -> tuple[str, ...]:
        replicas = self.meta.get(f"{PATH}/@replicas") or {}
        return tuple(sorted(r["cluster_name"] for r in replicas.values() if r["mode"] == "sync" and r["state"] in LIVE))

    def step(self) -> None:
        self.op.reconcile_all()
        self.tracker.check(time.monotonic())
        try:
            self.checks.append((time.monotonic(), self.sync_clusters()))
        except Exception:  # noqa: BLE001 - the meta-cluster taking over: that check saw nothing
            self.checks.append((time.monotonic(), ("?",)))

    def replica_id(self, cluster_name: str) -> str:
        return str(next(r for r in self.op.registry.of_kind("TableReplica")
                        if r.spec.cluster == cluster_name).status["replicaId"])

    def meta_cluster(self) -> Resource:
        return next(r for r in self.op.registry.of_kind("TableCluster") if r.name == "meta")


class Driver(threading.Thread):
    """Runs the operator's passes and the tracker's checks every 0.3 s until stopped."""

    def __init__(self, tracked: Tracked) -> None:
        super().__init__(daemon=True)
        self.tracked = tracked
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.3):
            try:
                self.tracked.step()
            except Exception as exc:  # noqa: BLE001 - kept for the test to report
                self.tracked.errors.append(exc)

    def __enter__(self) -> Driver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.join(60)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracked]:
    base: Path = tmp_path_factory.mktemp("ha-tracker")
    with EngineSet(base, names=NAMES, standbys={"meta": 1}, start_timeout=60) as engines, \
            LeaderService([e.url for e in engines.group("meta")]) as service:
        registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
        op = Operator({n: engines.engines[n] for n in NAMES}, registry, launcher=None)  # type: ignore[arg-type]
        switches: list[tuple[str, str, str]] = []
        tracker = TrackerLoop(registry.world(), period=0.0,
                              on_switch=lambda _owner, replica, mode, why: switches.append((replica, mode, why)))
        meta = Client([e.url for e in engines.group("meta")], TEST_TOKEN, timeout=30)
        t = Tracked(engines, service, op, tracker, meta, switches)
        try:
            for index, name in enumerate(NAMES):
                registry.upsert_secret(secret(f"{name}-token", TEST_TOKEN))
                # the meta-cluster through its Service, as on Kubernetes; the replica clusters directly
                op.add(cluster(name, service.url if name == "meta" else engines.engines[name].url, index))
            doc = table("orders")
            doc["spec"]["replicatedTableOptions"] = {"enableReplicatedTableTracker": True, "minSyncReplicaCount": 1,
                                                     "maxSyncReplicaCount": 1, "syncReplicaLagThreshold": "5s"}
            op.add(doc)
            op.add(replica("orders-r0", "orders", "r0"))
            op.add(replica("orders-r1", "orders", "r1"))

            def one_sync_in_sync() -> bool:
                t.step()
                sync = t.sync_clusters()
                return len(sync) == 1 and t.replica_id(sync[0]) in meta.get_in_sync_replicas(
                    PATH, meta.generate_timestamp())

            wait_for(one_sync_in_sync, 90, "one sync replica, in sync, chosen by the tracker", interval=0.3)
            yield t
        finally:
            tracker.close()
            meta.close()


def prepared(tracked: Tracked) -> tuple[str, int]:
    """The group with both meta engines up and a leader: the sync replica's cluster and a timestamp of it."""
    tracked.engines.revive("meta")
    tracked.engines.leader("meta", 60)
    for name in ("r0", "r1"):  # their change streams show a change applied twice
        tracked.engines.client(name).set(f"{PATH}_{name}/@enable_change_log", True)
    wait_for(lambda: len(tracked.sync_clusters()) == 1, 30, "one sync replica")
    tracked.switches.clear()
    tracked.checks.clear()
    sync = tracked.sync_clusters()[0]
    return sync, tracked.engines.client(sync).generate_timestamp()


def check_after(tracked: Tracked, sync: str, since: int, writer: Writer, fault_wall: float) -> None:
    assert not tracked.errors, tracked.errors
    assert tracked.switches == [], f"the tracker switched replicas around the takeover: {tracked.switches}"
    seen = {clusters for _, clusters in tracked.checks}
    assert seen <= {(sync,), ("?",)}, f"checks saw other sync replicas than the one on {sync}: {seen}"
    # the tracker's checks went on at the new leader, through the Service, and so did the operator's
    verdict = tracked.tracker.verdicts[(NS, "orders")]
    assert verdict.time > fault_wall and verdict.sync_replica_ids == (tracked.replica_id(sync),), verdict
    ready = next(c for c in tracked.meta_cluster().status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    with Client(tracked.engines.engines[sync].url, TEST_TOKEN, timeout=30) as replica_client:
        count = check_once(replica_client, f"{PATH}_{sync}", since, [writer], "k", "v", set())
    print(f"\n{count} acknowledged writes on the sync replica at {sync}, each once; {len(writer.failed)} failed, "
          f"{len(writer.unknown)} unknown; {len(tracked.checks)} tracker checks, no switch")


def test_the_tracker_keeps_the_sync_replica_when_the_meta_leader_is_killed(tracked: Tracked) -> None:
    sync, since = prepared(tracked)
    old = tracked.engines.leader("meta")
    with Client([e.url for e in tracked.engines.group("meta")], TEST_TOKEN, timeout=3) as client:
        writer = Writer(client, PATH, 1_000_000, lambda k: {"k": k, "v": f"v{k}"})
        with Driver(tracked):
            writer.start()
            try:
                wait_for(lambda: len(writer.acked) >= 20, 60, "writes before the kill")
                fault_wall = time.time()
                old.kill()
                new = tracked.engines.leader("meta", 30)
                assert new is not old
                acked = len(writer.acked)
                wait_for(lambda: len(writer.acked) >= acked + 20, 60, "writes at the new leader")
                checks = len(tracked.checks)
                wait_for(lambda: len(tracked.checks) >= checks + 5, 30, "five more tracker checks")
            finally:
                writer.stop_event.set()
                writer.join(30)
    assert tracked.service.leader == new.url
    check_after(tracked, sync, since, writer, fault_wall)


def test_the_tracker_keeps_the_sync_replica_when_the_meta_leader_is_paused(tracked: Tracked) -> None:
    sync, since = prepared(tracked)
    old = tracked.engines.leader("meta")
    with Client([e.url for e in tracked.engines.group("meta")], TEST_TOKEN, timeout=3) as client:
        writer = Writer(client, PATH, 2_000_000, lambda k: {"k": k, "v": f"v{k}"})
        with Driver(tracked):
            writer.start()
            try:
                wait_for(lambda: len(writer.acked) >= 20, 60, "writes before the pause")
                fault_wall = time.time()
                os.killpg(old.pid, signal.SIGSTOP)
                try:
                    new = tracked.engines.leader("meta", 30)
                    assert new is not old
                    acked = len(writer.acked)
                    wait_for(lambda: len(writer.acked) >= acked + 20, 60, "writes at the new leader")
                finally:
                    os.killpg(old.pid, signal.SIGCONT)
                assert old.proc is not None and old.proc.wait(timeout=30) == EXIT_STEPPED_DOWN
                checks = len(tracked.checks)
                wait_for(lambda: len(tracked.checks) >= checks + 5, 30, "five more tracker checks")
            finally:
                writer.stop_event.set()
                writer.join(30)
    check_after(tracked, sync, since, writer, fault_wall)
