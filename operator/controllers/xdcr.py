"""XdcrGroup reconciliation: the engines' XDCR settings from one manifest (docs/xdcr.md).

What the engine offers is per cluster (docs/xdcr.md, "Set up a group"): an id given at start
(``--cluster-id``), the peers in ``//sys/clusters``, ``//sys/@xdcr_connections``, XDCR tables and the
``dr_*`` commands. An XdcrGroup is that list of steps as desired state, kept true on every member:

1. **Judge the manifest first.** Every cluster must be a TableCluster, their ``clusterId``\\ s must
   differ, no older XdcrGroup may hold one of them, and each reachable engine must run with the id
   its TableCluster declares (an engine started without ``--cluster-id`` cannot take part). Any
   problem is a Ready=False condition whose message names the group and the cluster, and *nothing*
   is written to any engine: a group is never half set up.
2. **Apply, member by member.** The directory (``directory.py`` lists the group's peers with peer
   credentials), the tables (created with ``xdcr=%true`` and mounted, existing ones adopted when
   they are XDCR tables), ``reset`` (``dr_reset --force`` of the named cluster on the others, while
   it is named), the connections, and ``paused`` (``dr_pause`` without waiting for the drain, so a
   reconcile never blocks on an unreachable peer; ``queuedRows`` shows the drain). An unreachable
   member does not stop the others: an active-active group must stay operable with a member down.
3. **Join** a cluster added to a group whose change logs were trimmed: the members wait for its
   snapshot (``waiting_for_snapshot``), and the operator runs the XDCR join job for it, one join per
   group at a time, from ``preferredSource`` when named (``xdcr_join.py``; ``status.joins``,
   Ready=False with reason ``Joining`` meanwhile).
4. **Report** every ordered pair from ``dr_status`` of its sending cluster, with the conflicts the
   receiving cluster resolved for it. A Warning event is posted when those grew by at least
   ``conflictEventThreshold`` since the last reconcile (the engine's counter restarts with it, so a
   smaller value counts as growth from zero).

Deletion resets the connections between the members (``dr_reset --force`` of each other member);
the tables and the pause state are left as they are.
"""

from __future__ import annotations

from typing import Any

import httpx

from reptables.engine.client import Client, XdcrStatus
from reptables.engine.errors import YtError
from reptables.engine.tablets import TabletState

from ..models import ConditionType, XdcrPairState, XdcrTable
from . import conditions
from .common import yt_schema
from .conditions import Cond
from .directory import sync_directory
from .world import ClusterNotFound, Event, Outcome, Resource, World, describe_error
from .xdcr_join import JoinStep, advance_joins
from .xdcr_members import CLUSTER_ID_MISMATCH, CLUSTER_ID_MISSING, ENGINE_ID_PROBLEMS, GroupProblem, group_problem

REFRESH_SECONDS = 10.0
#: while pairs are still connecting, come back soon
CONNECTING_RETRY = 2.0
#: a degraded group is looked at again this often (a member down may stay down for long)
DEGRADED_RETRY = 5.0
#: a pair in one of these states delivers (paused: client writes are refused, peers' changes flow)
CONNECTED_STATES = frozenset({XdcrPairState.CONNECTED, XdcrPairState.PAUSED})

def _status_of(client: Client) -> XdcrStatus:
    return client.dr_status()


def _not_applied(res: Resource, problem: GroupProblem, retry: float = 30.0) -> Outcome:
    """Ready=False and Degraded=True with the problem; a Warning event only when the reason is new."""
    out = Outcome(retry_after=retry, invalid=problem.message, status={
        "observedGeneration": res.generation, "conditions": conditions.merge(res.status.get("conditions"), [
            Cond(ConditionType.READY, False, problem.reason, problem.message),
            Cond(ConditionType.DEGRADED, True, problem.reason, problem.message)], res.generation)})
    if conditions.reason_of(res.status.get("conditions"), ConditionType.READY) != problem.reason:
        out.events.append(Event("Warning", problem.reason, problem.message))
    return out


