"""The operator shows who leads an HA table cluster: ``status.leadership`` of a TableCluster with members.

Real parts: two engine processes started with ``--standby`` over one database of the run's
PostgreSQL server (docs/storage.md, "Leadership and fencing"), in front of them the forwarder
``reptables up`` runs as their Service (``operator/local/service.py``, so the TableCluster's endpoint
reaches the leader as a Kubernetes Service does), ``reptables operator`` as a process against the
Kubernetes API emulator of tests/k8s (which serves CloudNativePG's ``Cluster`` CRD, so the Cluster the
TableCluster names is a valid object with a ``status.currentPrimary``), and the ``kubectl-reptables``
executable. What is checked is what a user relies on:

* the status names the engine that serves (the one the database's lease row names, with its
  epoch), the standby, and the database's primary (the CloudNativePG Cluster's ``currentPrimary``;
  the server the leader reached when the Cluster cannot be read, with the reason);
* after the leader is SIGKILLed, the status names the new leader within seconds, and the killed
  engine as not answering since then - never the old leader; started again, it is a standby;
* ``kubectl reptables status`` shows the leader, the standbys and the database's primary;
* the operator reads CloudNativePG only with ``get`` on the named Cluster (the chart's RBAC);
* ``reptables up`` runs a TableCluster with members as that group (every member an engine with
  ``--standby``, its endpoint forwarding to the leader), and ``reptables status`` shows the same view.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.process import free_port
from reptables.operator.local.service import LocalService
from reptables.testing import EngineProcess, WaitTimeout, wait_for
from reptables.testing.backends import RunServer
from tests.k8s.emulator import SPARK_CRD_PATH, THIRDPARTY_DIR, ApiError, K8sApi

NS = "ha"
API = "reptables.io/v1alpha1"
TOKEN = "token-meta-0123456789"
CNPG_CRD = THIRDPARTY_DIR / "postgresql.cnpg.io_clusters.yaml"
PLUGIN = Path(sys.executable).with_name("kubectl-reptables")
#: seconds from a leader's SIGKILL to a status naming the new one: the rest of its lease (1.5 s), the
#: standby's look and load, a status refresh (1 s here) and the write; generous for a loaded machine
NEW_LEADER_SECONDS = 15.0


@dataclass
class Setting:
    api: K8sApi
    engines: list[EngineProcess]
    service: LocalService
    database: str
    postgres: RunServer
    operator: subprocess.Popen[bytes]
    log: Path
    kubeconfig: Path

    def leadership(self) -> dict[str, Any]:
        return (self.api.get("tableclusters", "meta").get("status") or {}).get("leadership") or {}

    def wait(self, check: Any, timeout: float, what: str) -> Any:
        try:
            return wait_for(check, timeout, what, interval=0.2, retry_on=(ApiError,))
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\nstatus.leadership: {self.leadership()}\n--- operator log ---\n"
                                 f"{self.log.read_text(errors='replace')[-4000:]}") from None

    def lease_row(self) -> tuple[int, str]:
        """The epoch and address of the database's lease row (who the database says leads)."""
        epoch, address = self.postgres.psql("SELECT epoch, address FROM _rt_leader", self.database_name).split("|")
        return int(epoch), address

    @property
    def database_name(self) -> str:
        return self.database.rsplit("/", 1)[1]

    def serving(self) -> EngineProcess | None:
        return next((e for e in self.engines if e.alive() and _ready(e.url)), None)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def group_engine(base: Path, name: str, url: str) -> EngineProcess:
    """A member of the meta-cluster's leader/standby group, advertising its own address."""
    engine = EngineProcess("meta", base / name, token=TOKEN)
    engine.extra_args = ["--storage", url, "--standby", "--advertise-url", engine.url]
    return engine


