"""TableReplica reconciliation: the replica object on the meta-cluster and the replica table.

Order matters and every step is idempotent: (1) find or create the ``table_replica`` object on the
meta-cluster — adopted from the status' ``replicaId``, or found in the table's ``@replicas`` by
cluster and path, so an operator restart never creates a second one; (2) find or create the replica
table with ``upstream_replica_id`` on the replica cluster and mount it; (3) enable or disable it;
(4) set its mode — unless the replicated table tracker owns the mode (tracker on for the table
and for the replica), in which case the spec's mode is only the starting point. Enabling and
disabling take a while on the engine (the replica is ``enabling``/``disabling`` until its
replicator has started or stopped): while a transition runs the replica is not Ready (reason
``Enabling``/``Disabling``) and no further ``alter_table_replica`` is sent; the next reconcile,
a second later, looks again. Before the
first step the two clusters' directories are brought up to date (``directory.py``): each engine
knows only the peers its tables link it to, and this replica is a new link.

A replica created for a table whose queue was trimmed is bootstrapped (``replica_bootstrap.py``): created
disabled at a snapshot timestamp T, filled by a copy job, verified, then enabled. While
``status.bootstrap`` says a bootstrap is under way the replica is not enabled here and its mode is
left alone; each reconcile advances the bootstrap by one step and returns.

A replica table is re-created only by starting the replica over. ``status.replicaTableId`` is the
id of the table the replica fills. If that table is removed (or another takes its path), re-creating
it empty under the same replica would go on from the replica's progress and leave it silently
without every earlier row. So the operator removes the replica object and creates a new one on the
next pass, with a bootstrap from another replica when the history was trimmed (``ReplicaTableLost``
event and condition). With no other replica to copy from, the new replica's Ready condition names
the reason (the engine refuses to enable it without its history).
"""

from __future__ import annotations

from typing import Any

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.replica_types import ReplicaMode, ReplicaState
from reptables.engine.tablets import TabletState

from ..models import Atomicity, BootstrapPhase, ConditionType, DeletionPolicy
from . import conditions, replica_bootstrap
from .common import not_ready, unreachable, unreachable_status, unreachable_text, yt_schema
from .conditions import Cond
from .directory import sync_directory
from .world import (
    ClusterNotFound,
    Event,
    Outcome,
    Resource,
    World,
    describe_error,
    oldest_claimant,
)

REFRESH_SECONDS = 5.0
#: the replica states of a transition the engine runs (seed 002: enabling -> enabled, disabling ->
#: disabled); while one runs the operator issues no alter and looks again after this many seconds
TRANSITIONS = {ReplicaState.ENABLING: "Enabling", ReplicaState.DISABLING: "Disabling"}
TRANSITION_POLL_SECONDS = 1.0


def replica_place(replica: Resource) -> tuple[str | None, str, str, str]:
    """What a TableReplica claims: the replica of table ``spec.table`` (in its namespace) at
    ``spec.cluster``:``spec.replica_path``. Two resources that claim one place are one too many."""
    return replica.namespace, replica.spec.table, replica.spec.cluster, replica.spec.replica_path


def tracker_owns_mode(table: Resource, replica: Resource) -> bool:
    return bool(table.spec.replicated_table_options.enable_replicated_table_tracker and
                replica.spec.enable_replicated_table_tracker)


def _find_replica(meta: Client, table_path: str, cluster: str, replica_path: str,
                  known: str | None) -> tuple[str | None, dict[str, Any] | None]:
    """The replica's id (None: there is none) and, when the status knew it, its attributes (read once
    per refresh: whether it exists is whether they can be read)."""
    if known:
        info = _attributes(meta, f"#{known}")
        if info is not None:
            return known, info
    for replica_id, info in (meta.get(f"{table_path}/@replicas") or {}).items():
        if info["cluster_name"] == cluster and info["replica_path"] == replica_path:
            return str(replica_id), None
    return None, None


