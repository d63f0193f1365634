"""TableCollocation reconciliation: the engine's ``table_collocation`` object.

All tables of a collocation must live on one meta-cluster (the engine keeps the collocation there).
The collocation is adopted when one already exists for the first table, so restarts never make a
second one; tables added to the spec later join it with ``@replication_collocation_id``.
"""

from __future__ import annotations

from reptables.engine.errors import YtError

from ..models import ConditionType
from . import conditions
from .common import not_ready
from .conditions import Cond
from .world import ClusterNotFound, Event, Outcome, Resource, World, describe_error


def reconcile_table_collocation(res: Resource, world: World) -> Outcome:
    tables = []
    for name in res.spec.tables:
        table = world.find("ReplicatedTable", res.namespace, name)
        if table is None or not table.status.get("tableId"):
            return not_ready(res, "WaitingForTable", f"ReplicatedTable {res.namespace}/{name} is not created yet", 5.0)
        tables.append(table)
    metas = {t.spec.cluster for t in tables}
    if len(metas) != 1:
        return not_ready(res, "InvalidSpec", f"tables of a collocation must share one meta-cluster, got "
                                             f"{', '.join(sorted(metas))}", 60.0)
    events: list[Event] = []
    try:
        client = world.engines.client(metas.pop())
        collocation_id = res.status.get("collocationId")
        if not collocation_id or not client.exists(f"#{collocation_id}"):
            existing = [client.get(f"{t.spec.path}/@").get("replication_collocation_id") for t in tables]
            collocation_id = next((c for c in existing if c), None)
        if collocation_id is None:
            collocation_id = client.create("table_collocation", attributes={
                "collocation_type": "replication", "table_paths": [t.spec.path for t in tables]})
            events.append(Event("Normal", "Created", f"table_collocation {collocation_id} created"))
        members = set(client.get(f"#{collocation_id}/@table_paths"))
        for table in tables:
            if table.spec.path not in members:
                client.set(f"{table.spec.path}/@replication_collocation_id", collocation_id)
                events.append(Event("Normal", "Joined", f"{table.spec.path} joined {collocation_id}"))
    except ClusterNotFound as exc:
        return not_ready(res, "ClusterNotFound", str(exc), 30.0)
    except YtError as exc:
        return not_ready(res, "EngineError", describe_error(exc), 15.0)
    return Outcome(retry_after=30.0, events=events, status={
        "collocationId": collocation_id, "observedGeneration": res.generation,
        "conditions": conditions.merge(res.status.get("conditions"), [Cond(
            ConditionType.READY, True, "Collocated", f"{len(tables)} tables in {collocation_id}")], res.generation)})


def finalize_table_collocation(res: Resource, world: World) -> Outcome:
    collocation_id = res.status.get("collocationId")
    if not collocation_id:
        return Outcome()
    for name in res.spec.tables:
        table = world.find("ReplicatedTable", res.namespace, name)
        if table is None:
            continue
        try:
            client = world.engines.client(table.spec.cluster)
            if client.exists(f"#{collocation_id}"):
                client.remove(f"#{collocation_id}")
            return Outcome(events=[Event("Normal", "Deleted", f"table_collocation {collocation_id} removed")])
        except (ClusterNotFound, YtError) as exc:
            return Outcome(finished=False, retry_after=10.0,
                           events=[Event("Warning", "DeleteFailed", describe_error(exc))])
    return Outcome()
