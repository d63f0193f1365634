"""What a command's handler may return besides a plain value: the API layer's result types.

``Plain``: a structured result known to hold only JSON's own types, encoded by the fast path;
``WithParameters``: a result with response parameters (the ``X-YT-Response-Parameters`` header).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plain:
    """A structured result known to hold only JSON's own types (no YSON attributes): encoded by
    the fast path (``formats.dump_plain_structured``)."""

    value: Any


@dataclass(frozen=True)
class WithParameters:
    """A command's result and its response parameters (the ``X-YT-Response-Parameters`` header)."""

    result: Any
    parameters: dict[str, Any]
