"""Status conditions the Kubernetes way.

A condition is ``{type, status, reason, message, observedGeneration, lastTransitionTime}``. The
subtle rule is ``lastTransitionTime``: it changes only when ``status`` changes, not when the
reason, the message or the generation do — otherwise every status refresh would look like a
transition and `kubectl wait`, alerts and GitOps health checks would flap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..models.common import ConditionStatus, ConditionType, now_text


@dataclass(frozen=True)
class Cond:
    """A condition as a reconciler decides it (time and generation are filled in by ``merge``)."""

    type: ConditionType
    status: bool | None
    reason: str
    message: str

    @property
    def status_text(self) -> ConditionStatus:
        if self.status is None:
            return ConditionStatus.UNKNOWN
        return ConditionStatus.TRUE if self.status else ConditionStatus.FALSE


def merge(existing: list[dict[str, Any]] | None, updates: list[Cond], generation: int | None,
          now: datetime | None = None) -> list[dict[str, Any]]:
    """New conditions list: ``updates`` applied over ``existing``, transitions timed correctly."""
    by_type = {c.get("type"): dict(c) for c in existing or []}
    for cond in updates:
        old = by_type.get(cond.type)
        if old is None or old.get("status") != cond.status_text:
            transition = now_text(now)
        else:
            transition = old.get("lastTransitionTime") or now_text(now)
        entry: dict[str, Any] = {
            "type": cond.type, "status": cond.status_text, "reason": cond.reason,
            "message": cond.message[:32768], "lastTransitionTime": transition,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        by_type[cond.type] = entry
    return sorted(by_type.values(), key=lambda c: str(c.get("type")))


def is_true(conditions: list[dict[str, Any]] | None, type_: ConditionType) -> bool:
    return any(c.get("type") == type_ and c.get("status") == ConditionStatus.TRUE for c in conditions or [])


def reason_of(conditions: list[dict[str, Any]] | None, type_: ConditionType) -> str | None:
    for c in conditions or []:
        if c.get("type") == type_:
            return c.get("reason")
    return None