@pytest.fixture(scope="module")
def setting(postgres: RunServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setting]:
    base = tmp_path_factory.mktemp("leadership")
    database = postgres.create_database("ha_status")
    engines = [group_engine(base, name, database) for name in ("meta_a", "meta_b")]
    service = LocalService("meta", free_port(), [e.url for e in engines])
    operator: subprocess.Popen[bytes] | None = None
    try:
        for engine in engines:
            engine.spawn()
        for engine in engines:
            engine.wait_up(60)
        service.start()
        with K8sApi(namespaces=[NS, "default"], crd_files=[SPARK_CRD_PATH, CNPG_CRD]) as api:
            kubeconfig = api.kubeconfig(base / "kubeconfig", namespace=NS)
            api.create({"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
                        "metadata": {"name": "meta-pg", "namespace": NS}, "spec": {"instances": 2}})
            api.patch_status("clusters", "meta-pg", {"currentPrimary": "meta-pg-1", "instances": 2}, NS)
            log = base / "operator.log"
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "REPTABLES_NAMESPACE": NS,
                   "REPTABLES_STATUS_REFRESH": "1", "REPTABLES_TRACKER_PERIOD": "1", "PYTHONUNBUFFERED": "1"}
            with log.open("ab") as out:
                operator = subprocess.Popen(
                    [sys.executable, "-m", "reptables.operator.cli", "operator", "--standalone", "--namespace", NS,
                     "--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--metrics-port", "0"],
                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            api.create({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "meta-token", "namespace": NS,
                                     "labels": {"reptables.io/credentials": "true"}},
                        "stringData": {"token": TOKEN}})
            api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": "meta"},
                        "spec": {"endpoint": service.url, "clusterId": 0,
                                 "credentialsSecret": {"name": "meta-token", "namespace": NS},
                                 "members": [e.url for e in engines], "databaseCluster": {"name": "meta-pg"}}})
            yield Setting(api, engines, service, database, postgres, operator, log, kubeconfig)
            assert not api.server_errors()
    finally:
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
                operator.wait(5)
        service.stop()
        for engine in engines:
            engine.stop()


def test_status_names_the_leader_its_epoch_the_standby_and_the_database_primary(setting: Setting) -> None:
    leadership = setting.wait(lambda: (lambda lead: lead if lead.get("leader") and lead.get("standbys") else None)(
        setting.leadership()), 60, "status.leadership naming a leader and a standby")
    serving = setting.serving()
    assert serving is not None
    epoch, address = setting.lease_row()
    assert leadership["leader"] == serving.url == address
    assert leadership["epoch"] == epoch
    assert leadership["standbys"] == [e.url for e in setting.engines if e is not serving]
    assert leadership["databasePrimary"] == "meta-pg-1"  # the CloudNativePG Cluster's currentPrimary
    assert leadership["unreachable"] == [] and "databaseClusterError" not in leadership
    assert leadership["observedAt"]
    status = setting.api.get("tableclusters", "meta")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and f"{serving.url} leads (epoch {epoch}), 1 standing by" in ready["message"]
    assert TOKEN not in json.dumps(status)


def test_the_engines_leadership_answer_takes_the_token_and_holds_no_secret(setting: Setting) -> None:
    """``GET /leadership`` (what the operator reads): the leader's lease and database server, behind the
    cluster's token; a standby answers 105 naming the leader, as it does every request."""
    from reptables.engine.credentials import peer_credential

    serving = setting.serving()
    assert serving is not None
    standby = next(e for e in setting.engines if e is not serving)
    with httpx.Client(timeout=10) as http:
        said = http.get(f"{serving.url}/leadership", headers={"Authorization": f"OAuth {TOKEN}"})
        assert said.status_code == 200, said.text
        epoch, address = setting.lease_row()
        body = said.json()
        assert {k: body[k] for k in ("cluster_name", "storage", "role", "epoch", "address", "lease_seconds")} == {
            "cluster_name": "meta", "storage": "postgresql", "role": "leader", "epoch": epoch, "address": address,
            "lease_seconds": 1.5}
        assert body["database"] == {"server": f"{setting.postgres.host}:{setting.postgres.port}",
                                    "in_recovery": False}
        assert "reptables@" not in said.text and TOKEN not in said.text  # no user, password or token
        for headers in ({}, {"Authorization": "OAuth wrong-token"},
                        {"Authorization": f"OAuth {peer_credential(TOKEN, 'other')}"}):
            refused = http.get(f"{serving.url}/leadership", headers=headers)
            assert refused.status_code in (401, 403) and refused.json()["code"] == 900, refused.text
        away = http.get(f"{standby.url}/leadership", headers={"Authorization": f"OAuth {TOKEN}"})
        assert away.status_code == 503 and away.json()["code"] == 105
        assert away.json()["attributes"]["leader_url"] == serving.url