def _attributes(client: Client, path: str) -> dict[str, Any] | None:
    """The attributes of the node at ``path`` (None: there is none). One read where ``exists`` and a
    ``get`` were two: a refresh of every TableReplica every few seconds made 7 engine calls, now 2
    (a third when it changed the replica)."""
    try:
        found: dict[str, Any] = client.get(f"{path}/@")
    except YtError as exc:
        if exc.code == ErrorCode.RESOLVE_ERROR:
            return None
        raise
    return found


def reconcile_table_replica(res: Resource, world: World) -> Outcome:
    spec = res.spec
    table = world.find("ReplicatedTable", res.namespace, spec.table)
    if table is None:
        return not_ready(res, "TableNotFound", f"ReplicatedTable {res.namespace}/{spec.table} does not exist", 10.0)
    if not table.status.get("tableId"):
        return not_ready(res, "WaitingForTable", f"ReplicatedTable {spec.table} is not created yet", 2.0)
    claimants = [r for r in world.grouped("TableReplica", replica_place).get(replica_place(res), ())
                 if not r.deleting]
    winner = oldest_claimant(claimants) if claimants else res
    if winner.uid != res.uid:
        return not_ready(res, "ResourceConflict", f"{winner.display} already manages the replica of "
                                                  f"{spec.table} at {spec.cluster}:{spec.replica_path}", 30.0)
    table_path = table.spec.path
    try:
        meta = world.engines.client(table.spec.cluster)
        remote = world.engines.client(spec.cluster)
    except ClusterNotFound as exc:
        return not_ready(res, "ClusterNotFound", str(exc), 30.0)
    events: list[Event] = []
    owned_by_tracker = tracker_owns_mode(table, res)
    try:
        if not res.status.get("replicaId"):
            # the two engines must know each other before the replica exists: the meta-cluster
            # refuses a replica on a cluster missing from its directory, and the replica cluster
            # asks the meta-cluster about in-doubt writes (the TableClusters' refresh keeps it so)
            sync_directory(table.spec.cluster, world)
            try:
                sync_directory(spec.cluster, world)
            except YtError as exc:
                return _replica_cluster_down(res, table, meta, None, exc, events)
        replica_id, info = _find_replica(meta, table_path, spec.cluster, spec.replica_path,
                                         res.status.get("replicaId"))
        known_table = res.status.get("replicaTableId")
        replica_table: dict[str, Any] | None = None
        if replica_id is not None and known_table:
            try:
                replica_table = _attributes(remote, spec.replica_path)
            except YtError as exc:
                return _replica_cluster_down(res, table, meta, replica_id, exc, events)
            lost = _lost_replica_table(replica_table, known_table)
            if lost is not None:
                return _start_over(res, meta, replica_id, lost, events)
        boot: dict[str, Any] = dict(res.status.get("bootstrap") or {})
        start: replica_bootstrap.Start | None = None
        if replica_id is None:
            start = None if boot else replica_bootstrap.plan(res, table, meta, world)
            attrs: dict[str, Any] = {
                "table_path": table_path, "cluster_name": spec.cluster, "replica_path": spec.replica_path,
                "mode": ReplicaMode.ASYNC if owned_by_tracker else spec.mode,
                "preserve_timestamps": spec.preserve_timestamps, "atomicity": spec.atomicity.value,
                "enable_replicated_table_tracker": spec.enable_replicated_table_tracker}
            if spec.start_replication_timestamp is not None:
                attrs["start_replication_timestamp"] = spec.start_replication_timestamp
            if start is not None:
                attrs["start_replication_timestamp"] = start.timestamp
            replica_id = meta.create("table_replica", attributes=attrs)
            info = None
            events.append(Event("Normal", "ReplicaCreated", f"table_replica {replica_id} of {table_path} created"))
            if start is not None:
                boot = replica_bootstrap.pending_status(start)
                events.append(Event("Normal", "BootstrapPending",
                                    f"{start.reason}: replica {replica_id} starts at "
                                    f"{start.timestamp:#x} and is filled from replica {start.source_replica_id}"))
        try:
            table_events, table_id = _ensure_replica_table(remote, table, res, replica_id, replica_table)
            events += table_events
        except YtError as exc:
            return _replica_cluster_down(res, table, meta, replica_id, exc, events, boot)
        if info is None:
            info = meta.get(f"#{replica_id}/@")
        configuration = res.status.get("observedGeneration") != res.generation
        changed = False  # (whether this pass changed the replica: its attributes are read again)
        if info.get("enable_replicated_table_tracker") != spec.enable_replicated_table_tracker:
            meta.set(f"#{replica_id}/@enable_replicated_table_tracker", spec.enable_replicated_table_tracker)
            changed = True
            events.append(_setting_event(
                configuration, "enableReplicatedTableTracker",
                _default_note(spec, "enable_replicated_table_tracker", spec.enable_replicated_table_tracker),
                f"enable_replicated_table_tracker of replica {replica_id} set to "
                f"{str(spec.enable_replicated_table_tracker).lower()}"))
        if start is not None:
            step: replica_bootstrap.Step | None = replica_bootstrap.created_step(boot)
        else:
            step = replica_bootstrap.advance(res, table, meta, world, replica_id, boot) if boot else None
        if step is not None and step.phase is not BootstrapPhase.DONE:
            # under way or failed: the replica stays disabled, its mode as created
            info = meta.get(f"#{replica_id}/@")
            out = Outcome(retry_after=step.retry_after, events=events + step.events)
            out.status = _status(res, replica_id, info, step, _lag_threshold(table), table_id)
            return out
        if step is not None and step.events:
            events += step.events
            info = meta.get(f"#{replica_id}/@")  # the bootstrap just enabled it
        want_enabled = spec.enabled
        state = ReplicaState(info["state"])
        if state in TRANSITIONS:
            # the engine is enabling or disabling it: no second alter until that is over
            out = Outcome(retry_after=TRANSITION_POLL_SECONDS, events=events)
            out.status = _status(res, replica_id, info, step, _lag_threshold(table), table_id)
            return out
        # one alter for state and mode: a second one would land in the transition the first began
        enable: bool | None = None
        mode: ReplicaMode | None = None
        source = "" if configuration else " (it was changed on the engine, not in the spec)"
        if want_enabled and state is not ReplicaState.ENABLED:
            enable = True
            events.append(Event("Normal", "Enabling", f"replica {replica_id} is being enabled: spec.enabled "
                                                      f"{_default_note(spec, 'enabled', True)}{source}"))
        elif not want_enabled and state is not ReplicaState.DISABLED:
            enable = False
            events.append(Event("Normal", "Disabling", f"replica {replica_id} is being disabled: spec.enabled "
                                                       f"{_default_note(spec, 'enabled', False)}{source}"))
        if not owned_by_tracker and ReplicaMode(info["mode"]) is not spec.mode:
            mode = spec.mode
            events.append(Event("Normal", "ModeChanged", f"replica {replica_id} switched to {spec.mode.value}: "
                                                         f"spec.mode {_default_note(spec, 'mode', spec.mode.value)}"
                                                         f"{source}"))
        if enable is not None or mode is not None:
            meta.alter_table_replica(replica_id, enabled=enable, mode=mode)
            changed = True
        if changed:
            info = meta.get(f"#{replica_id}/@")
    except YtError as exc:
        if unreachable(exc) and not _from(exc, world, spec.cluster, table.spec.cluster):
            # (the replica cluster's own calls are handled where they are made: this is the meta-cluster)
            return _meta_cluster_down(res, table, exc, events)
        reason = "EnableFailed" if "Cannot enable replica" in describe_error(exc) else "EngineError"
        out = not_ready(res, reason, describe_error(exc), 15.0)
        out.status.pop("observedGeneration")  # the spec was not applied: its edit is still to come
        return out
    transition = ReplicaState(info["state"]) in TRANSITIONS
    out = Outcome(retry_after=TRANSITION_POLL_SECONDS if transition else REFRESH_SECONDS, events=events)
    out.status = _status(res, replica_id, info, step, _lag_threshold(table), table_id)
    return out


