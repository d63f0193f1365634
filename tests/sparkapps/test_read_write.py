"""spark.read / df.write of format "reptables" against a real engine, with real local Spark.

What users rely on: every column type the engine has survives a write and a read (nulls and the
extremes of each type included) and looks right in the engine itself; an ordered table reads whole;
a read at an older timestamp sees that snapshot; however many partitions are asked for, each row
comes exactly once; a write task that Spark retries after some of its chunks were committed neither
loses nor duplicates a row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from tests.harness import EngineProcess

from .conftest import client_of, create_table, read, table_name, write

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: every column type the engine accepts (engine/schema.py: the six types and their aliases)
ALL_TYPES_SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "i8", "type": "int8"}, {"name": "i16", "type": "int16"}, {"name": "i32", "type": "int32"},
    {"name": "i64", "type": "int64"}, {"name": "u8", "type": "uint8"}, {"name": "u16", "type": "uint16"},
    {"name": "u32", "type": "uint32"}, {"name": "u64", "type": "uint64"}, {"name": "f64", "type": "double"},
    {"name": "f32", "type": "float"}, {"name": "b", "type": "boolean"}, {"name": "s", "type": "string"},
    {"name": "t", "type": "utf8"}, {"name": "a", "type": "any"}, {"name": "y", "type": "yson"},
    {"name": "r", "type": "string", "required": True},
]
#: the Spark schema docs/spark.md promises for it
ALL_TYPES_SPARK = StructType([
    StructField("k", LongType(), False),
    StructField("i8", ByteType()), StructField("i16", ShortType()), StructField("i32", IntegerType()),
    StructField("i64", LongType()), StructField("u8", ShortType()), StructField("u16", IntegerType()),
    StructField("u32", LongType()), StructField("u64", LongType()), StructField("f64", DoubleType()),
    StructField("f32", FloatType()), StructField("b", BooleanType()), StructField("s", StringType()),
    StructField("t", StringType()), StructField("a", StringType()), StructField("y", StringType()),
    StructField("r", StringType(), False),
])
ALL_TYPES_ROWS = [
    (INT64_MIN, -128, -32768, -(1 << 31), INT64_MIN, 0, 0, 0, 0, float("-inf"), -1.5, False, "", "",
     '{"nested":{"list":[1,2.5,"x",null,true]}}', "[]", "minimums"),
    (0, None, None, None, None, None, None, None, None, None, None, None, None, None, None, None, "nulls"),
    (7, 127, 32767, (1 << 31) - 1, INT64_MAX, 255, 65535, (1 << 32) - 1, INT64_MAX, 1e300, 3.25, True,
     'quote " backslash \\ newline\n tab\t', "ünïcödé ✓ 日本語", '"just a string"', "12", "maximums"),
    (INT64_MAX, 1, 2, 3, 4, 5, 6, 7, 8, float("inf"), 0.0, False, "]", "[", '{"m":{"k":"v"},"e":[]}', "-1.5",
     "largest key"),
]


@pytest.fixture
def engine(shared_engine: EngineProcess) -> EngineProcess:
    """The module's engine (tests/conftest.py): each test makes tables of its own."""
    return shared_engine


def test_every_column_type_round_trips_with_nulls(spark: SparkSession, engine: EngineProcess) -> None:
    path = table_name("all_types")
    create_table(engine, path, ALL_TYPES_SCHEMA)
    df = spark.createDataFrame(ALL_TYPES_ROWS, schema=ALL_TYPES_SPARK)
    write(df, engine, path, batch_rows=2)  # two insert_rows chunks

    back = read(spark, engine, path, partitions=2, page_rows=1)  # pages continue after INT64_MIN, 0...
    assert back.schema == ALL_TYPES_SPARK
    assert sorted(back.collect()) == sorted(df.collect())

    # and the engine holds them as its own types: structures in any columns, not their JSON text
    with client_of(engine) as client:
        rows = {r["k"]: r for r in client.select_rows(f"* FROM [{path}]")}
    assert rows[INT64_MIN]["a"] == {"nested": {"list": [1, 2.5, "x", None, True]}} and rows[INT64_MIN]["y"] == []
    assert rows[7]["a"] == "just a string" and rows[7]["y"] == 12
    assert rows[INT64_MIN]["i64"] == INT64_MIN and rows[7]["u64"] == INT64_MAX and rows[7]["f32"] == 3.25
    assert rows[0] == {"k": 0, **{c["name"]: None for c in ALL_TYPES_SCHEMA[1:-1]}, "r": "nulls"}


