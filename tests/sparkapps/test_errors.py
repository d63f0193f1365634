"""Failures of format "reptables" name the table, the proxy and the engine's reason, in Spark's error.

A user sees these as the text of a Spark exception: a bad token, an unreachable proxy, a missing table,
a write the data source refuses (an ordered table, mode overwrite, a Spark type the column cannot take,
an integer out of a narrow column's range) and the engine's own schema errors (a null key, a null in a
required column, an unknown column).
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

from tests.harness import EngineProcess, free_port

from .conftest import client_of, create_table, read, table_name, write

SORTED = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "small", "type": "int8"}, {"name": "r", "type": "string", "required": True}]


def error_text(call: Any) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps the data source's error in its own
        call()
    return str(info.value)


@pytest.mark.parametrize(("options", "reason"), [
    ({"token": "not-the-token"}, "Authentication failed"),
    ({"proxy": f"http://127.0.0.1:{free_port()}"}, "Cannot reach YT proxy"),
    ({"path": "//tmp/no_such_table"}, "has no child with key 'no_such_table'"),
], ids=["bad token", "unreachable proxy", "missing table"])
def test_a_failed_read_names_the_table_and_the_reason(spark: SparkSession, shared_engine: EngineProcess,
                                                      options: dict[str, str], reason: str) -> None:
    path = table_name("readable")
    create_table(shared_engine, path, SORTED)
    options = {"path": path, **options}
    reader = spark.read.format("reptables").option("proxy", shared_engine.url).option(
        "token", shared_engine.read_token())
    text = error_text(lambda: reader.options(**options).load().collect())
    assert f"reptables: cannot read table {options['path']} at {options.get('proxy', shared_engine.url)}" in text
    assert reason in text
    assert shared_engine.read_token() not in text


def test_a_write_with_a_bad_token_names_the_table_and_the_reason(spark: SparkSession,
                                                                 shared_engine: EngineProcess) -> None:
    path = table_name("guarded")
    create_table(shared_engine, path, SORTED)
    df = spark.createDataFrame([(1, "x", "r")], "k long, v string, r string")
    text = error_text(lambda: df.write.format("reptables").option("proxy", shared_engine.url)
                      .option("token", "not-the-token").option("path", path).mode("append").save())
    assert f"cannot write to table {path} at {shared_engine.url}" in text and "Authentication failed" in text


def test_a_write_to_an_ordered_table_is_refused_before_any_row_is_written(spark: SparkSession,
                                                                          shared_engine: EngineProcess) -> None:
    path = table_name("queue")
    create_table(shared_engine, path, [{"name": "v", "type": "string"}])
    df = spark.createDataFrame([("a",), ("b",)], "v string")
    text = error_text(lambda: write(df, shared_engine, path))
    assert f"cannot write to table {path}" in text and "ordered table" in text and "not idempotent" in text
    with client_of(shared_engine) as client:
        assert client.select_rows(f"v FROM [{path}]") == []


def test_mode_overwrite_is_refused(spark: SparkSession, shared_engine: EngineProcess) -> None:
    path = table_name("kept")
    create_table(shared_engine, path, SORTED)
    df = spark.createDataFrame([(1, "x", "r")], "k long, v string, r string")
    text = error_text(lambda: write(df, shared_engine, path, mode="overwrite"))
    assert f"cannot write to table {path}" in text and '"overwrite"' in text


@pytest.mark.parametrize(("rows", "schema", "reason"), [
    ([(None, "x", "r")], "k long, v string, r string", "Key column 'k' of table {path} cannot be null"),
    ([(1, "x", None)], "k long, v string, r string", "Required column 'r' of table {path} cannot have a null value"),
    ([(1, "x", "r", 5)], "k long, v string, r string, extra long",
     "Column 'extra' is not found in the schema of table {path}"),
], ids=["null key", "null in a required column", "unknown column"])
def test_the_engine_schema_errors_reach_the_spark_error(spark: SparkSession, shared_engine: EngineProcess,
                                                        rows: list[tuple[Any, ...]], schema: str, reason: str) -> None:
    path = table_name("strict")
    create_table(shared_engine, path, SORTED)
    text = error_text(lambda: write(spark.createDataFrame(rows, schema), shared_engine, path))
    assert f"reptables: cannot write to table {path} at {shared_engine.url}" in text
    assert reason.format(path=path) in text


def test_values_a_column_cannot_hold_are_refused_by_the_data_source(spark: SparkSession,
                                                                    shared_engine: EngineProcess) -> None:
    path = table_name("typed")
    create_table(shared_engine, path, SORTED)
    dated = spark.createDataFrame([(1, None, "r")], StructType([
        StructField("k", LongType()), StructField("v", DateType()), StructField("r", StringType())]))
    text = error_text(lambda: write(dated, shared_engine, path))
    assert f"column 'v' of type string of table {path}" in text and "Spark type date" in text

    too_big = spark.createDataFrame([(1, 300, "r")], "k long, small long, r string")
    text = error_text(lambda: write(too_big, shared_engine, path))
    assert f"value 300 of column 'small' of table {path} is out of the range of its type int8" in text


def test_a_value_beyond_its_declared_type_fails_the_read_unless_read_wider(spark: SparkSession,
                                                                           shared_engine: EngineProcess) -> None:
    """The engine stores an int8 column in 64 bits without checking: another client may put 1000 there."""
    path = table_name("lax")
    create_table(shared_engine, path, SORTED)
    with client_of(shared_engine) as client:
        client.insert_rows(path, [{"k": 1, "small": 1000, "r": "r"}])
    text = error_text(lambda: read(spark, shared_engine, path).collect())
    assert f"column 'small' of table {path} holds a value that Spark type int8 cannot hold" in text
    wider = spark.read.format("reptables").schema("k long, small long").options(
        proxy=shared_engine.url, token=shared_engine.read_token(), path=path).load()
    assert [tuple(r) for r in wider.collect()] == [(1, 1000)]
