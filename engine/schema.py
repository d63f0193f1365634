"""Table schemas in YT's shape, and validation of rows against them.

A YT schema is a list of columns ``{name; type; sort_order; required; lock}``. Key columns (those
with ``sort_order=ascending``) come first and make the row key of a sorted dynamic table. Columns
may name a ``lock`` group: writes to columns of different groups do not conflict, which is how
seed 003 lets two transactions update different parts of one row at once.

Validation happens here, before anything reaches storage, so that a bad row fails the whole
request with an error naming the table, the column and the reason, and nothing is applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from . import yson_util
from .errors import ErrorCode, SchemaViolation, YtError

#: YT's limit on the weight of one row
MAX_ROW_WEIGHT = 16 * 1024 * 1024
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: uint64 values are stored in signed 64-bit SQL integers; larger values are refused (docs/engine.md)
UINT64_STORABLE_MAX = (1 << 63) - 1
RESERVED_PREFIXES = ("_rt_", "$")
PRIMARY_LOCK = "<primary>"


class ColumnType(StrEnum):
    INT64 = "int64"
    UINT64 = "uint64"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    STRING = "string"
    ANY = "any"


_TYPE_ALIASES = {
    "int8": ColumnType.INT64, "int16": ColumnType.INT64, "int32": ColumnType.INT64,
    "uint8": ColumnType.UINT64, "uint16": ColumnType.UINT64, "uint32": ColumnType.UINT64,
    "utf8": ColumnType.STRING, "float": ColumnType.DOUBLE, "yson": ColumnType.ANY,
}


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    sort_order: str | None = None
    required: bool = False
    lock: str | None = None
    #: the type name the user wrote (kept so `get @schema` shows it back)
    type_name: str = ""

    @property
    def is_key(self) -> bool:
        return self.sort_order is not None

    def to_yt(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type_name or str(self.type),
                               "required": self.required}
        if self.sort_order:
            out["sort_order"] = self.sort_order
        if self.lock:
            out["lock"] = self.lock
        return out


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[Column, ...]
    strict: bool = True
    unique_keys: bool = False
    by_name: dict[str, Column] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.by_name.update({c.name: c for c in self.columns})

    # the derived views below are read for every row written: computed once per schema

    @cached_property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)

    @cached_property
    def value_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if not c.is_key)

    @cached_property
    def key_names(self) -> list[str]:
        return [c.name for c in self.key_columns]

    @cached_property
    def required_value_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.value_columns if c.required)

    @cached_property
    def is_sorted(self) -> bool:
        return bool(self.key_columns)

    @cached_property
    def lock_groups(self) -> list[str]:
        """Lock group names; index 0 is the primary lock (bit 0 of a lock mask)."""
        groups = [PRIMARY_LOCK]
        for c in self.value_columns:
            if c.lock and c.lock not in groups:
                groups.append(c.lock)
        return groups

    @cached_property
    def full_lock_mask(self) -> int:
        return self._lock_mask([c.name for c in self.value_columns])

    def lock_mask(self, columns: list[str] | None) -> int:
        """The lock mask a write of ``columns`` takes; ``None`` means every column (overwrite)."""
        if columns is None:
            return self.full_lock_mask
        return self._lock_mask(columns)

    def _lock_mask(self, names: list[str]) -> int:
        groups = self.lock_groups
        mask = 0
        for name in names:
            col = self.by_name[name]
            if col.is_key:
                continue
            mask |= 1 << groups.index(col.lock or PRIMARY_LOCK)
        return mask or 1

    @cached_property
    def batch_validator(self) -> Callable[[list[Any], Callable[[Any], dict[str, Any]]], list[dict[str, Any]]]:
        """A function that validates a batch of rows, made for this schema (see :func:`validate_rows`)."""
        return _make_batch_validator(self)

    def to_yt(self) -> Any:
        return yson_util.with_attributes(
            [c.to_yt() for c in self.columns], {"strict": self.strict, "unique_keys": self.unique_keys}
        )

    @classmethod
    def parse(cls, raw: Any, path: str) -> TableSchema:
        """Parse a schema given by a user (YSON/JSON structure); errors name the table."""
        attrs = yson_util.attributes_of(raw)
        value = yson_util.strip(raw)
        if not isinstance(value, list) or not value:
            raise YtError(f"Invalid schema for table {path}: expected a non-empty list of columns",
                          code=ErrorCode.INVALID_PARAMETER)
        columns: list[Column] = []
        seen: set[str] = set()
        keys_done = False
        for i, item in enumerate(value):
            item = yson_util.strip(item)
            if not isinstance(item, dict):
                raise YtError(f"Invalid schema for table {path}: column #{i} is not a map",
                              code=ErrorCode.INVALID_PARAMETER)
            name = yson_util.to_str(item.get("name"))
            if not name:
                raise YtError(f"Invalid schema for table {path}: column #{i} has no name",
                              code=ErrorCode.INVALID_PARAMETER)
            # SQL names are case-insensitive: "_RT_TS" would be the hidden "_rt_ts", "V" the column "v"
            if name.lower().startswith(RESERVED_PREFIXES):
                raise YtError(f"Invalid schema for table {path}: column name {name!r} is reserved "
                              f"(names starting with {' or '.join(RESERVED_PREFIXES)} are system columns)",
                              code=ErrorCode.INVALID_PARAMETER)
            if name.lower() in seen:
                raise YtError(f"Invalid schema for table {path}: duplicate column {name!r} (names that differ "
                              "only in case count as one: they are one SQL column)",
                              code=ErrorCode.INVALID_PARAMETER)
            seen.add(name.lower())
            type_name = yson_util.to_str(item.get("type") or item.get("type_v3") or "")
            try:
                col_type = _TYPE_ALIASES.get(type_name) or ColumnType(type_name)
            except ValueError:
                raise YtError(f"Invalid schema for table {path}: column {name!r} has unsupported type "
                              f"{type_name!r} (supported: {', '.join(t.value for t in ColumnType)})",
                              code=ErrorCode.INVALID_PARAMETER) from None
            sort_order = yson_util.to_str(item.get("sort_order")) or None
            if sort_order not in (None, "ascending"):
                raise YtError(f"Invalid schema for table {path}: column {name!r} has unsupported sort order "
                              f"{sort_order!r}", code=ErrorCode.INVALID_PARAMETER)
            if sort_order and keys_done:
                raise YtError(f"Invalid schema for table {path}: key column {name!r} follows a non-key "
                              "column; key columns must form a prefix", code=ErrorCode.INVALID_PARAMETER)
            if not sort_order:
                keys_done = True
            lock = yson_util.to_str(item.get("lock")) or None
            if lock and sort_order:
                raise YtError(f"Invalid schema for table {path}: key column {name!r} cannot have a lock",
                              code=ErrorCode.INVALID_PARAMETER)
            if sort_order and col_type is ColumnType.ANY:
                raise YtError(f"Invalid schema for table {path}: key column {name!r} cannot be of type any",
                              code=ErrorCode.INVALID_PARAMETER)
            columns.append(Column(name=name, type=col_type, sort_order=sort_order,
                                  required=bool(item.get("required", False)), lock=lock, type_name=type_name))
        strict = bool(attrs.get("strict", True))
        unique_keys = bool(attrs.get("unique_keys", any(c.is_key for c in columns)))
        return cls(columns=tuple(columns), strict=strict, unique_keys=unique_keys)


_PLAIN = frozenset({int, float, str, bool})
#: the Python type a value of each column type has after validation (``any`` is stored as text)
_FAST_TYPES: dict[ColumnType, type] = {ColumnType.INT64: int, ColumnType.UINT64: int, ColumnType.DOUBLE: float,
                                       ColumnType.BOOLEAN: bool, ColumnType.STRING: str}
_INT_RANGES: dict[ColumnType, tuple[float, float]] = {
    ColumnType.INT64: (INT64_MIN, INT64_MAX), ColumnType.UINT64: (0, UINT64_STORABLE_MAX),
    ColumnType.DOUBLE: (float("-inf"), float("inf")), ColumnType.BOOLEAN: (0, 1),
    ColumnType.STRING: (0, 0), ColumnType.ANY: (0, 0)}


def _coerce(value: Any, col: Column, path: str) -> Any:
    if value is None:
        return None
    t = col.type
    # the common cases first: a value already of the column's Python type
    vt = type(value)
    if vt is int and (t is ColumnType.INT64 and INT64_MIN <= value <= INT64_MAX or
                      t is ColumnType.UINT64 and 0 <= value <= UINT64_STORABLE_MAX):
        return value
    if vt is str and t is ColumnType.STRING:
        return value
    if vt is float and t is ColumnType.DOUBLE and value == value:
        return value
    if t is ColumnType.INT64:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(value, col, path)
        if not INT64_MIN <= value <= INT64_MAX:
            raise SchemaViolation(f"Value {value} of column {col.name!r} of table {path} is out of int64 range")
        return int(value)
    if t is ColumnType.UINT64:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(value, col, path)
        if value < 0:
            raise SchemaViolation(f"Value {value} of column {col.name!r} of table {path} is negative, "
                                  "expected uint64")
        if value > UINT64_STORABLE_MAX:
            raise SchemaViolation(f"Value {value} of column {col.name!r} of table {path} exceeds {UINT64_STORABLE_MAX},"
                                  " the largest uint64 reptables stores")
        return int(value)
    if t is ColumnType.DOUBLE:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(value, col, path)
        value = float(value)
        if math.isnan(value):
            # SQL storage has no NaN (SQLite would store a null): refused, not silently changed
            raise SchemaViolation(f"NaN is not allowed in column {col.name!r} of table {path}: reptables "
                                  "stores doubles in SQL, which has no NaN (infinities are kept)",
                                  attributes={"column": col.name, "path": path})
        return value
    if t is ColumnType.BOOLEAN:
        if not isinstance(value, bool):
            raise _type_error(value, col, path)
        return bool(value)
    if t is ColumnType.STRING:
        if isinstance(value, bytes):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                raise SchemaViolation(f"Value of column {col.name!r} of table {path} is not valid UTF-8; "
                                      "reptables stores strings as UTF-8 text") from None
        if not isinstance(value, str):
            raise _type_error(value, col, path)
        return str(value)
    return yson_util.dumps_text(value)


def _type_error(value: Any, col: Column, path: str) -> SchemaViolation:
    return SchemaViolation(
        f"Cannot write value {value!r} of type {yson_util.type_name(value)} to column {col.name!r} "
        f"of type {col.type.value} of table {path}",
        attributes={"column": col.name, "path": path},
    )


def validate_row(schema: TableSchema, row: Any, path: str, *, update: bool = False,
                 key_only: bool = False) -> dict[str, Any]:
    """Check one input row against the schema and return it with Python-typed values.

    ``update`` is YT's update mode (unspecified columns keep their values, so ``required`` columns
    need not all be present... except that YT still demands them: we follow YT). ``key_only`` is
    for delete and lookup keys: exactly the key columns, all present.
    """
    if not isinstance(row, dict):
        raise SchemaViolation(f"Row for table {path} must be a map, got {yson_util.type_name(row)}")
    out: dict[str, Any] = {}
    by_name = schema.by_name
    for name, value in row.items():
        if type(name) is not str:
            name = yson_util.to_str(name)
        col = by_name.get(name)
        if col is None:
            if name.startswith("$"):
                continue
            raise YtError(f"Column {name!r} is not found in the schema of table {path}",
                          code=ErrorCode.COLUMN_NOT_FOUND, attributes={"column": name, "path": path})
        if key_only and not col.is_key:
            raise SchemaViolation(f"Column {name!r} of table {path} is not a key column")
        if value is None:
            if col.required:
                raise SchemaViolation(f"Required column {name!r} of table {path} cannot have a null value",
                                      attributes={"column": name, "path": path})
            out[name] = None
            continue
        vt = type(value)
        if vt is not _FAST_TYPES.get(col.type) or (vt is int and not _INT_RANGES[col.type][0] <= value
                                                   <= _INT_RANGES[col.type][1]) or value != value:
            if vt not in _PLAIN:
                value = yson_util.to_python(value)
            value = _coerce(value, col, path)
        out[name] = value
    for key_name in schema.key_names:
        if key_name not in out:
            raise SchemaViolation(f"Missing key column {key_name!r} in a row of table {path}",
                                  attributes={"column": key_name, "path": path})
    if not key_only:
        for col in schema.required_value_columns:
            if col.name not in out:
                raise SchemaViolation(f"Missing required column {col.name!r} in a row of table {path}",
                                      attributes={"column": col.name, "path": path})
    return out


def row_weight(row: dict[str, Any]) -> int:
    """An estimate of YT's row weight, to enforce the 16 MiB limit."""
    # cheap bound first: a UTF-8 character takes at most 4 bytes
    bound = sum(len(v) * 4 if type(v) is str else 8 for v in row.values()) + 64 * len(row)
    if bound <= MAX_ROW_WEIGHT:
        return bound
    weight = 0
    for name, value in row.items():
        if isinstance(value, str):
            weight += len(name) + len(value.encode("utf-8"))
        else:
            weight += len(name) + (len(value) if isinstance(value, bytes) else 8)
    return weight


