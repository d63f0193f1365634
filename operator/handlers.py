"""kopf handlers: thin adapters from Kubernetes events to the reconcile core.

Every handler parses the resource, asks the matching ``reconcile_*`` function for an Outcome and
turns it into kopf terms: the status patch, Kubernetes Events, ``TemporaryError`` to come back
soon while waiting for something, ``PermanentError`` for a spec that cannot work. Timers refresh
status (and re-apply the spec, correcting drift) periodically.

The tracker runs from a timer on every tracked ReplicatedTable but checks at most once per period
operator-wide (``TrackerLoop.maybe_check``). kopf pauses handlers and timers of an operator that
is not the active peer, so only the active operator ever runs the tracker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import kopf

from reptables.operator import models
from reptables.operator.conditions import Cond, merge
from reptables.operator.reconcile_clusters import finalize_table_cluster, reconcile_table_cluster
from reptables.operator.reconcile_collocations import finalize_table_collocation, reconcile_table_collocation
from reptables.operator.reconcile_replicas import finalize_table_replica, reconcile_table_replica
from reptables.operator.reconcile_tables import finalize_replicated_table, reconcile_replicated_table
from reptables.operator.registry import Registry
from reptables.operator.tracking import TrackerLoop
from reptables.operator.world import Engines, Outcome, Resource, World

log = logging.getLogger("reptables.operator")

GROUP, VERSION = models.GROUP, models.VERSION
FINALIZER = "reptables.io/finalizer"
OPERATOR_NAMESPACE = os.environ.get("REPTABLES_NAMESPACE", os.environ.get("POD_NAMESPACE", "reptables-system"))
STATUS_REFRESH = float(os.environ.get("REPTABLES_STATUS_REFRESH", "5"))
TRACKER_PERIOD = float(os.environ.get("REPTABLES_TRACKER_PERIOD", "1"))

ENGINES = Engines()
REGISTRY = Registry(ENGINES, OPERATOR_NAMESPACE)


def _publish_switch(table: Resource, replica_id: str, mode: str, reason: str) -> None:
    _pending_events.append((table, "Normal", "ReplicaModeChanged", f"replica {replica_id} is now {mode}: {reason}"))


_pending_events: list[tuple[Resource, str, str, str]] = []
TRACKER = TrackerLoop(REGISTRY.world(), period=TRACKER_PERIOD, on_switch=_publish_switch)

Reconciler = Callable[[Resource, World], Outcome]
RECONCILERS: dict[str, tuple[Reconciler, Reconciler]] = {
    "TableCluster": (reconcile_table_cluster, finalize_table_cluster),
    "ReplicatedTable": (reconcile_replicated_table, finalize_replicated_table),
    "TableReplica": (reconcile_table_replica, finalize_table_replica),
    "TableCollocation": (reconcile_table_collocation, finalize_table_collocation),
}


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
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


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    TRACKER.close()
    ENGINES.close()


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
    from datetime import UTC, datetime

    try:
        then = datetime.strptime(str(timestamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return False
    return (datetime.now(UTC) - then).total_seconds() < seconds


def _reconcile(kind: str, body: kopf.Body, patch: kopf.Patch, waiting_retries: bool) -> None:
    REGISTRY.upsert(body)
    try:
        res = REGISTRY.resource(body)
    except models.InvalidResourceError as exc:
        patch.status["conditions"] = merge((body.get("status") or {}).get("conditions"),
                                           [Cond("Ready", False, "InvalidSpec", str(exc))], body.meta.get("generation"))
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(exc))
        raise kopf.PermanentError(str(exc)) from None
    if res.deleting:
        return  # the deletion handler owns the object now
    if kind == "TableCluster":
        problem = REGISTRY.refresh_cluster(res.name)
        if problem is not None:
            patch.status["conditions"] = merge(res.status.get("conditions"),
                                               [Cond("Ready", False, "SecretNotFound", problem)], res.generation)
            raise kopf.TemporaryError(problem, delay=10)
    outcome = RECONCILERS[kind][0](res, REGISTRY.world())
    _apply(outcome, body, patch)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in outcome.status.get("conditions", []))
    if waiting_retries and not ready and outcome.retry_after is not None and outcome.retry_after <= 5:
        raise kopf.TemporaryError("waiting: " + ", ".join(
            c.get("message", "") for c in outcome.status.get("conditions", []) if c.get("status") != "True"),
            delay=outcome.retry_after)


def _finalize(kind: str, body: kopf.Body, patch: kopf.Patch) -> None:
    try:
        res = REGISTRY.resource(body)
    except models.InvalidResourceError:
        return
    outcome = RECONCILERS[kind][1](res, REGISTRY.world())
    _apply(outcome, body, patch)
    if not outcome.finished:
        raise kopf.TemporaryError("deletion waits: " + "; ".join(e.message for e in outcome.events),
                                  delay=outcome.retry_after or 10)
    meta = body.get("metadata", {})
    REGISTRY.remove(kind, meta.get("namespace"), meta.get("name"))


def _register(kind: str) -> None:
    plural = models.PLURALS[kind]

    @kopf.on.event(GROUP, VERSION, plural)
    def observe(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata", {})
        if event.get("type") == "DELETED":
            REGISTRY.remove(kind, meta.get("namespace"), meta.get("name"))
        else:
            REGISTRY.upsert(body)

    @kopf.on.create(GROUP, VERSION, plural)
    @kopf.on.update(GROUP, VERSION, plural, field="spec")
    @kopf.on.resume(GROUP, VERSION, plural)
    def apply(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _reconcile(kind, body, patch, waiting_retries=True)

    @kopf.timer(GROUP, VERSION, plural, interval=STATUS_REFRESH, initial_delay=STATUS_REFRESH, idle=1)
    def refresh(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _reconcile(kind, body, patch, waiting_retries=False)

    @kopf.on.delete(GROUP, VERSION, plural)
    def delete(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        _finalize(kind, body, patch)


for _kind in RECONCILERS:
    _register(_kind)


@kopf.on.event("v1", "secrets")
def observe_secret(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    meta = body.get("metadata", {})
    if event.get("type") == "DELETED":
        REGISTRY.remove_secret(meta.get("namespace"), meta.get("name"))
    else:
        REGISTRY.upsert_secret(body)


@kopf.timer(GROUP, VERSION, "replicatedtables", interval=TRACKER_PERIOD,
            when=lambda spec, **_: bool((spec.get("replicatedTableOptions") or {}).get("enableReplicatedTableTracker")))
def track(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Runs the operator-wide tracker check (at most once per period) and publishes this table's verdict."""
    TRACKER.maybe_check()
    while _pending_events:
        table, type_, reason, message = _pending_events.pop()
        kopf.event({"apiVersion": models.API_VERSION, "kind": "ReplicatedTable",
                    "metadata": {"name": table.name, "namespace": table.namespace, "uid": table.uid}},
                   type=type_, reason=reason, message=message)
    meta = body.get("metadata", {})
    verdict = TRACKER.verdicts.get((meta.get("namespace"), meta.get("name")))
    if verdict is None:
        return
    current = (body.get("status") or {}).get("tracker") or {}
    if current.get("lastDecision") != verdict.decision or current.get("reason") != verdict.reason:
        from datetime import UTC, datetime

        patch.status["tracker"] = {"lastDecision": verdict.decision, "reason": verdict.reason,
                                   "time": datetime.fromtimestamp(verdict.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
