"""YT column types <-> Spark types <-> Arrow types, and rows <-> Arrow record batches.

Why a module of its own: the mapping is a contract users rely on (docs/spark.md "Schema mapping"
states it, tests/sparkapps checks it both ways), and the reader, the writer and the later jobs
(bootstrap, verify) must all use the same one.

Choices, and why:

* **Declared widths.** The engine stores every integer in 64 bits, but keeps the type a user declared
  (``int8``, ``uint16``...) in ``@schema``: a column reads as the Spark type of that declared width,
  as YTsaurus' own Spark connector maps them. The engine does not check narrow ranges, so the writer
  does (a value that the declared type cannot hold would make the table unreadable as that type), and
  the reader names the column if the table holds one anyway.
* **uint64 -> LongType.** The engine stores uint64 values only up to 2**63 - 1 (docs/engine.md), so
  every stored value fits a LongType; a negative LongType value written to a uint64 column is
  refused (by the writer's range check, as the engine would). No DecimalType(20, 0) is needed.
* **any/yson -> StringType holding JSON text.** The engine's API speaks JSON; YSON text would need a
  second encoder on both sides and no Spark function reads it, while ``from_json``/``to_json`` work on
  JSON. A top-level null is a Spark null; the JSON text ``null`` written is stored as null.
* **Nullability.** A column is nullable unless it is ``required`` or a key column of a sorted table
  (the engine refuses null keys).

Conversions build one Arrow array per column from a Python list (``pa.array``), never a row at a
time; only ``any`` values, which need a JSON encoding or parsing each, pass through Python one by one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from .options import ReptablesSparkError

#: YT type name -> (Spark type, Arrow type)
_READ_TYPES: dict[str, tuple[DataType, pa.DataType]] = {
    "int8": (ByteType(), pa.int8()),
    "int16": (ShortType(), pa.int16()),
    "int32": (IntegerType(), pa.int32()),
    "int64": (LongType(), pa.int64()),
    "uint8": (ShortType(), pa.int16()),
    "uint16": (IntegerType(), pa.int32()),
    "uint32": (LongType(), pa.int64()),
    "uint64": (LongType(), pa.int64()),
    "double": (DoubleType(), pa.float64()),
    "float": (FloatType(), pa.float32()),
    "boolean": (BooleanType(), pa.bool_()),
    "string": (StringType(), pa.string()),
    "utf8": (StringType(), pa.string()),
    "any": (StringType(), pa.string()),
    "yson": (StringType(), pa.string()),
}
#: YT types whose values travel as JSON text in a Spark string column
JSON_TYPES = frozenset({"any", "yson"})
INTEGER_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
#: the range a declared integer type holds (what the writer checks, the engine does not for narrow ones)
INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(1 << 7), (1 << 7) - 1), "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1),
    "uint8": (0, (1 << 8) - 1), "uint16": (0, (1 << 16) - 1), "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 63) - 1),
}
#: Spark type -> Arrow type, for every Spark type a column of this source can have
_ARROW_OF_SPARK: dict[type[DataType], pa.DataType] = {
    ByteType: pa.int8(), ShortType: pa.int16(), IntegerType: pa.int32(), LongType: pa.int64(),
    FloatType: pa.float32(), DoubleType: pa.float64(), BooleanType: pa.bool_(), StringType: pa.string(),
}
_SPARK_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
#: the Spark types a user's read schema may give a column instead of the mapped one
_READ_FAMILIES: dict[type[DataType], tuple[type[DataType], ...]] = {
    **{t: _SPARK_INTEGERS for t in _SPARK_INTEGERS}, FloatType: (FloatType, DoubleType),
    DoubleType: (FloatType, DoubleType),
}
#: YT type -> the Spark types a DataFrame column written into it may have
_WRITABLE: dict[str, tuple[type[DataType], ...]] = {
    **{t: _SPARK_INTEGERS for t in INTEGER_TYPES},
    "double": (*_SPARK_INTEGERS, FloatType, DoubleType), "float": (*_SPARK_INTEGERS, FloatType, DoubleType),
    "boolean": (BooleanType,), "string": (StringType,), "utf8": (StringType,),
    "any": (StringType, *_SPARK_INTEGERS, FloatType, DoubleType, BooleanType),
}
_WRITABLE["yson"] = _WRITABLE["any"]


@dataclass(frozen=True)
class YtColumn:
    """One column of a table's ``@schema``."""

    name: str
    type: str
    key: bool
    required: bool

    @property
    def nullable(self) -> bool:
        return not (self.required or self.key)


def parse_columns(raw_schema: Any, path: str) -> list[YtColumn]:
    """The columns of a ``@schema`` value (a list of maps, possibly in YT's attributed form)."""
    if isinstance(raw_schema, dict) and "$value" in raw_schema:
        raw_schema = raw_schema["$value"]
    columns = []
    for item in raw_schema or []:
        type_name = str(item.get("type") or item.get("type_v3") or "")
        if type_name not in _READ_TYPES:
            raise ReptablesSparkError(f"reptables: column {item.get('name')!r} of table {path} has type "
                                      f"{type_name!r}, which the Spark data source does not map (docs/spark.md)")
        columns.append(YtColumn(name=str(item["name"]), type=type_name, key=item.get("sort_order") is not None,
                                required=bool(item.get("required", False))))
    if not columns:
        raise ReptablesSparkError(f"reptables: table {path} has no columns in its schema")
    return columns