def validate_rows(schema: TableSchema, rows: list[Any], path: str, *, update: bool = False,
                  keys_not_null: bool = False) -> list[dict[str, Any]]:
    """:func:`validate_row` for a batch: the same results and errors, several times faster.

    A batch insert spends most of its Python time checking rows one value at a time, so each schema
    gets a loop of its own (:func:`_make_batch_validator`) with the column names and type checks
    written out: a row whose keys are all columns of the schema and whose values already have the
    stored Python types (the usual case) is accepted as is, with one copy. Any other row - one to
    convert (an int for a double, YSON types, ``any`` values, ``$`` system columns) or to refuse -
    goes through :func:`validate_row`, which converts it or raises the precise error.
    """

    def slow(row: Any) -> dict[str, Any]:
        out = validate_row(schema, row, path, update=update)
        if keys_not_null:
            for col in schema.key_columns:
                if out.get(col.name) is None:
                    raise SchemaViolation(f"Key column {col.name!r} of table {path} cannot be null "
                                          "(reptables keys are SQL primary keys)",
                                          attributes={"column": col.name, "path": path})
        return out

    return schema.batch_validator(rows, slow)


_PY_TYPES = {ColumnType.INT64: int, ColumnType.UINT64: int, ColumnType.DOUBLE: float, ColumnType.BOOLEAN: bool,
             ColumnType.STRING: str}
