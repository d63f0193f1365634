"""The operator bootstraps a replica added to a table whose history was trimmed: real engines, real jobs.

The reconcile core (the registry and the reconcile table the operator and ``reptables up`` share)
runs against three real engines — ``meta`` (the meta-cluster), ``source`` (an existing replica) and
``target`` (the new replica's cluster) — and a :class:`LocalLauncher` that runs the real bootstrap
and verify jobs (``python -m reptables.sparkapps.bootstrap`` / ``verify``, local Spark). The history
is trimmed before the new TableReplica appears; the test reconciles the way a front end does (over
and over, never waiting inside a reconcile) and follows ``status.bootstrap`` through its phases.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.process import start_all
from reptables.operator.controllers.dispatch import ORDER, reconcile
from reptables.operator.controllers.world import Engines, Event, Resource
from reptables.operator.jobs.launcher import JobSpec, JobState
from reptables.operator.jobs.processes import LocalLauncher
from reptables.operator.registry import CredentialPolicy, Registry
from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess

API = "reptables.io/v1alpha1"
OPS = "reptables-system"
NS = "shop"
NAMES = ("meta", "source", "target")
_ids = itertools.count()


def secret(name: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": OPS, "labels": {"reptables.io/credentials": "true"}},
            "data": {"token": base64.b64encode(value.encode()).decode()}}


def cluster(name: str, endpoint: str, cluster_id: int) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"endpoint": endpoint, "credentialsSecret": {"name": f"{name}-token"}, "clusterId": cluster_id}}


def table(name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": name, "namespace": NS},
            "spec": {"cluster": "meta", "path": f"//home/{name}", "minReplicationLogTtl": "0s",
                     "schema": [{"name": "k", "type": "int64", "sortOrder": "ascending"},
                                {"name": "v", "type": "string"}, {"name": "a", "type": "any"}]}}


def replica(name: str, table_name: str, on: str, **bootstrap: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"table": table_name, "cluster": on, "replicaPath": f"//home/{table_name}_{on}"}
    if bootstrap:
        spec["bootstrap"] = bootstrap
    return {"apiVersion": API, "kind": "TableReplica", "metadata": {"name": name, "namespace": NS,
                                                                    "uid": f"uid-{name}"}, "spec": spec}


@dataclass
class Operator:
    """The reconcile core driven like a front end drives it: status merged back, events kept."""

    engines: dict[str, EngineProcess]
    registry: Registry
    launcher: LocalLauncher
    bodies: dict[tuple[str, str | None, str], dict[str, Any]] = field(default_factory=dict)
    events: dict[str, list[Event]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)

    def add(self, doc: dict[str, Any]) -> None:
        meta = doc["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}-{next(_ids)}")
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{next(_ids) % 60:02d}Z")
        doc.setdefault("status", {})
        self.bodies[(doc["kind"], meta.get("namespace"), meta["name"])] = doc
        self.registry.upsert(doc)

    def reconcile_all(self) -> None:
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                outcome = reconcile(res, self.registry.world())
                body = self.bodies[res.key]
                body["status"] = {**body.get("status", {}), **outcome.status}
                self.registry.upsert(body)
                self.events.setdefault(res.name, []).extend(outcome.events)
                self.statuses.append(outcome.status)

    def replica(self, name: str) -> Resource:
        return next(r for r in self.registry.of_kind("TableReplica") if r.name == name)

    def client(self, name: str) -> Client:
        return Client(self.engines[name].url, self.engines[name].read_token())

    def until(self, predicate: Any, timeout: float, what: str) -> None:
        """Reconcile everything until ``predicate()`` holds (:func:`wait_for`, a pass per look)."""
        def reconciled() -> bool:
            self.reconcile_all()
            return bool(predicate())

        wait_for(reconciled, timeout, what, interval=0.3)

    def secrets(self) -> list[str]:
        tokens = [e.read_token() for e in self.engines.values()]
        return tokens + [peer_credential(t, "meta") for t in tokens]


def condition(res: Resource, type_: str) -> dict[str, Any]:
    return next(c for c in res.status.get("conditions", []) if c["type"] == type_)


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    base: Path = tmp_path_factory.mktemp("op-bootstrap")
    engines: dict[str, EngineProcess] = {}
    launcher = LocalLauncher(base_dir=base)
    registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
    registry.launcher = launcher
    try:
        for name in NAMES:
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789abcdef")
        start_all(engines.values())
        operator = Operator(engines, registry, launcher)
        for index, name in enumerate(NAMES):
            registry.upsert_secret(secret(f"{name}-token", engines[name].read_token()))
            operator.add(cluster(name, engines[name].url, index))
        yield operator
    finally:
        launcher.close()
        for engine in engines.values():
            engine.stop()


def trimmed_table(op: Operator, name: str, rows: int, also_on: tuple[str, ...] = ()) -> str:
    """A ReplicatedTable with one replica on ``source`` (and one on each cluster of ``also_on``, all
    filled by replication) whose queue lost ``rows`` rows to trimming."""
    op.add(table(name))
    for cluster in ("source", *also_on):
        op.add(replica(f"{name}-{cluster}", name, cluster))
    for cluster in ("source", *also_on):
        op.until(lambda c=cluster: op.replica(f"{name}-{c}").status.get("state") == "enabled", 60,
                 f"the replica on {cluster}")
        assert "bootstrap" not in op.replica(f"{name}-{cluster}").status  # nothing trimmed yet: no bootstrap
    path = f"//home/{name}"
    with op.client("meta") as meta:
        for start in range(0, rows, 1000):
            meta.insert_rows(path, [{"k": i, "v": f"v{i}", "a": {"i": i} if i % 3 else None}
                                    for i in range(start, min(rows, start + 1000))], require_sync_replica=False)
        wait_for(lambda: sum(t["trimmed_row_count"] for t in meta.get(f"{path}/@tablets")) >= rows, 60,
                 "the history to be trimmed", interval=0.2)
    return path


def no_secret_anywhere(op: Operator) -> None:
    text = json.dumps(op.statuses) + json.dumps([[e.reason, e.message] for es in op.events.values() for e in es])
    for value in op.secrets():
        assert value not in text


def test_a_replica_added_to_a_table_with_trimmed_history_is_bootstrapped_verified_and_enabled(op: Operator) -> None:
    path = trimmed_table(op, "orders", 3000)
    op.add(replica("orders-target", "orders", "target", parallelism=2))
    phases: list[str] = []

    def done() -> bool:
        phase = (op.replica("orders-target").status.get("bootstrap") or {}).get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        return phase in ("Done", "Failed")

    op.until(done, 240, "the bootstrap to finish")
    res = op.replica("orders-target")
    boot = res.status["bootstrap"]
    assert boot["phase"] == "Done", (boot, op.launcher.log_of(boot.get("jobRef", "")))
    assert phases[:3] == ["Pending", "Copying", "Verifying"] and phases[-1] == "Done"
    assert [e.reason for e in op.events["orders-target"] if e.reason.startswith("Bootstrap")] == [
        "BootstrapPending", "BootstrapCopying", "BootstrapVerifying", "BootstrapEnabling", "BootstrapDone"]
    assert boot["attempts"] == 1 and boot["rowsCopied"] == 3000 and boot["jobRef"].startswith("local:")
    assert condition(res, "Bootstrapped")["status"] == "True"
    with op.client("meta") as meta:
        info = meta.get(f"#{res.status['replicaId']}/@")
        assert info["state"] == "enabled" and info["start_replication_timestamp"] == boot["snapshotTimestamp"]
        # rows written after the bootstrap arrive through the replicator
        meta.insert_rows(path, [{"k": 10_000, "v": "after", "a": [1]}], require_sync_replica=False)
        wait_for(lambda: res.status["replicaId"] in meta.get_in_sync_replicas(path, meta.generate_timestamp()),
                 60, "the bootstrapped replica to come in sync", interval=0.3)
    with op.client("source") as source, op.client("target") as target:
        query = "* from [{}] order by k limit 100000"
        expected = source.select_rows(query.format(path + "_source"))
        assert len(expected) == 3001
        assert target.select_rows(query.format(path + "_target")) == expected
    op.until(lambda: condition(op.replica("orders-target"), "Ready")["status"] == "True", 30, "Ready")
    no_secret_anywhere(op)
    assert op.launcher.pids() == []


def test_a_source_that_cannot_be_read_fails_after_the_retry_limit_naming_the_jobs_error(op: Operator) -> None:
    path = trimmed_table(op, "broken", 50)
    # the only replica to copy from stays enabled but loses its table: a map node stands in its
    # place. Its TableReplica is deleted first (Retain), or the operator would start it over
    # (ReplicaTableLost, the test above) and there would be no enabled replica to copy from. A
    # replica of another table keeps the source cluster in the meta-cluster's directory
    op.add(table("brokenlink"))
    op.add(replica("brokenlink-source", "brokenlink", "source"))
    op.until(lambda: op.replica("brokenlink-source").status.get("state") == "enabled", 60, "the linking replica")
    op.registry.remove("TableReplica", NS, "broken-source")
    del op.bodies[("TableReplica", NS, "broken-source")]
    with op.client("source") as source:
        source.unmount_table(path + "_source")
        source.remove(path + "_source")
        source.create("map_node", path + "_source")
    op.add(replica("broken-target", "broken", "target", maxAttempts=2, backoffSeconds=1, verify=False))
    op.until(lambda: (op.replica("broken-target").status.get("bootstrap") or {}).get("phase") == "Failed", 240,
             "the bootstrap to fail")
    res = op.replica("broken-target")
    boot = res.status["bootstrap"]
    # the job's own error line, naming the table it could not read
    assert boot["attempts"] == 2 and boot["lastError"].startswith("the copy job failed: bootstrap failed: "), boot
    assert path + "_source" in boot["lastError"]
    bootstrapped, ready = condition(res, "Bootstrapped"), condition(res, "Ready")
    assert (bootstrapped["status"], bootstrapped["reason"]) == ("False", "BootstrapFailed")
    assert (ready["status"], ready["reason"]) == ("False", "BootstrapFailed")
    assert ready["message"] == bootstrapped["message"] == f"bootstrap failed after 2 attempts: {boot['lastError']}"
    reasons = [e.reason for e in op.events["broken-target"] if e.reason.startswith("Bootstrap")]
    assert reasons == ["BootstrapPending", "BootstrapCopying", "BootstrapRetrying", "BootstrapCopying",
                       "BootstrapFailed"]
    with op.client("meta") as meta:
        assert meta.get(f"#{res.status['replicaId']}/@state") == "disabled"
    # a failed bootstrap stays failed: no further job is started
    op.reconcile_all()
    assert op.replica("broken-target").status["bootstrap"]["attempts"] == 2 and op.launcher.pids() == []
    no_secret_anywhere(op)


def test_a_replica_table_removed_after_it_was_filled_is_refilled_with_every_row(op: Operator) -> None:
    # two replicas filled by replication, then the history is trimmed
    path = trimmed_table(op, "lost", 2000, also_on=("target",))
    with op.client("meta") as meta:
        meta.insert_rows(path, [{"k": i, "v": f"late{i}", "a": None} for i in range(5000, 5100)],
                         require_sync_replica=False)
    query = "* from [{}] order by k limit 100000"
    with op.client("source") as source, op.client("target") as target:
        wait_for(lambda: len(target.select_rows(query.format(path + "_target"))) >= 2100
                 and len(source.select_rows(query.format(path + "_source"))) >= 2100,
                 60, "the rows to reach both replicas", interval=0.2)
        before = op.replica("lost-target").status
        assert before["replicaTableId"] == target.get(path + "_target/@id")
        # someone removes the filled replica table; made again empty under the same replica, it
        # would go on from the replica's progress and miss every row written before
        target.unmount_table(path + "_target")
        target.remove(path + "_target")

    def refilled() -> bool:
        status = op.replica("lost-target").status
        return status.get("replicaId") not in (None, before["replicaId"]) and \
            (status.get("bootstrap") or {}).get("phase") in ("Done", "Failed")

    op.until(refilled, 240, "the replica to start over and be refilled")
    res = op.replica("lost-target")
    assert res.status["bootstrap"]["phase"] == "Done", res.status["bootstrap"]
    lost = [e for e in op.events["lost-target"] if e.reason == "ReplicaTableLost"]
    assert len(lost) == 1 and lost[0].type == "Warning" and path + "_target" in lost[0].message \
        and before["replicaId"] in lost[0].message
    with op.client("meta") as meta:
        assert not meta.exists(f"#{before['replicaId']}")  # the old replica is gone, not left failing
        meta.insert_rows(path, [{"k": 9999, "v": "after", "a": None}], require_sync_replica=False)
    op.until(lambda: condition(op.replica("lost-target"), "Ready")["status"] == "True", 60, "Ready")
    with op.client("source") as source, op.client("target") as target:
        assert op.replica("lost-target").status["replicaTableId"] == target.get(path + "_target/@id") \
            != before["replicaTableId"]
        def refilled_rows() -> bool:
            rows = target.select_rows(query.format(path + "_target"))
            return len(rows) == 2101 and rows == source.select_rows(query.format(path + "_source"))

        wait_for(refilled_rows, 60, "the refilled replica to hold the source's 2101 rows", interval=0.3)
    no_secret_anywhere(op)


def test_the_local_launcher_keeps_secrets_off_the_command_line_and_stops_what_it_started(tmp_path: Path) -> None:
    launcher = LocalLauncher(base_dir=tmp_path, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert launcher.directory.stat().st_mode & 0o777 == 0o700
        # this module is the job: it checks its secret file and sleeps (``__main__`` below)
        ref = launcher.start(JobSpec("sleepy", "tests.operator.test_bootstrap", ("--check",),
                                     {"meta-token-file": "s3cret-value-0123"}))
        assert launcher.start(JobSpec("sleepy", "tests.operator.test_bootstrap", ())) == ref  # started once
        try:
            wait_for(lambda: "secret file ok" in launcher.log_of(ref), 30, "the job to find its secret file",
                     interval=0.1)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}: {launcher.log_of(ref)}") from None
        [pid] = launcher.pids()
        assert b"s3cret-value-0123" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert launcher.poll(ref) == JobState(running=True)
        launcher.stop(ref)
        state = launcher.poll(ref)
        assert state is not None and not state.running and state.exit_code == -15
        assert launcher.pids() == [] and not list(launcher.directory.rglob("meta-token-file"))
        failing = launcher.start(JobSpec("failing", "no_such_module_here", (), {"meta-token-file": "s3cret-0123"}))

        def ended() -> JobState | None:
            state = launcher.poll(failing)
            assert state is not None, f"{failing} is gone"
            return None if state.running else state

        state = wait_for(ended, 30, "the failing job to end", interval=0.1)
        assert state.exit_code == 1
        assert "No module named no_such_module_here" in (state.error or "")
        assert launcher.poll("local:never-started") is None
    finally:
        launcher.close()
    assert not launcher.directory.exists()


if __name__ == "__main__":  # the job of the launcher test
    import stat
    import sys

    secret_path = Path(sys.argv[sys.argv.index("--meta-token-file") + 1])
    mode = stat.S_IMODE(secret_path.stat().st_mode)
    ok = mode == 0o600 and secret_path.read_text() == "s3cret-value-0123" and "--check" in sys.argv
    print("secret file ok" if ok else f"secret file wrong: mode {mode:o}", flush=True)
    time.sleep(600)