def _replica_cluster_down(res: Resource, table: Resource, meta: Client, replica_id: str | None, exc: YtError,
                          events: list[Event], boot: dict[str, Any] | None = None) -> Outcome:
    """The replica's own cluster is down or refuses: the status still says what the meta-cluster knows
    of the replica — its mode (the tracker may just have switched it), state, lag and rows behind —
    and the Ready condition says since when its cluster has been unreachable."""
    spec = res.spec
    lost = unreachable_status(res.status.get("unreachable"), spec.cluster, exc) if unreachable(exc) else None
    message = unreachable_text(lost) if lost is not None else f"{spec.cluster}: {describe_error(exc)}"
    out = not_ready(res, "ReplicaClusterUnavailable", message, 5.0)
    out.events = events + out.events
    if replica_id is None:  # nothing exists on the meta-cluster yet
        out.status.pop("observedGeneration")
        out.status["unreachable"] = lost
        return out
    info = meta.get(f"#{replica_id}/@")  # (the meta-cluster down too: the caller's handler says so)
    status = _status(res, replica_id, info, threshold=_lag_threshold(table), table_id=res.status.get("replicaTableId"))
    status["conditions"] = conditions.merge(status["conditions"], [
        Cond(ConditionType.READY, False, "ReplicaClusterUnavailable", message)], res.generation)
    status["unreachable"] = lost
    status.pop("observedGeneration")  # the spec could not be applied on the replica cluster
    if boot:
        status["bootstrap"] = boot
    out.status = status
    return out