_BOUNDS = {ColumnType.INT64: (INT64_MIN, INT64_MAX), ColumnType.UINT64: (0, UINT64_STORABLE_MAX)}


def columns_clean(schema: TableSchema, names: list[str], values: list[list[Any]], *,
                  keys_not_null: bool = False) -> int | None:
    """For whole rows given as columns (``values[i]`` the values of column ``names[i]``, a column
    not named null in every row): whether :func:`validate_rows` would accept every row as it is -
    the same conditions as its fast path, checked a column at a time in C (``map``, ``set``,
    ``min``, ``max``) - and then the rows' data bytes (a string by its length, any other value 8,
    as a replication batch is counted). None when some row needs the row-by-row check: a value to
    convert or to refuse, or a row that might weigh more than ``MAX_ROW_WEIGHT`` (keys are never
    null when this is not None; ``keys_not_null`` is the row check's, for the same signature)."""
    del keys_not_null  # (a key column takes no null on the fast path either)
    by_name = schema.by_name
    if not all(name in by_name for name in names):
        return None
    given = dict(zip(names, values, strict=True))
    total = 0
    widest = 0
    for col in schema.columns:
        column = given.get(col.name)
        strict = col.is_key or col.required
        if column is None:
            if strict and col.type is not ColumnType.ANY:
                return None
            continue
        types = set(map(type, column))
        if col.type is ColumnType.ANY:
            if types != {type(None)}:
                return None
            total += 8 * len(column)
            widest += 8
            continue
        py = _PY_TYPES[col.type]
        present = column
        if type(None) in types:
            if strict:
                return None
            types.discard(type(None))
            present = [v for v in column if v is not None]
        if types - {py}:
            return None
        if not present:
            total += 8 * len(column)
            widest += 8
            continue
        bounds = _BOUNDS.get(col.type)
        if bounds is not None and not (bounds[0] <= min(present) and max(present) <= bounds[1]):
            return None
        if py is float and any(map(math.isnan, present)):
            return None
        if py is str:
            lengths = list(map(len, present))
            total += sum(lengths) + 8 * (len(column) - len(present))
            widest += max(max(lengths), 8)
        else:
            total += 8 * len(column)
            widest += 8
    # (a row weighs at most 4 bytes a character and 64 a column more than its data)
    if widest * 4 + 64 * len(names) > MAX_ROW_WEIGHT:
        return None
    return total


