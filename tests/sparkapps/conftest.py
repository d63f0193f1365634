"""One real local Spark session for the whole run, and helpers to read and write real engines with it.

Spark takes ~10 s to start, so the session is session-scoped: ``local[2,2]`` (two cores; a failed task
is tried a second time, as a cluster would, which the retry test relies on), small memory, no UI,
bound to loopback. Its Python workers run this interpreter (``PYSPARK_PYTHON``), so they import the
installed ``reptables.sparkapps`` and pyarrow. Engines are real processes (tests/harness.py), started
per module. PostgreSQL (the mirror's target) is ONE real PostgreSQL 15 server per run, started and
stopped with the helpers of benchmarks/pg_logical.py.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from reptables.engine.client import Client
from reptables.sparkapps import register
from tests.harness import EngineProcess

_names = itertools.count()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    work = tmp_path_factory.mktemp("spark")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        session = (SparkSession.builder.master("local[2,2]").appName("reptables-sparkapps-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.memory", "512m")
                   .config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.local.dir", str(work / "local"))
                   .config("spark.sql.warehouse.dir", str(work / "warehouse"))
                   .getOrCreate())
        session.sparkContext.setLogLevel("ERROR")
        register(session)
        try:
            yield session
        finally:
            session.stop()


def table_name(prefix: str) -> str:
    return f"//tmp/{prefix}_{next(_names)}"


def client_of(engine: EngineProcess) -> Client:
    return Client(engine.url, engine.read_token())


def create_table(engine: EngineProcess, path: str, schema: list[dict[str, Any]],
                 pivot_keys: list[list[Any]] | None = None, tablet_count: int | None = None,
                 change_log: bool = False) -> None:
    """A mounted dynamic table (``change_log``: keeping a change log from the start, for streams of it)."""
    with client_of(engine) as client:
        client.create("table", path, attributes={"dynamic": True, "schema": schema, "enable_change_log": change_log},
                      recursive=True)
        if pivot_keys is not None or tablet_count is not None:
            client.reshard_table(path, pivot_keys=pivot_keys, tablet_count=tablet_count)
        client.mount_table(path)


def read(spark: SparkSession, engine: EngineProcess, path: str, **options: Any) -> DataFrame:
    reader = (spark.read.format("reptables").option("proxy", engine.url).option("token", engine.read_token())
              .option("path", path))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def write(df: DataFrame, engine: EngineProcess, path: str, mode: str = "append", **options: Any) -> None:
    writer = (df.write.format("reptables").option("proxy", engine.url).option("token", engine.read_token())
              .option("path", path).mode(mode))
    for name, value in options.items():
        writer = writer.option(name, str(value))
    writer.save()
