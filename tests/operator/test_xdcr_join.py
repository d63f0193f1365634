"""A cluster added to an XdcrGroup that holds data joins from a snapshot, run by the operator (seed 001).

kopf runs as a real process against the Kubernetes API emulator, with real engines, and runs its
jobs with a :class:`~reptables.operator.jobs.processes.LocalLauncher` (real local Spark): this module,
run as ``__main__``, is that operator — ``reptables operator`` with the launcher ``reptables up``
uses instead of SparkApplications. Two members, ``chicago`` and ``sf``, hold rows (with deletes) and
have trimmed their change logs (``change_retention`` set through the engines); then ``nyc`` is added
to ``spec.clusters``. What users rely on: the members do not ship ``nyc`` a partial log, the
operator runs the join job for it from ``preferredSource`` (``sf``), the group says it is joining,
``status.joins`` shows the join Succeeded, and all three converge and go on replicating. And the API
server refuses a ``preferredSource`` that is not a member, saying so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import YtError
from tests.harness import EngineProcess, free_port
from tests.k8s.emulator import ApiError, K8sApi
from tests.operator.test_xdcr_group import USERS, Env, table_cluster, xdcr_group

REPO = Path(__file__).resolve().parents[2]
NS = "xdcr-join"
CREDENTIALS = {"reptables.io/credentials": "true"}
MEMBERS = ("chicago", "sf", "nyc")
WRITTEN = "boston"  # its table was written on it before it was added: it cannot join from a snapshot
ENGINE_SCHEMA = [{"name": "id", "type": "int64", "sort_order": "ascending"}, {"name": "name", "type": "string"}]


@dataclass
class JoiningOperator:
    """``reptables operator`` with a LocalLauncher: this module run as a process of its own group."""

    kubeconfig: Path
    log_path: Path
    jobs_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = field(default_factory=free_port)

    def start(self) -> JoiningOperator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "REPTABLES_NAMESPACE": NS,
               "REPTABLES_STATUS_REFRESH": "2", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.operator.test_xdcr_join", str(self.jobs_dir),
                 f"http://127.0.0.1:{self.health_port}/healthz"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the group this test started: the operator (its jobs
            try:                                      # run in groups of their own, stopped by its cleanup)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:] if self.log_path.exists() else ""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("xdcr-join")
    engines: dict[str, EngineProcess] = {}
    operator: JoiningOperator | None = None
    try:
        for index, name in enumerate((*MEMBERS, WRITTEN), start=1):
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789abcdef",
                                          extra_args=["--cluster-id", str(index)])
            engines[name].start()
        with K8sApi(namespaces=[NS]) as api:
            (base / "jobs").mkdir()
            operator = JoiningOperator(api.kubeconfig(base / "kubeconfig"), base / "operator.log", base / "jobs")
            operator.start()
            for index, name in enumerate((*MEMBERS, WRITTEN), start=1):
                api.create({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": f"{name}-token", "namespace": NS, "labels": CREDENTIALS},
                            "stringData": {"token": engines[name].token}})
                api.create(table_cluster(name, engines[name], index, namespace=NS))
            yield Env(api, engines, operator)
    finally:
        if operator is not None:
            operator.stop()
        for engine in engines.values():
            engine.stop()


def _log_trimmed(client: Client, start: int) -> bool:
    try:
        client.pull_changes(USERS, from_timestamp=start, wait_timeout=0)
    except YtError as exc:
        return exc.code == 1760  # the changes after ``start`` are gone from the log
    return False


def test_a_cluster_added_to_a_group_with_trimmed_logs_joins_from_the_preferred_source(env: Env) -> None:
    # chicago and sf hold the table, their change logs kept one second (set through the engines)
    for name in ("chicago", "sf"):
        with env.client(name) as client:
            client.create("table", USERS, recursive=True, attributes={
                "dynamic": True, "xdcr": True, "schema": ENGINE_SCHEMA, "change_retention": 1})
    env.api.create(xdcr_group("users", ["chicago", "sf"], preferredSource="sf"))
    env.wait(lambda: env.condition("users").get("status") == "True", 60, "the two-member group Ready")
    with env.client("chicago") as chicago, env.client("sf") as sf:
        # each cluster's own clock (commit timestamps are (second, counter) per cluster: within one
        # second chicago's can be later than every commit sf makes)
        starts = {"chicago": chicago.generate_timestamp(), "sf": sf.generate_timestamp()}
        chicago.insert_rows(USERS, [{"id": i, "name": f"chicago-{i}"} for i in range(300)])
        # (chicago's rows may be applied on sf meanwhile: a lock conflict, 1700, retried as a client does)
        env.wait(lambda: sf.insert_rows(USERS, [{"id": i, "name": f"sf-{i}"} for i in range(200, 500)]) is None,
                 10, "sf's rows written")
        env.wait(lambda: len(env.rows("chicago")) == 500 and env.rows("chicago") == env.rows("sf"), 30,
                 "chicago and sf converged")
        chicago.delete_rows(USERS, [{"id": i} for i in range(40)])
        env.wait(lambda: len(env.rows("sf")) == 460 and env.rows("chicago") == env.rows("sf"), 30, "the deletes")
        for name, client in (("chicago", chicago), ("sf", sf)):
            env.wait(lambda c=client, n=name: _log_trimmed(c, starts[n]), 30, f"the change log of {name} trimmed")
    expected = env.rows("sf")

    env.api.patch("xdcrgroups", "users", {"spec": {"clusters": list(MEMBERS)}})
    reasons: set[str] = set()

    def joined() -> dict[str, Any] | None:
        reasons.add(str(env.condition("users").get("reason")))
        joins = (env.group("users").get("status") or {}).get("joins") or []
        return next((j for j in joins if j["cluster"] == "nyc" and j["phase"] == "Succeeded"), None)

    join = env.wait(joined, 90, "nyc's join Succeeded")
    assert join["path"] == USERS and join["source"] == "sf" and join["attempts"] == 1
    assert join["jobRef"].startswith("local:") and join["completionTime"]
    assert "Joining" in reasons  # Ready said so while the job ran
    env.wait(lambda: env.rows("nyc") == expected, 30, "nyc holding the group's rows")
    env.wait(lambda: env.condition("users").get("status") == "True", 30, "the three-member group Ready")
    pairs = env.group("users")["status"]["pairs"]
    assert len(pairs) == 6 and all(p["state"] == "connected" for p in pairs), pairs
    # a full member: its writes reach the others, and theirs reach it
    with env.client("nyc") as nyc, env.client("chicago") as chicago:
        nyc.insert_rows(USERS, [{"id": 9000, "name": "from nyc"}])
        nyc.delete_rows(USERS, [{"id": 100}])
        chicago.insert_rows(USERS, [{"id": 9001, "name": "from chicago"}])
    for name in MEMBERS:
        env.wait(lambda n=name: {r["id"] for r in env.rows(n)} >= {9000, 9001}
                 and 100 not in {r["id"] for r in env.rows(n)}, 30, f"the newcomer's changes on {name}")
    events = env.api.events(involved_name="users")
    by_reason = {e["reason"]: e for e in events}
    assert by_reason["Joining"]["type"] == "Normal" and "nyc joins //home/users" in by_reason["Joining"]["message"]
    assert by_reason["Joined"]["type"] == "Normal" and "of sf" in by_reason["Joined"]["message"]
    text = json.dumps(env.group("users").get("status")) + json.dumps(events) + env.operator.logs()
    for engine in env.engines.values():
        assert engine.token and engine.token not in text


def test_a_join_that_fails_is_reported_and_retried_until_the_cluster_leaves(env: Env) -> None:
    """boston's own rows would be lost by a snapshot: the job fails, the group says why, and waits."""
    with env.client(WRITTEN) as boston:
        boston.create("table", USERS, recursive=True, attributes={"dynamic": True, "xdcr": True,
                                                                  "schema": ENGINE_SCHEMA})
        boston.mount_table(USERS)
        boston.insert_rows(USERS, [{"id": 7000, "name": "boston's own"}])
    env.api.patch("xdcrgroups", "users", {"spec": {"clusters": [*MEMBERS, WRITTEN]}})

    def failed() -> dict[str, Any] | None:
        joins = (env.group("users").get("status") or {}).get("joins") or []
        return next((j for j in joins if j["cluster"] == WRITTEN and j["phase"] == "Failed"), None)

    join = env.wait(failed, 60, "boston's join Failed")
    assert join["attempts"] == 1 and join["nextAttemptTime"]
    assert "written on this cluster" in join["message"] and USERS in join["message"]
    ready = env.condition("users")
    assert ready["status"] == "False" and ready["reason"] == "JoinFailed" and WRITTEN in ready["message"]
    event = env.wait(lambda: env.api.events(involved_name="users", reason="JoinFailed"), 30, "a JoinFailed event")
    assert event[0]["type"] == "Warning" and "retrying in 10 s" in event[0]["message"]
    with env.client(WRITTEN) as boston:  # no snapshot replaced its table: its own row is intact
        assert {"id": 7000, "name": "boston's own"} in boston.select_rows(f"* from [{USERS}]")
        assert USERS not in boston.call("dr_status", {})["joining"]
    # the way out: take it out of the group; the join is dropped and the group is Ready again
    env.api.patch("xdcrgroups", "users", {"spec": {"clusters": list(MEMBERS)}})
    env.wait(lambda: env.condition("users").get("status") == "True", 30, "Ready without boston")
    assert [j["cluster"] for j in env.group("users")["status"]["joins"]] == ["nyc"]


