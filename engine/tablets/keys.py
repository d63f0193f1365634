"""Keys and tablets: which tablet a key belongs to, pivot keys, tablet ids.

These are pure functions of a schema and a key, shared by table creation and resharding (the
node validates pivot keys before a table exists) and by the write path (which routes each row to
its tablet). They know nothing of SQL or of a table's state.
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import yson_util
from ..errors import ErrorCode, SchemaViolation, YtError
from ..schema import ColumnType, TableSchema

TABLET_OBJECT_TYPE = 0x2BC


def tablet_id(table_id: str, index: int) -> str:
    """A stable, GUID-shaped object id for tablet ``index`` of a table (YT shows tablets by id)."""
    digest = uuid.uuid5(uuid.NAMESPACE_OID, f"{table_id}/{index}").int
    return f"{(digest >> 96) & 0xFFFFFFFF:x}-{(digest >> 64) & 0xFFFFFFFF:x}-{TABLET_OBJECT_TYPE:x}-" \
           f"{digest & 0xFFFFFFFF:x}"


def _null_first(value: Any) -> tuple[int, Any]:
    return (0, 0) if value is None else (1, value)


def key_sort_tuple(key: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    """A key in YT order: null sorts before every value."""
    return tuple(_null_first(v) for v in key)


def validate_key_not_null(schema: TableSchema, row: dict[str, Any], path: str) -> None:
    for col in schema.key_columns:
        if row.get(col.name) is None:
            raise SchemaViolation(f"Key column {col.name!r} of table {path} cannot be null "
                                  "(reptables keys are SQL primary keys)",
                                  attributes={"column": col.name, "path": path})


def parse_pivot_keys(raw: Any, schema: TableSchema, path: str) -> list[list[Any]]:
    pivots = yson_util.to_python(raw)
    if not isinstance(pivots, list) or not pivots or any(not isinstance(p, list) for p in pivots):
        raise YtError(f"Invalid pivot keys for table {path}: expected a list of key lists",
                      code=ErrorCode.INVALID_PARAMETER)
    if pivots[0] != []:
        raise YtError(f"Invalid pivot keys for table {path}: the first pivot key must be []",
                      code=ErrorCode.INVALID_PARAMETER)
    keycols = schema.key_columns
    for p in pivots[1:]:
        if len(p) > len(keycols) or not p:
            raise YtError(f"Invalid pivot key {p} for table {path}: it must be a non-empty prefix of "
                          f"the key columns {[c.name for c in keycols]}", code=ErrorCode.INVALID_PARAMETER)
        for value, col in zip(p, keycols, strict=False):
            if value is not None and col.type in (ColumnType.INT64, ColumnType.UINT64) and (
                    isinstance(value, bool) or not isinstance(value, int)):
                raise YtError(f"Invalid pivot key {p} for table {path}: value {value!r} does not match "
                              f"key column {col.name!r} of type {col.type.value}", code=ErrorCode.INVALID_PARAMETER)
            if value is not None and col.type is ColumnType.STRING and not isinstance(value, str):
                raise YtError(f"Invalid pivot key {p} for table {path}: value {value!r} does not match "
                              f"key column {col.name!r} of type string", code=ErrorCode.INVALID_PARAMETER)
    sort_keys = [key_sort_tuple(tuple(p)) for p in pivots[1:]]
    if any(a >= b for a, b in zip(sort_keys, sort_keys[1:], strict=False)):
        raise YtError(f"Invalid pivot keys for table {path}: pivot keys must be strictly increasing",
                      code=ErrorCode.INVALID_PARAMETER)
    return pivots
