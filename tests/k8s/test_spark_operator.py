"""Tests for the spark-operator stand-in (tests/k8s/spark_operator.py) against the Kubernetes API emulator.

The main file is a tiny script written by each test (no Spark): it copies its ``--token-file`` to
``--out`` (with the file's mode and path), sleeps ``--sleep`` seconds and exits with ``--exit-code``.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import signal
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.emulator import K8sApi, k8s_api  # noqa: F401  (the fixture)
from tests.k8s.spark_operator import SparkOperatorStandIn

NS = "jobs"
MAIN = "local:///opt/reptables/sparkapp.py"
SCRIPT = """\
import argparse, json, os, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--token-file")
parser.add_argument("--out")
parser.add_argument("--sleep", type=float, default=0)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()
print("driver started in", os.getcwd(), "SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP"),
      "EXTRA", os.environ.get("EXTRA"), flush=True)
with open(args.token_file) as token:
    content = token.read()
with open(args.out, "w") as out:
    json.dump({"token": content, "path": args.token_file, "mode": os.stat(args.token_file).st_mode & 0o777}, out)
time.sleep(args.sleep)
print("driver exits with", args.exit_code, flush=True)
sys.exit(args.exit_code)
"""


def state_of(api: K8sApi, name: str) -> str:
    return ((api.get("sparkapplications", name, NS).get("status") or {}).get("applicationState") or {}).get("state", "")


def wait_state(api: K8sApi, name: str, state: str, timeout: float = 15) -> dict[str, Any]:
    api.wait_for(lambda: state_of(api, name) == state, timeout, message=f"{name} reaching {state}")
    return api.get("sparkapplications", name, NS)["status"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Job:
    """Creates SparkApplications (valid against the CRD) and their Secrets for one test."""

    def __init__(self, api: K8sApi, tmp_path: Path) -> None:
        self.api = api
        self.tmp_path = tmp_path

    def out(self, name: str) -> Path:
        return self.tmp_path / f"{name}.out.json"

    def secret(self, name: str, token: str = "s3cret-token") -> None:
        self.api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
                         "data": {"token": base64.b64encode(token.encode()).decode()}})

    def app(self, name: str, *, secret: str = "job-secret", exit_code: int = 0, sleep: float = 0,
            **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "type": "Python", "mode": "cluster", "image": "registry.example/reptables-spark:4.0.1",
                "mainApplicationFile": MAIN, "sparkVersion": "4.0.1",
                "arguments": ["--token-file", "/etc/job/token", "--out", str(self.out(name)),
                              "--exit-code", str(exit_code), "--sleep", str(sleep)],
                "restartPolicy": {"type": "Never"},
                "driver": {"cores": 1, "memory": "512m", "serviceAccount": "spark",
                           "secrets": [{"name": secret, "path": "/etc/job", "secretType": "Generic"}]},
                "executor": {"instances": 1, "cores": 1, "memory": "512m"},
                **spec,
            },
        }
        return self.api.create(copy.deepcopy(body))


@pytest.fixture
def job(k8s_api: K8sApi, tmp_path: Path) -> Job:  # noqa: F811
    k8s_api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return Job(k8s_api, tmp_path)


@pytest.fixture
def operator(k8s_api: K8sApi, tmp_path: Path) -> Iterator[SparkOperatorStandIn]:  # noqa: F811
    main = tmp_path / "main.py"
    main.write_text(SCRIPT, encoding="utf-8")
    with SparkOperatorStandIn(k8s_api, tmp_path / "spark", {MAIN: main}, env={"EXTRA": "yes"}, poll=0.1) as op:
        yield op
    assert op.errors == []


def test_success_completes_with_the_secret_as_a_private_file(k8s_api, job, operator, tmp_path):  # noqa: F811
    job.secret("job-secret")
    job.app("ok")
    status = wait_state(k8s_api, "ok", "COMPLETED")

    assert status["submissionAttempts"] == 1 and status["executionAttempts"] == 1
    assert status["driverInfo"] == {"podName": "ok-driver"}
    assert uuid.UUID(status["submissionID"])
    assert status["lastSubmissionAttemptTime"].endswith("Z") and status["terminationTime"].endswith("Z")
    assert "errorMessage" not in status["applicationState"]

    result = json.loads(job.out("ok").read_text())
    assert result["token"] == "s3cret-token"
    assert result["mode"] == 0o600
    token_path = Path(result["path"])  # the argument /etc/job/token was rewritten to the local "mount"
    assert token_path.name == "token" and token_path.is_relative_to(tmp_path / "spark")
    app_dir = token_path.parents[2]
    assert stat.S_IMODE(app_dir.stat().st_mode) == 0o700

    log = operator.log(NS, "ok")
    assert f"driver started in {app_dir}" in log and "SPARK_LOCAL_IP 127.0.0.1 EXTRA yes" in log
    assert "driver exits with 0" in log
    assert operator.apps_seen == ["ok"]
    assert not pid_alive(operator.pids()[(NS, "ok")])  # exited and reaped


def test_nonzero_exit_fails_with_the_driver_error_message(k8s_api, job, operator):  # noqa: F811
    job.secret("job-secret")
    job.app("exits-3", exit_code=3)
    status = wait_state(k8s_api, "exits-3", "FAILED")
    assert status["applicationState"]["errorMessage"] == "driver container failed with ExitCode: 3, Reason: Error"
    assert status["terminationTime"] and status["executionAttempts"] == 1
    assert json.loads(job.out("exits-3").read_text())["token"] == "s3cret-token"  # it did run
    assert "driver exits with 3" in operator.log(NS, "exits-3")


def test_submission_failed_behaviour_never_runs(k8s_api, job, operator):  # noqa: F811
    operator.behaviour = lambda app: "submission_failed" if app["metadata"]["name"] == "bad-image" else "run"
    job.secret("job-secret")
    job.app("bad-image")
    status = wait_state(k8s_api, "bad-image", "SUBMISSION_FAILED")
    message = status["applicationState"]["errorMessage"]
    assert message.startswith(f"failed to run spark-submit for SparkApplication {NS}/bad-image: ")
    assert "registry.example/reptables-spark:4.0.1" in message and status["submissionAttempts"] == 1
    job.app("good")  # the behaviour is per app
    wait_state(k8s_api, "good", "COMPLETED")
    time.sleep(0.5)
    assert state_of(k8s_api, "bad-image") == "SUBMISSION_FAILED"
    assert not job.out("bad-image").exists() and (NS, "bad-image") not in operator.pids()
    assert operator.log(NS, "bad-image") == ""


def test_stuck_behaviour_stays_submitted(k8s_api, job, operator):  # noqa: F811
    operator.behaviour = lambda app: "stuck"
    job.secret("job-secret")
    job.app("stuck")
    status = wait_state(k8s_api, "stuck", "SUBMITTED")
    assert status["driverInfo"] == {"podName": "stuck-driver"} and status["submissionID"]
    rv = k8s_api.get("sparkapplications", "stuck", NS)["metadata"]["resourceVersion"]
    time.sleep(1.0)  # ten polls
    after = k8s_api.get("sparkapplications", "stuck", NS)
    assert after["status"]["applicationState"] == {"state": "SUBMITTED"}
    assert after["metadata"]["resourceVersion"] == rv  # nothing written since
    assert not job.out("stuck").exists() and operator.pids() == {}


def test_deleting_a_running_app_kills_its_driver(k8s_api, job, operator):  # noqa: F811
    job.secret("job-secret")
    job.app("sleeper", sleep=60)
    wait_state(k8s_api, "sleeper", "RUNNING")
    pid = operator.pids()[(NS, "sleeper")]
    assert pid_alive(pid)
    k8s_api.delete("sparkapplications", "sleeper", NS)
    k8s_api.wait_for(lambda: not pid_alive(pid), timeout=5, message="the driver killed")
    assert "driver exits" not in operator.log(NS, "sleeper")


def test_stop_kills_running_drivers(k8s_api, job, tmp_path):  # noqa: F811
    main = tmp_path / "main.py"
    main.write_text(SCRIPT, encoding="utf-8")
    job.secret("job-secret")
    with SparkOperatorStandIn(k8s_api, tmp_path / "spark", {MAIN: main}, poll=0.1) as op:
        job.app("long", sleep=60)
        wait_state(k8s_api, "long", "RUNNING")
        pid = op.pids()[(NS, "long")]
    assert not pid_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)  # the whole process group is gone
    assert op.errors == []


def test_secret_arriving_late_is_waited_for(k8s_api, job, operator):  # noqa: F811
    job.app("late-secret")
    wait_state(k8s_api, "late-secret", "SUBMITTED")
    time.sleep(1.0)
    assert state_of(k8s_api, "late-secret") == "SUBMITTED" and operator.pids() == {}
    job.secret("job-secret", token="arrived-late")
    wait_state(k8s_api, "late-secret", "COMPLETED")
    assert json.loads(job.out("late-secret").read_text())["token"] == "arrived-late"


def test_missing_secret_fails_after_the_timeout(k8s_api, job, tmp_path):  # noqa: F811
    main = tmp_path / "main.py"
    main.write_text(SCRIPT, encoding="utf-8")
    with SparkOperatorStandIn(k8s_api, tmp_path / "spark", {MAIN: main}, poll=0.1, secret_timeout=0.5) as op:
        job.app("no-secret", secret="never-created")
        status = wait_state(k8s_api, "no-secret", "FAILED")
    assert 'secret "never-created" not found' in status["applicationState"]["errorMessage"]
    assert op.pids() == {} and not job.out("no-secret").exists()


@pytest.mark.parametrize(("spec", "field"), [
    ({"type": "Scala", "mainClass": "org.example.Main"}, "spec.type"),
    ({"mode": "client"}, "spec.mode"),
    ({"mainApplicationFile": "local:///opt/unknown.py"}, "spec.mainApplicationFile"),
])
def test_unrunnable_spec_is_a_submission_failure(k8s_api, job, operator, spec, field):  # noqa: F811
    job.secret("job-secret")
    job.app("unrunnable", **spec)
    status = wait_state(k8s_api, "unrunnable", "SUBMISSION_FAILED")
    message = status["applicationState"]["errorMessage"]
    assert message.startswith(f"failed to run spark-submit for SparkApplication {NS}/unrunnable: {field}: ")
    assert operator.pids() == {}


def test_terminal_app_is_left_alone(k8s_api, job, tmp_path):  # noqa: F811
    main = tmp_path / "main.py"
    main.write_text(SCRIPT, encoding="utf-8")
    job.secret("job-secret")
    job.app("finished")
    k8s_api.patch_status("sparkapplications", "finished", {
        "applicationState": {"state": "COMPLETED"}, "driverInfo": {"podName": "finished-driver"}}, NS)
    rv = k8s_api.get("sparkapplications", "finished", NS)["metadata"]["resourceVersion"]
    with SparkOperatorStandIn(k8s_api, tmp_path / "spark", {MAIN: main}, poll=0.1) as op:
        k8s_api.wait_for(lambda: "finished" in op.apps_seen, timeout=5)
        time.sleep(0.5)
    assert k8s_api.get("sparkapplications", "finished", NS)["metadata"]["resourceVersion"] == rv
    assert op.pids() == {} and not job.out("finished").exists()


def test_status_goes_through_the_status_subresource(k8s_api, job, operator):  # noqa: F811
    job.secret("job-secret")
    job.app("via-status")
    wait_state(k8s_api, "via-status", "COMPLETED")
    writes = [r for r in k8s_api.request_log() if r["method"] in ("PATCH", "PUT")
              and r["path"].startswith(f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NS}/sparkapplications/")]
    assert [r["path"].rsplit("/", 1)[-1] for r in writes] == ["status"] * 3  # SUBMITTED, RUNNING, COMPLETED
    app = k8s_api.get("sparkapplications", "via-status", NS)
    assert app["metadata"]["generation"] == 1


def test_api_errors_do_not_stop_the_thread(k8s_api, job, operator, monkeypatch):  # noqa: F811
    real_list = k8s_api.list
    failures: list[int] = []

    def flaky_list(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        if len(failures) < 3:
            failures.append(1)
            raise ConnectionError("emulator unreachable")
        return real_list(*args, **kwargs)

    monkeypatch.setattr(k8s_api, "list", flaky_list)
    job.secret("job-secret")
    job.app("after-errors")
    wait_state(k8s_api, "after-errors", "COMPLETED")
    assert len(failures) == 3 and len(operator.errors) == 3
    operator.errors.clear()  # expected ones (the fixture checks that no others happened)


def test_a_driver_ignoring_sigterm_gets_sigkill(k8s_api, job, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr("tests.k8s.spark_operator.KILL_GRACE", 1.0)  # 10 s in real use
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('ready', flush=True)\ntime.sleep(60)\n", encoding="utf-8")
    job.secret("job-secret")
    with SparkOperatorStandIn(k8s_api, tmp_path / "spark", {MAIN: stubborn}, poll=0.1) as op:
        job.app("stubborn")
        wait_state(k8s_api, "stubborn", "RUNNING")
        k8s_api.wait_for(lambda: "ready" in op.log(NS, "stubborn"), timeout=5)
        pid = op.pids()[(NS, "stubborn")]
        k8s_api.delete("sparkapplications", "stubborn", NS)
        time.sleep(0.6)
        assert pid_alive(pid)  # SIGTERM ignored
        k8s_api.wait_for(lambda: not pid_alive(pid), timeout=5, message="SIGKILL after the grace period")
    assert op.errors == []
