"""kopf handlers: thin adapters from Kubernetes events to the reconcile core.

Every handler parses the resource, asks the kind's reconcile function (the table in
``controllers/dispatch.py``) for an Outcome and turns it into kopf terms: the status patch, Kubernetes Events,
``TemporaryError`` to come back soon while waiting for something, ``PermanentError`` for a spec that
cannot work. Timers refresh status (and re-apply the spec, correcting drift) periodically.

The tracker runs from a timer on every tracked ReplicatedTable but checks at most once per period
operator-wide (``TrackerLoop.maybe_check``). kopf pauses handlers and timers of an operator that
is not the active peer, so only the active operator ever runs the tracker.

Nothing is built when this module is imported. Importing it registers the handlers with kopf (that
is how kopf finds them) and that is all: :func:`run` starts kopf with the CLI's
:class:`~.settings.OperatorSettings` in kopf's memo, and the startup handler builds the
:class:`~.runtime.Runtime` (engine clients, registry, tracker) from them and keeps it in the memo,
which kopf hands (shallow-copied per object) to every handler. The startup handler also registers
the two timers, because their intervals are settings.

kopf runs an object's timers beside its change handlers, each on a worker thread, so two
reconciles of one object could overlap: both would see a schema edit undone and both alter the
table (two ``SchemaMigrated`` events), or both start a step of a bootstrap. ``_object_lock`` makes
them take turns. The later one then reads the engines after the earlier one's changes.

Started by plain ``kopf run -m reptables.operator.handlers`` instead of the CLI, the startup
handler resolves the settings from the environment itself.

This module and ``cli.py`` are the only ones that import kopf; the core runs without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from datetime import UTC, datetime
from typing import Any

import kopf

from . import models
from .controllers.conditions import Cond, merge
from .controllers.dispatch import ORDER, RECONCILERS, finalize, is_ready, reconcile
from .controllers.world import Outcome, Resource
from .models import ConditionStatus, ConditionType
from .models.common import parse_time
from .registry import CREDENTIALS_SELECTOR, CredentialPolicy
from .runtime import Runtime
from .settings import OperatorSettings

log = logging.getLogger("reptables.operator")

GROUP, VERSION = models.GROUP, models.VERSION
FINALIZER = "reptables.io/finalizer"
#: keys of kopf's operator memo
SETTINGS_KEY, RUNTIME_KEY, TIMERS_KEY = "settings", "runtime", "timers_registered"


def run(settings: OperatorSettings) -> None:
    """Run the operator until it is stopped: logging, metrics, then kopf with the settings in its memo."""
    from reptables.engine import logs

    logs.configure("debug" if settings.verbose else "info")
    kopf_logger = logging.getLogger("kopf")
    kopf_logger.handlers[:] = logging.getLogger("reptables").handlers
    kopf_logger.setLevel(logging.DEBUG if settings.verbose else logging.INFO)
    kopf_logger.propagate = False
    logging.getLogger("kopf.objects").addFilter(_RoutineSuccess())  # (a logger's filter sees only its own records)
    if settings.metrics_port:
        import prometheus_client

        prometheus_client.start_http_server(settings.metrics_port)
    asyncio.run(kopf.operator(
        standalone=settings.standalone, peering_name=settings.peering, priority=settings.priority,
        clusterwide=settings.all_namespaces, namespaces=settings.namespaces,
        liveness_endpoint=settings.liveness, memo=kopf.Memo({SETTINGS_KEY: settings})))


class _RoutineSuccess(logging.Filter):
    """Drops kopf's "Timer ... succeeded." and "Handler '...observe' succeeded." lines (below
    WARNING): every status refresh and every watch event logged one, 120 lines a second from an idle
    operator over 600 resources (and 6 % of its CPU). Failures, retries and the create/update
    handlers' lines stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        message = record.getMessage()
        return not (message.endswith("succeeded.") and (message.startswith("Timer ") or ".observe'" in message))