def test_the_api_server_refuses_a_preferred_source_that_is_not_a_member(env: Env) -> None:
    with pytest.raises(ApiError) as refused:
        env.api.create(xdcr_group("stray", ["chicago", "sf"], preferredSource="nyc"))
    assert "preferredSource must be one of clusters" in str(refused.value)


def test_a_cluster_joining_again_after_a_reset_gets_jobs_of_its_own() -> None:
    # a launcher starts a name once and answers a name it started before with that job: a second
    # join of nyc to the table (it left and was reset since) must not be answered with the first's
    from reptables.operator.controllers.world import Resource
    from reptables.operator.controllers.xdcr_join import _job_name

    group = Resource("XdcrGroup", NS, "users", "uid-users", 1, "", None, {})
    first, again = (_job_name(group, "nyc", USERS, join_round, 1) for join_round in (1, 2))
    assert first != again and first.startswith("users-join-nyc-1-") and again.startswith("users-join-nyc-1-")
    # the same status seen twice (an event and the refresh timer) names the same job: it starts once
    assert _job_name(group, "nyc", USERS, 1, 1) == first


def _run_operator(jobs_dir: str, liveness: str) -> None:
    """``reptables operator --standalone``, its runtime given a LocalLauncher (this module as ``__main__``)."""
    import kopf

    from reptables.engine import logs
    from reptables.operator import handlers
    from reptables.operator.jobs.processes import LocalLauncher
    from reptables.operator.registry import CredentialPolicy
    from reptables.operator.runtime import Runtime
    from reptables.operator.settings import OperatorSettings

    settings = OperatorSettings.resolve(os.environ, namespaces=[NS], standalone=True, liveness=liveness,
                                        metrics_port=0)
    logs.configure("info")
    runtime = Runtime.start(settings.operator_namespace, settings.tracker_period,
                            CredentialPolicy(settings.secret_namespaces), launcher=LocalLauncher(Path(jobs_dir)))
    asyncio.run(kopf.operator(standalone=True, namespaces=settings.namespaces, liveness_endpoint=liveness,
                              memo=kopf.Memo({handlers.SETTINGS_KEY: settings, handlers.RUNTIME_KEY: runtime})))


if __name__ == "__main__":
    _run_operator(sys.argv[1], sys.argv[2])
