"""Helpers that more than one kind's reconciler uses, so that no reconciler imports another.

Each kind's module (``clusters``, ``tables``, ``replicas``, ``collocations``, ``xdcr``) depends only
on the modules below it, never on a sibling: what two of them need lives here (the Ready=False
outcome every kind reports the same way, the engine form of a table schema that ReplicatedTable,
TableReplica and XdcrGroup create tables from, and ``status.unreachable``, how a status says that a
cluster it is read from does not answer, and since when).
"""

from __future__ import annotations

from typing import Any

from reptables.engine.errors import UnavailableError

from ..models import ConditionType
from ..models.common import now_text
from . import conditions
from .conditions import Cond
from .world import Event, Outcome, Resource, describe_error


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


def unreachable(exc: BaseException) -> bool:
    """The engine did not answer (connection refused, timeout) or answered that it is unavailable (105)."""
    return isinstance(exc, UnavailableError)


def unreachable_status(previous: Any, cluster: str, exc: BaseException) -> dict[str, Any]:
    """``status.unreachable`` for ``cluster``: ``since`` kept from ``previous`` while it is the same cluster."""
    before = previous if isinstance(previous, dict) else {}
    since = before.get("since") if before.get("cluster") == cluster and before.get("since") else now_text()
    return {"cluster": cluster, "since": since, "message": describe_error(exc)}


def unreachable_text(status: dict[str, Any], role: str = "cluster") -> str:
    """``"cluster remote-0 unreachable since 2026-...Z: <error>"``: what a condition and the views say."""
    return f"{role} {status['cluster']} unreachable since {status['since']}: {status.get('message') or '-'}"