def _runtime(memo: kopf.Memo) -> Runtime:
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the operator runtime is missing: kopf's startup handler has not run")
    return runtime


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours = memo.get(SETTINGS_KEY)
    if not isinstance(ours, OperatorSettings):  # started by `kopf run`, not by `reptables operator`
        try:
            ours = memo[SETTINGS_KEY] = OperatorSettings.resolve(os.environ)
        except ValueError as exc:
            raise kopf.PermanentError(str(exc)) from None  # retrying cannot fix the environment
    settings.persistence.finalizer = FINALIZER
    # handler progress and the last-handled spec live in annotations: status is ours, and the API
    # server prunes fields the CRD schema does not declare
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="reptables.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="reptables.io")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.execution.max_workers = 8
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)
    # Secrets: only those labelled as credentials are listed and watched (server-side), and only in
    # the namespaces TableClusters may take credentials from are they kept (``registry.py``)
    settings.watching.label_selectors["v1", "secrets"] = CREDENTIALS_SELECTOR
    if RUNTIME_KEY not in memo:
        launcher = None
        if ours.spark_jobs is not None:
            from .jobs.spark_applications import SparkApplicationLauncher  # the kubernetes client, only when jobs run

            launcher = SparkApplicationLauncher(ours.spark_jobs, default_namespace=ours.operator_namespace)
        from .cnpg import CloudNativePGClusters  # (its API client is made at its first read)

        memo[RUNTIME_KEY] = Runtime.start(ours.operator_namespace, ours.tracker_period,
                                          CredentialPolicy(ours.secret_namespaces), launcher=launcher,
                                          database_clusters=CloudNativePGClusters(ours.operator_namespace))
    if not memo.get(TIMERS_KEY):
        _register_timers(ours)
        memo[TIMERS_KEY] = True
    log.info("operator started", extra={"operator_namespace": ours.operator_namespace,
                                        "namespaces": ",".join(ours.namespaces) or "*",
                                        "credentials_namespaces": ",".join(sorted(ours.secret_namespaces)),
                                        "status_refresh": ours.status_refresh,
                                        "tracker_period": ours.tracker_period,
                                        "bootstrap_jobs": ("SparkApplications of image " + ours.spark_jobs.image
                                                           if ours.spark_jobs else "none (they wait)")})


@kopf.on.cleanup()
def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, Runtime):
        runtime.close()


def _apply(outcome: Outcome, body: kopf.Body, patch: kopf.Patch) -> None:
    # only what changed goes to the API server: refreshes of an unchanged status cost nothing
    current = body.get("status") or {}
    for key, value in outcome.status.items():
        if current.get(key) != value and not (key == "lastProbeTime" and _recent(current.get(key))):
            patch.status[key] = value
    for event in outcome.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _recent(timestamp: Any, seconds: float = 60.0) -> bool:
    """True for an RFC 3339 time less than ``seconds`` old (probe times are refreshed once a minute)."""
    then = parse_time(timestamp)
    return then is not None and (datetime.now(UTC) - then).total_seconds() < seconds


#: guards ``_object_locks`` (a leaf: held only to find or make an object's lock)
_object_locks_lock = threading.Lock()
#: (kind, namespace, name) -> the lock one reconcile or finalize of that object holds (never two objects' at once)
_object_locks: dict[tuple[str, str | None, str], threading.Lock] = {}


def _object_lock(kind: str, body: kopf.Body) -> threading.Lock:
    key = (kind, body.meta.namespace, str(body.meta.name))
    with _object_locks_lock:
        return _object_locks.setdefault(key, threading.Lock())


def _reconcile(kind: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, waiting_retries: bool) -> None:
    with _object_lock(kind, body):
        _reconcile_one(kind, body, patch, memo, waiting_retries)


def _reconcile_one(kind: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, waiting_retries: bool) -> None:
    runtime = _runtime(memo)
    registry = runtime.registry
    try:
        res = registry.upserted(body)
    except models.InvalidResourceError as exc:
        patch.status["conditions"] = merge((body.get("status") or {}).get("conditions"),
                                           [Cond(ConditionType.READY, False, "InvalidSpec", str(exc))],
                                           body.meta.get("generation"))
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    if res.deleting:
        return  # the deletion handler owns the object now
    refused = runtime.admit(res)
    if refused is not None:
        # (a TableCluster whose credentials cannot be used: nothing is sent to its endpoint)
        _apply(refused, body, patch)
        raise kopf.TemporaryError(_waiting(refused), delay=refused.retry_after)
    outcome = reconcile(res, registry.world())
    _apply(outcome, body, patch)
    if waiting_retries and not is_ready(outcome.status) and outcome.retry_after is not None \
            and outcome.retry_after <= 5:
        raise kopf.TemporaryError(_waiting(outcome), delay=outcome.retry_after)


