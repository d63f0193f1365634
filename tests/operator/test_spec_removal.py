"""Removing an optional spec field restores the engine's default (docs/operations.md, "Removing a
setting"): the reconcile core on two real engines, one test per field.

Each case sets the field in a manifest, waits for the engine to have it, removes the field (the
manifest's ``metadata.generation`` goes up, as the API server and ``reptables up`` do on a spec
edit), and waits for the engine's default again. The event of that pass names the field as a
configuration change (``ConfigurationChanged``, or the replica's own ``Enabling``/``ModeChanged``);
``DriftCorrected`` is only for a change made on the engine behind the spec's back. Issue 26 found
``replicationThrottler`` removed from a manifest left ``@replication_throttler`` in place, reported
as ``DriftCorrected``.

The fields, from ``operator/models``: ReplicatedTable ``replicationThrottler`` (and its ``period``),
``frozen``, ``minReplicationLogTtl``, ``replicatedTableOptions`` (whole, and each of
``enableReplicatedTableTracker``, ``minSyncReplicaCount``, ``maxSyncReplicaCount``,
``preferredSyncReplicaClusters``, ``syncReplicaLagThreshold``); TableReplica ``enabled``, ``mode``,
``enableReplicatedTableTracker``; TableCluster ``readOnly``. Not here, on purpose: ``pivotKeys`` and
``tabletCount`` (an absent field leaves the tablets as they are; resharding unmounts the table, so
it is never implied), ``deletionPolicy``, ``bootstrap`` and ``local`` (the operator's own, nothing on
an engine) and the immutable fields.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.process import start_all
from reptables.operator.controllers.world import Engines
from reptables.operator.registry import CredentialPolicy, Registry
from tests.harness import EngineProcess
from tests.operator.test_bootstrap import NS, OPS, Operator, cluster, replica, secret, table

NAMES = ("meta", "c0")
ABSENT = "<absent>"
_tables = itertools.count()


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    base: Path = tmp_path_factory.mktemp("op-spec-removal")
    engines: dict[str, EngineProcess] = {}
    registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
    try:
        for name in NAMES:
            engines[name] = EngineProcess(name, base / name, token=f"token-{name}-0123456789abcdef")
        start_all(engines.values())
        operator = Operator(engines, registry, launcher=None)  # type: ignore[arg-type]  # no jobs here
        for index, name in enumerate(NAMES):
            registry.upsert_secret(secret(f"{name}-token", engines[name].read_token()))
            operator.add(cluster(name, engines[name].url, index))
        yield operator
    finally:
        for engine in engines.values():
            engine.stop()


def edit(op: Operator, kind: str, namespace: str | None, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    """A spec edit as the API server stores it: the spec changed, ``metadata.generation`` one up."""
    body = op.bodies[(kind, namespace, name)]
    change(body["spec"])
    body["metadata"]["generation"] += 1
    op.registry.upsert(body)


def remove(*keys: str) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        for key in keys[:-1]:
            spec = spec[key]
        del spec[keys[-1]]
    return change


def table_attr(name: str, *keys: str) -> Callable[[Client, Operator], Any]:
    def read(meta: Client, _: Operator) -> Any:
        value: Any = meta.get(f"//home/{name}/@")
        for key in keys:
            value = value.get(key, ABSENT) if isinstance(value, dict) else ABSENT
        return value
    return read


def replica_attr(name: str, key: str) -> Callable[[Client, Operator], Any]:
    def read(meta: Client, op: Operator) -> Any:
        replica_id = op.replica(name).status.get("replicaId")
        return meta.get(f"#{replica_id}/@").get(key, ABSENT) if replica_id else None
    return read


@dataclass(frozen=True)
class Case:
    field: str
    """The field as a user names it (``replicatedTableOptions.minSyncReplicaCount``)."""
    spec: dict[str, Any]
    """What the manifest sets (for a TableReplica case, its spec)."""
    removed: tuple[str, ...]
    """The key path removed from the spec."""
    attribute: tuple[str, ...]
    """Where the engine keeps it: the table's attribute path, or ("replica", key)."""
    when_set: Any
    default: Any
    reason: str = "ConfigurationChanged"
    named: str = ""
    """What the event's message says (default: ``spec.<first key removed>``)."""


