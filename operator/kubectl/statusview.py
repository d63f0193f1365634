"""The status view shared by ``kubectl reptables`` and the local runner's ``reptables status``.

Both faces show the same thing — the CloudNativePG ``kubectl cnpg status`` idea: a summary per
replicated table and a per-replica table with mode, state, lag and bootstrap progress; per XDCR group
the same shape, a summary and a row per ordered peer pair — so the view is built here once, from
Kubernetes-shaped dicts (what the API server returns for the reptables kinds, and core v1 Events),
and nothing here talks to Kubernetes or an engine. :func:`build_view` turns the objects into a
plain JSON-able dict (what ``-o json``/``-o yaml`` print, so scripts read the same facts the text
shows); :func:`render`, :func:`render_tracker` and :func:`render_bootstrap` print it with rich.
Everything is sorted so that the output is deterministic.

The view holds what manifests and engines said, exactly (``-o json`` stays exact); the renderers
print a copy whose every string went through :func:`~reptables.operator.terminal.display`, so a table path with
terminal escapes in it shows them as ``\\x1b`` instead of obeying them, and they hand every string
to rich as :class:`~rich.text.Text`, never as markup: a path like ``//tmp/[/x]`` is text, not a
closing tag (which rich would refuse with an error, or apply as a style).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from reptables.engine.replica_types import ReplicaMode, ReplicaState

from ..models import KINDS as KIND_MODELS
from ..models import BootstrapPhase, ConditionStatus, ConditionType
from ..terminal import display

__all__ = ["KINDS", "MAX_SWITCHES", "build_view", "find_replica", "render", "render_bootstrap", "render_tracker"]

KINDS = tuple(KIND_MODELS)
MAX_SWITCHES = 50
"""At most this many tracker switches are kept in the view (the newest)."""
_SWITCH_REASON = "ReplicaModeChanged"
_SWITCH_MESSAGE = re.compile(r"^replica (?P<id>\S+) is now (?P<mode>sync|async): (?P<reason>.*)$", re.DOTALL)
_DEFAULT_MAX_ATTEMPTS = 3


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


def _display(namespace: str | None, name: str) -> str:
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
        "maxAttempts": _section(spec, "bootstrap").get("maxAttempts", _DEFAULT_MAX_ATTEMPTS),
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


def _replica(obj: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    spec, status = _section(obj, "spec"), _section(obj, "status")
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
        "mode": status.get("mode") or summary.get("mode"),
        "state": status.get("state") or summary.get("state"),
        "lagSeconds": status.get("lagSeconds", summary.get("lagSeconds")),
        "rowsBehind": _rows_behind(tablets),
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
                    "time": tracker.get("time")},
        "replicas": rows,
    }


def _cluster(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec, status = _section(obj, "spec"), _section(obj, "status")
    conditions = _conditions(status)
    return {"name": _meta(obj).get("name"), "endpoint": spec.get("endpoint"), "clusterId": spec.get("clusterId"),
            "readOnly": bool(spec.get("readOnly", False)), "healthy": status.get("healthy"),
            "version": status.get("version"), "latencyMs": status.get("latencyMs"),
            "lastProbeTime": status.get("lastProbeTime"), "ready": _ready(conditions), "conditions": conditions}


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
        if event.get("reason") != _SWITCH_REASON:
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


def _select(tables: list[Mapping[str, Any]], wanted: str) -> Mapping[str, Any]:
    namespace, _, name = wanted.rpartition("/")
    found = [t for t in tables if _meta(t).get("name") == name and (not namespace or _meta(t).get("namespace")
                                                                      == namespace)]
    if not found:
        raise ValueError(f"ReplicatedTable {wanted!r} not found")
    if len(found) > 1:
        where = ", ".join(sorted(_display(_meta(t).get("namespace"), name) for t in found))
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
    return {"tables": table_views, "xdcrGroups": groups, "clusters": clusters, "collocations": collocations,
            "trackerSwitches": switches, "orphanReplicas": orphans}


def find_replica(view: Mapping[str, Any], replica: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (table, replica) of ``"REPLICA"`` or ``"TABLE/REPLICA"`` in a view; ValueError when absent or ambiguous."""
    table_name, _, name = replica.rpartition("/")
    found = [(t, r) for t in view.get("tables", []) for r in t["replicas"]
             if r["name"] == name and (not table_name or t["name"] == table_name)]
    if not found:
        raise ValueError(f"TableReplica {replica!r} not found")
    if len(found) > 1:
        where = ", ".join(sorted(_display(t["namespace"], f"{t['name']}/{r['name']}") for t, r in found))
        raise ValueError(f"TableReplica {replica!r} is ambiguous ({where})")
    return found[0]