def _meta_cluster_down(res: Resource, table: Resource, exc: YtError, events: list[Event]) -> Outcome:
    """The meta-cluster does not answer: the replica's mode, state, lag and rows behind are unknown, and
    the status says so (absent, and ``status.unreachable``) rather than keep the last ones seen."""
    lost = unreachable_status(res.status.get("unreachable"), table.spec.cluster, exc)
    message = unreachable_text(lost, "meta-cluster")
    out = not_ready(res, "ClusterUnreachable", message, 5.0)
    out.events = events + out.events
    out.status.pop("observedGeneration")
    out.status["conditions"] = conditions.merge(out.status["conditions"], [
        Cond(ConditionType.REPLICATING, None, "ClusterUnreachable", message)], res.generation)
    tablets = dict(res.status.get("tablets") or {})
    out.status.update({"unreachable": lost, "mode": None, "state": None, "lagSeconds": None,
                       "tablets": {**tablets, "maxLagSeconds": None, "rowsBehind": None} if tablets else None})
    return out


def _from(exc: YtError, world: World, cluster: str, other: str) -> bool:
    """Whether a request that got no answer went to ``cluster`` (and not to ``other``, its URL being known)."""
    url = str(getattr(exc, "url", "") or "")
    try:
        mine, theirs = world.engines.ref(cluster).endpoint.rstrip("/"), world.engines.ref(other).endpoint.rstrip("/")
    except ClusterNotFound:
        return False
    return bool(url) and mine != theirs and url.startswith(mine + "/")


