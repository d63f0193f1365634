"""The status view's data: reptables objects and Events turned into one JSON-able dict.

:func:`build_view` is what ``kubectl reptables status`` and ``reptables status`` print with ``-o
json``/``-o yaml`` and what :mod:`.statusview` renders as text: per replicated table its Ready
condition, sync replicas, tracker (last decision, recent switches, latest check) and per replica
its mode, state, lag, rows behind and bootstrap — each replica from its TableReplica's status, which
the operator writes from the meta-cluster (and leaves out what it cannot know, with
``unreachable`` saying since when) — per XDCR group its pairs, the clusters (an HA table cluster's
leader, standbys and database primary), the collocations, the tracker's switch Events and the other
recent Events. Nothing here talks to Kubernetes or an
engine, and everything is sorted so that the output is deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from reptables.engine.replica_types import ReplicaMode

from ..models import KINDS as KIND_MODELS
from ..models import ConditionStatus, ConditionType

__all__ = ["KINDS", "MAX_EVENTS", "MAX_SWITCHES", "SWITCH_REASON", "build_view", "display_name", "find_replica"]

KINDS = tuple(KIND_MODELS)
MAX_SWITCHES = 50
"""At most this many tracker switches are kept in the view (the newest)."""
MAX_EVENTS = 20
"""At most this many other recent events are kept in the view (the newest)."""
SWITCH_REASON = "ReplicaModeChanged"
_SWITCH_MESSAGE = re.compile(r"^replica (?P<id>\S+) is now (?P<mode>sync|async): (?P<reason>.*)$", re.DOTALL)
DEFAULT_MAX_ATTEMPTS = 3


# --- building the view --------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _conditions(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason"),
            "message": c.get("message"), "lastTransitionTime": c.get("lastTransitionTime")}
           for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    # Ready first, then by type
    return sorted(out, key=lambda c: (c["type"] != ConditionType.READY, str(c["type"])))


def _ready(conditions: list[dict[str, Any]]) -> str:
    return next((str(c["status"]) for c in conditions if c["type"] == ConditionType.READY),
                ConditionStatus.UNKNOWN.value)


def display_name(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _bootstrap(spec: Mapping[str, Any], status: Mapping[str, Any],
               conditions: list[dict[str, Any]]) -> dict[str, Any] | None:
    boot = _section(status, "bootstrap")
    if not boot:
        return None
    cond = next((c for c in conditions if c["type"] == "Bootstrapped"), None)
    return {
        "phase": boot.get("phase"),
        "snapshotTimestamp": boot.get("snapshotTimestamp"),
        "sourceReplicaId": boot.get("sourceReplicaId"),
        "attempts": boot.get("attempts"),
        "maxAttempts": _section(spec, "bootstrap").get("maxAttempts", DEFAULT_MAX_ATTEMPTS),
        "rowsCopied": boot.get("rowsCopied"),
        "jobRef": boot.get("jobRef"),
        "nextAttemptTime": boot.get("nextAttemptTime"),
        "lastError": boot.get("lastError"),
        "message": cond["message"] if cond else None,
    }


def _rows_behind(tablets: Mapping[str, Any]) -> int | None:
    """Queue rows not yet replicated, when the operator reports them in ``status.tablets``."""
    value = tablets.get("rowsBehind")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _unreachable(status: Mapping[str, Any]) -> dict[str, Any] | None:
    lost = _section(status, "unreachable")
    return {"cluster": lost.get("cluster"), "since": lost.get("since"), "message": lost.get("message")} \
        if lost.get("cluster") else None


def _replica(obj: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """A replica: from its TableReplica's status when the object exists (the operator writes it from the
    meta-cluster on every pass, and leaves out what it cannot know), else from the table's summary."""
    spec, status = _section(obj, "spec"), _section(obj, "status")
    source = status if obj else summary
    conditions = _conditions(status)
    tablets = _section(status, "tablets")
    errors = [e for e in status.get("errors") or [] if isinstance(e, Mapping)]
    last_error = errors[0].get("message") if errors else None
    if last_error is None:
        failing = next((c for c in conditions if c["type"] == ConditionType.READY
                        and c["status"] == ConditionStatus.FALSE
                        and c["reason"] in ("ReplicationError", "BootstrapFailed")), None)
        last_error = failing["message"] if failing else None
    return {
        "name": _meta(obj).get("name") or summary.get("name"),
        "cluster": spec.get("cluster") or summary.get("cluster"),
        "replicaPath": spec.get("replicaPath"),
        "replicaId": status.get("replicaId"),
        "enabled": spec.get("enabled", True) if spec else None,
        "specMode": spec.get("mode", ReplicaMode.ASYNC.value) if spec else None,
        "tracked": spec.get("enableReplicatedTableTracker", True) if spec else None,
        "mode": source.get("mode"),
        "state": source.get("state"),
        "lagSeconds": source.get("lagSeconds"),
        "rowsBehind": _rows_behind(tablets),
        "unreachable": _unreachable(status),
        "tablets": {"count": tablets.get("count"), "errors": tablets.get("errors"),
                    "maxLagSeconds": tablets.get("maxLagSeconds")} if tablets else None,
        "ready": _ready(conditions),
        "conditions": conditions,
        "lastError": last_error,
        "bootstrap": _bootstrap(spec, status, conditions),
    }


