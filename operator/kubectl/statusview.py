"""The status view shared by ``kubectl reptables`` and the local runner's ``reptables status``.

Both faces show the same thing — the CloudNativePG ``kubectl cnpg status`` idea: a summary per
replicated table and a per-replica table with mode, state, lag and bootstrap progress; per XDCR group
the same shape, a summary and a row per ordered peer pair; under each table the tracker's last
decision, its latest check and its recent switches; per HA table cluster its leader, standbys and
database primary; and at the end the recent events — so the view is
built once, from Kubernetes-shaped dicts (what the API server returns for the reptables kinds, and
core v1 Events), and nothing here talks to Kubernetes or an engine. :func:`build_view` (:mod:`.view`)
turns the objects into a plain JSON-able dict (what ``-o json``/``-o yaml`` print, so scripts read the
same facts the text shows); :func:`render`, :func:`render_tracker` and :func:`render_bootstrap`
(here) print it with rich. Everything is sorted so that the output is deterministic.

The view holds what manifests and engines said, exactly (``-o json`` stays exact); the renderers
print a copy whose every string went through :func:`~reptables.operator.terminal.display`, so a table path with
terminal escapes in it shows them as ``\\x1b`` instead of obeying them, and they hand every string
to rich as :class:`~rich.text.Text`, never as markup: a path like ``//tmp/[/x]`` is text, not a
closing tag (which rich would refuse with an error, or apply as a style).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from reptables.engine.replica_types import ReplicaMode, ReplicaState

from ..models import BootstrapPhase, ConditionStatus, ConditionType
from ..terminal import display
from .view import DEFAULT_MAX_ATTEMPTS, KINDS, MAX_SWITCHES, build_view, display_name, find_replica

__all__ = ["KINDS", "MAX_SWITCHES", "build_view", "find_replica", "render", "render_bootstrap", "render_tracker"]

SWITCHES_SHOWN = 5
"""The text view shows this many of a table's recent switches."""


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
        parts.append(f"attempt {boot['attempts']}/{boot.get('maxAttempts') or DEFAULT_MAX_ATTEMPTS}")
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
    line.append(f"ReplicatedTable {display_name(table['namespace'], table['name'])}", style="bold")
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
        if rep.get("unreachable"):
            state += " (unreachable)"
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
        _render_table_tracker(table, view.get("trackerSwitches") or [], console)
        if table["replicas"]:
            console.print(_replica_table(table))
        else:
            console.print("  no replicas")
        for rep in table["replicas"]:
            for line in _problems(c for c in rep["conditions"] if c["type"] == ConditionType.READY):
                line.append_text(Text(f" (replica {rep['name']})", style="dim"))
                console.print(line)
            lost = rep.get("unreachable")
            if lost and not any(c["type"] == ConditionType.READY and c["status"] != ConditionStatus.TRUE
                                for c in rep["conditions"]):
                console.print(Text(f"  ! cluster {lost['cluster']} unreachable since {_dash(lost['since'])} "
                                   f"(replica {rep['name']})", style="red"))
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
        _render_leadership(view["clusters"], console)
    if view.get("collocations"):
        console.print()
        grid = Table(title="TableCollocations", title_justify="left", show_edge=False, pad_edge=False, box=None,
                     header_style="bold")
        for column in ("Collocation", "Tables", "Preferred sync clusters", "Ready"):
            grid.add_column(column)
        for col in view["collocations"]:
            _row(grid, display_name(col["namespace"], col["name"]), ", ".join(col["tables"]),
                 ", ".join(col["preferredSyncReplicaClusters"]) or "-",
                 Text(col["ready"], style=_status_style(col["ready"])))
        console.print(grid)
    for orphan in view.get("orphanReplicas", []):
        console.print(Text(f"TableReplica {display_name(orphan['namespace'], orphan['name'])}: its ReplicatedTable "
                           f"'{orphan['table']}' does not exist", style="yellow"))
    if view.get("recentEvents"):
        console.print()
        grid = Table(title="Recent events (newest first)", title_justify="left", show_edge=False, pad_edge=False,
                     box=None, header_style="bold")
        for column in ("Time", "Type", "Reason", "Object", "Message"):
            grid.add_column(column, no_wrap=column != "Message", overflow="fold")
        for event in view["recentEvents"]:
            kind = Text(_dash(event["type"]), style="yellow" if event["type"] == "Warning" else "")
            about = f"{_dash(event['kind'])} {display_name(event['namespace'], _dash(event['name']))}"
            _row(grid, _dash(event["time"]), kind, _dash(event["reason"]), about, _dash(event["message"]))
        console.print(grid)