def _ensure_table(client: Client, cluster: str, table: XdcrTable) -> tuple[str | None, Event | None]:
    """Create (xdcr, mounted) or adopt one XDCR table on one cluster: (problem, event)."""
    path = table.path
    event = None
    if not client.exists(path):
        client.create("table", path, recursive=True, attributes={
            "dynamic": True, "xdcr": True, "schema": yt_schema(table)})
        event = Event("Normal", "TableCreated", f"XDCR table {path} created on {cluster}")
    attrs = client.get(f"{path}/@")
    if attrs.get("type") != "table" or not attrs.get("dynamic"):
        return f"{path} on {cluster} is a {attrs.get('type')}, not a dynamic table", event
    if attrs.get("xdcr") is not True:
        return (f"{path} on {cluster} exists but is not an XDCR table (`yt set {path}/@xdcr %true` while it is "
                "empty, or remove it)"), event
    keys = [c["name"] for c in yt_schema(table) if c.get("sort_order")]
    if list(attrs.get("key_columns") or []) != keys:
        return f"{path} on {cluster} has key columns {attrs.get('key_columns')}, the group says {keys}", event
    if attrs.get("tablet_state") != TabletState.MOUNTED:
        client.mount_table(path)
    return None, event


def reconcile_xdcr_group(res: Resource, world: World) -> Outcome:
    spec = res.spec
    problem = group_problem(res, world)
    if problem is not None:
        return _not_applied(res, problem)
    members: list[str] = list(spec.members)
    clients: dict[str, Any] = {}
    unreachable: dict[str, str] = {}
    before: dict[str, XdcrStatus] = {}
    # 1. every engine answering must run with its TableCluster's id, or nothing is written anywhere
    for name in spec.clusters:
        declared = int(world.find("TableCluster", None, name).spec.cluster_id)  # type: ignore[union-attr]
        try:
            client = world.engines.client(name)
            status = _status_of(client)
        except (ClusterNotFound, YtError, httpx.HTTPError) as exc:
            unreachable[name] = describe_error(exc)
            continue
        actual = status.get("cluster_id")
        if actual is None:
            world.engines.note_group_checked(res.uid, False)
            return _not_applied(res, GroupProblem(CLUSTER_ID_MISSING, (
                f"{res.display}: the engine of TableCluster {name} runs without an XDCR cluster id; start it with "
                f"--cluster-id {declared} (its spec.clusterId); nothing is applied")))
        if actual != declared:
            world.engines.note_group_checked(res.uid, False)
            return _not_applied(res, GroupProblem(CLUSTER_ID_MISMATCH, (
                f"{res.display}: the engine of TableCluster {name} runs with --cluster-id {actual}, its "
                f"spec.clusterId is {declared}; nothing is applied")))
        clients[name] = client
        before[name] = status
    # the engines that answered run with their ids: the directories may list the group's peers now
    world.engines.note_group_checked(res.uid, True)
    if spec.reset is not None:
        unreachable.pop(spec.reset.cluster, None)  # it is leaving the group: being down is expected
    # 2. apply on every member that answers
    events: list[Event] = []
    table_problems: list[str] = []
    for name in members:
        if name not in clients:
            continue
        client = clients[name]
        try:
            _, written = sync_directory(name, world)
            if written:
                events.append(Event("Normal", "DirectoryUpdated", f"//sys/clusters of {name} lists its XDCR peers"))
            for table in spec.tables:
                trouble, event = _ensure_table(client, name, table)
                if event is not None:
                    events.append(event)
                if trouble is not None:
                    table_problems.append(trouble)
            connections = list(before[name].get("connections") or [])
            if spec.reset is not None and spec.reset.cluster in connections:
                client.dr_reset(spec.reset.cluster, force=True)
                connections.remove(spec.reset.cluster)
                events.append(Event("Warning", "Reset", f"{name} no longer replicates with {spec.reset.cluster} "
                                                        "(dr_reset --force: its undelivered changes are dropped)"))
            desired = [m for m in members if m != name]
            if sorted(connections) != sorted(desired):
                client.set("//sys/@xdcr_connections", desired)
                events.append(Event("Normal", "Connected", f"//sys/@xdcr_connections of {name}: "
                                                           f"{', '.join(desired)}"))
            if bool(before[name].get("paused")) != spec.paused:
                if spec.paused:
                    client.dr_pause(wait=False)
                else:
                    client.dr_resume()
                how = "is true" if spec.paused else "is false" if "paused" in spec.model_fields_set \
                    else "not set (the default: false)"
                events.append(Event("Normal", "Paused" if spec.paused else "Resumed",
                                    f"spec.paused {how}: {name} {'refuses' if spec.paused else 'takes'} client writes"))
        except (ClusterNotFound, YtError, httpx.HTTPError) as exc:
            unreachable[name] = describe_error(exc)
            clients.pop(name)
    if spec.reset is not None and spec.reset.cluster in clients:
        # the cluster being reset leaves the group: it stops queuing changes for peers that refuse them
        client = clients.pop(spec.reset.cluster)
        try:
            if before[spec.reset.cluster].get("connections"):
                client.dr_reset()
                events.append(Event("Warning", "Reset", f"{spec.reset.cluster} no longer replicates with the group"))
        except (YtError, httpx.HTTPError) as exc:
            unreachable[spec.reset.cluster] = describe_error(exc)
    # 3. status from every member, as it stands now; 4. a cluster that must join from a snapshot
    statuses: dict[str, XdcrStatus] = {}
    for name in members:
        if name in clients:
            try:
                statuses[name] = _status_of(clients[name])
            except (YtError, httpx.HTTPError) as exc:
                unreachable[name] = describe_error(exc)
    joins = advance_joins(res, world, statuses)
    return _report(res, members, statuses, unreachable, table_problems, events + joins.events, joins)


