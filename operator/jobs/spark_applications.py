"""Running the bootstrap and verify jobs on Kubernetes: one SparkApplication per attempt.

The kubeflow spark-operator runs a ``sparkoperator.k8s.io/v1beta2`` SparkApplication: it submits
the driver, follows it and writes ``status.applicationState.state``. This launcher creates one app
per job attempt and reads that state back; it never edits an app it submitted, because the
spark-operator re-runs an app whose spec changes (a copy running twice at once). So each attempt
gets a new, unique name, and the reconcile core's ``jobRef`` (``sparkapplication:<ns>/<name>``)
is all it needs to find the job again — after an operator restart too: the launcher keeps no
state of its own.

* **Owned by the TableReplica**: deleting the replica deletes its apps (garbage collection).
  ``timeToLiveSeconds`` lets the spark-operator delete a finished app after a while.
* **Secrets**: the job's token and peer credentials go into a Secret ``<app>-credentials`` owned
  by the app, created right after it (the kubelet starts the driver once the Secret exists) and
  mounted into the driver only, as files whose paths the job gets as options. They never appear in
  the app's spec, its arguments, the operator's status, events or logs. Executors get no secret:
  the driver hands each task what it needs.
* **Stuck apps**: an app that is still waiting to run (``""``, SUBMITTED, PENDING_RERUN, a suspend
  state) ``submitTimeoutSeconds`` after its creation (a driver image that cannot be pulled, a pod
  that is never scheduled, no spark-operator at all) is deleted and counts as a failed attempt,
  with a message saying what to check. The spark-operator itself would wait forever.
* **Failures** are reported with the app's ``errorMessage`` and where to read the driver's log.

It talks to the API with the official ``kubernetes`` client, as kopf's documentation does for
child objects, through an ``ApiClient`` of its own (in-cluster configuration, else the
kubeconfig), with the verbs the chart grants: ``create``, ``get`` and ``delete`` on
sparkapplications, ``create`` on secrets.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from ..models.common import parse_time
from ..settings import SparkJobSettings
from .launcher import JobSpec, JobState, LaunchError

log = logging.getLogger("reptables.operator.sparkapp")

GROUP, VERSION, PLURAL, KIND = "sparkoperator.k8s.io", "v1beta2", "sparkapplications", "SparkApplication"
API_VERSION = f"{GROUP}/{VERSION}"
REF_PREFIX = "sparkapplication:"
#: where the driver finds the job's secret files
SECRET_DIR = "/etc/reptables/job"
USER_AGENT = "reptables-operator"
#: states in which the app has not run yet: the submit timeout applies
WAITING = frozenset({"", "SUBMITTED", "PENDING_RERUN", "SUSPENDING", "SUSPENDED", "RESUMING"})
SUCCEEDED = frozenset({"COMPLETED"})
FAILED = frozenset({"FAILED", "SUBMISSION_FAILED"})
#: longest app name: the spark-operator derives pod (``<name>-driver``) and service names from it
MAX_NAME = 50
_REQUEST_TIMEOUT = (5.0, 30.0)
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def app_name(job_name: str) -> str:
    """A DNS label of at most :data:`MAX_NAME` characters, unique for a unique job name."""
    name = _NOT_DNS.sub("-", job_name.lower()).strip("-")
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9].rstrip('-')}-{digest}"
    return name or "job"


def parse_ref(ref: str) -> tuple[str, str] | None:
    """``sparkapplication:<ns>/<name>`` -> (namespace, name); None for another launcher's reference."""
    if not ref.startswith(REF_PREFIX) or "/" not in ref:
        return None
    namespace, _, name = ref[len(REF_PREFIX):].partition("/")
    return namespace, name


def build_app(job: JobSpec, settings: SparkJobSettings, name: str, namespace: str) -> dict[str, Any]:
    """The SparkApplication of one job attempt (it validates against the spark-operator's CRD)."""
    labels = {"app.kubernetes.io/name": "reptables", "app.kubernetes.io/component": f"{job.job}-job",
              "app.kubernetes.io/managed-by": "reptables-operator"}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if job.owner is not None:
        # (reptables.io/tablereplica for a bootstrap, reptables.io/xdcrgroup for a join)
        labels[f"reptables.io/{job.owner.kind.lower()}"] = job.owner.name
        metadata["labels"] = dict(labels)
        metadata["ownerReferences"] = [{"apiVersion": job.owner.api_version, "kind": job.owner.kind,
                                        "name": job.owner.name, "uid": job.owner.uid, "controller": True,
                                        "blockOwnerDeletion": True}]
    arguments = [job.job, *job.args]
    for option in job.secrets:
        arguments += [f"--{option}", f"{SECRET_DIR}/{option}"]
    spec: dict[str, Any] = {
        "type": "Python", "mode": "cluster", "image": settings.image, "imagePullPolicy": settings.image_pull_policy,
        "sparkVersion": settings.spark_version, "mainApplicationFile": settings.main_application_file,
        "arguments": arguments,
        # one attempt is one app: the operator retries with a new app, never the spark-operator
        "restartPolicy": {"type": "Never"},
        "timeToLiveSeconds": settings.time_to_live_seconds,
        "driver": {"cores": settings.driver_cores, "memory": settings.driver_memory,
                   "serviceAccount": settings.service_account, "labels": dict(labels),
                   "secrets": ([{"name": secret_name(name), "path": SECRET_DIR, "secretType": "Generic"}]
                               if job.secrets else [])},
        "executor": {"instances": settings.executor_instances, "cores": settings.executor_cores,
                     "memory": settings.executor_memory, "labels": dict(labels)},
    }
    if settings.spark_conf:
        spec["sparkConf"] = dict(settings.spark_conf)
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def secret_name(app: str) -> str:
    return f"{app}-credentials"