def _make_batch_validator(schema: TableSchema) -> Callable[[list[Any], Callable[[Any], dict[str, Any]]],
                                                              list[dict[str, Any]]]:
    """Compile the fast path of :func:`validate_rows` for ``schema``.

    The generated code only reads the row; column names enter it as ``repr`` literals. A row fails
    the fast path (and goes to ``slow``) on the first column that is not clean: a key column that
    is null or of another type, a required column that is missing or null, a value of a type other
    than the stored one, an int out of range, a NaN in a double key, any value of an ``any`` column.
    """
    lines = ["def validate(rows, slow):",
             "    out = []",
             "    append = out.append",
             "    for row in rows:",
             "        if type(row) is not dict or not row.keys() <= NAMES:",
             "            append(slow(row))",
             "            continue",
             "        get = row.get"]
    for col in schema.columns:
        lines.append(f"        v = get({col.name!r})")
        strict = col.is_key or col.required
        if col.type is ColumnType.ANY:
            cond = "v is not None"
        else:
            py = {ColumnType.INT64: "int", ColumnType.UINT64: "int", ColumnType.DOUBLE: "float",
                  ColumnType.BOOLEAN: "bool", ColumnType.STRING: "str"}[col.type]
            cond = f"type(v) is not {py}"
            if col.type is ColumnType.INT64:
                cond += f" or not {INT64_MIN} <= v <= {INT64_MAX}"
            elif col.type is ColumnType.UINT64:
                cond += f" or not 0 <= v <= {UINT64_STORABLE_MAX}"
            elif col.type is ColumnType.DOUBLE:
                cond += " or v != v"  # NaN: refused by the slow path
            if not strict:
                cond = f"v is not None and ({cond})"
        lines += [f"        if {cond}:", "            append(slow(row))", "            continue"]
    lines += ["        append(row.copy())", "    return out"]
    namespace: dict[str, Any] = {"NAMES": frozenset(c.name for c in schema.columns)}
    exec("\n".join(lines), namespace)  # noqa: S102 - generated from the validated schema only
    validate: Callable[[list[Any], Callable[[Any], dict[str, Any]]], list[dict[str, Any]]] = namespace["validate"]
    return validate