def _report(res: Resource, members: list[str], statuses: dict[str, XdcrStatus], unreachable: dict[str, str],
            table_problems: list[str], events: list[Event], joins: JoinStep) -> Outcome:
    spec = res.spec
    previous = {(p.get("from"), p.get("to")): p.get("conflicts") for p in res.status.get("pairs") or []
                if isinstance(p, dict)}
    pairs: list[dict[str, Any]] = []
    for sender in members:
        for receiver in members:
            if sender == receiver:
                continue
            pair: dict[str, Any] = {"from": sender, "to": receiver}
            sent = statuses.get(sender)
            peer = (sent.get("peers") or {}).get(receiver) if sent is not None else None
            if peer is None:
                pair["state"] = XdcrPairState.UNKNOWN if sent is None else XdcrPairState.CONNECTING
                if sender in unreachable:
                    pair["lastError"] = f"{sender} did not answer: {unreachable[sender]}"
            else:
                state = str(peer.get("state"))
                if state == XdcrPairState.CONNECTING and not sent.get("tables"):  # type: ignore[union-attr]
                    # nothing to ship: the engine's shipper has no table to connect with
                    state = XdcrPairState.CONNECTED
                pair.update({"state": state, "lagSeconds": float(peer.get("lag_seconds") or 0.0),
                             "queuedRows": int(peer.get("queued_rows") or 0),
                             "paused": bool(sent.get("paused"))})  # type: ignore[union-attr]
                if peer.get("last_error"):
                    pair["lastError"] = str(peer["last_error"])[:1024]
            received = statuses.get(receiver)
            back = (received.get("peers") or {}).get(sender) if received is not None else None
            if back is not None:
                count = int(back.get("conflicts") or 0)
                pair["conflicts"] = count
                old = previous.get((sender, receiver))
                grown = count - old if isinstance(old, int) and count >= old else count
                if grown >= spec.conflict_event_threshold and grown > 0:
                    events.append(Event("Warning", "Conflicts", (
                        f"{receiver} resolved {grown} conflict{'s' if grown != 1 else ''} applying changes from "
                        f"{sender} ({count} since its engine started); see //sys/xdcr_conflicts on {receiver}")))
            pairs.append(pair)
    tables_everywhere = sorted(t.path for t in spec.tables if statuses and all(
        t.path in (s.get("tables") or []) for s in statuses.values()) and len(statuses) == len(members))
    status: dict[str, Any] = {
        "observedGeneration": res.generation, "pairs": pairs, "tables": tables_everywhere,
        "paused": bool(statuses) and len(statuses) == len(members) and all(s.get("paused") for s in statuses.values()),
        "conflicts": sum(int(p.get("conflicts") or 0) for p in pairs), "joins": joins.joins}
    waiting = [p for p in pairs if p["state"] not in CONNECTED_STATES]
    # the pairs to a cluster joining from a snapshot wait for it: that is the join, not a fault
    broken = [p for p in waiting if p["state"] != XdcrPairState.CONNECTING and not (
        p["state"] == XdcrPairState.WAITING_FOR_SNAPSHOT and joins.joining(p["to"]))]
    degraded: list[tuple[str, str]] = []
    if unreachable:
        degraded.append(("ClusterUnreachable", "; ".join(f"{n}: {why}" for n, why in sorted(unreachable.items()))))
    if table_problems:
        degraded.append(("TableProblem", "; ".join(table_problems)))
    if joins.failed:
        degraded.append(("JoinFailed", "; ".join(
            f"{j['cluster']} could not join {j['path']} from a snapshot (attempt {j.get('attempts')}, next at "
            f"{j.get('nextAttemptTime')}): {j.get('message')}" for j in joins.failed)))
    if broken:
        degraded.append(("PairsNotConnected", "; ".join(
            f"{p['from']} -> {p['to']}: {p['state']}" + (f" ({p['lastError']})" if p.get("lastError") else "")
            for p in broken)))
    conds: list[Cond] = []
    if degraded:
        reason = degraded[0][0]
        message = f"{res.display}: " + "; ".join(text for _, text in degraded)
        conds += [Cond(ConditionType.READY, False, reason, message),
                  Cond(ConditionType.DEGRADED, True, reason, message)]
    elif joins.active is not None:
        join = joins.active
        message = f"{res.display}: {join['cluster']} joins {join['path']} from a snapshot: {join.get('message')}"
        conds += [Cond(ConditionType.READY, False, "Joining", message),
                  Cond(ConditionType.DEGRADED, False, "Joining", message)]
    elif waiting:
        message = f"{res.display}: connecting " + ", ".join(f"{p['from']} -> {p['to']}" for p in waiting)
        conds += [Cond(ConditionType.READY, False, "Connecting", message),
                  Cond(ConditionType.DEGRADED, False, "Connecting", message)]
    else:
        pause = "paused: client writes refused, " if spec.paused else ""
        message = (f"{len(pairs)} pairs of {len(members)} clusters connected ({pause}"
                   f"{len(spec.tables)} XDCR table{'s' if len(spec.tables) != 1 else ''})")
        conds += [Cond(ConditionType.READY, True, "Connected", message),
                  Cond(ConditionType.DEGRADED, False, "AllPairsConnected", message)]
    status["conditions"] = conditions.merge(res.status.get("conditions"), conds, res.generation)
    before = conditions.reason_of(res.status.get("conditions"), ConditionType.DEGRADED)
    if degraded and before != degraded[0][0]:
        events.append(Event("Warning", degraded[0][0], conds[0].message))
    retry = CONNECTING_RETRY if waiting and not degraded else DEGRADED_RETRY if degraded else REFRESH_SECONDS
    if joins.retry_after is not None:
        retry = min(retry, joins.retry_after)
    return Outcome(status=status, events=events, retry_after=retry)


