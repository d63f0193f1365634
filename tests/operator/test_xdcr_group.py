"""The XdcrGroup kind end to end: the operator as a real process, the Kubernetes API emulated, engines real.

Three engines started with ``--cluster-id`` 1-3 are the TableClusters of one group; a fourth
engine, started without an id, backs the TableClusters of the manifests that cannot work. The
tests check what a user of the kind relies on (docs/xdcr.md, "With the operator"): the group is set
up on every engine (connections, directory, the XDCR table), a write on one cluster appears on the
others, ``paused`` refuses client writes on every cluster and lifting it takes them again, the
status lists every ordered pair, a conflict is reported as a Warning event, and a manifest that
cannot work gets a condition naming the group and the reason while nothing reaches the engines.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from reptables.engine.client import Client
from reptables.engine.errors import LockConflict, YtError
from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess, free_port
from tests.k8s.emulator import ApiError, K8sApi
from tests.operator.test_operator_e2e import API, CREDENTIALS, NS, OperatorProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "xdcr"
MEMBERS = ("chicago", "sf", "nyc")
PLAIN = "plain"  # an engine started without --cluster-id
USERS = "//home/users"
SCHEMA = [{"name": "id", "type": "int64", "sortOrder": "ascending"}, {"name": "name", "type": "string"}]


class WithLogs(Protocol):
    def logs(self) -> str: ...


@dataclass
class Env:
    """An XdcrGroup's world: the emulated API, the engines, the operator (tests/operator/test_xdcr_join.py too)."""

    api: K8sApi
    engines: dict[str, EngineProcess]
    operator: WithLogs

    def client(self, cluster: str) -> Client:
        engine = self.engines[cluster]
        return Client(engine.url, engine.token, timeout=30)

    def group(self, name: str) -> dict[str, Any]:
        return self.api.get("xdcrgroups", name)

    def condition(self, name: str, type_: str = "Ready") -> dict[str, Any]:
        conds = (self.group(name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c.get("type") == type_), {})

    def wait(self, predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
        """:func:`wait_for`, with an API error "not yet" too, and the operator's log in the failure."""
        try:
            return wait_for(predicate, timeout, what, interval=0.2, retry_on=(ApiError, YtError))
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}\n--- operator log ---\n{self.operator.logs()}") from None

    def rows(self, cluster: str) -> list[dict[str, Any]]:
        with self.client(cluster) as client:
            return client.select_rows(f"* from [{USERS}]", output_row_limit=100_000)


def table_cluster(name: str, engine: EngineProcess, cluster_id: int, secret: str | None = None,
                  namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
            "spec": {"endpoint": engine.url, "clusterId": cluster_id,
                     "credentialsSecret": {"name": secret or f"{name}-token", "namespace": namespace}}}


def xdcr_group(name: str, clusters: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "XdcrGroup", "metadata": {"name": name},
            "spec": {"clusters": clusters, "tables": [{"path": USERS, "schema": SCHEMA}], **spec}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("xdcr-group")
    engines: dict[str, EngineProcess] = {}
    operator: OperatorProcess | None = None
    try:
        for index, name in enumerate(MEMBERS, start=1):
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789",
                                          extra_args=["--cluster-id", str(index)]).start()
        engines[PLAIN] = EngineProcess(PLAIN, base / PLAIN, token="token-plain-0123456789").start()
        with K8sApi(namespaces=[NS]) as api:
            operator = OperatorProcess(api.kubeconfig(base / "kubeconfig"), base / "operator.log").start()
            for name, engine in engines.items():
                api.create({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": f"{name}-token", "namespace": NS, "labels": CREDENTIALS},
                            "stringData": {"token": engine.token}})
            for index, name in enumerate(MEMBERS, start=1):
                api.create(table_cluster(name, engines[name], index))
            # the engine without an id, under two names: "plain" (id 9) and "twin" (id 9 as well)
            api.create(table_cluster(PLAIN, engines[PLAIN], 9))
            api.create(table_cluster("twin", engines[PLAIN], 9, secret=f"{PLAIN}-token"))
            api.create(table_cluster("other", engines[PLAIN], 10, secret=f"{PLAIN}-token"))
            yield Env(api, engines, operator)
    finally:
        if operator is not None:
            operator.stop()
        for engine in engines.values():
            engine.stop()


@pytest.fixture(scope="module")
def group(env: Env) -> str:
    env.api.create(xdcr_group("users", list(MEMBERS), conflictEventThreshold=1))
    env.wait(lambda: env.condition("users").get("status") == "True", 60, "the group Ready")
    return "users"


def test_the_group_is_set_up_on_every_member(env: Env, group: str) -> None:
    for name in MEMBERS:
        with env.client(name) as client:
            assert sorted(client.get("//sys/@xdcr_connections")) == sorted(m for m in MEMBERS if m != name)
            assert set(client.get("//sys/clusters")) == set(MEMBERS) - {name}
            assert client.get(f"{USERS}/@xdcr") is True
            assert client.get(f"{USERS}/@tablet_state") == "mounted"
    status = env.group(group)["status"]
    assert status["tables"] == [USERS]
    assert env.condition(group, "Degraded")["status"] == "False"