def _waiting(outcome: Outcome) -> str:
    """What a resource that is not Ready waits for: the messages of its conditions that are not True."""
    return "waiting: " + ", ".join(c.get("message", "") for c in outcome.status.get("conditions", [])
                                   if c.get("status") != ConditionStatus.TRUE)


def _finalize(kind: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    with _object_lock(kind, body):
        _finalize_one(kind, body, patch, memo)


def _finalize_one(kind: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    registry = _runtime(memo).registry
    try:
        res = registry.resource(body)
    except models.InvalidResourceError:
        return
    outcome = finalize(res, registry.world())
    _apply(outcome, body, patch)
    if not outcome.finished:
        raise kopf.TemporaryError("deletion waits: " + "; ".join(e.message for e in outcome.events),
                                  delay=outcome.retry_after or 10)
    registry.remove(kind, body.meta.namespace, str(body.meta.name))


def _register(kind: str) -> None:
    """The handlers of one kind that need no settings (the refresh timer comes at startup)."""
    plural = models.PLURALS[kind]

    @kopf.on.event(GROUP, VERSION, plural)
    def observe(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        registry = _runtime(memo).registry
        if event.get("type") == "DELETED":
            registry.remove(kind, body.meta.namespace, str(body.meta.name))
            with _object_locks_lock:  # its reconciles are over: the finalizer has run
                _object_locks.pop((kind, body.meta.namespace, str(body.meta.name)), None)
        else:
            registry.upsert(body)

    @kopf.on.create(GROUP, VERSION, plural)
    @kopf.on.update(GROUP, VERSION, plural, field="spec")
    @kopf.on.resume(GROUP, VERSION, plural)
    def apply(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        _reconcile(kind, body, patch, memo, waiting_retries=True)

    @kopf.on.delete(GROUP, VERSION, plural)
    def delete(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        _finalize(kind, body, patch, memo)


for _kind in RECONCILERS:
    _register(_kind)


@kopf.on.event("v1", "secrets")
def observe_secret(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    registry = _runtime(memo).registry
    if event.get("type") == "DELETED":
        registry.remove_secret(str(body.meta.namespace), str(body.meta.name))
    else:
        registry.upsert_secret(body)


def _register_timers(settings: OperatorSettings) -> None:
    """The timers, whose intervals are settings: each kind's status refresh, and the tracker."""
    for kind in ORDER:
        _register_refresh(kind, settings.status_refresh)
    kopf.timer(GROUP, VERSION, "replicatedtables", interval=settings.tracker_period, when=_tracked)(track)


def _register_refresh(kind: str, period: float) -> None:
    @kopf.timer(GROUP, VERSION, models.PLURALS[kind], interval=period, initial_delay=period, idle=1)
    def refresh(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        _reconcile(kind, body, patch, memo, waiting_retries=False)


def _tracked(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("replicatedTableOptions") or {}).get("enableReplicatedTableTracker"))


def _reference(table: Resource) -> kopf.Body:
    """Just enough of a ReplicatedTable for kopf to address an Event to it."""
    return kopf.Body({"apiVersion": models.API_VERSION, "kind": table.kind,
                      "metadata": {"name": table.name, "namespace": table.namespace or "", "uid": table.uid}})


def track(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Runs the operator-wide tracker check (at most once per period) and publishes this table's verdict."""
    runtime = _runtime(memo)
    runtime.tracker.maybe_check()
    for switch in runtime.pending_switches():
        kopf.event(_reference(switch.table), type="Normal", reason="ReplicaModeChanged", message=switch.message)
    # (the table's reconcile writes the same status.tracker from the same journal; this is sooner)
    current = (body.get("status") or {}).get("tracker") or {}
    tracker = runtime.registry.tracker_journal.status((body.meta.namespace, str(body.meta.name)), current)
    if tracker is not None and tracker != current:
        patch.status["tracker"] = tracker