def _render_leadership(clusters: Iterable[Mapping[str, Any]], console: Console) -> None:
    """The HA table clusters (``spec.members``): a row each with the leader, its epoch, the standbys and
    the database's primary, then a line per member that neither leads nor stands by."""
    ha = [c for c in clusters if c.get("leadership")]
    if not ha:
        return
    console.print()
    grid = Table(title="Leaders and standbys", title_justify="left", show_edge=False, pad_edge=False, box=None,
                 header_style="bold")
    for column in ("Cluster", "Leader", "Epoch", "Standbys", "Database primary", "Observed"):
        grid.add_column(column, no_wrap=column not in ("Standbys", "Database primary"), overflow="fold")
    for cluster in ha:
        lead = cluster["leadership"]
        leader = Text(lead["leader"], style="green") if lead["leader"] else \
            Text("none" if lead["observedAt"] else "-", style="red" if lead["observedAt"] else "")
        primary = _dash(lead["databasePrimary"])
        if lead["databaseCluster"] and lead["databasePrimary"] and not lead["databaseClusterError"]:
            primary += f" (CloudNativePG {lead['databaseCluster']})"
        _row(grid, cluster["name"], leader, _dash(lead["epoch"]), ", ".join(lead["standbys"]) or "none", primary,
             _dash(lead["observedAt"]))
    console.print(grid)
    for cluster in ha:
        lead = cluster["leadership"]
        for lost in lead["unreachable"]:
            console.print(Text(f"  ! {cluster['name']}: member {_dash(lost['member'])} neither leads nor stands by "
                               f"since {_dash(lost['since'])}: {_dash(lost['message'])}", style="red"))
        if lead["databaseClusterError"]:
            console.print(Text(f"  ! {cluster['name']}: {lead['databaseClusterError']}", style="yellow"))


def _table_switches(table: Mapping[str, Any], switches: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The table's recent switches, newest first: its ``status.tracker.recentSwitches``, else its
    ReplicaModeChanged events."""
    if table["tracker"]["recentSwitches"]:
        return list(table["tracker"]["recentSwitches"])
    return [s for s in switches if s.get("table") == table["name"]
            and (s.get("namespace") is None or s.get("namespace") == table["namespace"])]


def _render_table_tracker(table: Mapping[str, Any], switches: Iterable[Mapping[str, Any]], console: Console) -> None:
    """The tracker's lines of a table: its last decision (or that it made none yet), what its latest
    check saw, and the table's last few switches."""
    tracker = table["tracker"]
    if not tracker["enabled"] and not tracker["lastDecision"]:
        return
    if tracker["lastDecision"]:
        console.print(Text(f"  tracker: {tracker['lastDecision']} ({_dash(tracker['reason'])}) at "
                           f"{_dash(tracker['time'])}"))
    else:
        console.print("  tracker: enabled, no switch yet", highlight=False)
    if tracker.get("summary"):
        console.print(Text(f"  tracker now: {tracker['summary']}", style="dim"))
    recent = _table_switches(table, switches)[:SWITCHES_SHOWN]
    if recent:
        console.print("  recent switches (newest first):", highlight=False)
        for switch in recent:
            replica = switch.get("replica") or switch.get("replicaId") or "-"
            console.print(Text(f"    {_dash(switch.get('time'))}  {replica} -> {_dash(switch.get('mode'))}: "
                               f"{_dash(switch.get('reason'))}"))


def render_tracker(view: Mapping[str, Any], console: Console) -> None:
    """Each table's tracker state and last decision, then the recent switches (newest first) and why."""
    view = _escaped(view)
    grid = Table(title="Tracker", title_justify="left", show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("Table", "Tracker", "Sync replicas", "Last decision", "Reason", "Time", "Latest check"):
        grid.add_column(column, overflow="fold")
    for table in view.get("tables", []):
        tracker = table["tracker"]
        _row(grid, display_name(table["namespace"], table["name"]), "enabled" if tracker["enabled"] else "disabled",
             ", ".join(table["syncReplicas"]) or "-", _dash(tracker["lastDecision"]),
             _dash(tracker["reason"]), _dash(tracker["time"]), _dash(tracker.get("summary")))
    console.print(grid)
    console.print()
    switches = view.get("trackerSwitches", [])
    title = "Recent switches (ReplicaModeChanged events, newest first)"
    if not switches:  # the events are gone (Kubernetes keeps them an hour): the tables' status keeps the last ones
        switches = sorted(({**s, "namespace": t["namespace"], "table": t["name"]} for t in view.get("tables", [])
                           for s in t["tracker"]["recentSwitches"]), key=lambda s: str(s["time"]), reverse=True)
        title = "Recent switches (status.tracker.recentSwitches, newest first)"
    if not switches:
        console.print("No recent tracker switches (ReplicaModeChanged events, status.tracker.recentSwitches).")
        return
    grid = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("Time", "Table", "Replica", "Now", "Why"):
        grid.add_column(column, overflow="fold")
    for switch in switches:
        replica = switch["replica"] or switch["replicaId"] or "-"
        _row(grid, _dash(switch["time"]), display_name(switch["namespace"], _dash(switch["table"])), replica,
             _dash(switch["mode"]), _dash(switch["reason"]))
    console.print(grid)


def render_bootstrap(view: Mapping[str, Any], console: Console, replica: str) -> None:
    """The bootstrap of one replica (``"REPLICA"`` or ``"TABLE/REPLICA"``): phase, rows, job, errors, next attempt."""
    table, rep = (_escaped(found) for found in find_replica(view, replica))
    title = (f"TableReplica {display_name(table['namespace'], rep['name'])} of {table['name']} "
             f"on {_dash(rep['cluster'])}")
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