def test_status_shows_every_ordered_pair(env: Env, group: str) -> None:
    pairs = env.group(group)["status"]["pairs"]
    assert sorted((p["from"], p["to"]) for p in pairs) == sorted(
        (a, b) for a in MEMBERS for b in MEMBERS if a != b)
    for pair in pairs:
        assert pair["state"] == "connected", pair
        assert pair["paused"] is False and pair["queuedRows"] >= 0 and pair["lagSeconds"] >= 0
        assert pair["conflicts"] == 0


def test_a_write_on_one_member_appears_on_the_others(env: Env, group: str) -> None:
    with env.client("chicago") as chicago:
        chicago.insert_rows(USERS, [{"id": 1, "name": "from chicago"}])
    with env.client("nyc") as nyc:
        nyc.insert_rows(USERS, [{"id": 2, "name": "from nyc"}])
    for name in MEMBERS:
        env.wait(lambda n=name: {r["id"] for r in env.rows(n)} >= {1, 2}, 30, f"both rows on {name}")
    assert {r["id"]: r["name"] for r in env.rows("sf")}.items() >= {1: "from chicago", 2: "from nyc"}.items()


def test_paused_refuses_client_writes_on_every_member_and_resume_takes_them(env: Env, group: str) -> None:
    env.api.patch("xdcrgroups", group, {"spec": {"paused": True}})
    env.wait(lambda: (env.group(group).get("status") or {}).get("paused") is True, 30, "status.paused")
    for name in MEMBERS:
        with env.client(name) as client, pytest.raises(YtError) as refused:
            client.insert_rows(USERS, [{"id": 100, "name": "refused"}])
        assert refused.value.code == 605 and "paused" in refused.value.message
    assert all(p["paused"] for p in env.group(group)["status"]["pairs"])
    assert env.condition(group)["status"] == "True"  # paused pairs still deliver: not degraded
    env.api.patch("xdcrgroups", group, {"spec": {"paused": None}})  # the field removed: its default, false
    env.wait(lambda: env.group(group)["status"].get("paused") is False, 30, "status.paused false")
    resumed = env.api.events(None, involved_name=group, reason="Resumed")
    assert resumed and all("spec.paused is false" in e["message"] for e in resumed), resumed
    with env.client("sf") as sf:
        sf.insert_rows(USERS, [{"id": 3, "name": "after resume"}])
    env.wait(lambda: 3 in {r["id"] for r in env.rows("chicago")}, 30, "the row written after resume")