def _default_note(spec: Any, field_name: str, value: Any) -> str:
    """How a field came to its value: set in the spec, or left out (its default applies)."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"is {text}" if field_name in spec.model_fields_set else f"not set (the default: {text})"


def _setting_event(configuration: bool, field_name: str, how: str, what: str) -> Event:
    """``ConfigurationChanged`` for an edit of the spec being applied, ``DriftCorrected`` for a change made
    on the engine that the spec undoes."""
    if configuration:
        return Event("Normal", "ConfigurationChanged", f"spec.{field_name} {how}: {what}")
    return Event("Normal", "DriftCorrected", f"{what} (changed on the engine, not in the spec; spec.{field_name} "
                                             "is what counts)")


def _lost_replica_table(attributes: dict[str, Any] | None, known_id: str) -> str | None:
    """Why the table the replica filled is gone, by the attributes of what is at its path now (None:
    nothing is; the result None: it is still there)."""
    if attributes is None:
        return "was removed"
    current = attributes.get("id")
    if current != known_id:
        return f"was replaced by another table (id {current}, not {known_id})"
    return None


def _start_over(res: Resource, meta: Client, replica_id: str, lost: str, events: list[Event]) -> Outcome:
    """The replica table is gone: remove the replica, so that the next pass creates a new one that
    gets every row (from a bootstrap, or the whole queue) instead of going on from this one's progress."""
    spec = res.spec
    message = (f"replica table {spec.replica_path} on {spec.cluster} {lost} after replica {replica_id} had "
               "filled it; the replica is removed and a new one is created and filled with every row")
    if meta.exists(f"#{replica_id}"):
        meta.remove(f"#{replica_id}")
    out = not_ready(res, "ReplicaTableLost", message, 1.0)
    out.status = {"replicaId": None, "replicaTableId": None, "bootstrap": None, "state": None, "mode": None,
                  "conditions": out.status["conditions"], "observedGeneration": res.generation}
    out.events = [*events, *out.events]  # (not_ready's Warning event names the reason)
    return out


def _ensure_replica_table(remote: Client, table: Resource, res: Resource, replica_id: str,
                          seen: dict[str, Any] | None = None) -> tuple[list[Event], str]:
    """The replica table, created or adopted and mounted: the events, and the table's id. ``seen``:
    its attributes as this pass has just read them (None: read them here)."""
    spec = res.spec
    events = []
    path = spec.replica_path
    upstream = replica_id if spec.preserve_timestamps else None
    current = seen if seen is not None else _attributes(remote, path)
    if current is None:
        attrs: dict[str, Any] = {"dynamic": True, "schema": yt_schema(table.spec)}
        if upstream:
            attrs["upstream_replica_id"] = upstream
        if table.spec.tablet_count:
            attrs["tablet_count"] = table.spec.tablet_count
        if spec.atomicity is not Atomicity.FULL:
            attrs["atomicity"] = spec.atomicity.value  # replication writes carry the replica's atomicity
        remote.create("table", path, attributes=attrs, recursive=True)
        events.append(Event("Normal", "ReplicaTableCreated", f"{path} created on {spec.cluster}"))
        current = remote.get(f"{path}/@")
    if current.get("type") != "table":
        raise YtError(f"{path} on {spec.cluster} is a {current.get('type')}, not a table")
    if current.get("upstream_replica_id") != upstream:
        if current.get("tablet_state") != TabletState.UNMOUNTED:
            remote.unmount_table(path)
        remote.alter_table(path, upstream_replica_id=upstream or "0-0-0-0")
        events.append(Event("Normal", "ReplicaTableAdopted", f"{path} on {spec.cluster} now follows {replica_id}"))
        current["tablet_state"] = TabletState.UNMOUNTED
    if current.get("tablet_state") == TabletState.UNMOUNTED:
        remote.mount_table(path)
    return events, str(current["id"])


def _lag_threshold(table: Resource) -> int:
    """The table's ``syncReplicaLagThreshold`` in seconds: above it a replica is not Replicating."""
    return int(table.spec.replicated_table_options.sync_replica_lag_threshold.total_seconds())


