"""The SparkApplication launcher: bootstrap jobs on Kubernetes, the API emulated, the spark-operator played.

No Kubernetes (and so no spark-operator) runs here. The API is the emulator of tests/k8s, which
validates every SparkApplication the operator creates against the spark-operator's own CRD
(``../shared/thirdparty``), and :class:`~tests.k8s.spark_operator.SparkOperatorStandIn` plays the
spark-operator: it mounts the app's Secret as files, runs the app's main file
(``sparkapps/sparkapp.py``) as a local process with local Spark and writes
``status.applicationState`` as the real one does — or, when a test asks, fails the submission or
leaves the app SUBMITTED forever.

Two levels: the launcher alone (what an app looks like, failures, the stuck-app timeout), and the
operator as a real process (``reptables operator`` with ``REPTABLES_SPARK_JOBS``) bootstrapping a
replica of a table with trimmed history through two SparkApplications, with real engines.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.process import start_all
from reptables.operator.jobs.launcher import JobSpec, JobState, LaunchError, Owner
from reptables.operator.jobs.spark_applications import SECRET_DIR, USER_AGENT, SparkApplicationLauncher, app_name
from reptables.operator.settings import SparkJobSettings
from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess, free_port
from tests.k8s.emulator import ApiError, K8sApi
from tests.k8s.spark_operator import SparkOperatorStandIn

REPO = Path(__file__).resolve().parents[2]
MAIN_FILE = "local:///opt/reptables/sparkapp.py"
NS = "shop"
API = "reptables.io/v1alpha1"
APPS = "sparkoperator.k8s.io/v1beta2/sparkapplications"


def app_state(api: K8sApi, name: str, namespace: str = NS) -> str | None:
    try:
        app = api.get(APPS, name, namespace)
    except ApiError:
        return None
    return str(((app.get("status") or {}).get("applicationState") or {}).get("state") or "")


def wait_done(launcher: SparkApplicationLauncher, ref: str, timeout: float = 60.0) -> JobState:
    def finished() -> JobState | None:
        state = launcher.poll(ref)
        assert state is not None, f"{ref} is gone"
        return None if state.running else state

    return wait_for(finished, timeout, f"{ref} to finish", interval=0.2)


# --- the launcher alone --------------------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[K8sApi]:
    with K8sApi(namespaces=[NS]) as emulator:
        yield emulator
        assert not emulator.server_errors()


def owner(api: K8sApi, name: str) -> Owner:
    created = api.create({"apiVersion": API, "kind": "TableReplica", "metadata": {"name": name, "namespace": NS},
                          "spec": {"table": "t", "cluster": "c", "replicaPath": "//home/t"}})
    return Owner(API, "TableReplica", name, created["metadata"]["uid"], NS)


def launcher_for(api: K8sApi, tmp_path: Path, **settings: Any) -> SparkApplicationLauncher:
    client = SparkApplicationLauncher.connect(str(api.kubeconfig(tmp_path / "kubeconfig")))
    return SparkApplicationLauncher(SparkJobSettings(image="reptables-spark:test", **settings), client)


JOB_SCRIPT = """
import stat, sys
from pathlib import Path
args = sys.argv[1:]
token = Path(args[args.index("--meta-token-file") + 1])
print("job", args[0], "mode", oct(stat.S_IMODE(token.stat().st_mode)), "token", token.read_text(), flush=True)
sys.exit(int(args[args.index("--exit") + 1]))
"""


def test_an_app_per_attempt_owned_by_the_replica_with_its_secrets_only_in_an_owned_secret(
        api: K8sApi, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    launcher = launcher_for(api, tmp_path, time_to_live_seconds=600, spark_conf=(("spark.ui.enabled", "false"),))
    with SparkOperatorStandIn(api, tmp_path / "spark", {MAIN_FILE: script}) as spark:
        replica = owner(api, "orders-target")
        job = JobSpec("orders-target-copy-1-abc123", "reptables.sparkapps.bootstrap", ("--replica-id", "1-2-3-4",
                      "--exit", "0"), {"meta-token-file": "s3cret-meta-token-0123"}, replica)
        ref = launcher.start(job)
        assert ref == f"sparkapplication:{NS}/orders-target-copy-1-abc123"
        # two reconciles that saw the same status start the job once: same name, same app
        assert launcher.start(job) == ref and len(api.list(APPS, NS)) == 1
        other = Owner(API, "TableReplica", "orders-target", "uid-of-another-replica", NS)
        with pytest.raises(LaunchError, match="exists and belongs to another object"):
            launcher.start(JobSpec(job.name, job.module, job.args, job.secrets, other))
        state = wait_done(launcher, ref)
        assert state == JobState(running=False, exit_code=0)
        app = api.get(APPS, "orders-target-copy-1-abc123", NS)
        spec = app["spec"]
        assert (spec["type"], spec["mode"], spec["mainApplicationFile"], spec["restartPolicy"]) == (
            "Python", "cluster", MAIN_FILE, {"type": "Never"})
        assert spec["timeToLiveSeconds"] == 600 and spec["image"] == "reptables-spark:test"
        assert spec["sparkConf"] == {"spark.ui.enabled": "false"}
        assert spec["arguments"] == ["bootstrap", "--replica-id", "1-2-3-4", "--exit", "0",
                                     "--meta-token-file", f"{SECRET_DIR}/meta-token-file"]
        [ref_owner] = app["metadata"]["ownerReferences"]
        assert (ref_owner["kind"], ref_owner["name"], ref_owner["uid"], ref_owner["controller"]) == (
            "TableReplica", "orders-target", replica.uid, True)
        assert spec["driver"]["secrets"] == [{"name": "orders-target-copy-1-abc123-credentials", "path": SECRET_DIR,
                                              "secretType": "Generic"}]
        assert "secrets" not in spec["executor"]
        assert "s3cret" not in json.dumps(app)
        secret = api.get("v1/secrets", "orders-target-copy-1-abc123-credentials", NS)
        assert base64.b64decode(secret["data"]["meta-token-file"]).decode() == "s3cret-meta-token-0123"
        [secret_owner] = secret["metadata"]["ownerReferences"]
        assert (secret_owner["kind"], secret_owner["uid"]) == ("SparkApplication", app["metadata"]["uid"])
        # the job got the secret as a private file, whose path its arguments name
        assert "job bootstrap mode 0o600 token s3cret-meta-token-0123" in spark.log(NS, "orders-target-copy-1-abc123")

        # a failing driver: the app's errorMessage and where the driver's log is
        failing = launcher.start(JobSpec("orders-target-verify-1-def456", "reptables.sparkapps.verify",
                                         ("--exit", "3"), {"meta-token-file": "s3cret-meta-token-0123"}, replica))
        state = wait_done(launcher, failing)
        assert not state.running and state.exit_code == 1
        assert state.error == (f"SparkApplication {NS}/orders-target-verify-1-def456 FAILED: driver container failed "
                               f"with ExitCode: 3, Reason: Error; the driver's log: kubectl logs -n {NS} "
                               "orders-target-verify-1-def456-driver")
        # the replica deleted: its apps and their Secrets go with it (owner references)
        api.delete("tablereplicas", "orders-target", NS)
        api.wait_for(lambda: not api.list(APPS, NS) and not api.list("v1/secrets", NS),
                     timeout=10, message="the apps and Secrets of the deleted replica to go")
        assert launcher.poll(ref) is None  # gone: the reconcile core counts it as a lost attempt
    launcher.close()


def test_a_failed_submission_and_a_stuck_app_are_failed_attempts_that_say_what_to_check(
        api: K8sApi, tmp_path: Path) -> None:
    launcher = launcher_for(api, tmp_path, submit_timeout_seconds=2)
    with SparkOperatorStandIn(api, tmp_path / "spark", {}) as spark:
        replica = owner(api, "r1")
        spark.behaviour = lambda app: "submission_failed" if "-copy-" in app["metadata"]["name"] else "stuck"
        refused = launcher.start(JobSpec("r1-copy-1-aaaaaa", "reptables.sparkapps.bootstrap", (), {}, replica))
        state = wait_done(launcher, refused)
        assert state.exit_code == 1 and state.error is not None
        assert state.error.startswith(f"SparkApplication {NS}/r1-copy-1-aaaaaa SUBMISSION_FAILED: failed to run "
                                      "spark-submit"), state.error
        assert "kubectl logs" not in state.error  # no driver ever ran
        stuck = launcher.start(JobSpec("r1-verify-1-bbbbbb", "reptables.sparkapps.verify", (), {"k": "v"}, replica))
        api.wait_for(lambda: app_state(api, "r1-verify-1-bbbbbb") == "SUBMITTED", timeout=10)
        assert launcher.poll(stuck) == JobState(running=True)  # within the timeout it is waited for
        time.sleep(2.5)
        state = launcher.poll(stuck)
        assert state is not None and not state.running and state.exit_code == 1
        assert state.error is not None
        assert f"SparkApplication {NS}/r1-verify-1-bbbbbb was still SUBMITTED" in state.error
        assert "submitTimeoutSeconds" in state.error and "reptables-spark:test" in state.error
        # deleted, so that it cannot start late and run beside the next attempt; its Secret goes with it
        api.wait_for(lambda: app_state(api, "r1-verify-1-bbbbbb") is None, timeout=10)
        api.wait_for(lambda: not api.list("v1/secrets", NS), timeout=10)
    assert launcher.poll("local:other-launchers-job") is None
    launcher.close()


def test_without_the_spark_operator_crd_a_start_fails_with_a_clear_error(tmp_path: Path) -> None:
    with K8sApi(namespaces=[NS], crd_files=[]) as emulator:
        launcher = launcher_for(emulator, tmp_path)
        with pytest.raises(LaunchError, match=r"cannot create SparkApplication shop/x-copy-1: the API has no "
                                              r"sparkapplications.sparkoperator.k8s.io/v1beta2 \(install the kubeflow"):
            launcher.start(JobSpec("x-copy-1", "reptables.sparkapps.bootstrap", (), {}, Owner(API, "TableReplica",
                                                                                              "x", "uid-x", NS)))
        launcher.close()


def test_app_names_are_dns_labels_of_at_most_50_characters() -> None:
    assert app_name("orders-target-copy-1-abc123") == "orders-target-copy-1-abc123"
    long = app_name("a-very-long-replica-name-that-goes-on-and-on-and-on-copy-12-abcdef")
    assert len(long) <= 50 and long.startswith("a-very-long-replica-name") and long[-9] == "-"
    assert long != app_name("a-very-long-replica-name-that-goes-on-and-on-and-on-copy-12-abcdeg")
    assert app_name("Weird_Name.x") == "weird-name-x"


def test_the_jobs_settings_come_from_one_json_variable_and_name_the_bad_key() -> None:
    settings = SparkJobSettings.from_json(json.dumps({
        "enabled": True, "image": "registry/reptables-spark:1", "serviceAccount": "spark", "timeToLiveSeconds": 60,
        "driver": {"cores": 2, "memory": "2g"}, "executor": {"instances": 4, "cores": 1, "memory": "4g"},
        "sparkConf": {"spark.ui.enabled": "false"}, "nodeSelector": {"pool": "spark"}}))
    assert (settings.image, settings.service_account, settings.driver_cores, settings.executor_instances) == (
        "registry/reptables-spark:1", "spark", 2, 4)
    assert settings.spark_conf == (("spark.ui.enabled", "false"),) and settings.node_selector == (("pool", "spark"),)
    for bad, message in [({"image": ""}, "image must name the job image"),
                         ({"image": "x", "driver": {"memory": "lots"}}, "driver.memory must be a Spark memory size"),
                         ({"image": "x", "submitTimeoutSeconds": 0}, "submitTimeoutSeconds must be a positive"),
                         ({"image": "x", "imagePullPolicy": "Sometimes"}, "imagePullPolicy must be"),
                         ({"image": "x", "colour": "red"}, "unknown key 'colour'")]:
        with pytest.raises(ValueError, match=message):
            SparkJobSettings.from_json(json.dumps(bad))


# --- the operator, end to end -----------------------------------------------------------------------


SCHEMA = [{"name": "k", "type": "int64", "sortOrder": "ascending"}, {"name": "v", "type": "string"}]
CLUSTERS = ("meta", "source", "target")


def test_the_operator_bootstraps_a_replica_through_spark_applications(tmp_path: Path) -> None:
    engines = {name: EngineProcess(name, tmp_path / name, token=f"token-{name}-0123456789") for name in CLUSTERS}
    start_all(engines.values())
    proc: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "operator.log"
    try:
        with K8sApi(namespaces=[NS]) as api, SparkOperatorStandIn(
                api, tmp_path / "spark", {MAIN_FILE: REPO / "sparkapps" / "sparkapp.py"}) as spark:
            env = {**os.environ, "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
                   "REPTABLES_NAMESPACE": NS, "REPTABLES_STATUS_REFRESH": "1", "PYTHONUNBUFFERED": "1",
                   "REPTABLES_SPARK_JOBS": json.dumps({"image": "reptables-spark:test", "submitTimeoutSeconds": 300,
                                                       "sparkConf": {"spark.ui.enabled": "false"}})}
            with log_path.open("ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "reptables.operator.cli", "operator", "--standalone", "--namespace", NS,
                     "--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--metrics-port", "0"],
                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

            def status(kind: str, name: str) -> dict[str, Any]:
                return api.get(kind, name, None if kind == "tableclusters" else NS).get("status") or {}

            def wait(predicate: Any, timeout: float, what: str) -> None:
                try:
                    wait_for(predicate, timeout, what, interval=0.3)
                except WaitTimeout as exc:
                    raise AssertionError(f"{exc}\n{log_path.read_text()[-5000:]}") from None

            for index, (name, engine) in enumerate(engines.items()):
                api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
                    "name": f"{name}-token", "namespace": NS, "labels": {"reptables.io/credentials": "true"}},
                    "stringData": {"token": engine.token}})
                api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                            "spec": {"endpoint": engine.url, "clusterId": index,
                                     "credentialsSecret": {"name": f"{name}-token", "namespace": NS}}})
            api.create({"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "orders", "namespace": NS},
                        "spec": {"cluster": "meta", "path": "//home/orders", "schema": SCHEMA,
                                 "minReplicationLogTtl": "0s"}})
            api.create({"apiVersion": API, "kind": "TableReplica", "metadata": {"name": "orders-source",
                                                                                "namespace": NS},
                        "spec": {"table": "orders", "cluster": "source", "replicaPath": "//home/orders"}})
            wait(lambda: status("tablereplicas", "orders-source").get("state") == "enabled", 60, "the source replica")
            meta = Client(engines["meta"].url, engines["meta"].token)
            meta.insert_rows("//home/orders", [{"k": i, "v": f"v{i}"} for i in range(2000)],
                             require_sync_replica=False)
            wait(lambda: sum(t["trimmed_row_count"] for t in meta.get("//home/orders/@tablets")) == 2000, 60,
                 "the queue to be trimmed")

            api.create({"apiVersion": API, "kind": "TableReplica", "metadata": {"name": "orders-target",
                                                                                "namespace": NS},
                        "spec": {"table": "orders", "cluster": "target", "replicaPath": "//home/orders",
                                 "bootstrap": {"parallelism": 2}}})
            wait(lambda: (status("tablereplicas", "orders-target").get("bootstrap") or {}).get("phase")
                 in ("Done", "Failed"), 300, "the bootstrap")
            replica = api.get("tablereplicas", "orders-target", NS)
            boot = replica["status"]["bootstrap"]
            apps = api.list(APPS, NS)
            logs = "\n".join(spark.log(NS, a["metadata"]["name"]) for a in apps)
            assert boot["phase"] == "Done", (boot, logs[-4000:])
            assert boot["rowsCopied"] == 2000 and boot["attempts"] == 1
            # one app for the copy, one for the verification, both the replica's, both finished
            assert sorted(a["spec"]["arguments"][0] for a in apps) == ["bootstrap", "verify"], [
                a["metadata"]["name"] for a in apps]
            assert boot["jobRef"] in {f"sparkapplication:{NS}/{a['metadata']['name']}" for a in apps}
            for app in apps:
                assert app["metadata"]["ownerReferences"][0]["uid"] == replica["metadata"]["uid"]
                assert app["status"]["applicationState"]["state"] == "COMPLETED"
            assert "bootstrap copied 2000 rows" in logs and "0 differing ranges" in logs
            # the replica is in sync and holds every row
            replica_id = replica["status"]["replicaId"]
            assert meta.get(f"#{replica_id}/@state") == "enabled"
            with Client(engines["source"].url, engines["source"].token) as source, \
                    Client(engines["target"].url, engines["target"].token) as target:
                query = "* from [//home/orders] order by k limit 10000"
                assert target.select_rows(query) == source.select_rows(query)
            wait(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                             for c in status("tablereplicas", "orders-target").get("conditions", [])), 30, "Ready")
            # the launcher's requests: only what the chart grants it, only in the replica's namespace
            assert api.emulator is not None
            ours = [(str(getattr(r.method, "value", r.method)).upper(), r.url.path)
                    for r in list(api.emulator.history) if USER_AGENT in r.headers.get("User-Agent", "")]
            used = {(method, path.rsplit("/", 1)[0] if method != "POST" else path) for method, path in ours}
            assert used == {("POST", f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NS}/sparkapplications"),
                            ("POST", f"/api/v1/namespaces/{NS}/secrets"),
                            ("GET", f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NS}/sparkapplications")}, used
            # no token in what anyone can read: apps, statuses, events
            readable = json.dumps([apps, api.list("tablereplicas", NS), api.list("v1/events", NS)])
            for engine in engines.values():
                assert engine.token not in readable
            meta.close()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for engine in engines.values():
            engine.stop()