def spark_schema(columns: Sequence[YtColumn]) -> StructType:
    """The Spark schema a read of a table with ``columns`` has."""
    return StructType([StructField(c.name, _READ_TYPES[c.type][0], nullable=c.nullable) for c in columns])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of the batches a read yields: exactly what Spark derives from ``schema``."""
    fields = []
    for f in schema.fields:
        arrow_type = _ARROW_OF_SPARK.get(type(f.dataType))
        if arrow_type is None:
            raise ReptablesSparkError(f"reptables: column {f.name!r} is given Spark type {f.dataType.simpleString()}"
                                      ", which the data source does not read into (docs/spark.md)")
        fields.append(pa.field(f.name, arrow_type, nullable=f.nullable))
    return pa.schema(fields)


def check_read_schema(schema: StructType, columns: Sequence[YtColumn], path: str) -> None:
    """A schema the user gave to ``spark.read.schema(...)``: each column must be the table's, and its Spark
    type of the same family as the mapped one (any integer type for an integer column, so a narrow
    column can be read wider; FloatType or DoubleType for a floating-point one)."""
    by_name = {c.name: c for c in columns}
    for f in schema.fields:
        column = by_name.get(f.name)
        if column is None:
            raise ReptablesSparkError(f"reptables: column {f.name!r} is not in the schema of table {path}")
        expected = _READ_TYPES[column.type][0]
        family = _READ_FAMILIES.get(type(expected), (type(expected),))
        if not isinstance(f.dataType, family):
            raise ReptablesSparkError(f"reptables: column {f.name!r} of table {path} has type {column.type}, which "
                                      f"reads as {expected.simpleString()}, not {f.dataType.simpleString()}")


def check_write_schema(schema: StructType, columns: Sequence[YtColumn], path: str) -> None:
    """Refuse, before any task runs, DataFrame columns whose Spark type cannot go into their table column.

    A DataFrame column the table lacks is left to the engine, which names it in its own error.
    """
    by_name = {c.name: c for c in columns}
    for f in schema.fields:
        column = by_name.get(f.name)
        if column is not None and not isinstance(f.dataType, _WRITABLE[column.type]):
            allowed = ", ".join(t().simpleString() for t in _WRITABLE[column.type])
            raise ReptablesSparkError(
                f"reptables: cannot write DataFrame column {f.name!r} of Spark type {f.dataType.simpleString()} to "
                f"column {f.name!r} of type {column.type} of table {path}: it takes {allowed}")


# -- reading: rows of the engine -> Arrow --------------------------------------------------------------


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode("utf-8")
    except TypeError:  # an integer beyond 64 bits, or a non-finite double (orjson writes those as null)
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def rows_to_batch(rows: list[dict[str, Any]], schema: pa.Schema, json_columns: frozenset[str],
                  path: str) -> pa.RecordBatch:
    """A record batch of ``rows`` (as select_rows returns them), one ``pa.array`` per column."""
    arrays = []
    for f in schema:
        values = list(map(itemgetter(f.name), rows))
        if f.name in json_columns:
            values = [None if v is None else _json_text(v) for v in values]
        try:
            arrays.append(pa.array(values, type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise ReptablesSparkError(f"reptables: column {f.name!r} of table {path} holds a value that Spark type "
                                      f"{f.type} cannot hold ({exc}); the engine does not check narrow integer "
                                      "types: read the column as a wider type with spark.read.schema(...)") from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- writing: Arrow -> rows of the engine --------------------------------------------------------------


def check_ranges(batch: pa.RecordBatch, narrow: dict[str, str], path: str) -> None:
    """Refuse integers that the declared type of their column cannot hold (one min/max per column)."""
    for name, type_name in narrow.items():
        lo, hi = INTEGER_RANGES[type_name]
        bounds = pc.min_max(batch.column(name))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None:
            continue
        for value in (low, high):
            if not lo <= value <= hi:
                raise ReptablesSparkError(f"reptables: value {value} of column {name!r} of table {path} is out of the "
                                          f"range of its type {type_name} ({lo}..{hi})")


def batch_to_rows(batch: pa.RecordBatch, json_columns: frozenset[str], path: str) -> list[dict[str, Any]]:
    """The rows of ``batch`` as insert_rows takes them; JSON text of ``any`` columns becomes structures."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    for name in json_columns:
        for row in rows:
            text = row[name]
            if text is None:
                continue
            try:
                row[name] = orjson.loads(text)
            except orjson.JSONDecodeError:
                try:  # what orjson refuses but the engine's JSON takes: NaN, Infinity, big integers
                    row[name] = json.loads(text)
                except ValueError as exc:
                    shown = text if len(text) <= 100 else text[:100] + "..."
                    raise ReptablesSparkError(f"reptables: value {shown!r} of column {name!r} of table {path} is not "
                                              f"JSON text ({exc}); a column of type any takes JSON text") from None
    return rows


def json_string_columns(schema: StructType, columns: Sequence[YtColumn]) -> frozenset[str]:
    """DataFrame string columns that go to ``any`` columns: their values are JSON text to parse."""
    types = {c.name: c.type for c in columns}
    return frozenset(f.name for f in schema.fields
                     if types.get(f.name) in JSON_TYPES and isinstance(f.dataType, StringType))


def narrow_integer_columns(schema: StructType, columns: Sequence[YtColumn]) -> dict[str, str]:
    """DataFrame integer columns whose table column's declared type is narrower than the Spark type."""
    types = {c.name: c.type for c in columns}
    width = {ByteType: pa.int8(), ShortType: pa.int16(), IntegerType: pa.int32(), LongType: pa.int64()}
    out = {}
    for f in schema.fields:
        yt_type = types.get(f.name)
        if yt_type in INTEGER_TYPES and isinstance(f.dataType, _SPARK_INTEGERS):
            spark_bits = width[type(f.dataType)].bit_width
            lo, hi = INTEGER_RANGES[yt_type]
            if lo > -(1 << (spark_bits - 1)) or hi < (1 << (spark_bits - 1)) - 1:
                out[f.name] = yt_type
    return out
