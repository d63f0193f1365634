"""Helpers that more than one kind's reconciler uses, so that no reconciler imports another.

Each kind's module (``clusters``, ``tables``, ``replicas``, ``collocations``, ``xdcr``) depends only
on the modules below it, never on a sibling: what two of them need lives here (the Ready=False
outcome every kind reports the same way, and the engine form of a table schema that ReplicatedTable,
TableReplica and XdcrGroup create tables from).
"""

from __future__ import annotations

from typing import Any

from ..models import ConditionType
from . import conditions
from .conditions import Cond
from .world import Event, Outcome, Resource


def not_ready(res: Resource, reason: str, message: str, retry: float) -> Outcome:
    """Ready=False with a precise reason; a Warning event only when the reason is new (no storms)."""
    out = Outcome(retry_after=retry, status={"conditions": conditions.merge(
        res.status.get("conditions"), [Cond(ConditionType.READY, False, reason, message)], res.generation),
        "observedGeneration": res.generation})
    if conditions.reason_of(res.status.get("conditions"), ConditionType.READY) != reason:
        out.events.append(Event("Warning", reason, message))
    return out


def yt_schema(spec: Any) -> list[dict[str, Any]]:
    """The engine's schema (YT's column maps) of a spec with ``table_schema`` (a table's or an XDCR table's)."""
    out = []
    for col in spec.table_schema:
        column: dict[str, Any] = {"name": col.name, "type": col.type.value, "required": col.required}
        if col.sort_order is not None:
            column["sort_order"] = col.sort_order.value
        if col.lock:
            column["lock"] = col.lock
        out.append(column)
    return out