# --- rendering ----------------------------------------------------------------------------------


def _escaped(value: Any) -> Any:
    """A copy of (part of) a view with every string made safe for a terminal (``terminal.display``)."""
    if isinstance(value, str):
        return display(value)
    if isinstance(value, Mapping):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(item) for item in value]
    return value


def _row(grid: Table, *cells: str | Text) -> None:
    """A row of a table whose strings are text, never rich markup."""
    grid.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells))


def _dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _status_style(status: Any) -> str:
    return "green" if status == ConditionStatus.TRUE else "red" if status == ConditionStatus.FALSE else "yellow"


def _lag(value: Any) -> str:
    if isinstance(value, float):  # XDCR pairs: fractions of a second, one decimal is plenty
        return f"{value:.1f}".removesuffix(".0") + "s"
    return "-" if value is None else f"{value}s"


def _yes_no(value: bool | None) -> Text:
    return Text("-" if value is None else "yes" if value else "no", style="yellow" if value else "")


def _progress(boot: Mapping[str, Any] | None) -> str:
    if not boot:
        return "-"
    parts = [_dash(boot.get("phase"))]
    if boot.get("attempts") is not None:
        parts.append(f"attempt {boot['attempts']}/{boot.get('maxAttempts') or _DEFAULT_MAX_ATTEMPTS}")
    if boot.get("rowsCopied") is not None:
        parts.append(f"{boot['rowsCopied']:,} rows")
    return ", ".join(parts)


def _problems(conditions: Iterable[Mapping[str, Any]]) -> list[Text]:
    """Conditions that are not True, highlighted."""
    out = []
    for cond in conditions:
        if cond.get("status") != ConditionStatus.TRUE:
            line = Text("  ! ", style="bold red")
            line.append(f"{cond.get('type')}={cond.get('status')}", style=_status_style(cond.get("status")))
            line.append(f" {_dash(cond.get('reason'))}: {_dash(cond.get('message'))}")
            out.append(line)
    return out


def _summary(table: Mapping[str, Any]) -> Text:
    line = Text()
    line.append(f"ReplicatedTable {_display(table['namespace'], table['name'])}", style="bold")
    line.append(f"  {_dash(table['path'])} on {_dash(table['cluster'])}  ")
    line.append(f"Ready={table['ready']}", style=_status_style(table["ready"]))
    sync = ", ".join(table["syncReplicas"]) or "none"
    line.append(f"  sync: {sync}  max lag: {_lag(table['maxLagSeconds'])}")
    if table.get("frozen"):
        line.append("  frozen", style="yellow")
    return line


def _replica_table(table: Mapping[str, Any]) -> Table:
    grid = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("Replica", "Cluster", "Path", "Mode", "State", "Lag", "Rows behind", "Ready", "Bootstrap",
                   "Last error"):
        grid.add_column(column, no_wrap=column != "Last error", overflow="fold")
    for rep in table["replicas"]:
        mode = _dash(rep["mode"])
        if rep["specMode"] and rep["mode"] and rep["specMode"] != rep["mode"] and rep["tracked"] is False:
            mode += f" (wants {rep['specMode']})"
        state = _dash(rep["state"])
        if rep["enabled"] is False and rep["state"] != ReplicaState.DISABLED:
            state += " (disabling)"
        _row(grid, _dash(rep["name"]), _dash(rep["cluster"]), _dash(rep["replicaPath"]),
             Text(mode, style="bold" if rep["mode"] == ReplicaMode.SYNC else ""), state, _lag(rep["lagSeconds"]),
             _dash(rep["rowsBehind"]), Text(rep["ready"], style=_status_style(rep["ready"])),
             _progress(rep["bootstrap"]), _dash(rep["lastError"]))
    return grid