def test_conflicts_are_counted_and_reported_as_a_warning_event(env: Env, group: str) -> None:
    """Two clusters insert one key at once: each takes the other's insert as a CNST conflict."""
    for attempt in range(10):
        key = 1000 + attempt
        barrier = threading.Barrier(2)

        def write(cluster: str, key: int = key, barrier: threading.Barrier = barrier) -> None:
            with env.client(cluster) as client:
                barrier.wait()
                # (the peer's insert of the key may be applied here at that moment: a lock conflict,
                # 1700, retried as a client does)
                for _ in range(5):
                    try:
                        client.insert_rows(USERS, [{"id": key, "name": cluster}])
                        return
                    except LockConflict:
                        time.sleep(0.05)

        threads = [threading.Thread(target=write, args=(c,)) for c in ("chicago", "sf")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with contextlib.suppress(AssertionError):
            env.wait(lambda: (env.group(group).get("status") or {}).get("conflicts", 0) > 0, 5, "a conflict")
            break
    else:
        pytest.fail("no conflict in 10 attempts of simultaneous inserts")
    events = env.wait(lambda: env.api.events(involved_name=group, reason="Conflicts"), 30, "a Conflicts event")
    assert events[0]["type"] == "Warning" and "//sys/xdcr_conflicts" in events[0]["message"]
    env.wait(lambda: len({r["name"] for c in MEMBERS for r in env.rows(c) if r["id"] == key}) == 1, 30,
             "the same winner on every member")


@pytest.mark.parametrize(("name", "clusters", "reason", "named"), [
    ("ghosts", [PLAIN, "ghost"], "UnknownCluster", "no TableCluster ghost"),
    ("twins", [PLAIN, "twin"], "DuplicateClusterId", "TableClusters plain and twin share clusterId 9"),
    ("no-id", [PLAIN, "other"], "ClusterIdMissing", "the engine of TableCluster plain runs without an XDCR "
                                                    "cluster id; start it with --cluster-id 9"),
    ("poacher", ["chicago", "other"], "ClusterInAnotherGroup", "TableCluster chicago already belongs to "
                                                              "XdcrGroup users"),
])
def test_an_invalid_group_gets_a_clear_condition_and_nothing_is_applied(
        env: Env, group: str, name: str, clusters: list[str], reason: str, named: str) -> None:
    env.api.create(xdcr_group(name, clusters))
    ready = env.wait(lambda: env.condition(name) if env.condition(name).get("reason") == reason else None, 30,
                     f"Ready=False {reason}")
    assert ready["status"] == "False"
    assert ready["message"].startswith(f"XdcrGroup {name}: ") and named in ready["message"]
    assert "nothing is applied" in ready["message"]
    assert env.condition(name, "Degraded")["status"] == "True"
    assert env.api.events(involved_name=name, reason=reason)[0]["type"] == "Warning"
    with env.client(PLAIN) as plain:  # nothing reached the engine: no connections, no table, no peers
        assert not plain.exists(USERS)
        assert plain.call("dr_status", {})["connections"] == []
        assert plain.get("//sys/clusters") == {}
        assert not plain.exists("//sys/@xdcr_connections")
    with env.client("chicago") as chicago:  # and the valid group is untouched
        assert sorted(chicago.get("//sys/@xdcr_connections")) == ["nyc", "sf"]
    env.api.delete("xdcrgroups", name)
    env.api.wait_for_deletion("xdcrgroups", name, None, timeout=30)


def test_the_api_server_refuses_a_reset_without_force(env: Env) -> None:
    with pytest.raises(ApiError) as refused:
        env.api.create(xdcr_group("reckless", list(MEMBERS), reset={"cluster": "nyc", "force": False}))
    assert "set force: true to confirm" in str(refused.value)
    with pytest.raises(ApiError) as outsider:
        env.api.create(xdcr_group("outsider", ["chicago", "sf"], reset={"cluster": "nyc", "force": True}))
    assert "reset.cluster must be one of clusters" in str(outsider.value)


def test_a_member_down_degrades_the_group_and_catches_up_when_back(env: Env, group: str) -> None:
    env.engines["nyc"].stop()
    try:
        degraded = env.wait(lambda: env.condition(group, "Degraded") if env.condition(group, "Degraded").get(
            "reason") == "ClusterUnreachable" else None, 30, "Degraded ClusterUnreachable")
        assert degraded["status"] == "True" and "nyc" in degraded["message"]
        assert env.condition(group)["status"] == "False"
        with env.client("chicago") as chicago:  # the others go on taking writes and replicating
            chicago.insert_rows(USERS, [{"id": 4000, "name": "while nyc is down"}])
        env.wait(lambda: 4000 in {r["id"] for r in env.rows("sf")}, 30, "the row on sf")
    finally:
        env.engines["nyc"].start()
    env.wait(lambda: 4000 in {r["id"] for r in env.rows("nyc")}, 30, "nyc catching up")
    env.wait(lambda: env.condition(group).get("status") == "True", 30, "Ready again")


def test_reset_takes_a_cluster_out_of_the_group_until_it_is_lifted(env: Env, group: str) -> None:
    env.api.patch("xdcrgroups", group, {"spec": {"reset": {"cluster": "nyc", "force": True}}})
    env.wait(lambda: len(env.group(group)["status"]["pairs"]) == 2, 30, "the pairs without nyc")
    env.wait(lambda: env.condition(group).get("status") == "True", 30, "Ready without nyc")
    for name in ("chicago", "sf"):
        with env.client(name) as client:
            assert client.get("//sys/@xdcr_connections") == [m for m in ("chicago", "sf") if m != name]
    with env.client("nyc") as nyc:
        assert nyc.get("//sys/@xdcr_connections") == []
    assert env.api.events(involved_name=group, reason="Reset")[0]["type"] == "Warning"
    with env.client("chicago") as chicago:
        chicago.insert_rows(USERS, [{"id": 5000, "name": "while nyc is out"}])
    env.wait(lambda: 5000 in {r["id"] for r in env.rows("sf")}, 30, "the row on sf")
    time.sleep(1)
    assert 5000 not in {r["id"] for r in env.rows("nyc")}
    env.api.patch("xdcrgroups", group, {"spec": {"reset": None}})  # lifted: nyc joins again and catches up
    env.wait(lambda: 5000 in {r["id"] for r in env.rows("nyc")}, 30, "the row on nyc after the reset is lifted")
    env.wait(lambda: len(env.group(group)["status"]["pairs"]) == 6 and env.condition(group)["status"] == "True",
             30, "six connected pairs again")


def test_reptables_up_runs_the_example_group(tmp_path: Path) -> None:
    """examples/xdcr with free ports: three engines, the group Ready, every member has every member's rows."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for source in sorted(EXAMPLE.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "TableCluster":
                doc["spec"]["endpoint"] = f"http://127.0.0.1:{free_port()}"
        (manifests / source.name).write_text(yaml.safe_dump_all(docs))
    result = subprocess.run([sys.executable, "-m", "reptables.operator.cli", "up", str(manifests), "--no-live",
                             "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for name in MEMBERS:
        assert f"wrote 333 rows to {name}://home/users with yt.wrapper" in out
        assert f"{name}://home/users (XDCR group users): 999 of 999 rows" in out
    final = out[out.rindex("TableCluster     chicago"):]
    assert "XdcrGroup        users                Ready=True" in final and "pairs=6/6 connected" in final
