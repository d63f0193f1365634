"""What the data source learns of a table before it reads or writes, and the query text it sends.

Why a module of its own: planning a read (key ranges from pivot keys, row ranges from tablets) and
paging through a range both need the table's layout and must write YT QL literals exactly as the
engine's parser reads them back (``engine/query/parser.py``): a uint64 needs its ``u`` suffix, a
string its C escapes, a column name its brackets. Getting one of those wrong would silently read the
wrong range, so it is written once, here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reptables.engine.client import Client

from .schema_mapping import YtColumn, parse_columns

#: the pseudo-columns of an ordered table that order its rows
TABLET_INDEX = "$tablet_index"
ROW_INDEX = "$row_index"

#: a bound of a key range: a key or a key prefix, as a tuple of values
Bound = tuple[Any, ...]


@dataclass(frozen=True)
class TableInfo:
    """The attributes of a table that planning needs (one ``get`` of ``@``)."""

    path: str
    type: str
    sorted: bool
    columns: tuple[YtColumn, ...]
    tablet_count: int
    #: sorted tables: the first key of each tablet ([] for the first)
    pivot_keys: tuple[Bound, ...]
    #: ordered tables: (trimmed_row_count, row_count) of each tablet; empty for replicated tables,
    #: whose rows live on their replicas (the meta-cluster's counts are of its replication queue)
    tablet_rows: tuple[tuple[int, int], ...]

    @property
    def replicated(self) -> bool:
        return self.type == "replicated_table"

    @property
    def key_columns(self) -> tuple[YtColumn, ...]:
        return tuple(c for c in self.columns if c.key)

    @classmethod
    def fetch(cls, client: Client, path: str) -> TableInfo:
        attrs = client.get(f"{path}/@")
        node_type = str(attrs.get("type"))
        if node_type not in ("table", "replicated_table") or not attrs.get("dynamic"):
            raise ValueError(f"{path} is a {node_type}, not a dynamic table")
        sorted_ = bool(attrs.get("sorted"))
        tablets = attrs.get("tablets") or []
        rows: tuple[tuple[int, int], ...] = ()
        if not sorted_ and node_type == "table":
            rows = tuple((int(t.get("trimmed_row_count", 0)), int(t.get("flushed_row_count", 0))) for t in tablets)
        return cls(path=path, type=node_type, sorted=sorted_, columns=tuple(parse_columns(attrs.get("schema"), path)),
                   tablet_count=int(attrs.get("tablet_count") or len(tablets) or 1),
                   pivot_keys=tuple(tuple(k) for k in attrs.get("pivot_keys") or [[]]) if sorted_ else (),
                   tablet_rows=rows)


# -- YT QL text -------------------------------------------------------------------------------------------


def column_ref(name: str) -> str:
    """A column reference the parser reads back as ``name`` whatever its characters."""
    if "]" not in name:
        return f"[{name}]"
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def literal(value: Any, yt_type: str) -> str:
    """``value`` of a column of ``yt_type`` as a YT QL constant."""
    if value is None:
        return "null"
    if yt_type == "boolean":
        return "true" if value else "false"
    if yt_type.startswith("uint"):
        return f"{int(value)}u"
    if yt_type.startswith("int"):
        number = int(value)
        # the parser reads -N as minus N: the most negative int64 has no positive counterpart
        return f"({number + 1} - 1)" if number == -(1 << 63) else str(number)
    if yt_type in ("double", "float"):
        real = float(value)
        if math.isinf(real):
            return "1e999" if real > 0 else "-1e999"
        return repr(real)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def compare(names: Sequence[str], types: Sequence[str], op: str, bound: Bound) -> str:
    """``(names...) op (bound...)`` over the first ``len(bound)`` names (a key prefix compares as YT does)."""
    count = len(bound)
    refs = [column_ref(n) for n in names[:count]]
    values = [literal(v, t) for v, t in zip(bound, types[:count], strict=True)]
    if count == 1:
        return f"{refs[0]} {op} {values[0]}"
    return f"({', '.join(refs)}) {op} ({', '.join(values)})"


def select_page(path: str, projection: Sequence[str], key_names: Sequence[str], key_types: Sequence[str],
                conditions: Sequence[str], after: Bound | None, limit: int) -> str:
    """One page of a range: rows past ``after`` in key order, at most ``limit``."""
    where = list(conditions)
    if after is not None:
        where.append(compare(key_names, key_types, ">", after))
    text = f"{', '.join(column_ref(n) for n in projection)} FROM [{path}]"
    if where:
        text += " WHERE " + " AND ".join(f"({c})" for c in where)
    return text + f" ORDER BY {', '.join(column_ref(n) for n in key_names)} LIMIT {limit}"