def _status(res: Resource, replica_id: str, info: dict[str, Any], step: replica_bootstrap.Step | None = None,
            threshold: int | None = None, table_id: str | None = None) -> dict[str, Any]:
    tablets = info.get("tablets") or []
    tablet_errors = [t for t in tablets if t.get("replication_error")]
    lag = int(info.get("replication_lag_time", 0)) // 1000
    errors = [{"code": e.get("code"), "message": e.get("message", "")} for e in info.get("errors") or []][:100]
    conds = []
    state = ReplicaState(info["state"])
    enabled_as_wanted = (state is ReplicaState.ENABLED) == res.spec.enabled
    if step is not None:
        conds.append(step.condition)
    if step is not None and step.phase is BootstrapPhase.FAILED:
        conds.append(Cond(ConditionType.READY, False, "BootstrapFailed", step.condition.message))
    elif step is not None and step.phase is not BootstrapPhase.DONE:
        conds.append(Cond(ConditionType.READY, False, "Bootstrapping",
                          f"bootstrap {step.status.get('phase')}: {step.condition.message}"))
    elif errors:
        conds.append(Cond(ConditionType.READY, False, "ReplicationError", errors[0]["message"]))
    elif state in TRANSITIONS:
        conds.append(Cond(ConditionType.READY, False, TRANSITIONS[state],
                          f"replica is {info['state']}: waiting for the replicator to "
                          f"{'start' if state is ReplicaState.ENABLING else 'stop'} on every tablet"))
    elif not enabled_as_wanted:
        conds.append(Cond(ConditionType.READY, False, "StateMismatch", f"replica is {info['state']}"))
    else:
        conds.append(Cond(ConditionType.READY, True, "Replicating" if res.spec.enabled else "Disabled",
                          f"{info['mode']} replica, lag {lag} s"))
    lagging = threshold is not None and lag > threshold
    replicating = state is ReplicaState.ENABLED and not errors and not lagging
    conds.append(Cond(ConditionType.REPLICATING, replicating, "Replicating" if replicating else (
        "ReplicationError" if errors else "Disabled" if state is not ReplicaState.ENABLED else "Lagging"),
        f"state {info['state']}, mode {info['mode']}, lag {lag} s"
        + (f" above syncReplicaLagThreshold {threshold} s" if lagging else "")))
    status: dict[str, Any] = {
        "replicaId": replica_id, "replicaTableId": table_id, "state": info["state"], "mode": info["mode"],
        "lagSeconds": lag,
        "tablets": {"count": len(tablets), "errors": len(tablet_errors),
                    "maxLagSeconds": max((int(t.get("replication_lag_time", 0)) // 1000 for t in tablets), default=0),
                    "rowsBehind": sum(max(0, int(t.get("flushed_row_count") or 0)
                                          - int(t.get("current_replication_row_index") or 0)) for t in tablets)},
        "errors": errors, "observedGeneration": res.generation, "unreachable": None,
        "conditions": conditions.merge(res.status.get("conditions"), conds, res.generation)}
    if step is not None:
        status["bootstrap"] = step.status
    return status


def finalize_table_replica(res: Resource, world: World) -> Outcome:
    """``Retain`` leaves replica object and table; ``Delete`` removes both."""
    spec = res.spec
    if spec.deletion_policy is not DeletionPolicy.DELETE:
        return Outcome(events=[Event("Normal", "Retained", f"replica of {spec.table} on {spec.cluster} retained")])
    table = world.find("ReplicatedTable", res.namespace, spec.table)
    replica_id = res.status.get("replicaId")
    try:
        if table is not None and replica_id:
            meta = world.engines.client(table.spec.cluster)
            if meta.exists(f"#{replica_id}"):
                meta.remove(f"#{replica_id}")
        remote = world.engines.client(spec.cluster)
        if remote.exists(spec.replica_path):
            if remote.get(f"{spec.replica_path}/@tablet_state") != TabletState.UNMOUNTED:
                remote.unmount_table(spec.replica_path)
            remote.remove(spec.replica_path)
    except ClusterNotFound as exc:
        return Outcome(events=[Event("Warning", "Retained", f"{exc}; nothing removed there")])
    except YtError as exc:
        return Outcome(finished=False, retry_after=10.0, events=[Event("Warning", "DeleteFailed", describe_error(exc))])
    return Outcome(events=[Event("Normal", "Deleted", f"replica {replica_id} and {spec.replica_path} removed")])