def kubectl_reptables(setting: Setting, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "COLUMNS")}
    result = subprocess.run([str(PLUGIN), "--kubeconfig", str(setting.kubeconfig), *args], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kubectl_reptables_status_shows_the_leader_the_standbys_and_the_database_primary(setting: Setting) -> None:
    leadership = setting.leadership()
    text = kubectl_reptables(setting, "status")
    assert "Leaders and standbys" in text, text
    row = next(line for line in text.splitlines() if line.startswith("meta ") and leadership["leader"] in line)
    assert f" {leadership['epoch']} " in row and leadership["standbys"][0] in row, text
    assert "meta-pg-1 (CloudNativePG meta-pg)" in row, text
    view = json.loads(kubectl_reptables(setting, "status", "-o", "json"))
    [cluster] = view["clusters"]
    assert cluster["leadership"]["leader"] == leadership["leader"]
    assert cluster["leadership"]["standbys"] == leadership["standbys"]
    assert cluster["leadership"]["databasePrimary"] == "meta-pg-1"
    assert cluster["leadership"]["members"] == sorted(e.url for e in setting.engines)


def test_after_the_leader_is_killed_the_status_names_the_new_leader_within_seconds(setting: Setting) -> None:
    before = setting.leadership()
    old = next(e for e in setting.engines if e.url == before["leader"])
    new = next(e for e in setting.engines if e is not old)
    old.kill()
    killed = time.monotonic()
    seen: list[str | None] = []

    def new_leader() -> dict[str, Any] | None:
        lead = setting.leadership()
        seen.append(lead.get("leader"))
        return lead if lead.get("leader") == new.url else None

    leadership = setting.wait(new_leader, NEW_LEADER_SECONDS, "the standby named as the leader")
    took = time.monotonic() - killed
    print(f"status named the new leader {took:.1f} s after the SIGKILL")
    assert leadership["epoch"] == before["epoch"] + 1 == setting.lease_row()[0]
    assert leadership["standbys"] == []
    [lost] = leadership["unreachable"]
    assert lost["member"] == old.url and lost["since"] and lost["message"]
    # no status named the killed engine as the leader once the new one served: only it, or none
    assert set(seen[seen.index(new.url):]) == {new.url}
    # the new leader says which lease it took over: the event names it also when a status pass fell
    # into the takeover's gap (no member serving) and so never saw both leaders
    said = httpx.get(f"{new.url}/leadership", headers={"Authorization": f"OAuth {TOKEN}"}, timeout=10).json()
    assert said["replaced"] == {"epoch": before["epoch"], "address": old.url}
    events = [e for e in setting.api.list("events", "default") if e.get("reason") == "LeaderChanged"]
    assert any(f"the engine at {new.url} leads (epoch {leadership['epoch']}); before: {old.url} "
               f"(epoch {before['epoch']})" in e["message"] for e in events), [e["message"] for e in events]
    # its supervisor starts it again: it stands by
    old.spawn().wait_up(60)
    again = setting.wait(lambda: (lambda lead: lead if lead.get("standbys") == [old.url] else None)(
        setting.leadership()), 30, "the restarted engine standing by")
    assert again["leader"] == new.url and again["unreachable"] == []


def test_an_unreadable_database_cluster_is_said_and_the_server_the_leader_reached_shown(setting: Setting) -> None:
    setting.api.patch("tableclusters", "meta", {"spec": {"databaseCluster": {"name": "gone-pg"}}})
    leadership = setting.wait(lambda: (lambda lead: lead if lead.get("databaseClusterError") else None)(
        setting.leadership()), 30, "the error reading the missing Cluster")
    assert "CloudNativePG Cluster ha/gone-pg not found" in leadership["databaseClusterError"]
    # the PostgreSQL server the leader's sessions reached (the run's server), never its user or password
    assert leadership["databasePrimary"] == f"{setting.postgres.host}:{setting.postgres.port}"
    # least privilege: the operator only ever got the Cluster it was named, in its namespace
    requests = [r for r in list(setting.api.emulator.history) if "/apis/postgresql.cnpg.io/" in r.url.path
                and "reptables-operator" in r.headers.get("User-Agent", "")]
    assert requests
    assert {(str(getattr(r.method, "value", r.method)), r.url.path) for r in requests} <= {
        ("GET", f"/apis/postgresql.cnpg.io/v1/namespaces/{NS}/clusters/{name}") for name in ("meta-pg", "gone-pg")}
    setting.api.patch("tableclusters", "meta", {"spec": {"databaseCluster": {"name": "meta-pg"}}})
    setting.wait(lambda: setting.leadership().get("databasePrimary") == "meta-pg-1"
                 and "databaseClusterError" not in setting.leadership(), 30, "the Cluster's primary again")


# -- reptables up ------------------------------------------------------------------------------------


def test_up_runs_a_table_cluster_with_members_as_a_leader_and_a_standby_behind_its_endpoint(
        postgres: RunServer, tmp_path: Path) -> None:
    from reptables.operator.local.runner import LocalRunner

    database = postgres.create_database("ha_up")
    endpoint, members = free_port(), [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    manifests = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "meta-token", "namespace": "default",
                                                             "labels": {"reptables.io/credentials": "true"}},
         "stringData": {"token": TOKEN}},
        {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": "meta"},
         "spec": {"endpoint": f"http://127.0.0.1:{endpoint}", "clusterId": 0,
                  "credentialsSecret": {"name": "meta-token", "namespace": "default"}, "members": members,
                  "local": {"storage": database}}}]
    data = tmp_path / "data"
    runner = LocalRunner(manifests, data)
    try:
        runner.start_engines()
        assert runner.converge(timeout=60)
        group = runner.groups["meta"]
        leader = group.leader()
        assert leader is not None and [e.url for e in group.members] == members

        def standbys() -> list[str]:
            runner.reconcile_all()
            status = runner.bodies[("TableCluster", None, "meta")]["status"]
            return list((status.get("leadership") or {}).get("standbys") or [])

        wait_for(standbys, 30, "the standby in status")
        view = subprocess.run([str(Path(sys.executable).with_name("reptables")), "status", "--data-dir", str(data)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert view.returncode == 0, view.stderr
        assert "Leaders and standbys" in view.stdout
        standby = next(m for m in members if m != leader.url)
        row = next(line for line in view.stdout.splitlines() if line.startswith("meta ") and leader.url in line)
        assert standby in row and f"{postgres.host}:{postgres.port}" in row, view.stdout
        assert f"engine meta: http://127.0.0.1:{endpoint} forwards to the leader, {leader.url}" in view.stdout
        # the endpoint reaches the leader: a write through it, the kill, and a write again through it on a new
        # connection (held by the forwarder while no engine leads, then served by the new leader; a connection
        # that was forwarded to the killed engine ends with it, as on Kubernetes)
        with Client(f"http://127.0.0.1:{endpoint}", TOKEN, timeout=30) as client:
            client.create("map_node", "//home/before")
        ok, message = runner._control("kill", "meta")
        assert ok and f"at {leader.url}" in message and "killed (SIGKILL)" in message, message
        with Client(f"http://127.0.0.1:{endpoint}", TOKEN, timeout=30) as client:
            client.create("map_node", "//home/after")
            assert client.exists("//home/before")
        assert group.service.leader == standby

        def standing_by_again() -> bool:
            runner.reconcile_all()  # up, as supervisor, starts the killed engine again (3 s later): as a standby
            return leader.alive() and httpx.get(f"{leader.url}/readyz", timeout=1).json().get("status") == "standby"

        wait_for(standing_by_again, 60, "the killed engine standing by again", retry_on=(httpx.HTTPError,))
        state = json.loads((data / "state.json").read_text())
        assert [m["url"] for m in state["engines"]["meta"]["members"]] == members
        assert TOKEN not in (data / "state.json").read_text()
    finally:
        runner.stop()
    assert not any(e.alive() for e in runner.groups["meta"].members)


def test_a_leader_found_after_a_pass_that_saw_none_is_announced_with_the_one_it_replaced() -> None:
    """The takeover's gap: a status pass between the old leader's death and the new one's load saw
    no member serving (``leader`` absent, a ``NoLeader`` Warning); the next pass finds the new leader.
    Its ``LeaderChanged`` still names the leader it replaced - from the lease the new leader says it
    took over (``GET /leadership``'s ``replaced``) - as docs/ha.md promises."""
    from reptables.operator.controllers.leadership import MemberAnswer, _events

    old, new = "http://127.0.0.1:1001", "http://127.0.0.1:1002"
    gap = {"standbys": [], "unreachable": [{"member": old, "since": "2026-11-27T00:00:00Z", "message": "refused"}]}
    answers = [MemberAnswer(new, "leader", "serves"), MemberAnswer(old, "unreachable", "refused")]
    now = {"leader": new, "epoch": 8, "standbys": [], "unreachable": gap["unreachable"]}
    [event] = _events(gap, now, answers, {"epoch": 7, "address": old})
    assert (event.type, event.reason) == ("Normal", "LeaderChanged")
    assert event.message == f"the engine at {new} leads (epoch 8); before: {old} (epoch 7); standing by: none"
    # a pass that saw the old leader names it from the status, whatever the new leader says
    [event] = _events({**gap, "leader": old, "epoch": 7}, now, answers, None)
    assert f"before: {old} (epoch 7)" in event.message
    # the first leader of a new database replaced none
    [event] = _events({}, {**now, "epoch": 1}, answers, None)
    assert event.message == f"the engine at {new} leads (epoch 1); standing by: none"
