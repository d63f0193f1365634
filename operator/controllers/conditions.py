"""Status conditions the Kubernetes way.

A condition is ``{type, status, reason, message, observedGeneration, lastTransitionTime}``. The
subtle rule is ``lastTransitionTime``: it changes only when ``status`` changes, not when the
reason, the message or the generation do — otherwise every status refresh would look like a
transition and `kubectl wait`, alerts and GitOps health checks would flap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
REPLICATING = "Replicating"
WRITABLE = "Writable"
BOOTSTRAPPED = "Bootstrapped"


@dataclass(frozen=True)
class Cond:
    """A condition as a reconciler decides it (time and generation are filled in by ``merge``)."""

    type: str
    status: bool | None
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


def now_text(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A time as ``now_text`` writes it (Kubernetes' form); None when absent or malformed."""
    if not text:
        return None
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


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


def is_true(conditions: list[dict[str, Any]] | None, type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions or [])


def reason_of(conditions: list[dict[str, Any]] | None, type_: str) -> str | None:
    for c in conditions or []:
        if c.get("type") == type_:
            return c.get("reason")
    return None