def _group_summary(group: Mapping[str, Any]) -> Text:
    line = Text()
    line.append(f"XdcrGroup {group['name']}", style="bold")
    line.append(f"  clusters: {', '.join(group['clusters']) or '-'}  tables: {', '.join(group['tables']) or '-'}  ")
    line.append(f"Ready={group['ready']}", style=_status_style(group["ready"]))
    line.append(f"  conflicts: {_dash(group['conflicts'])}")
    if group["paused"] or group["specPaused"]:  # the status lags the spec until every member did it
        state = "resuming" if not group["specPaused"] else "paused" if group["paused"] else "pausing"
        line.append(f"  {state}", style="yellow")
    if group["reset"]:
        line.append(f"  reset: {group['reset']}", style="yellow")
    return line


def _pair_table(group: Mapping[str, Any]) -> Table:
    grid = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("From", "To", "State", "Lag", "Queued rows", "Conflicts", "Paused", "Last error"):
        grid.add_column(column, no_wrap=column != "Last error", overflow="fold")
    for pair in group["pairs"]:
        _row(grid, _dash(pair["from"]), _dash(pair["to"]), _dash(pair["state"]), _lag(pair["lagSeconds"]),
             _dash(pair["queuedRows"]), _dash(pair["conflicts"]), _yes_no(pair["paused"]), _dash(pair["lastError"]))
    return grid


def _render_group(group: Mapping[str, Any], console: Console) -> None:
    """An XdcrGroup like a table: summary, Ready when not True (Degraded says the same), a row per pair."""
    console.print(_group_summary(group))
    for line in _problems(c for c in group["conditions"] if c["type"] == ConditionType.READY):
        console.print(line)
    if group["pairs"]:
        console.print(_pair_table(group))
    else:
        console.print("  no pairs reported yet")
    console.print()


def render(view: Mapping[str, Any], console: Console) -> None:
    """The human view: per table a summary line, its problems, tracker decision and replica table; then per
    XdcrGroup its summary and pairs; then clusters and collocations."""
    view = _escaped(view)
    if not view.get("tables") and not view.get("clusters") and not view.get("xdcrGroups"):
        console.print("No reptables objects found.")
    for table in view.get("tables", []):
        console.print(_summary(table))
        for line in _problems(table["conditions"]):
            console.print(line)
        tracker = table["tracker"]
        if tracker["lastDecision"]:
            console.print(Text(f"  tracker: {tracker['lastDecision']} ({_dash(tracker['reason'])}) at "
                               f"{_dash(tracker['time'])}"))
        elif tracker["enabled"]:
            console.print("  tracker: enabled, no switch yet", highlight=False)
        if table["replicas"]:
            console.print(_replica_table(table))
        else:
            console.print("  no replicas")
        for rep in table["replicas"]:
            for line in _problems(c for c in rep["conditions"] if c["type"] == ConditionType.READY):
                line.append_text(Text(f" (replica {rep['name']})", style="dim"))
                console.print(line)
            boot = rep["bootstrap"]
            if boot and boot.get("phase") not in (None, BootstrapPhase.DONE):
                detail = f"  bootstrap {rep['name']}: {_progress(boot)}"
                if boot.get("jobRef"):
                    detail += f", job {boot['jobRef']}"
                if boot.get("lastError"):
                    detail += f", last error: {boot['lastError']}"
                console.print(Text(detail))
        console.print()
    for group in view.get("xdcrGroups", []):
        _render_group(group, console)
    if view.get("clusters"):
        grid = Table(title="TableClusters", title_justify="left", show_edge=False, pad_edge=False, box=None,
                     header_style="bold")
        for column in ("Cluster", "Endpoint", "ID", "Healthy", "Version", "Ready", "Message"):
            grid.add_column(column, no_wrap=column != "Message", overflow="fold")
        for cluster in view["clusters"]:
            ready: dict[str, Any] = next((c for c in cluster["conditions"] if c["type"] == ConditionType.READY), {})
            healthy = {True: "yes", False: "no"}.get(cluster["healthy"], "-")
            _row(grid, cluster["name"], _dash(cluster["endpoint"]), _dash(cluster["clusterId"]),
                 Text(healthy, style={"yes": "green", "no": "red"}.get(healthy, "")),
                 _dash(cluster["version"]), Text(cluster["ready"], style=_status_style(cluster["ready"])),
                 "" if cluster["ready"] == ConditionStatus.TRUE else _dash(ready.get("message")))
        console.print(grid)
    if view.get("collocations"):
        console.print()
        grid = Table(title="TableCollocations", title_justify="left", show_edge=False, pad_edge=False, box=None,
                     header_style="bold")
        for column in ("Collocation", "Tables", "Preferred sync clusters", "Ready"):
            grid.add_column(column)
        for col in view["collocations"]:
            _row(grid, _display(col["namespace"], col["name"]), ", ".join(col["tables"]),
                 ", ".join(col["preferredSyncReplicaClusters"]) or "-",
                 Text(col["ready"], style=_status_style(col["ready"])))
        console.print(grid)
    for orphan in view.get("orphanReplicas", []):
        console.print(Text(f"TableReplica {_display(orphan['namespace'], orphan['name'])}: its ReplicatedTable "
                           f"'{orphan['table']}' does not exist", style="yellow"))


