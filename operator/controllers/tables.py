"""ReplicatedTable reconciliation: the replicated table on its meta-cluster, and its status.

Creation is idempotent and restart-safe: a table already at the path is *adopted* (by path, and
checked to be a replicated table with the same key columns), never created twice. Options the
spec owns (``replicated_table_options``, ``replication_throttler``, ``min_replication_log_ttl``,
pivot keys, frozen) are compared with the engine on every pass and out-of-band drift is corrected
with an event. ``Ready`` means replication is healthy — every enabled replica replicating without
errors — not merely that the table exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic.alias_generators import to_camel

from reptables.engine.client import Client
from reptables.engine.errors import YtError
from reptables.engine.replica_types import ReplicaMode, ReplicaState
from reptables.engine.schema import INCOMPATIBLE_SCHEMAS, TableSchema, check_schema_update
from reptables.engine.tablets import TabletState

from ..models import ConditionType, DeletionPolicy, SchemaMigrationPhase, format_duration
from . import conditions
from .common import not_ready, unreachable, unreachable_status, unreachable_text, yt_schema
from .conditions import Cond
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


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


def yt_options(spec: Any) -> dict[str, Any]:
    o = spec.replicated_table_options
    options: dict[str, Any] = {"enable_replicated_table_tracker": o.enable_replicated_table_tracker,
                               "sync_replica_lag_threshold": _ms(o.sync_replica_lag_threshold)}
    if o.min_sync_replica_count is not None:
        options["min_sync_replica_count"] = o.min_sync_replica_count
    if o.max_sync_replica_count is not None:
        options["max_sync_replica_count"] = o.max_sync_replica_count
    if o.preferred_sync_replica_clusters:
        options["preferred_sync_replica_clusters"] = list(o.preferred_sync_replica_clusters)
    return options


def _throttler(spec: Any) -> dict[str, int] | None:
    t = spec.replication_throttler
    return None if t is None else {"period": t.period, "limit": t.limit}


def table_place(table: Resource) -> tuple[str, str]:
    """What a ReplicatedTable claims: the table ``spec.path`` on ``spec.cluster`` (across namespaces)."""
    return table.spec.cluster, table.spec.path


def replica_table(replica: Resource) -> tuple[str | None, str]:
    """The ReplicatedTable a TableReplica belongs to: (its namespace, ``spec.table``)."""
    return replica.namespace, replica.spec.table


def reconcile_replicated_table(res: Resource, world: World) -> Outcome:
    spec = res.spec
    claimants = [r for r in world.grouped("ReplicatedTable", table_place).get(table_place(res), ())
                 if not r.deleting]
    winner = oldest_claimant(claimants) if claimants else res
    if winner.uid != res.uid:
        return not_ready(res, "ResourceConflict",
                          f"{winner.display} already manages {spec.path} on cluster {spec.cluster}", 30.0)
    try:
        client = world.engines.client(spec.cluster)
    except ClusterNotFound as exc:
        return not_ready(res, "ClusterNotFound", str(exc), 30.0)
    events: list[Event] = []
    path = spec.path
    try:
        if not client.exists(path):
            attrs: dict[str, Any] = {"dynamic": True, "schema": yt_schema(spec),
                                     "replicated_table_options": yt_options(spec),
                                     "min_replication_log_ttl": _ms(spec.min_replication_log_ttl)}
            if spec.pivot_keys:
                attrs["pivot_keys"] = spec.pivot_keys
            if spec.tablet_count:
                attrs["tablet_count"] = spec.tablet_count
            if _throttler(spec):
                attrs["replication_throttler"] = _throttler(spec)
            client.create("replicated_table", path, attributes=attrs, recursive=True)
            events.append(Event("Normal", "Created", f"replicated table {path} created on {spec.cluster}"))
        node_type = client.get(f"{path}/@type")
        if node_type != "replicated_table":
            return not_ready(res, "PathOccupied", f"{path} on {spec.cluster} is a {node_type}, not a "
                                                   "replicated_table", 30.0)
        attrs = client.get(f"{path}/@")
        keys = [c["name"] for c in yt_schema(spec) if c.get("sort_order")]
        if list(attrs.get("key_columns", [])) != keys:
            return not_ready(res, "SchemaMismatch", f"{path} on {spec.cluster} has key columns "
                                                     f"{attrs.get('key_columns')}, the spec says {keys}", 30.0)
        migration = _migrate_schema(res, world, client, path, attrs)
        if migration is not None and migration.refused:
            out = not_ready(res, "SchemaChangeRefused", migration.message, 30.0)
            out.status["schemaMigration"] = migration.status(res)
            return out
        if migration is not None:
            events += migration.events
            if migration.phase is SchemaMigrationPhase.DONE:
                attrs = client.get(f"{path}/@")
        events += _correct_drift(client, path, res, attrs)
        status = _status(res, world, client, path, attrs)
    except YtError as exc:
        if unreachable(exc):
            return _meta_unreachable(res, exc)
        out = not_ready(res, "EngineError", f"{spec.cluster}: {describe_error(exc)}", 10.0)
        out.status.pop("observedGeneration")  # the spec was not applied: its edit is still to come
        return out
    out = Outcome(retry_after=REFRESH_SECONDS, events=events)
    out.status = status
    if migration is not None:
        out.status["schemaMigration"] = migration.status(res)
        if migration.phase is not SchemaMigrationPhase.DONE:
            # under way: Ready says so until the replicated table has the new schema too
            out.retry_after = 1.0 if migration.phase is SchemaMigrationPhase.TABLE else 5.0
            out.status["conditions"] = conditions.merge(out.status["conditions"], [Cond(
                ConditionType.READY, False, "SchemaMigrating", migration.message)], res.generation)
    elif res.status.get("schemaMigration"):
        previous = dict(res.status["schemaMigration"])
        if previous.get("phase") != SchemaMigrationPhase.DONE:
            # the engine has the manifest's schema (an edit reverted, say, or the pass that altered the
            # table was not in the status this pass read): nothing is under way; the columns say which
            columns = ", ".join(c.name for c in spec.table_schema)
            previous = {"phase": SchemaMigrationPhase.DONE, "pending": [],
                        "message": f"{path} has the manifest's schema ({columns})",
                        "observedGeneration": res.generation}
        out.status["schemaMigration"] = previous
    return out


def _meta_unreachable(res: Resource, exc: YtError) -> Outcome:
    """The meta-cluster does not answer: what the status knew of the replicas is not true any more.

    The replicas' modes, states and lags are dropped (the list keeps their names and clusters), no
    replica is claimed to be sync, and the table is not Writable: nothing can be written or read
    through it until the meta-cluster is back. ``status.unreachable`` says since when."""
    lost = unreachable_status(res.status.get("unreachable"), res.spec.cluster, exc)
    message = unreachable_text(lost, "meta-cluster")
    out = not_ready(res, "ClusterUnreachable", message, 5.0)
    out.status.pop("observedGeneration")
    out.status["conditions"] = conditions.merge(out.status["conditions"], [
        Cond(ConditionType.REPLICATING, None, "ClusterUnreachable", message),
        Cond(ConditionType.WRITABLE, False, "ClusterUnreachable", message)], res.generation)
    out.status.update({
        "unreachable": lost, "syncReplicas": [], "maxLagSeconds": None,
        "replicas": [{"name": r.get("name"), "cluster": r.get("cluster")} for r in res.status.get("replicas") or []
                     if isinstance(r, dict) and r.get("name") and r.get("cluster")]})
    return out


# -- schema edits ------------------------------------------------------------------------------------


def _columns(raw: Any) -> list[dict[str, Any]]:
    """A schema as the engine reports it (a list, or YSON's ``{"$value": [...]}`` with attributes),
    reduced to what a manifest states of each column."""
    if isinstance(raw, dict):
        raw = raw.get("$value", [])
    out = []
    for col in raw or []:
        column: dict[str, Any] = {"name": col["name"], "type": col["type"], "required": bool(col.get("required"))}
        if col.get("sort_order"):
            column["sort_order"] = col["sort_order"]
        if col.get("lock"):
            column["lock"] = col["lock"]
        out.append(column)
    return out


def widened(current: list[dict[str, Any]], desired: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The schema a replica table needs before the replicated table takes ``desired``: its own
    columns, with ``required`` relaxed where ``desired`` relaxes it, and the columns of ``desired``
    it lacks appended. A replica may stay wider than the replicated table (seed 002)."""
    wanted = {c["name"]: c for c in desired}
    out = []
    for col in current:
        want = wanted.get(col["name"])
        out.append({**col, "required": False} if want is not None and col["required"] and not want["required"]
                   else col)
    have = {c["name"] for c in current}
    return out + [c for c in desired if c["name"] not in have]


@dataclass
class Migration:
    """One reconcile pass of a schema edit: what it did and where it stands."""

    phase: SchemaMigrationPhase
    message: str
    pending: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        """The edit cannot be applied: nothing was touched, and nothing will be until it changes."""
        return self.phase is SchemaMigrationPhase.REFUSED

    def status(self, res: Resource) -> dict[str, Any]:
        return {"phase": self.phase, "pending": self.pending,
                "message": self.message, "observedGeneration": res.generation}


def _migrate_schema(res: Resource, world: World, client: Client, path: str, attrs: dict[str, Any]) -> Migration | None:
    """Apply a schema edit of the manifest in seed 002's order; None when the engine already has it.

    "Start the schema change with the replicas and then move on to the replicated table": a pass
    first widens every replica table that lacks a new column (or still requires a relaxed one),
    on its own cluster; the next pass alters the replicated table (the engine itself refuses it
    while an enabled replica is narrower). An edit the engine cannot take (a removed, reordered or
    retyped column, a new required column, a lock change) is refused here, before anything is
    touched, with the engine's own reason naming the column."""
    desired = yt_schema(res.spec)
    current = _columns(attrs.get("schema"))
    if current == desired:
        return None
    try:
        check_schema_update(TableSchema.parse(current, path), TableSchema.parse(desired, path), path, empty=False)
    except YtError as exc:
        return Migration(SchemaMigrationPhase.REFUSED, f"the schema edit cannot be applied: {exc.message}; the "
                         f"engine keeps {[c['name'] for c in current]} (revert the edit, or create a new table)")
    owners = {r.status.get("replicaId"): r.name for r in world.of_kind(
        "TableReplica", res.namespace, lambda r: r.spec.table == res.name and bool(r.status.get("replicaId")))}
    events: list[Event] = []
    pending: list[str] = []
    problems: list[str] = []
    for replica_id, info in sorted((client.get(f"{path}/@replicas") or {}).items()):
        name = owners.get(replica_id, replica_id)
        cluster, replica_path = info["cluster_name"], info["replica_path"]
        try:
            remote = world.engines.client(cluster)
            if not remote.exists(replica_path):
                continue  # made later from the manifest's schema (replicas.py)
            have = _columns(remote.get(f"{replica_path}/@schema"))
            want = widened(have, desired)
            if want == have:
                continue
            remote.alter_table(replica_path, schema=want)
        except (YtError, ClusterNotFound) as exc:
            pending.append(name)
            why = describe_error(exc) if isinstance(exc, YtError) else str(exc)
            problems.append(f"{name} ({cluster}:{replica_path}): {why}")
            continue
        events.append(Event("Normal", "SchemaMigrating", f"replica table {replica_path} on {cluster} ({name}) "
                                                         f"altered to the new schema"))
    if problems:
        return Migration(SchemaMigrationPhase.REPLICAS, "waiting for replica tables: " + "; ".join(problems), pending,
                         events)
    if events:
        return Migration(SchemaMigrationPhase.TABLE, f"{len(events)} replica table(s) altered; the replicated table "
                         "is next", [], events)
    try:
        client.alter_table(path, schema=desired)
    except YtError as exc:
        if exc.code == INCOMPATIBLE_SCHEMAS:
            return Migration(SchemaMigrationPhase.REFUSED, f"the schema edit cannot be applied: {exc.message}")
        return Migration(SchemaMigrationPhase.TABLE, f"altering {path}: {describe_error(exc)}", [], events)
    added = [c["name"] for c in desired if c["name"] not in {x["name"] for x in current}]
    message = f"{path} has the new schema" + (f" (added {', '.join(added)})" if added else "")
    return Migration(SchemaMigrationPhase.DONE, message, [], [Event("Normal", "SchemaMigrated", message)])


def _correct_drift(client: Client, path: str, res: Resource, attrs: dict[str, Any]) -> list[Event]:
    """Bring the engine's settings to the spec: every optional field absent means the engine's default.

    A difference found on the first pass after the spec changed (``metadata.generation`` ahead of
    ``status.observedGeneration``) is the user's edit being applied: event ``ConfigurationChanged``,
    naming the field (and, for a removed one, the default it goes back to). A difference found later
    was made out of band on the engine, and is undone: event ``DriftCorrected``."""
    spec = res.spec
    change = _ChangeEvents(res, path)
    desired = yt_options(spec)
    current = dict(attrs.get("replicated_table_options") or {})
    if current != desired:
        client.set(f"{path}/@replicated_table_options", desired)
        change.add("replicatedTableOptions", _option_changes(current, desired),
                   f"replicated_table_options of {path} set to {json.dumps(desired, sort_keys=True)}")
    throttler = _throttler(spec)
    engine_throttler = attrs.get("replication_throttler") or None
    if throttler is None and engine_throttler is not None:
        client.remove(f"{path}/@replication_throttler")
        change.add("replicationThrottler", "removed (the default: no limit)",
                   f"replication_throttler of {path} removed: replication is not throttled")
    elif throttler is not None and engine_throttler != throttler:
        client.set(f"{path}/@replication_throttler", throttler)
        change.add("replicationThrottler", f"set to {json.dumps(throttler)}", f"replication_throttler of {path} set")
    ttl = _ms(spec.min_replication_log_ttl)
    if attrs.get("min_replication_log_ttl") != ttl:
        client.set(f"{path}/@min_replication_log_ttl", ttl)
        change.add("minReplicationLogTtl", _default_note(spec, "min_replication_log_ttl",
                                                         format_duration(spec.min_replication_log_ttl)),
                   f"min_replication_log_ttl of {path} set to {ttl} ms")
    state = attrs.get("tablet_state")
    want_pivots = spec.pivot_keys
    if want_pivots and attrs.get("pivot_keys") != want_pivots or (
            spec.tablet_count and attrs.get("tablet_count") != spec.tablet_count):
        if state != TabletState.UNMOUNTED:
            client.unmount_table(path)
        if want_pivots:
            client.reshard_table(path, pivot_keys=want_pivots)
        else:
            client.reshard_table(path, tablet_count=spec.tablet_count)
        state = TabletState.UNMOUNTED
        change.events.append(Event("Normal", "Resharded", f"{path} resharded to "
                                                          f"{len(want_pivots or []) or spec.tablet_count} tablets"))
    if state == TabletState.UNMOUNTED:
        client.mount_table(path, freeze=spec.frozen)
        change.events.append(Event("Normal", "Mounted", f"{path} mounted{' frozen' if spec.frozen else ''}"))
    elif spec.frozen and state == TabletState.MOUNTED:
        client.freeze_table(path)
        change.add("frozen", "set to true", f"{path} frozen: writes are refused")
    elif not spec.frozen and state == TabletState.FROZEN:
        client.unfreeze_table(path)
        change.add("frozen", _default_note(spec, "frozen", "false"), f"{path} unfrozen: writes are accepted")
    return change.events


class _ChangeEvents:
    """The events of one pass that brought engine settings to the spec (see ``_correct_drift``)."""

    def __init__(self, res: Resource, path: str) -> None:
        self.res = res
        self.path = path
        self.configuration = res.status.get("observedGeneration") != res.generation
        self.events: list[Event] = []

    def add(self, field_name: str, how: str, what: str) -> None:
        if self.configuration:
            self.events.append(Event("Normal", "ConfigurationChanged", f"spec.{field_name} {how}: {what}"))
        else:
            self.events.append(Event("Normal", "DriftCorrected", f"{what} (changed on the engine, not in the spec; "
                                                                 f"spec.{field_name} is what counts)"))


def _default_note(spec: Any, field_name: str, default: str) -> str:
    """How a field with a default came to its value: set in the spec, or left out (the default applies)."""
    return f"set to {default}" if field_name in spec.model_fields_set else f"not set (the default: {default})"


def _option_changes(current: dict[str, Any], desired: dict[str, Any]) -> str:
    """Which of ``replicated_table_options`` change, by their manifest names; removed ones say so."""
    parts = []
    for key in sorted(set(current) | set(desired)):
        name = to_camel(key)
        if key not in desired:
            parts.append(f"{name} removed (the default applies)")
        elif current.get(key) != desired[key]:
            parts.append(f"{name} set to {json.dumps(desired[key])}")
    return ", ".join(parts)


def _status(res: Resource, world: World, client: Client, path: str, attrs: dict[str, Any]) -> dict[str, Any]:
    # (found through a shared grouping, then each read with its current status: O(replicas of the
    # table) per refresh, where a scan of every TableReplica made a round of N tables O(N^2))
    mine = [found for r in world.grouped("TableReplica", replica_table).get((res.namespace, res.name), ())
            if (found := world.find("TableReplica", r.namespace, r.name)) is not None]
    by_replica_id = {r.status.get("replicaId"): r for r in mine if r.status.get("replicaId")}
    # a TableReplica whose status does not hold its replicaId yet (the replica was just created, its
    # status patch is on its way) is known by where its replica lives, as its reconciler finds it
    unrecorded: dict[tuple[str, str], list[Resource]] = {}
    for r in mine:
        if not r.status.get("replicaId") and not r.deleting:
            unrecorded.setdefault((r.spec.cluster, r.spec.replica_path), []).append(r)
    replicas_attr: dict[str, Any] = client.get(f"{path}/@replicas")
    summaries, sync, errors, max_lag = [], [], [], 0
    for replica_id, info in sorted(replicas_attr.items()):
        owner = by_replica_id.get(replica_id)
        if owner is None and (claimants := unrecorded.get((info["cluster_name"], info["replica_path"]))):
            owner = oldest_claimant(claimants)
        name = owner.name if owner is not None else replica_id
        lag = int(info.get("replication_lag_time", 0)) // 1000
        max_lag = max(max_lag, lag)
        summaries.append({"name": name, "cluster": info["cluster_name"], "mode": info["mode"],
                          "state": info["state"], "lagSeconds": lag})
        if info["mode"] == ReplicaMode.SYNC and info["state"] == ReplicaState.ENABLED:
            sync.append(name)
        if info.get("errors"):
            errors.append(f"{name}: {info['errors'][0].get('message')}")
    enabled = [s for s in summaries if s["state"] == ReplicaState.ENABLED]
    conds = []
    frozen_ok = (attrs.get("tablet_state") == TabletState.FROZEN) == res.spec.frozen
    if errors:
        conds.append(Cond(ConditionType.READY, False, "ReplicationErrors", "; ".join(errors)))
    elif not frozen_ok:
        conds.append(Cond(ConditionType.READY, False, "TabletState", f"tablets are {attrs.get('tablet_state')}"))
    elif not enabled:
        # mounted but serving nothing: no replica receives its rows, and a write needs
        # require_sync_replica=false (docs/crds.md: Ready is "every enabled replica replicates" of at least one)
        conds.append(Cond(ConditionType.READY, False, "NoReplicas",
                          f"no enabled replica: nothing is replicated and reads have no in-sync replica "
                          f"({len(summaries)} replica(s) in all)"))
    else:
        conds.append(Cond(ConditionType.READY, True, "Replicating",
                          f"{len(enabled)} enabled replica(s), sync: {', '.join(sync) or 'none'}"))
    conds.append(Cond(ConditionType.REPLICATING, bool(enabled) and not errors,
                      "ReplicationErrors" if errors else ("Replicating" if enabled else "NoEnabledReplicas"),
                      "; ".join(errors) if errors else f"{len(enabled)} enabled replica(s)"))
    writable = bool(sync) and attrs.get("tablet_state") == TabletState.MOUNTED
    conds.append(Cond(ConditionType.WRITABLE, writable, "SyncReplicaAvailable" if writable else (
        "Frozen" if attrs.get("tablet_state") == TabletState.FROZEN else "NoSyncReplica"),
        f"sync replicas: {', '.join(sync)}" if sync else "writes need require_sync_replica=false"))
    status = {"tableId": attrs["id"], "syncReplicas": sync, "replicas": summaries, "maxLagSeconds": max_lag,
              "observedGeneration": res.generation, "unreachable": None,
              "conditions": conditions.merge(res.status.get("conditions"), conds, res.generation)}
    tracker = _tracker_status(res, world)
    if tracker is not None:
        status["tracker"] = tracker
    return status


def _tracker_status(res: Resource, world: World) -> dict[str, Any] | None:
    """``status.tracker`` from what the tracker recorded (its last decision and switches survive a restart
    of the operator: the journal extends the status already written)."""
    journal = world.tracker_journal
    previous = res.status.get("tracker")
    if journal is None:
        return None
    if not res.spec.replicated_table_options.enable_replicated_table_tracker:
        journal.forget((res.namespace, res.name))
        if not previous:
            return None
        return {**previous, "summary": "the tracker is off for this table "
                                       "(replicatedTableOptions.enableReplicatedTableTracker: false)"}
    return journal.status((res.namespace, res.name), previous)


def finalize_replicated_table(res: Resource, world: World) -> Outcome:
    """Deletion: ``Retain`` leaves the table on the engine; ``Delete`` unmounts and removes it."""
    spec = res.spec
    if spec.deletion_policy is not DeletionPolicy.DELETE:
        return Outcome(events=[Event("Normal", "Retained", f"{spec.path} left on {spec.cluster} (Retain)")])
    claimants = [r for r in world.grouped("ReplicatedTable", table_place).get(table_place(res), ())
                 if r.uid != res.uid and not r.deleting]
    if claimants:
        return Outcome(events=[Event("Normal", "Retained", f"{spec.path} is still claimed by {claimants[0].display}")])
    try:
        client = world.engines.client(spec.cluster)
        if client.exists(spec.path) and client.get(f"{spec.path}/@id") == res.status.get("tableId", None) or \
                res.status.get("tableId") is None and client.exists(spec.path):
            if client.get(f"{spec.path}/@tablet_state") != TabletState.UNMOUNTED:
                client.unmount_table(spec.path)
            client.remove(spec.path)
    except ClusterNotFound:
        return Outcome(events=[Event("Warning", "Retained", f"cluster {spec.cluster} is gone; nothing removed")])
    except YtError as exc:
        return Outcome(finished=False, retry_after=10.0,
                       events=[Event("Warning", "DeleteFailed", describe_error(exc))])
    return Outcome(events=[Event("Normal", "Deleted", f"{spec.path} removed from {spec.cluster}")])