def finalize_xdcr_group(res: Resource, world: World) -> Outcome:
    """Deletion: every member forgets the group's other members (dr_reset of each, forced); tables and
    pause are left as they are. A group that never applied (another group holds its clusters, or
    its engines lack ids) touches nothing. Either way the operator then forgets that it checked
    the group's engines (a deleted group's uid never comes back)."""
    try:
        return _reset_members(res, world)
    finally:
        world.engines.note_group_checked(res.uid, False)


def _reset_members(res: Resource, world: World) -> Outcome:
    events: list[Event] = []
    if group_problem(res, world) is not None or \
            conditions.reason_of(res.status.get("conditions"), ConditionType.READY) in ENGINE_ID_PROBLEMS:
        return Outcome()
    for name in res.spec.clusters:
        try:
            client = world.engines.client(name)
            for peer in _status_of(client).get("connections") or []:
                if peer in res.spec.clusters:
                    client.dr_reset(peer, force=True)
                    events.append(Event("Normal", "Reset", f"{name} no longer replicates with {peer}"))
        except ClusterNotFound:
            continue
        except (YtError, httpx.HTTPError) as exc:
            events.append(Event("Warning", "ResetFailed", f"{name}: {describe_error(exc)}; its connections are "
                                                          "left as they are"))
    return Outcome(events=events)
