"""A test-side stand-in for the kubeflow spark-operator, played against the Kubernetes API emulator.

Why it exists: the reptables operator hands Spark jobs to the spark-operator by creating
``SparkApplication`` objects (``sparkoperator.k8s.io/v1beta2``) and then only reads their
``status.applicationState``. No Kubernetes cluster (and so no spark-operator) runs on the test
machines, so without a stand-in nothing would ever move such an application past its empty state.
:class:`SparkOperatorStandIn` watches the emulator (:mod:`tests.k8s.emulator`) the way the real
operator watches the API server and drives the applications through the states the real operator
reports, running the job for real as a local Python process.

What of the real spark-operator it plays:

* it lists ``SparkApplications`` in all namespaces (a poll every ``poll`` seconds rather than a watch)
  and writes ``.status`` only through the ``/status`` subresource, as the real controller does;
* the state machine ``""`` -> ``SUBMITTED`` -> ``RUNNING`` -> ``COMPLETED`` / ``FAILED``, and
  ``""`` -> ``SUBMISSION_FAILED``, with the status fields the real operator sets: ``submissionAttempts``,
  ``lastSubmissionAttemptTime``, ``submissionID``, ``driverInfo.podName`` (``<name>-driver``),
  ``executionAttempts``, ``terminationTime`` and ``applicationState.errorMessage`` worded like the real
  one (``driver container failed with ExitCode: <code>, Reason: Error``, ``failed to run spark-submit
  for SparkApplication <ns>/<name>: ...``);
* the driver's secret volumes (``spec.driver.secrets``): each Secret is read from the API and its keys
  become files of mode 0600 in a private directory, standing in for the volume mounted at ``path``;
  a missing Secret is waited for (the kubelet keeps retrying a pod whose secret volume is missing, the
  app stays ``SUBMITTED``) for ``secret_timeout`` seconds, then the app is ``FAILED``;
* deleting an application while it runs kills its driver (the real operator deletes the driver pod);
* an application whose status is already terminal when first seen is left alone;
* test-chosen misbehaviour per application (``behaviour``): ``"submission_failed"`` (spark-submit
  fails, e.g. the image cannot be pulled) and ``"stuck"`` (``SUBMITTED`` forever, as with a driver pod
  that is never scheduled), the failure modes users of the real operator report.

What it does not play: there is no spark-submit, no driver or executor pods, no Kubernetes
scheduling, images, service accounts, resources, Spark UI service, ``sparkConf``, ``deps``, retries
(``restartPolicy`` is treated as ``Never``), ``timeToLiveSeconds`` garbage collection, spec-change
invalidation/re-runs, suspension, or the mutating webhook. Only ``spec.type: Python`` in
``mode: cluster`` (the real webhook's default when ``mode`` is absent) runs: ``spec.mainApplicationFile``
(e.g. ``local:///opt/reptables/sparkapp.py``) is mapped to a local file through ``main_files``, which
runs as ``[python, <local main file>, *spec.arguments]`` with local Spark (``SPARK_LOCAL_IP=127.0.0.1``,
``PYSPARK_PYTHON=python``). Applications first seen in a non-terminal, non-empty state (e.g. left
``RUNNING`` by another operator) are left alone too, with a warning.

Usage::

    with K8sApi() as api, SparkOperatorStandIn(api, tmp_path / "spark",
                                               {"local:///opt/reptables/sparkapp.py": "sparkapps/job.py"}) as spark:
        api.create(spark_application)
        api.wait_for(lambda: api.get("sparkapplications", "job-1", "ns")
                     .get("status", {}).get("applicationState", {}).get("state") == "COMPLETED")
        print(spark.log("ns", "job-1"))
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import dataclasses
import datetime
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.k8s.emulator import ApiError, K8sApi

logger = logging.getLogger("tests.k8s.spark_operator")

RESOURCE = "sparkoperator.k8s.io/v1beta2/sparkapplications"
BEHAVIOURS = frozenset({"run", "submission_failed", "stuck"})
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "SUBMISSION_FAILED"})
KILL_GRACE = 10.0  # seconds between SIGTERM and SIGKILL, like a pod's default terminationGracePeriodSeconds
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_behaviour(app: dict[str, Any]) -> str:
    return "run"


def _kill_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group of a driver we started in its own session (pgid == pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _SubmissionError(Exception):
    """The app cannot be submitted; the message goes after "failed to run spark-submit for ...: "."""


@dataclasses.dataclass
class _App:
    namespace: str
    name: str
    uid: str
    behaviour: str
    phase: str  # new | submitted | running | done | ignored
    app_dir: Path | None = None
    secrets_since: float | None = None  # monotonic time of the first attempt to mount the secrets
    proc: subprocess.Popen[bytes] | None = None
    kill_deadline: float | None = None  # when SIGTERM was sent after a deletion: SIGKILL after this


class SparkOperatorStandIn:
    """Plays the spark-operator for ``SparkApplications`` in the emulator ``api`` (see the module docstring).

    ``workdir``: where the per-app directories go (``<namespace>_<name>_<uid8>``, mode 0700, holding the
    secrets and ``driver.log``); ``main_files``: ``spec.mainApplicationFile`` -> local file to run;
    ``python``: the interpreter for the driver (also ``PYSPARK_PYTHON``); ``env``: extra environment for
    the driver; ``poll``: seconds between listings; ``secret_timeout``: how long a missing Secret is
    waited for before the app fails. Set ``behaviour`` (``app dict -> "run" | "submission_failed" |
    "stuck"``) before the apps it should apply to are created; it is asked once per app, when first seen.
    """

    def __init__(self, api: K8sApi, workdir: Path, main_files: Mapping[str, str | Path], python: str = sys.executable,
                 env: Mapping[str, str] | None = None, poll: float = 0.2, *, secret_timeout: float = 30.0) -> None:
        self.api = api
        self.workdir = Path(workdir)
        self.main_files = {key: Path(value).resolve() for key, value in main_files.items()}
        self.python = python
        self.env = dict(env or {})
        self.poll = poll
        self.secret_timeout = secret_timeout
        self.behaviour: Callable[[dict[str, Any]], str] = _default_behaviour
        self.apps_seen: list[str] = []
        self.errors: list[str] = []  # every error logged by the poll thread (API errors included), for tests
        self._apps: dict[tuple[str, str], _App] = {}
        self._dying: list[_App] = []  # deleted apps whose driver got SIGTERM and has not exited yet
        self._started: list[_App] = []  # every app whose driver was started, in order
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> SparkOperatorStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SparkOperatorStandIn:
        if self._thread is not None:
            raise RuntimeError("the spark-operator stand-in is already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="spark-operator-stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the poll thread, then kill every driver still running (its process group, by pid)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        with self._lock:
            procs = [app.proc for app in self._started if app.proc is not None and app.proc.poll() is None]
        for proc in procs:
            _kill_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)

    # --- what tests look at ------------------------------------------------------------------------

    def log(self, namespace: str, name: str) -> str:
        """The driver.log of the app (its latest incarnation); "" when its driver never started."""
        with self._lock:
            app = self._apps.get((namespace, name))
            if app is None:
                app = next((a for a in reversed(self._started) if (a.namespace, a.name) == (namespace, name)), None)
        if app is None or app.app_dir is None:
            return ""
        path = app.app_dir / "driver.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def pids(self) -> dict[tuple[str, str], int]:
        """The pid of every driver started so far, by (namespace, name) (the latest one per name).

        The process may have ended since; ended drivers are reaped, so their pids disappear.
        """
        with self._lock:
            return {(app.namespace, app.name): app.proc.pid for app in self._started if app.proc is not None}

    # --- the poll loop ----------------------------------------------------------------------------

    def _error(self, message: str, *args: object) -> None:
        logger.exception(message, *args)
        self.errors.append(message % args + f": {sys.exc_info()[1]!r}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll_once()
            except Exception:  # never let the thread die: retry on the next poll
                self._error("spark-operator stand-in: poll failed")
            self._stop.wait(self.poll)

    def _poll_once(self) -> None:
        self._reap_dying()
        items = self.api.list(RESOURCE)  # all namespaces
        listed: set[tuple[str, str]] = set()
        for obj in items:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if meta.get("deletionTimestamp"):
                continue  # being deleted: treated as gone
            listed.add(key)
            with self._lock:
                app = self._apps.get(key)
            if app is not None and app.uid != meta.get("uid"):
                self._forget(app)  # deleted and created again between two polls
                app = None
            if app is None:
                app = self._first_seen(obj)
            if app.phase in ("done", "ignored"):
                continue
            try:
                self._step(app, obj)
            except ApiError as exc:
                if exc.status == 404:  # deleted meanwhile: forgotten on the next poll
                    logger.info("spark-operator stand-in: %s/%s is gone: %s", app.namespace, app.name, exc)
                else:
                    self._error("spark-operator stand-in: %s/%s (phase %s)", app.namespace, app.name, app.phase)
            except Exception:
                self._error("spark-operator stand-in: %s/%s (phase %s)", app.namespace, app.name, app.phase)
        with self._lock:
            gone = [app for key, app in self._apps.items() if key not in listed]
        for app in gone:
            self._forget(app)

    def _first_seen(self, obj: dict[str, Any]) -> _App:
        meta = obj["metadata"]
        state = ((obj.get("status") or {}).get("applicationState") or {}).get("state", "")
        app = _App(meta["namespace"], meta["name"], meta.get("uid", ""), "run", "new")
        if state in TERMINAL_STATES:
            app.phase = "ignored"
        elif state:
            logger.warning("spark-operator stand-in: %s/%s first seen in state %s: left alone",
                           app.namespace, app.name, state)
            app.phase = "ignored"
        else:
            try:
                behaviour = self.behaviour(copy.deepcopy(obj))
                if behaviour not in BEHAVIOURS:
                    raise ValueError(f"unknown behaviour {behaviour!r} (expected one of {sorted(BEHAVIOURS)})")
                app.behaviour = behaviour
            except Exception:
                self._error("spark-operator stand-in: behaviour for %s/%s failed; app left alone",
                            app.namespace, app.name)
                app.phase = "ignored"
        with self._lock:
            self._apps[(app.namespace, app.name)] = app
            self.apps_seen.append(app.name)
        return app

    def _forget(self, app: _App) -> None:
        """The app left the API: a running driver gets SIGTERM (SIGKILL KILL_GRACE seconds later)."""
        with self._lock:
            if self._apps.get((app.namespace, app.name)) is app:
                del self._apps[(app.namespace, app.name)]
        if app.proc is not None and app.proc.poll() is None:
            logger.info("spark-operator stand-in: %s/%s deleted: killing its driver (pid %d)",
                        app.namespace, app.name, app.proc.pid)
            _kill_group(app.proc.pid, signal.SIGTERM)
            app.kill_deadline = time.monotonic() + KILL_GRACE
            self._dying.append(app)

    def _reap_dying(self) -> None:
        for app in list(self._dying):
            assert app.proc is not None
            if app.proc.poll() is not None:
                self._dying.remove(app)
            elif app.kill_deadline is not None and time.monotonic() >= app.kill_deadline:
                _kill_group(app.proc.pid, signal.SIGKILL)
                app.kill_deadline = None

    # --- the state machine --------------------------------------------------------------------------

    def _patch_status(self, app: _App, status: Mapping[str, Any]) -> None:
        self.api.patch_status(RESOURCE, app.name, status, app.namespace)

    def _step(self, app: _App, obj: dict[str, Any]) -> None:
        if app.phase == "new":
            self._submit(app, obj)
        if app.phase == "submitted" and app.behaviour == "run":
            self._start(app, obj)
        if app.phase == "running":
            self._check_exit(app)

    def _submit(self, app: _App, obj: dict[str, Any]) -> None:
        submission = {"submissionAttempts": 1, "lastSubmissionAttemptTime": _now(),
                      "driverInfo": {"podName": f"{app.name}-driver"}}
        problem: str | None = None
        if app.behaviour == "submission_failed":
            image = (obj.get("spec") or {}).get("image", "")
            problem = f'driver pod {app.name}-driver: image "{image}" cannot be pulled (ErrImagePull)'
        elif app.behaviour == "run":
            try:
                self._main_file(obj)
            except _SubmissionError as exc:
                problem = str(exc)
        if problem is not None:
            message = f"failed to run spark-submit for SparkApplication {app.namespace}/{app.name}: {problem}"
            self._patch_status(app, {**submission, "applicationState": {"state": "SUBMISSION_FAILED",
                                                                         "errorMessage": message}})
            app.phase = "done"
            return
        self._patch_status(app, {**submission, "submissionID": str(uuid.uuid4()),
                                 "applicationState": {"state": "SUBMITTED"}})
        app.phase = "submitted"

    def _main_file(self, obj: Mapping[str, Any]) -> Path:
        spec = obj.get("spec") or {}
        if spec.get("type") != "Python":
            raise _SubmissionError(f"spec.type: the stand-in runs only Python applications, not {spec.get('type')!r}")
        if spec.get("mode", "cluster") != "cluster":
            raise _SubmissionError(f"spec.mode: the stand-in runs only cluster mode, not {spec.get('mode')!r}")
        main = spec.get("mainApplicationFile", "")
        if main not in self.main_files:
            raise _SubmissionError(f"spec.mainApplicationFile: {main!r} is not a file the stand-in knows "
                                   f"(known: {sorted(self.main_files)})")
        return self.main_files[main]

    def _start(self, app: _App, obj: dict[str, Any]) -> None:
        if app.proc is None:
            if app.app_dir is None:
                app.app_dir = self.workdir / f"{app.namespace}_{app.name}_{app.uid[:8]}"
                app.app_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                app.app_dir.chmod(0o700)
            mounts = self._mount_secrets(app, obj)
            if mounts is None:
                return  # a Secret is still missing (or the app just FAILED for it)
            self._spawn(app, obj, mounts)
        self._patch_status(app, {"executionAttempts": 1, "applicationState": {"state": "RUNNING"}})
        app.phase = "running"

    def _mount_secrets(self, app: _App, obj: Mapping[str, Any]) -> dict[str, Path] | None:
        """Secret ``path`` -> local directory with its keys as 0600 files; None while a Secret is missing."""
        assert app.app_dir is not None
        secrets = ((obj.get("spec") or {}).get("driver") or {}).get("secrets") or []
        mounts: dict[str, Path] = {}
        if app.secrets_since is None:
            app.secrets_since = time.monotonic()
        for entry in secrets:
            secret_name, mount_path = entry["name"], entry["path"]
            secret = self.api.get_or_none("v1/secrets", secret_name, app.namespace)
            if secret is None:
                waited = time.monotonic() - app.secrets_since
                if waited < self.secret_timeout:
                    return None
                message = (f'driver pod {app.name}-driver failed to start: MountVolume.SetUp failed for volume '
                           f'"{secret_name}-volume" : secret "{secret_name}" not found '
                           f'(waited {self.secret_timeout:g} s)')
                self._patch_status(app, {"terminationTime": _now(),
                                         "applicationState": {"state": "FAILED", "errorMessage": message}})
                app.phase = "done"
                return None
            target = app.app_dir / "secrets" / secret_name
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.parent.chmod(0o700)
            target.chmod(0o700)
            for key, value in (secret.get("data") or {}).items():
                if not _SECRET_KEY_RE.match(key) or key in (".", ".."):
                    logger.warning("spark-operator stand-in: secret %s/%s: key %r skipped",
                                   app.namespace, secret_name, key)
                    continue
                try:
                    content = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    logger.warning("spark-operator stand-in: secret %s/%s: key %r is not base64",
                                   app.namespace, secret_name, key)
                    continue
                fd = os.open(target / key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as file:
                    os.fchmod(file.fileno(), 0o600)
                    file.write(content)
            mounts[mount_path] = target
        return mounts

    @staticmethod
    def _rewrite(argument: str, mounts: Mapping[str, Path]) -> str:
        for mount_path, local in mounts.items():
            prefix = mount_path.rstrip("/")
            if argument == mount_path or argument == prefix:
                return str(local)
            if argument.startswith(prefix + "/"):
                return str(local) + argument[len(prefix):]
        return argument

    def _spawn(self, app: _App, obj: Mapping[str, Any], mounts: Mapping[str, Path]) -> None:
        assert app.app_dir is not None
        main = self._main_file(obj)
        arguments = [self._rewrite(str(a), mounts) for a in (obj.get("spec") or {}).get("arguments") or []]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": self.python, **self.env}
        with (app.app_dir / "driver.log").open("ab") as log:
            proc = subprocess.Popen([self.python, str(main), *arguments], cwd=app.app_dir, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        logger.info("spark-operator stand-in: %s/%s driver started (pid %d)", app.namespace, app.name, proc.pid)
        with self._lock:
            app.proc = proc
            self._started.append(app)

    def _check_exit(self, app: _App) -> None:
        assert app.proc is not None
        code = app.proc.poll()
        if code is None:
            return
        if code == 0:
            state: dict[str, Any] = {"state": "COMPLETED"}
        else:
            exit_code = 128 - code if code < 0 else code  # killed by a signal: a container's 128+signal
            state = {"state": "FAILED",
                     "errorMessage": f"driver container failed with ExitCode: {exit_code}, Reason: Error"}
        self._patch_status(app, {"terminationTime": _now(), "applicationState": state})
        app.phase = "done"