def render_tracker(view: Mapping[str, Any], console: Console) -> None:
    """Each table's tracker state and last decision, then the recent switches (newest first) and why."""
    view = _escaped(view)
    grid = Table(title="Tracker", title_justify="left", show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("Table", "Tracker", "Sync replicas", "Last decision", "Reason", "Time"):
        grid.add_column(column, overflow="fold")
    for table in view.get("tables", []):
        tracker = table["tracker"]
        _row(grid, _display(table["namespace"], table["name"]), "enabled" if tracker["enabled"] else "disabled",
             ", ".join(table["syncReplicas"]) or "-", _dash(tracker["lastDecision"]),
             _dash(tracker["reason"]), _dash(tracker["time"]))
    console.print(grid)
    console.print()
    switches = view.get("trackerSwitches", [])
    if not switches:
        console.print("No recent tracker switches (ReplicaModeChanged events).")
        return
    grid = Table(title="Recent switches (ReplicaModeChanged events, newest first)", title_justify="left",
                 show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("Time", "Table", "Replica", "Now", "Why"):
        grid.add_column(column, overflow="fold")
    for switch in switches:
        replica = switch["replica"] or switch["replicaId"] or "-"
        _row(grid, _dash(switch["time"]), _display(switch["namespace"], _dash(switch["table"])), replica,
             _dash(switch["mode"]), _dash(switch["reason"]))
    console.print(grid)


def render_bootstrap(view: Mapping[str, Any], console: Console, replica: str) -> None:
    """The bootstrap of one replica (``"REPLICA"`` or ``"TABLE/REPLICA"``): phase, rows, job, errors, next attempt."""
    table, rep = (_escaped(found) for found in find_replica(view, replica))
    title = f"TableReplica {_display(table['namespace'], rep['name'])} of {table['name']} on {_dash(rep['cluster'])}"
    console.print(Text(title, style="bold"))
    boot = rep["bootstrap"]
    if not boot:
        console.print(Text(f"  not bootstrapped: state {_dash(rep['state'])}, mode {_dash(rep['mode'])} (the "
                           "replica started from the replication queue, or its bootstrap has not been planned yet)"))
        return
    grid = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    attempts = "-" if boot["attempts"] is None else f"{boot['attempts']} of {boot['maxAttempts']}"
    phase_style = ("red" if boot["phase"] == BootstrapPhase.FAILED else "green" if boot["phase"] == BootstrapPhase.DONE
                   else "yellow")
    rows: list[tuple[str, str | Text]] = [
            ("Phase", Text(_dash(boot["phase"]), style=phase_style)),
            ("Snapshot timestamp", _dash(boot["snapshotTimestamp"])),
            ("Source replica", _dash(boot["sourceReplicaId"])),
            ("Attempts", attempts),
            ("Rows copied", "-" if boot["rowsCopied"] is None else f"{boot['rowsCopied']:,}"),
            ("Job", _dash(boot["jobRef"])),
            ("Last error", _dash(boot["lastError"])),
            ("Next attempt", _dash(boot["nextAttemptTime"])),
            ("Message", _dash(boot["message"])),
            ("Replica state", f"{_dash(rep['state'])}, mode {_dash(rep['mode'])}")]
    for label, value in rows:
        _row(grid, label, value)
    console.print(grid)