OPTIONS = "replicatedTableOptions"
CASES = [
    Case("replicationThrottler", {"replicationThrottler": {"period": 500, "limit": 1000}}, ("replicationThrottler",),
         ("replication_throttler",), {"period": 500, "limit": 1000}, ABSENT,
         named="spec.replicationThrottler removed (the default: no limit)"),
    Case("replicationThrottler.period", {"replicationThrottler": {"period": 500, "limit": 1000}},
         ("replicationThrottler", "period"), ("replication_throttler",), {"period": 500, "limit": 1000},
         {"period": 1000, "limit": 1000}),
    Case("frozen", {"frozen": True}, ("frozen",), ("tablet_state",), "frozen", "mounted",
         named="spec.frozen not set (the default: false)"),
    Case("minReplicationLogTtl", {"minReplicationLogTtl": "1m"}, ("minReplicationLogTtl",),
         ("min_replication_log_ttl",), 60_000, 300_000, named="spec.minReplicationLogTtl not set (the default: 5m)"),
    Case("replicatedTableOptions", {OPTIONS: {"enableReplicatedTableTracker": True, "maxSyncReplicaCount": 1}},
         (OPTIONS,), ("replicated_table_options",),
         {"enable_replicated_table_tracker": True, "max_sync_replica_count": 1, "sync_replica_lag_threshold": 600_000},
         {"enable_replicated_table_tracker": False, "sync_replica_lag_threshold": 600_000},
         named="maxSyncReplicaCount removed (the default applies)"),
    Case("replicatedTableOptions.enableReplicatedTableTracker", {OPTIONS: {"enableReplicatedTableTracker": True}},
         (OPTIONS, "enableReplicatedTableTracker"), ("replicated_table_options", "enable_replicated_table_tracker"),
         True, False, named="enableReplicatedTableTracker set to false"),
    Case("replicatedTableOptions.minSyncReplicaCount", {OPTIONS: {"minSyncReplicaCount": 0}},  # 0: falsy, not absent
         (OPTIONS, "minSyncReplicaCount"), ("replicated_table_options", "min_sync_replica_count"), 0, ABSENT,
         named="minSyncReplicaCount removed (the default applies)"),
    Case("replicatedTableOptions.maxSyncReplicaCount", {OPTIONS: {"maxSyncReplicaCount": 2}},
         (OPTIONS, "maxSyncReplicaCount"), ("replicated_table_options", "max_sync_replica_count"), 2, ABSENT,
         named="maxSyncReplicaCount removed (the default applies)"),
    Case("replicatedTableOptions.preferredSyncReplicaClusters", {OPTIONS: {"preferredSyncReplicaClusters": ["c0"]}},
         (OPTIONS, "preferredSyncReplicaClusters"), ("replicated_table_options", "preferred_sync_replica_clusters"),
         ["c0"], ABSENT, named="preferredSyncReplicaClusters removed (the default applies)"),
    Case("replicatedTableOptions.syncReplicaLagThreshold", {OPTIONS: {"syncReplicaLagThreshold": "90s"}},
         (OPTIONS, "syncReplicaLagThreshold"), ("replicated_table_options", "sync_replica_lag_threshold"),
         90_000, 600_000, named="syncReplicaLagThreshold set to 600000"),
    Case("TableReplica enabled", {"enabled": False}, ("enabled",), ("replica", "state"), "disabled", "enabled",
         reason="Enabling", named="spec.enabled not set (the default: true)"),
    Case("TableReplica mode", {"mode": "sync"}, ("mode",), ("replica", "mode"), "sync", "async",
         reason="ModeChanged", named="spec.mode not set (the default: async)"),
    Case("TableReplica enableReplicatedTableTracker", {"enableReplicatedTableTracker": False},
         ("enableReplicatedTableTracker",), ("replica", "enable_replicated_table_tracker"), False, True,
         named="spec.enableReplicatedTableTracker not set (the default: true)"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.field for c in CASES])