#: YT's error code for a schema change an existing table cannot take ("Table schemas are incompatible")
INCOMPATIBLE_SCHEMAS = 316
#: type names that widen losslessly into one another (YT's compatible type changes), narrowest first
_WIDENING = (("int8", "int16", "int32", "int64"), ("uint8", "uint16", "uint32", "uint64"), ("utf8", "string"))


def _type_widens(old: Column, new: Column) -> bool:
    old_name, new_name = old.type_name or old.type.value, new.type_name or new.type.value
    if old_name == new_name:
        return True
    for chain in _WIDENING:
        if old_name in chain and new_name in chain:
            return chain.index(new_name) > chain.index(old_name)
    return False


def check_schema_update(old: TableSchema, new: TableSchema, path: str, *, empty: bool) -> list[Column]:
    """Check that a table holding rows (``empty``: it holds none) can take ``new`` in place of ``old``;
    returns the columns ``new`` adds.

    What an existing table takes, as YT's ``alter_table`` does: new value columns (optional ones;
    a required one only while the table is empty, since rows already written have no value for
    it), ``required`` relaxed from true to false, and a type widened within its family (int32 ->
    int64, utf8 -> string: the SQL column is the same). Refused, with YT's reasons: removing a
    column, changing a type otherwise, making an optional column required, touching the key
    columns (their names, order, types or sort order: the key is the SQL primary key and the
    tablets' pivots), adding a key column, changing ``strict`` or ``unique_keys``. Two choices of
    reptables beyond YT: new columns come after the existing ones (the SQL table appends them, and
    lock groups are numbered in column order), and an existing column keeps its ``lock`` group.
    The error names the table and the column; nothing has been changed when it is raised.
    """

    def refuse(reason: str, column: str | None = None) -> YtError:
        attributes: dict[str, Any] = {"path": path}
        if column is not None:
            attributes["column"] = column
        return YtError(f"Cannot alter the schema of table {path}: {reason}", code=INCOMPATIBLE_SCHEMAS,
                       attributes=attributes,
                       inner_errors=[YtError(reason, code=INCOMPATIBLE_SCHEMAS, attributes=dict(attributes))])

    if old.is_sorted != new.is_sorted:
        raise refuse("Cannot change dynamic table type from sorted to ordered or vice versa")
    if new.strict != old.strict:
        raise refuse(f"Changing \"strict\" from \"{str(old.strict).lower()}\" to \"{str(new.strict).lower()}\" "
                     "is not allowed")
    if new.unique_keys != old.unique_keys:
        raise refuse(f"Changing \"unique_keys\" from \"{str(old.unique_keys).lower()}\" to "
                     f"\"{str(new.unique_keys).lower()}\" is not allowed")
    for old_col in old.columns:
        if old_col.name not in new.by_name:
            raise refuse(f"Cannot remove column {old_col.name!r} from a strict schema", old_col.name)
    for i, old_col in enumerate(old.columns):
        new_col = new.columns[i]
        if new_col.name != old_col.name:
            if new_col.name not in old.by_name:
                if new_col.is_key:
                    raise refuse(f"Cannot add key column {new_col.name!r}: the key of a dynamic table cannot "
                                 "change (create a new table and copy the rows)", new_col.name)
                raise refuse(f"Cannot insert column {new_col.name!r} before existing column {old_col.name!r}: "
                             "reptables appends new columns after the existing ones", new_col.name)
            raise refuse(f"Cannot change position of column {old_col.name!r}: existing columns keep their order",
                         old_col.name)
        name = old_col.name
        if not _type_widens(old_col, new_col):
            raise refuse(f"Type mismatch for column {name!r}: cannot change {old_col.type_name or old_col.type.value}"
                         f" to {new_col.type_name or new_col.type.value}", name)
        if new_col.sort_order != old_col.sort_order:
            raise refuse(f"Sort order mismatch for column {name!r}: old {old_col.sort_order or 'none'!s}, new "
                         f"{new_col.sort_order or 'none'!s} (key columns cannot change)", name)
        if new_col.required and not old_col.required:
            raise refuse(f"Column {name!r} cannot become required: rows already written may hold no value in it; "
                         "only required -> optional is allowed", name)
        if new_col.lock != old_col.lock:
            raise refuse(f"Lock mismatch for column {name!r}: old {old_col.lock or 'none'!s}, new "
                         f"{new_col.lock or 'none'!s} (an existing column keeps its lock group)", name)
    added = list(new.columns[len(old.columns):])
    for col in added:
        if col.is_key:
            raise refuse(f"Cannot add key column {col.name!r}: the key of a dynamic table cannot change "
                         "(create a new table and copy the rows)", col.name)
        if col.required and not empty:
            raise refuse(f"Cannot insert a new required column {col.name!r} into a non-empty table", col.name)
    return added