def build_secret(job: JobSpec, app: Mapping[str, Any]) -> dict[str, Any]:
    """The app's credentials Secret, owned by the app (deleted with it)."""
    meta = app["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": {"app.kubernetes.io/name": "reptables",
                                    "app.kubernetes.io/managed-by": "reptables-operator"},
                         "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                                              "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "stringData": dict(job.secrets)}


def _api_reason(exc: ApiException) -> str:
    """The API server's message of a failed request (its Status body), else the HTTP reason."""
    import json

    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {message or exc.reason}"


class SparkApplicationLauncher:
    """A :class:`~.launcher.Launcher` whose jobs are SparkApplications (see the module docstring)."""

    def __init__(self, settings: SparkJobSettings, api_client: k8s.ApiClient | None = None,
                 default_namespace: str = "default") -> None:
        self.settings = settings
        self.default_namespace = default_namespace
        self.api_client = api_client if api_client is not None else self.connect()
        self.api_client.user_agent = USER_AGENT
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)

    @staticmethod
    def connect(kubeconfig: str | None = None) -> k8s.ApiClient:
        """An API client from the in-cluster service account, else from ``kubeconfig`` (default:
        ``$KUBECONFIG`` as it is now, else ``~/.kube/config``)."""
        configuration = k8s.Configuration()
        if kubeconfig is None:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
                return k8s.ApiClient(configuration)
            except k8s_config.ConfigException:
                kubeconfig = os.environ.get("KUBECONFIG") or None
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return k8s.ApiClient(configuration)

    # -- Launcher -----------------------------------------------------------------------------------

    def start(self, job: JobSpec) -> str:
        namespace = (job.owner.namespace if job.owner is not None else None) or self.default_namespace
        name = app_name(job.name)
        body = build_app(job, self.settings, name, namespace)
        where = f"SparkApplication {namespace}/{name}"
        try:
            created = cast(dict[str, Any], self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, _request_timeout=_REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                raise LaunchError(f"cannot create {where}: the API has no {PLURAL}.{GROUP}/{VERSION} (install the "
                                  "kubeflow spark-operator and its CRD)") from None
            if exc.status != 409:
                raise LaunchError(f"cannot create {where}: {_api_reason(exc)}") from None
            # started already (job names are one per attempt): the same job, if it is this replica's
            created = self._existing(namespace, name, job, where)
        if job.secrets:
            try:
                # the client serializes a plain dict as it is (no model objects needed)
                self.core.create_namespaced_secret(namespace, cast(k8s.V1Secret, build_secret(job, created)),
                                                   _request_timeout=_REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status != 409:  # 409: made with the app by an earlier start of this job
                    self._delete(namespace, name)
                    raise LaunchError(f"cannot create the credentials Secret {namespace}/{secret_name(name)} of "
                                      f"{where}: {_api_reason(exc)}") from None
        log.info("started %s for %s", where, job.name)
        return f"{REF_PREFIX}{namespace}/{name}"

    def _existing(self, namespace: str, name: str, job: JobSpec, where: str) -> dict[str, Any]:
        """The app of an earlier start of ``job``; LaunchError when the name belongs to something else."""
        try:
            app = cast(dict[str, Any], self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_REQUEST_TIMEOUT))
        except ApiException as exc:
            raise LaunchError(f"cannot create {where}: it exists but cannot be read: {_api_reason(exc)}") from None
        owners = [o.get("uid") for o in (app.get("metadata") or {}).get("ownerReferences") or []]
        if job.owner is not None and job.owner.uid not in owners:
            raise LaunchError(f"cannot create {where}: a SparkApplication of that name exists and belongs to "
                              "another object")
        return app

    def poll(self, ref: str) -> JobState | None:
        parsed = parse_ref(ref)
        if parsed is None:
            return None
        namespace, name = parsed
        where = f"SparkApplication {namespace}/{name}"
        try:
            app = cast(dict[str, Any], self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None  # deleted by someone, or its time to live ran out before it was looked at
            raise LaunchError(f"cannot read {where}: {_api_reason(exc)}") from None
        status = app.get("status") or {}
        app_state = status.get("applicationState") or {}
        state = str(app_state.get("state") or "")
        if state in SUCCEEDED:
            return JobState(running=False, exit_code=0)
        if state in FAILED:
            pod = (status.get("driverInfo") or {}).get("podName")
            where_log = (f"; the driver's log: kubectl logs -n {namespace} {pod}" if pod and state == "FAILED"
                         else "")
            return JobState(running=False, exit_code=1,
                            error=f"{where} {state}: {app_state.get('errorMessage') or 'no message'}{where_log}")
        if state in WAITING:
            created = parse_time((app.get("metadata") or {}).get("creationTimestamp"))
            waited = (datetime.now(UTC) - created).total_seconds() if created else 0.0
            if waited > self.settings.submit_timeout_seconds:
                self._delete(namespace, name)
                return JobState(running=False, exit_code=1, error=(
                    f"{where} was still {state or 'not submitted'} {waited:.0f} s after its creation (limit "
                    f"{self.settings.submit_timeout_seconds} s: submitTimeoutSeconds), so it was deleted; check that "
                    f"the spark-operator runs, that the image {self.settings.image} can be pulled and that the "
                    "driver pod can be scheduled"))
        return JobState(running=True)

    def stop(self, ref: str) -> None:
        parsed = parse_ref(ref)
        if parsed is not None:
            self._delete(*parsed)

    def close(self) -> None:
        # running apps go on: a restarted operator finds them again by their jobRef
        self.api_client.close()

    def _delete(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                        propagation_policy="Background",
                                                        _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("cannot delete SparkApplication %s/%s: %s", namespace, name, _api_reason(exc))