def _table(obj: Mapping[str, Any], replicas: list[Mapping[str, Any]]) -> dict[str, Any]:
    meta, spec, status = _meta(obj), _section(obj, "spec"), _section(obj, "status")
    conditions = _conditions(status)
    summaries = {str(s.get("name")): s for s in status.get("replicas") or [] if isinstance(s, Mapping)}
    by_name = {str(_meta(r).get("name")): r for r in replicas}
    rows = [_replica(by_name.get(name, {}), summaries.get(name, {"name": name}))
            for name in sorted(set(by_name) | set(summaries))]
    options = _section(spec, "replicatedTableOptions")
    tracker = dict(_section(status, "tracker"))
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "cluster": spec.get("cluster"),
        "path": spec.get("path"),
        "tableId": status.get("tableId"),
        "frozen": bool(spec.get("frozen", False)),
        "ready": _ready(conditions),
        "conditions": conditions,
        "syncReplicas": sorted(status.get("syncReplicas") or []),
        "maxLagSeconds": status.get("maxLagSeconds"),
        "tracker": {"enabled": bool(options.get("enableReplicatedTableTracker", False)),
                    "lastDecision": tracker.get("lastDecision"), "reason": tracker.get("reason"),
                    "time": tracker.get("time"), "summary": tracker.get("summary"),
                    "recentSwitches": [_status_switch(sw) for sw in tracker.get("recentSwitches") or []
                                       if isinstance(sw, Mapping)]},
        "unreachable": _unreachable(status),
        "replicas": rows,
    }


def _status_switch(switch: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of ``status.tracker.recentSwitches``."""
    return {"time": switch.get("time"), "replica": switch.get("replica"), "replicaId": switch.get("replicaId"),
            "cluster": switch.get("cluster"), "mode": switch.get("mode"), "reason": switch.get("reason")}


def _leadership(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """An HA table cluster's ``status.leadership`` (who leads, who stands by, the database's primary);
    None for a cluster without ``spec.members``. Members the operator has not asked yet are left out."""
    if not spec.get("members"):
        return None
    lead = _section(status, "leadership")
    lost = [{"member": u.get("member"), "since": u.get("since"), "message": u.get("message")}
            for u in lead.get("unreachable") or [] if isinstance(u, Mapping)]
    database = _section(spec, "databaseCluster")
    return {"members": sorted(spec.get("members") or []), "leader": lead.get("leader"), "epoch": lead.get("epoch"),
            "standbys": sorted(lead.get("standbys") or []), "databasePrimary": lead.get("databasePrimary"),
            "databaseCluster": display_name(database.get("namespace"), database["name"]) if database.get("name")
            else None, "databaseClusterError": lead.get("databaseClusterError"),
            "unreachable": sorted(lost, key=lambda u: str(u["member"])), "observedAt": lead.get("observedAt")}


def _cluster(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec, status = _section(obj, "spec"), _section(obj, "status")
    conditions = _conditions(status)
    return {"name": _meta(obj).get("name"), "endpoint": spec.get("endpoint"), "clusterId": spec.get("clusterId"),
            "readOnly": bool(spec.get("readOnly", False)), "healthy": status.get("healthy"),
            "version": status.get("version"), "latencyMs": status.get("latencyMs"),
            "lastProbeTime": status.get("lastProbeTime"), "ready": _ready(conditions), "conditions": conditions,
            "leadership": _leadership(spec, status)}


def _collocation(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec, status = _meta(obj), _section(obj, "spec"), _section(obj, "status")
    conditions = _conditions(status)
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "tables": sorted(spec.get("tables") or []),
            "preferredSyncReplicaClusters": sorted(spec.get("preferredSyncReplicaClusters") or []),
            "ready": _ready(conditions), "conditions": conditions}


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _pair(pair: Mapping[str, Any]) -> dict[str, Any]:
    """One ordered pair of an XdcrGroup's ``status.pairs``, as the reconciler writes it."""
    return {"from": pair.get("from"), "to": pair.get("to"), "state": pair.get("state"),
            "lagSeconds": pair.get("lagSeconds"), "queuedRows": pair.get("queuedRows"),
            "conflicts": pair.get("conflicts"), "paused": _bool(pair.get("paused")),
            "lastError": pair.get("lastError")}