def test_removing_a_field_restores_the_engines_default_as_a_configuration_change(op: Operator, case: Case) -> None:
    name = f"removal{next(_tables)}"
    doc = table(name)
    on_replica = case.attribute[0] == "replica"
    if not on_replica:
        doc["spec"].update(case.spec)
    op.add(doc)
    replica_name = f"{name}-r"
    replica_doc = replica(replica_name, name, "c0")
    if on_replica:
        replica_doc["spec"].update(case.spec)
    op.add(replica_doc)
    read = replica_attr(replica_name, case.attribute[1]) if on_replica else table_attr(name, *case.attribute)
    owner = replica_name if on_replica else name
    with op.client("meta") as meta:
        op.until(lambda: read(meta, op) == case.when_set and op.replica(replica_name).status.get("state")
                 in ("enabled", "disabled"), 60, f"{case.field} on the engine")
        op.until(lambda: op.replica(replica_name).status.get("observedGeneration") == 1
                 and op.bodies[("ReplicatedTable", NS, name)]["status"].get("observedGeneration") == 1, 30,
                 "both resources reconciled")
        seen = len(op.events.get(owner, []))

        edit(op, "TableReplica" if on_replica else "ReplicatedTable", NS, owner, remove(*case.removed))
        op.until(lambda: read(meta, op) == case.default, 60, f"the default of {case.field} back on the engine")

    events = op.events[owner][seen:]
    named = case.named or f"spec.{case.removed[0]}"
    assert [e for e in events if e.reason == case.reason and named in e.message], events
    assert not [e for e in events if e.reason == "DriftCorrected"], events


def test_a_throttler_set_on_the_engine_behind_the_specs_back_is_drift(op: Operator) -> None:
    """Without ``replicationThrottler`` in the spec the engine's default holds: one set with ``yt set`` is
    removed again, and that is ``DriftCorrected``, not a configuration change."""
    op.add(table("drifting"))
    op.add(replica("drifting-r", "drifting", "c0"))
    with op.client("meta") as meta:
        op.until(lambda: op.replica("drifting-r").status.get("state") == "enabled", 60, "the replica")
        seen = len(op.events.get("drifting", []))
        meta.set("//home/drifting/@replication_throttler", {"period": 1000, "limit": 2000})
        meta.set("//home/drifting/@min_replication_log_ttl", 1000)
        op.until(lambda: "replication_throttler" not in meta.get("//home/drifting/@")
                 and meta.get("//home/drifting/@min_replication_log_ttl") == 0, 30, "the spec's settings back")
    reasons = [(e.reason, e.message) for e in op.events["drifting"][seen:]]
    assert [r for r, m in reasons if "replication_throttler" in m] == ["DriftCorrected"], reasons
    assert [r for r, m in reasons if "min_replication_log_ttl" in m] == ["DriftCorrected"], reasons


def test_removing_read_only_makes_the_cluster_writable_again(op: Operator) -> None:
    doc = cluster("c0", op.engines["c0"].url, 1)
    doc["spec"]["readOnly"] = True
    op.add(doc)
    with op.client("c0") as c0:
        op.until(lambda: c0.get("//sys/@read_only") is True, 30, "c0 read-only")
        seen = len(op.events.get("c0", []))
        edit(op, "TableCluster", None, "c0", remove("readOnly"))
        op.until(lambda: c0.get("//sys/@read_only") is False, 30, "c0 writable again")
    events = op.events["c0"][seen:]
    assert [e for e in events if e.reason == "Writable" and "spec.readOnly not set (the default: false)" in e.message]