def test_ordered_table_reads_every_untrimmed_row_once(spark: SparkSession, engine: EngineProcess) -> None:
    path = table_name("ordered")
    create_table(engine, path, [{"name": "v", "type": "string"}, {"name": "n", "type": "int64"}], tablet_count=3)
    with client_of(engine) as client:
        for tablet in range(3):
            client.insert_rows(path, [{"$tablet_index": tablet, "v": f"t{tablet}", "n": tablet * 100 + i}
                                      for i in range(10)])
        client.trim_rows(path, 0, 3)  # rows 0..2 of tablet 0 are gone
    expected = sorted([(f"t{t}", t * 100 + i) for t in range(3) for i in range(10) if t or i >= 3])

    default = read(spark, engine, path)
    assert default.rdd.getNumPartitions() == 3
    assert sorted(tuple(r) for r in default.collect()) == expected
    split = read(spark, engine, path, partitions=7, page_rows=2)
    assert split.rdd.getNumPartitions() == 7
    assert sorted(tuple(r) for r in split.collect()) == expected


def test_read_at_an_older_timestamp_sees_the_older_snapshot(spark: SparkSession, engine: EngineProcess) -> None:
    path = table_name("snapshot")
    create_table(engine, path, [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                {"name": "v", "type": "string"}])
    with client_of(engine) as client:
        client.insert_rows(path, [{"k": k, "v": "old"} for k in range(10)])
        before = client.generate_timestamp()
        client.insert_rows(path, [{"k": k, "v": "new"} for k in range(5)] + [{"k": 10, "v": "new"}])
        client.delete_rows(path, [{"k": 9}])

    old = read(spark, engine, path, timestamp=before, partitions=3)
    assert sorted(tuple(r) for r in old.collect()) == [(k, "old") for k in range(10)]
    as_hex = read(spark, engine, path, timestamp=hex(before))
    assert as_hex.count() == 10
    now = read(spark, engine, path)
    assert sorted(tuple(r) for r in now.collect()) == (
        [(k, "new") for k in range(5)] + [(k, "old") for k in range(5, 9)] + [(10, "new")])


@pytest.mark.parametrize("partitions", [2, 8])
def test_any_number_of_partitions_returns_each_row_exactly_once(spark: SparkSession, engine: EngineProcess,
                                                                partitions: int) -> None:
    path = table_name("split")
    # three tablets, one pivot inside a run of equal first key columns
    create_table(engine, path, [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                {"name": "s", "type": "string", "sort_order": "ascending"},
                                {"name": "v", "type": "int64"}], pivot_keys=[[], [0], [100, "m"]])
    # string keys that the continuation queries must quote and escape right
    expected = sorted((k, s, k * 10) for k in range(-50, 200) for s in ("a", 'm"q', "m\\b", "z\nü"))
    with client_of(engine) as client:
        client.insert_rows(path, [{"k": k, "s": s, "v": v} for k, s, v in expected])

    df = read(spark, engine, path, partitions=partitions, page_rows=37)
    assert df.rdd.getNumPartitions() == partitions
    rows = [tuple(r) for r in df.collect()]
    assert len(rows) == len(expected)
    assert sorted(rows) == expected


def test_a_retried_write_task_neither_loses_nor_duplicates_rows(spark: SparkSession, engine: EngineProcess,
                                                               tmp_path: Path) -> None:
    """The task's first attempt fails at its 13th chunk (the engine refuses a null in a required column)
    after committing twelve; Spark runs it again, and this time the value is there."""
    from pyspark.sql.functions import col, udf

    path = table_name("retried")
    create_table(engine, path, [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                {"name": "v", "type": "string", "required": True}])
    url, token, seen_file = engine.url, engine.read_token(), str(tmp_path / "seen")

    @udf(returnType=StringType(), useArrow=False)
    def null_on_first_attempt(k):
        from pyspark import TaskContext

        from reptables.engine.client import Client

        attempt = TaskContext.get().attemptNumber()
        if k == 0 and attempt == 1:  # what the first attempt left behind
            with Client(url, token) as client:
                Path(seen_file).write_text(str(client.select_rows(f"sum(1) AS n FROM [{path}]")[0]["n"]))
        return None if k == 250 and attempt == 0 else f"v{k}"

    df = spark.range(0, 400, numPartitions=1).select(col("id").alias("k"), null_on_first_attempt("id").alias("v"))
    write(df, engine, path, batch_rows=20)

    assert int((tmp_path / "seen").read_text()) == 240  # twelve chunks of 20, committed by the failed attempt
    with client_of(engine) as client:
        rows = client.select_rows(f"k, v FROM [{path}]")
    assert sorted((r["k"], r["v"]) for r in rows) == [(k, f"v{k}") for k in range(400)]