def _xdcr_group(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An XdcrGroup (cluster-scoped: no namespace): members, tables, pause, Ready and every ordered pair."""
    spec, status = _section(obj, "spec"), _section(obj, "status")
    conditions = _conditions(status)
    pairs = [_pair(p) for p in status.get("pairs") or [] if isinstance(p, Mapping)]
    return {"name": _meta(obj).get("name"), "clusters": sorted(spec.get("clusters") or []),
            "tables": sorted(str(t.get("path")) for t in spec.get("tables") or [] if isinstance(t, Mapping)),
            "tablesOnEveryCluster": sorted(status.get("tables") or []),
            "specPaused": bool(spec.get("paused", False)), "paused": _bool(status.get("paused")),
            "reset": _section(spec, "reset").get("cluster"), "conflicts": status.get("conflicts"),
            "ready": _ready(conditions), "conditions": conditions,
            "pairs": sorted(pairs, key=lambda p: (str(p["from"]), str(p["to"])))}


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
               or _meta(event).get("creationTimestamp") or "")


def _resource_version(event: Mapping[str, Any]) -> int:
    value = str(_meta(event).get("resourceVersion") or "")
    return int(value) if value.isdigit() else 0


def _switches(events: Iterable[Mapping[str, Any]], replica_names: Mapping[tuple[str | None, str], str]
              ) -> list[dict[str, Any]]:
    out: list[tuple[tuple[str, int], dict[str, Any]]] = []
    for event in events:
        if event.get("reason") != SWITCH_REASON:
            continue
        involved = _section(event, "involvedObject")
        namespace = involved.get("namespace") or _meta(event).get("namespace") or None
        message = str(event.get("message") or "")
        parsed = _SWITCH_MESSAGE.match(message)
        replica_id = parsed["id"] if parsed else None
        switch = {"time": _event_time(event) or None, "namespace": namespace, "table": involved.get("name"),
                  "replica": replica_names.get((namespace, replica_id or "")) if replica_id else None,
                  "replicaId": replica_id, "mode": parsed["mode"] if parsed else None,
                  "reason": parsed["reason"] if parsed else message, "message": message,
                  "count": event.get("count")}
        out.append(((_event_time(event), _resource_version(event)), switch))
    out.sort(key=lambda item: item[0], reverse=True)
    return [switch for _, switch in out[:MAX_SWITCHES]]


def _recent_events(events: Iterable[Mapping[str, Any]], involved: set[tuple[str | None, str]] | None
                   ) -> list[dict[str, Any]]:
    """Events other than the tracker's switches (those have their own list), newest first; with
    ``involved``, only those about these (namespace, name) objects."""
    out: list[tuple[tuple[str, int], dict[str, Any]]] = []
    for event in reversed(list(events)):  # (the sort is stable: events of one second stay newest first)
        if not isinstance(event, Mapping) or event.get("reason") == SWITCH_REASON:
            continue
        obj = _section(event, "involvedObject")
        namespace = obj.get("namespace") or None
        if involved is not None and (namespace, obj.get("name")) not in involved:
            continue
        out.append(((_event_time(event), _resource_version(event)), {
            "time": _event_time(event) or None, "type": event.get("type"), "reason": event.get("reason"),
            "kind": obj.get("kind"), "namespace": namespace, "name": obj.get("name"),
            "message": event.get("message")}))
    out.sort(key=lambda item: item[0], reverse=True)
    return [event for _, event in out[:MAX_EVENTS]]


def _select(tables: list[Mapping[str, Any]], wanted: str) -> Mapping[str, Any]:
    namespace, _, name = wanted.rpartition("/")
    found = [t for t in tables if _meta(t).get("name") == name and (not namespace or _meta(t).get("namespace")
                                                                      == namespace)]
    if not found:
        raise ValueError(f"ReplicatedTable {wanted!r} not found")
    if len(found) > 1:
        where = ", ".join(sorted(display_name(_meta(t).get("namespace"), name) for t in found))
        raise ValueError(f"ReplicatedTable {wanted!r} is ambiguous ({where}): name it as NAMESPACE/NAME")
    return found[0]


def build_view(objects: list[dict[str, Any]], events: list[dict[str, Any]] | None = None,
               table: str | None = None) -> dict[str, Any]:
    """A JSON-able view of reptables objects (other kinds are ignored) and tracker events.

    ``table`` keeps one ReplicatedTable (``"namespace/name"`` or ``"name"``), its replicas, the clusters
    they use, its collocations and its switches (no XdcrGroup: its tables are not ReplicatedTables);
    an unknown table is a :class:`ValueError` naming it.
    """
    by_kind: dict[str, list[Mapping[str, Any]]] = {kind: [] for kind in KINDS}
    for obj in objects:
        if isinstance(obj, Mapping) and obj.get("kind") in by_kind and _meta(obj).get("name"):
            by_kind[str(obj["kind"])].append(obj)
    key = lambda o: (str(_meta(o).get("namespace") or ""), str(_meta(o).get("name")))  # noqa: E731
    tables = sorted(by_kind["ReplicatedTable"], key=key)
    if table is not None:
        tables = [_select(tables, table)]
    replicas_of: dict[tuple[str | None, str], list[Mapping[str, Any]]] = {}
    replica_names: dict[tuple[str | None, str], str] = {}
    for rep in sorted(by_kind["TableReplica"], key=key):
        namespace = _meta(rep).get("namespace")
        replicas_of.setdefault((namespace, str(_section(rep, "spec").get("table"))), []).append(rep)
        replica_id = _section(rep, "status").get("replicaId")
        if replica_id:
            replica_names[(namespace, str(replica_id))] = str(_meta(rep)["name"])
    table_views = [_table(t, replicas_of.get((_meta(t).get("namespace"), str(_meta(t)["name"])), []))
                   for t in tables]
    known = {(t["namespace"], t["name"]) for t in table_views}
    switches = [s for s in _switches(events or [], replica_names) if table is None
                or (s["namespace"], s["table"]) in known or (s["namespace"] is None and
                                                             any(s["table"] == n for _, n in known))]
    clusters = [_cluster(c) for c in sorted(by_kind["TableCluster"], key=key)]
    collocations = [_collocation(c) for c in sorted(by_kind["TableCollocation"], key=key)]
    groups = [_xdcr_group(g) for g in sorted(by_kind["XdcrGroup"], key=key)] if table is None else []
    orphans: list[dict[str, Any]] = []
    if table is None:
        all_tables = {(_meta(t).get("namespace"), str(_meta(t)["name"])) for t in tables}
        orphans = [{"namespace": ns, "name": _meta(r).get("name"), "table": name}
                   for (ns, name), reps in sorted(replicas_of.items(), key=lambda i: (str(i[0][0]), i[0][1]))
                   if (ns, name) not in all_tables for r in reps]
    else:
        used = {t["cluster"] for t in table_views} | {r["cluster"] for t in table_views for r in t["replicas"]}
        clusters = [c for c in clusters if c["name"] in used]
        collocations = [c for c in collocations if any((c["namespace"], n) in known for n in c["tables"])]
    involved = None if table is None else \
        {(t["namespace"], t["name"]) for t in table_views} | \
        {(t["namespace"], r["name"]) for t in table_views for r in t["replicas"]}
    return {"tables": table_views, "xdcrGroups": groups, "clusters": clusters, "collocations": collocations,
            "trackerSwitches": switches, "recentEvents": _recent_events(events or [], involved),
            "orphanReplicas": orphans}


def find_replica(view: Mapping[str, Any], replica: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (table, replica) of ``"REPLICA"`` or ``"TABLE/REPLICA"`` in a view; ValueError when absent or ambiguous."""
    table_name, _, name = replica.rpartition("/")
    found = [(t, r) for t in view.get("tables", []) for r in t["replicas"]
             if r["name"] == name and (not table_name or t["name"] == table_name)]
    if not found:
        raise ValueError(f"TableReplica {replica!r} not found")
    if len(found) > 1:
        where = ", ".join(sorted(display_name(t["namespace"], f"{t['name']}/{r['name']}") for t, r in found))
        raise ValueError(f"TableReplica {replica!r} is ambiguous ({where})")
    return found[0]
