"""The XDCR settings of a cluster and what two clusters must agree on: checked when they are set.

``//sys/@xdcr_connections`` (the peers), ``//sys/@xdcr_conflict_retention`` and
``//sys/@xdcr_preferred_source`` are live settings. What cannot work is refused when it is set, not
found later by ``dr_status``: a list that is not distinct names of ``//sys/clusters`` other than the
cluster's own, more peers than cluster ids, or peers that share a cluster id (each listed peer that
answers is asked its id). A table's schema must be identical on every member (seed 001:
replication waits until it is), and a difference is told column by column, naming both clusters.
"""

from __future__ import annotations

import json
from typing import Any

from ..schema import TableSchema

#: the settings of ``//sys`` that ``_check_setting`` checks
XDCR_SETTINGS = ("xdcr_connections", "xdcr_conflict_retention", "xdcr_preferred_source")
#: the longest conflict-log retention (100 years, in ms)
MAX_RETENTION_MS = 100 * 365 * 24 * 3600 * 1000
DEFAULT_CONFLICT_RETENTION_MS = 7 * 24 * 3600 * 1000


def schema_signature(schema: TableSchema) -> list[dict[str, Any]]:
    return [{"name": c.name, "type": c.type.value, "sort_order": "ascending" if c.is_key else None,
             "required": bool(getattr(c, "required", False))} for c in schema.columns]


def describe_schema_difference(theirs: Any, mine: list[dict[str, Any]], other: str, own: str) -> str:
    """How two schema signatures differ, in words, column by column (no Python reprs)."""
    def columns(signature: Any) -> dict[str, dict[str, Any]]:
        if not isinstance(signature, list):
            return {}
        return {str(c.get("name")): c for c in signature if isinstance(c, dict)}

    def describe(column: dict[str, Any]) -> str:
        parts = [str(column.get("type"))]
        if column.get("sort_order"):
            parts.append(f"key ({column['sort_order']})")
        if column.get("required"):
            parts.append("required")
        return ", ".join(parts)

    if not isinstance(theirs, list):
        return f"cluster {other} sent no schema"
    a, b = columns(theirs), columns(mine)
    out = []
    for name in list(dict.fromkeys([*a, *b])):
        if name not in b:
            out.append(f"column {name} ({describe(a[name])}) exists only on {other}")
        elif name not in a:
            out.append(f"column {name} ({describe(b[name])}) exists only on {own}")
        elif a[name] != b[name]:
            out.append(f"column {name} is {describe(a[name])} on {other} but {describe(b[name])} on {own}")
    if not out and list(a) != list(b):
        out.append(f"the columns are in another order ({', '.join(a)} on {other}; {', '.join(b)} on {own})")
    return "; ".join(out[:10]) or "the schemas are written differently"


def shown(value: Any) -> str:
    """A value in an error message: YSON-like, short, control characters escaped."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 80 else text[:80] + "..."
